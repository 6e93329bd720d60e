//! The CUDA backend over `resident-cuda`.

use crate::seam::SeamResult;
use resident_core::engine::kernel::{Kernel, KernelArg};
use resident_core::engine::storage::{
    DeviceMemory, DeviceMemoryInner, EngineHostMemory, EngineMemory, HostMemory, HostMemoryInner,
};
use resident_core::engine::{
    BackendError, BackendKind, ComputeDevice, DeviceInfo, LaunchConfig, Result, Stream,
};
use resident_core::profile::Direction::{ToDevice, ToHost};
use resident_cuda::{Device, DeviceBuffer, KernelParams, PinnedMemory};
use std::sync::Arc;

/// One CUDA device.
pub struct CudaDevice {
    device: Arc<Device>,
    /// Stream for launches and copies that name none; synchronized before they return.
    default_stream: resident_cuda::Stream,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("name", &self.device.info().name)
            .finish()
    }
}

fn info_of(i: &resident_cuda::DeviceInfo) -> DeviceInfo {
    DeviceInfo {
        backend: BackendKind::Cuda,
        ordinal: i.ordinal,
        name: i.name.clone(),
        compute_units: i.sm_count,
        total_memory: i.total_memory as u64,
        max_threads_per_block: i.max_threads_per_block,
        compute_capability: Some(i.compute_capability),
        shared_memory_per_block: i.shared_memory_per_block as u64,
        shared_memory_per_sm: i.shared_memory_per_sm as u64,
        can_map_host_memory: i.can_map_host_memory,
        driver_version: Some(i.driver_version),
    }
}

/// Properties of every CUDA device, or why there are none.
pub fn device_infos() -> Result<Vec<DeviceInfo>> {
    let list = resident_cuda::devices().map_err(crate::seam::unavailable)?;
    Ok(list.iter().map(info_of).collect())
}

/// A CUDA buffer as the seam's engine memory.
struct CudaMemory(DeviceBuffer);

