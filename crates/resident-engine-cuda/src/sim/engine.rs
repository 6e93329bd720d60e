//! The CudaSim backend: everything the CUDA backend runs, from the same CUDA C source, on host
//! threads (see [`crate::sim`]): ring kernels with a [`CudaHandler`] run as the
//! persistent template compiled by the host C++ compiler (`SimEngine`, one block of OS
//! threads over the same queue layout and control block as on a GPU), and one-shot
//! [`Kernel`]s with CUDA source run over their grid ([`CudaSimDevice`]). Memory is host
//! memory. Nothing here says anything about GPU speed; it runs the kernel source where there
//! is no GPU, so it can be tested and debugged.

use crate::seam::SeamResult;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::forward::ForwardRing;
use crate::persistent::sim::with_all_quiesced;
use crate::persistent::{SimBuffers, SimKernel, SimLaunchOptions, SimState};
use crate::sim::driver::SimContext;
use crate::sim::{SimInstance, SimModule, SimOptions};
use parking_lot::Mutex;
use resident_cuda::hazards::DriverCall;
use resident_ring::{Message, Slot};

use crate::ring::{
    BoundBuffers, CudaHandler, CudaRing, DeviceGeometry, EngineBuffers, Launched, ResidentKernel,
    BUFFER_SYNC_TIMEOUT,
};
use resident_core::engine::cpu::CpuDevice;
use resident_core::engine::error::DeviceError;
use resident_core::engine::kernel::{Kernel, KernelArg};
use resident_core::engine::storage::{DeviceMemory, HostMemory};
use resident_core::engine::{
    BackendError, BackendKind, ComputeDevice, DeviceInfo, LaunchConfig, Result, Stream,
};
use resident_core::runtime::bind::{DeviceBinding, DeviceBuffers};
use resident_core::runtime::host::device::StateSnapshot;

/// How long the kernel outlives a silent host (the pump beats every 50 ms).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

use crate::QUIESCE_TIMEOUT;

/// Runs `op` under the residency rule: every resident CudaSim ring kernel of the process parks
/// and exits first (queues, indices and state stay) and is relaunched where it left off after.
fn quiesced<R>(op: impl FnOnce() -> R) -> std::result::Result<R, DeviceError> {
    with_all_quiesced(QUIESCE_TIMEOUT, op).seam()
}

/// A ring kernel's CUDA handler running as the persistent template on CudaSim, as the one
/// CUDA ring.
pub(crate) type SimEngine<In, Out> = CudaRing<In, Out, SimKernel<In, Out>>;

impl<In: Message, Out: Message> CudaRing<In, Out, SimKernel<In, Out>> {
    /// Compiles (or finds cached) and starts the kernel; returns once it reports resident.
    /// Follows the residency rule: the kernels already resident are quiesced for the launch
    /// (module load, allocations, the launch) and relaunched after it.
    /// Bound buffers (`bindings`) get host memory the block's threads use, initialized from
    /// their values at launch; the returned [`DeviceBuffers`] reads and writes them with this
    /// kernel parked between two batches (see [`SimBuffers`]), and the returned state is read
    /// the same way (see [`SimState`]).
    pub fn launch(
        id: &str,
        handler: &CudaHandler<In, Out>,
        g: &DeviceGeometry,
        bindings: &[DeviceBinding],
    ) -> std::result::Result<Launched<Self>, DeviceError> {
        let (source, buffers) = handler.launch_source(id, g.batch_size, bindings)?;
        let opts = SimLaunchOptions {
            queues: g.queues(),
            heartbeat_timeout: Some(HEARTBEAT_TIMEOUT),
            buffers,
            // RESIDENT_BULK_LANE / RESIDENT_BULK_THRESHOLD; a bad value is a typed error.
            bulk: crate::persistent::BulkConfig::from_env().seam()?,
            ..SimLaunchOptions::default()
        };
        // Compiling touches no device: outside the quiesce, so resident kernels keep running.
        let module = crate::persistent::compile_sim(&source).seam()?;
        // After a device fault the context is reset once no kernel of it is left (the driver
        // model's cuDevicePrimaryCtxReset); until then a launch fails typed.
        SimContext::get().recover(QUIESCE_TIMEOUT);
        // Only a launch that loads a new module or grows the pinned arena needs the device
        // idle; any other launches beside the resident kernels (a stuck one included).
        if SimKernel::<In, Out>::launch_needs_idle_device(&module, &opts) {
            quiesced(|| SimKernel::<In, Out>::prepare(&module, &opts))?.seam()?;
        }
        let kernel = SimKernel::launch_compiled(&module, &source, &handler.state, &opts).seam()?;
        let buffers = kernel
            .buffers()
            .map(|b| Arc::new(BoundBuffers::new(b, bindings)) as Arc<dyn DeviceBuffers>);
        let state: Arc<dyn StateSnapshot> = Arc::new(SimStateRead(kernel.state()));
        Ok((CudaRing::new(kernel, BackendKind::CudaSim), buffers, state))
    }
}

