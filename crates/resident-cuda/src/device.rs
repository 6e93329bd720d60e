//! Device discovery and the owner of a device's primary context.

use crate::error::{CudaError, Result};
use crate::module::ModuleCache;
use crate::result as r;
use cudarc::driver::sys::CUdevice_attribute as A;
use std::sync::Arc;

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

/// An opened device: holds its primary context (released on drop) and the modules loaded in it.
pub struct Device {
    raw: r::CUdevice,
    ctx: r::CUcontext,
    info: DeviceInfo,
    pub(crate) modules: ModuleCache,
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
    pub fn open(ordinal: usize) -> Result<Arc<Device>> {
        let info = device_info(ordinal)?;
        let raw = r::device_get(ordinal)?;
        let ctx = r::primary_ctx_retain(raw)?;
        let dev = Device {
            raw,
            ctx,
            info,
            modules: ModuleCache::default(),
        };
        dev.bind()?;
        Ok(Arc::new(dev))
    }

    /// Makes this device's context current on the calling thread (cheap; done before every call).
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is retained until drop.
        unsafe { r::ctx_set_current(self.ctx) }
    }

    pub(crate) fn ctx(&self) -> r::CUcontext {
        self.ctx
    }

    /// The device's properties.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Waits until all work of this context finished.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        cudarc::driver::result::ctx::synchronize().map_err(r::drv("cuCtxSynchronize"))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.modules.clear();
        // SAFETY: pairs with the retain in `open`; every owner that used the context holds an
        // `Arc<Device>`, so none is left.
        let _ = unsafe { r::primary_ctx_release(self.raw) };
    }
}