impl EngineMemory for CudaMemory {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn backend(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn address(&self) -> u64 {
        self.0.device_ptr()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// Pinned, device-mapped host memory as the seam's engine host memory.
struct CudaPinned(PinnedMemory);

impl EngineHostMemory for CudaPinned {
    fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_bytes_mut()
    }
}

fn wrong(m: &DeviceMemory, what: &'static str) -> BackendError {
    BackendError::WrongBackend {
        what,
        memory: m.backend(),
        device: BackendKind::Cuda,
    }
}

fn cuda_mem<'a>(m: &'a DeviceMemory, what: &'static str) -> Result<&'a DeviceBuffer> {
    match &m.inner {
        DeviceMemoryInner::Engine(e) => match e.as_any().downcast_ref::<CudaMemory>() {
            Some(c) => Ok(&c.0),
            None => Err(wrong(m, what)),
        },
        _ => Err(wrong(m, what)),
    }
}

fn cuda_mem_mut<'a>(m: &'a mut DeviceMemory, what: &'static str) -> Result<&'a mut DeviceBuffer> {
    let refused = wrong(m, what);
    match &mut m.inner {
        DeviceMemoryInner::Engine(e) => match e.as_any_mut().downcast_mut::<CudaMemory>() {
            Some(c) => Ok(&mut c.0),
            None => Err(refused),
        },
        _ => Err(refused),
    }
}

impl CudaDevice {
    /// Opens CUDA device `ordinal`; [`BackendError::CudaUnavailable`] says why it cannot.
    pub fn open(ordinal: usize) -> Result<Self> {
        let device = Device::open(ordinal).map_err(crate::seam::unavailable)?;
        let default_stream = resident_cuda::Stream::new(&device).seam()?;
        Ok(CudaDevice {
            device,
            default_stream,
        })
    }

    fn stream<'a>(&'a self, s: Option<&'a Stream>) -> &'a resident_cuda::Stream {
        s.and_then(|s| s.engine.as_deref())
            .and_then(|a| a.downcast_ref::<resident_cuda::Stream>())
            .unwrap_or(&self.default_stream)
    }
}

impl ComputeDevice for CudaDevice {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn info(&self) -> DeviceInfo {
        info_of(self.device.info())
    }

    fn shares_host_memory(&self) -> bool {
        false
    }

    // User allocations follow the residency rule (resident_cuda::hazards): device memory is
    // stream-ordered where the device has memory pools (it waits for no kernel); otherwise
    // cuMemAlloc waits for the device, and the resident ring kernels park around it (and are
    // relaunched after). cuMemHostAlloc always waits: pinned memory is allocated parked.
    fn alloc(&self, bytes: usize) -> Result<DeviceMemory> {
        let q = crate::QUIESCE_TIMEOUT;
        let buf = if self.device.has_memory_pools() {
            DeviceBuffer::zeroed(&self.device, bytes).seam()?
        } else {
            self.device
                .with_quiesced(q, || DeviceBuffer::zeroed(&self.device, bytes))
                .seam()?
                .seam()?
        };
        Ok(DeviceMemory {
            inner: DeviceMemoryInner::Engine(Box::new(CudaMemory(buf))),
        })
    }

    fn alloc_host(&self, bytes: usize, pinned: bool) -> Result<HostMemory> {
        if !pinned {
            return HostMemory::heap(bytes);
        }
        let q = crate::QUIESCE_TIMEOUT;
        let mem = self
            .device
            .with_quiesced(q, || PinnedMemory::new(&self.device, bytes.max(1)))
            .seam()?
            .seam()?;
        Ok(HostMemory {
            inner: HostMemoryInner::Pinned(Box::new(CudaPinned(mem))),
            len: bytes,
        })
    }

    fn copy_to_device(&self, dst: &mut DeviceMemory, src: &[u8]) -> Result<()> {
        let dst = cuda_mem_mut(dst, "copy_to_device")?;
        resident_core::profile::transfer("cuda", ToDevice, src.len(), || dst.copy_from_host(src))
            .seam()
    }

    fn copy_to_host(&self, dst: &mut [u8], src: &DeviceMemory) -> Result<()> {
        let src = cuda_mem(src, "copy_to_host")?;
        resident_core::profile::transfer("cuda", ToHost, dst.len(), || src.copy_to_host(dst)).seam()
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: &mut DeviceMemory,
        src: &[u8],
        stream: &Stream,
    ) -> Result<()> {
        let s = self.stream(Some(stream));
        let dst = cuda_mem_mut(dst, "copy_to_device_async")?;
        // Async: the span covers the enqueue only.
        resident_core::profile::transfer("cuda", ToDevice, src.len(), || {
            dst.copy_from_host_async(src, s)
        })
        .seam()
    }

    unsafe fn copy_to_host_async(
        &self,
        dst: &mut [u8],
        src: &DeviceMemory,
        stream: &Stream,
    ) -> Result<()> {
        let s = self.stream(Some(stream));
        let src = cuda_mem(src, "copy_to_host_async")?;
        // Async: the span covers the enqueue only.
        resident_core::profile::transfer("cuda", ToHost, dst.len(), || {
            src.copy_to_host_async(dst, s)
        })
        .seam()
    }

    // `cuStreamCreate` can wait for the device (resident_cuda::hazards: on an H200 the 35th
    // ring-kernel launch hung in it with 34 resident), so a stream is made with the resident
    // ring kernels parked, as pinned memory is; with none resident nothing parks.
    fn create_stream(&self) -> Result<Stream> {
        let q = crate::QUIESCE_TIMEOUT;
        let stream = self
            .device
            .with_quiesced(q, || resident_cuda::Stream::new(&self.device))
            .seam()?
            .seam()?;
        Ok(Stream {
            engine: Some(Arc::new(stream)),
        })
    }

    fn synchronize(&self, stream: &Stream) -> Result<()> {
        self.stream(Some(stream)).synchronize().seam()
    }

    fn launch(
        &self,
        kernel: &Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg<'_>],
        stream: Option<&Stream>,
    ) -> Result<()> {
        let (source, entry, options) =
            kernel
                .cuda
                .as_ref()
                .ok_or_else(|| BackendError::NoCudaSource {
                    kernel: kernel.name().to_string(),
                })?;
        crate::check_source(kernel, source)?;
        let f = self.device.kernel(source, entry, options, None).seam()?;
        let mut params = KernelParams::new();
        for a in args {
            match a {
                KernelArg::Buffer { address, .. } | KernelArg::BufferMut { address, .. } => {
                    params.push_ptr(*address);
                }
                KernelArg::Scalar { bytes, len } => {
                    params.push_bytes(&bytes[..*len]).seam()?;
                }
            }
        }
        let s = self.stream(stream);
        let t0 = std::time::Instant::now();
        // SAFETY: buffer arguments borrow their memory for the duration of `args`, and we wait
        // for the kernel before returning, so no borrow ends while it runs. The parameter list
        // matching the kernel's signature is the kernel author's contract (as in CUDA C).
        unsafe { f.launch(cfg, s, &mut params).seam()? };
        let t1 = std::time::Instant::now();
        s.synchronize().seam()?;
        resident_core::profile::device_launch(
            "cuda",
            cfg.index_space(),
            t0,
            t1,
            std::time::Instant::now(),
        );
        Ok(())
    }
}

/// The GPUs' telemetry for the profiler's report (NVML), or why there is none
/// (`Engines::device_telemetry`).
pub fn telemetry() -> (Vec<resident_core::profile::GpuTelemetry>, Option<String>) {
    // NVML is looked up only when a CUDA driver is present (no driver, no NVML).
    if !resident_cuda::driver_present() {
        return (Vec::new(), Some("no CUDA driver on this machine".into()));
    }
    match resident_cuda::telemetry::read_all() {
        Ok(v) => (
            v.into_iter()
                .map(|d| resident_core::profile::GpuTelemetry {
                    index: d.index,
                    name: d.name,
                    gpu_utilization_pct: d.gpu_utilization_pct,
                    memory_utilization_pct: d.memory_utilization_pct,
                    memory_used: d.memory_used,
                    memory_total: d.memory_total,
                    power_mw: d.power_mw,
                    temperature_c: d.temperature_c,
                })
                .collect(),
            None,
        ),
        Err(e) => (Vec::new(), Some(format!("NVML unavailable: {e}"))),
    }
}
