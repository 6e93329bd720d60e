//! Pinned, device-mapped host memory: `cuMemHostAlloc` with `DEVICEMAP | PORTABLE`.
//!
//! This is ordinary cached memory (not write-combined like cudarc's `alloc_pinned`), so host
//! reads stay fast, and the device reaches it at [`PinnedMemory::device_ptr`] over PCIe. The
//! persistent kernels' queues live here (see [`resident_ring::spsc::RingMemory`]).

use crate::device::Device;
use crate::error::{CudaError, Result};
use crate::result as r;
use bytemuck::Pod;
use cudarc::driver::sys::{CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_PORTABLE};
use std::marker::PhantomData;
use std::sync::Arc;

/// The flags every pinned allocation of this crate uses.
pub const PINNED_FLAGS: u32 = CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE;

/// Zeroed bytes of pinned, device-mapped host memory, page aligned, freed on drop.
pub struct PinnedMemory {
    /// Start of the allocation; page aligned, constant for the life of the value.
    ptr: *mut u8,
    /// Bytes usable, as requested.
    len: usize,
    /// Where the device sees `ptr`.
    device_ptr: u64,
    device: Arc<Device>,
}

// SAFETY: the allocation is owned by this value and not tied to a thread; mapping and freeing
// bind the device's context first.
unsafe impl Send for PinnedMemory {}
// SAFETY: `&PinnedMemory` only hands out the pointer; reads and writes through it are the
// caller's protocol (the ring's atomics, or `&mut` access in `PinnedBuffer`).
unsafe impl Sync for PinnedMemory {}

impl std::fmt::Debug for PinnedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedMemory")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("device_ptr", &format_args!("{:#x}", self.device_ptr))
            .finish()
    }
}

impl PinnedMemory {
    /// Allocates `len` zeroed bytes (`len > 0`).
    pub fn new(device: &Arc<Device>, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(CudaError::invalid("cuMemHostAlloc", "zero bytes requested"));
        }
        if !device.info().can_map_host_memory {
            return Err(CudaError::invalid(
                "cuMemHostAlloc",
                format!("device {} cannot map host memory", device.info().ordinal),
            ));
        }
        device.bind()?;
        // SAFETY: the context is current; flags are valid for cuMemHostAlloc.
        let raw = unsafe { r::host_alloc(len, PINNED_FLAGS)? };
        let mut mem = PinnedMemory {
            ptr: raw.cast(),
            len,
            device_ptr: 0,
            device: device.clone(),
        };
        // SAFETY: fresh allocation of `len` bytes that nothing else sees yet.
        unsafe { std::ptr::write_bytes(mem.ptr, 0, len) };
        // SAFETY: allocated with DEVICEMAP in the current context.
        // (On error `mem` drops and frees the allocation.)
        mem.device_ptr = unsafe { r::host_device_pointer(raw)? };
        Ok(mem)
    }

    /// Where the device sees this memory (a `CUdeviceptr`).
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// Host address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the size is zero (never true: `new` refuses zero).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device it is mapped into.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The bytes, for exclusive host access.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `len` initialized (zeroed at allocation) bytes; `&mut self`
        // excludes other host access. The caller must not let the device write concurrently.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The bytes, for shared host access.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: as `as_bytes_mut`, shared.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        // A reset context (after a fault) freed it already.
        if !self.device.is_alive() || self.device.bind().is_err() {
            return;
        }
        let ptr = self.ptr as usize;
        let device = self.device.clone();
        let free = move || {
            if device.bind().is_ok() {
                // SAFETY: allocated by `host_alloc` in `new`, freed once, here.
                let _ = unsafe { r::host_free(ptr as *mut std::ffi::c_void) };
            }
        };
        // cuMemFreeHost waits for the whole device (crate::hazards): with ring kernels
        // resident they park around it. If one does not park (a handler that never returns),
        // the memory is kept rather than the caller hung.
        if self.device.resident_kernels() == 0 {
            free();
        } else {
            let _ = self
                .device
                .with_quiesced(crate::device::FREE_QUIESCE_TIMEOUT, free);
        }
    }
}

// SAFETY: `ptr` is fixed for the value's life, valid for `len` bytes, page aligned (cuMemHostAlloc
// returns page-aligned memory, checked again in `resident_ring`'s `with_memory`), and owned by
// this value alone.
unsafe impl resident_ring::spsc::RingMemory for PinnedMemory {
    fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// `len` values of `T` in pinned, device-mapped host memory.
pub struct PinnedBuffer<T: Pod> {
    mem: PinnedMemory,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> std::fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.len)
            .field("mem", &self.mem)
            .finish()
    }
}

