//! Device memory: an owner of one `cuMemAlloc` allocation.

use crate::device::Device;
use crate::error::{CudaError, Result};
use crate::result as r;
use crate::stream::Stream;
use std::sync::Arc;

/// Bytes of device memory, freed on drop.
///
/// Where the device has memory pools (every GPU persistent kernels run on), the memory is
/// stream-ordered: allocated and freed (`cuMemAllocAsync`/`cuMemFreeAsync`) and copied on the
/// device's side stream, so neither waits for the resident ring kernels (a plain `cuMemAlloc`
/// or `cuMemFree` waits for the whole device, see [`crate::hazards`]). The free is ordered
/// after the side stream's work only: work on another stream that still uses the buffer must
/// have finished (synchronize that stream) before the buffer is dropped.
pub struct DeviceBuffer {
    ptr: r::CUdeviceptr,
    bytes: usize,
    device: Arc<Device>,
    /// From the stream-ordered pool (freed with `cuMemFreeAsync`).
    ordered: bool,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least 1) of uninitialized device memory.
    pub fn alloc(device: &Arc<Device>, bytes: usize) -> Result<Self> {
        device.bind()?;
        if device.has_memory_pools() {
            let side = device.side_stream()?;
            // SAFETY: the context is current and the side stream live; a zero-size request is
            // rounded up so the pointer is always a real allocation. The synchronize (of the
            // side stream alone) makes the memory usable from any stream.
            let ptr = unsafe {
                let p = r::mem_alloc_async(bytes.max(1), side)?;
                if let Err(e) = r::stream_synchronize(side) {
                    let _ = r::mem_free_async(p, side);
                    return Err(e);
                }
                p
            };
            return Ok(DeviceBuffer {
                ptr,
                bytes,
                device: device.clone(),
                ordered: true,
            });
        }
        // SAFETY: the context is current; a zero-size request is rounded up so the pointer is
        // always a real allocation.
        let ptr = unsafe { r::mem_alloc(bytes.max(1))? };
        Ok(DeviceBuffer {
            ptr,
            bytes,
            device: device.clone(),
            ordered: false,
        })
    }

    /// Allocates `bytes` of zeroed device memory.
    pub fn zeroed(device: &Arc<Device>, bytes: usize) -> Result<Self> {
        let buf = Self::alloc(device, bytes)?;
        if buf.ordered {
            let side = device.side_stream()?;
            // SAFETY: `buf` covers `bytes` bytes of this context's memory; the side stream
            // orders the memset, and its synchronize waits for it alone.
            unsafe {
                r::memset_d8_async(buf.ptr, 0, bytes, side)?;
                r::stream_synchronize(side)?;
            }
        } else {
            // SAFETY: `buf` covers `bytes` bytes of this context's memory.
            unsafe { r::memset_d8(buf.ptr, 0, bytes)? };
        }
        Ok(buf)
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the size is zero.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The device address (for kernel parameters).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The device this memory belongs to.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    fn check(&self, call: &'static str, n: usize) -> Result<()> {
        if n != self.bytes {
            return Err(CudaError::invalid(
                call,
                format!("host side has {n} bytes, device buffer {}", self.bytes),
            ));
        }
        Ok(())
    }

    /// Copies `src` (exactly `len()` bytes) to the device and waits.
    pub fn copy_from_host(&mut self, src: &[u8]) -> Result<()> {
        self.check("cuMemcpyHtoD", src.len())?;
        self.device.bind()?;
        if self.ordered {
            let side = self.device.side_stream()?;
            // SAFETY: both sides hold `bytes` bytes (checked); `src` outlives the copy, which
            // the side stream's synchronize completes before this returns.
            return unsafe {
                r::memcpy_htod_async(self.ptr, src.as_ptr().cast(), self.bytes, side)?;
                r::stream_synchronize(side)
            };
        }
        // SAFETY: both sides hold `bytes` bytes (checked); the call is synchronous.
        unsafe { r::memcpy_htod(self.ptr, src.as_ptr().cast(), self.bytes) }
    }

    /// Copies the device bytes into `dst` (exactly `len()` bytes) and waits.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        self.check("cuMemcpyDtoH", dst.len())?;
        self.device.bind()?;
        if self.ordered {
            let side = self.device.side_stream()?;
            // SAFETY: both sides hold `bytes` bytes (checked); nothing reads `dst` until the
            // side stream's synchronize completed the copy.
            return unsafe {
                r::memcpy_dtoh_async(dst.as_mut_ptr().cast(), self.ptr, self.bytes, side)?;
                r::stream_synchronize(side)
            };
        }
        // SAFETY: both sides hold `bytes` bytes (checked); the call is synchronous.
        unsafe { r::memcpy_dtoh(dst.as_mut_ptr().cast(), self.ptr, self.bytes) }
    }

    /// Queues a copy from host memory on `stream`.
    ///
    /// # Safety
    /// `src` must stay valid and unmodified until `stream` has passed this copy (pinned memory
    /// makes it truly asynchronous; pageable memory is staged by the driver).
    pub unsafe fn copy_from_host_async(&mut self, src: &[u8], stream: &Stream) -> Result<()> {
        self.check("cuMemcpyHtoDAsync", src.len())?;
        self.device.bind()?;
        r::memcpy_htod_async(self.ptr, src.as_ptr().cast(), self.bytes, stream.raw())
    }

    /// Queues a copy into host memory on `stream`.
    ///
    /// # Safety
    /// Nothing may read or write `dst` until `stream` has passed this copy.
    pub unsafe fn copy_to_host_async(&self, dst: &mut [u8], stream: &Stream) -> Result<()> {
        self.check("cuMemcpyDtoHAsync", dst.len())?;
        self.device.bind()?;
        r::memcpy_dtoh_async(dst.as_mut_ptr().cast(), self.ptr, self.bytes, stream.raw())
    }
}

