//! The GPU launch path: [`PersistentKernel`] (queues and control block in pinned device-mapped
//! host memory, state in device memory, the template compiled with NVRTC, one resident block on
//! its own stream), and the same template's launch-per-batch kernel ([`load_batch_kernel`]),
//! which resident-bench's ring benchmark measures the persistent kernel against.
//!
//! Nothing here runs without a GPU: every entry point returns
//! [`PersistentError::DriverUnavailable`] / [`PersistentError::NvrtcUnavailable`] instead.
//!
//! The parts: this file is the kernel's life on the GPU (launch under the residency rule, the
//! heartbeat thread, park and relaunch, terminate and teardown); `load` compiles and loads its
//! module (NVRTC or nvJitLink, through the caches) and the launch-per-batch kernel; `access`
//! holds the host's parked reads and writes of its memory (bound buffers, state).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytemuck::Pod;
use resident_ring::spsc::RingMemory;
use resident_ring::{Envelope, Slot};

use super::check::{check_launch, check_sizes, wait_resident, Starting};
use super::control::{ControlBlock, DeviceCounters, DeviceState, RunState};
use super::host::{Full, PersistentQueues, QueueConfig};
use super::park::Parking;
use super::template::{
    compile_ptx, KernelSource, PersistentParams, BATCH_KERNEL_NAME, PERSISTENT_KERNEL_NAME,
};
use super::{FaultCause, PersistentError, SharedMemory, Unavailable};
use resident_cuda::{
    CacheKey, CudaError, Device, DeviceBuffer, Function, KernelCache, KernelParams, LaunchConfig,
    ResidentSlot, Stream,
};

mod access;
mod load;

use access::GpuAccess;
pub use access::{GpuBuffers, GpuState};
pub use load::load_batch_kernel;
use load::{build_linked, device_sm, external_needs_device_arch, linked_key, load, module_ready};

/// How to launch a persistent kernel.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Device ordinal.
    pub device: usize,
    /// `compute_XY` to compile for; `None` = the device's own. A source with an external
    /// function ([`KernelSource::external`]) takes `None` only: its LTO-IR is linked into
    /// machine code for the device's exact `sm_XY` ([`super::template::link_cubin`]).
    pub arch: Option<String>,
    /// Queue geometry (`out_capacity` must be at least the source's batch size).
    pub queues: QueueConfig,
    /// The kernel exits when the host's heartbeat thread stops for this long.
    pub heartbeat_timeout: Duration,
    /// Longest idle `__nanosleep` between two polls of the input lanes. Each poll already
    /// costs one PCIe read (about 0.6-1 us), and a message that lands while the kernel sleeps
    /// waits on average half of this, so it is kept well under a microsecond.
    pub max_backoff_ns: u32,
    /// Longest time between two reads of the control block (activate, deactivate, terminate,
    /// heartbeat) while the kernel is active. Lane polls do not read it, so a message arriving
    /// at an idle kernel pays one PCIe read, not four.
    pub control_poll: Duration,
    /// How long `launch` waits for the kernel to report that it is resident.
    pub start_timeout: Duration,
    /// The bound buffers' initial values, one per [`KernelSource::buffers`] entry, in order:
    /// allocated in device memory with the queues (under the residency rule) and reachable
    /// through [`PersistentKernel::buffers`].
    pub buffers: Vec<super::BufferInit>,
    /// The lanes' bulk paths ([`super::bulk`]): a copy stream, a staging ring and a device ring
    /// per lane unless [`BulkMode::Off`](super::BulkMode::Off). A device without 64-bit stream
    /// memory operations gets LL lanes only under `Auto`, and a typed error under `On`.
    pub bulk: super::BulkConfig,
}

/// How often [`PersistentKernel::receive`] polls the kernel's stream while it waits.
pub const RECEIVE_CHECK_EVERY: Duration = Duration::from_micros(200);

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions {
            device: 0,
            arch: None,
            queues: QueueConfig {
                lanes: 1,
                lane_capacity: 4096,
                out_capacity: 4096,
            },
            heartbeat_timeout: Duration::from_secs(2),
            max_backoff_ns: 256,
            control_poll: Duration::from_micros(50),
            start_timeout: Duration::from_secs(10),
            buffers: Vec::new(),
            bulk: super::BulkConfig::default(),
        }
    }
}

/// Maps the CUDA layer's errors: a missing driver, NVRTC or device become the "unavailable"
/// variants (what callers test for to skip), everything else stays typed in
/// [`PersistentError::Cuda`].
pub(crate) fn cuda_error(e: CudaError) -> PersistentError {
    match e {
        CudaError::DriverNotFound | CudaError::NoDevice | CudaError::DeviceOutOfRange { .. } => {
            PersistentError::DriverUnavailable(Unavailable::Cuda(e))
        }
        CudaError::NvrtcNotFound => PersistentError::NvrtcUnavailable(e),
        e => PersistentError::Cuda(e),
    }
}

