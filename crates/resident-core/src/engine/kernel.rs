//! One-shot kernels described once for every backend: CUDA C source plus entry name, and an
//! optional Rust closure the CPU backend runs over the same index space with rayon.

use super::storage::DeviceMemory;
use super::{BackendError, LaunchConfig, Result};
use bytemuck::Pod;
use rayon::prelude::*;
use std::marker::PhantomData;
use std::sync::Arc;

/// The CPU form of a kernel: called once per index, in parallel.
pub type CpuKernelFn = dyn Fn(&CpuThread<'_>) -> Result<()> + Send + Sync;

/// A kernel for every backend.
#[derive(Clone)]
pub struct Kernel {
    name: String,
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub cuda: Option<(String, String, Vec<String>)>,
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub wgsl: Option<(String, String)>,
    pub(crate) cpu: Option<Arc<CpuKernelFn>>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("cuda", &self.cuda.is_some())
            .field("wgsl", &self.wgsl.is_some())
            .field("cpu", &self.cpu.is_some())
            .finish()
    }
}

impl Kernel {
    /// A kernel named `name` with no implementation yet.
    pub fn new(name: impl Into<String>) -> Self {
        Kernel {
            name: name.into(),
            cuda: None,
            wgsl: None,
            cpu: None,
        }
    }

    /// The CUDA C `source` and its `extern "C"` `entry` kernel.
    pub fn cuda(mut self, source: impl Into<String>, entry: impl Into<String>) -> Self {
        self.cuda = Some((source.into(), entry.into(), Vec::new()));
        self
    }

    /// The WGSL `source` and its `@compute` `entry` point, for the wgpu backend. Argument `i`
    /// is `@group(0) @binding(i)`: read-only buffers `var<storage, read>`, writable ones
    /// `var<storage, read_write>`, scalars `var<uniform>`; the workgroup size is the source's.
    pub fn wgsl(mut self, source: impl Into<String>, entry: impl Into<String>) -> Self {
        self.wgsl = Some((source.into(), entry.into()));
        self
    }

    /// Extra NVRTC options for the CUDA source.
    pub fn nvrtc_options(mut self, options: &[&str]) -> Self {
        if let Some(c) = &mut self.cuda {
            c.2 = options.iter().map(|s| s.to_string()).collect();
        }
        self
    }

    /// The CPU implementation, called once per index of the launch.
    pub fn cpu(mut self, f: impl Fn(&CpuThread<'_>) -> Result<()> + Send + Sync + 'static) -> Self {
        self.cpu = Some(Arc::new(f));
        self
    }

    /// Name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// One kernel argument. Buffers borrow their memory for the launch, so a writable buffer
/// cannot alias any other argument.
#[derive(Debug)]
pub enum KernelArg<'a> {
    /// Memory the kernel only reads.
    Buffer {
        /// Backend address.
        address: u64,
        /// Size in bytes.
        bytes: usize,
        /// Ties the argument to the borrow of its memory.
        _borrow: PhantomData<&'a [u8]>,
    },
    /// Memory the kernel writes.
    BufferMut {
        /// Backend address.
        address: u64,
        /// Size in bytes.
        bytes: usize,
        /// Ties the argument to the exclusive borrow of its memory.
        _borrow: PhantomData<&'a mut [u8]>,
    },
    /// A value of up to 8 bytes, passed by value.
    Scalar {
        /// Little-endian bytes.
        bytes: [u8; 8],
        /// How many of them are used.
        len: usize,
    },
}

impl<'a> KernelArg<'a> {
    /// A read-only buffer.
    pub fn buffer(mem: &'a DeviceMemory) -> Self {
        // SAFETY: `mem` is borrowed for `'a`, so the address stays valid and unwritten.
        unsafe { Self::from_raw(mem.address(), mem.len(), false) }
    }
    /// A writable buffer.
    pub fn buffer_mut(mem: &'a mut DeviceMemory) -> Self {
        // SAFETY: `mem` is exclusively borrowed for `'a`.
        unsafe { Self::from_raw(mem.address(), mem.len(), true) }
    }
    /// A by-value parameter (`u32`, `f32`, `u64`, a small `#[repr(C)]` struct ...).
    pub fn scalar<T: Pod>(value: T) -> Self {
        let b = bytemuck::bytes_of(&value);
        assert!(b.len() <= 8, "kernel scalars are at most 8 bytes");
        let mut bytes = [0u8; 8];
        bytes[..b.len()].copy_from_slice(b);
        KernelArg::Scalar {
            bytes,
            len: b.len(),
        }
    }
    /// A buffer from a raw backend address.
    ///
    /// # Safety
    /// `address` must be memory of the device the kernel runs on, valid for `bytes` bytes for
    /// `'a`, and (when `writable`) used by nothing else during `'a`.
    pub unsafe fn from_raw(address: u64, bytes: usize, writable: bool) -> Self {
        if writable {
            KernelArg::BufferMut {
                address,
                bytes,
                _borrow: PhantomData,
            }
        } else {
            KernelArg::Buffer {
                address,
                bytes,
                _borrow: PhantomData,
            }
        }
    }
}

/// What the CPU closure sees for one index.
pub struct CpuThread<'a> {
    index: usize,
    args: &'a [KernelArg<'a>],
}

