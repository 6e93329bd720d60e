//! CudaSim's model of the CUDA driver's context: the two ways a real context differs from
//! plain host threads that matter to a resident kernel, so a path that hangs or fails on a GPU
//! fails on CudaSim in CI first.
//!
//! 1. **Calls that wait for the device.** A driver call that [`synchronizes`] (the table in
//!    [`resident_cuda::hazards`]) waits until no kernel of the context runs. With a ring kernel
//!    resident that is forever; here it waits for the running blocks as the driver does, up to
//!    [`sync_wait`], and then fails with [`SimError::WouldWaitForDevice`] naming the call and
//!    the kernels that were running (on a GPU: a hang). Each such failure is also recorded
//!    ([`SimContext::hazards`]), so a call made where no error can be returned (a `Drop`)
//!    still fails the test that caused it.
//! 2. **Sticky faults.** A device fault (`__trap()`, an illegal address caught by the shim)
//!    poisons the whole context: every kernel of it fails, and every later call fails with
//!    [`SimError::ContextLost`] (the driver's `CUDA_ERROR_LAUNCH_FAILED`) until the context is
//!    reset ([`SimContext::reset_if_unused`], as `cuDevicePrimaryCtxReset`), which is allowed
//!    only once no kernel of the lost context is left.
//!
//! 3. **Speed (opt-in).** CudaSim runs a kernel's block as OS threads, some hundred times slower
//!    than a GPU, so a host timer that races a kernel's progress can win here and lose there.
//!    [`SimContext::set_host_dilation`] (or `RESIDENT_CUDASIM_HOST_DILATION=<factor>`) stretches
//!    the host pauses that race the kernels by that factor, so the race comes out as on a GPU:
//!    today the device pump's pause between two offers of a device-forwarding link (an H100
//!    relayed a whole 3000-message chain through the host before the first offer; CudaSim, 100x
//!    slower, was linked after 64). Default 1: no dilation.
//!
//! Strict mode (the hazards of 1.) is on unless `RESIDENT_CUDASIM_STRICT=0`; faults are always
//! sticky. One context per process: CudaSim has one device.
//!
//! A real driver may refuse the reset: on an H100 with driver 580 (measured), a context lost to
//! a `trap` stays lost after `cuDevicePrimaryCtxReset` and after every reference is released,
//! for the rest of the process. `RESIDENT_CUDASIM_RESET=never` models that driver (the reset
//! never clears the fault); the default lets the context recover, so one test process can
//! fault the device more than once.
//!
//! [`synchronizes`]: resident_cuda::hazards::DriverCall::synchronizes

use std::collections::{BTreeMap, HashSet};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::sim::SimError;
use resident_cuda::hazards::DriverCall;

/// Environment variable that turns the strict model off (`0`, `off` or `false`).
pub const STRICT_ENV: &str = "RESIDENT_CUDASIM_STRICT";

/// Environment variable: `never` makes the context's reset leave a fault in place, as the
/// driver measured on a GPU does (see the module's notes); anything else, or unset, lets it
/// recover.
pub const RESET_ENV: &str = "RESIDENT_CUDASIM_RESET";

/// Whether a reset clears a fault by default (`RESIDENT_CUDASIM_RESET` is not `never`);
/// [`SimContext::set_reset_recovers`] changes it for the process.
fn reset_recovers_by_env() -> bool {
    std::env::var(RESET_ENV).map_or(true, |v| v.trim() != "never")
}

/// Environment variable: the factor by which the host pauses that race a kernel's progress
/// are stretched (see the module's notes, 3.); unset, unparsable or 0 means 1.
pub const HOST_DILATION_ENV: &str = "RESIDENT_CUDASIM_HOST_DILATION";

