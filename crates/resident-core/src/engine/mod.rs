//! The seam between the runtime and the engines: what a device is ([`ComputeDevice`], its
//! memory and streams in [`storage`], one-shot kernels in [`kernel`]), how a ring kernel is
//! launched on one (`runtime::device_handler`, above this module), the errors engines report ([`error`]) and which engines a
//! runtime has ([`Engines`]). The runtime, memory and profiling layers name only this; the
//! engines (the CPU's in [`cpu`], the device engines in the crate `resident`) implement it.

pub mod cpu;
pub mod error;
pub mod kernel;
pub mod storage;

use std::sync::Arc;
use std::time::Duration;

use resident_ring::message::quoted_name;

pub use error::EngineError;
pub use kernel::{Kernel, KernelArg};
pub use resident_ring::launch::{block_size_for, LaunchConfig};
pub use storage::{DeviceMemory, HostMemory, Stream};

/// The engines a runtime can run on: how it resolves a [`Backend`] request and opens a device.
/// A type, so a runtime's engines are fixed when it is named (`resident::Runtime` is
/// `Runtime<resident::backend::AllEngines>`), with no registry to fill at start-up.
pub trait Engines: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The backend `request` resolves to (never `Auto`) and its device when resolving opened
    /// one; an explicit request that cannot be met is the reason.
    fn resolve(request: Backend) -> Result<(Backend, Option<DeviceHandle>)>;
    /// Opens device 0 of `backend`.
    fn open(backend: Backend) -> Result<DeviceHandle>;
    /// The GPUs' telemetry for the profiler's report (NVML, with the CUDA engine), or why
    /// there is none.
    fn device_telemetry() -> (Vec<crate::profile::GpuTelemetry>, Option<String>) {
        (
            Vec::new(),
            Some("no GPU telemetry: this runtime has no GPU engine".into()),
        )
    }
}

/// How long a host read or write of a bound buffer, or a read of the state
/// (`KernelHandle::snapshot_state`), waits for the kernel to park between two batches.
pub const BUFFER_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// Which backend to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Threads and rayon on the host.
    Cpu,
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
    /// A GPU through wgpu (Vulkan, Metal, DX12), hardware adapters first; an explicit request
    /// also accepts a software adapter such as lavapipe.
    Wgpu,
    /// CUDA when a device works, else a hardware wgpu adapter, else the CPU (never a software
    /// wgpu adapter on its own).
    #[default]
    Auto,
    /// The CUDA C source run on host threads (the `cuda_sim` module); never picked by `Auto`.
    CudaSim,
}

/// The backend a device actually runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// See [`Backend::Cpu`].
    Cpu,
    /// See [`Backend::Cuda`].
    Cuda,
    /// See [`Backend::Wgpu`].
    Wgpu,
    /// See [`Backend::CudaSim`].
    CudaSim,
}

impl BackendKind {
    /// The cargo feature of `resident` that compiles this engine in (`None` for the CPU, which
    /// is always there).
    pub fn feature(self) -> Option<&'static str> {
        match self {
            BackendKind::Cpu => None,
            BackendKind::Cuda => Some("cuda"),
            BackendKind::Wgpu => Some("wgpu"),
            BackendKind::CudaSim => Some("cudasim"),
        }
    }

    /// Whether this build has the engine (its cargo feature was on).
    pub fn compiled_in(self) -> bool {
        match self {
            BackendKind::Cpu => true,
            BackendKind::Cuda => cfg!(feature = "cuda"),
            BackendKind::Wgpu => cfg!(feature = "wgpu"),
            BackendKind::CudaSim => cfg!(feature = "cudasim"),
        }
    }
}

/// The engines compiled into this build, CPU first (see [`BackendKind::feature`]).
pub fn compiled_in() -> Vec<BackendKind> {
    [
        BackendKind::Cpu,
        BackendKind::Cuda,
        BackendKind::Wgpu,
        BackendKind::CudaSim,
    ]
    .into_iter()
    .filter(|k| k.compiled_in())
    .collect()
}

/// [`BackendError::NotCompiled`] for `backend` (an engine this build does not have).
pub fn not_compiled(backend: BackendKind) -> BackendError {
    BackendError::NotCompiled {
        backend,
        feature: backend.feature().unwrap_or("default"),
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
            BackendKind::CudaSim => "cuda-sim",
        })
    }
}

