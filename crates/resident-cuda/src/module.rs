//! Loaded PTX modules, their kernels, and one-shot launches.
//!
//! [`Device::kernel`] is the whole path: source -> (in-memory cache) -> (disk cache) -> NVRTC ->
//! `cuModuleLoadData` -> function.

use crate::cache::{CacheKey, KernelCache};
use crate::device::Device;
use crate::error::{CudaError, Result};
pub use crate::loaded::Module;
use crate::nvrtc::{compile_ptx, CompileOptions};
use crate::result as r;
use crate::stream::Stream;
use bytemuck::Pod;
use resident_ring::launch::LaunchConfig;
use std::ffi::c_void;
use std::sync::Arc;

/// One kernel of a loaded module.
#[derive(Clone)]
pub struct Function {
    raw: r::CUfunction,
    _module: Arc<Module>,
    device: Arc<Device>,
    name: String,
}

// SAFETY: as `Module`.
unsafe impl Send for Function {}
// SAFETY: as `Module`.
unsafe impl Sync for Function {}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.name)
            .finish()
    }
}

/// Kernel parameters in the form `cuLaunchKernel` takes: each value boxed at a stable,
/// 8-byte-aligned address.
#[derive(Default, Debug)]
pub struct KernelParams {
    values: Vec<Box<[u64]>>,
}

impl KernelParams {
    /// No parameters yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a value parameter (a scalar or a `#[repr(C)]` struct, alignment at most 8).
    pub fn push<T: Pod>(&mut self, value: T) -> Result<&mut Self> {
        if std::mem::align_of::<T>() > 8 {
            return Err(CudaError::invalid(
                "cuLaunchKernel",
                "parameter aligned to more than 8 bytes",
            ));
        }
        let bytes = bytemuck::bytes_of(&value);
        let mut slot = vec![0u64; bytes.len().div_ceil(8).max(1)].into_boxed_slice();
        bytemuck::cast_slice_mut::<u64, u8>(&mut slot)[..bytes.len()].copy_from_slice(bytes);
        self.values.push(slot);
        Ok(self)
    }

    /// Appends a value parameter given as its bytes (at most 64).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> Result<&mut Self> {
        if bytes.len() > 64 {
            return Err(CudaError::invalid(
                "cuLaunchKernel",
                "by-value parameter larger than 64 bytes",
            ));
        }
        let mut slot = vec![0u64; bytes.len().div_ceil(8).max(1)].into_boxed_slice();
        bytemuck::cast_slice_mut::<u64, u8>(&mut slot)[..bytes.len()].copy_from_slice(bytes);
        self.values.push(slot);
        Ok(self)
    }

    /// Appends a device pointer parameter.
    pub fn push_ptr(&mut self, device_ptr: u64) -> &mut Self {
        self.values.push(vec![device_ptr].into_boxed_slice());
        self
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    fn pointers(&mut self) -> Vec<*mut c_void> {
        self.values
            .iter_mut()
            .map(|v| v.as_mut_ptr().cast::<c_void>())
            .collect()
    }
}

