//! [`SimKernel`]: the persistent ring kernel on CudaSim. The template and the user's handler
//! (the very source the GPU runs) are compiled by the host C++ compiler against the shim and
//! run as one block of real OS threads over the same queue layout and control block a GPU
//! uses; the host's half of the protocol is [`PersistentQueues`], unchanged.
//!
//! The queues and the state live in host memory (the "device" is the host); the kernel's block
//! runs on a launcher thread until it exits (terminate, heartbeat timeout, a parameter error)
//! or faults (`__trap()` in any thread faults the block: see [`SimKernel::check`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytemuck::Pod;
use resident_ring::spsc::{HeapMemory, RingMemory};
use resident_ring::{Envelope, Slot};

use super::check::{check_launch, wait_resident, Starting};
use super::control::{ControlBlock, DeviceCounters, DeviceState, RunState};
use super::host::{Full, PersistentQueues, QueueConfig};
use super::park::Parking;
use super::template::{compile_sim, KernelSource, PersistentParams, PERSISTENT_KERNEL_NAME};
use super::{FaultCause, PersistentError, SharedMemory};
use crate::sim::driver::{KernelLife, SimContext};
use crate::sim::{SimError, SimInstance};
use resident_cuda::arena::Arena;
use resident_cuda::hazards::DriverCall;

/// How to launch a [`SimKernel`].
#[derive(Clone, Debug)]
pub struct SimLaunchOptions {
    /// Queue geometry (`out_capacity` must be at least the source's batch size).
    pub queues: QueueConfig,
    /// The kernel exits when [`SimKernel::heartbeat`] is not called for this long (`None`:
    /// never).
    pub heartbeat_timeout: Option<Duration>,
    /// Longest idle `__nanosleep` of thread 0 between polls (on the host a sleep below the
    /// timer slack, about 50 us, costs a wake-up anyway, so the default is 50 us).
    pub max_backoff_ns: u32,
    /// Longest time between control-block reads while active.
    pub control_poll: Duration,
    /// How long `launch` waits for the kernel to report it is resident.
    pub start_timeout: Duration,
    /// The bound buffers' initial values, one per [`KernelSource::buffers`] entry, in order:
    /// copied into host memory the block's threads use, reachable through
    /// [`SimKernel::buffers`].
    pub buffers: Vec<super::BufferInit>,
    /// The lanes' bulk paths ([`super::bulk`]): a copy engine thread, a staging ring and a
    /// device ring per lane unless [`BulkMode::Off`](super::BulkMode::Off).
    pub bulk: super::BulkConfig,
}

impl Default for SimLaunchOptions {
    fn default() -> Self {
        SimLaunchOptions {
            queues: QueueConfig {
                lanes: 1,
                lane_capacity: 4096,
                out_capacity: 4096,
            },
            heartbeat_timeout: Some(Duration::from_secs(10)),
            max_backoff_ns: 50_000,
            control_poll: Duration::from_micros(200),
            start_timeout: Duration::from_secs(30),
            buffers: Vec::new(),
            bulk: super::BulkConfig::default(),
        }
    }
}

/// What the launcher thread reports when the block has exited for good.
type Exit = Result<(), SimError>;

/// The quiesce state of one kernel, shared by its handle, its launcher thread and the
/// process-wide registry that [`with_all_quiesced`] walks.
struct QuiesceShared {
    control: SharedMemory,
    /// The address of the kernel's output ring (what a consumer's peer slot names).
    out: u64,
    state: Mutex<QState>,
    cv: Condvar,
}

#[derive(Default)]
struct QState {
    /// The host's side of parks (the rule the GPU launcher follows too).
    park: Parking,
    /// The block exited on the quiesce and the launcher waits to relaunch it.
    parked: bool,
    /// Bumped by every resume: a block that parked after the launch it was started by saw
    /// this value relaunches once it changes.
    resume: u64,
    /// The launcher is gone (final exit or fault).
    finished: bool,
    /// The kernel was dropped while its block still ran (a handler that never returns): it
    /// was told to terminate, its host side is gone, and it is left out of later quiesces (it
    /// will never park; on a GPU such a kernel needs a context reset).
    abandoned: bool,
}

