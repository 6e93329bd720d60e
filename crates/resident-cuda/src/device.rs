//! Device discovery and the owner of a device's primary context.

use crate::error::{CudaError, DriverFault, Result};
use crate::loaded::ModuleCache;
use crate::result as r;
use cudarc::driver::sys::CUdevice_attribute as A;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// What a device is and can do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Ordinal as the driver counts devices.
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Device memory in bytes.
    pub total_memory: usize,
    /// Largest block.
    pub max_threads_per_block: u32,
    /// Threads one SM can hold.
    pub max_threads_per_sm: u32,
    /// Static shared memory one block may use, in bytes.
    pub shared_memory_per_block: usize,
    /// Shared memory of one SM, in bytes.
    pub shared_memory_per_sm: usize,
    /// Whether pinned host memory can be mapped into the device's address space.
    pub can_map_host_memory: bool,
    /// Whether kernels can run concurrently.
    pub concurrent_kernels: bool,
    /// Copy engines (2 means H2D and D2H overlap each other and compute).
    pub async_engines: u32,
    /// Whether the device takes 64-bit stream memory operations (`cuStreamWriteValue64`,
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`), which publish the bulk input lanes'
    /// tails; `false` also where the driver does not know the attribute.
    pub stream_mem_ops_64: bool,
    /// The driver's CUDA version (major, minor).
    pub driver_version: (u32, u32),
}

impl DeviceInfo {
    /// The NVRTC virtual architecture of this device, e.g. `compute_90`.
    pub fn arch(&self) -> String {
        format!(
            "compute_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// Number of CUDA devices; an error says why there are none to ask.
pub fn device_count() -> Result<usize> {
    r::device_count()
}

/// Properties of one device, without creating a context.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    let dev = r::device_get(ordinal)?;
    let attr = |a| r::device_attribute(dev, a).map(|v| v.max(0) as u32);
    Ok(DeviceInfo {
        ordinal,
        name: r::device_name(dev)?,
        compute_capability: (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        total_memory: r::device_total_mem(dev)?,
        max_threads_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_threads_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
        shared_memory_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)? as usize,
        shared_memory_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?
            as usize,
        can_map_host_memory: attr(A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? != 0,
        concurrent_kernels: attr(A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS)? != 0,
        async_engines: attr(A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)?,
        stream_mem_ops_64: attr(A::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS).unwrap_or(0)
            != 0,
        driver_version: r::driver_version()?,
    })
}

/// Properties of every device. An empty driver gives [`CudaError::NoDevice`].
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let n = device_count()?;
    if n == 0 {
        return Err(CudaError::NoDevice);
    }
    (0..n).map(device_info).collect()
}

/// The most kernels a device of compute capability 7.0 or newer runs concurrently (on 9.0,
/// also the most grids resident at once).
pub const CONCURRENT_KERNEL_LIMIT: usize = 128;

/// Grid slots the default residency limit always leaves for other work (one-shot kernels,
/// copies' kernels, libraries): ring kernels never take the last ones.
pub const RESERVED_GRID_SLOTS: usize = 16;

/// The default most resident ring kernels on a device with `sm_count` SMs: at most one per
/// SM, leaving an eighth of the SMs (at least one, unless there is only one) and
/// [`RESERVED_GRID_SLOTS`] of the [`CONCURRENT_KERNEL_LIMIT`] grid slots for other work.
///
/// ```
/// use resident_cuda::device::default_resident_limit;
/// assert_eq!(default_resident_limit(1), 1);
/// assert_eq!(default_resident_limit(8), 7);
/// assert_eq!(default_resident_limit(132), 112); // H100 SXM: the grid slots bind
/// ```
pub fn default_resident_limit(sm_count: usize) -> usize {
    let sms = sm_count.max(1);
    let by_sm = if sms == 1 { 1 } else { sms - (sms / 8).max(1) };
    by_sm.min(CONCURRENT_KERNEL_LIMIT - RESERVED_GRID_SLOTS)
}

/// Counts resident (persistent) kernels against a limit; lock-free.
#[derive(Debug, Default)]
pub struct ResidencyBudget {
    resident: AtomicUsize,
}

