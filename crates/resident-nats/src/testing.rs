//! A real `nats-server` for tests and benchmarks: started with JetStream on a loopback port
//! picked here and a fresh store folder, killed (and the folder removed) on drop.
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
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl NatsServer {
    /// Starts a server, or prints `SKIP: <test>: ...` and returns `None` when `nats-server`
    /// is missing (panics instead under `RESIDENT_REQUIRE_NATS=1`). Panics if the server is
    /// installed but does not come up (that is a failure, not a skip).
    pub fn start_or_skip(test: &str) -> Option<NatsServer> {
        match nats_server_binary() {
            Some(bin) => Some(
                NatsServer::start(bin)
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
        let mut s = NatsServer {
            child: None,
            port: 0,
            store,
            binary,
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
        let mut child = Command::new(&self.binary)
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
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait()? {
                return Err(std::io::Error::other(format!(
                    "nats-server exited at start ({status}) on port {}",
                    self.port
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
