//! # resident
//!
//! Persistent GPU actors for Rust: ring kernels that are launched once, stay resident, and are
//! fed through lock-free queues instead of being relaunched for every batch.
#![deny(missing_docs)]

pub use resident_ring as ring;

pub mod backend;
pub mod memory;

pub use backend::{Backend, BackendError, ComputeDevice, Kernel, KernelArg, LaunchConfig};
pub use memory::{BufferState, MemoryError, MemoryPool, PoolKind, UnifiedBuffer};