impl ResidencyBudget {
    /// Takes one place if fewer than `limit` are taken; else `Err(taken now)`.
    pub fn try_take(&self, limit: usize) -> std::result::Result<usize, usize> {
        // AcqRel/Acquire: a plain counter whose only readers are other `try_take`/`give`
        // calls; the CAS makes check-and-increment one step so the limit is never passed.
        self.resident
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .map(|n| n + 1)
    }

    /// Gives one place back.
    pub fn give(&self) {
        // AcqRel: pairs with `try_take`; saturates so a stray give cannot wrap.
        let _ = self
            .resident
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Places taken now.
    pub fn taken(&self) -> usize {
        self.resident.load(Ordering::Acquire)
    }
}

/// How long freeing pinned memory waits for the resident kernels to park
/// (`cuMemFreeHost` waits for the whole device); past it the memory is kept, not freed.
pub const FREE_QUIESCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What every [`Device`] value of one ordinal shares: whether a fault has poisoned the context,
/// and the resident-kernel budget.
#[derive(Default)]
pub(crate) struct DeviceShared {
    lost: OnceLock<DriverFault>,
    pub(crate) residency: ResidencyBudget,
    /// A limit set with [`Device::set_resident_limit`] (0: the default).
    limit_override: AtomicUsize,
    /// The resident ring kernels, for the residency rule ([`Device::with_quiesced`]).
    quiescers: Mutex<Vec<std::sync::Weak<dyn Quiesce>>>,
    /// Serializes quiesces of this device.
    quiesce_turn: Mutex<()>,
}

impl std::fmt::Debug for DeviceShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceShared")
            .field("lost", &self.lost.get())
            .field("residency", &self.residency)
            .finish_non_exhaustive()
    }
}

/// A resident kernel that can park and be relaunched where it left off (the residency rule).
pub trait Quiesce: Send + Sync {
    /// Asks it to finish its batch and exit, keeping its queues and state; `true` once it has
    /// exited (or was not running), `false` if it had not by `deadline`.
    fn park(&self, deadline: std::time::Instant) -> bool;
    /// Relaunches it where it left off, with the run state the host last asked for.
    fn resume(&self);
    /// Its name (what a quiesce that timed out reports).
    fn name(&self) -> String {
        String::from("(unnamed kernel)")
    }
    /// Device-side forwarding: (its output ring's device address, the peer ring its slot names
    /// now or 0), so a quiesce parks producers before their consumers.
    fn forward_edge(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// Per ordinal: the shared state of the live `Device`s, and whether the context must be reset
/// before the next open because a fault poisoned it.
#[derive(Default)]
struct RegistrySlot {
    shared: Weak<DeviceShared>,
    /// The live `Device` of the ordinal: every `open` shares it (one module cache, one pinned
    /// arena, one side stream, one identity for device-side forwarding).
    device: Weak<Device>,
    reset_pending: bool,
    /// The driver refused a fresh context after a reset: the fault outlives the context for
    /// this process (measured on an H100, driver 580: after a `trap`, neither
    /// `cuDevicePrimaryCtxReset` nor releasing every reference lets `cuDevicePrimaryCtxRetain`
    /// succeed; it answers `CUDA_ERROR_LAUNCH_FAILED`). Every later open is refused at once.
    gone: Option<DriverFault>,
}

fn registry() -> &'static Mutex<Vec<RegistrySlot>> {
    static REGISTRY: OnceLock<Mutex<Vec<RegistrySlot>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(Vec::new()))
}

/// Whether device `ordinal` is lost to this process for good: the driver refused a fresh
/// context after a fault ([`RegistrySlot::gone`]), so every later [`Device::open`] answers
/// [`CudaError::DeviceLost`] at once and waiting for it to clear is pointless. `false` while a
/// `DeviceLost` may still clear (kernels of the lost context are still resident).
#[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
pub fn lost_for_good(ordinal: usize) -> bool {
    let reg = registry().lock().unwrap_or_else(|p| p.into_inner());
    reg.get(ordinal).is_some_and(|slot| slot.gone.is_some())
}

