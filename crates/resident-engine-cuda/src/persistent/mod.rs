//! Persistent ring kernels: a CUDA kernel launched once that stays resident and drains priority
//! lanes of [`resident_ring::spsc`] rings living in pinned, device-mapped host memory.
//!
//! The parts, bottom up:
//! * [`control`]: the 256-byte [`ControlBlock`] the host steers the kernel through;
//! * [`host`]: [`PersistentQueues`], the host's half of the protocol (lane writers, output
//!   consumer, control block) over any [`RingMemory`];
//! * [`bulk`]: an input lane's second path for deep queues: staging ring, copy engine, device
//!   ring, and the one-path-at-a-time rule that keeps FIFO across the switch;
//! * `park`: the host's side of parking a resident kernel (the residency rule's quiesce), one
//!   rule for both launchers;
//! * [`lane`]: an input lane's LL format (a flag in every 8 bytes, so the kernel finds and
//!   reads a message in one bus read) and its host writer;
//! * [`sim`]: [`SimKernel`], the same template and handler compiled by the host C++ compiler
//!   (CudaSim, see [`crate::sim`]) and run as one block of OS threads over the same memory, so
//!   the kernel source and the whole protocol run without a GPU;
//! * [`template`]: the CUDA C translation unit (persistent, launch-per-batch) generated around a
//!   user handler, and [`compile`](template::compile_ptx) through NVRTC;
//! * [`kernel`]: [`PersistentKernel`] (the real GPU launch path) and the template's
//!   launch-per-batch kernel ([`load_batch_kernel`]).
//!
//! # Priority lanes
//! Input is `N` lanes (`1 ..= 8`), one ring each. Priority `p` goes to lane `(p * N) >> 8`
//! ([`lane_for_priority`]); the consumer always drains the highest non-empty lane first and is
//! FIFO within a lane.
//!
//! # Batch output order
//! A batch is gathered highest lane first, FIFO within each lane. Outputs are compacted (inputs
//! whose handler returned `false` leave no gap) and published in that same gathered order.

use std::sync::Arc;

use resident_ring::message::quoted_name;
use resident_ring::spsc::{RingError, RingMemory};

pub mod bulk;
mod check;
pub mod control;
pub mod host;
#[cfg(feature = "cuda")]
pub mod kernel;
pub mod lane;
mod park;
pub mod peer;
pub mod sim;
pub mod template;
pub mod untrusted;

pub use bulk::{
    choose, BulkConfig, BulkLanes, BulkMemory, BulkMode, BulkStats, CopyEngine, CopyRange, Path,
    SimCopyEngine,
};
pub use check::batch_scan_bytes;
#[doc(hidden)] // test support for the crates of this workspace
pub use check::{on_resident_wait, ResidentWaitHook};
pub use control::{ControlBlock, DeviceCounters, DeviceState, RunState};
pub use host::{Full, PersistentQueues, QueueConfig};
#[cfg(feature = "cuda")]
pub use kernel::{
    load_batch_kernel, open_device, GpuBuffers, GpuState, LaunchOptions, PersistentKernel,
};
pub use peer::{LinkRefused, PeerInput, PeerPhase, PeerRing, UnlinkTimeout};
pub use sim::{SimBuffers, SimKernel, SimLaunchOptions, SimState, MIN_RUN_BETWEEN_ACCESSES};
pub use template::{
    buffer_table_bytes, compile_sim, compile_sim_with, external_pointer_name, is_c_identifier,
    parse_ptxas_report, BufferDecl, BufferInit, CompiledKernel, ExternalFn, KernelSource,
    MessageDecl, SassReport, BUFFER_ENTRY_BYTES, EXTERNAL_FN_SIGNATURE, SIM_ARCH,
};
#[cfg(feature = "cuda")]
pub use template::{compile_ptx, compile_sass_report, link_cubin};

/// Most priority lanes a kernel can have.
pub const MAX_LANES: usize = 8;

/// The lane a priority goes to with `lanes` lanes: `(priority * lanes) >> 8`.
///
/// ```
/// use resident_engine_cuda::persistent::lane_for_priority;
/// assert_eq!(lane_for_priority(0, 4), 0);
/// assert_eq!(lane_for_priority(128, 4), 2);
/// assert_eq!(lane_for_priority(255, 4), 3);
/// assert_eq!(lane_for_priority(255, 1), 0);
/// ```
pub fn lane_for_priority(priority: u8, lanes: usize) -> usize {
    // The one mapping, shared with the host mailbox: a device lane and a host lane never
    // disagree about a priority.
    resident_ring::lane_of(priority, lanes)
}

