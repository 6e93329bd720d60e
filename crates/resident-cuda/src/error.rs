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
    /// `libcuda` loaded but lacks functions this build calls (an older driver than the
    /// `cuda-13000` bindings expect); refused before any call could panic on the missing symbol.
    #[error(
        "the CUDA driver lacks {symbols:?}, which this build calls; install a newer NVIDIA driver"
    )]
    MissingDriverSymbols {
        /// The functions not found in libcuda.
        symbols: Vec<&'static str>,
    },
    /// NVRTC is newer than the driver: its PTX would be refused at load (PTX ISA too new).
    #[error("NVRTC {}.{} is newer than the CUDA driver ({}.{}): its PTX cannot be loaded; use an NVRTC of at most the driver's version or a newer driver", nvrtc.0, nvrtc.1, driver.0, driver.1)]
    NvrtcNewerThanDriver {
        /// NVRTC's version.
        nvrtc: (u32, u32),
        /// The driver's CUDA version.
        driver: (u32, u32),
    },
    /// `cuModuleLoadDataEx` failed; `log` is the JIT compiler's error log.
    #[error("cuModuleLoadDataEx failed: {code} ({message}); JIT log:\n{log}")]
    ModuleLoad {
        /// The `CUresult` name.
        code: String,
        /// The driver's description.
        message: String,
        /// The JIT error log (empty when the driver wrote none).
        log: String,
    },
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
    /// A device fault (trap, illegal address, ...) poisoned the device's CUDA context: every
    /// kernel, buffer and stream made on it before the fault is gone. The device opens again once
    /// every object from before the fault has been dropped (the context is then reset).
    #[error("CUDA device {ordinal} was lost to a device fault ({reason}); drop every kernel and buffer made on it before the fault, then open it again")]
    DeviceLost {
        /// The device.
        ordinal: usize,
        /// The fault, as the driver reported it.
        reason: String,
    },
    /// Launching one more resident (persistent) kernel could leave some of them unable to run,
    /// because not all of them would be co-resident on the device.
    #[error("CUDA device {ordinal} already holds {resident} resident kernels, its limit (one per SM, at most the device's concurrent-kernel limit) is {limit}")]
    ResidencyExceeded {
        /// The device.
        ordinal: usize,
        /// Resident kernels now.
        resident: usize,
        /// The most this device keeps co-resident.
        limit: usize,
    },
    /// A call that waits for the whole device was refused because ring kernels are resident on
    /// it (they never finish, so it would wait forever).
    #[error("device {ordinal}: {call} refused: {resident} ring kernel(s) resident, the wait would never end")]
    WouldWaitForResident {
        /// The device.
        ordinal: usize,
        /// Resident kernels now.
        resident: usize,
        /// The refused call.
        call: &'static str,
    },
    /// The resident kernels of a device did not all park for an operation under the
    /// residency rule within its timeout.
    #[error("device {ordinal}: the {kernels} resident kernel(s) did not all park in time for an operation under the residency rule")]
    QuiesceTimeout {
        /// The device.
        ordinal: usize,
        /// Resident kernels asked to park.
        kernels: usize,
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

/// Driver errors after which the context is unusable ("sticky": every later call in the
/// context fails with the same error until it is reset). From the CUDA driver API's `CUresult`
/// documentation: every code documented as leaving "the context in an inconsistent state" or
/// requiring that "the process must be terminated and relaunched", plus `CUDA_ERROR_UNKNOWN`,
/// which a fault can surface as and after which nothing about the context is known.
const STICKY_CODES: &[&str] = &[
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    "CUDA_ERROR_CONTAINED",
    "CUDA_ERROR_TENSOR_MEMORY_LEAK",
    "CUDA_ERROR_EXTERNAL_DEVICE",
    "CUDA_ERROR_UNKNOWN",
];

impl CudaError {
    /// Whether this error poisoned the context (a device fault; see [`CudaError::DeviceLost`]).
    pub fn is_sticky(&self) -> bool {
        match self {
            CudaError::Driver { code, .. } => STICKY_CODES.iter().any(|c| code == c),
            CudaError::DeviceLost { .. } => true,
            _ => false,
        }
    }

    #[cfg(feature = "driver")]
    pub(crate) fn invalid(call: &'static str, reason: impl Into<String>) -> Self {
        CudaError::InvalidArgument {
            call,
            reason: reason.into(),
        }
    }
}

/// Result of this crate.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(code: &str) -> CudaError {
        CudaError::Driver {
            call: "cuStreamQuery",
            code: code.into(),
            message: String::new(),
        }
    }

    #[test]
    fn faults_are_sticky_other_errors_are_not() {
        assert!(driver("CUDA_ERROR_ILLEGAL_ADDRESS").is_sticky());
        assert!(driver("CUDA_ERROR_LAUNCH_FAILED").is_sticky());
        assert!(driver("CUDA_ERROR_ILLEGAL_INSTRUCTION").is_sticky());
        for code in [
            "CUDA_ERROR_UNKNOWN",
            "CUDA_ERROR_CONTAINED",
            "CUDA_ERROR_EXTERNAL_DEVICE",
            "CUDA_ERROR_NVLINK_UNCORRECTABLE",
            "CUDA_ERROR_TENSOR_MEMORY_LEAK",
            "CUDA_ERROR_HARDWARE_STACK_ERROR",
        ] {
            assert!(driver(code).is_sticky(), "{code}");
        }
        assert!(!driver("CUDA_ERROR_OUT_OF_MEMORY").is_sticky());
        assert!(!driver("CUDA_ERROR_NOT_READY").is_sticky());
        assert!(!CudaError::NoDevice.is_sticky());
    }

    /// The code strings are the `CUresult` names as cudarc prints them.
    #[cfg(feature = "driver")]
    #[test]
    fn cudarc_names_match_the_sticky_codes() {
        let name = format!(
            "{:?}",
            cudarc::driver::sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        );
        assert!(driver(&name).is_sticky());
    }
}
