//! The engines' errors, defined once in the seam so the runtime carries them typed
//! (`Error::Device`, `KernelFailure::Device`) while naming no engine module: what a device-side
//! kernel reports ([`DeviceError`]), an engine's own error carried across the seam
//! ([`EngineError`]), and the wgpu engine's launch and fault causes.

use std::sync::Arc;
use std::time::Duration;

use resident_ring::message::WgslLayoutError;

use super::BackendError;

/// An engine's own error, carried across the seam as it was made: the core names no engine's
/// types, so the caller asks for the type it knows (`downcast_ref`), e.g.
/// `resident::cuda::PersistentError` under a [`DeviceError::Cuda`] or
/// `resident::cuda::CudaError` under a [`BackendError::Cuda`].
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct EngineError(Box<dyn std::error::Error + Send + Sync + 'static>);

impl EngineError {
    /// Wraps an engine's error.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        EngineError(Box::new(e))
    }

    /// The engine's error, when it is an `E`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }

    /// Whether the engine's error is an `E`.
    pub fn is<E: std::error::Error + 'static>(&self) -> bool {
        self.0.is::<E>()
    }

    /// The engine's error itself.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

/// Why a device-side kernel could not be launched or stopped, or why it failed. Keeps the
/// engine's own error, so callers can ask for it by type (see [`DeviceError::engine`]), e.g.
/// `resident::cuda::PersistentError::Compile` or `resident::cuda::CudaError::ResidencyExceeded`.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The persistent CUDA kernel layer (on a GPU or on CudaSim) reported an error: a
    /// `resident::cuda::PersistentError`, to downcast.
    #[error(transparent)]
    Cuda(EngineError),
    /// The device side exited without being asked to.
    #[error("the device kernel exited on its own ({state})")]
    ExitedOnItsOwn {
        /// The state it reported.
        state: String,
    },
    /// The device side failed after launch (on wgpu: a batch cut short, not read back in time,
    /// the device lost, a `WgpuFault`); the engine's own error is the source, to downcast.
    #[error("the device kernel faulted: {0}")]
    Fault(#[source] Arc<dyn std::error::Error + Send + Sync>),
    /// The device side did not stop within the timeout.
    #[error("the device kernel did not stop within {0:?}")]
    StopTimeout(Duration),
    /// A WGSL ring kernel could not be launched (compile error with line, layout, limits).
    #[error(transparent)]
    Wgsl(#[from] WgslLaunchError),
    /// The backend's device layer failed (wgpu validation, memory, device lost).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A bound buffer cannot be used by this device handler (no device type for its element,
    /// a name that is not an identifier, a host write of the wrong size, a kernel that ended).
    #[error("bound buffer '{name}': {reason}")]
    Binding {
        /// The buffer's name.
        name: String,
        /// Why.
        reason: String,
    },
}

impl DeviceError {
    /// The engine's own error of type `E`, wherever this error carries one: under
    /// [`DeviceError::Cuda`], or under a [`BackendError`] (`Cuda`, `CudaUnavailable`, `Sim`,
    /// `Residency`), directly or inside a WGSL launch error.
    pub fn engine<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            DeviceError::Cuda(e) => e.downcast_ref(),
            DeviceError::Backend(b) | DeviceError::Wgsl(WgslLaunchError::Device(b)) => b.engine(),
            _ => None,
        }
    }
}

/// Why a WGSL ring kernel could not be launched.
#[derive(Debug, thiserror::Error)]
pub enum WgslLaunchError {
    /// A message or state type has no byte-identical WGSL declaration.
    #[error(transparent)]
    Layout(#[from] WgslLayoutError),
    /// The handler (with the generated code) did not compile.
    #[error(transparent)]
    Compile(#[from] WgslError),
    /// The compile was stopped by the compile's limits, or crashed in its own process.
    #[error(transparent)]
    Stopped(#[from] resident_limits::CompileStopped),
    /// WGSL lays a type out with another size than Rust.
    #[error("type `{ty}` is {wgsl} bytes in WGSL but {rust} bytes in Rust")]
    LayoutMismatch {
        /// The type.
        ty: String,
        /// WGSL size.
        wgsl: u32,
        /// Rust size.
        rust: usize,
    },
    /// The device refused (limits, memory, loss).
    #[error(transparent)]
    Device(#[from] BackendError),
    /// `WgslHandler::atomic` named a buffer that is not bound, or whose elements are not
    /// `u32`/`i32`.
    #[error("atomic bound buffer '{name}': {reason}")]
    Atomic {
        /// The name given to `atomic`.
        name: String,
        /// Why it cannot be atomic.
        reason: String,
    },
    /// The device refused a bound buffer (for example past `max_storage_buffer_binding_size`,
    /// named in the [`BackendError::WgpuLimit`] underneath).
    #[error("bound buffer '{name}': {source}")]
    BoundBuffer {
        /// The buffer's name.
        name: String,
        /// What the device said.
        #[source]
        source: BackendError,
    },
}

/// A WGSL source that naga refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("WGSL {stage} error{}: {message}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
pub struct WgslError {
    /// `parse` or `validation`.
    pub stage: &'static str,
    /// naga's message, with the source excerpt it points at.
    pub message: String,
    /// 1-based line in the source that was compiled, when naga gives one.
    pub line: Option<u32>,
    /// 1-based column, when naga gives one.
    pub column: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine's error as an engine crate would define it (the core knows none).
    #[derive(Debug, PartialEq, thiserror::Error)]
    enum Engines {
        #[error("compile failed: {log}")]
        Compile { log: String },
    }

    #[derive(Debug, thiserror::Error)]
    #[error("other")]
    struct Other;

    #[test]
    fn an_engine_error_crosses_the_seam_typed_and_its_words_unchanged() {
        let e = DeviceError::Cuda(EngineError::new(Engines::Compile { log: "nope".into() }));
        assert_eq!(e.to_string(), "compile failed: nope");
        assert_eq!(
            e.engine::<Engines>(),
            Some(&Engines::Compile { log: "nope".into() })
        );
        assert!(e.engine::<Other>().is_none());
        // Under a backend error, directly or inside a WGSL launch error.
        let b = BackendError::Sim(EngineError::new(Engines::Compile { log: "x".into() }));
        assert_eq!(b.to_string(), "CudaSim: compile failed: x");
        assert!(b.engine::<Engines>().is_some());
        assert!(
            std::error::Error::source(&b).is_some(),
            "the engine's error is the source"
        );
        let d = DeviceError::Wgsl(WgslLaunchError::Device(b));
        assert!(d.engine::<Engines>().is_some());
        // Variants that carry no engine error have none.
        assert!(DeviceError::StopTimeout(Duration::from_secs(1))
            .engine::<Engines>()
            .is_none());
    }
}