impl EngineBuffers for SimBuffers {
    fn read(&self, index: usize, out: &mut [u8]) -> std::result::Result<(), DeviceError> {
        SimBuffers::read(self, index, out, BUFFER_SYNC_TIMEOUT).seam()
    }
    fn write(&self, index: usize, data: &[u8]) -> std::result::Result<(), DeviceError> {
        SimBuffers::write(self, index, data, BUFFER_SYNC_TIMEOUT).seam()
    }
}

/// The state of a kernel on CudaSim, read with the kernel parked between two batches.
struct SimStateRead(Arc<SimState>);

impl StateSnapshot for SimStateRead {
    fn read(&self) -> std::result::Result<Vec<u8>, DeviceError> {
        self.0.read(BUFFER_SYNC_TIMEOUT).seam()
    }
}

impl<In: Message, Out: Message> ResidentKernel<In, Out> for SimKernel<In, Out> {
    fn queues(&mut self) -> &mut crate::persistent::PersistentQueues<In, Out> {
        SimKernel::queues(self)
    }
    fn set_active(&mut self, on: bool) -> std::result::Result<(), DeviceError> {
        if on {
            self.activate()
        } else {
            self.deactivate()
        }
        Ok(())
    }
    fn heartbeat(&mut self) {
        SimKernel::heartbeat(self);
    }
    fn check(&mut self) -> std::result::Result<(), DeviceError> {
        SimKernel::check(self).seam()
    }
    fn device_counters(&self) -> crate::persistent::DeviceCounters {
        SimKernel::device_counters(self)
    }
    fn terminate(&mut self, timeout: Duration) -> std::result::Result<(), DeviceError> {
        SimKernel::terminate(self, timeout).seam()
    }
    fn reclaim_input(&mut self) -> Option<Vec<Slot<In>>> {
        SimKernel::reclaim_input(self)
    }
    fn peer_input(&self) -> Arc<crate::persistent::PeerInput> {
        SimKernel::peer_input(self)
    }
    fn host_dilation(&self) -> u32 {
        // CudaSim's speed model (off unless asked for): see `crate::sim::driver`.
        SimContext::get().host_dilation()
    }
}

impl<In: Message, Out: Message> ForwardRing for SimKernel<In, Out> {
    fn output_peer_ring(&self) -> Option<crate::persistent::PeerRing> {
        Some(SimKernel::output_peer_ring(self))
    }
    unsafe fn resync_output(&mut self) -> std::result::Result<(), DeviceError> {
        // SAFETY: the caller's contract (the link's phase is Free).
        unsafe { self.queues().resync_output() }.seam()
    }
}

/// Loaded one-shot modules by (source, entry, options).
type ModuleMap = HashMap<(String, String, Vec<String>), Arc<SimInstance>>;

/// One-shot kernels with CUDA source on host threads; memory is host memory.
#[derive(Debug, Default)]
pub struct CudaSimDevice {
    host: CpuDevice,
    /// Loaded modules by (source, entry, options).
    modules: Mutex<ModuleMap>,
}

impl CudaSimDevice {
    /// The CudaSim device; an error when no host C++ compiler runs.
    pub fn open() -> Result<Self> {
        crate::sim::compiler().seam()?;
        Ok(CudaSimDevice::default())
    }

    fn instance(&self, kernel: &Kernel) -> Result<(Arc<SimInstance>, String)> {
        let Some((source, entry, options)) = &kernel.cuda else {
            return Err(BackendError::NoCudaSource {
                kernel: kernel.name().to_string(),
            });
        };
        crate::check_source(kernel, source)?;
        let key = (source.clone(), entry.clone(), options.clone());
        if let Some(i) = self.modules.lock().get(&key) {
            return Ok((i.clone(), entry.clone()));
        }
        // NVRTC options (`-arch`, `--use_fast_math`, ...) mean nothing to the host compiler;
        // only preprocessor definitions carry over.
        let extra = options
            .iter()
            .filter(|o| o.starts_with("-D"))
            .cloned()
            .collect();
        let module = SimModule::compile(
            kernel.name(),
            source,
            &[entry.as_str()],
            &SimOptions {
                extra,
                ..SimOptions::default()
            },
        )
        .seam()?;
        let instance = Arc::new(module.instantiate().seam()?);
        self.modules.lock().insert(key, instance.clone());
        Ok((instance, entry.clone()))
    }
}