impl QuiesceShared {
    fn control(&self) -> &ControlBlock {
        // SAFETY: the control memory was checked by PersistentQueues (CONTROL_BLOCK_BYTES,
        // 128-aligned) and lives as long as `self`.
        unsafe { &*(self.control.as_mut_ptr() as *const ControlBlock) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The host's run-state writes go through here so a quiesce never loses one. A terminate
    /// ends a park: the launcher of a parked block sees it and finishes, with no relaunch
    /// beside the operation of the quiesce that parked it.
    fn set_run_state(&self, rs: RunState) {
        let mut q = self.lock();
        q.park.set_run_state(self.control(), rs);
        self.cv.notify_all();
    }

    /// Asks the block to finish its batch and exit (queues stay), and waits until it has.
    fn quiesce(&self, timeout: Duration) -> bool {
        let mut q = self.lock();
        if q.finished || q.abandoned {
            return true;
        }
        q.park.request(self.control());
        let deadline = Instant::now() + timeout;
        while !q.parked && !q.finished && !q.abandoned {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            q = self
                .cv
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Relaunches a quiesced block with the run state the host wants.
    fn resume(&self) {
        let mut q = self.lock();
        if !q.park.resume(self.control()) {
            return;
        }
        q.resume += 1;
        // No longer parked from here on, although the launcher thread may not have woken to
        // relaunch yet: a quiesce that follows at once must wait for the relaunched block to
        // park again, not take the stale flag for a parked block.
        q.parked = false;
        self.cv.notify_all();
    }
}

fn registry() -> &'static Mutex<Vec<Weak<QuiesceShared>>> {
    static R: std::sync::OnceLock<Mutex<Vec<Weak<QuiesceShared>>>> = std::sync::OnceLock::new();
    R.get_or_init(|| Mutex::new(Vec::new()))
}

static RELAUNCHES: AtomicU64 = AtomicU64::new(0);

/// Relaunches after a quiesce, over the process's life (for tests and telemetry).
pub fn relaunch_count() -> u64 {
    RELAUNCHES.load(Ordering::Relaxed)
}

/// Serializes quiesces: [`with_all_quiesced`] and the per-kernel parks of bound-buffer
/// accesses ([`SimBuffers`]) never overlap, so one never resumes a kernel the other parked.
static QUIESCE_SERIAL: Mutex<()> = Mutex::new(());

/// The residency rule on CudaSim: every resident CudaSim ring kernel of the process parks and
/// exits (finishing the batch in hand, outputs included; queues, indices, counters and state
/// stay), `op` runs, and every kernel is relaunched where it left off, with the run state the
/// host last asked for. Messages sent meanwhile queue up in the lanes; nothing is lost or
/// reordered. Calls are serialized. Errors: [`PersistentError::Timeout`] when a kernel did not
/// park within `timeout` (then `op` does not run and every kernel is resumed).
pub fn with_all_quiesced<R>(
    timeout: Duration,
    op: impl FnOnce() -> R,
) -> Result<R, PersistentError> {
    let _serial = QUIESCE_SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut live: Vec<Arc<QuiesceShared>> = {
        let mut r = registry().lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|w| w.strong_count() > 0);
        r.iter().filter_map(|w| w.upgrade()).collect()
    };
    super::peer::upstream_first(&mut live, |k| (k.out, k.control().peer_ring()));
    let mut parked = Vec::with_capacity(live.len());
    let mut failed = false;
    let deadline = Instant::now() + timeout;
    for k in &live {
        let left = deadline.saturating_duration_since(Instant::now());
        let ok = k.quiesce(left);
        parked.push(k.clone());
        if !ok {
            failed = true;
            break;
        }
    }
    let out = if failed { None } else { Some(op()) };
    for k in &parked {
        k.resume();
    }
    out.ok_or(PersistentError::Timeout {
        name: "(every resident CudaSim kernel)".into(),
        what: "the resident kernels to quiesce",
    })
}

/// How long a kernel whose context another kernel's fault lost waits for its own block to
/// stop (a GPU kills it; CudaSim's host threads must see the terminate).
const CONTEXT_LOST_WAIT: Duration = Duration::from_secs(1);

/// How long dropping a still-running kernel waits for its block to exit before leaving it.
const DROP_WAIT: Duration = Duration::from_secs(2);

/// A persistent ring kernel running on CudaSim.
pub struct SimKernel<In: Pod + Send, Out: Pod + Send> {
    name: String,
    queues: PersistentQueues<In, Out>,
    state: SharedMemory,
    state_len: usize,
    done: Receiver<Exit>,
    thread: Option<JoinHandle<()>>,
    /// Set once the launcher reported: `Some(Ok)` exited, `Some(Err)` faulted.
    exit: Option<Result<(), FaultCause>>,
    instance: Option<Arc<SimInstance>>,
    quiesce: Arc<QuiesceShared>,
    buffers: Option<Arc<SimBuffers>>,
    /// The host's synchronized view of the state (see [`SimKernel::state`]).
    state_access: Arc<SimState>,
    /// The peer-input slot, made on first use ([`SimKernel::peer_input`]).
    peer: std::sync::OnceLock<Arc<super::peer::PeerInput>>,
    /// Its place in the driver model's context (a lost context fails it).
    life: KernelLife,
}

/// The pinned queue memory of CudaSim's context ([`resident_cuda::arena`]).
fn sim_arena() -> &'static Arena {
    static A: std::sync::OnceLock<Arena> = std::sync::OnceLock::new();
    A.get_or_init(Arena::new)
}

/// Streams a refill of CudaSim's spare ring-kernel streams makes (the GPU launcher makes its
/// device's residency limit + 1; CudaSim has no such limit, so a fixed batch: a launch beyond
/// it parks the resident kernels for the next refill, as a GPU launch beyond the limit would).
const SIM_STREAM_REFILL: usize = 16;

/// How long a launch that found no spare stream waits for the resident kernels to park for a
/// refill (CudaSim runs a batch some hundred times slower than a GPU).
const SIM_STREAM_QUIESCE_TIMEOUT: Duration = Duration::from_secs(30);

/// The key the driver model knows a module by (its compiled object).
fn module_key(module: &crate::sim::SimModule) -> String {
    module.path().to_string_lossy().into_owned()
}

impl<In: Pod + Send, Out: Pod + Send> SimKernel<In, Out> {
    /// Whether launching a kernel of `module` with `opts` makes a driver call that waits for
    /// the whole device (the module is not loaded yet, or the pinned arena must grow for its
    /// queues): then the caller parks the resident kernels around [`prepare`](Self::prepare).
    /// Otherwise the launch makes no such call and resident kernels, a stuck one included,
    /// keep running.
    pub fn launch_needs_idle_device(
        module: &crate::sim::SimModule,
        opts: &SimLaunchOptions,
    ) -> bool {
        let ctx = SimContext::get();
        !ctx.is_loaded(&module_key(module))
            || !sim_arena().fits(&Self::pinned_sizes(opts))
            || ctx.spare_streams() < Self::streams(opts)
    }

