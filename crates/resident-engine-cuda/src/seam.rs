//! The CUDA engine's errors as the seam carries them. The core names no CUDA type, so each
//! crosses as an [`EngineError`] inside the variant that says where it came from; callers get
//! it back by type (`DeviceError::engine`, `BackendError::engine`).

use crate::persistent::PersistentError;
use resident_core::engine::error::DeviceError;
use resident_core::engine::{BackendError, EngineError};
use resident_cuda::CudaError;

/// An error of the CUDA layers and the seam's form of it.
pub(crate) trait ToSeam {
    type Seam;
    fn to_seam(self) -> Self::Seam;
}

impl ToSeam for CudaError {
    type Seam = BackendError;
    fn to_seam(self) -> BackendError {
        BackendError::Cuda(EngineError::new(self))
    }
}

impl ToSeam for crate::sim::SimError {
    type Seam = BackendError;
    fn to_seam(self) -> BackendError {
        BackendError::Sim(EngineError::new(self))
    }
}

impl ToSeam for PersistentError {
    type Seam = DeviceError;
    fn to_seam(self) -> DeviceError {
        DeviceError::Cuda(EngineError::new(self))
    }
}

/// `result.seam()?`: the `?` of the CUDA layers' results in the engine's functions.
pub(crate) trait SeamResult<T, E: ToSeam> {
    fn seam(self) -> Result<T, E::Seam>;
}

impl<T, E: ToSeam> SeamResult<T, E> for Result<T, E> {
    fn seam(self) -> Result<T, E::Seam> {
        self.map_err(ToSeam::to_seam)
    }
}

/// CUDA cannot be used here: the driver layer says why.
#[cfg(feature = "cuda")]
pub(crate) fn unavailable(e: CudaError) -> BackendError {
    BackendError::CudaUnavailable(EngineError::new(e))
}
