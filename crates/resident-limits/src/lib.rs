//! Limits on a compiler run over source that came from users: a wall-time limit, an
//! address-space limit and no core file, with the compiler and everything it starts (g++ runs
//! `cc1plus`, `as` and `ld`) in a process group of its own that is killed whole at the limit.
//!
//! Every engine's compiler runs this way, in a process of its own: CudaSim's host C++ compiler
//! as a child command ([`run`]), and the compilers that are libraries, NVRTC (CUDA) and naga
//! (WGSL), in a forked child of this process ([`run_forked`]). A compile that never ends is
//! [`Ended::Timeout`], one that allocates without bound [`Ended::OutOfMemory`] (the
//! address-space limit makes its allocations fail, so it ends, and the machine's other programs
//! never meet an OOM kill), one that dies of a signal or reports an internal compiler error
//! [`Ended::Crashed`]; each engine turns them into its typed errors (`SimError::CompileTimeout`,
//! `CudaError::CompileTimeout`, [`CompileStopped::CompileTimeout`] for WGSL, and the
//! out-of-memory and crash kin of each).
//!
//! This crate sits below every engine (it depends on no other crate of the workspace), so the
//! one way to run a compiler under limits serves them all.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Environment variable: the wall-time limit of one compile, in seconds (default 120).
pub const TIMEOUT_ENV: &str = "RESIDENT_COMPILE_TIMEOUT_S";
/// Environment variable: the address-space limit of one compile, in MiB (default 4096).
pub const MEMORY_ENV: &str = "RESIDENT_COMPILE_MEMORY_MB";

/// The most of a compiler's standard output or error kept (the rest is read and dropped, so a
/// compiler that prints without end neither blocks nor fills memory).
const KEEP_BYTES: usize = 4 << 20;

/// Limits on one compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompileLimits {
    /// Wall time, from the compiler's start to its exit.
    pub wall: Duration,
    /// Address space of each process of the compile, in bytes.
    pub memory_bytes: u64,
}

impl Default for CompileLimits {
    /// 120 s and 4 GiB: a ring kernel compiles in about a second and under 300 MB here.
    fn default() -> Self {
        CompileLimits {
            wall: Duration::from_secs(120),
            memory_bytes: 4 << 30,
        }
    }
}

/// A limit setting that is not a whole positive number.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name} = {value:?} is not a whole number above 0")]
pub struct BadLimit {
    /// The variable.
    pub name: &'static str,
    /// Its value (at most 64 bytes).
    pub value: String,
}

impl CompileLimits {
    /// The defaults, with [`TIMEOUT_ENV`] and [`MEMORY_ENV`] applied where set.
    pub fn from_env() -> Result<Self, BadLimit> {
        let mut l = CompileLimits::default();
        let read = |name: &'static str| -> Result<Option<u64>, BadLimit> {
            match std::env::var(name) {
                Err(_) => Ok(None),
                Ok(v) if v.trim().is_empty() => Ok(None),
                Ok(v) => match v.trim().parse::<u64>() {
                    Ok(n) if n > 0 => Ok(Some(n)),
                    _ => Err(BadLimit {
                        name,
                        value: v.chars().take(64).collect(),
                    }),
                },
            }
        };
        if let Some(s) = read(TIMEOUT_ENV)? {
            l.wall = Duration::from_secs(s);
        }
        if let Some(mb) = read(MEMORY_ENV)? {
            l.memory_bytes = mb.saturating_mul(1 << 20);
        }
        Ok(l)
    }
}

/// How a limited compile ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited by itself (successfully or with diagnostics): its status and output.
    Exited {
        /// Whether the exit status was 0.
        success: bool,
        /// Standard output (at most 4 MiB).
        stdout: Vec<u8>,
        /// Standard error (at most 4 MiB).
        stderr: Vec<u8>,
    },
    /// It ran past the wall-time limit and was killed.
    Timeout,
    /// It ran out of its address space (or was killed as the system ran out of memory).
    OutOfMemory,
    /// It died of a signal, or reported an internal compiler error; `reason` says which.
    Crashed {
        /// The signal or the compiler's report (at most 256 bytes).
        reason: String,
    },
}

