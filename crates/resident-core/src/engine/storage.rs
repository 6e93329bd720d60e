//! Backend-neutral owners of memory and streams. Their insides name the backend's types; their
//! faces do not.

use super::{BackendError, BackendKind, Result};
use std::alloc::Layout;
use std::any::Any;
use std::sync::Arc;

/// Alignment of host allocations: a cache line pair, enough for any `Pod` we move and for
/// ring headers.
pub(crate) const HOST_ALIGN: usize = 128;

/// Zeroed, 128-byte aligned heap bytes.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub struct HeapBytes {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: owns its allocation exclusively.
unsafe impl Send for HeapBytes {}
// SAFETY: shared access is read-only through `&self` methods.
unsafe impl Sync for HeapBytes {}

impl HeapBytes {
    pub(crate) fn zeroed(len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(1), HOST_ALIGN)
            .map_err(|_| BackendError::TooLarge(len))?;
        // SAFETY: non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        // A refusal is a typed error, never `handle_alloc_error` (which aborts the process).
        let ptr = std::ptr::NonNull::new(raw).ok_or(BackendError::OutOfMemory(len))?;
        Ok(HeapBytes { ptr, len, layout })
    }
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub(crate) fn as_bytes(&self) -> &[u8] {
        // SAFETY: `len` zero-initialized bytes, owned.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub(crate) fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HeapBytes {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `zeroed`, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub enum DeviceMemoryInner {
    Host(HeapBytes),
    /// An engine's memory that this module does not name (CUDA's, wgpu's): the engine
    /// downcasts it.
    #[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
    Engine(Box<dyn EngineMemory>),
}

/// The memory of an engine, seen from here without naming the engine (so `storage` imports no
/// engine module and an engine is added without editing this file).
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub trait EngineMemory: Any + Send + Sync {
    /// Size in bytes.
    fn len(&self) -> usize;
    /// Whether the size is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The engine it belongs to.
    fn backend(&self) -> BackendKind;
    /// The address a kernel of the engine uses.
    fn address(&self) -> u64;
    /// For the engine's own downcast.
    fn as_any(&self) -> &dyn Any;
    /// For the engine's own downcast, mutably.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// Host memory an engine allocated (CUDA's pinned, device-mapped memory), seen from here
/// without naming the engine.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub trait EngineHostMemory: Send + Sync {
    /// The bytes (at least the `HostMemory`'s length).
    fn as_bytes(&self) -> &[u8];
    /// The bytes, mutably.
    fn as_bytes_mut(&mut self) -> &mut [u8];
}

/// Memory a kernel of its backend reads and writes (host memory on the CPU backend).
pub struct DeviceMemory {
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub inner: DeviceMemoryInner,
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("backend", &self.backend())
            .field("len", &self.len())
            .finish()
    }
}

impl DeviceMemory {
    /// Size in bytes.
    pub fn len(&self) -> usize {
        match &self.inner {
            DeviceMemoryInner::Host(h) => h.len,
            DeviceMemoryInner::Engine(e) => e.len(),
        }
    }
    /// Whether the size is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The backend it belongs to.
    pub fn backend(&self) -> BackendKind {
        match &self.inner {
            DeviceMemoryInner::Host(_) => BackendKind::Cpu,
            DeviceMemoryInner::Engine(e) => e.backend(),
        }
    }
    /// The address a kernel of the backend uses (a host address on the CPU backend; on wgpu,
    /// which has no device pointers, a handle the backend maps back to the buffer).
    pub fn address(&self) -> u64 {
        match &self.inner {
            DeviceMemoryInner::Host(h) => h.as_ptr() as u64,
            DeviceMemoryInner::Engine(e) => e.address(),
        }
    }
}

#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub enum HostMemoryInner {
    Heap(HeapBytes),
    /// Pinned memory of an engine (CUDA's).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Pinned(Box<dyn EngineHostMemory>),
}

/// Host memory, pinned and device-mapped when the backend provides it.
pub struct HostMemory {
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub inner: HostMemoryInner,
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub len: usize,
}

impl std::fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMemory")
            .field("pinned", &self.is_pinned())
            .field("len", &self.len)
            .finish()
    }
}

impl HostMemory {
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub fn heap(len: usize) -> Result<Self> {
        Ok(HostMemory {
            inner: HostMemoryInner::Heap(HeapBytes::zeroed(len)?),
            len,
        })
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the size is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Whether it is page-locked, device-mapped memory.
    pub fn is_pinned(&self) -> bool {
        match self.inner {
            HostMemoryInner::Heap(_) => false,
            HostMemoryInner::Pinned(_) => true,
        }
    }
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.inner {
            HostMemoryInner::Heap(h) => h.as_bytes(),
            HostMemoryInner::Pinned(p) => &p.as_bytes()[..self.len],
        }
    }
    /// The bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.inner {
            HostMemoryInner::Heap(h) => h.as_bytes_mut(),
            HostMemoryInner::Pinned(p) => &mut p.as_bytes_mut()[..self.len],
        }
    }
}

/// An ordered queue of device work. On the CPU backend work runs when queued, so a stream
/// there is only a token.
#[derive(Clone, Default)]
pub struct Stream {
    /// The engine's own stream (CUDA's), which the engine downcasts; `None` on engines whose
    /// work runs when queued.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub engine: Option<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("engine", &self.engine.is_some())
            .finish()
    }
}