/// Opens device `ordinal` for persistent kernels (it must map host memory). A missing driver or
/// device is [`PersistentError::DriverUnavailable`], as from [`PersistentKernel::launch`].
///
/// After a device fault the context is reset once no resident kernel of it is left (each
/// failed kernel gives its place back when its host lets go of it): this waits for that up to
/// [`QUIESCE_TIMEOUT`], then answers the fault ([`CudaError::DeviceLost`]). Where the driver
/// refused the fresh context (the device is lost to the process) there is nothing to wait for:
/// the fault is answered at once, as CudaSim's `SimContext::recover` does for that driver.
pub fn open_device(ordinal: usize) -> Result<Arc<Device>, PersistentError> {
    let deadline = Instant::now() + QUIESCE_TIMEOUT;
    let device = loop {
        match Device::open(ordinal) {
            Err(CudaError::DeviceLost { .. })
                if Instant::now() < deadline && !resident_cuda::device::lost_for_good(ordinal) =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            r => break r.map_err(cuda_error)?,
        }
    };
    if !device.info().can_map_host_memory {
        return Err(PersistentError::DriverUnavailable(
            Unavailable::NoHostMapping { ordinal },
        ));
    }
    Ok(device)
}

/// A persistent ring kernel resident on a GPU.
///
/// Residency: each kernel is one block on its own non-blocking stream, and takes one place in
/// its device's budget ([`Device::reserve_resident`]): `launch` refuses with
/// [`CudaError::ResidencyExceeded`] (inside [`PersistentError::Cuda`]) rather than start a
/// kernel that might never be scheduled. Faults: a trap or illegal access in any kernel
/// poisons the device's context; every kernel on it then reports
/// [`PersistentError::DeviceFault`], and the device opens again (fresh context) once all of
/// them are dropped.
pub struct PersistentKernel<In: Pod + Send, Out: Pod + Send> {
    name: String,
    // Fields are `Option` so `Drop` can leak them when the kernel would not exit (freeing memory
    // a running kernel still uses would be worse than a leak).
    queues: Option<PersistentQueues<In, Out>>,
    /// The state (shared with whoever reads it through [`PersistentKernel::state`]).
    state: Option<Arc<GpuState>>,
    /// Bound buffers (shared with whoever reads them through [`PersistentKernel::buffers`]).
    buffers: Option<Arc<GpuBuffers>>,
    stream: Option<Arc<Stream>>,
    function: Option<Function>,
    residency: Option<ResidentSlot>,
    /// Its side of the residency rule (registered with the device).
    resident: Option<Arc<GpuResident>>,
    heartbeat: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    device: Arc<Device>,
    heartbeat_timeout: Duration,
    exited: bool,
    fault: Option<FaultCause>,
    /// The peer-input slot, made on first use ([`PersistentKernel::peer_input`]).
    peer: std::sync::OnceLock<Arc<super::peer::PeerInput>>,
}

impl<In: Pod + Send, Out: Pod + Send> PersistentKernel<In, Out> {
    /// The engine tag of this kernel's rings ([`super::peer::PeerRing::engine`]): kernels on
    /// the same device handle (one context) can link.
    fn engine_tag(&self) -> u64 {
        Arc::as_ptr(&self.device) as *const () as u64
    }

    /// This kernel's peer-input slot (device-side forwarding: another kernel's output ring on
    /// the same device consumed as one more input), made once.
    pub fn peer_input(&self) -> Arc<super::peer::PeerInput> {
        self.peer
            .get_or_init(|| {
                Arc::new(super::peer::PeerInput::new(
                    self.q().device_view().control,
                    core::mem::size_of::<resident_ring::Slot<In>>(),
                    self.engine_tag(),
                ))
            })
            .clone()
    }

    /// This kernel's output ring as another kernel on the same device would consume it (its
    /// device address is the one this kernel was launched with). `None` after the kernel's
    /// resources were given up.
    pub fn output_peer_ring(&self) -> Option<super::peer::PeerRing> {
        let r = self.resident.as_ref()?;
        let (mem, capacity) = self.q().output_memory();
        Some(super::peer::PeerRing {
            mem,
            device_addr: r.params.out,
            capacity: capacity as u32,
            slot_bytes: core::mem::size_of::<resident_ring::Slot<Out>>(),
            engine: self.engine_tag(),
        })
    }

    /// The host pops the output ring again after a link ended.
    ///
    /// # Safety
    /// As [`PersistentQueues::resync_output`]: nobody else pops the output ring any more.
    pub unsafe fn resync_output(&mut self) -> Result<(), PersistentError> {
        // SAFETY: this function's contract.
        unsafe { self.q_mut().resync_output() }
    }