/// Hex text of a binary image (the disk cache stores text).
#[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
pub fn to_hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// The bytes of [`to_hex`] text; `None` when it is not.
#[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Device {
    /// Loads machine code (a CUBIN for this device's architecture) as a module; cached in
    /// memory under `key`.
    pub fn load_cubin(self: &Arc<Self>, key: u128, cubin: &[u8]) -> Result<Arc<Module>> {
        if let Some(m) = self.modules.get(key) {
            return Ok(m);
        }
        self.bind()?;
        // SAFETY: the context is current; `cubin` is an ELF image the driver validates.
        let raw = unsafe { r::module_load_data(cubin.as_ptr().cast())? };
        let m = Arc::new(Module::new(raw, self.ctx(), self.alive.clone()));
        self.modules.insert(key, m.clone());
        Ok(m)
    }

    /// Loads `source` for this device: machine code for its exact architecture (`sm_XY`,
    /// built by `cubin`), and only when that cannot be built or loaded for another reason
    /// than a compile error, PTX for `compute_XY` (built by `ptx`) that the driver JIT-compiles,
    /// after checking NVRTC is not newer than the driver. Both are disk-cached (`cache`, or the
    /// default folder) and cached in memory.
    pub fn load_best(
        self: &Arc<Self>,
        source: &str,
        extra: &[String],
        cache: Option<&KernelCache>,
        cubin: impl FnOnce(&str) -> Result<Vec<u8>>,
        ptx: impl FnOnce(&str) -> Result<String>,
    ) -> Result<Arc<Module>> {
        let (major, minor) = self.info().compute_capability;
        let sm = format!("sm_{major}{minor}");
        let key = CacheKey::new(source, extra, &sm, self.info().driver_version);
        if let Some(m) = self.modules.get(key.0) {
            return Ok(m);
        }
        let owned_default;
        let disk = match cache {
            Some(c) => Some(c),
            None => {
                owned_default = KernelCache::from_env().ok();
                owned_default.as_ref()
            }
        };
        let build = || cubin(&sm).map(|b| to_hex(&b));
        let image = match disk {
            Some(c) => c.get_or_build(&key, build).map(|(h, _)| h),
            None => build(),
        }
        .and_then(|h| {
            from_hex(&h)
                .ok_or_else(|| CudaError::invalid("cuModuleLoadDataEx", "cached CUBIN is not hex"))
        });
        match image {
            Ok(image) => match self.load_cubin(key.0, &image) {
                Ok(m) => return Ok(m),
                Err(e) if e.is_sticky() => return Err(e),
                Err(_) => {}
            },
            Err(e @ CudaError::Compile { .. }) => return Err(e),
            Err(_) => {}
        }
        // PTX fallback (e.g. an architecture this NVRTC cannot emit machine code for).
        if let Ok(nv) = crate::nvrtc::nvrtc_version() {
            r::check_ptx_compatible(nv, self.info().driver_version)?;
        }
        let arch = self.info().arch();
        let pkey = CacheKey::new(source, extra, &arch, self.info().driver_version);
        if let Some(m) = self.modules.get(pkey.0) {
            return Ok(m);
        }
        let text = match disk {
            Some(c) => c.get_or_build(&pkey, || ptx(&arch))?.0,
            None => ptx(&arch)?,
        };
        self.load_ptx(pkey.0, &text)
    }

    /// Loads PTX (text) as a module; cached in memory under `key`.
    pub fn load_ptx(self: &Arc<Self>, key: u128, ptx: &str) -> Result<Arc<Module>> {
        if let Some(m) = self.modules.get(key) {
            return Ok(m);
        }
        let image = std::ffi::CString::new(ptx)
            .map_err(|_| CudaError::invalid("cuModuleLoadData", "PTX contains NUL"))?;
        self.bind()?;
        // SAFETY: the context is current and `image` is NUL-terminated.
        let raw = unsafe { r::module_load_data(image.as_ptr().cast())? };
        let m = Arc::new(Module::new(raw, self.ctx(), self.alive.clone()));
        self.modules.insert(key, m.clone());
        Ok(m)
    }

    /// Number of modules in the in-memory cache.
    pub fn loaded_modules(&self) -> usize {
        self.modules.len()
    }

    /// The kernel `entry` of CUDA C `source`, compiled for this device with `extra` NVRTC
    /// options. Served from the in-memory cache, else the disk cache (`cache`, or the default
    /// folder when `None`), else compiled.
    pub fn kernel(
        self: &Arc<Self>,
        source: &str,
        entry: &str,
        extra: &[String],
        cache: Option<&KernelCache>,
    ) -> Result<Function> {
        let module = self.load_best(
            source,
            extra,
            cache,
            |sm| {
                let opts = CompileOptions {
                    arch: sm.to_string(),
                    extra: extra.to_vec(),
                };
                crate::nvrtc::compile_cubin(source, entry, &opts).map(|(image, _)| image)
            },
            |arch| {
                let opts = CompileOptions {
                    arch: arch.to_string(),
                    extra: extra.to_vec(),
                };
                compile_ptx(source, entry, &opts)
            },
        )?;
        self.function(&module, entry)
    }

    /// A kernel of a loaded module by its `extern "C"` name.
    pub fn function(self: &Arc<Self>, module: &Arc<Module>, name: &str) -> Result<Function> {
        self.bind()?;
        let mut fs = module.functions.lock().unwrap_or_else(|p| p.into_inner());
        let raw = match fs.get(name) {
            Some(f) => *f,
            None => {
                // SAFETY: the module is live (held by `module`).
                let f = unsafe { r::module_get_function(module.raw, name)? };
                fs.insert(name.to_string(), f);
                f
            }
        };
        drop(fs);
        Ok(Function {
            raw,
            _module: module.clone(),
            device: self.clone(),
            name: name.into(),
        })
    }
}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The occupancy calculator's (minimum grid for full occupancy, block size).
    pub fn occupancy_block_size(&self, dynamic_shared_bytes: usize) -> Result<(u32, u32)> {
        self.device.bind()?;
        // SAFETY: `raw` is live while `_module` is held.
        unsafe { r::occupancy_max_potential_block_size(self.raw, dynamic_shared_bytes, 0) }
    }

    /// Blocks of `block` threads (with `dynamic_shared_bytes` of dynamic shared memory) that
    /// one SM holds at once; 0 when such a block does not fit at all.
    pub fn max_active_blocks_per_sm(&self, block: u32, dynamic_shared_bytes: usize) -> Result<u32> {
        self.device.bind()?;
        // SAFETY: `raw` is live while `_module` is held.
        unsafe { r::occupancy_max_active_blocks(self.raw, block, dynamic_shared_bytes) }
    }

    /// The device the kernel was loaded on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Resolves an element-count launch with the occupancy calculator (explicit launches pass
    /// through unchanged).
    pub fn resolve(&self, cfg: LaunchConfig) -> Result<LaunchConfig> {
        if cfg.elements.is_none() {
            return Ok(cfg);
        }
        let (_, block) = self.occupancy_block_size(cfg.shared_bytes as usize)?;
        Ok(cfg.with_suggested_block(block))
    }

    /// Queues the kernel on `stream`.
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list in number, order and types; every device
    /// pointer among them must stay valid until the kernel finished; the kernel must not access
    /// memory outside what it was given.
    pub unsafe fn launch(
        &self,
        cfg: LaunchConfig,
        stream: &Stream,
        params: &mut KernelParams,
    ) -> Result<()> {
        let cfg = self.resolve(cfg)?;
        self.device.bind()?;
        let mut ptrs = params.pointers();
        r::launch_kernel(
            self.raw,
            cfg.grid,
            cfg.block,
            cfg.shared_bytes,
            stream.raw(),
            &mut ptrs,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cubin_survives_the_text_cache_encoding() {
        let image: Vec<u8> = (0..=255u8).chain([0x7f, 0x45, 0x4c, 0x46]).collect();
        assert_eq!(from_hex(&to_hex(&image)).unwrap(), image);
        assert!(from_hex("abc").is_none());
        assert!(from_hex("zz").is_none());
    }

    #[test]
    fn params_are_boxed_and_aligned() {
        #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
        #[repr(C)]
        struct P {
            a: u32,
            b: f32,
            c: u64,
        }
        let mut p = KernelParams::new();
        p.push(7u32).unwrap().push_ptr(0xdead_beef);
        p.push(P { a: 1, b: 2.0, c: 3 }).unwrap();
        assert_eq!(p.len(), 3);
        let ptrs = p.pointers();
        for q in &ptrs {
            assert_eq!(*q as usize % 8, 0);
        }
        // SAFETY: the pointers point into `p`'s boxes, which are alive and initialized.
        unsafe {
            assert_eq!(*(ptrs[0] as *const u32), 7);
            assert_eq!(*(ptrs[1] as *const u64), 0xdead_beef);
            assert_eq!((*(ptrs[2] as *const P)).c, 3);
        }
        assert!(p.push(0u128).is_err() || std::mem::align_of::<u128>() <= 8);
    }
}