fn host_dilation_by_env() -> u32 {
    std::env::var(HOST_DILATION_ENV)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// Environment variable: how long, in milliseconds, a synchronizing call waits for the running
/// blocks before it is reported as a call that would hang on a GPU (default 10000).
pub const SYNC_WAIT_ENV: &str = "RESIDENT_CUDASIM_SYNC_WAIT_MS";

/// Whether synchronizing calls wait for the running blocks (the strict model).
pub fn strict() -> bool {
    static S: OnceLock<bool> = OnceLock::new();
    *S.get_or_init(|| {
        !matches!(
            std::env::var(STRICT_ENV).as_deref().map(str::trim),
            Ok("0") | Ok("off") | Ok("false")
        )
    })
}

/// How long a synchronizing call waits for the running blocks before it fails.
pub fn sync_wait() -> Duration {
    static W: OnceLock<Duration> = OnceLock::new();
    *W.get_or_init(|| {
        std::env::var(SYNC_WAIT_ENV)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or(Duration::from_secs(10), Duration::from_millis)
    })
}

/// The device fault that lost a context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextFault {
    /// The kernel entry whose block faulted.
    pub entry: String,
    /// What faulted, as the shim reported it.
    pub reason: String,
}

impl std::fmt::Display for ContextFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device fault in `{}`: {}", self.entry, self.reason)
    }
}

/// A synchronizing call made while kernels ran and did not finish within [`sync_wait`]: on a
/// GPU, a call that never returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hazard {
    /// The call.
    pub call: DriverCall,
    /// The kernels whose blocks were running.
    pub running: Vec<String>,
}

#[derive(Default)]
struct CtxState {
    /// Blocks executing now: token -> kernel name.
    running: BTreeMap<u64, String>,
    next_token: u64,
    /// The context's generation: bumped by every reset.
    generation: u64,
    /// The fault that lost the current generation (sticky until reset).
    fault: Option<ContextFault>,
    /// Faults of earlier generations (their kernels still report them).
    history: Vec<(u64, ContextFault)>,
    /// Kernels of the current generation not yet dropped.
    live: usize,
    /// Whether a reset clears a fault (`false`: the driver measured on a GPU, see the module's
    /// notes). Set from [`RESET_ENV`] when the context is made.
    reset_recovers: bool,
    /// The speed model's factor (module notes, 3.). Set from [`HOST_DILATION_ENV`] when the
    /// context is made.
    host_dilation: u32,
    /// Modules loaded in the current generation (by key).
    loaded: HashSet<String>,
    /// Spare ring-kernel streams of the current generation (the GPU launcher's pool on its
    /// `Device`; a reset takes them with the context).
    spare_streams: usize,
    /// Synchronizing calls that would have hung.
    hazards: Vec<Hazard>,
    /// Calls made, by kind.
    counts: BTreeMap<&'static str, u64>,
}

/// CudaSim's driver context (one per process).
pub struct SimContext {
    st: Mutex<CtxState>,
    cv: Condvar,
}

/// A block registered as running; unregisters on drop.
pub struct RunningBlock {
    token: u64,
}

/// One kernel's membership in a context generation; given back on drop.
pub struct KernelLife {
    generation: u64,
}

impl KernelLife {
    /// The generation the kernel was launched in.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The fault that lost this kernel's context, if it was lost.
    pub fn fault(&self) -> Option<ContextFault> {
        SimContext::get().fault_of(self.generation)
    }
}

impl Drop for KernelLife {
    fn drop(&mut self) {
        let ctx = SimContext::get();
        let mut st = ctx.lock();
        if st.generation == self.generation {
            st.live = st.live.saturating_sub(1);
        }
    }
}

/// A ring kernel's stream from [`SimContext::take_stream`]: held while any block of the kernel
/// may still run, then given back to the spare ones.
#[derive(Debug)]
pub struct SimStream {
    generation: u64,
}

impl Drop for SimStream {
    fn drop(&mut self) {
        let ctx = SimContext::get();
        let mut st = ctx.lock();
        if st.generation == self.generation {
            st.spare_streams += 1;
        }
    }
}

impl Drop for RunningBlock {
    fn drop(&mut self) {
        let ctx = SimContext::get();
        ctx.lock().running.remove(&self.token);
        ctx.cv.notify_all();
    }
}

