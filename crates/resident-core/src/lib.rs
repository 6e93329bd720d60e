//! # resident-core
//!
//! The engine-neutral core of [resident](https://docs.rs/resident): the definition of a ring
//! kernel ([`runtime::kernel::RingKernel`]), its handle, the runtime that hosts kernels, the
//! host thread and the device pump, buffers bound to kernels, memory, telemetry and the
//! profiling hooks, and the seam engines plug into ([`engine`]).
//!
//! It names no engine and depends on none: the CPU engine is here (always there), the device
//! engines (CUDA, CudaSim, wgpu) implement [`engine`]'s traits in the crate `resident`, which
//! is what applications depend on. A runtime is generic over the engines it can run on
//! ([`engine::Engines`]); `resident::Runtime` is this crate's runtime with every engine the
//! build has.
#![deny(missing_docs)]

pub mod engine;
pub mod memory;
pub mod profile;
pub mod runtime;
pub mod state;
pub mod telemetry;

pub use resident_ring as ring;
pub use state::{Error, Failure, KernelState, Op, Result};
