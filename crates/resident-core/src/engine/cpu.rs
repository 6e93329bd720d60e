//! The CPU backend: device memory is host memory, streams run work as it is queued, kernels
//! are Rust closures run over the index space on the rayon pool. Always available.

use super::storage::{DeviceMemory, DeviceMemoryInner, HeapBytes, HostMemory};
use super::{
    not_compiled, Backend, BackendError, BackendKind, ComputeDevice, DeviceHandle, DeviceInfo,
    Engines, LaunchConfig, Result, Stream,
};
use crate::engine::kernel::{run_cpu, Kernel, KernelArg};
use crate::profile::Direction::{ToDevice, ToHost};

/// The CPU engine alone (`resident-core` on its own): `Auto` is the CPU, every other engine is
/// [`BackendError::NotCompiled`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuOnly;

impl Engines for CpuOnly {
    fn resolve(request: Backend) -> Result<(Backend, Option<DeviceHandle>)> {
        match request {
            Backend::Cpu | Backend::Auto => Ok((Backend::Cpu, None)),
            other => Self::open(other).map(|d| (other, Some(d))),
        }
    }

    fn open(backend: Backend) -> Result<DeviceHandle> {
        match backend {
            Backend::Cpu | Backend::Auto => Ok(std::sync::Arc::new(CpuDevice::new())),
            Backend::Cuda => Err(not_compiled(BackendKind::Cuda)),
            Backend::Wgpu => Err(not_compiled(BackendKind::Wgpu)),
            Backend::CudaSim => Err(not_compiled(BackendKind::CudaSim)),
        }
    }
}

/// The host as a device.
#[derive(Debug, Default)]
pub struct CpuDevice;

impl CpuDevice {
    /// The CPU device.
    pub fn new() -> Self {
        CpuDevice
    }
}

fn host_bytes<'a>(mem: &'a DeviceMemory, what: &'static str) -> Result<&'a HeapBytes> {
    match &mem.inner {
        DeviceMemoryInner::Host(h) => Ok(h),
        _ => Err(BackendError::WrongBackend {
            what,
            memory: mem.backend(),
            device: BackendKind::Cpu,
        }),
    }
}

fn same_len(what: &'static str, host: usize, device: usize) -> Result<()> {
    if host != device {
        return Err(BackendError::SizeMismatch { what, host, device });
    }
    Ok(())
}

impl ComputeDevice for CpuDevice {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            backend: BackendKind::Cpu,
            ordinal: 0,
            name: format!("host CPU ({} rayon threads)", rayon::current_num_threads()),
            compute_units: rayon::current_num_threads() as u32,
            total_memory: 0,
            max_threads_per_block: u32::MAX,
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

    fn alloc(&self, bytes: usize) -> Result<DeviceMemory> {
        Ok(DeviceMemory {
            inner: DeviceMemoryInner::Host(HeapBytes::zeroed(bytes)?),
        })
    }

    fn alloc_host(&self, bytes: usize, _pinned: bool) -> Result<HostMemory> {
        // Nothing to pin: the CPU backend never DMAs.
        HostMemory::heap(bytes)
    }

    fn copy_to_device(&self, dst: &mut DeviceMemory, src: &[u8]) -> Result<()> {
        same_len("copy_to_device", src.len(), dst.len())?;
        match &mut dst.inner {
            DeviceMemoryInner::Host(h) => {
                crate::profile::transfer("cpu", ToDevice, src.len(), || {
                    h.as_bytes_mut().copy_from_slice(src)
                })
            }
            _ => {
                return Err(BackendError::WrongBackend {
                    what: "copy_to_device",
                    memory: dst.backend(),
                    device: BackendKind::Cpu,
                })
            }
        }
        Ok(())
    }

    fn copy_to_host(&self, dst: &mut [u8], src: &DeviceMemory) -> Result<()> {
        same_len("copy_to_host", dst.len(), src.len())?;
        let src = host_bytes(src, "copy_to_host")?.as_bytes();
        crate::profile::transfer("cpu", ToHost, dst.len(), || dst.copy_from_slice(src));
        Ok(())
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: &mut DeviceMemory,
        src: &[u8],
        _stream: &Stream,
    ) -> Result<()> {
        self.copy_to_device(dst, src)
    }

    unsafe fn copy_to_host_async(
        &self,
        dst: &mut [u8],
        src: &DeviceMemory,
        _stream: &Stream,
    ) -> Result<()> {
        self.copy_to_host(dst, src)
    }

    fn create_stream(&self) -> Result<Stream> {
        Ok(Stream::default())
    }

    fn synchronize(&self, _stream: &Stream) -> Result<()> {
        Ok(())
    }

    fn launch(
        &self,
        kernel: &Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg<'_>],
        _stream: Option<&Stream>,
    ) -> Result<()> {
        run_cpu(kernel, cfg, args)
    }
}
