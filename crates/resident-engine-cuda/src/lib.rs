//! # resident-engine-cuda
//!
//! resident's CUDA engine: one engine, two launchers. A ring kernel's [`CudaHandler`] (CUDA C
//! source and its declarations, in every build) runs as the persistent ring-kernel template of
//! `resident-cuda` on an NVIDIA GPU (feature `cuda`: [`ring`]'s GPU launcher, [`device`]'s
//! memory, streams and one-shot kernels) or on CudaSim, the same source compiled by the host
//! C++ compiler and run on host threads (feature `cudasim`: [`sim`]). Both are pumped by the
//! one device host of `resident-core` and plug in through its seam
//! ([`resident_core::runtime::device_handler::DeviceHandler`], in [`launch`]).
//!
//! Applications use it through the facade `resident` (`resident::prelude::CudaHandler`).

#[cfg(feature = "cuda")]
pub mod device;
#[cfg(any(feature = "cuda", feature = "cudasim"))]
mod forward;
pub mod launch;
// The handler is plain data, kept in every build; its GPU parts follow the `cuda` feature.
pub mod persistent;
#[cfg_attr(
    not(any(feature = "cuda", feature = "cudasim")),
    allow(dead_code, unused_imports)
)]
pub mod ring;
#[cfg(any(feature = "cuda", feature = "cudasim"))]
mod seam;
pub mod sim;

pub use ring::{CudaHandler, BUFFER_SYNC_TIMEOUT};

/// How long the residency rule waits for every resident kernel of the device to park, for a
/// user allocation or a launch, on either launcher (CudaSim's parked kernels are OS threads of
/// a shared machine, hence generous). The driver layer's own kernel launch and teardown keep
/// `crate::persistent::kernel::QUIESCE_TIMEOUT`.
pub const QUIESCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A one-shot kernel's CUDA source comes from users: it may ask the compiler for no file of the
/// host (`crate::persistent::untrusted`), on either launcher, before any compile.
#[cfg(any(feature = "cuda", feature = "cudasim"))]
pub(crate) fn check_source(
    kernel: &resident_core::engine::Kernel,
    source: &str,
) -> std::result::Result<(), resident_core::engine::BackendError> {
    match crate::persistent::untrusted::forbidden_file(source) {
        None => Ok(()),
        Some(f) => Err(resident_core::engine::BackendError::ForbiddenFile {
            kernel: kernel.name().to_string(),
            line: f.line,
            directive: f.directive,
            file: f.name,
        }),
    }
}