impl DeviceBuffer {
    fn check_prefix(&self, call: &'static str, n: usize) -> Result<()> {
        if n > self.bytes {
            return Err(CudaError::invalid(
                call,
                format!("{n} bytes do not fit a {}-byte device buffer", self.bytes),
            ));
        }
        Ok(())
    }

    /// Queues zeroing the whole buffer on `stream`.
    pub fn memset_zero_async(&mut self, stream: &Stream) -> Result<()> {
        self.device.bind()?;
        // SAFETY: the buffer covers `bytes` bytes of this context's memory and `&mut self`
        // keeps it alive; the stream orders the memset before later work on it.
        unsafe { r::memset_d8_async(self.ptr, 0, self.bytes, stream.raw()) }
    }

    /// Queues a copy of `src` into the first `src.len()` bytes (at most `len()`) on `stream`.
    ///
    /// # Safety
    /// As [`DeviceBuffer::copy_from_host_async`].
    pub unsafe fn copy_prefix_from_host_async(
        &mut self,
        src: &[u8],
        stream: &Stream,
    ) -> Result<()> {
        self.check_prefix("cuMemcpyHtoDAsync", src.len())?;
        self.device.bind()?;
        r::memcpy_htod_async(self.ptr, src.as_ptr().cast(), src.len(), stream.raw())
    }

    /// Queues a copy of the first `dst.len()` bytes (at most `len()`) into `dst` on `stream`.
    ///
    /// # Safety
    /// As [`DeviceBuffer::copy_to_host_async`].
    pub unsafe fn copy_prefix_to_host_async(&self, dst: &mut [u8], stream: &Stream) -> Result<()> {
        self.check_prefix("cuMemcpyDtoHAsync", dst.len())?;
        self.device.bind()?;
        r::memcpy_dtoh_async(dst.as_mut_ptr().cast(), self.ptr, dst.len(), stream.raw())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // A reset context (after a fault) freed it already; a lost one refuses every call.
        if !self.device.is_alive() || self.device.bind().is_err() {
            return;
        }
        if self.ordered {
            if let Ok(side) = self.device.side_stream() {
                // SAFETY: allocated from the pool in `alloc`, freed once, here, ordered after
                // the side stream's work (the type's documentation: other streams are done).
                let _ = unsafe { r::mem_free_async(self.ptr, side) };
            }
            return;
        }
        // SAFETY: allocated in `alloc`, freed once, here, in its own context.
        let _ = unsafe { r::mem_free(self.ptr) };
    }
}