impl<T: Pod> PinnedBuffer<T> {
    /// `len` zeroed values.
    pub fn zeroed(device: &Arc<Device>, len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| CudaError::invalid("cuMemHostAlloc", "size overflows usize"))?;
        if std::mem::align_of::<T>() > 4096 {
            return Err(CudaError::invalid(
                "cuMemHostAlloc",
                "alignment above a page",
            ));
        }
        Ok(PinnedBuffer {
            mem: PinnedMemory::new(device, bytes.max(1))?,
            len,
            _t: PhantomData,
        })
    }

    /// A copy of `data` in pinned memory.
    pub fn from_slice(device: &Arc<Device>, data: &[T]) -> Result<Self> {
        let mut b = Self::zeroed(device, data.len())?;
        b.as_mut_slice().copy_from_slice(data);
        Ok(b)
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The values.
    pub fn as_slice(&self) -> &[T] {
        bytemuck::cast_slice(&self.mem.as_bytes()[..self.len * std::mem::size_of::<T>()])
    }

    /// The values, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        let n = self.len * std::mem::size_of::<T>();
        bytemuck::cast_slice_mut(&mut self.mem.as_bytes_mut()[..n])
    }

    /// Where the device sees the values.
    pub fn device_ptr(&self) -> u64 {
        self.mem.device_ptr()
    }

    /// The raw allocation.
    pub fn memory(&self) -> &PinnedMemory {
        &self.mem
    }
}

/// Adds a pinned chunk to `device`'s queue arena big enough for pieces of `sizes` bytes:
/// `cuMemHostAlloc`, which waits for the device (call it under [`Device::with_quiesced`]).
#[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
pub fn grow_arena(device: &Arc<Device>, sizes: &[usize]) -> Result<()> {
    device.arena().grow(sizes, |n| {
        ArenaChunk::new(device, n)
            .map(|(c, at)| (Arc::new(c) as Arc<dyn resident_ring::spsc::RingMemory>, at))
    })
}

/// One chunk of a device's pinned queue arena ([`crate::arena`]): pinned, device-mapped host
/// memory that keeps its own hold on the context (not on the `Device`, which owns the arena),
/// freed when the arena lets go of it.
pub(crate) struct ArenaChunk {
    ptr: *mut u8,
    len: usize,
    dev: r::CUdevice,
    ctx: r::CUcontext,
    /// The `Device`'s flag: `false` once its context was reset (the memory is gone with it).
    alive: Arc<std::sync::atomic::AtomicBool>,
}

// SAFETY: as PinnedMemory: the allocation is owned by this value and not tied to a thread.
unsafe impl Send for ArenaChunk {}
// SAFETY: as PinnedMemory: only the pointer is handed out; access is the ring protocol's.
unsafe impl Sync for ArenaChunk {}

impl ArenaChunk {
    /// `cuMemHostAlloc` of `len` zeroed bytes: waits for the device (call it with the resident
    /// kernels parked). Returns the chunk and where the device sees it.
    pub(crate) fn new(device: &Arc<Device>, len: usize) -> Result<(Self, u64)> {
        device.bind()?;
        let dev = device.raw();
        let ctx = r::primary_ctx_retain(dev)?;
        // SAFETY: the context is current; flags are valid for cuMemHostAlloc.
        let raw = match unsafe { r::host_alloc(len.max(1), PINNED_FLAGS) } {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: pairs with the retain above.
                let _ = unsafe { r::primary_ctx_release(dev) };
                return Err(e);
            }
        };
        let chunk = ArenaChunk {
            ptr: raw.cast(),
            len: len.max(1),
            dev,
            ctx,
            alive: device.alive.clone(),
        };
        // SAFETY: fresh allocation of `len` bytes that nothing else sees yet.
        unsafe { std::ptr::write_bytes(chunk.ptr, 0, chunk.len) };
        // SAFETY: allocated with DEVICEMAP in the current context (on error `chunk` drops
        // and frees it).
        let device_ptr = unsafe { r::host_device_pointer(raw)? };
        Ok((chunk, device_ptr))
    }
}

// SAFETY: the pointer is fixed for the value's life, page aligned (so 128-aligned), `len`
// bytes, owned by this value.
unsafe impl resident_ring::spsc::RingMemory for ArenaChunk {
    fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for ArenaChunk {
    fn drop(&mut self) {
        if self.alive.load(std::sync::atomic::Ordering::Acquire) {
            // SAFETY: the context is retained by this value; the memory was allocated in it by
            // `new` and is freed once, here. The arena drops a chunk only with its device,
            // when no ring kernel of it runs (each holds the device).
            unsafe {
                if r::ctx_set_current(self.ctx).is_ok() {
                    let _ = r::host_free(self.ptr.cast());
                }
            }
        }
        // SAFETY: pairs with the retain in `new` (allowed after a reset, too).
        let _ = unsafe { r::primary_ctx_release(self.dev) };
    }
}
