//! # resident-workloads
//!
//! The reference workloads of `resident`, each one ring-kernel definition over buffers bound to
//! the kernel (`RingKernel::bind`), each with a straightforward sequential f64 reference on the
//! host and a stated tolerance:
//!
//! | workload | kernel | reference check |
//! |---|---|---|
//! | [`vector_add`] | actor over bound `a`, `b`, `c`; messages carry offset/length | `|c - (a + b)| <= f32::EPSILON * |a + b|` per element (f32 add is correctly rounded) |
//! | [`pagerank`] | full: graph in CSR bound to the kernel, one power-iteration step over a node range per message; streaming: edge changes applied to the graph kept on the device (growable out-lists in a bound pool), ranks and residual resident, refreshed by residual push in parallel rounds ([`pagerank::StreamPageRank`]) | full: same iteration count and per-node relative error `<= 1e-9`; streaming vs recompute: L1 `<= 2 d/(1-d) N tol`, final ranks vs the reference on the final graph likewise (f32 on wgpu: `+ 1e-4`) |
//! | [`pipeline`] | normalizer -> scorer, kernel to kernel (`ctx.send_to`) | exact (same f64 operations), compared with `1e-12` |
//! | [`anomaly`] | a keyed kernel: sensor = key, its EWMA statistics the key's state, resident for the kernel's life; per-sensor order kept by the keyed kernel (no tickets) | same alerts (index, sensor), `z` and final statistics within relative `1e-9` |
//!
//! Every workload also has the stateless baseline the issue compares against ([`anomaly::run_stateless`],
//! [`pagerank::recompute`]).
//!
//! Each workload is one folder: its Rust, its CUDA C (`.cu`, run on a GPU through NVRTC and on
//! CudaSim) and its WGSL (`.wgsl`), with the handler builders beside the message types they
//! use. [`device`] is the index of every device source and handler; what the workloads share
//! per device kind (the batch size, [`batch_size`], and the arithmetic, [`Precision`]) is here.
#![deny(missing_docs)]

pub mod anomaly;
pub mod device;
pub mod error;
pub mod input;
pub mod pagerank;
pub mod pipeline;
pub mod rng;
pub mod vector_add;

pub use error::{InputError, LineError, WorkloadError, MAX_EXCERPT};

use resident::backend::BackendKind;

/// The arithmetic a backend's handlers do, which sets the tolerance of the reference checks:
/// f64 on the CPU and in CUDA C (CudaSim, CUDA), f32 in WGSL (it has no f64: 64-bit fields
/// travel as `vec2<u32>` and are converted; see each workload's `check_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Same f64 operations as the reference (tolerances of a summation order).
    F64,
    /// f32 arithmetic on f64 data.
    F32,
}

impl Precision {
    /// What the handlers on `kind` compute in.
    pub fn of(kind: BackendKind) -> Self {
        match kind {
            BackendKind::Wgpu => Precision::F32,
            _ => Precision::F64,
        }
    }
}

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
