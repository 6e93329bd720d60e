//! Backends: where memory lives and kernels run. Everything above this folder talks to a
//! [`ComputeDevice`] and never names CUDA types.
//!
//! * `cpu`: threads and rayon; always available. Its "device memory" is host memory.
//! * `cuda` (cargo feature `cuda`): `resident-cuda`, loaded at run time; available when a
//!   driver and device work.
//! * `wgpu` (cargo feature `wgpu`): Vulkan / Metal / DX12 through wgpu (lavapipe in CI); WGSL
//!   kernels. The WGSL handler type is in every build.
//! * `cuda_sim` (cargo feature `cudasim`): CudaSim, the CUDA C source (ring-kernel template +
//!   handlers, one-shot kernels) compiled by the host C++ compiler and run on host threads;
//!   available where a host C++ compiler (`g++`, or `RESIDENT_SIM_CXX`) runs. For running and
//!   debugging CUDA handlers without a GPU, not for speed.
//!
//! [`open`] picks one from a [`Backend`] request; [`probe`] reports what this machine has and
//! why a backend is missing; [`compiled_in`] lists the engines of this build (the three
//! features are on by default; an engine not compiled in is [`BackendError::NotCompiled`]).

// The engines are reached through `open`, `Backend` and the handler types, not by module:
// their modules are the crate's own.
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
// The handler is plain data (CUDA C source and declarations), kept in every build so a kernel
// definition compiles whichever engines are in; its engine parts follow the features.
mod cuda_launch;
#[cfg_attr(
    not(any(feature = "cuda", feature = "cudasim")),
    allow(dead_code, unused_imports)
)]
pub(crate) mod cuda_ring;
#[cfg(feature = "cudasim")]
pub(crate) mod cuda_sim;
mod kernel;
mod storage;
// Like `cuda_ring`: `WgslHandler` and the WGSL error types are in every build, the wgpu engine
// (adapters, pipelines, naga) only with the `wgpu` feature.
#[cfg_attr(not(feature = "wgpu"), allow(dead_code, unused_imports))]
pub mod wgpu;

pub use crate::runtime::host::device::DeviceError;
pub use cuda_ring::{CudaHandler, BUFFER_SYNC_TIMEOUT};

pub use kernel::{launch_cpu, CpuKernelFn, CpuThread, Kernel, KernelArg, Output};
pub use resident_cuda::launch::{block_size_for, LaunchConfig};
#[cfg(feature = "cuda")]
pub use resident_cuda::telemetry::DeviceTelemetry;
pub use storage::{DeviceMemory, HostMemory, Stream};

use std::sync::Arc;

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