    /// The pinned pieces a launch takes from the arena: the queues, and the bulk lanes'
    /// staging rings and heads line when they are on.
    fn pinned_sizes(opts: &SimLaunchOptions) -> Vec<usize> {
        let mut sizes = PersistentQueues::<In, Out>::allocation_sizes(opts.queues);
        if opts.bulk.enabled() {
            sizes.extend(PersistentQueues::<In, Out>::bulk_allocation_sizes(
                opts.queues,
            ));
        }
        sizes
    }

    /// Streams a launch takes: the kernel's, and a copy stream for its bulk lanes.
    fn streams(opts: &SimLaunchOptions) -> usize {
        1 + opts.bulk.enabled() as usize
    }

    /// Makes the synchronizing calls a launch of `module` with `opts` needs: loads the module
    /// and grows the pinned arena when it has no room for the queues. A no-op when
    /// [`launch_needs_idle_device`](Self::launch_needs_idle_device) is `false`.
    pub fn prepare(
        module: &crate::sim::SimModule,
        opts: &SimLaunchOptions,
    ) -> Result<(), PersistentError> {
        let ctx = SimContext::get();
        ctx.load_module(&module_key(module))?;
        let sizes = Self::pinned_sizes(opts);
        if !sim_arena().fits(&sizes) {
            sim_arena().grow(&sizes, |n| -> Result<_, PersistentError> {
                ctx.call(DriverCall::MemHostAlloc)?;
                // CudaSim's device addresses are host addresses.
                let m = Arc::new(HeapMemory::new(n)?) as Arc<dyn RingMemory>;
                let base = m.as_mut_ptr() as u64;
                Ok((m, base))
            })?;
        }
        if ctx.spare_streams() < Self::streams(opts) {
            ctx.fill_streams(SIM_STREAM_REFILL)?;
        }
        Ok(())
    }
}

/// The engine tag of CudaSim rings ([`super::peer::PeerRing::engine`]): every CudaSim kernel of
/// the process addresses host memory, so any two can link.
pub const SIM_ENGINE: u64 = 1;

/// A CudaSim kernel's bound buffers: host memory its block's threads read and write through
/// the `ResidentBuffers` table, kept alive by the kernel's launcher thread and by this value
/// (so a read after the kernel ended returns its last values).
///
/// # Synchronization
/// The host touches the bytes only while the block is parked: [`read`](Self::read) and
/// [`write`](Self::write) quiesce this kernel (it finishes the batch in hand, outputs included,
/// and its block exits; queues, indices and state stay), copy, and relaunch it where it left
/// off. The block's exit is observed through the launcher thread's join of the block's threads
/// and the quiesce mutex, so every write a batch made happens before the host's copy, and the
/// copy happens before the relaunch (the next batch). Parks are serialized with
/// [`with_all_quiesced`]. Once the kernel has ended the copy runs at once (no block left).
/// Between two accesses the relaunched kernel runs a batch, or at least
/// [`MIN_RUN_BETWEEN_ACCESSES`], so back-to-back reads do not starve it.
pub struct SimBuffers {
    /// Each buffer's memory and byte length.
    mems: Vec<(SharedMemory, usize)>,
    _table: SharedMemory,
    access: Arc<SimAccess>,
}

/// A CudaSim kernel's device state, readable by the host between two batches (see
/// [`SimKernel::state`]): the same park as [`SimBuffers`], shared with them, so state reads
/// and buffer accesses together still let the kernel run between two of them.
pub struct SimState {
    mem: SharedMemory,
    len: usize,
    access: Arc<SimAccess>,
}

/// One kernel's parked host access (bound buffers, state): parks it between two batches,
/// runs the copy, relaunches it, and spaces accesses so the kernel is never starved.
struct SimAccess {
    name: String,
    quiesce: Arc<QuiesceShared>,
    /// When the last access relaunched the kernel, and its batch count then.
    last_resume: Mutex<Option<(Instant, u64)>>,
}

/// The least time a kernel runs between two host accesses (bound buffers, state) unless it
/// finishes a batch sooner: back-to-back host reads must not starve it.
pub const MIN_RUN_BETWEEN_ACCESSES: Duration = Duration::from_millis(1);

/// How long an access waits for the previous access's relaunch to start running.
const RELAUNCH_WAIT: Duration = Duration::from_millis(100);

impl SimAccess {
    /// Waits (at most [`MIN_RUN_BETWEEN_ACCESSES`]) until the kernel relaunched by the last
    /// access has run a batch or had that long to run.
    fn let_it_run(&self) {
        let last = *self.last_resume.lock().unwrap_or_else(|p| p.into_inner());
        let Some((at, batches)) = last else {
            return;
        };
        // The relaunch itself (the launcher wakes, the block's threads start) comes first: the
        // block shows a running state on its first control check. Bounded, in case it never
        // does (a terminate, a fault).
        let start_by = at + RELAUNCH_WAIT;
        let mut running_since = None;
        loop {
            let now = Instant::now();
            let c = self.quiesce.control().device_counters();
            if c.batches != batches || now >= start_by {
                return;
            }
            match c.state {
                Some(DeviceState::Quiesced) => {}
                Some(s) if s.has_exited() => return,
                _ => {
                    let since = *running_since.get_or_insert(now);
                    if now >= since + MIN_RUN_BETWEEN_ACCESSES {
                        return;
                    }
                }
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Runs `op` while this kernel's block is parked between two batches (or gone). `what`
    /// names the access in errors ("access its bound buffers", "read its state").
    fn with_parked<R>(
        &self,
        timeout: Duration,
        what: &'static str,
        op: impl FnOnce() -> R,
    ) -> Result<R, PersistentError> {
        self.let_it_run();
        let _serial = QUIESCE_SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let parked = self.quiesce.quiesce(timeout);
        let abandoned = {
            let q = self.quiesce.lock();
            q.abandoned && !q.finished
        };
        if !parked || abandoned {
            self.quiesce.resume();
            return Err(if abandoned {
                PersistentError::InvalidState {
                    name: self.name.clone(),
                    op: what,
                    state: "still running after it was dropped",
                }
            } else {
                PersistentError::Timeout {
                    name: self.name.clone(),
                    what: "the kernel to park between two batches for a host access",
                }
            });
        }
        let r = op();
        let batches = self.quiesce.control().device_counters().batches;
        self.quiesce.resume();
        *self.last_resume.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), batches));
        Ok(r)
    }
}

impl SimBuffers {
    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.mems.len()
    }