impl<'a> CpuThread<'a> {
    /// This invocation's index in `0 .. cfg.index_space()` (CUDA's
    /// `blockIdx.x * blockDim.x + threadIdx.x`).
    pub fn index(&self) -> usize {
        self.index
    }

    fn bad(&self, index: usize, reason: impl Into<String>) -> BackendError {
        BackendError::BadArgument {
            index,
            reason: reason.into(),
        }
    }

    /// A read-only buffer argument as a slice.
    pub fn input<T: Pod>(&self, arg: usize) -> Result<&'a [T]> {
        match self.args.get(arg) {
            Some(KernelArg::Buffer { address, bytes, .. }) => {
                let (ptr, n) = (
                    *address as *const T,
                    bytes / std::mem::size_of::<T>().max(1),
                );
                if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
                    return Err(self.bad(arg, "buffer misaligned for the element type"));
                }
                // SAFETY: the argument borrows `bytes` bytes of host memory (CPU backend) for
                // the launch and nothing writes it meanwhile (writable buffers are exclusive
                // borrows, so they cannot be this memory); alignment checked; T is Pod.
                Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
            }
            Some(KernelArg::BufferMut { .. }) => Err(self.bad(
                arg,
                "is writable; read it through `output` (other indices may write it)",
            )),
            Some(KernelArg::Scalar { .. }) => Err(self.bad(arg, "is a scalar, not a buffer")),
            None => Err(self.bad(arg, "missing")),
        }
    }

    /// A by-value argument.
    pub fn scalar<T: Pod>(&self, arg: usize) -> Result<T> {
        match self.args.get(arg) {
            Some(KernelArg::Scalar { bytes, len }) if *len == std::mem::size_of::<T>() => {
                Ok(bytemuck::pod_read_unaligned(&bytes[..*len]))
            }
            Some(KernelArg::Scalar { len, .. }) => Err(self.bad(
                arg,
                format!(
                    "scalar has {len} bytes, asked for {}",
                    std::mem::size_of::<T>()
                ),
            )),
            Some(_) => Err(self.bad(arg, "is a buffer, not a scalar")),
            None => Err(self.bad(arg, "missing")),
        }
    }

    /// This index's element of a writable buffer argument.
    pub fn output<T: Pod>(&self, arg: usize) -> Result<Output<'a, T>> {
        match self.args.get(arg) {
            Some(KernelArg::BufferMut { address, bytes, .. }) => {
                let ptr = *address as *mut T;
                if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
                    return Err(self.bad(arg, "buffer misaligned for the element type"));
                }
                Ok(Output {
                    ptr,
                    len: bytes / std::mem::size_of::<T>().max(1),
                    index: self.index,
                    arg,
                    _t: PhantomData,
                })
            }
            Some(_) => Err(self.bad(arg, "is not a writable buffer")),
            None => Err(self.bad(arg, "missing")),
        }
    }
}