    /// Compiles `source`, allocates the queues and the state (initialized from `initial_state`,
    /// which must be `source.state.size` bytes), launches the kernel once and waits until it
    /// reports it is resident. The kernel starts `Launched` (not processing): call
    /// [`activate`](Self::activate).
    pub fn launch(
        source: &KernelSource,
        initial_state: &[u8],
        opts: &LaunchOptions,
    ) -> Result<Self, PersistentError> {
        check_launch::<In, Out>(source, initial_state, &opts.queues, &opts.buffers)?;
        let device = open_device(opts.device)?;
        // Compile before the quiesce (NVRTC needs no device): the machine code for the
        // device's architecture goes into the disk cache under the key `load` looks up, so the
        // resident kernels are parked only for the module load, allocations and launch.
        if let (Some(a), true) = (opts.arch.as_deref(), source.external.is_some()) {
            return Err(external_needs_device_arch(source, a));
        }
        if opts.arch.is_none() && source.external.is_some() {
            if let (Ok(cache), Ok(text)) = (KernelCache::from_env(), source.render()) {
                let sm = device_sm(&device);
                let key = linked_key(&device, source, &text, &sm);
                // A failure here is reported by `load` inside the quiesce, with its log.
                let _ = cache.get_or_build(&key, || build_linked(source, &sm, &mut None));
            }
        } else if opts.arch.is_none() {
            if let (Ok(cache), Ok(text)) = (KernelCache::from_env(), source.render()) {
                let (major, minor) = device.info().compute_capability;
                let sm = format!("sm_{major}{minor}");
                let key = CacheKey::new(
                    &text,
                    &["resident-persistent".to_string()],
                    &sm,
                    device.info().driver_version,
                );
                // A failure here is reported by `load` inside the quiesce, with its log.
                let _ = cache.get_or_build(&key, || {
                    super::template::compile_cubin(source, &sm)
                        .map(|b| resident_cuda::module::to_hex(&b))
                        .map_err(|e| CudaError::invalid("nvrtcGetCUBIN", e.to_string()))
                });
            }
        }
        // The residency rule: a driver call that waits for the whole device (resident_cuda::hazards)
        // runs only while every resident kernel of the device is parked. A launch needs one
        // only to load a new module (and look its function up) or to grow the pinned queue
        // arena: then those run parked, and the kernels are relaunched right after. Everything
        // else (queues from the arena, stream-ordered device memory, copies on the side
        // stream, the stream, the launch) waits for no other kernel, so resident kernels keep
        // running through it, a stuck one included.
        if opts.bulk.mode == super::BulkMode::On && !device.info().stream_mem_ops_64 {
            return Err(PersistentError::config(
                "RESIDENT_BULK_LANE = on, but the device does not take 64-bit stream memory \
                 operations (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0), which \
                 publish the bulk lanes' tails",
            ));
        }
        let bulk_on = opts.bulk.enabled() && device.info().stream_mem_ops_64;
        let mut sizes = PersistentQueues::<In, Out>::allocation_sizes(opts.queues);
        if bulk_on {
            sizes.extend(PersistentQueues::<In, Out>::bulk_allocation_sizes(
                opts.queues,
            ));
        }
        let streams = 1 + bulk_on as usize;
        let arch = opts.arch.as_deref();
        let ready = module_ready(&device, source, arch, PERSISTENT_KERNEL_NAME)
            && device.arena().fits(&sizes)
            && device.spare_streams() >= streams
            && device.has_memory_pools();
        if !ready {
            let dev = device.clone();
            device
                .with_quiesced(QUIESCE_TIMEOUT, move || -> Result<(), PersistentError> {
                    load(&dev, source, arch, PERSISTENT_KERNEL_NAME)?;
                    if !dev.arena().fits(&sizes) {
                        resident_cuda::pinned::grow_arena(&dev, &sizes).map_err(cuda_error)?;
                    }
                    if dev.spare_streams() < streams {
                        dev.fill_streams(spare_stream_target(&dev))
                            .map_err(cuda_error)?;
                    }
                    Ok(())
                })
                .map_err(cuda_error)??;
        }
        // Without memory pools the device allocations below wait for the device: the whole
        // launch runs parked, as before stream-ordered allocation.
        let dev = device.clone();
        let launch_parts = move || -> Result<Self, PersistentError> {
            let device = dev;
            let function = load(
                &device,
                source,
                opts.arch.as_deref(),
                PERSISTENT_KERNEL_NAME,
            )?;
            let residency = device.reserve_resident().map_err(cuda_error)?;

            // Allocation order in `with_allocator`: control block, lanes 0.., output ring,
            // each a piece of the device's pinned arena (no driver call).
            let mut device_ptrs = Vec::new();
            let mut queues =
                PersistentQueues::<In, Out>::with_allocator(opts.queues, &mut |len| {
                    let piece = device.arena().take(len).ok_or(PersistentError::Memory {
                        what: "queues (the pinned arena has no room)",
                        need: len,
                        got: 0,
                    })?;
                    device_ptrs.push(piece.device_ptr());
                    Ok(Arc::new(piece) as Arc<dyn RingMemory>)
                })?;
            let lanes = opts.queues.lanes;
            if device_ptrs.len() != lanes + 2 {
                return Err(PersistentError::config(format!(
                    "the queues made {} allocations, not lanes + 2 = {} (control block, \
                         lanes, output ring)",
                    device_ptrs.len(),
                    lanes + 2
                )));
            }
            let mut state_mem =
                DeviceBuffer::alloc(&device, initial_state.len().max(1)).map_err(cuda_error)?;
            if !initial_state.is_empty() {
                let mut bytes = initial_state.to_vec();
                bytes.resize(state_mem.len(), 0);
                state_mem.copy_from_host(&bytes).map_err(cuda_error)?;
            }
            let state_ptr = state_mem.device_ptr();
            // Host accesses (bound buffers, state) share one spacing between parks.
            let access = Arc::new(GpuAccess {
                device: device.clone(),
                kernel: std::sync::Mutex::new(None),
                last_access: std::sync::Mutex::new(None),
            });
            let state = Arc::new(GpuState {
                access: access.clone(),
                len: initial_state.len(),
                memory: std::sync::Mutex::new(Some(state_mem)),
            });
            // Bound buffers: device memory each, initialized from the launch's values, and
            // the `ResidentBuffers` table (device memory too) pointing at them; allocated
            // here, under the residency rule, like the state.
            let mut dev_bufs = Vec::with_capacity(opts.buffers.len());
            let mut entries = Vec::with_capacity(opts.buffers.len());
            for b in &opts.buffers {
                let mut d =
                    DeviceBuffer::alloc(&device, b.initial.len().max(1)).map_err(cuda_error)?;
                if !b.initial.is_empty() {
                    d.copy_from_host(&b.initial).map_err(cuda_error)?;
                }
                entries.push((d.device_ptr(), b.len as u64, b.id));
                dev_bufs.push((d, b.initial.len()));
            }
            let buffers = if entries.is_empty() {
                None
            } else {
                let bytes = super::template::buffer_table_bytes(&entries);
                let mut table = DeviceBuffer::alloc(&device, bytes.len()).map_err(cuda_error)?;
                table.copy_from_host(&bytes).map_err(cuda_error)?;
                Some(Arc::new(GpuBuffers {
                    name: source.name.clone(),
                    access,
                    lens: dev_bufs.iter().map(|b| b.1).collect(),
                    memory: std::sync::Mutex::new(Some((
                        dev_bufs.into_iter().map(|b| b.0).collect(),
                        table,
                    ))),
                }))
            };
            // A spare stream: `cuStreamCreate` may wait for the device (resident_cuda::hazards), so it
            // runs only parked. Another launch may have taken the last one since `ready`.
            let spare_stream = || -> Result<Stream, PersistentError> {
                match Stream::from_pool(&device) {
                    Some(s) => Ok(s),
                    None => device
                        .with_quiesced(QUIESCE_TIMEOUT, || {
                            device.fill_streams(spare_stream_target(&device))?;
                            Stream::from_pool(&device).ok_or_else(|| {
                                CudaError::invalid("cuStreamCreate", "no spare stream")
                            })
                        })
                        .map_err(cuda_error)?
                        .map_err(cuda_error),
                }
            };
            let stream = spare_stream()?;
            // The bulk lanes: staging rings and the heads line from the pinned arena (no driver
            // call), device rings and the tails line in stream-ordered device memory, and a copy
            // stream from the spares; the copies and tail stores on it never wait for the
            // device (resident_cuda::hazards).
            let mut bulk_params = None;
            if bulk_on {
                let pinned = |len: usize| -> Result<(SharedMemory, u64), PersistentError> {
                    let piece = device.arena().take(len).ok_or(PersistentError::Memory {
                        what: "bulk staging (the pinned arena has no room)",
                        need: len,
                        got: 0,
                    })?;
                    let at = piece.device_ptr();
                    // SAFETY: a fresh piece of at least `len` bytes, not shared yet.
                    unsafe { core::ptr::write_bytes(piece.as_mut_ptr(), 0, len) };
                    Ok((SharedMemory(Arc::new(piece)), at))
                };
                let pinned_sizes = PersistentQueues::<In, Out>::bulk_allocation_sizes(opts.queues);
                let device_sizes = PersistentQueues::<In, Out>::bulk_device_sizes(opts.queues);
                let staging = pinned_sizes[..lanes]
                    .iter()
                    .map(|&n| pinned(n).map(|m| m.0))
                    .collect::<Result<Vec<_>, _>>()?;
                let (heads, heads_device) = pinned(pinned_sizes[lanes])?;
                let rings = device_sizes[..lanes]
                    .iter()
                    .map(|&n| DeviceBuffer::alloc(&device, n))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(cuda_error)?;
                let tails =
                    DeviceBuffer::zeroed(&device, device_sizes[lanes]).map_err(cuda_error)?;
                let mem = super::BulkMemory {
                    staging,
                    device_slots: rings.iter().map(|r| r.device_ptr()).collect(),
                    heads,
                    heads_device,
                    tails_device: tails.device_ptr(),
                };
                bulk_params = Some((mem.device_slots.clone(), mem.tails_device, heads_device));
                let engine = GpuCopyEngine {
                    device: device.clone(),
                    stream: spare_stream()?,
                    _rings: rings,
                    _tails: tails,
                };
                // SAFETY: fresh memory; these lanes are the host's only writers of it.
                let bulk = unsafe {
                    super::BulkLanes::new(
                        mem,
                        opts.queues.lane_capacity,
                        opts.bulk,
                        Box::new(engine),
                    )
                }?;
                queues.attach_bulk(bulk);
            }

            let mut params = PersistentParams {
                buffers: buffers.as_ref().map_or(0, |b| b.table_ptr()),
                out: device_ptrs[lanes + 1],
                control: device_ptrs[0],
                state: state_ptr,
                lane_count: lanes as u32,
                lane_capacity: opts.queues.lane_capacity as u32,
                out_capacity: opts.queues.out_capacity as u32,
                max_backoff_ns: opts.max_backoff_ns.max(32),
                control_poll_ns: opts.control_poll.as_nanos().min(u64::MAX as u128) as u64,
                ..Default::default()
            };
            params.lanes[..lanes].copy_from_slice(&device_ptrs[1..=lanes]);
            if let Some((slots, tails, heads)) = bulk_params {
                params.bulk_slots[..slots.len()].copy_from_slice(&slots);
                params.bulk_tails = tails;
                params.bulk_heads = heads;
            }

            queues.set_heartbeat_timeout(Some(opts.heartbeat_timeout));
            queues.heartbeat();

            let mut args = KernelParams::new();
            args.push(params).map_err(cuda_error)?;
            // The launch and the registration for the residency rule in one quiesce turn, so
            // no quiesce on another thread sees the kernel running and not registered.
            let turn = device.clone();
            let start = move || -> Result<Self, PersistentError> {
                // SAFETY: `function` is `resident_persistent(PersistentParams)` and `args` holds exactly
                // that struct (the driver copies it at launch). Every address inside points at memory
                // this value owns and frees only after the kernel has exited (or leaks, see Drop).
                unsafe {
                    function.launch(LaunchConfig::new(1, source.batch_size), &stream, &mut args)
                }
                .map_err(cuda_error)?;

                let mut k = PersistentKernel::<In, Out> {
                    name: source.name.clone(),
                    queues: Some(queues),
                    state: Some(state),
                    buffers,
                    stream: None,
                    function: Some(function.clone()),
                    residency: Some(residency),
                    resident: None,
                    heartbeat: None,
                    device,
                    heartbeat_timeout: opts.heartbeat_timeout,
                    exited: false,
                    fault: None,
                    peer: std::sync::OnceLock::new(),
                };
                let stream = Arc::new(stream);
                k.stream = Some(stream.clone());
                let control = k.q().device_view().control;
                k.resident = Some(Arc::new(GpuResident {
                    name: source.name.clone(),
                    control,
                    function,
                    stream,
                    params,
                    block: source.batch_size,
                    st: std::sync::Mutex::new(GState::default()),
                }));
                Ok(k)
            };
            turn.launch_registered(start, |k| {
                k.resident.as_ref().map(|r| {
                    Arc::downgrade(&(r.clone() as Arc<dyn resident_cuda::device::Quiesce>))
                })
            })
        };
        let mut k = if device.has_memory_pools() {
            launch_parts()?
        } else {
            device
                .with_quiesced(QUIESCE_TIMEOUT, launch_parts)
                .map_err(cuda_error)??
        };
        if let Some(r) = &k.resident {
            // Host accesses of the state and the bound buffers park this kernel alone.
            let me = Arc::downgrade(r);
            if let Some(s) = &k.state {
                s.access.set_kernel(me.clone());
            }
            if let Some(b) = &k.buffers {
                b.access.set_kernel(me);
            }
        }
        // Started after the launch so a failed launch leaves no thread behind; if spawning
        // fails, dropping `k` terminates the kernel and waits for it.
        let control = k.q().device_view().control;
        k.heartbeat = Some(spawn_heartbeat(control, opts.heartbeat_timeout)?);
        // Resident means running or idle: a kernel that already reported an exit (a parameter
        // error, say) is an error, never `Ok`; a park by the residency rule meanwhile (another
        // launch's module load, an allocation: it is registered from here on) is waited out.
        wait_resident(&mut k, opts.start_timeout)?;
        Ok(k)
    }

