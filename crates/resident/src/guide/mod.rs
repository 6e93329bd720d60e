//! The guide: from a first ring kernel to serving and tuning, one chapter per module.
//!
//! Every code block in these chapters is a complete program that `cargo test --doc -p resident`
//! compiles and runs (the few marked `no_run` need a GPU or a NATS server; the program beside
//! them in `crates/resident/examples/` runs the same code on the CPU, CudaSim or lavapipe, and
//! `scripts/run-examples.sh` runs every example).
//!
//! Read in order:
//!
//! 1. [`intro`]: what a ring kernel is, the first program, the crates.
//! 2. [`ring_kernels`]: messages, handlers, state, `call`, kernel to kernel.
//! 3. [`lifecycle`]: launch, activate, deactivate, terminate; what comes back; failures.
//!    [`keyed`]: millions of small per-key actors in one kernel, and forwarding on the device.
//! 4. [`backpressure`]: priorities, lanes, queue sizes and the four full-queue policies.
//! 5. [`backends`]: CPU, CUDA, CudaSim, wgpu; one definition for all of them.
//! 6. [`cuda_handlers`]: handlers in CUDA C, device state, checking them without a GPU.
//! 7. [`wgsl_handlers`]: handlers in WGSL on wgpu, atomics, 64-bit fields.
//! 8. [`memory`]: `UnifiedBuffer`, one-shot kernels, pools, buffers bound to a kernel.
//! 9. [`workloads`]: the reference workloads and their checks.
//! 10. [`profiling`]: where the time goes, traces, tuning.
//! 11. [`serving`]: ring kernels behind NATS.
//! 12. [`performance`]: what makes resident fast, with measured figures.
//! 13. [`troubleshooting`]: every skipped test and set-up error, and its fix.

// Every example is a complete program, `fn main` included, as a user would write it.
#![allow(clippy::needless_doctest_main)]

#[doc = include_str!("intro.md")]
pub mod intro {}
#[doc = include_str!("ring_kernels.md")]
pub mod ring_kernels {}
#[doc = include_str!("lifecycle.md")]
pub mod lifecycle {}
#[doc = include_str!("keyed.md")]
pub mod keyed {}
#[doc = include_str!("backpressure.md")]
pub mod backpressure {}
#[doc = include_str!("backends.md")]
pub mod backends {}
// Its examples check handlers with NVRTC, part of the `cuda` feature.
#[cfg_attr(feature = "cuda", doc = include_str!("cuda_handlers.md"))]
#[cfg_attr(
    not(feature = "cuda"),
    doc = "Handlers in CUDA C. This chapter checks handlers with NVRTC, which is part of the \
           `cuda` cargo feature (on by default): this build has it off."
)]
pub mod cuda_handlers {}
#[doc = include_str!("wgsl_handlers.md")]
pub mod wgsl_handlers {}
#[doc = include_str!("memory.md")]
pub mod memory {}
#[doc = include_str!("workloads.md")]
pub mod workloads {}
#[doc = include_str!("profiling.md")]
pub mod profiling {}
// Deployment (authentication, TLS, several workers) is docs/guide/serving.md in the repository;
// the chapter points to it (an include_str! from outside the crate would break packaging).
#[doc = include_str!("serving.md")]
pub mod serving {}
#[doc = include_str!("performance.md")]
pub mod performance {}
#[doc = include_str!("troubleshooting.md")]
pub mod troubleshooting {}

/// The README's example program, compiled and run as a doctest (`cargo test -p resident
/// --doc`). The README lies outside this crate's package, so only under `cfg(doctest)`.
#[cfg(doctest)]
#[doc = include_str!("../../../../README.md")]
pub struct ReadmeExample;
