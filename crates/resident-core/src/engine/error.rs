//! The engines' errors, defined once in the seam so the runtime carries them typed
//! (`Error::Device`, `KernelFailure::Device`) while naming no engine module: what a device-side
//! kernel reports ([`DeviceError`]), and the wgpu engine's launch and fault causes.

use std::sync::Arc;
use std::time::Duration;

use resident_ring::message::WgslLayoutError;

use super::BackendError;

/// Why a device-side kernel could not be launched or stopped, or why it failed. Keeps the
/// backend's own error as its source, so callers can match e.g.
/// `resident_cuda::CudaError::ResidencyExceeded`.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The persistent CUDA kernel layer reported an error.
    #[error(transparent)]
    Cuda(#[from] resident_cuda::persistent::PersistentError),
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
    /// The CUDA error underneath, if this came from the CUDA driver.
    pub fn cuda(&self) -> Option<&resident_cuda::CudaError> {
        match self {
            DeviceError::Cuda(resident_cuda::persistent::PersistentError::Cuda(e)) => Some(e),
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
