//! Backends: where memory lives and kernels run, and the set of engines this build has
//! ([`AllEngines`], the engines of [`crate::runtime::Runtime`]). The runtime (`resident-core`)
//! talks to a [`ComputeDevice`] and a `DeviceHandler` and never names an engine; the engines
//! are crates of their own:
//!
//! * `cpu` (in `resident-core`): threads and rayon; always available. Its "device memory" is
//!   host memory.
//! * `cuda` (cargo feature `cuda`, crate `resident-engine-cuda`): `resident-cuda`, loaded at run
//!   time; available when a driver and device work.
//! * `wgpu` (cargo feature `wgpu`, crate `resident-engine-wgpu`): Vulkan / Metal / DX12 through
//!   wgpu (lavapipe in CI); WGSL kernels. The WGSL handler type is in every build.
//! * `cuda_sim` (cargo feature `cudasim`, crate `resident-engine-cuda`): CudaSim, the CUDA C source (ring-kernel template +
//!   handlers, one-shot kernels) compiled by the host C++ compiler and run on host threads;
//!   available where a host C++ compiler (`g++`, or `RESIDENT_SIM_CXX`) runs. For running and
//!   debugging CUDA handlers without a GPU, not for speed.
//!
//! [`open`] picks one from a [`Backend`] request; [`probe`] reports what this machine has and
//! why a backend is missing; [`compiled_in`] lists the engines of this build (the three
//! features are on by default; an engine not compiled in is [`BackendError::NotCompiled`]).

pub use resident_core::engine::cpu;
// The engines: the CUDA family's crate (GPU and CudaSim launchers) under its old module names,
// and wgpu's module.
#[cfg(feature = "cuda")]
pub(crate) use resident_engine_cuda::device as cuda;
pub(crate) use resident_engine_cuda::ring as cuda_ring;
#[cfg(feature = "cudasim")]
pub(crate) use resident_engine_cuda::sim::engine as cuda_sim;
// wgpu's engine crate (WgslHandler and the WGSL errors in every build, the engine with the
// `wgpu` feature), under its old module path.
pub use resident_engine_wgpu as wgpu;

// The seam's types, where they were (the engines below and users name them here).
pub use cuda_ring::CudaHandler;
pub use resident_core::engine::error::DeviceError;
pub use resident_core::engine::kernel::{
    launch_cpu, CpuKernelFn, CpuThread, Kernel, KernelArg, Output,
};
pub(crate) use resident_core::engine::not_compiled;
pub use resident_core::engine::storage::{DeviceMemory, HostMemory, Stream};
use resident_core::engine::Engines;
pub use resident_core::engine::{
    block_size_for, compiled_in, Backend, BackendError, BackendKind, ComputeDevice, DeviceHandle,
    DeviceInfo, LaunchConfig, Result, BUFFER_SYNC_TIMEOUT,
};
#[cfg(feature = "cuda")]
pub use resident_cuda::telemetry::DeviceTelemetry;

use std::sync::Arc;

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

/// Every engine this build has (the cargo features `cuda`, `cudasim`, `wgpu`, and the CPU):
/// the engines of [`crate::runtime::Runtime`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AllEngines;

impl Engines for AllEngines {
    /// `Auto` becomes CUDA when a device opens, else a hardware wgpu adapter, else the CPU
    /// (only the engines compiled in); an explicit request that cannot be met says why.
    fn resolve(request: Backend) -> Result<(Backend, Option<DeviceHandle>)> {
        match request {
            Backend::Cpu => Ok((Backend::Cpu, None)),
            Backend::Cuda | Backend::Wgpu | Backend::CudaSim => {
                open(request).map(|d| (request, Some(d)))
            }
            // `open` of an engine not compiled in is an error, like no device.
            Backend::Auto => Ok(match open(Backend::Cuda) {
                Ok(d) => (Backend::Cuda, Some(d)),
                #[cfg(feature = "wgpu")]
                Err(_) if wgpu::hardware_adapter_present() => (Backend::Wgpu, None),
                Err(_) => (Backend::Cpu, None),
            }),
        }
    }

    fn open(backend: Backend) -> Result<DeviceHandle> {
        open(backend)
    }

    fn device_telemetry() -> (Vec<resident_core::profile::GpuTelemetry>, Option<String>) {
        #[cfg(feature = "cuda")]
        return resident_engine_cuda::device::telemetry();
        #[cfg(not(feature = "cuda"))]
        (
            Vec::new(),
            Some(format!(
                "no GPU telemetry: {}",
                resident_core::engine::not_compiled(BackendKind::Cuda)
            )),
        )
    }
}

/// What a runtime built on `b` runs on, as [`crate::RuntimeBuilder::build`] reports it.
#[cfg(test)]
fn resolve(b: Backend) -> resident_core::Result<(Backend, Option<DeviceHandle>)> {
    AllEngines::resolve(b).map_err(|source| resident_core::Error::BackendUnavailable {
        backend: b,
        source: Box::new(source),
    })
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
                Err(BackendError::CudaUnavailable(e))
                    if matches!(
                        e.downcast_ref(),
                        Some(resident_cuda::CudaError::DriverNotFound)
                    ) => {}
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
