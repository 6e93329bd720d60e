//! # resident
//!
//! Persistent GPU actors for Rust: ring kernels that are launched once, stay resident, and are
//! fed through lock-free queues instead of being relaunched for every batch.
//!
//! ```
//! use resident::prelude::*;
//! use std::time::Duration;
//!
//! let rt = Runtime::builder().backend(Backend::Cpu).enable_telemetry(true).build()?;
//! let scale = rt.launch(
//!     RingKernel::<f32, f32>::new("scale")
//!         .queue_size(1024)
//!         .backpressure(Backpressure::Reject)
//!         .handler(|_ctx: &mut Context<()>, x: f32| Some(x * 2.0)),
//! )?;
//! scale.activate()?;
//! scale.send(1.5)?;
//! assert_eq!(scale.receive(Duration::from_secs(5))?, 3.0);
//! assert_eq!(scale.telemetry().messages_processed, 1);
//! # Ok::<(), resident::Error>(())
//! ```
#![deny(missing_docs)]

pub mod backend;
pub mod guide;

// The engine-neutral layers live in `resident-core`; they are re-exported here at the paths
// users know, with the runtime named on every engine of this build.
pub use resident_core::{engine, memory, telemetry};

/// Ring kernels and the runtime that hosts them (`resident-core`'s, on every engine of this
/// build: [`backend::AllEngines`]).
pub mod runtime {
    pub use resident_core::runtime::*;
    /// The kernel lifecycle and the runtime's typed errors (`resident-core`'s `state`, below
    /// its runtime; here beside the runtime, where users of `resident` name it).
    pub use resident_core::state;
    /// Hosts ring kernels on every engine of this build. Dropping it drains and terminates
    /// every kernel.
    pub type Runtime = resident_core::runtime::Runtime<crate::backend::AllEngines>;
    /// Configures and builds a [`Runtime`].
    pub type RuntimeBuilder = resident_core::runtime::RuntimeBuilder<crate::backend::AllEngines>;
}

/// The limits every compile of a kernel's source runs under, in a process of its own (g++ for
/// CudaSim, NVRTC for CUDA, naga for WGSL): the settings, their environment variables, and the
/// typed end of a WGSL compile they stopped (`resident-limits`).
pub mod limits {
    pub use resident_limits::{BadLimit, CompileLimits, CompileStopped, MEMORY_ENV, TIMEOUT_ENV};
}

/// Profiling: spans, traces, the report naming the bottleneck, and tuning.
pub mod profile {
    pub use resident_core::profile::*;
    pub mod tune;
}

/// The CUDA layer underneath the CUDA and CudaSim engines (`resident-cuda`), narrowed to what
/// a user of `resident` names: the errors the engines return (to match on), whether NVRTC and
/// the driver are here, the built-in CUDA C kernels, and NVRTC compilation. The driver layer
/// itself (devices, streams, modules, pinned memory, the persistent-kernel protocol) stays
/// inside the engines.
pub mod cuda {
    #[cfg(feature = "cuda")]
    pub use resident_cuda::{
        compile_ptx, device_info, driver_present, driver_version, nvrtc_present, nvrtc_version,
        unavailable_reason, CUresult, CompileOptions, DeviceInfo, DriverFault,
    };
    pub use resident_cuda::{CudaError, LaunchConfig};

    /// CUDA C kernels that ship with resident (for [`Kernel::cuda`](crate::Kernel::cuda)).
    pub mod builtin {
        pub use resident_cuda::builtin::{Source, ALL, ELEMENTWISE, SPIN};
    }

    /// The persistent ring kernel's errors (what [`DeviceError::Cuda`] holds).
    ///
    /// [`DeviceError::Cuda`]: crate::backend::DeviceError::Cuda
    pub mod persistent {
        pub use resident_engine_cuda::persistent::{
            ExternalFn, FaultCause, PersistentError, SassReport, Unavailable, EXTERNAL_FN_SIGNATURE,
        };

        /// CudaSim's persistent kernels.
        #[doc(hidden)]
        pub mod sim {
            // For tests that check a kernel was relaunched after a quiesce (or was not).
            pub use resident_engine_cuda::persistent::sim::relaunch_count;
        }
    }

    /// The driver calls that wait for the whole device, and so never return while a ring
    /// kernel is resident (what CudaSim's driver model and the GPU launcher both follow).
    pub mod hazards {
        pub use resident_cuda::hazards::DriverCall;
    }

    /// CudaSim: the same CUDA C on host threads, built by the host's C++ compiler, with a
    /// model of the driver's context (synchronizing calls, sticky faults).
    pub mod sim {
        pub use resident_engine_cuda::sim::driver::{
            strict, sync_wait, ContextFault, Hazard, SimContext, STRICT_ENV, SYNC_WAIT_ENV,
        };
        pub use resident_engine_cuda::sim::{compiler, CompilerFault, SimError};
        // For the tests that fault a device on purpose.
        #[doc(hidden)]
        pub use resident_engine_cuda::sim::driver::fault_test_in_own_process;
        // For resident-workloads' ThreadSanitizer test of its CUDA C handlers.
        #[doc(hidden)]
        pub use resident_engine_cuda::sim::{run_under_tsan, translation_unit, TsanError};
    }
}
pub use resident_ring as ring;
pub use runtime::state::{Error, Failure, KernelState, Op, Result};

/// Everything a user of ring kernels needs.
pub mod prelude {
    pub use crate::backend::cuda_ring::CudaHandler;
    pub use crate::backend::wgpu::ring::WgslHandler;
    pub use crate::backend::Backend;
    pub use crate::profile::Profiler;
    pub use crate::runtime::bind::{
        BindError, Bindings, BufMut, BufRef, BufferId, BufferReadGuard, BufferWriteGuard,
    };
    pub use crate::runtime::context::{Context, LoopContext, OutsideLoop};
    pub use crate::runtime::handle::{
        ForwardingStats, KernelHandle, PendingCall, Placement, SendOutcome, TerminateReport,
    };
    pub use crate::runtime::kernel::{ForwardPath, RingKernel};
    pub use crate::runtime::keyed::{KeyContext, Keyed, Keys};
    pub use crate::runtime::report::KernelReport;
    pub use crate::runtime::state::{Error, Failure, KernelState, Result};
    pub use crate::runtime::{Runtime, RuntimeBuilder};
    pub use crate::telemetry::{LatencySummary, RuntimeTelemetry, Telemetry};
    pub use resident_ring::{
        device_message, Backpressure, DeviceMessage, Envelope, Message, MessageId, WaitStrategy,
    };
}

pub use backend::wgpu::WgslError;
pub use backend::{BackendError, ComputeDevice, Kernel, KernelArg, LaunchConfig};
pub use memory::{BufferState, MemoryError, MemoryPool, PoolKind, UnifiedBuffer};
