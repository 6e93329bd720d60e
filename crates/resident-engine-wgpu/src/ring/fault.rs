//! Why a WGSL ring kernel failed after launch: [`WgpuFault`], shared by the engine and the
//! kernel-to-kernel link.

use std::sync::Arc;
use std::time::Duration;

use resident_core::engine::BackendError;

/// Why a WGSL ring kernel failed after launch (the source of [`DeviceError::Fault`](resident_core::engine::error::DeviceError::Fault)). `Clone` (sources are
/// shared): the engine keeps its first failure and answers it to every later check.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WgpuFault {
    /// The device stopped an in-order batch (or a key's messages of a keyed batch) before its
    /// end (see the [module docs](super)).
    #[error("the device stopped an in-order batch (or a key's messages in a keyed batch) of {messages} messages before its end (llvmpipe ends an invocation's loops after 65535 iterations in all): use smaller batches or less work per message")]
    CutShort {
        /// Messages in the batch.
        messages: usize,
    },
    /// A submitted batch was not read back within the engine's bound.
    #[error("a batch did not complete within {0:?}")]
    BatchTimeout(Duration),
    /// Stopping: the batches in flight did not complete within the terminate timeout.
    #[error("batches in flight did not complete within {0:?}")]
    StopTimeout(Duration),
    /// Mapping a batch's staging buffer for reading failed.
    #[error("reading a batch back failed: {0}")]
    ReadBack(#[source] ::wgpu::BufferAsyncError),
    /// The mapped staging buffer could not be viewed.
    #[error("mapping a batch failed: {0}")]
    MapRange(#[source] ::wgpu::MapRangeError),
    /// Polling the device failed.
    #[error("device poll failed: {0}")]
    Poll(#[source] Arc<::wgpu::PollError>),
    /// The device layer failed (device lost, a validation error, a refused submission).
    #[error(transparent)]
    Device(Arc<BackendError>),
}
