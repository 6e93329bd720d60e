//! The one error type of the CUDA layer. Every message names the call or the step that failed.

use std::path::PathBuf;

/// Everything that can go wrong in `resident-cuda`.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// `libcuda` could not be loaded (no NVIDIA driver on this machine).
    #[error("CUDA driver library not found (searched libcuda.so and its versioned names); install the NVIDIA driver or put libcuda on LD_LIBRARY_PATH")]
    DriverNotFound,
    /// `libnvrtc` could not be loaded.
    #[error("NVRTC library not found (searched libnvrtc.so, libnvrtc.so.13 and related names); run scripts/setup-nvrtc.sh and put its lib folder on LD_LIBRARY_PATH")]
    NvrtcNotFound,
    /// The driver loaded but reports no CUDA device.
    #[error("the CUDA driver reports no device")]
    NoDevice,
    /// A device ordinal past the number of devices.
    #[error("CUDA device {ordinal} requested but only {count} present")]
    DeviceOutOfRange {
        /// Ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// A driver API call returned an error.
    #[error("{call} failed: {code} ({message})")]
    Driver {
        /// The driver function, e.g. `cuMemHostAlloc`.
        call: &'static str,
        /// The `CUresult` name.
        code: String,
        /// The driver's description of the error.
        message: String,
    },
    /// An NVRTC call other than compilation failed.
    #[error("{call} failed: {code}")]
    Nvrtc {
        /// The NVRTC function.
        call: &'static str,
        /// The `nvrtcResult` name.
        code: String,
    },
    /// NVRTC rejected the source; `log` is the compiler's output.
    #[error("NVRTC could not compile `{name}` for {arch}:\n{log}")]
    Compile {
        /// Program name.
        name: String,
        /// Target architecture, e.g. `compute_90`.
        arch: String,
        /// The NVRTC program log.
        log: String,
    },
    /// The kernel cache could not read or write its folder.
    #[error("kernel cache at {path}: {source}")]
    Cache {
        /// The file or folder involved.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// NVML (telemetry) is unavailable or failed.
    #[error("NVML {what} failed: {message}")]
    Nvml {
        /// What was asked.
        what: &'static str,
        /// NVML's error.
        message: String,
    },
    /// A caller passed a value the call cannot accept.
    #[error("invalid argument to {call}: {reason}")]
    InvalidArgument {
        /// The function that rejected the value.
        call: &'static str,
        /// Why.
        reason: String,
    },
}

impl CudaError {
    pub(crate) fn invalid(call: &'static str, reason: impl Into<String>) -> Self {
        CudaError::InvalidArgument {
            call,
            reason: reason.into(),
        }
    }
}

/// Result of this crate.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;