/// What `open` should do with an ordinal's registry slot.
#[derive(Debug, PartialEq, Eq)]
enum SlotDecision {
    /// Devices of the ordinal are alive and healthy: share their state.
    Share,
    /// Devices of the ordinal are alive but lost: refuse.
    Lost(DriverFault),
    /// None alive: start fresh (after resetting the context when `reset` is set).
    Fresh {
        /// A fault poisoned the context the last devices used.
        reset: bool,
    },
}

fn decide(slot: &RegistrySlot) -> SlotDecision {
    if let Some(fault) = &slot.gone {
        return SlotDecision::Lost(fault.clone());
    }
    match slot.shared.upgrade() {
        Some(s) => match s.lost.get() {
            // A fault lost the context and no resident kernel of it is left (each failed and
            // gave its place back): reset it now, although values of it are still held (the
            // runtime's device, a kernel's final state). They are marked dead and lost first:
            // they make no driver call any more.
            Some(_) if s.residency.taken() == 0 => SlotDecision::Fresh { reset: true },
            Some(reason) => SlotDecision::Lost(reason.clone()),
            None => SlotDecision::Share,
        },
        None => SlotDecision::Fresh {
            reset: slot.reset_pending,
        },
    }
}

/// An opened device: holds its primary context (released on drop) and the modules loaded in it.
///
/// Every `Device` of one ordinal shares one record of whether a device fault poisoned the
/// context ([`Device::mark_lost`]) and one resident-kernel budget
/// ([`Device::reserve_resident`]).
pub struct Device {
    raw: r::CUdevice,
    ctx: r::CUcontext,
    info: DeviceInfo,
    #[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
    pub modules: ModuleCache,
    shared: Arc<DeviceShared>,
    /// `false` once the context was reset after a fault: what this value loaded or allocated
    /// is gone with it, so nothing is unloaded or freed any more.
    pub(crate) alive: Arc<AtomicBool>,
    /// Pinned queue memory taken without a driver call ([`crate::arena`]).
    pub(crate) arena: crate::arena::Arena,
    /// The side stream of stream-ordered allocations and copies (made on first use).
    side: Mutex<Option<r::CUstream>>,
    /// Spare non-blocking streams for ring kernels: `cuStreamCreate` may wait for the device
    /// ([`crate::hazards`]), so they are made with no ring kernel resident or with the
    /// resident ones parked ([`Device::fill_streams`]), and a ring kernel's stream comes back
    /// here when it ends ([`crate::Stream`]'s drop).
    streams: Mutex<Vec<r::CUstream>>,
    /// Whether the device has memory pools (stream-ordered allocation).
    pools: bool,
}

thread_local! {
    /// Set while this thread runs an operation under [`Device::with_quiesced`]: a nested call
    /// (a value freed inside the operation) runs directly instead of waiting for itself.
    static IN_QUIESCE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `op` as the operation of a quiesce on this thread ([`IN_QUIESCE`] set, also if it
/// panics).
fn as_quiesced_op<R>(op: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_QUIESCE.with(|q| q.set(false));
        }
    }
    IN_QUIESCE.with(|q| q.set(true));
    let _reset = Reset;
    op()
}

/// One resident kernel's place in its device's budget; given back on drop.
#[derive(Debug)]
pub struct ResidentSlot {
    shared: Arc<DeviceShared>,
}

impl Drop for ResidentSlot {
    fn drop(&mut self) {
        self.shared.residency.give();
    }
}

// SAFETY: a CUDA context may be used from any thread once made current there; every method
// that issues driver calls binds it first.
unsafe impl Send for Device {}
// SAFETY: as above; the module cache is behind a mutex.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("info", &self.info).finish()
    }
}