/// A compile that ended short of an answer, by one of its limits or a crash: the typed error
/// of a compiler that has none of its own (naga; CUDA and CudaSim keep theirs).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompileStopped {
    /// It ran past the wall-time limit and was stopped.
    #[error(
        "{compiler} did not finish within {limit:?} (it was stopped; {TIMEOUT_ENV} sets the limit)"
    )]
    CompileTimeout {
        /// The compiler (`naga`).
        compiler: &'static str,
        /// The limit.
        limit: Duration,
    },
    /// It ran out of its address-space limit (or the system killed it for memory).
    #[error("{compiler} ran out of memory (limit {limit_mb} MiB above what the process held; {MEMORY_ENV} sets it)")]
    CompileOutOfMemory {
        /// The compiler.
        compiler: &'static str,
        /// The limit, MiB.
        limit_mb: u64,
    },
    /// It died (a signal: its stack overflowed, say), or its process could not be started.
    #[error("{compiler} crashed: {reason}")]
    CompileCrashed {
        /// The compiler.
        compiler: &'static str,
        /// The signal, or why (at most 256 bytes).
        reason: String,
    },
}

/// Runs `cmd` under `limits`; an error only when it cannot be started.
pub fn run(cmd: &mut Command, limits: &CompileLimits) -> std::io::Result<Ended> {
    let mem = limits.memory_bytes;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: the closure runs in the child between fork and exec and calls only setrlimit,
    // which is async-signal-safe; it touches no memory of the parent but its captured copy.
    unsafe {
        cmd.pre_exec(move || {
            let set = |res, v: u64| {
                let r = libc::rlimit {
                    rlim_cur: v as libc::rlim_t,
                    rlim_max: v as libc::rlim_t,
                };
                if libc::setrlimit(res, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            set(libc::RLIMIT_AS, mem)?;
            set(libc::RLIMIT_CORE, 0)?;
            Ok(())
        })
    };
    let mut child = cmd.spawn()?;
    let pgid = child.id() as libc::pid_t;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            if let Some(mut r) = r {
                let mut buf = [0u8; 64 << 10];
                while let Ok(n) = r.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let room = KEEP_BYTES.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
            kept
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let kill_group = || {
        // SAFETY: kill(2) of the process group the child leads (made by `process_group(0)`);
        // no memory is touched. ESRCH (already gone) is fine.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    };
    // The child is waited for on a thread of its own, so its exit is seen at once (no polling)
    // and the limit is a plain timed wait.
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = match rx.recv_timeout(limits.wall) {
        Ok(s) => Some(s?),
        Err(_) => {
            kill_group();
            // The wait returns once the killed leader is reaped.
            let _ = rx.recv();
            None
        }
    };
    let _ = waiter.join();
    // Whatever the compiler left running in its group (an assembler, a linker) goes with it.
    kill_group();
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let Some(status) = status else {
        return Ok(Ended::Timeout);
    };
    Ok(classify(status, stdout, stderr))
}

/// Runs `body` in a child process forked from the calling thread, under `limits`, the way
/// [`run`] runs a command: in a process group of its own, killed at the wall-time limit, no core
/// file, and an address-space limit of `limits.memory_bytes` above what the process held when it
/// was forked (it inherits the whole address space of this one, which may hold many GiB of
/// reservations). `body` writes its result to file descriptor 1 (at most `keep_stdout` bytes are
/// kept); whatever the child prints to 2 is kept bounded, to tell an out-of-memory end from a
/// crash, and stdin is `/dev/null`. Fatal signals have their default action in the child, so a
/// crash ends it without another handler of this process running there. An error only when the
/// child cannot be started.
///
/// This is for a compiler that is a library (NVRTC): the child needs nothing this process has
/// not loaded already. It has one thread (the caller's, with its stack), and what it may use
/// of this process is what survives a fork of a threaded process: memory allocation (glibc
/// makes it safe across fork), raw system calls, and code whose locks no other thread takes
/// (`body` must not print through Rust's `stdout`, spawn threads, or load a library).
///
/// # Safety
/// `body` runs in a forked copy of a threaded process: it must keep to the above, and must not
/// return before it has written its result (the child `_exit`s after it; a panic exits 101).
pub unsafe fn run_forked(
    limits: &CompileLimits,
    keep_stdout: usize,
    body: impl FnOnce(&mut ChildStdout),
) -> std::io::Result<Ended> {
    use std::os::fd::FromRawFd;
    let pipe = || -> std::io::Result<[libc::c_int; 2]> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(fds)
    };
    let out = pipe()?;
    let err = match pipe() {
        Ok(e) => e,
        Err(e) => {
            libc::close(out[0]);
            libc::close(out[1]);
            return Err(e);
        }
    };
    let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
    let close_all = || {
        for fd in [out[0], out[1], err[0], err[1], null] {
            if fd >= 0 {
                libc::close(fd);
            }
        }
    };
    if null < 0 {
        let e = std::io::Error::last_os_error();
        close_all();
        return Err(e);
    }
    let parent = libc::getpid();
    let mem = limits.memory_bytes;
    let pid = libc::fork();
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        close_all();
        return Err(e);
    }
    if pid == 0 {
        // The child: system calls only until `body`.
        libc::setpgid(0, 0);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        if libc::getppid() != parent {
            libc::_exit(125);
        }
        libc::dup2(null, 0);
        libc::dup2(out[1], 1);
        libc::dup2(err[1], 2);
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGABRT,
            libc::SIGTRAP,
        ] {
            libc::signal(sig, libc::SIG_DFL);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        let set = |res, v: u64| {
            let r = libc::rlimit {
                rlim_cur: v as libc::rlim_t,
                rlim_max: v as libc::rlim_t,
            };
            libc::setrlimit(res, &r) == 0
        };
        let held = held_address_space();
        if !set(libc::RLIMIT_CORE, 0) || !set(libc::RLIMIT_AS, held.saturating_add(mem)) {
            libc::_exit(126);
        }
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&mut ChildStdout)))
            .is_ok();
        libc::_exit(if ok { 0 } else { 101 });
    }
    // The parent.
    libc::close(out[1]);
    libc::close(err[1]);
    libc::close(null);
    let drain = |fd: libc::c_int, keep: usize| {
        // SAFETY: `fd` is the read end of a pipe this function made, owned by the File now.
        let mut f = std::fs::File::from_raw_fd(fd);
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = f.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let room = keep.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            kept
        })
    };
    let stdout = drain(out[0], keep_stdout);
    let stderr = drain(err[0], 64 << 10);
    let kill = || {
        // SAFETY: kill(2) of the child and of the group it leads; ESRCH (gone) is fine.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut status = 0;
        // SAFETY: waits for this function's own child, into `status`.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        let _ = tx.send((r, status));
    });
    let waited = match rx.recv_timeout(limits.wall) {
        Ok(w) => Some(w),
        Err(_) => {
            kill();
            let _ = rx.recv();
            None
        }
    };
    let _ = waiter.join();
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    match waited {
        None => Ok(Ended::Timeout),
        Some((r, _)) if r != pid => Err(std::io::Error::last_os_error()),
        Some((_, status)) => Ok(classify(
            std::process::ExitStatus::from_raw(status),
            stdout,
            stderr,
        )),
    }
}