impl ComputeDevice for CudaSimDevice {
    fn kind(&self) -> BackendKind {
        BackendKind::CudaSim
    }

    fn info(&self) -> DeviceInfo {
        let compiler = crate::sim::compiler()
            .map(|(_, v)| v)
            .unwrap_or_else(|e| e.to_string());
        DeviceInfo {
            backend: BackendKind::CudaSim,
            ordinal: 0,
            name: format!("CudaSim: CUDA C on host threads ({compiler})"),
            compute_units: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
            total_memory: 0,
            max_threads_per_block: 1024,
            compute_capability: None,
            shared_memory_per_block: 0,
            shared_memory_per_sm: 0,
            can_map_host_memory: true,
            driver_version: None,
        }
    }

    fn shares_host_memory(&self) -> bool {
        true
    }

    // Allocations follow the residency rule as on a GPU (resident_cuda::hazards), checked by
    // the driver model: device memory is stream-ordered (waits for no kernel); pinned memory
    // (cuMemHostAlloc waits for the whole device) is allocated with the resident ring kernels
    // parked.
    fn alloc(&self, bytes: usize) -> Result<DeviceMemory> {
        let ctx = SimContext::get();
        ctx.call(DriverCall::MemAllocAsync).seam()?;
        self.host.alloc(bytes)
    }

    fn alloc_host(&self, bytes: usize, pinned: bool) -> Result<HostMemory> {
        if !pinned {
            return self.host.alloc_host(bytes, false);
        }
        with_all_quiesced(QUIESCE_TIMEOUT, || {
            SimContext::get().call(DriverCall::MemHostAlloc).seam()?;
            self.host.alloc_host(bytes, true)
        })
        .map_err(|e| BackendError::Residency(resident_core::engine::EngineError::new(e)))?
    }

    fn copy_to_device(&self, dst: &mut DeviceMemory, src: &[u8]) -> Result<()> {
        self.host.copy_to_device(dst, src)
    }

    fn copy_to_host(&self, dst: &mut [u8], src: &DeviceMemory) -> Result<()> {
        self.host.copy_to_host(dst, src)
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: &mut DeviceMemory,
        src: &[u8],
        _stream: &Stream,
    ) -> Result<()> {
        self.host.copy_to_device(dst, src)
    }

    unsafe fn copy_to_host_async(
        &self,
        dst: &mut [u8],
        src: &DeviceMemory,
        _stream: &Stream,
    ) -> Result<()> {
        self.host.copy_to_host(dst, src)
    }

    fn create_stream(&self) -> Result<Stream> {
        self.host.create_stream()
    }

    fn synchronize(&self, stream: &Stream) -> Result<()> {
        self.host.synchronize(stream)
    }

    fn launch(
        &self,
        kernel: &Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg<'_>],
        _stream: Option<&Stream>,
    ) -> Result<()> {
        if cfg.shared_bytes != 0 {
            return Err(BackendError::BadArgument {
                index: 0,
                reason: "dynamic shared memory (extern __shared__) is not supported on CudaSim"
                    .into(),
            });
        }
        let (instance, entry) = self.instance(kernel)?;
        // Each argument's value lives here for the launch: buffers as their 8-byte address
        // (the kernel's pointer parameter), scalars as their bytes.
        let mut values: Vec<[u8; 8]> = Vec::with_capacity(args.len());
        let mut sizes: Vec<u64> = Vec::with_capacity(args.len());
        for a in args {
            match a {
                KernelArg::Buffer { address, .. } | KernelArg::BufferMut { address, .. } => {
                    values.push(address.to_ne_bytes());
                    sizes.push(8);
                }
                KernelArg::Scalar { bytes, len } => {
                    values.push(*bytes);
                    sizes.push(*len as u64);
                }
            }
        }
        let ptrs: Vec<*mut core::ffi::c_void> = values
            .iter_mut()
            .map(|v| v.as_mut_ptr() as *mut core::ffi::c_void)
            .collect();
        // SAFETY: buffer addresses are host memory of this backend borrowed for the launch by
        // the `KernelArg`s (writable ones exclusively); the launcher checks the argument count
        // and sizes against the kernel's signature; `values` outlives the call.
        unsafe { instance.launch(&entry, cfg.grid, cfg.block, &ptrs, &sizes) }.seam()?;
        Ok(())
    }
}
