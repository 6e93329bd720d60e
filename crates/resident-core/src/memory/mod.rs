//! Memory above the backends: [`UnifiedBuffer`] keeps a host and a device copy and moves data
//! only when the other side is newer; [`MemoryPool`] recycles device and pinned host buffers by
//! size class.

mod pool;
mod unified;

pub use pool::{size_class, MemoryPool, PoolKind, PoolStats, PooledBuffer, MIN_CLASS};
pub use unified::{
    BufferOptions, BufferState, DeviceView, DeviceViewMut, TransferStats, UnifiedBuffer,
};

use crate::engine::BackendError;

/// Errors of the memory layer.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// Read access to a buffer no side has written yet.
    #[error("buffer of {len} elements is uninitialized: write it (host_mut/device_mut) or create it from data first")]
    Uninitialized {
        /// Elements.
        len: usize,
    },
    /// A sync needs the named side to hold valid data, and it does not.
    #[error("cannot sync {direction}: buffer is {state:?}")]
    NothingToSync {
        /// `to device` or `to host`.
        direction: &'static str,
        /// The buffer's state.
        state: BufferState,
    },
    /// A copy between the two sides failed.
    #[error("sync {direction} failed in state {state:?}: {source}")]
    SyncFailed {
        /// `to device` or `to host`.
        direction: &'static str,
        /// The state the buffer kept.
        state: BufferState,
        /// The backend error.
        source: BackendError,
    },
    /// An allocation failed.
    #[error("allocating {bytes} bytes failed: {source}")]
    AllocFailed {
        /// Bytes asked for.
        bytes: usize,
        /// The backend error.
        source: BackendError,
    },
    /// A buffer size overflows.
    #[error("{len} elements of {elem} bytes overflow usize")]
    TooLarge {
        /// Elements.
        len: usize,
        /// Element size.
        elem: usize,
    },
    /// The pool's byte limit would be exceeded.
    #[error("memory pool limit of {limit} bytes exceeded: {in_use} bytes in use, {requested} more requested (size class)")]
    PoolLimitExceeded {
        /// The limit.
        limit: usize,
        /// Bytes handed out now.
        in_use: usize,
        /// Size class of the request.
        requested: usize,
    },
}
