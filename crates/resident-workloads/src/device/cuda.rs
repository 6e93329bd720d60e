//! CUDA C handlers of the four workloads (run on a GPU through NVRTC and on CudaSim through the
//! host C++ compiler; the same sources), and the stateless anomaly baseline on a CUDA-C device.
//!
//! Each ring-kernel handler takes the bound buffers (`ResidentBuffers*`, see
//! [`CudaHandler`](resident::prelude::CudaHandler)); the `*_handler()` functions declare them,
//! so a kernel using one must bind the same names, element types and order:
//!
//! | handler | messages | state | bound buffers (in order) |
//! |---|---|---|---|
//! | [`vector_add_handler`] (`vector_add`) | `AddRange -> RangeDone` | none | `a`, `b`, `c`: f32 |
//! | [`normalizer_handler`] (`pipeline_normalize`) | `Raw -> Normalized` | none | none |
//! | [`scorer_handler`] (`pipeline_score`) | `Normalized -> Scored` | none | none |
//! | [`anomaly_handler`] (`anomaly_detect`, keyed on `slot`) | `ReadingMsg -> AlertMsg` | per key: `SensorStats` (`KeyState* ks`) | `keys`: SensorStats (the keyed kernel's own) |
//! | [`pagerank_handler`] (`pagerank_step`) | `PageRankStep -> StepDone` | none | `in_offsets`: u64, `in_sources`: u32, `out_degree`: u32, `ranks`: f64 |
//! | [`pagerank_stream_handler`] (`pagerank_stream`) | `StreamMsg -> StreamAnswer` | `StreamCounters` | `ranks`, `residual`, `acc`: f64; `out_off`, `out_len`, `out_cap`, `pool`, `flags`, `frontier`, `src_seq`: u32 |
//!
//! The anomaly handler is a keyed handler (`CudaHandler::keyed`): it gets the state of its
//! reading's sensor, and the keyed template keeps each sensor's readings in order.

// Every workload keeps its sources and handlers in its own folder; named here too, so that
// this module stays the index of every CUDA C handler.
pub use crate::anomaly::{
    anomaly_handler, anomaly_stateless_kernel, anomaly_stateless_source, run_stateless_cuda,
    ANOMALY_CU, ANOMALY_FN, ANOMALY_STATELESS_CU, ANOMALY_STATELESS_ENTRY,
};
pub use crate::pagerank::{
    pagerank_handler, pagerank_stream_handler, PAGERANK_CU, PAGERANK_FN, PAGERANK_STREAM_CU,
    PAGERANK_STREAM_FN,
};
pub use crate::pipeline::{
    normalizer_handler, scorer_handler, NORMALIZE_FN, PIPELINE_CU, SCORE_FN,
};
pub use crate::vector_add::{vector_add_handler, VECTOR_ADD_CU, VECTOR_ADD_FN};