impl Device {
    /// Opens device `ordinal` (retains its primary context).
    ///
    /// After a device fault ([`CudaError::DeviceLost`]) this fails with that error while any
    /// `Device` from before the fault is alive; once all are dropped it resets the poisoned
    /// context and opens a fresh one.
    pub fn open(ordinal: usize) -> Result<Arc<Device>> {
        let info = device_info(ordinal)?;
        let raw = r::device_get(ordinal)?;
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        if reg.len() <= ordinal {
            reg.resize_with(ordinal + 1, RegistrySlot::default);
        }
        let slot = &mut reg[ordinal];
        let shared = match decide(slot) {
            SlotDecision::Share => {
                if let Some(d) = slot.device.upgrade() {
                    return Ok(d);
                }
                slot.shared.upgrade().expect("checked alive above")
            }
            SlotDecision::Lost(fault) => return Err(CudaError::DeviceLost { ordinal, fault }),
            SlotDecision::Fresh { reset } => {
                if reset {
                    if let Some(old) = slot.device.upgrade() {
                        // Its modules, memory and streams die with the context: never
                        // unloaded, freed or destroyed through it again.
                        old.alive.store(false, Ordering::Release);
                    }
                    // SAFETY: no resident kernel of the lost context is left (decide), and
                    // every value of it still held is lost (`bind` refuses) and dead (frees
                    // nothing). The driver allows releasing a primary context after a reset.
                    // A failed reset shows up as an error on the first call that follows.
                    let _ = unsafe { r::primary_ctx_reset(raw) };
                    slot.reset_pending = false;
                }
                let s = Arc::new(DeviceShared::default());
                slot.shared = Arc::downgrade(&s);
                s
            }
        };
        let ctx = match r::primary_ctx_retain(raw) {
            Ok(c) => c,
            // The fault outlived the reset (what the driver does, see `RegistrySlot::gone`):
            // the device is lost to this process, typed, and no later open asks the driver.
            Err(CudaError::Driver(fault)) if fault.is_sticky() => {
                slot.gone = Some(fault.clone());
                return Err(CudaError::DeviceLost { ordinal, fault });
            }
            Err(e) => return Err(e),
        };
        let pools = r::device_attribute(raw, A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
            .is_ok_and(|v| v == 1);
        let dev = Arc::new(Device {
            raw,
            ctx,
            info,
            modules: ModuleCache::default(),
            shared,
            alive: Arc::new(AtomicBool::new(true)),
            arena: crate::arena::Arena::new(),
            side: Mutex::new(None),
            streams: Mutex::new(Vec::new()),
            pools,
        });
        dev.bind()?;
        if pools {
            // SAFETY: the context is current (bound above).
            let _ = unsafe { r::mem_pool_keep_reserved(raw) };
        }
        slot.device = Arc::downgrade(&dev);
        Ok(dev)
    }

    /// Whether the context this value belongs to still exists (not reset after a fault).
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Whether device memory comes from the stream-ordered pool (allocated, freed and copied on
    /// the device's side stream, see [`DeviceBuffer`](crate::DeviceBuffer)).
    pub fn has_memory_pools(&self) -> bool {
        self.pools
    }

    /// The side stream: a non-blocking stream of this device on which allocations, frees and
    /// copies are ordered (they wait for it alone, never for the resident kernels).
    pub(crate) fn side_stream(&self) -> Result<r::CUstream> {
        let mut s = self.side.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(raw) = *s {
            return Ok(raw);
        }
        self.bind()?;
        // SAFETY: the context is current; destroyed once, in Drop.
        let raw = unsafe { r::stream_create()? };
        *s = Some(raw);
        Ok(raw)
    }

    /// Spare ring-kernel streams, taken with no driver call.
    #[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
    pub fn spare_streams(&self) -> usize {
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Makes streams until `n` are spare: `cuStreamCreate`, which may wait for the device, so
    /// call it with no ring kernel resident or under [`Device::with_quiesced`].
    #[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
    pub fn fill_streams(&self, n: usize) -> Result<()> {
        // The side stream too, if it is not made yet: made here, it is never made later
        // beside resident kernels (by their allocations on it).
        self.side_stream()?;
        self.bind()?;
        let mut spare = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        while spare.len() < n {
            // SAFETY: the context is current; each stream is handed out once (`take_stream`)
            // or destroyed once (Drop).
            spare.push(unsafe { r::stream_create()? });
        }
        Ok(())
    }

    /// A spare stream (no driver call), `None` when there is none.
    pub(crate) fn take_stream(&self) -> Option<r::CUstream> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    /// Takes back a stream from [`Device::take_stream`] whose work has finished.
    pub(crate) fn give_stream(&self, raw: r::CUstream) {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(raw);
    }

    /// The pinned queue memory of this device's ring kernels.
    #[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
    pub fn arena(&self) -> &crate::arena::Arena {
        &self.arena
    }

    /// The driver's handle of the device.
    pub(crate) fn raw(&self) -> r::CUdevice {
        self.raw
    }

    /// Makes this device's context current on the calling thread (cheap; done before every call).
    /// A lost device ([`Device::mark_lost`]) answers [`CudaError::DeviceLost`], so owners skip
    /// freeing what the fault already destroyed.
    pub fn bind(&self) -> Result<()> {
        if let Some(fault) = self.shared.lost.get() {
            return Err(CudaError::DeviceLost {
                ordinal: self.info.ordinal,
                fault: fault.clone(),
            });
        }
        // SAFETY: `ctx` is retained until drop.
        unsafe { r::ctx_set_current(self.ctx) }
    }

    /// Records that a device fault poisoned this device's context. Every `Device` of the
    /// ordinal then answers [`CudaError::DeviceLost`]; the context is reset on the next
    /// [`Device::open`] after all of them are dropped. The first fault sticks.
    pub fn mark_lost(&self, fault: DriverFault) {
        let _ = self.shared.lost.set(fault);
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = reg.get_mut(self.info.ordinal) {
            slot.reset_pending = true;
        }
    }

    /// The driver fault that lost the device, if it was lost.
    pub fn lost_reason(&self) -> Option<&DriverFault> {
        self.shared.lost.get()
    }

    /// Passes `r` through; a sticky error (a device fault) marks the device lost first.
    pub fn watch<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(CudaError::Driver(fault)) = &r {
            if fault.is_sticky() {
                self.mark_lost(fault.clone());
            }
        }
        r
    }

    /// The most resident kernels this device keeps co-resident: by default
    /// [`default_resident_limit`] (at most one per SM, which always run together, with SMs and
    /// grid slots left for other work); [`set_resident_limit`](Self::set_resident_limit)
    /// changes it.
    pub fn resident_limit(&self) -> usize {
        let sms = self.info.sm_count as usize;
        match self.shared.limit_override.load(Ordering::Relaxed) {
            0 => default_resident_limit(sms),
            n => n,
        }
    }

    /// Sets the residency limit of this device (every `Device` of the ordinal shares it);
    /// `None` restores the default. A value is capped at one per SM and one below
    /// [`CONCURRENT_KERNEL_LIMIT`] (a slot always stays free for other work); kernels already
    /// resident stay.
    pub fn set_resident_limit(&self, limit: Option<usize>) -> usize {
        let sms = (self.info.sm_count as usize).max(1);
        let v = limit.map_or(0, |n| n.clamp(1, sms.min(CONCURRENT_KERNEL_LIMIT - 1)));
        // Relaxed: a configuration value; reserve_resident's CAS on the budget is what counts.
        self.shared.limit_override.store(v, Ordering::Relaxed);
        self.resident_limit()
    }

    /// Takes a place for one resident kernel, or fails with
    /// [`CudaError::ResidencyExceeded`] when the device is at [`Device::resident_limit`].
    pub fn reserve_resident(&self) -> Result<ResidentSlot> {
        let limit = self.resident_limit();
        match self.shared.residency.try_take(limit) {
            Ok(_) => Ok(ResidentSlot {
                shared: self.shared.clone(),
            }),
            Err(resident) => Err(CudaError::ResidencyExceeded {
                ordinal: self.info.ordinal,
                resident,
                limit,
            }),
        }
    }

    /// Resident kernels on this device now.
    pub fn resident_kernels(&self) -> usize {
        self.shared.residency.taken()
    }

    pub(crate) fn ctx(&self) -> r::CUcontext {
        self.ctx
    }

    /// The device's properties.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Registers a resident kernel for the residency rule (held weakly).
    pub fn register_resident(&self, k: std::sync::Weak<dyn Quiesce>) {
        let mut v = self
            .shared
            .quiescers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.push(k);
    }

    /// Runs `launch` (which starts a resident kernel and returns it) and registers what
    /// `quiescer` names of its result in one turn of the device's quiesce serialization: a
    /// [`with_quiesced`](Self::with_quiesced) on another thread runs wholly before the launch
    /// or parks the new kernel too. Without the turn, a quiesce could read the registered
    /// kernels between the launch and the registration and make its module load beside a
    /// running kernel nobody asked to park: a hang. Within a quiesce's operation on this
    /// thread the turn is already held. Parks nobody.
    #[doc(hidden)] // for the CUDA engine
    pub fn launch_registered<T, E>(
        &self,
        launch: impl FnOnce() -> std::result::Result<T, E>,
        quiescer: impl FnOnce(&T) -> Option<std::sync::Weak<dyn Quiesce>>,
    ) -> std::result::Result<T, E> {
        let _turn = (!IN_QUIESCE.with(|q| q.get())).then(|| {
            self.shared
                .quiesce_turn
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        });
        let k = launch()?;
        if let Some(w) = quiescer(&k) {
            self.register_resident(w);
        }
        Ok(k)
    }

    /// The residency rule: a driver call that may wait for the whole device (allocation, free,
    /// module load, a launch) must not run while a ring kernel is resident, because a resident
    /// kernel never finishes. So every registered resident kernel of this device parks and
    /// exits (queues in host memory, state in device memory, heads and tails persist), `op`
    /// runs, and each is relaunched where it left off. Calls are serialized per device; hot
    /// paths (send, receive, call) never come here. [`CudaError::QuiesceTimeout`] when a
    /// kernel did not park within `timeout` (then `op` does not run; the parked ones resume).
    pub fn with_quiesced<R>(
        &self,
        timeout: std::time::Duration,
        op: impl FnOnce() -> R,
    ) -> Result<R> {
        if IN_QUIESCE.with(|q| q.get()) {
            // Nested (something dropped inside the operation): already quiesced.
            return Ok(op());
        }
        let _turn = self
            .shared
            .quiesce_turn
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut live: Vec<Arc<dyn Quiesce>> = {
            let mut v = self
                .shared
                .quiescers
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            v.retain(|w| w.strong_count() > 0);
            v.iter().filter_map(|w| w.upgrade()).collect()
        };
        crate::park_order::upstream_first(&mut live, |k| k.forward_edge());
        let live: Vec<&dyn Quiesce> = live.iter().map(|k| &**k).collect();
        self.parked_run(&live, timeout, op)
    }

    /// Parks `kernels` in order (until `timeout`), runs `op` if all parked, resumes the parked
    /// ones. The caller holds the device's quiesce turn.
    fn parked_run<R>(
        &self,
        kernels: &[&dyn Quiesce],
        timeout: std::time::Duration,
        op: impl FnOnce() -> R,
    ) -> Result<R> {
        let deadline = std::time::Instant::now() + timeout;
        let mut parked = 0;
        let mut ok = true;
        for k in kernels {
            parked += 1;
            if !k.park(deadline) {
                ok = false;
                break;
            }
        }
        let out = ok.then(|| as_quiesced_op(op));
        for k in &kernels[..parked] {
            k.resume();
        }
        out.ok_or_else(|| CudaError::QuiesceTimeout {
            ordinal: self.info.ordinal,
            kernels: kernels.len(),
            stuck: kernels[..parked]
                .last()
                .map(|k| k.name())
                .into_iter()
                .collect(),
        })
    }

    /// Runs `op` with one resident kernel `k` parked between two batches (the others keep
    /// running): for a host access of `k`'s own memory whose copy waits for no other kernel
    /// (the side stream). Serialized with [`with_quiesced`](Self::with_quiesced), so neither
    /// resumes a kernel the other parked. [`CudaError::QuiesceTimeout`] when `k` did not park
    /// within `timeout` (then `op` does not run).
    pub fn with_parked<R>(
        &self,
        k: &dyn Quiesce,
        timeout: std::time::Duration,
        op: impl FnOnce() -> R,
    ) -> Result<R> {
        if IN_QUIESCE.with(|q| q.get()) {
            return Ok(op());
        }
        let _turn = self
            .shared
            .quiesce_turn
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.parked_run(&[k], timeout, op)
    }

    /// Waits until all work of this context finished. Refused with
    /// [`CudaError::WouldWaitForResident`] while a ring kernel is resident on the device: a
    /// resident kernel does not finish, so the wait would never end.
    pub fn synchronize(&self) -> Result<()> {
        let resident = self.resident_kernels();
        if resident > 0 {
            return Err(CudaError::WouldWaitForResident {
                ordinal: self.info.ordinal,
                resident,
                call: "cuCtxSynchronize",
            });
        }
        self.bind()?;
        self.watch(cudarc::driver::result::ctx::synchronize().map_err(r::drv("cuCtxSynchronize")))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let side = self.side.lock().unwrap_or_else(|p| p.into_inner()).take();
        let spare = std::mem::take(&mut *self.streams.lock().unwrap_or_else(|p| p.into_inner()));
        if self.is_alive() && self.bind().is_ok() {
            for raw in side.into_iter().chain(spare) {
                // SAFETY: made in `side_stream` or `fill_streams`, destroyed once; skipped when
                // a reset destroyed the context (and the streams with it).
                let _ = unsafe { r::stream_destroy(raw) };
            }
        }
        self.modules.clear();
        // SAFETY: pairs with the retain in `open`; every owner that used the context holds an
        // `Arc<Device>`, so none is left.
        let _ = unsafe { r::primary_ctx_release(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residency_budget_never_passes_its_limit() {
        let b = ResidencyBudget::default();
        assert_eq!(b.try_take(2), Ok(1));
        assert_eq!(b.try_take(2), Ok(2));
        assert_eq!(b.try_take(2), Err(2));
        b.give();
        assert_eq!(b.taken(), 1);
        assert_eq!(b.try_take(2), Ok(2));
        b.give();
        b.give();
        b.give(); // a stray give saturates at zero
        assert_eq!(b.taken(), 0);
    }

    #[test]
    fn residency_budget_under_contention() {
        let b = Arc::new(ResidencyBudget::default());
        let wins: usize = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..1000).filter(|_| b.try_take(100).is_ok()).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(wins, 100);
        assert_eq!(b.taken(), 100);
    }

    #[test]
    fn registry_decisions() {
        let mut slot = RegistrySlot::default();
        assert_eq!(decide(&slot), SlotDecision::Fresh { reset: false });
        let live = Arc::new(DeviceShared::default());
        slot.shared = Arc::downgrade(&live);
        assert_eq!(decide(&slot), SlotDecision::Share);
        let fault = DriverFault {
            call: "cuStreamQuery",
            code: crate::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            message: "an illegal memory access was encountered".into(),
        };
        // A resident kernel of the lost context is left: refused.
        live.residency.try_take(4).unwrap();
        let _ = live.lost.set(fault.clone());
        slot.reset_pending = true;
        assert_eq!(decide(&slot), SlotDecision::Lost(fault.clone()));
        // None is left: reset, although values of the lost context are still held.
        live.residency.give();
        assert_eq!(decide(&slot), SlotDecision::Fresh { reset: true });
        drop(live);
        assert_eq!(decide(&slot), SlotDecision::Fresh { reset: true });
        // The driver refused the fresh context: lost for good, refused without a reset.
        slot.gone = Some(fault.clone());
        assert_eq!(decide(&slot), SlotDecision::Lost(fault));
    }

    #[test]
    fn a_device_the_driver_refused_is_lost_for_good() {
        // An ordinal no test opens: the registry is the process's.
        let ordinal = 63;
        assert!(!lost_for_good(ordinal));
        {
            let mut reg = registry().lock().unwrap();
            if reg.len() <= ordinal {
                reg.resize_with(ordinal + 1, RegistrySlot::default);
            }
            reg[ordinal].gone = Some(DriverFault {
                call: "cuDevicePrimaryCtxRetain",
                code: crate::CUresult::CUDA_ERROR_LAUNCH_FAILED,
                message: "unspecified launch failure".into(),
            });
        }
        assert!(lost_for_good(ordinal));
    }
}
