//! Loaded modules and the per-device module cache: the lowest layer of [`crate::module`],
//! below [`crate::device::Device`] (which owns a cache) and [`crate::module::Function`] (which
//! holds its module), so that neither imports the other for them.

use crate::result as r;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A loaded module, unloaded on drop. Lives inside its [`Device`](crate::device::Device) (which keeps the context
/// alive longer than any module).
pub struct Module {
    pub(crate) raw: r::CUmodule,
    /// The context it was loaded in; retained by the owning `Device`, which drops its module
    /// cache before releasing the context, while every `Function` holds an `Arc<Device>`.
    pub(crate) ctx: r::CUcontext,
    /// The owning `Device`'s flag: `false` once the context was reset (the module is gone).
    pub(crate) alive: Arc<std::sync::atomic::AtomicBool>,
    /// Its functions, looked up once each (with lazy loading the first lookup loads the
    /// function, which waits for the device: it happens before the first resident launch).
    pub(crate) functions: Mutex<HashMap<String, r::CUfunction>>,
}

impl Module {
    pub(crate) fn new(
        raw: r::CUmodule,
        ctx: r::CUcontext,
        alive: Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        Module {
            raw,
            ctx,
            alive,
            functions: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `name` was looked up already (no driver call is left for it).
    #[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
    pub fn has_function(&self, name: &str) -> bool {
        self.functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(name)
    }
}

// SAFETY: module handles may be used from any thread with the context current.
unsafe impl Send for Module {}
// SAFETY: loaded modules are immutable.
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        if !self.alive.load(std::sync::atomic::Ordering::Acquire) {
            // The context was reset: the handle means nothing (and may name a new module).
            return;
        }
        // SAFETY: `ctx` is still retained (see the field's invariant).
        let _ = unsafe { r::ctx_set_current(self.ctx) };
        // SAFETY: loaded in `load`, unloaded once, here; no `Function` outlives its module (each
        // holds an `Arc<Module>`).
        let _ = unsafe { r::module_unload(self.raw) };
    }
}

/// The in-memory module cache of one device: key -> loaded module.
#[derive(Default)]
#[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
pub struct ModuleCache(Mutex<HashMap<u128, Arc<Module>>>);

impl ModuleCache {
    #[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
    #[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
    pub fn get(&self, key: u128) -> Option<Arc<Module>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned()
    }
    #[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
    pub fn insert(&self, key: u128, m: Arc<Module>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, m);
    }
    #[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
