//! CUDA C handlers of the four workloads (run on a GPU through NVRTC and on CudaSim through the
//! host C++ compiler; the same sources), and the stateless anomaly baseline on a CUDA-C device.
//!
//! Each ring-kernel handler takes the bound buffers (`ResidentBuffers*`, see
//! [`CudaHandler`]); the `*_handler()` functions declare them,
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

use resident::backend::{DeviceHandle, Kernel, KernelArg, LaunchConfig};
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::ring::DeviceMessage;
use resident::UnifiedBuffer;

use crate::anomaly::{
    drive_stateless, AlertMsg, ReadingMsg, RunReport, SensorStats, SlottedReadings,
};
use crate::error::WorkloadError;

// The other workloads keep their sources and handlers in their own folders; named here too, so
// that this module stays the index of every CUDA C handler.
pub use crate::pagerank::{
    pagerank_handler, pagerank_stream_handler, PAGERANK_CU, PAGERANK_FN, PAGERANK_STREAM_CU,
    PAGERANK_STREAM_FN,
};
pub use crate::pipeline::{
    normalizer_handler, scorer_handler, NORMALIZE_FN, PIPELINE_CU, SCORE_FN,
};
pub use crate::vector_add::{vector_add_handler, VECTOR_ADD_CU, VECTOR_ADD_FN};

/// The anomaly detector (`anomaly_detect`).
pub const ANOMALY_CU: &str = include_str!("anomaly.cu");
/// Its handler function.
pub const ANOMALY_FN: &str = "anomaly_detect";
/// The stateless anomaly baseline's one-shot kernel (needs `SensorStats` declared first: see
/// [`anomaly_stateless_source`]).
pub const ANOMALY_STATELESS_CU: &str = include_str!("anomaly_stateless.cu");
/// Its `extern "C"` entry.
pub const ANOMALY_STATELESS_ENTRY: &str = "anomaly_stateless";

/// The anomaly detector as a keyed handler: key = `ReadingMsg::slot`, per-key state
/// [`SensorStats`] (the keyed kernel's buffer `keys`); launch it with `RingKernel::key_cuda`.
pub fn anomaly_handler() -> CudaHandler<ReadingMsg, AlertMsg> {
    CudaHandler::new(ANOMALY_CU)
        .function(ANOMALY_FN)
        .keyed::<SensorStats>("slot")
}

/// The stateless baseline's full source: `SensorStats`' C declaration (from the Rust type)
/// followed by [`ANOMALY_STATELESS_CU`].
pub fn anomaly_stateless_source() -> String {
    format!(
        "{}\n{}",
        SensorStats::c_declarations(),
        ANOMALY_STATELESS_CU
    )
}

/// The stateless baseline's one-shot kernel (CUDA C; runs on CUDA and CudaSim).
pub fn anomaly_stateless_kernel() -> Kernel {
    Kernel::new("anomaly_stateless").cuda(anomaly_stateless_source(), ANOMALY_STATELESS_ENTRY)
}

/// Threads per block of the stateless kernel.
const STATELESS_BLOCK: u32 = 256;

/// The stateless baseline on a CUDA-C device (CUDA or CudaSim), shaped like
/// [`anomaly::run_stateless`](crate::anomaly::run_stateless): every micro-batch uploads the
/// statistics and its readings (slots, values, tickets) into `UnifiedBuffer`s, runs
/// [`anomaly_stateless_kernel`] (readings folded in parallel, in order per sensor), and
/// downloads the statistics and the scores.
pub fn run_stateless_cuda(
    device: &DeviceHandle,
    r: &SlottedReadings,
    batch: usize,
    progress: impl FnMut(usize),
) -> Result<RunReport, WorkloadError> {
    let sensors = r.sensor_ids.len();
    let mut order_buf = UnifiedBuffer::<u32>::new(device, 1, BufferOptions::default())?;
    let k = anomaly_stateless_kernel();
    // The actor's batch on this device: one thread per reading, the same count.
    let block = super::batch_size(device.kind(), STATELESS_BLOCK as usize) as u32;
    drive_stateless(device, r, batch, true, progress, |b, n| {
        order_buf.host_mut()?[0] = 0;
        let (sv, vv, tv) = (b.slots.device()?, b.values.device()?, b.tickets.device()?);
        let (mut stv, mut zv, mut ov) = (
            b.stats.device_mut()?,
            b.z.device_mut()?,
            order_buf.device_mut()?,
        );
        let args = [
            KernelArg::scalar(n as u64),
            sv.arg(),
            vv.arg(),
            tv.arg(),
            stv.arg(),
            KernelArg::scalar(sensors as u64),
            zv.arg(),
            ov.arg(),
        ];
        let blocks = (n as u32).div_ceil(block).max(1);
        let cfg = LaunchConfig::new(blocks, block.min(n.max(1) as u32));
        device.launch(&k, cfg, &args, None)?;
        Ok(())
    })
}
