//! # resident-cuda
//!
//! resident's CUDA layer, shaped like cudarc: raw calls loaded at run time at the bottom,
//! owners with `Drop` above them. Nothing here panics when the driver or NVRTC is missing:
//! every entry point first checks that the library is present and returns a typed error.
//!
//! * [`result`]: each driver call as a function returning `Result<_, CudaError>`.
//! * [`device`]: discovery ([`devices`], [`DeviceInfo`]) and the [`Device`] owner of a context.
//! * [`memory`], [`pinned`]: device memory and pinned, device-mapped host memory
//!   ([`PinnedMemory`] is also a `resident_ring` ring memory).
//! * [`stream`]: [`Stream`] and [`Event`]; [`overlap`]: copy/compute double buffering.
//! * [`nvrtc`], [`cache`], [`module`]: CUDA C -> PTX, the disk cache, loaded kernels.
//! * [`launch`]: launch geometry shared with the CPU backend.
//! * [`telemetry`]: NVML readings; [`bench`](mod@bench): the transfer benchmark.
#![deny(missing_docs)]

pub mod bench;
pub mod builtin;
pub mod cache;
pub mod device;
pub mod error;
pub mod launch;
pub mod memory;
pub mod module;
pub mod nvrtc;
pub mod overlap;
pub mod persistent;
pub mod pinned;
pub mod result;
pub mod sim;
pub mod stream;
pub mod telemetry;

pub use cache::{CacheKey, CacheOutcome, KernelCache};
pub use device::{
    device_count, device_info, devices, Device, DeviceInfo, ResidencyBudget, ResidentSlot,
    CONCURRENT_KERNEL_LIMIT,
};
pub use error::{CudaError, DriverFault, Result};
/// The driver's and NVRTC's result codes, as [`DriverFault::code`] and [`CudaError::Nvrtc`] hold them.
pub use cudarc::{driver::sys::CUresult, nvrtc::sys::nvrtcResult};
pub use launch::LaunchConfig;
pub use memory::DeviceBuffer;
pub use module::{Function, KernelParams, Module};
pub use nvrtc::{compile_ptx, nvrtc_present, nvrtc_version, CompileOptions};
pub use overlap::{DoubleBuffer, PipelineTiming};
pub use pinned::{PinnedBuffer, PinnedMemory, PINNED_FLAGS};
pub use result::{driver_present, driver_version};
pub use stream::{Event, Graph, Stream};
pub use telemetry::{DeviceTelemetry, Telemetry};

/// Why CUDA cannot be used here, or `None` when a device opens. Never panics.
pub fn unavailable_reason() -> Option<CudaError> {
    devices().err()
}
