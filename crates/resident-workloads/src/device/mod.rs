//! Device handlers of the workloads, one module per device language: the index of every
//! source, handler builder and stateless baseline runner (each workload keeps its own in its
//! folder), and what they share: the batch size per device kind.

pub mod cuda;
pub mod wgsl;

use resident::backend::BackendKind;

/// Threads CudaSim gives a batch at most: the template runs one thread per message of a batch,
/// and on CudaSim every thread is an OS thread (a block of 1024 on two cores spends its time in
/// the scheduler, not in the handler).
pub const CUDASIM_MAX_BATCH: usize = 64;

/// The device kind a runtime of `backend` launches its device kernels on (`Auto` and the CPU:
/// the CPU; `Auto` picks a GPU only when one is present, which these workloads then treat
/// like CUDA).
pub fn kind_of(backend: resident::prelude::Backend) -> BackendKind {
    use resident::prelude::Backend;
    match backend {
        Backend::Cuda => BackendKind::Cuda,
        Backend::CudaSim => BackendKind::CudaSim,
        Backend::Wgpu => BackendKind::Wgpu,
        _ => BackendKind::Cpu,
    }
}

/// The batch size (one device thread per message) a workload kernel uses on `kind`: `gpu` on
/// a GPU, wgpu and the CPU, at most [`CUDASIM_MAX_BATCH`] on CudaSim.
pub fn batch_size(kind: BackendKind, gpu: usize) -> usize {
    match kind {
        BackendKind::CudaSim => gpu.min(CUDASIM_MAX_BATCH),
        _ => gpu,
    }
}
