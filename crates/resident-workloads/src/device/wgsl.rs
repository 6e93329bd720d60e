//! The workloads' WGSL handlers for the wgpu backend, and the anomaly detector's stateless
//! baseline on wgpu ([`run_stateless_wgpu`]).
//!
//! Each source is a WGSL file beside this one, compiled by the runtime together with the
//! generated declarations of the kernel's message types, state and bound buffers (see
//! `resident::backend::wgpu::ring`). Arithmetic is f32 (WGSL has no f64): f64 fields and
//! buffer elements are `vec2<u32>` converted with the runtime's `resident_f64_to_f32` /
//! `resident_f32_to_f64` helpers, so results agree with the f64 references to f32 precision,
//! not to the CPU kernels' `1e-9`.
//!
//! | source | function | kernel | build with |
//! |---|---|---|---|
//! | [`VECTOR_ADD_WGSL`] | `vector_add` | `AddRange -> RangeDone`, bound `a`, `b`, `c` (f32) | `WgslHandler::new(VECTOR_ADD_WGSL).function("vector_add")` |
//! | [`PIPELINE_WGSL`] | `normalize` | `Raw -> Normalized` | `.function("normalize").declare::<Scored>()` |
//! | [`PIPELINE_WGSL`] | `score` | `Normalized -> Scored` | `.function("score").declare::<Raw>()` |
//! | [`ANOMALY_WGSL`] | `anomaly` | `ReadingMsg -> AlertMsg`, keyed on `slot`, per-key state `SensorStats` | `.function("anomaly").keyed("slot")` with `RingKernel::key_wgsl` |
//! | [`PAGERANK_WGSL`] | `pagerank_step` | `PageRankStep -> StepDone`, bound `in_offsets`, `in_sources`, `out_degree`, `ranks` (f64\[2N\]) | `.function("pagerank_step")` |
//! | [`PAGERANK_STREAM_WGSL`] | `pagerank_stream` | `StreamMsg -> StreamAnswer`, bound `ranks` (f32), `residual`, `acc` (atomic u32: f32 bits), `out_off`, `out_len`, `out_cap`, `pool`, `frontier` (u32), state `WgslStreamCounters` | see `pagerank::stream_kernel` |
//! | [`ANOMALY_STATELESS_WGSL`] | `anomaly_stateless` (entry point) | one-shot kernel | `Kernel::new(..).wgsl(ANOMALY_STATELESS_WGSL, "anomaly_stateless")` |
//!
//! On Mesa's llvmpipe/lavapipe one invocation runs at most 65535 loop iterations in total, so
//! on lavapipe keep a vector-add range and a PageRank step's nodes plus in-edges well under
//! that (the handlers answer `ok = 0` when a loop was cut short); real GPUs have no such cap.

// Every workload keeps its sources in its own folder; named here too, so that this module
// stays the index of every WGSL source.
pub use crate::anomaly::{run_stateless_wgpu, ANOMALY_STATELESS_WGSL, ANOMALY_WGSL};
pub use crate::pagerank::{PAGERANK_STREAM_WGSL, PAGERANK_WGSL};
pub use crate::pipeline::PIPELINE_WGSL;
pub use crate::vector_add::VECTOR_ADD_WGSL;
