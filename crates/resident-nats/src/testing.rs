//! A real `nats-server` for tests and benchmarks: started with JetStream on a loopback port
//! picked here and a fresh store folder, killed (and the folder removed) on drop.
//!
//! A server can be given a configuration file's text ([`NatsServer::start_or_skip_with_config`]):
//! authorization, TLS, permissions; the command line still sets the address, port and store.
//!
//! When `nats-server` is not installed, [`NatsServer::start_or_skip`] prints a visible
//! `SKIP:` line and returns `None` — unless `RESIDENT_REQUIRE_NATS=1`, then it panics.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The server binary looked up on `PATH` (Debian's `nats-server` package puts it in /usr/sbin,
/// which is searched too).
pub fn nats_server_binary() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/usr/local/bin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// A running `nats-server -js` on 127.0.0.1.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    store: PathBuf,
    binary: PathBuf,
    config: Option<PathBuf>,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl NatsServer {
    /// Starts a server, or prints `SKIP: <test>: ...` and returns `None` when `nats-server`
    /// is missing (panics instead under `RESIDENT_REQUIRE_NATS=1`). Panics if the server is
    /// installed but does not come up (that is a failure, not a skip).
    pub fn start_or_skip(test: &str) -> Option<NatsServer> {
        Self::start_or_skip_inner(test, None)
    }

    /// [`start_or_skip`](Self::start_or_skip) with a configuration file holding `config`.
    pub fn start_or_skip_with_config(test: &str, config: &str) -> Option<NatsServer> {
        Self::start_or_skip_inner(test, Some(config))
    }

    fn start_or_skip_inner(test: &str, config: Option<&str>) -> Option<NatsServer> {
        match nats_server_binary() {
            Some(bin) => Some(
                NatsServer::start_with(bin, config)
                    .unwrap_or_else(|e| panic!("{test}: nats-server did not start: {e}")),
            ),
            None => {
                if std::env::var("RESIDENT_REQUIRE_NATS").as_deref() == Ok("1") {
                    panic!("{test}: nats-server is not installed and RESIDENT_REQUIRE_NATS=1");
                }
                println!(
                    "SKIP: {test}: nats-server is not installed (apt-get install nats-server)"
                );
                None
            }
        }
    }

    /// Starts `binary -js -a 127.0.0.1 -p <free port> -sd <fresh folder>` and waits (at most
    /// 10 s) until it accepts connections.
    pub fn start(binary: PathBuf) -> std::io::Result<NatsServer> {
        Self::start_with(binary, None)
    }

    /// [`start`](Self::start), with `-c <file holding config>` when `config` is given.
    pub fn start_with(binary: PathBuf, config: Option<&str>) -> std::io::Result<NatsServer> {
        static N: AtomicU64 = AtomicU64::new(0);
        let store = std::env::temp_dir().join(format!(
            "resident-nats-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&store)?;
        let config = match config {
            Some(text) => {
                let path = store.join("nats-server.conf");
                std::fs::write(&path, text)?;
                Some(path)
            }
            None => None,
        };
        let mut s = NatsServer {
            child: None,
            port: 0,
            store,
            binary,
            config,
        };
        // A port picked free can be taken before the server binds it: try a few.
        let mut last = None;
        for _ in 0..5 {
            s.port = free_port()?;
            match s.spawn() {
                Ok(()) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no attempt made")))
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let mut cmd = Command::new(&self.binary);
        if let Some(c) = &self.config {
            cmd.arg("-c").arg(c);
        }
        let mut child = cmd
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.store)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.store.join("nats-server.log"))?)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait()? {
                let log =
                    std::fs::read_to_string(self.store.join("nats-server.log")).unwrap_or_default();
                return Err(std::io::Error::other(format!(
                    "nats-server exited at start ({status}) on port {}: {}",
                    self.port,
                    log.trim()
                )));
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::io::Error::other(
                    "nats-server did not listen within 10 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The folder of this server's store (removed on drop): a place for test files.
    pub fn dir(&self) -> &std::path::Path {
        &self.store
    }

    /// Replaces the configuration file's text; it takes effect at the next
    /// [`restart`](Self::restart). A server started without one gets one.
    pub fn set_config(&mut self, config: &str) -> std::io::Result<()> {
        let path = self.store.join("nats-server.conf");
        std::fs::write(&path, config)?;
        self.config = Some(path);
        Ok(())
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills the server and starts it again on the same port with the same store (streams,
    /// consumers and stored messages survive).
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                // The port may linger for a moment.
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// Connect options for tests and the CLI: retry the first connect, reconnect forever with a
/// short backoff (100 ms steps, at most 1 s).
pub fn connect_options() -> async_nats::ConnectOptions {
    async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(2))
        .reconnect_delay_callback(|attempts| {
            Duration::from_millis((attempts as u64 * 100).clamp(100, 1000))
        })
}

/// A keyed kernel whose every output depends on every earlier input of its key, in order: the
/// soak (`resident bench soak`) and the keyed tests check exactly-once state with it. Each key's
/// state is a running hash and a count; the output of an input is the key's state after it.
pub mod fold {
    use resident::prelude::*;

    /// An input: the key, the producer's number for it, a value.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
    pub struct FoldInput {
        /// The key.
        pub key: u32,
        /// Padding (zero).
        pub pad: u32,
        /// The producer's number for this input (its id).
        pub n: u64,
        /// The value folded in.
        pub value: u64,
    }

    impl Keyed for FoldInput {
        fn key(&self) -> u32 {
            self.key
        }
    }

    /// A key's state.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
    pub struct FoldState {
        /// Running hash of the values, in order.
        pub hash: u64,
        /// Inputs applied.
        pub count: u64,
    }

    /// An output: the input's key and number, the key's state after it.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
    pub struct FoldOutput {
        /// The key.
        pub key: u32,
        /// Padding (zero).
        pub pad: u32,
        /// The input's number.
        pub n: u64,
        /// The key's state after the input.
        pub state: FoldState,
    }

    /// Applies one value to a state (order matters: a lost, repeated or reordered input
    /// changes every later output of the key).
    pub fn step(s: &mut FoldState, value: u64) {
        s.hash = (s.hash ^ value)
            .wrapping_mul(0x0000_0100_0000_01B3)
            .rotate_left(17)
            ^ s.count;
        s.count += 1;
    }

    /// The kernel: keyed over `states.len()` keys, one worker thread, active.
    pub fn launch(
        rt: &Runtime,
        id: &str,
        states: Vec<FoldState>,
    ) -> resident::Result<KernelHandle<FoldInput, FoldOutput>> {
        let k = rt.launch(
            RingKernel::<FoldInput, FoldOutput>::new(id)
                .queue_size(4096)
                .keyed_from(states)
                .workers(1)
                .key_handler(|ks: &mut KeyContext<FoldState>, m: FoldInput| {
                    let st = ks.state_mut();
                    step(st, m.value);
                    Some(FoldOutput {
                        key: m.key,
                        pad: 0,
                        n: m.n,
                        state: *st,
                    })
                }),
        )?;
        k.activate()?;
        Ok(k)
    }
}