/// Errors of the backend layer.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The engine was asked for but this build does not have it: `resident` was built without
    /// its cargo feature (`cuda`, `cudasim` or `wgpu`; all are on by default).
    #[error("the {backend} engine is not compiled into this build: enable the cargo feature `{feature}` of `resident` (on by default)")]
    NotCompiled {
        /// The engine asked for.
        backend: BackendKind,
        /// The cargo feature that compiles it in.
        feature: &'static str,
    },
    /// CUDA was requested but cannot be used here.
    /// The engine's error (a `resident::cuda::CudaError`) says why.
    #[error("CUDA backend unavailable: {0}")]
    CudaUnavailable(#[source] EngineError),
    /// A CUDA operation failed: a `resident::cuda::CudaError`, to downcast.
    #[error("CUDA: {0}")]
    Cuda(#[source] EngineError),
    /// CudaSim failed: no host compiler, a compile error (with the compiler's log), a device
    /// fault (`__trap()`) or an invalid launch: a `resident::cuda::sim::SimError`, to downcast.
    #[error("CudaSim: {0}")]
    Sim(#[source] EngineError),
    /// The kernel has no CPU closure but runs on the CPU backend.
    #[error("kernel `{qkernel}` has no CPU implementation", qkernel = quoted_name(.kernel))]
    NoCpuImplementation {
        /// Kernel name.
        kernel: String,
    },
    /// The kernel has no CUDA source but runs on the CUDA backend.
    #[error("kernel `{qkernel}` has no CUDA source", qkernel = quoted_name(.kernel))]
    NoCudaSource {
        /// Kernel name.
        kernel: String,
    },
    /// A kernel's source asks the compiler for a file of the host (`#include`, `#embed`,
    /// `__has_include`, ...) other than the built-in headers an engine allows: refused before
    /// any compiler runs, so no file is read and none is quoted back.
    #[error("kernel `{}`: its source asks for a file of the host (`#{directive} {file}`, line {line}); only built-in headers may be included", resident_ring::message::quoted_name(.kernel))]
    ForbiddenFile {
        /// Kernel name.
        kernel: String,
        /// The source's line (from 1).
        line: usize,
        /// The directive or operator.
        directive: String,
        /// The file asked for, as written (at most 64 bytes).
        file: String,
    },
    /// A kernel argument is missing or of the wrong kind or size.
    #[error("kernel argument {index}: {reason}")]
    BadArgument {
        /// Position of the argument.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// Host and device sides of a copy differ in size.
    #[error("{what}: host side has {host} bytes, device side {device}")]
    SizeMismatch {
        /// The operation.
        what: &'static str,
        /// Host bytes.
        host: usize,
        /// Device bytes.
        device: usize,
    },
    /// The resident ring kernels did not park for an operation under the residency rule. The
    /// engine's error is a `resident::cuda::PersistentError`.
    #[error("residency rule: {0}")]
    Residency(#[source] EngineError),
    /// Memory of one backend was handed to another.
    #[error("{what}: memory belongs to the {memory} backend, not {device}")]
    WrongBackend {
        /// The operation.
        what: &'static str,
        /// Backend of the memory.
        memory: BackendKind,
        /// Backend of the device.
        device: BackendKind,
    },
    /// A request too large for the address space.
    #[error("allocation of {0} bytes overflows")]
    TooLarge(usize),
    /// The allocator refused: more memory than this machine can give.
    #[error("out of memory: cannot allocate {0} bytes")]
    OutOfMemory(usize),
    /// wgpu was requested but no usable adapter exists.
    #[error("wgpu backend unavailable: {reason}")]
    WgpuUnavailable {
        /// Why.
        reason: String,
    },
    /// The kernel has no WGSL source but runs on the wgpu backend.
    #[error("kernel `{qkernel}` has no WGSL source", qkernel = quoted_name(.kernel))]
    NoWgslSource {
        /// Kernel name.
        kernel: String,
    },
    /// A WGSL source did not compile (naga's message and line inside).
    #[error("kernel `{qkernel}`: {source}", qkernel = quoted_name(.kernel))]
    WgslCompile {
        /// Kernel name.
        kernel: String,
        /// The compiler's error.
        #[source]
        source: error::WgslError,
    },
    /// A WGSL source's compile was stopped by the compile's limits, or crashed in its own
    /// process ([`resident_limits`]).
    #[error("kernel `{qkernel}`: {source}", qkernel = quoted_name(.kernel))]
    WgslStopped {
        /// Kernel name.
        kernel: String,
        /// How the compile ended.
        #[source]
        source: resident_limits::CompileStopped,
    },
    /// A request past what the wgpu adapter supports.
    #[error("wgpu adapter limit `{limit}` exceeded: {requested} requested, at most {max}")]
    WgpuLimit {
        /// The wgpu limit's name.
        limit: &'static str,
        /// What was asked for.
        requested: u64,
        /// The adapter's limit.
        max: u64,
    },
    /// A wgpu operation failed validation or the device reported an error.
    #[error("wgpu {operation}: {reason}")]
    WgpuDevice {
        /// The operation.
        operation: &'static str,
        /// wgpu's message.
        reason: String,
    },
    /// wgpu ran out of memory.
    #[error("wgpu {operation}: out of memory: {reason}")]
    WgpuOutOfMemory {
        /// The operation.
        operation: &'static str,
        /// wgpu's message.
        reason: String,
    },
    /// The device did not finish in time.
    #[error("wgpu {operation}: device did not finish within {waited:?}")]
    WgpuTimeout {
        /// The operation.
        operation: &'static str,
        /// How long we waited.
        waited: std::time::Duration,
    },
    /// The wgpu device was lost (driver reset, removal, destroy).
    #[error("wgpu {reason}")]
    DeviceLost {
        /// wgpu's reason and message.
        reason: String,
    },
}

impl BackendError {
    /// The engine's own error of type `E` under `Cuda`, `CudaUnavailable`, `Sim` or
    /// `Residency`, e.g. `resident::cuda::CudaError` or `resident::cuda::sim::SimError`.
    pub fn engine<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            BackendError::CudaUnavailable(e)
            | BackendError::Cuda(e)
            | BackendError::Sim(e)
            | BackendError::Residency(e) => e.downcast_ref(),
            _ => None,
        }
    }
}

/// Result of this layer.
pub type Result<T, E = BackendError> = std::result::Result<T, E>;

/// What a device is, in backend-neutral terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Backend.
    pub backend: BackendKind,
    /// Ordinal within the backend.
    pub ordinal: usize,
    /// Name.
    pub name: String,
    /// Parallel units: SMs on CUDA, worker threads on the CPU.
    pub compute_units: u32,
    /// Device memory in bytes (0 when unknown, e.g. host RAM on the CPU backend).
    pub total_memory: u64,
    /// Largest block (threads).
    pub max_threads_per_block: u32,
    /// Compute capability, CUDA only.
    pub compute_capability: Option<(u32, u32)>,
    /// Shared memory per block, bytes (CUDA only, else 0).
    pub shared_memory_per_block: u64,
    /// Shared memory per SM, bytes (CUDA only, else 0).
    pub shared_memory_per_sm: u64,
    /// Whether the device can read mapped pinned host memory (CPU: trivially yes).
    pub can_map_host_memory: bool,
    /// Driver's CUDA version, CUDA only.
    pub driver_version: Option<(u32, u32)>,
}

/// One backend implementation: device memory, copies, streams, kernel launch, device info.
pub trait ComputeDevice: Send + Sync + std::fmt::Debug {
    /// Which backend.
    fn kind(&self) -> BackendKind;
    /// Properties.
    fn info(&self) -> DeviceInfo;
    /// Whether device memory is host memory (then no copy is ever needed).
    fn shares_host_memory(&self) -> bool;
    /// Zeroed device memory.
    fn alloc(&self, bytes: usize) -> Result<DeviceMemory>;
    /// Zeroed host memory; `pinned` asks for page-locked, device-mapped memory where the
    /// backend has it.
    fn alloc_host(&self, bytes: usize, pinned: bool) -> Result<HostMemory>;
    /// Copies `src` into device memory of the same size and waits.
    fn copy_to_device(&self, dst: &mut DeviceMemory, src: &[u8]) -> Result<()>;
    /// Copies device memory into `dst` of the same size and waits.
    fn copy_to_host(&self, dst: &mut [u8], src: &DeviceMemory) -> Result<()>;
    /// Queues a host-to-device copy on `stream`.
    ///
    /// # Safety
    /// `src` must stay valid and unmodified until `stream` is synchronized.
    unsafe fn copy_to_device_async(
        &self,
        dst: &mut DeviceMemory,
        src: &[u8],
        stream: &Stream,
    ) -> Result<()>;
    /// Queues a device-to-host copy on `stream`.
    ///
    /// # Safety
    /// `dst` must not be read or written until `stream` is synchronized.
    unsafe fn copy_to_host_async(
        &self,
        dst: &mut [u8],
        src: &DeviceMemory,
        stream: &Stream,
    ) -> Result<()>;
    /// A new stream (work queued on one stream runs in order).
    fn create_stream(&self) -> Result<Stream>;
    /// Waits for everything queued on `stream`.
    fn synchronize(&self, stream: &Stream) -> Result<()>;
    /// Runs `kernel` over `cfg` with `args`, after the work already queued on `stream` when
    /// one is given, and waits for it (the arguments' borrows end when this returns).
    fn launch(
        &self,
        kernel: &Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg<'_>],
        stream: Option<&Stream>,
    ) -> Result<()>;
}

/// A shared handle to a device of some backend.
pub type DeviceHandle = Arc<dyn ComputeDevice>;
