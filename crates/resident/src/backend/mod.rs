//! Backend selection.

use crate::runtime::state::{Error, Result};

/// Which backend a runtime runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// Threads on the host; always available.
    Cpu,
    /// CUDA through the driver loaded at run time.
    Cuda,
    /// CUDA when a device works, the CPU otherwise.
    #[default]
    Auto,
}

/// Resolves `Auto` and checks that the requested backend can be used.
pub(crate) fn resolve(b: Backend) -> Result<Backend> {
    match b {
        Backend::Cpu | Backend::Auto => Ok(Backend::Cpu),
        Backend::Cuda => Err(Error::BackendUnavailable(
            "the CUDA backend is not built yet".into(),
        )),
    }
}