    fn q(&self) -> &PersistentQueues<In, Out> {
        self.queues.as_ref().expect("queues are only taken in Drop")
    }

    fn q_mut(&mut self) -> &mut PersistentQueues<In, Out> {
        self.queues.as_mut().expect("queues are only taken in Drop")
    }

    /// The host side of the queues (what `send_batch` and `receive_into` use), for the
    /// engine's device ring.
    pub(crate) fn queues(&mut self) -> &mut PersistentQueues<In, Out> {
        self.q_mut()
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device it runs on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The kernel's bound buffers (`None` when it has none).
    pub fn buffers(&self) -> Option<Arc<GpuBuffers>> {
        self.buffers.clone()
    }

    /// The kernel's device state, readable between two batches ([`GpuState::read`]), also
    /// after the kernel ended (the handle keeps the memory).
    pub fn state(&self) -> Arc<GpuState> {
        self.state.clone().expect("the state is only taken in Drop")
    }

    /// Polls the kernel's stream: `Err(DeviceFault)` after a trap / illegal address (in this
    /// kernel or any other on the same device: the fault poisons the whole context),
    /// `Err(Exited)` when it exited on its own (heartbeat timeout, error). Also keeps the host's
    /// view of mapped memory fresh (see GPU-NOTES: spinning hosts must call a CUDA query).
    pub fn check(&mut self) -> Result<(), PersistentError> {
        if let Some(reason) = self.q().bulk_error() {
            return Err(PersistentError::CopyEngine {
                name: self.name.clone(),
                reason: reason.chars().take(256).collect(),
            });
        }
        if let Some(cause) = &self.fault {
            return Err(PersistentError::DeviceFault {
                name: self.name.clone(),
                cause: cause.clone(),
            });
        }
        if self.exited {
            return self.exit_error();
        }
        let stream = self.stream.as_ref().expect("stream is only taken in Drop");
        // Parked by the residency rule: its stream is idle but it has not exited. The lock is
        // held across the query so a park or relaunch cannot slip in between.
        let resident = self.resident.clone();
        let guard = resident.as_ref().map(|r| r.lock());
        if let Some(g) = &guard {
            if let Some(e) = &g.relaunch_error {
                let cause = FaultCause::Relaunch(e.clone());
                self.fault = Some(cause.clone());
                return Err(PersistentError::DeviceFault {
                    name: self.name.clone(),
                    cause,
                });
            }
        }
        let parked = guard.as_ref().is_some_and(|g| g.park.is_parking());
        // `query` binds the context (the caller may be any thread) and marks the device lost
        // on a sticky error; a device already lost answers DeviceLost without a driver call.
        let q = stream.query();
        drop(guard);
        match q {
            Ok(false) => Ok(()),
            Ok(true) if parked => Ok(()),
            Ok(true) => {
                self.exited = true;
                self.exit_error()
            }
            Err(e) => {
                let cause = FaultCause::Cuda(Arc::new(e));
                self.fault = Some(cause.clone());
                Err(PersistentError::DeviceFault {
                    name: self.name.clone(),
                    cause,
                })
            }
        }
    }

    fn exit_error(&self) -> Result<(), PersistentError> {
        let c = self.device_counters();
        Err(PersistentError::Exited {
            name: self.name.clone(),
            state: c.state,
            error_code: c.error_code,
        })
    }

    /// Enqueues one message (see [`PersistentQueues::send`]).
    pub fn send(&mut self, env: Envelope, payload: In) -> Result<(), Full<In>> {
        self.q_mut().send(env, payload)
    }

    /// Enqueues the longest prefix that fits.
    pub fn send_batch(&mut self, slots: &[Slot<In>]) -> usize {
        self.q_mut().send_batch(slots)
    }

    /// Takes the oldest output, if any.
    pub fn try_receive(&mut self) -> Option<Slot<Out>> {
        self.q_mut().try_receive()
    }

    /// Waits up to `timeout` for one output, polling the stream so a device fault or an exit
    /// is returned instead of a hang.
    pub fn receive(&mut self, timeout: Duration) -> Result<Slot<Out>, PersistentError> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut last_check = start;
        let mut spins = 0u32;
        loop {
            if let Some(s) = self.q_mut().try_receive() {
                return Ok(s);
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                // The stream query (a driver call of a few microseconds, which a round trip of
                // a few microseconds would pay when it lands during one) runs every
                // RECEIVE_CHECK_EVERY of waiting, not every few hundred spins: often enough to
                // see a fault or an exit promptly and to keep mapped memory fresh (GPU-NOTES),
                // rarely enough to stay out of a message's round trip.
                let now = Instant::now();
                if now.duration_since(last_check) >= RECEIVE_CHECK_EVERY {
                    last_check = now;
                    self.check()?;
                }
                if now > deadline {
                    self.check()?;
                    return Err(PersistentError::Timeout {
                        name: self.name.clone(),
                        what: "an output",
                    });
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Moves up to `max` outputs to `out`.
    pub fn receive_into(&mut self, out: &mut Vec<Slot<Out>>, max: usize) -> usize {
        self.q_mut().receive_into(out, max)
    }

    /// Starts processing.
    pub fn activate(&mut self) -> Result<(), PersistentError> {
        self.check()?;
        self.set_run_state(RunState::Active);
        Ok(())
    }

    /// Pauses processing.
    pub fn deactivate(&mut self) -> Result<(), PersistentError> {
        self.check()?;
        self.set_run_state(RunState::Inactive);
        Ok(())
    }

    /// Tells the kernel to exit after its batch, with no driver call: only the control block
    /// (host memory) is written. For a host whose driver calls may be stuck behind the
    /// resident kernel (a call that waits for the device): once the kernel exits they return.
    pub fn signal_terminate(&self) {
        self.set_run_state(RunState::Terminate);
    }

    /// Run-state writes go through the residency side, so a quiesce never loses one.
    fn set_run_state(&self, rs: RunState) {
        match &self.resident {
            Some(r) => r.set_run_state(rs),
            None => self.q().control().set_run_state(rs),
        }
    }

    /// The device counters.
    pub fn device_counters(&self) -> DeviceCounters {
        self.q().device_counters()
    }

    /// Asks the kernel to exit and waits up to `timeout` for it; returns the messages left in
    /// the lanes (never taken by the kernel: what [`reclaim_input`](Self::reclaim_input) gives
    /// back).
    pub fn terminate(&mut self, timeout: Duration) -> Result<usize, PersistentError> {
        self.set_run_state(RunState::Terminate);
        let deadline = Instant::now() + timeout;
        loop {
            match self.check() {
                Ok(()) => {}
                // Counted once the kernel has exited: its last lane heads are final then (its
                // stream is done). Counted while it runs, they may lag: the kernel finishes the
                // batch in hand, and it publishes a batch's output tail before the batch's lane
                // heads (one fence, two relaxed stores), so a host that has received every
                // output can still read the last batch's inputs as pending.
                Err(PersistentError::Exited {
                    state: Some(DeviceState::Terminated | DeviceState::Quiesced),
                    ..
                }) => return Ok(self.q().pending_input()),
                Err(e) => return Err(e),
            }
            if Instant::now() > deadline {
                return Err(PersistentError::Timeout {
                    name: self.name.clone(),
                    what: "the kernel to exit",
                });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// After the kernel has exited (a successful [`terminate`](Self::terminate), a heartbeat
    /// timeout or a fault), takes back the inputs it never consumed. `None` while it may still
    /// be running.
    pub fn reclaim_input(&mut self) -> Option<Vec<Slot<In>>> {
        if !(self.exited || self.fault.is_some()) {
            return None;
        }
        // SAFETY: the kernel has exited or faulted, so the device no longer reads the lanes.
        // (The pinned memory itself stays mapped until this value drops, faulted or not.)
        Some(unsafe { self.q_mut().reclaim_input() })
    }

    fn stop_heartbeat(&mut self) {
        if let Some((stop, t)) = self.heartbeat.take() {
            stop.store(true, Ordering::Relaxed);
            // The thread parks between beats: wake it so the join is immediate instead of
            // waiting out a period (up to a quarter of the heartbeat timeout).
            t.thread().unpark();
            let _ = t.join();
        }
    }

    /// Whether the stream finished (or faulted) within `d`.
    fn stream_done_within(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let Some(stream) = self.stream.as_ref() else {
            return true;
        };
        loop {
            match stream.query() {
                Ok(false) => {}
                // Done, or faulted (a faulted kernel no longer runs).
                _ => return true,
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl<In: Pod + Send, Out: Pod + Send> Starting for PersistentKernel<In, Out> {
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
        std::thread::sleep(Duration::from_micros(50));
    }
}

impl<In: Pod + Send, Out: Pod + Send> Drop for PersistentKernel<In, Out> {
    fn drop(&mut self) {
        let mut done = self.exited || self.fault.is_some();
        if !done {
            // Through the residency side, like every run-state write: written to the control
            // block directly, a park in progress on another thread would resume the kernel
            // with the run state it saved and relaunch it over the memory freed below.
            self.set_run_state(RunState::Terminate);
            done = self.stream_done_within(Duration::from_secs(2));
        }
        self.stop_heartbeat();
        if !done {
            // The heartbeat has stopped: the kernel exits within its timeout.
            done = self.stream_done_within(self.heartbeat_timeout + Duration::from_secs(2));
        }
        if !done {
            // Still running: leak everything it might touch rather than free it under it, and
            // keep its place in the residency budget (it still occupies the device).
            std::mem::forget(self.queues.take());
            std::mem::forget(self.state.take());
            // One strong count that never drops: the buffers outlive every other holder.
            std::mem::forget(self.buffers.take());
            std::mem::forget(self.stream.take());
            std::mem::forget(self.function.take());
            std::mem::forget(self.residency.take());
            // And the device itself: its pinned arena (the queues' memory) must never be freed
            // under the running block (a free would also wait for it forever).
            std::mem::forget(self.device.clone());
        }
        // Otherwise nothing here waits for the device: the queues go back to the pinned
        // arena, the stream is destroyed (the driver lets queued work finish), the module
        // stays loaded in the device's cache, and the state and bound buffers (stream-ordered
        // memory) free themselves when their last holder drops them. Our registration goes
        // first so no quiesce asks a kernel that is gone to park.
        self.resident.take();
    }
}

/// The bulk lanes' copy engine on a GPU: `cuMemcpyHtoDAsync` of each range from pinned staging
/// and `cuStreamWriteValue64` of the lane's tail, in that order on one copy stream, so the kernel
/// that sees the tail sees the copies. It owns the device rings and the tails line: dropped
/// only after the kernel has exited (its queues go with it, or are leaked with a stuck kernel),
/// it first waits for its own stream (that stream alone) so no copy lands in freed memory.
struct GpuCopyEngine {
    device: Arc<Device>,
    stream: Stream,
    _rings: Vec<DeviceBuffer>,
    _tails: DeviceBuffer,
}

impl super::CopyEngine for GpuCopyEngine {
    fn copy_then_publish(
        &mut self,
        copies: &[super::CopyRange],
        tail: u64,
        value: u64,
    ) -> Result<(), PersistentError> {
        self.device.bind().map_err(cuda_error)?;
        for c in copies {
            // SAFETY: `src` is `len` bytes of this kernel's pinned staging ring, which the host
            // does not write again before the kernel's head passes it (super::bulk, "Reuse");
            // `dst` the same bytes' place in this engine's device ring (`_rings`), alive while
            // the engine is; the stream is live.
            unsafe {
                resident_cuda::result::memcpy_htod_async(
                    c.dst,
                    c.src as *const core::ffi::c_void,
                    c.len,
                    self.stream.raw(),
                )
            }
            .map_err(cuda_error)?;
        }
        // SAFETY: `tail` is an 8-aligned u64 of `_tails` (the tails line), written only by this
        // stream; the stream is live.
        unsafe { resident_cuda::result::stream_write_value64(self.stream.raw(), tail, value) }
            .map_err(cuda_error)
    }

    fn wait_idle(&mut self, _timeout: Duration) -> bool {
        // The copy stream alone (never the device); the driver bounds it by the copies.
        self.stream.synchronize().is_ok()
    }
}

impl Drop for GpuCopyEngine {
    fn drop(&mut self) {
        // Its own stream only (never the device): the copies finish before the rings are freed.
        let _ = self.stream.synchronize();
    }
}

/// How many spare streams a refill makes: one per place in the residency budget and one more,
/// so kernels within the budget never need another (ended kernels give theirs back).
fn spare_stream_target(device: &Device) -> usize {
    device.resident_limit() + 1
}

/// How long the residency rule waits for the resident kernels of a device to park.
pub const QUIESCE_TIMEOUT: Duration = Duration::from_secs(10);

/// A [`PersistentKernel`]'s side of the residency rule: parks it (`RunState::Quiesce`, then
/// waits for its stream to drain) and relaunches it over the same memory.
struct GpuResident {
    name: String,
    control: SharedMemory,
    function: Function,
    stream: Arc<Stream>,
    params: PersistentParams,
    block: u32,
    st: std::sync::Mutex<GState>,
}

#[derive(Default)]
struct GState {
    /// The host's side of parks (the rule CudaSim's launcher follows too).
    park: Parking,
    /// A relaunch that failed (reported by `check` as a fault).
    relaunch_error: Option<Arc<CudaError>>,
}

impl GpuResident {
    fn control(&self) -> &ControlBlock {
        // SAFETY: CONTROL_BLOCK_BYTES, 128-aligned (checked by PersistentQueues), kept alive
        // by the SharedMemory we hold.
        unsafe { &*(self.control.as_mut_ptr() as *const ControlBlock) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_run_state(&self, rs: RunState) {
        self.lock().park.set_run_state(self.control(), rs);
    }
}

impl resident_cuda::device::Quiesce for GpuResident {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn forward_edge(&self) -> (u64, u64) {
        // SAFETY: the control memory (CONTROL_BLOCK_BYTES, 128-aligned, checked by
        // PersistentQueues) lives as long as `self.control`; atomics only.
        let ctl = unsafe { &*(self.control.as_mut_ptr() as *const ControlBlock) };
        (self.params.out, ctl.peer_ring())
    }

    fn park(&self, deadline: Instant) -> bool {
        self.lock().park.request(self.control());
        loop {
            match self.stream.query() {
                // Exited (parked, or for another reason), or faulted: not running.
                Ok(true) | Err(_) => return true,
                Ok(false) => {}
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    fn resume(&self) {
        let mut g = self.lock();
        // Read before the resume writes the run state the host wants: a kernel that exited
        // for another reason meanwhile is not relaunched.
        let parked = self.control().device_counters().state == Some(DeviceState::Quiesced);
        // The park ends and the relaunch is queued under the lock `check` takes: `check` never
        // sees an idle stream without the park in between.
        if !g.park.resume(self.control()) || !parked {
            return;
        }
        let mut args = KernelParams::new();
        let r = args.push(self.params).map(|_| ()).and_then(|_| {
            // SAFETY: the same function, parameters and stream as the first launch; the
            // memory they address is owned by the PersistentKernel, which unregisters this
            // before freeing it.
            unsafe {
                self.function
                    .launch(LaunchConfig::new(1, self.block), &self.stream, &mut args)
            }
        });
        if let Err(e) = r {
            g.relaunch_error = Some(Arc::new(e));
        }
    }
}

/// Bumps the heartbeat every quarter of the timeout until told to stop. The only writer of
/// `heartbeat` for a [`PersistentKernel`].
fn spawn_heartbeat(
    control: SharedMemory,
    timeout: Duration,
) -> Result<(Arc<AtomicBool>, JoinHandle<()>), PersistentError> {
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let period = (timeout / 4).max(Duration::from_micros(100));
    let t = std::thread::Builder::new()
        .name("resident-heartbeat".into())
        .spawn(move || {
            // SAFETY: `control` is at least CONTROL_BLOCK_BYTES, 128-aligned (checked when the
            // queues were built) and kept alive by the SharedMemory we own.
            let ctl = unsafe { &*(control.as_mut_ptr() as *const ControlBlock) };
            // Relaxed: a plain stop flag, nothing is published through it.
            while !stop2.load(Ordering::Relaxed) {
                ctl.bump_heartbeat();
                // Parked, not asleep: `stop_heartbeat` unparks it, so dropping a kernel joins
                // this thread at once. A spurious wake-up only beats early.
                std::thread::park_timeout(period);
            }
        })
        .map_err(|source| PersistentError::Spawn {
            what: "the heartbeat thread",
            source,
        })?;
    Ok((stop, t))
}