impl SimContext {
    /// The process's CudaSim context.
    pub fn get() -> &'static SimContext {
        static C: OnceLock<SimContext> = OnceLock::new();
        C.get_or_init(|| SimContext {
            st: Mutex::new(CtxState {
                reset_recovers: reset_recovers_by_env(),
                host_dilation: host_dilation_by_env(),
                ..CtxState::default()
            }),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, CtxState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lost(call: DriverCall, fault: &ContextFault) -> SimError {
        SimError::ContextLost {
            call,
            entry: fault.entry.clone(),
            reason: fault.reason.clone(),
        }
    }

    /// Makes driver call `call`: fails on a lost context; a synchronizing call waits (strict
    /// mode) until no block runs, or fails after [`sync_wait`] and records the hazard.
    pub fn call(&self, call: DriverCall) -> Result<(), SimError> {
        self.call_waiting(call, sync_wait())
    }

    /// [`call`](Self::call) with its own bound on the wait.
    fn call_waiting(&self, call: DriverCall, wait: Duration) -> Result<(), SimError> {
        let mut st = self.lock();
        *st.counts.entry(call.name()).or_default() += 1;
        if let Some(f) = &st.fault {
            return Err(Self::lost(call, f));
        }
        if !(call.synchronizes() && strict()) {
            return Ok(());
        }
        let deadline = Instant::now() + wait;
        while !st.running.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                let running: Vec<String> = st.running.values().cloned().collect();
                st.hazards.push(Hazard {
                    call,
                    running: running.clone(),
                });
                return Err(SimError::WouldWaitForDevice {
                    call,
                    running,
                    waited: wait,
                });
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if let Some(f) = &st.fault {
                return Err(Self::lost(call, f));
            }
        }
        Ok(())
    }

    /// Loads module `key` (a driver module load the first time in this generation, nothing
    /// after: kernels of one source share the module, as on a GPU). `Ok(true)` when this call
    /// loaded it.
    pub fn load_module(&self, key: &str) -> Result<bool, SimError> {
        if self.is_loaded(key) {
            return match self.fault() {
                Some(f) => Err(Self::lost(DriverCall::ModuleLoad, &f)),
                None => Ok(false),
            };
        }
        self.call(DriverCall::ModuleLoad)?;
        Ok(self.lock().loaded.insert(key.to_string()))
    }

    /// Whether module `key` is loaded in the current generation.
    pub fn is_loaded(&self, key: &str) -> bool {
        self.lock().loaded.contains(key)
    }

    /// Registers a kernel of the current generation (for [`reset_if_unused`](Self::reset_if_unused)).
    pub fn kernel_created(&self) -> KernelLife {
        let mut st = self.lock();
        st.live += 1;
        KernelLife {
            generation: st.generation,
        }
    }

    /// A block of `kernel` (launched in generation `generation`) starts running: refused on a
    /// lost context (the launch fails with `CUDA_ERROR_LAUNCH_FAILED`).
    pub fn block_started(&self, kernel: &str, generation: u64) -> Result<RunningBlock, SimError> {
        let mut st = self.lock();
        *st.counts
            .entry(DriverCall::LaunchKernel.name())
            .or_default() += 1;
        if let Some(f) = Self::fault_in(&st, generation) {
            return Err(Self::lost(DriverCall::LaunchKernel, &f));
        }
        let token = st.next_token;
        st.next_token += 1;
        st.running.insert(token, kernel.to_string());
        Ok(RunningBlock { token })
    }

    fn fault_in(st: &CtxState, generation: u64) -> Option<ContextFault> {
        if generation == st.generation {
            return st.fault.clone();
        }
        st.history
            .iter()
            .find(|(g, _)| *g == generation)
            .map(|(_, f)| f.clone())
            // A generation that was reset without a recorded fault (not reachable today):
            // its memory is gone all the same.
            .or_else(|| {
                Some(ContextFault {
                    entry: "(context reset)".into(),
                    reason: "the context this kernel ran in was reset".into(),
                })
            })
    }

    /// The fault that lost generation `generation`, if it was lost.
    pub fn fault_of(&self, generation: u64) -> Option<ContextFault> {
        Self::fault_in(&self.lock(), generation)
    }

    /// The fault that lost the current generation, if any.
    pub fn fault(&self) -> Option<ContextFault> {
        self.lock().fault.clone()
    }

    /// A block faulted: the context is lost (the first fault sticks) and every waiting call
    /// fails.
    pub fn poison(&self, entry: &str, reason: &str) {
        let mut st = self.lock();
        if st.fault.is_none() {
            st.fault = Some(ContextFault {
                entry: entry.to_string(),
                reason: reason.to_string(),
            });
        }
        drop(st);
        self.cv.notify_all();
    }

    /// `cuDevicePrimaryCtxReset`: a lost context with no kernel of it left starts a new
    /// generation (modules unloaded, the fault cleared). `true` when it reset; `false` when
    /// the context is healthy or kernels of it are still alive.
    pub fn reset_if_unused(&self) -> bool {
        let mut st = self.lock();
        if st.live > 0 || (st.fault.is_some() && !st.reset_recovers) {
            return false;
        }
        let Some(f) = st.fault.take() else {
            return false;
        };
        let g = st.generation;
        st.history.push((g, f));
        st.generation += 1;
        st.loaded.clear();
        st.spare_streams = 0;
        true
    }

    /// Spare ring-kernel streams: a launch that takes one makes no driver call.
    pub fn spare_streams(&self) -> usize {
        self.lock().spare_streams
    }

    /// Makes streams until `n` are spare, each a `StreamCreate` call: synchronizing (it may
    /// wait for the device: the H200's 35th ring-kernel launch hung in it with 34 resident), so
    /// strict mode refuses it beside running blocks, as it does a module load.
    pub fn fill_streams(&self, n: usize) -> Result<(), SimError> {
        self.fill_streams_waiting(n, sync_wait())
    }

    /// [`fill_streams`](Self::fill_streams) with its own bound on each call's wait.
    fn fill_streams_waiting(&self, n: usize, wait: Duration) -> Result<(), SimError> {
        while self.spare_streams() < n {
            self.call_waiting(DriverCall::StreamCreate, wait)?;
            self.lock().spare_streams += 1;
        }
        Ok(())
    }

    /// Takes a spare stream (no driver call), `None` when there is none. It comes back when
    /// the [`SimStream`] drops, unless a reset took the context's streams since.
    pub fn take_stream(&self) -> Option<SimStream> {
        let mut st = self.lock();
        st.spare_streams = st.spare_streams.checked_sub(1)?;
        Some(SimStream {
            generation: st.generation,
        })
    }

    /// Whether a reset clears a fault: `false` models the driver measured on a GPU (a lost
    /// context stays lost for the process); `true` (the default) lets one test process fault
    /// the device more than once. Returns the previous setting.
    pub fn set_reset_recovers(&self, recovers: bool) -> bool {
        std::mem::replace(&mut self.lock().reset_recovers, recovers)
    }

    /// The factor by which host pauses that race a kernel are stretched (module notes, 3.):
    /// at least 1. Read by a kernel's host when it starts.
    pub fn host_dilation(&self) -> u32 {
        self.lock().host_dilation.max(1)
    }

    /// Sets the speed model's factor for kernels started from now on (0 counts as 1: no
    /// dilation). Returns the previous setting.
    pub fn set_host_dilation(&self, factor: u32) -> u32 {
        std::mem::replace(&mut self.lock().host_dilation, factor.max(1))
    }

    /// Waits up to `timeout` until no kernel of the lost context is left and resets it;
    /// `true` when the context is healthy at the end.
    pub fn recover(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.fault().is_none() || self.reset_if_unused() {
                return true;
            }
            // A driver that never recovers: nothing to wait for once no kernel is left.
            let settled = {
                let st = self.lock();
                st.live == 0 && !st.reset_recovers
            };
            if settled {
                return false;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The kernels whose blocks run now.
    pub fn running(&self) -> Vec<String> {
        self.lock().running.values().cloned().collect()
    }

    /// Every synchronizing call so far that would have hung on a GPU.
    pub fn hazards(&self) -> Vec<Hazard> {
        self.lock().hazards.clone()
    }

    /// How many times `call` was made.
    pub fn count(&self, call: DriverCall) -> u64 {
        self.lock().counts.get(call.name()).copied().unwrap_or(0)
    }
}

/// For a test that faults a device on purpose. A fault loses the context for the whole
/// process (on a GPU, and in this model), so every kernel of the tests running beside it would
/// fail too: such a test runs alone, in a child process of its own test binary. Returns `true`
/// in the child (run the test's body) and `false` in the parent once the child passed; panics
/// with the child's output when it failed. `test` is the test's full name as the harness lists
/// it (`module::name`).
#[doc(hidden)] // test support for the crates of this workspace
pub fn fault_test_in_own_process(test: &str) -> bool {
    const CHILD: &str = "RESIDENT_FAULT_TEST_CHILD";
    if std::env::var(CHILD).as_deref() == Ok(test) {
        return true;
    }
    let exe = std::env::current_exe().expect("the running test binary");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .output()
        .expect("the test binary runs again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{test}, run in its own process, failed:\n{text}"
    );
    assert!(
        text.contains("1 passed"),
        "{test}: its own process ran no test:\n{text}"
    );
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    // The context is process-wide: these tests run in one function so they do not race.
    #[test]
    fn synchronizing_calls_wait_for_running_blocks_and_faults_stick_until_reset() {
        let ctx = SimContext::get();
        let life = ctx.kernel_created();
        // Nothing runs: a synchronizing call returns at once.
        ctx.call(DriverCall::MemFree).unwrap();
        // A block runs and ends within the wait: the call waits for it, as the driver does.
        let b = ctx.block_started("k", life.generation()).unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(b);
        });
        let start = Instant::now();
        ctx.call(DriverCall::MemHostAlloc).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(40));
        t.join().unwrap();
        // A block that stays: a non-synchronizing call goes through, a synchronizing one fails
        // typed and is recorded.
        let b = ctx.block_started("resident", life.generation()).unwrap();
        ctx.call(DriverCall::MemAllocAsync).unwrap();
        if strict() {
            match ctx.call_waiting(DriverCall::MemFree, Duration::from_millis(100)) {
                Err(SimError::WouldWaitForDevice { call, running, .. }) => {
                    assert_eq!(call, DriverCall::MemFree);
                    assert_eq!(running, vec!["resident".to_string()]);
                }
                other => panic!("expected WouldWaitForDevice, got {other:?}"),
            }
            assert!(ctx.hazards().iter().any(|h| h.call == DriverCall::MemFree));
        }
        // A fault is sticky: every call fails, no reset while a kernel of it is alive.
        ctx.poison("k", "trap");
        drop(b);
        assert!(matches!(
            ctx.call(DriverCall::MemAllocAsync),
            Err(SimError::ContextLost { .. })
        ));
        assert!(matches!(
            ctx.block_started("again", life.generation()),
            Err(SimError::ContextLost { .. })
        ));
        assert!(!ctx.reset_if_unused());
        let g = life.generation();
        drop(life);
        assert!(ctx.recover(Duration::from_secs(1)));
        assert_eq!(ctx.generation(), g + 1);
        assert!(ctx.fault_of(g).is_some(), "the old generation stays lost");
        let fresh = ctx.kernel_created();
        ctx.call(DriverCall::MemAllocAsync).unwrap();
        let b = ctx.block_started("fresh", fresh.generation()).unwrap();
        drop(b);

        // Ring-kernel streams: made while no block runs, taken with no driver call, given back
        // when dropped; making one beside a running block would wait for it (refused in
        // strict mode); a reset takes the spare ones with the context.
        assert_eq!(ctx.spare_streams(), 0);
        ctx.fill_streams(2).unwrap();
        let s1 = ctx.take_stream().unwrap();
        let b = ctx.block_started("resident", fresh.generation()).unwrap();
        let s2 = ctx.take_stream().unwrap();
        assert!(ctx.take_stream().is_none());
        if strict() {
            match ctx.fill_streams_waiting(1, Duration::from_millis(100)) {
                Err(SimError::WouldWaitForDevice { call, .. }) => {
                    assert_eq!(call, DriverCall::StreamCreate)
                }
                other => panic!("expected WouldWaitForDevice, got {other:?}"),
            }
        }
        drop(s1);
        assert_eq!(ctx.spare_streams(), 1);
        ctx.poison("resident", "trap");
        drop(b);
        drop(fresh);
        assert!(ctx.recover(Duration::from_secs(1)));
        assert_eq!(ctx.spare_streams(), 0, "a reset takes the spare streams");
        drop(s2);
        assert_eq!(
            ctx.spare_streams(),
            0,
            "a stream of a reset context does not come back"
        );
    }
}