/// [`BackendError::NotCompiled`] for `backend`.
pub(crate) fn not_compiled(backend: BackendKind) -> BackendError {
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
    #[error("CUDA backend unavailable: {0}")]
    CudaUnavailable(#[source] resident_cuda::CudaError),
    /// A CUDA operation failed.
    #[error("CUDA: {0}")]
    Cuda(#[from] resident_cuda::CudaError),
    /// CudaSim failed: no host compiler, a compile error (with the compiler's log), a device
    /// fault (`__trap()`) or an invalid launch.
    #[error("CudaSim: {0}")]
    Sim(#[from] resident_cuda::sim::SimError),
    /// The kernel has no CPU closure but runs on the CPU backend.
    #[error("kernel `{kernel}` has no CPU implementation")]
    NoCpuImplementation {
        /// Kernel name.
        kernel: String,
    },
    /// The kernel has no CUDA source but runs on the CUDA backend.
    #[error("kernel `{kernel}` has no CUDA source")]
    NoCudaSource {
        /// Kernel name.
        kernel: String,
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
    /// The resident ring kernels did not park for an operation under the residency rule.
    #[error("residency rule: {0}")]
    Residency(#[source] resident_cuda::persistent::PersistentError),
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
    #[error("kernel `{kernel}` has no WGSL source")]
    NoWgslSource {
        /// Kernel name.
        kernel: String,
    },
    /// A WGSL source did not compile (naga's message and line inside).
    #[error("kernel `{kernel}`: {source}")]
    WgslCompile {
        /// Kernel name.
        kernel: String,
        /// The compiler's error.
        #[source]
        source: wgpu::WgslError,
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

/// Opens device 0 of the requested backend. `Auto` tries CUDA, then a hardware wgpu adapter,
/// then the CPU; `Cuda` returns [`BackendError::CudaUnavailable`] and `Wgpu`
/// [`BackendError::WgpuUnavailable`] saying why they cannot be used.
/// An engine not compiled in is [`BackendError::NotCompiled`]; `Auto` tries only the engines
/// compiled in.
pub fn open(backend: Backend) -> Result<DeviceHandle> {
    match backend {
        Backend::Cpu => Ok(Arc::new(cpu::CpuDevice::new())),
        #[cfg(feature = "cuda")]
        Backend::Cuda => Ok(Arc::new(cuda::CudaDevice::open(0)?)),
        #[cfg(not(feature = "cuda"))]
        Backend::Cuda => Err(not_compiled(BackendKind::Cuda)),
        #[cfg(feature = "wgpu")]
        Backend::Wgpu => Ok(Arc::new(wgpu::WgpuDevice::open()?)),
        #[cfg(not(feature = "wgpu"))]
        Backend::Wgpu => Err(not_compiled(BackendKind::Wgpu)),
        Backend::Auto => {
            #[cfg(feature = "cuda")]
            if let Ok(d) = cuda::CudaDevice::open(0) {
                return Ok(Arc::new(d));
            }
            #[cfg(feature = "wgpu")]
            if let Ok(d) = wgpu::WgpuDevice::open_hardware() {
                return Ok(Arc::new(d));
            }
            Ok(Arc::new(cpu::CpuDevice::new()))
        }
        #[cfg(feature = "cudasim")]
        Backend::CudaSim => Ok(Arc::new(cuda_sim::CudaSimDevice::open()?)),
        #[cfg(not(feature = "cudasim"))]
        Backend::CudaSim => Err(not_compiled(BackendKind::CudaSim)),
    }
}

/// What a probe found for one backend.
#[derive(Clone, Debug)]
pub struct BackendReport {
    /// The backend.
    pub backend: BackendKind,
    /// Devices (empty when unavailable).
    pub devices: Vec<DeviceInfo>,
    /// Why the backend cannot be used, when it cannot.
    pub unavailable: Option<String>,
    /// Whether NVRTC (runtime compilation) loads; CUDA only.
    pub nvrtc: Option<bool>,
}

/// An engine this build does not have, reported as unavailable with the feature to enable.
#[cfg_attr(
    all(feature = "cuda", feature = "cudasim", feature = "wgpu"),
    allow(dead_code)
)]
fn not_compiled_report(backend: BackendKind) -> BackendReport {
    BackendReport {
        backend,
        devices: Vec::new(),
        unavailable: Some(not_compiled(backend).to_string()),
        nvrtc: None,
    }
}

/// Every backend `resident` knows (CPU, CUDA, wgpu, CudaSim, in that order), with devices or
/// the reason it is unavailable; an engine not compiled into this build says which cargo
/// feature enables it.
pub fn probe() -> Vec<BackendReport> {
    let cpu = BackendReport {
        backend: BackendKind::Cpu,
        devices: vec![cpu::CpuDevice::new().info()],
        unavailable: None,
        nvrtc: None,
    };
    #[cfg(not(feature = "cuda"))]
    let cuda = not_compiled_report(BackendKind::Cuda);
    #[cfg(feature = "cuda")]
    let cuda = match cuda::device_infos() {
        Ok(devices) => BackendReport {
            backend: BackendKind::Cuda,
            devices,
            unavailable: None,
            nvrtc: Some(resident_cuda::nvrtc_present()),
        },
        Err(e) => BackendReport {
            backend: BackendKind::Cuda,
            devices: Vec::new(),
            unavailable: Some(e.to_string()),
            nvrtc: Some(resident_cuda::nvrtc_present()),
        },
    };
    #[cfg(not(feature = "wgpu"))]
    let wgpu = not_compiled_report(BackendKind::Wgpu);
    #[cfg(feature = "wgpu")]
    let adapters = wgpu::adapters();
    #[cfg(feature = "wgpu")]
    let wgpu = BackendReport {
        backend: BackendKind::Wgpu,
        devices: adapters.iter().map(wgpu::info_of).collect(),
        unavailable: adapters
            .is_empty()
            .then(|| "no wgpu adapter (no Vulkan, Metal or DX12 driver found)".to_string()),
        nvrtc: None,
    };
    #[cfg(not(feature = "cudasim"))]
    let sim = not_compiled_report(BackendKind::CudaSim);
    #[cfg(feature = "cudasim")]
    let sim = match cuda_sim::CudaSimDevice::open() {
        Ok(d) => BackendReport {
            backend: BackendKind::CudaSim,
            devices: vec![d.info()],
            unavailable: None,
            nvrtc: None,
        },
        Err(e) => BackendReport {
            backend: BackendKind::CudaSim,
            devices: Vec::new(),
            unavailable: Some(e.to_string()),
            nvrtc: None,
        },
    };
    vec![cpu, cuda, wgpu, sim]
}

/// NVML telemetry of every GPU, or why it is unavailable.
#[cfg(feature = "cuda")]
pub fn device_telemetry() -> Result<Vec<DeviceTelemetry>, resident_cuda::CudaError> {
    resident_cuda::telemetry::read_all()
}

/// Resolves a runtime's backend request: `Auto` becomes CUDA when a device opens, else the CPU;
/// an explicit `Cuda` request that cannot be met is a typed error saying why.
/// The backend a runtime runs on, and its device when choosing it opened one (the runtime
/// keeps it for [`Runtime::device`](crate::runtime::Runtime::device)).
pub(crate) fn resolve(
    b: Backend,
) -> crate::runtime::state::Result<(Backend, Option<DeviceHandle>)> {
    use crate::runtime::state::Error;
    let opened = |backend: Backend| {
        open(backend)
            .map(|d| (backend, Some(d)))
            .map_err(|e| Error::BackendUnavailable {
                backend,
                source: Box::new(e),
            })
    };
    match b {
        Backend::Cpu => Ok((Backend::Cpu, None)),
        Backend::Cuda | Backend::Wgpu | Backend::CudaSim => opened(b),
        // Only the engines compiled in: `open` of one that is not is an error, like no device.
        Backend::Auto => Ok(match open(Backend::Cuda) {
            Ok(d) => (Backend::Cuda, Some(d)),
            #[cfg(feature = "wgpu")]
            Err(_) if wgpu::hardware_adapter_present() => (Backend::Wgpu, None),
            Err(_) => (Backend::Cpu, None),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_request_matches_this_machine() {
        let r = open(Backend::Cuda);
        if resident_cuda::driver_present() {
            let d = r.expect("a CUDA driver is present, so the CUDA backend must open");
            assert_eq!(d.kind(), BackendKind::Cuda);
        } else {
            match r {
                Err(BackendError::CudaUnavailable(resident_cuda::CudaError::DriverNotFound)) => {}
                other => panic!("expected CudaUnavailable(DriverNotFound), got {other:?}"),
            }
        }
    }

    #[test]
    fn auto_falls_back_to_cpu() {
        let d = open(Backend::Auto).unwrap();
        #[cfg(feature = "cuda")]
        let cuda_works = cuda::CudaDevice::open(0).is_ok();
        #[cfg(not(feature = "cuda"))]
        let cuda_works = false;
        #[cfg(feature = "wgpu")]
        let hardware_wgpu = wgpu::hardware_adapter_present();
        #[cfg(not(feature = "wgpu"))]
        let hardware_wgpu = false;
        let want = if cuda_works {
            BackendKind::Cuda
        } else if hardware_wgpu {
            BackendKind::Wgpu
        } else {
            // A software wgpu adapter (lavapipe) is never picked on its own.
            BackendKind::Cpu
        };
        assert_eq!(d.kind(), want);
        assert_eq!(open(Backend::Cpu).unwrap().kind(), BackendKind::Cpu);
    }

    #[test]
    fn probe_explains_missing_cuda() {
        let reports = probe();
        assert_eq!(reports.len(), 4);
        let w = &reports[2];
        assert_eq!(w.backend, BackendKind::Wgpu);
        assert_eq!(w.unavailable.is_some(), w.devices.is_empty());
        let sim = &reports[3];
        assert_eq!(sim.backend, BackendKind::CudaSim);
        assert_eq!(sim.unavailable.is_some(), sim.devices.is_empty());
        assert!(reports[0].unavailable.is_none() && !reports[0].devices.is_empty());
        let cuda = &reports[1];
        assert_eq!(cuda.unavailable.is_some(), cuda.devices.is_empty());
        #[cfg(feature = "cuda")]
        if !resident_cuda::driver_present() {
            assert!(cuda.unavailable.as_deref().unwrap().contains("driver"));
        }
        // An engine not compiled in is unavailable and names its feature.
        for r in &reports {
            assert_eq!(r.backend.compiled_in(), compiled_in().contains(&r.backend));
            if !r.backend.compiled_in() {
                let why = r.unavailable.as_deref().unwrap();
                let feature = r.backend.feature().unwrap();
                assert!(why.contains(&format!("`{feature}`")), "{why}");
            }
        }
    }

    #[test]
    fn engines_not_compiled_in_are_typed_errors_naming_their_feature() {
        assert_eq!(compiled_in()[0], BackendKind::Cpu);
        for (backend, kind) in [
            (Backend::Cuda, BackendKind::Cuda),
            (Backend::Wgpu, BackendKind::Wgpu),
            (Backend::CudaSim, BackendKind::CudaSim),
        ] {
            if kind.compiled_in() {
                continue;
            }
            match open(backend) {
                Err(BackendError::NotCompiled {
                    backend: b,
                    feature,
                }) => {
                    assert_eq!(b, kind);
                    assert_eq!(Some(feature), kind.feature());
                }
                other => panic!("{backend:?}: expected NotCompiled, got {other:?}"),
            }
            match resolve(backend) {
                Err(crate::Error::BackendUnavailable { backend: b, source }) => {
                    assert_eq!(b, backend);
                    let msg = source.to_string();
                    assert!(
                        msg.contains(&format!("feature `{}`", kind.feature().unwrap())),
                        "{msg}"
                    );
                }
                Err(other) => panic!("{backend:?}: expected BackendUnavailable, got {other}"),
                Ok(_) => panic!("{backend:?}: opened although not compiled in"),
            }
        }
    }
}