    /// Byte length of buffer `index`.
    pub fn byte_len(&self, index: usize) -> Option<usize> {
        self.mems.get(index).map(|m| m.1)
    }

    fn check(&self, index: usize, bytes: usize) -> Result<&SharedMemory, PersistentError> {
        match self.mems.get(index) {
            Some((m, n)) if *n == bytes => Ok(m),
            n => Err(PersistentError::BoundBuffer {
                name: self.access.name.clone(),
                index,
                device_bytes: n.map(|(_, n)| *n),
                host_bytes: bytes,
            }),
        }
    }

    /// Copies buffer `index` (exactly its byte length) into `out`, between two batches; waits
    /// up to `timeout` for the batch in hand.
    pub fn read(
        &self,
        index: usize,
        out: &mut [u8],
        timeout: Duration,
    ) -> Result<(), PersistentError> {
        let m = self.check(index, out.len())?;
        self.access
            .with_parked(timeout, "access its bound buffers", || {
                // SAFETY: the block is parked or gone (see the type's docs), so nothing writes
                // the buffer; it holds `out.len()` bytes (checked).
                unsafe {
                    core::ptr::copy_nonoverlapping(m.as_mut_ptr(), out.as_mut_ptr(), out.len())
                }
            })
    }

    /// Replaces buffer `index` (exactly its byte length) with `data`, between two batches: the
    /// next batch sees all of it.
    pub fn write(
        &self,
        index: usize,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(), PersistentError> {
        let m = self.check(index, data.len())?;
        self.access
            .with_parked(timeout, "access its bound buffers", || {
                // SAFETY: as in `read`: no block runs, the buffer holds `data.len()` bytes.
                unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), m.as_mut_ptr(), data.len()) }
            })
    }
}

impl SimState {
    /// The state's byte length (the state type's size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the state has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of the state as of the end of the last batch: the kernel is parked between two
    /// batches for the copy (never mid-batch) and relaunched where it left off; waits up to
    /// `timeout` for the batch in hand ([`PersistentError::Timeout`] past it). After the
    /// kernel ended, its final state.
    pub fn read(&self, timeout: Duration) -> Result<Vec<u8>, PersistentError> {
        let mut out = vec![0u8; self.len];
        self.access.with_parked(timeout, "read its state", || {
            // SAFETY: the block is parked or gone (see `SimBuffers`' synchronization), so no
            // thread writes the state; the memory holds at least `len` bytes (allocated at
            // launch from the initial state) and lives as long as `self.mem`.
            unsafe {
                core::ptr::copy_nonoverlapping(self.mem.as_mut_ptr(), out.as_mut_ptr(), self.len)
            }
        })?;
        Ok(out)
    }
}

impl<In: Pod + Send, Out: Pod + Send> SimKernel<In, Out> {
    /// Compiles `source` (or takes it from the disk cache), allocates the queues and the state
    /// (initialized from `initial_state`, `source.state.size` bytes), starts the block and
    /// returns once the kernel reports it is resident (or its error). The kernel starts
    /// `Launched`: call [`activate`](Self::activate).
    pub fn launch(
        source: &KernelSource,
        initial_state: &[u8],
        opts: &SimLaunchOptions,
    ) -> Result<Self, PersistentError> {
        check_launch::<In, Out>(source, initial_state, &opts.queues, &opts.buffers)?;
        let module = compile_sim(source)?;
        Self::launch_compiled(&module, source, initial_state, opts)
    }