/// The standard output of a [`run_forked`] child, written with `write(2)` (not through Rust's
/// `stdout`, whose lock another thread of the parent may have held when it forked).
#[derive(Debug)]
pub struct ChildStdout;

impl ChildStdout {
    /// Writes all of `b` (retrying on `EINTR`; a broken pipe ends the write: the parent is
    /// gone or stopped reading).
    pub fn write_all(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            // SAFETY: writes from the live slice `b` to descriptor 1.
            let n = unsafe { libc::write(1, b.as_ptr().cast(), b.len()) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            b = &b[n as usize..];
        }
    }
}

/// [`run_forked`] from a thread with a `stack_bytes` stack, so the child (a copy of that thread)
/// has it too: a library compiler's parser recurses per nesting level of the source. From the
/// calling thread when such a thread cannot be started.
///
/// # Safety
/// As [`run_forked`].
pub unsafe fn run_forked_on_stack(
    limits: &CompileLimits,
    keep_stdout: usize,
    stack_bytes: usize,
    body: impl FnOnce(&mut ChildStdout) + Send,
) -> std::io::Result<Ended> {
    let mut body = Some(body);
    let spawned = std::thread::scope(|scope| {
        let body = &mut body;
        std::thread::Builder::new()
            .name("compile".into())
            .stack_size(stack_bytes)
            .spawn_scoped(scope, move || {
                let body = body.take().expect("taken once");
                // SAFETY: the caller's contract, passed on.
                unsafe { run_forked(limits, keep_stdout, body) }
            })
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("the compile's thread panicked")))
            })
    });
    match (spawned, body.take()) {
        (Ok(ended), _) => ended,
        // SAFETY: as above, from this thread.
        (Err(_), Some(body)) => unsafe { run_forked(limits, keep_stdout, body) },
        (Err(e), None) => Err(e),
    }
}

