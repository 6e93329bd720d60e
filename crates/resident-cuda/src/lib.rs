//! # resident-cuda
//!
//! resident's CUDA driver layer, shaped like cudarc: raw calls loaded at run time at the
//! bottom, owners with `Drop` above them. Nothing here panics when the driver or NVRTC is
//! missing: every entry point first checks that the library is present and returns a typed
//! error. The CUDA engine above it (`resident-engine-cuda`) owns the persistent ring-kernel
//! protocol and template and CudaSim.
//!
//! * [`result`]: each driver call as a function returning `Result<_, CudaError>`.
//! * [`device`]: discovery ([`devices`], [`DeviceInfo`]) and the [`Device`] owner of a context.
//! * [`memory`], [`pinned`]: device memory and pinned, device-mapped host memory
//!   ([`PinnedMemory`] is also a `resident_ring` ring memory).
//! * [`stream`]: [`Stream`] and [`Event`]; [`overlap`]: copy/compute double buffering.
//! * [`nvrtc`], [`cache`], [`module`]: CUDA C -> PTX, the disk cache, loaded kernels.
//! * [`nvjitlink`]: LTO-IR (the template's and a function compiled elsewhere) -> CUBIN.
//! * [`LaunchConfig`]: launch geometry, from `resident_ring::launch` (every engine shares it).
//! * [`telemetry`]: NVML readings (the transfer benchmark lives in `resident-bench`).
//! * [`hazards`]: which driver calls wait for the whole device (the residency rule's table,
//!   read by both launchers); [`park_order`]: the order a quiesce parks kernels in;
//!   [`arena`]: the pinned arena's bookkeeping.
#![deny(missing_docs)]

// The driver itself (cudarc, NVML) is the `driver` feature (on by default). Without it the
// crate is the part CudaSim and the CPU need: errors, the disk cache, the hazard table.
pub mod arena;
pub mod builtin;
pub mod cache;
#[cfg(feature = "driver")]
pub mod device;
pub mod error;
pub mod hazards;
#[cfg(feature = "driver")]
mod loaded;
#[cfg(feature = "driver")]
pub mod memory;
#[cfg(feature = "driver")]
pub mod module;
#[cfg(feature = "driver")]
pub mod nvjitlink;
#[cfg(feature = "driver")]
pub mod nvrtc;
#[cfg(feature = "driver")]
pub mod overlap;
pub mod park_order;
#[cfg(feature = "driver")]
pub mod pinned;
#[cfg(feature = "driver")]
pub mod result;
#[cfg(feature = "driver")]
pub mod stream;
#[cfg(feature = "driver")]
pub mod telemetry;

pub use cache::{CacheKey, CacheOutcome, KernelCache};
/// The driver's and NVRTC's result codes, as [`DriverFault::code`] and [`CudaError::Nvrtc`] hold them.
#[cfg(feature = "driver")]
pub use cudarc::{driver::sys::CUresult, nvrtc::sys::nvrtcResult};
#[cfg(feature = "driver")]
pub use device::{
    device_count, device_info, devices, Device, DeviceInfo, ResidencyBudget, ResidentSlot,
    CONCURRENT_KERNEL_LIMIT,
};
#[cfg(feature = "driver")]
pub use error::DriverFault;
pub use error::{bounded_log, jitlink_result_name, CudaError, Result, MAX_LOG_BYTES, MAX_LOG_LINE};
#[cfg(feature = "driver")]
pub use memory::DeviceBuffer;
#[cfg(feature = "driver")]
pub use module::{Function, KernelParams, Module};
#[cfg(feature = "driver")]
pub use nvjitlink::{link_cubin, nvjitlink_available, nvjitlink_present, nvjitlink_version};
#[cfg(feature = "driver")]
pub use nvrtc::{compile_ltoir, compile_ptx, nvrtc_present, nvrtc_version, CompileOptions};
#[cfg(feature = "driver")]
pub use overlap::{DoubleBuffer, PipelineTiming};
#[cfg(feature = "driver")]
pub use pinned::{PinnedBuffer, PinnedMemory, PINNED_FLAGS};
pub use resident_ring::launch::LaunchConfig;
#[cfg(feature = "driver")]
pub use result::{driver_present, driver_version};
#[cfg(feature = "driver")]
pub use stream::{Event, Graph, Stream};
#[cfg(feature = "driver")]
pub use telemetry::{DeviceTelemetry, Telemetry};

/// Why CUDA cannot be used here, or `None` when a device opens. Never panics.
#[cfg(feature = "driver")]
pub fn unavailable_reason() -> Option<CudaError> {
    devices().err()
}