/// The element of a writable buffer that belongs to one index. Each index of a launch owns a
/// different element, which is what makes `get` and `set` safe from parallel closures.
pub struct Output<'a, T> {
    ptr: *mut T,
    len: usize,
    index: usize,
    arg: usize,
    _t: PhantomData<&'a mut [T]>,
}

impl<T: Pod> Output<'_, T> {
    fn check(&self) -> Result<()> {
        if self.index >= self.len {
            return Err(BackendError::BadArgument {
                index: self.arg,
                reason: format!(
                    "index {} past the buffer's {} elements",
                    self.index, self.len
                ),
            });
        }
        Ok(())
    }
    /// Reads this index's element.
    pub fn get(&self) -> Result<T> {
        self.check()?;
        // SAFETY: in bounds (checked); only the invocation with this index touches this
        // element during the launch.
        Ok(unsafe { self.ptr.add(self.index).read() })
    }
    /// Writes this index's element.
    pub fn set(&self, value: T) -> Result<()> {
        self.check()?;
        // SAFETY: as `get`.
        unsafe { self.ptr.add(self.index).write(value) };
        Ok(())
    }
    /// Reads any element (gather from a writable buffer).
    ///
    /// # Safety
    /// No other index of the launch may write element `at`.
    pub unsafe fn read_at(&self, at: usize) -> Result<T> {
        if at >= self.len {
            return Err(BackendError::BadArgument {
                index: self.arg,
                reason: format!("index {at} past the buffer's {} elements", self.len),
            });
        }
        Ok(self.ptr.add(at).read())
    }

    /// Writes any element (scatter).
    ///
    /// # Safety
    /// No other index of the launch may read or write element `at`.
    pub unsafe fn write_at(&self, at: usize, value: T) -> Result<()> {
        if at >= self.len {
            return Err(BackendError::BadArgument {
                index: self.arg,
                reason: format!("index {at} past the buffer's {} elements", self.len),
            });
        }
        self.ptr.add(at).write(value);
        Ok(())
    }
}

/// Arguments shared by the rayon workers.
struct SharedArgs<'a>(&'a [KernelArg<'a>]);
// SAFETY: the addresses in the arguments are only dereferenced through `CpuThread`, whose
// accessors keep each index to its own output element and read-only buffers read-only.
unsafe impl Sync for SharedArgs<'_> {}

/// Runs `kernel`'s CPU closure over `cfg.index_space()` indices in parallel.
pub(crate) fn run_cpu(kernel: &Kernel, cfg: LaunchConfig, args: &[KernelArg<'_>]) -> Result<()> {
    let f = kernel
        .cpu
        .as_ref()
        .ok_or_else(|| BackendError::NoCpuImplementation {
            kernel: kernel.name().to_string(),
        })?;
    let shared = SharedArgs(args);
    let each = |index| {
        f(&CpuThread {
            index,
            args: shared.0,
        })
    };
    if let Some(r) = crate::profile::cpu_launch(cfg.index_space(), each) {
        return r;
    }
    (0..cfg.index_space() as usize)
        .into_par_iter()
        .try_for_each(|index| {
            f(&CpuThread {
                index,
                args: shared.0,
            })
        })
}

/// Runs `f(index)` for every index of `cfg` on the rayon pool: the CPU launch primitive.
pub fn launch_cpu(cfg: LaunchConfig, f: impl Fn(usize) + Send + Sync) {
    (0..cfg.index_space() as usize).into_par_iter().for_each(f);
}