impl CompileStopped {
    /// What a [`run_forked`] compile of `compiler` under `limits` gave: the child's standard
    /// output when it exited by itself with status 0, else how it ended.
    pub fn check(
        compiler: &'static str,
        limits: &CompileLimits,
        ended: std::io::Result<Ended>,
    ) -> Result<Vec<u8>, CompileStopped> {
        let crashed = |reason: String| CompileStopped::CompileCrashed {
            compiler,
            reason: reason.chars().take(256).collect(),
        };
        match ended {
            Err(e) => Err(crashed(format!("its process could not be started: {e}"))),
            Ok(Ended::Timeout) => Err(CompileStopped::CompileTimeout {
                compiler,
                limit: limits.wall,
            }),
            Ok(Ended::OutOfMemory) => Err(CompileStopped::CompileOutOfMemory {
                compiler,
                limit_mb: limits.memory_bytes >> 20,
            }),
            Ok(Ended::Crashed { reason }) => {
                Err(crashed(reason.replace("the compiler", "its process")))
            }
            Ok(Ended::Exited { success: false, .. }) => {
                Err(crashed("its process ended without a result".into()))
            }
            Ok(Ended::Exited { stdout, .. }) => Ok(stdout),
        }
    }

    /// A crash of `compiler` for `reason` (a report that came back cut, say).
    pub fn crashed(compiler: &'static str, reason: &str) -> Self {
        CompileStopped::CompileCrashed {
            compiler,
            reason: reason.chars().take(256).collect(),
        }
    }
}

/// A forked compile's report, written as little-endian pieces: bytes, `u32`s and `i32`s, and
/// byte strings with a `u64` length.
#[derive(Debug, Default)]
pub struct ReportWriter(Vec<u8>);

impl ReportWriter {
    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// A `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// An `i32`.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A byte string, after its `u64` length.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(&(b.len() as u64).to_le_bytes());
        self.0.extend_from_slice(b);
        self
    }
    /// The report.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

/// Reads a [`ReportWriter`]'s pieces back; each read is `None` past the end (a report cut
/// short), and a length past the end is refused, not allocated.
#[derive(Debug)]
pub struct ReportReader<'a>(&'a [u8]);

