//! Benchmark support shared by every benchmark of the workspace (the CLI's `resident bench ...`
//! commands, the NATS serving benchmark, the workloads' figures):
//!
//! * [`stats`]: the one statistics module: quantiles by nearest rank, median, the spread of
//!   repeated runs and latency summaries, all total on empty input (no panic, `null` in JSON);
//! * [`provenance`]: what every result file carries so that it can be reproduced and judged:
//!   the command, the machine, its load, the UTC date, and the writing of the JSON itself;
//! * [`cpu`]: the CPU backend against `rtrb` and `crossbeam` (`resident bench`);
//! * [`deadlines`]: the call storm, before and after call deadlines (`resident bench deadlines`);
//! * [`transfer`]: the host <-> device transfer benchmark (pinned vs pageable against a plain
//!   synchronous copy), which needs a CUDA device;
//! * [`ring_gpu`]: the persistent ring kernel against launch-per-batch and a CUDA graph of the
//!   same template (`resident bench-ring`), which needs a CUDA device;
//! * [`forwarding`]: device-side forwarding against the host relay on the pipeline workload
//!   (`resident bench forwarding`);
//! * [`profile_overhead`]: the profiler's own cost, off vs paused vs on (`resident profile
//!   --overhead`);
//! * [`wgpu_ring`]: a WGSL ring kernel with its state on the device against the same handler
//!   run stateless (`resident bench-wgpu`);
//! * [`workloads`]: the reference workloads against their baselines (`resident bench
//!   workloads`);
//! * [`fuzz`]: fuzzing of the decoders of untrusted bytes (NATS payloads and replies, edge
//!   lists, readings) on stable Rust (`resident fuzz`).
//!
//! The CLI parses the arguments, prints and writes the files; the measuring is here. The
//! figures go to `bench/results/` as JSON with the command that produced them.

#![deny(missing_docs)]

pub use error::{BenchError, OutputCheck};

pub mod cpu;
pub mod deadlines;
mod error;
pub mod forwarding;
pub mod fuzz;
pub mod profile_overhead;
pub mod provenance;
pub mod ring_bus;
#[cfg(feature = "cuda")]
pub mod ring_gpu;
pub mod stats;
#[cfg(feature = "cuda")]
pub mod transfer;
pub mod wgpu_ring;
pub mod workloads;