    /// [`launch`](Self::launch) with the module already compiled by
    /// [`compile_sim`] from `source` (compiling needs no quiesce; loading
    /// and launching do).
    pub fn launch_compiled(
        module: &crate::sim::SimModule,
        source: &KernelSource,
        initial_state: &[u8],
        opts: &SimLaunchOptions,
    ) -> Result<Self, PersistentError> {
        check_launch::<In, Out>(source, initial_state, &opts.queues, &opts.buffers)?;
        if source
            .external
            .as_ref()
            .is_some_and(|f| f.host_fn.is_none())
        {
            return Err(no_host_fn(source));
        }
        let ctx = SimContext::get();
        // The driver model: a lost context with no kernel of it left is reset (as the GPU
        // launcher's `Device::open` does); a kernel of a lost context cannot launch
        // (`CUDA_ERROR_LAUNCH_FAILED`).
        ctx.reset_if_unused();
        let life = ctx.kernel_created();
        if let Some(f) = life.fault() {
            return Err(PersistentError::Sim(SimError::ContextLost {
                call: DriverCall::LaunchKernel,
                entry: f.entry,
                reason: f.reason,
            }));
        }
        // Module and queue memory: synchronizing calls only when the module is new or the
        // arena must grow (the engine parks the resident kernels first, see
        // `launch_needs_idle_device`); nothing here waits for the device otherwise.
        Self::prepare(module, opts)?;
        // Its stream, from the spare ones. Another launch may have taken the last since
        // `prepare`: then more are made with every resident kernel parked, as the GPU
        // launcher does (`StreamCreate` waits for the device; strict mode refuses it beside
        // running blocks). The bulk lanes' copy stream comes from the same spares.
        let take_stream = || match ctx.take_stream() {
            Some(s) => Ok::<_, PersistentError>(s),
            None => Ok(with_all_quiesced(SIM_STREAM_QUIESCE_TIMEOUT, || {
                ctx.fill_streams(SIM_STREAM_REFILL)?;
                ctx.take_stream().ok_or(SimError::WouldWaitForDevice {
                    call: DriverCall::StreamCreate,
                    running: Vec::new(),
                    waited: Duration::ZERO,
                })
            })??),
        };
        let stream = take_stream()?;
        let copy_stream = if opts.bulk.enabled() {
            Some(take_stream()?)
        } else {
            None
        };
        // Each kernel runs a private copy of the object (its `__shared__` statics are its
        // own); on a GPU one loaded module serves every kernel of the source.
        let instance = module.instantiate()?;
        if let Some(f) = &source.external {
            let addr = f.host_fn.ok_or_else(|| no_host_fn(source))?;
            // SAFETY: `ExternalFn::host_fn` is a function of the template's declared signature
            // that its maker keeps callable while kernels of the source run; nothing runs on
            // this copy yet.
            unsafe { instance.bind_fn(&super::template::external_pointer_name(&f.symbol), addr)? };
        }
        let instance = Arc::new(instance);
        let mut queues = PersistentQueues::<In, Out>::in_arena(opts.queues, sim_arena())?;
        // Device memory: stream-ordered allocation and copies on a side stream.
        let device_alloc = |len: usize| -> Result<SharedMemory, PersistentError> {
            ctx.call(DriverCall::MemAllocAsync)?;
            ctx.call(DriverCall::MemcpyAsync)?;
            Ok(SharedMemory(Arc::new(HeapMemory::new(len)?)))
        };
        let state = device_alloc(initial_state.len().max(8))?;
        // SAFETY: fresh memory of at least `initial_state.len()` bytes, not shared yet.
        unsafe {
            core::ptr::copy_nonoverlapping(
                initial_state.as_ptr(),
                state.as_mut_ptr(),
                initial_state.len(),
            )
        };
        // Bound buffers: one host allocation each (128-aligned, at least 8 bytes so a buffer of
        // length 0 still has a real address), initialized from the launch's values, and the
        // `ResidentBuffers` table pointing at them.
        let mut buffer_mems: Vec<(SharedMemory, usize)> = Vec::with_capacity(opts.buffers.len());
        let mut entries = Vec::with_capacity(opts.buffers.len());
        for b in &opts.buffers {
            let m = device_alloc(b.initial.len().max(8))?;
            // SAFETY: fresh memory of at least `b.initial.len()` bytes, not shared yet.
            unsafe {
                core::ptr::copy_nonoverlapping(b.initial.as_ptr(), m.as_mut_ptr(), b.initial.len())
            };
            entries.push((m.as_mut_ptr() as u64, b.len as u64, b.id));
            buffer_mems.push((m, b.initial.len()));
        }
        let table_bytes = super::template::buffer_table_bytes(&entries);
        let table = device_alloc(table_bytes.len().max(8))?;
        // SAFETY: fresh memory of at least `table_bytes.len()` bytes, not shared yet.
        unsafe {
            core::ptr::copy_nonoverlapping(
                table_bytes.as_ptr(),
                table.as_mut_ptr(),
                table_bytes.len(),
            )
        };
        // The bulk lanes: staging rings and the heads line from the pinned arena, device rings
        // and the tails line in device memory, and a host thread for the copy engine.
        let mut bulk_keep: Vec<SharedMemory> = Vec::new();
        let mut bulk_params = None;
        if opts.bulk.enabled() {
            let pinned = |len: usize| -> Result<SharedMemory, PersistentError> {
                let l = sim_arena().take(len).ok_or(PersistentError::Memory {
                    what: "bulk staging (the pinned arena has no room)",
                    need: len,
                    got: 0,
                })?;
                // SAFETY: a fresh piece of `len` bytes (128-aligned), not shared yet.
                unsafe { core::ptr::write_bytes(l.as_mut_ptr(), 0, len) };
                Ok(SharedMemory(Arc::new(l)))
            };
            let pinned_sizes = PersistentQueues::<In, Out>::bulk_allocation_sizes(opts.queues);
            let device_sizes = PersistentQueues::<In, Out>::bulk_device_sizes(opts.queues);
            let lanes = opts.queues.lanes;
            let staging = pinned_sizes[..lanes]
                .iter()
                .map(|&n| pinned(n))
                .collect::<Result<Vec<_>, _>>()?;
            let heads = pinned(pinned_sizes[lanes])?;
            let rings = device_sizes[..lanes]
                .iter()
                .map(|&n| device_alloc(n))
                .collect::<Result<Vec<_>, _>>()?;
            let tails = device_alloc(device_sizes[lanes])?;
            let mut keep = staging.clone();
            keep.extend(rings.iter().cloned());
            keep.push(tails.clone());
            let engine = super::SimCopyEngine::new(&source.name, keep.clone())?;
            keep.push(heads.clone());
            let mem = super::BulkMemory {
                device_slots: rings.iter().map(|m| m.as_mut_ptr() as u64).collect(),
                heads_device: heads.as_mut_ptr() as u64,
                tails_device: tails.as_mut_ptr() as u64,
                staging,
                heads,
            };
            bulk_params = Some((mem.device_slots.clone(), mem.tails_device, mem.heads_device));
            // SAFETY: fresh memory; these lanes are the host's only writers of it.
            let bulk = unsafe {
                super::BulkLanes::new(mem, opts.queues.lane_capacity, opts.bulk, Box::new(engine))
            }?;
            queues.attach_bulk(bulk);
            bulk_keep = keep;
        }
        queues.set_heartbeat_timeout(opts.heartbeat_timeout);
        queues.heartbeat();
        let view = queues.device_view();
        let mut params = PersistentParams {
            out: view.out.as_mut_ptr() as u64,
            control: view.control.as_mut_ptr() as u64,
            state: state.as_mut_ptr() as u64,
            lane_count: opts.queues.lanes as u32,
            lane_capacity: opts.queues.lane_capacity as u32,
            out_capacity: opts.queues.out_capacity as u32,
            max_backoff_ns: opts.max_backoff_ns.max(32),
            control_poll_ns: opts.control_poll.as_nanos().min(u64::MAX as u128) as u64,
            buffers: if entries.is_empty() {
                0
            } else {
                table.as_mut_ptr() as u64
            },
            ..Default::default()
        };
        for (l, m) in view.lanes.iter().enumerate() {
            params.lanes[l] = m.as_mut_ptr() as u64;
        }
        if let Some((slots, tails, heads)) = bulk_params {
            params.bulk_slots[..slots.len()].copy_from_slice(&slots);
            params.bulk_tails = tails;
            params.bulk_heads = heads;
        }
        let (tx, done) = mpsc::channel();
        let inst = instance.clone();
        let keep_state = state.clone();
        let keep_buffers = (buffer_mems.clone(), table.clone());
        let block = source.batch_size;
        let quiesce = Arc::new(QuiesceShared {
            control: view.control.clone(),
            out: view.out.as_mut_ptr() as u64,
            state: Mutex::new(QState::default()),
            cv: Condvar::new(),
        });
        let q = quiesce.clone();
        let generation = life.generation();
        let kernel_name = source.name.clone();
        // The block starts and the kernel joins the registry in one turn of the quiesce
        // serialization: a `with_all_quiesced` on another thread either ran before the block
        // started or sees it in the registry and parks it (a block that starts on a Quiesce
        // request parks at once). Without the turn, a quiesce could read the registry between
        // the two and make its module load beside a running block nobody asked to park: on a
        // GPU, a hang.
        let serial = QUIESCE_SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let thread = std::thread::Builder::new()
            .name(format!("resident-sim-{}", source.name))
            .spawn(move || {
                // The memory the kernel addresses, and its stream, live as long as this
                // thread (the stream goes back to the spare ones after the last block exits).
                let _keep = (
                    view,
                    keep_state,
                    keep_buffers,
                    stream,
                    copy_stream,
                    bulk_keep,
                );
                let mut p = params;
                let arg = &mut p as *mut PersistentParams as *mut core::ffi::c_void;
                let ctx = SimContext::get();
                let r = loop {
                    // The resumes that happen from here on relaunch this block once it parks:
                    // one that comes while it still runs (a terminate, a quiesce that timed
                    // out on another kernel) is not lost.
                    let launched_at = q.lock().resume;
                    // The driver model sees the block running from its launch to its exit; a
                    // launch on a lost context fails as the driver's does.
                    let running = match ctx.block_started(&kernel_name, generation) {
                        Ok(b) => b,
                        Err(e) => break Err(e),
                    };
                    // SAFETY: `resident_persistent(PersistentParams)` takes exactly this
                    // struct; every address in it points at memory kept alive by `_keep` until
                    // the block has exited, and the host touches it only through the ring
                    // protocol.
                    let r = unsafe {
                        inst.launch(
                            PERSISTENT_KERNEL_NAME,
                            (1, 1, 1),
                            (block, 1, 1),
                            &[arg],
                            &[core::mem::size_of::<PersistentParams>() as u64],
                        )
                    };
                    // A device fault is sticky for the whole context, as on a GPU.
                    if let Err(SimError::Fault { entry, reason }) = &r {
                        ctx.poison(entry, reason);
                    }
                    drop(running);
                    if r.is_err()
                        || q.control().device_counters().state != Some(DeviceState::Quiesced)
                    {
                        break r;
                    }
                    // Quiesced: parked until resumed, then relaunched over the same memory; told
                    // to terminate meanwhile, it has exited for good.
                    let mut st = q.lock();
                    if st.resume == launched_at && !st.park.terminated() {
                        st.parked = true;
                        q.cv.notify_all();
                        while st.resume == launched_at && !st.park.terminated() {
                            st = q.cv.wait(st).unwrap_or_else(|p| p.into_inner());
                        }
                        st.parked = false;
                    }
                    if st.park.terminated() {
                        break r;
                    }
                    drop(st);
                    RELAUNCHES.fetch_add(1, Ordering::Relaxed);
                };
                let mut st = q.lock();
                st.finished = true;
                q.cv.notify_all();
                drop(st);
                let _ = tx.send(r);
            })
            .map_err(|source| PersistentError::Spawn {
                what: "the CudaSim block",
                source,
            })?;
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::downgrade(&quiesce));
        drop(serial);
        let access = Arc::new(SimAccess {
            name: source.name.clone(),
            quiesce: quiesce.clone(),
            last_resume: Mutex::new(None),
        });
        let buffers = (!opts.buffers.is_empty()).then(|| {
            Arc::new(SimBuffers {
                mems: buffer_mems,
                _table: table,
                access: access.clone(),
            })
        });
        let state_access = Arc::new(SimState {
            mem: state.clone(),
            len: initial_state.len(),
            access,
        });
        let mut k = SimKernel {
            buffers,
            state_access,
            name: source.name.clone(),
            queues,
            state,
            state_len: initial_state.len(),
            done,
            thread: Some(thread),
            exit: None,
            instance: Some(instance),
            quiesce,
            peer: std::sync::OnceLock::new(),
            life,
        };
        // `launch` returns once the kernel reports it is resident, or with its error; a park
        // by the residency rule meanwhile (another thread's module load or allocation) is
        // waited out, not taken for an exit.
        wait_resident(&mut k, opts.start_timeout)?;
        Ok(k)
    }

    fn record(&mut self, r: Exit) {
        if self.exit.is_none() {
            self.exit = Some(r.map_err(|e| FaultCause::Sim(Arc::new(e))));
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    fn record_lost(&mut self) {
        if self.exit.is_none() {
            self.exit = Some(Err(FaultCause::SimLauncherLost));
        }
    }

    fn poll_exit(&mut self) {
        if self.exit.is_some() {
            return;
        }
        match self.done.try_recv() {
            Ok(r) => self.record(r),
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => self.record_lost(),
        }
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `Ok` while resident or after an exit asked for; [`PersistentError::DeviceFault`] once
    /// the block faulted (`__trap()`), [`PersistentError::Exited`] when it exited on its own
    /// (heartbeat timeout, parameter error).
    pub fn check(&mut self) -> Result<(), PersistentError> {
        self.poll_exit();
        if let Some(reason) = self.queues.bulk_error() {
            return Err(PersistentError::CopyEngine {
                name: self.name.clone(),
                reason: reason.chars().take(256).collect(),
            });
        }
        if self.exit.is_none() {
            if let Some(f) = self.life.fault() {
                // Another kernel's fault lost the context: on a GPU this block is gone too.
                // Its host threads are told to stop and given a moment to; the kernel reports
                // the fault either way.
                let cause = FaultCause::Sim(Arc::new(SimError::ContextLost {
                    call: DriverCall::StreamQuery,
                    entry: f.entry,
                    reason: f.reason,
                }));
                self.quiesce.set_run_state(RunState::Terminate);
                match self.done.recv_timeout(CONTEXT_LOST_WAIT) {
                    // This block's own fault (the one that lost the context) stays its cause;
                    // a block that merely stopped reports the lost context.
                    Ok(r) => {
                        self.record(r);
                        if matches!(self.exit, Some(Ok(()))) {
                            self.exit = Some(Err(cause));
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => self.exit = Some(Err(cause)),
                    Err(RecvTimeoutError::Timeout) => {
                        return Err(PersistentError::DeviceFault {
                            name: self.name.clone(),
                            cause,
                        })
                    }
                }
            }
        }
        match &self.exit {
            Some(Err(cause)) => Err(PersistentError::DeviceFault {
                name: self.name.clone(),
                cause: cause.clone(),
            }),
            Some(Ok(())) => {
                let c = self.device_counters();
                match c.state {
                    Some(DeviceState::Terminated) => Ok(()),
                    // Parked when it was told to terminate: it exited at the park.
                    Some(DeviceState::Quiesced) if self.quiesce.lock().park.terminated() => Ok(()),
                    state => Err(PersistentError::Exited {
                        name: self.name.clone(),
                        state,
                        error_code: c.error_code,
                    }),
                }
            }
            None => Ok(()),
        }
    }

    /// Whether the block has exited (or faulted).
    pub fn has_exited(&mut self) -> bool {
        self.poll_exit();
        self.exit.is_some()
    }

    /// Enqueues one message on its priority's lane.
    pub fn send(&mut self, env: Envelope, payload: In) -> Result<(), Full<In>> {
        self.queues.send(env, payload)
    }

    /// Enqueues the longest prefix of `slots` that fits; returns how many.
    pub fn send_batch(&mut self, slots: &[Slot<In>]) -> usize {
        self.queues.send_batch(slots)
    }

    /// Moves up to `max` outputs to `out`.
    pub fn receive_into(&mut self, out: &mut Vec<Slot<Out>>, max: usize) -> usize {
        self.queues.receive_into(out, max)
    }

    /// Starts (or resumes) processing.
    pub fn activate(&self) {
        self.quiesce.set_run_state(RunState::Active)
    }

    /// Pauses processing; messages queue up.
    pub fn deactivate(&self) {
        self.quiesce.set_run_state(RunState::Inactive)
    }

    /// Parks this kernel: it finishes its batch and exits, its queues and state stay; see
    /// [`with_all_quiesced`]. `false` when it did not park within `timeout`.
    pub fn quiesce(&self, timeout: Duration) -> bool {
        self.quiesce.quiesce(timeout)
    }

    /// Relaunches a quiesced kernel where it left off.
    pub fn resume(&self) {
        self.quiesce.resume()
    }

    /// Bumps the heartbeat.
    pub fn heartbeat(&self) {
        self.queues.heartbeat();
    }

    /// CudaSim's bus model of this kernel: its queue traffic and dependent read chains since
    /// its launch (see [`crate::sim::bus`]).
    pub fn bus_stats(&self) -> Option<crate::sim::bus::BusStats> {
        let mut s = self.instance.as_ref().and_then(|i| i.bus_stats())?;
        if let Some(b) = self.queues.bulk_stats() {
            s.copy_engine_bytes = b.copy_engine_bytes.load(Ordering::Relaxed);
            s.driver_calls = b.driver_calls.load(Ordering::Relaxed);
        }
        Some(s)
    }

    /// The device-written counters (see [`DeviceCounters`]).
    pub fn device_counters(&self) -> DeviceCounters {
        self.queues.device_counters()
    }

    /// The kernel's bound buffers (`None` when it has none).
    pub fn buffers(&self) -> Option<Arc<SimBuffers>> {
        self.buffers.clone()
    }

    /// The kernel's device state, readable between two batches ([`SimState::read`]), also
    /// after the kernel ended (the handle keeps the memory).
    pub fn state(&self) -> Arc<SimState> {
        self.state_access.clone()
    }

    /// This kernel's peer-input slot (device-side forwarding: another CudaSim kernel's output
    /// ring consumed as one more input), made once.
    pub fn peer_input(&self) -> Arc<super::peer::PeerInput> {
        self.peer
            .get_or_init(|| {
                Arc::new(super::peer::PeerInput::new(
                    self.quiesce.control.clone(),
                    core::mem::size_of::<resident_ring::Slot<In>>(),
                    SIM_ENGINE,
                ))
            })
            .clone()
    }

    /// This kernel's output ring as another CudaSim kernel would consume it.
    pub fn output_peer_ring(&self) -> super::peer::PeerRing {
        let (mem, capacity) = self.queues.output_memory();
        super::peer::PeerRing {
            device_addr: resident_ring::spsc::RingMemory::as_mut_ptr(&mem) as u64,
            mem,
            capacity: capacity as u32,
            slot_bytes: core::mem::size_of::<resident_ring::Slot<Out>>(),
            engine: SIM_ENGINE,
        }
    }

    /// The host side of the queues.
    pub fn queues(&mut self) -> &mut PersistentQueues<In, Out> {
        &mut self.queues
    }

    /// Asks the kernel to finish its batch and exit, and waits up to `timeout` for its block.
    pub fn terminate(&mut self, timeout: Duration) -> Result<(), PersistentError> {
        self.quiesce.set_run_state(RunState::Terminate);
        if self.exit.is_none() {
            match self.done.recv_timeout(timeout) {
                Ok(r) => self.record(r),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(PersistentError::Timeout {
                        name: self.name.clone(),
                        what: "the kernel to exit",
                    })
                }
                Err(RecvTimeoutError::Disconnected) => self.record_lost(),
            }
        }
        self.check()
    }

    /// After the block has exited: the inputs it never consumed, highest lane first. `None`
    /// while it still runs.
    pub fn reclaim_input(&mut self) -> Option<Vec<Slot<In>>> {
        if !self.has_exited() {
            return None;
        }
        // SAFETY: the block has exited, so nothing else reads the lanes.
        Some(unsafe { self.queues.reclaim_input() })
    }

    /// After the block has exited: the device state's bytes. `None` while it still runs.
    pub fn state_bytes(&mut self) -> Option<Vec<u8>> {
        if !self.has_exited() {
            return None;
        }
        // SAFETY: the block has exited; the memory holds at least `state_len` bytes.
        Some(
            unsafe { std::slice::from_raw_parts(self.state.as_mut_ptr(), self.state_len) }.to_vec(),
        )
    }
}

// What the launch's wait for residency (`check::wait_resident`) asks of the kernel.
impl<In: Pod + Send, Out: Pod + Send> Starting for SimKernel<In, Out> {
    fn starting_name(&self) -> &str {
        &self.name
    }

    fn starting_check(&mut self) -> Result<(), PersistentError> {
        self.check()
    }

    fn starting_counters(&self) -> DeviceCounters {
        self.device_counters()
    }

    fn starting_pause(&mut self) {
        // The launcher's report of a final exit (or a fault) ends the pause early.
        match self.done.recv_timeout(Duration::from_micros(200)) {
            Ok(r) => self.record(r),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => self.record_lost(),
        }
    }
}

impl<In: Pod + Send, Out: Pod + Send> Drop for SimKernel<In, Out> {
    fn drop(&mut self) {
        if self.exit.is_none() {
            self.quiesce.set_run_state(RunState::Terminate);
            match self.done.recv_timeout(DROP_WAIT) {
                Ok(r) => self.record(r),
                Err(RecvTimeoutError::Disconnected) => self.record_lost(),
                Err(RecvTimeoutError::Timeout) => {
                    // Still running: the launcher thread keeps the memory it addresses and the
                    // loaded object (its `Arc`) alive; they are freed only after its block
                    // exits, so nothing is unmapped under running code. It no longer takes
                    // part in quiesces (it would time every later one out).
                    self.quiesce.lock().abandoned = true;
                    self.quiesce.cv.notify_all();
                    self.thread.take();
                }
            }
        }
    }
}

/// The error for a kernel whose external handler has no native form for CudaSim.
fn no_host_fn(source: &KernelSource) -> PersistentError {
    PersistentError::config(format!(
        "kernel `{}`: its external function has no host form to run on CudaSim (compiled for a GPU only)",
        resident_ring::message::quoted_name(&source.name)
    ))
}