impl<'a> ReportReader<'a> {
    /// Reads `report`.
    pub fn new(report: &'a [u8]) -> Self {
        ReportReader(report)
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    /// One byte.
    pub fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    /// A `u32`.
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    /// An `i32`.
    pub fn i32(&mut self) -> Option<i32> {
        Some(i32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    /// A byte string.
    pub fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(u64::from_le_bytes(self.take(8)?.try_into().ok()?)).ok()?;
        self.take(n)
    }
    /// `Some(())` when every byte was read (a report with more is malformed).
    pub fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

/// The address space this process holds now, in bytes (`/proc/self/statm`'s first field; 0
/// where it cannot be read). System calls only: it runs in a forked child.
fn held_address_space() -> u64 {
    // SAFETY: open/read/close of a procfs file into a stack buffer.
    unsafe {
        let fd = libc::open(
            c"/proc/self/statm".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return 0;
        }
        let mut buf = [0u8; 64];
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        let mut pages = 0u64;
        for &b in buf.iter().take(n.max(0) as usize) {
            if !b.is_ascii_digit() {
                break;
            }
            pages = pages.saturating_mul(10).saturating_add(u64::from(b - b'0'));
        }
        let page = libc::sysconf(libc::_SC_PAGESIZE).max(4096) as u64;
        pages.saturating_mul(page)
    }
}

/// What the exit status and the compiler's report say.
fn classify(status: std::process::ExitStatus, stdout: Vec<u8>, stderr: Vec<u8>) -> Ended {
    let text = String::from_utf8_lossy(&stderr);
    // A library compiler (NVRTC's LLVM) reports a failed allocation and aborts.
    const ABORTED_OOM: [&str; 2] = ["LLVM ERROR: out of memory", "std::bad_alloc"];
    if status.signal().is_some() && ABORTED_OOM.iter().any(|m| text.contains(m)) {
        return Ended::OutOfMemory;
    }
    if let Some(sig) = status.signal() {
        // SIGKILL that was not ours: the system's OOM killer.
        if sig == libc::SIGKILL {
            return Ended::OutOfMemory;
        }
        return Ended::Crashed {
            reason: format!("the compiler died of signal {sig}"),
        };
    }
    if !status.success() {
        const OOM: [&str; 4] = [
            "out of memory allocating",
            "virtual memory exhausted",
            "Cannot allocate memory",
            "std::bad_alloc",
        ];
        if OOM.iter().any(|m| text.contains(m)) || text.contains("Killed signal terminated program")
        {
            return Ended::OutOfMemory;
        }
        if let Some(i) = text
            .find("internal compiler error")
            .or_else(|| text.find("terminated program"))
        {
            let line = text[i..].lines().next().unwrap_or_default();
            return Ended::Crashed {
                reason: line.chars().take(256).collect(),
            };
        }
    }
    Ended::Exited {
        success: status.success(),
        stdout,
        stderr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script);
        c
    }

    #[test]
    fn a_run_past_its_time_is_killed_with_its_children() {
        let l = CompileLimits {
            wall: Duration::from_millis(300),
            ..CompileLimits::default()
        };
        let start = Instant::now();
        // A child of the child that would outlive it: killed with the group.
        let r = run(&mut sh("sleep 30 & sleep 30"), &l).unwrap();
        assert!(matches!(r, Ended::Timeout), "{r:?}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn an_allocation_past_the_limit_fails_in_the_child() {
        let l = CompileLimits {
            memory_bytes: 64 << 20,
            ..CompileLimits::default()
        };
        // `head -c` of 1 GiB into a shell variable: the shell's allocation fails.
        let r = run(
            &mut sh("x=$(head -c 1073741824 /dev/zero | tr '\\0' a); echo ${#x}"),
            &l,
        )
        .unwrap();
        match r {
            Ended::Exited {
                success, stdout, ..
            } => {
                assert!(
                    !success || stdout.len() < 5,
                    "allocated past the limit: {stdout:?}"
                )
            }
            Ended::OutOfMemory | Ended::Crashed { .. } => {}
            Ended::Timeout => panic!("timed out"),
        }
    }

    #[test]
    fn exits_and_signals_are_told_apart() {
        let l = CompileLimits::default();
        match run(&mut sh("echo out; echo err >&2; exit 3"), &l).unwrap() {
            Ended::Exited {
                success,
                stdout,
                stderr,
            } => {
                assert!(!success);
                assert_eq!(
                    (stdout.as_slice(), stderr.as_slice()),
                    (&b"out\n"[..], &b"err\n"[..])
                );
            }
            e => panic!("{e:?}"),
        }
        assert!(matches!(
            run(&mut sh("kill -SEGV $$"), &l).unwrap(),
            Ended::Crashed { .. }
        ));
        assert!(matches!(
            run(
                &mut sh("echo 'cc1plus: out of memory allocating 65536 bytes' >&2; exit 1"),
                &l
            )
            .unwrap(),
            Ended::OutOfMemory
        ));
        // A compiler that prints without end is read to its exit, its output kept bounded.
        match run(&mut sh("head -c 20000000 /dev/zero"), &l).unwrap() {
            Ended::Exited { stdout, .. } => assert_eq!(stdout.len(), KEEP_BYTES),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn a_report_reads_back_and_a_cut_or_overlong_one_is_refused() {
        let b = ReportWriter::default()
            .u8(7)
            .u32(9)
            .i32(-3)
            .bytes(b"log")
            .finish();
        let mut r = ReportReader::new(&b);
        assert_eq!(
            (r.u8(), r.u32(), r.i32(), r.bytes(), r.end()),
            (Some(7), Some(9), Some(-3), Some(&b"log"[..]), Some(()))
        );
        for cut in 0..b.len() {
            let mut r = ReportReader::new(&b[..cut]);
            let whole =
                r.u8().is_some() && r.u32().is_some() && r.i32().is_some() && r.bytes().is_some();
            assert!(!whole, "cut at {cut}");
        }
        let mut huge = ReportWriter::default().u8(1).finish();
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        let mut r = ReportReader::new(&huge);
        assert_eq!((r.u8(), r.bytes()), (Some(1), None));
    }

    #[test]
    fn bad_settings_are_typed() {
        assert_eq!(
            BadLimit {
                name: TIMEOUT_ENV,
                value: "x".into()
            }
            .to_string(),
            "RESIDENT_COMPILE_TIMEOUT_S = \"x\" is not a whole number above 0"
        );
    }
}