/// Errors of the persistent-kernel layer.
#[derive(Debug, thiserror::Error)]
pub enum PersistentError {
    /// A configuration value is out of range, or the source and the launch disagree; `reason`
    /// names the value and what it must be.
    #[error("invalid persistent kernel configuration: {reason}")]
    Config {
        /// Which value, and what it must be.
        reason: String,
    },
    /// A bound buffer index past the kernel's buffers, or a host-side size that differs from
    /// the device buffer's.
    #[error("kernel `{}`: {}", quoted_name(.name), match device_bytes {
        Some(n) => format!("bound buffer {index} holds {n} bytes, the host side {host_bytes}"),
        None => format!("no bound buffer {index}"),
    })]
    BoundBuffer {
        /// Kernel name.
        name: String,
        /// The buffer asked for.
        index: usize,
        /// Its size on the device; `None` when the kernel has no such buffer.
        device_bytes: Option<usize>,
        /// The size the host side gave.
        host_bytes: usize,
    },
    /// A host thread of the kernel (heartbeat, CudaSim block) could not be started.
    #[error("cannot spawn {what}: {source}")]
    Spawn {
        /// The thread.
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Building a ring failed.
    #[error("ring: {0}")]
    Ring(#[from] RingError),
    /// Memory handed in is too small or misaligned.
    #[error("memory for {what}: need {need} bytes aligned to 128, got {got} bytes")]
    Memory {
        /// What the memory was for.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        got: usize,
    },
    /// NVRTC (or its builtins library) could not be loaded: the CUDA layer's
    /// [`CudaError::NvrtcNotFound`](resident_cuda::CudaError::NvrtcNotFound), or an NVRTC call failing
    /// with `NVRTC_ERROR_BUILTIN_OPERATION_FAILURE`.
    #[error("NVRTC not available: {0}")]
    NvrtcUnavailable(#[source] resident_cuda::CudaError),
    /// The CUDA driver could not be loaded, has no such device, or the device cannot run
    /// persistent kernels.
    #[error("CUDA driver not available: {0}")]
    DriverUnavailable(#[source] Unavailable),
    /// A kernel's source text asks the compiler for a file of the host (`#include`, `#embed`,
    /// `__has_include`, ...) other than NVRTC's built-in headers
    /// ([`untrusted::ALLOWED_INCLUDES`]): refused before any compiler runs, so no file is read
    /// and none is quoted back.
    #[error("kernel `{qname}`: {what} asks for a file of the host (`#{directive} {file}`, line {line}); a kernel's source may include only {allowed}", qname = quoted_name(.name), allowed = untrusted::ALLOWED_INCLUDES.map(|h| format!("<{h}>")).join(", "))]
    Include {
        /// Kernel name.
        name: String,
        /// Which text (the handler, a type's declaration).
        what: &'static str,
        /// Its line (from 1).
        line: usize,
        /// The directive or operator.
        directive: String,
        /// The file asked for, as written (at most 64 bytes).
        file: String,
    },
    /// Kernel source failed to compile (the NVRTC log is included).
    #[error("kernel `{name}` failed to compile for {arch}:\n{log}")]
    Compile {
        /// Kernel name.
        name: String,
        /// Target architecture.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// nvJitLink could not be loaded: the CUDA layer's
    /// [`CudaError::JitLinkNotFound`](resident_cuda::CudaError::JitLinkNotFound). Only a kernel with an
    /// external function ([`KernelSource::external`]) needs it on a GPU.
    #[error("nvJitLink not available: {0}")]
    JitLinkUnavailable(#[source] resident_cuda::CudaError),
    /// nvJitLink refused to link the kernel's template with its external function
    /// ([`KernelSource::external`]): an input that is not LTO-IR (or not for `arch`), a symbol
    /// neither defines, a symbol that is not a function. `log` is nvJitLink's, bounded
    /// ([`resident_cuda::bounded_log`]). A function of the right name with another signature links
    /// (C names carry no types): the LTO-IR must have [`EXTERNAL_FN_SIGNATURE`].
    #[error("kernel `{qname}` failed to link for {arch}: {call} returned {} ({code}){}{log}", resident_cuda::jitlink_result_name(*code), if log.is_empty() { "" } else { "; nvJitLink's log:\n" }, qname = quoted_name(.name))]
    Link {
        /// Kernel name.
        name: String,
        /// The real architecture linked for, e.g. `sm_90` (at most 64 bytes).
        arch: String,
        /// The nvJitLink call that failed.
        call: &'static str,
        /// Its `nvJitLinkResult`.
        code: i32,
        /// nvJitLink's log (bounded).
        log: String,
    },
    /// A call of the CUDA layer failed (driver error, device lost, residency limit, ...).
    #[error(transparent)]
    Cuda(resident_cuda::CudaError),
    /// The device faulted (trap, illegal address, ...) while the kernel ran.
    #[error("kernel `{qname}` failed on the device: {cause}", qname = quoted_name(.name))]
    DeviceFault {
        /// Kernel name.
        name: String,
        /// The engine's error: the CUDA layer's (a sticky driver error, the device lost, a
        /// failed relaunch) or CudaSim's (a trapped thread of the block).
        #[source]
        cause: FaultCause,
    },
    /// The kernel exited on its own (heartbeat timeout or a detected error).
    #[error("kernel `{qname}` exited: {state:?} (error code {error_code})", qname = quoted_name(.name))]
    Exited {
        /// Kernel name.
        name: String,
        /// Its final state.
        state: Option<DeviceState>,
        /// Its error code.
        error_code: u32,
    },
    /// An operation is not allowed in the current state.
    #[error("kernel `{qname}`: cannot {op} while {state}", qname = quoted_name(.name))]
    InvalidState {
        /// Kernel name.
        name: String,
        /// The operation.
        op: &'static str,
        /// The state it was in.
        state: &'static str,
    },
    /// The CudaSim layer failed (loading, launching, or a fault of the kernel's block).
    #[error("CudaSim: {0}")]
    Sim(#[from] crate::sim::SimError),
    /// A bulk lane's copy engine refused a submit (its stream failed, or CudaSim's copy thread
    /// is gone); the kernel's messages not yet accepted stay with the caller.
    #[error("kernel `{qname}`: the bulk lanes' copy engine failed: {reason}", qname = quoted_name(.name))]
    CopyEngine {
        /// Kernel name.
        name: String,
        /// The copy engine's error, as text (it was reported once; later submits are refused).
        reason: String,
    },
    /// Waiting for the device timed out.
    #[error("kernel `{qname}`: timed out waiting for {what}", qname = quoted_name(.name))]
    Timeout {
        /// Kernel name.
        name: String,
        /// What was awaited.
        what: &'static str,
    },
}

impl PersistentError {
    pub(crate) fn config(reason: impl Into<String>) -> Self {
        PersistentError::Config {
            reason: reason.into(),
        }
    }
}

/// Why the CUDA driver cannot run persistent kernels here.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    /// No driver, no device, or no device of that ordinal.
    #[error(transparent)]
    Cuda(resident_cuda::CudaError),
    /// The device cannot map host memory, which the persistent queues live in.
    #[error("device {ordinal} cannot map host memory")]
    NoHostMapping {
        /// The device.
        ordinal: usize,
    },
}

/// The engine's error behind [`PersistentError::DeviceFault`]. Shared (`Arc`): a faulted
/// kernel answers the same fault to every later call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FaultCause {
    /// The CUDA layer reported a fault (a sticky driver error, or the device already lost).
    #[error(transparent)]
    Cuda(Arc<resident_cuda::CudaError>),
    /// Relaunching the kernel after it parked for the residency rule failed.
    #[error("relaunch after a quiesce failed: {0}")]
    Relaunch(#[source] Arc<resident_cuda::CudaError>),
    /// A thread of the CudaSim block faulted (`__trap()`), or the block could not run.
    #[error(transparent)]
    Sim(Arc<crate::sim::SimError>),
    /// The CudaSim launcher thread ended without reporting how the block exited.
    #[error("the CudaSim launcher thread ended without a report")]
    SimLauncherLost,
}

/// Memory shared between the host's ring halves and the device side (the CudaSim block or
/// the GPU launch): an `Arc` so either may outlive the other.
#[derive(Clone)]
pub struct SharedMemory(pub Arc<dyn RingMemory>);

// SAFETY: delegates to the inner memory, whose pointer and length are fixed for its life.
unsafe impl RingMemory for SharedMemory {
    fn as_mut_ptr(&self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::PersistentError;

    /// Kernel names come from users: the runtime errors quote at most 64 bytes of one, as the
    /// compile errors do.
    #[test]
    fn runtime_errors_quote_long_names_short() {
        let name = "n".repeat(1 << 20);
        for e in [
            PersistentError::Timeout {
                name: name.clone(),
                what: "the kernel to exit",
            },
            PersistentError::BoundBuffer {
                name,
                index: 3,
                device_bytes: None,
                host_bytes: 8,
            },
        ] {
            let text = e.to_string();
            assert!(text.len() < 200, "{} bytes", text.len());
            assert!(text.contains("(1048576 bytes)"), "{text}");
        }
    }
}
