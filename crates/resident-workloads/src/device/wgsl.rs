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

use resident::backend::DeviceHandle;
use resident::memory::BufferOptions;
use resident::{Kernel, KernelArg, LaunchConfig, UnifiedBuffer};

use crate::anomaly::{drive_stateless, RunReport, SlottedReadings};
use crate::error::WorkloadError;

// The other workloads keep their sources in their own folders; named here too, so that this
// module stays the index of every WGSL source.
pub use crate::pagerank::{PAGERANK_STREAM_WGSL, PAGERANK_WGSL};
pub use crate::pipeline::PIPELINE_WGSL;
pub use crate::vector_add::VECTOR_ADD_WGSL;

/// The anomaly detector actor: keyed handler `anomaly` (used with `WgslHandler::keyed("slot")`).
pub const ANOMALY_WGSL: &str = include_str!("anomaly.wgsl");
/// The anomaly detector's stateless baseline: a one-shot kernel, entry `anomaly_stateless`.
pub const ANOMALY_STATELESS_WGSL: &str = include_str!("anomaly_stateless.wgsl");

/// [`crate::anomaly::run_stateless`] on a wgpu device: per micro-batch of `batch` readings the
/// statistics and the readings are uploaded into `UnifiedBuffer`s, one one-shot WGSL kernel
/// ([`ANOMALY_STATELESS_WGSL`]) folds them in order, and the statistics and scores are
/// downloaded again. `progress(n)` after each micro-batch of `n` readings.
pub fn run_stateless_wgpu(
    device: &DeviceHandle,
    r: &SlottedReadings,
    batch: usize,
    progress: impl FnMut(usize),
) -> Result<RunReport, WorkloadError> {
    let batch = batch.max(1);
    let sensors = r.sensor_ids.len();
    if let Some((i, &s)) = r
        .slots
        .iter()
        .enumerate()
        .find(|(_, &s)| s as usize >= sensors)
    {
        return Err(WorkloadError::OutOfRange {
            workload: "anomaly",
            detail: format!("reading {i} has slot {s}, there are {sensors} sensors"),
        });
    }
    let mut status_buf = UnifiedBuffer::<u32>::new(device, 1, BufferOptions::default())?;
    let k = Kernel::new("anomaly_stateless").wgsl(ANOMALY_STATELESS_WGSL, "anomaly_stateless");
    drive_stateless(device, r, batch, true, progress, |b, n| {
        status_buf.host_mut()?;
        {
            let (sv, vv, tv) = (b.slots.device()?, b.values.device()?, b.tickets.device()?);
            let (mut stv, mut zv, mut usv) = (
                b.stats.device_mut()?,
                b.z.device_mut()?,
                status_buf.device_mut()?,
            );
            let args = [
                KernelArg::scalar(n as u64),
                sv.arg(),
                vv.arg(),
                tv.arg(),
                stv.arg(),
                zv.arg(),
                usv.arg(),
            ];
            device.launch(&k, LaunchConfig::for_elements(1), &args, None)?;
        }
        let handled = status_buf.host()?[0] as usize;
        if handled != n {
            return Err(WorkloadError::OutOfRange {
                workload: "anomaly",
                detail: format!(
                    "the device handled {handled} of the {n} readings of a micro-batch (llvmpipe caps an invocation's loops at 65535 iterations: use smaller micro-batches)"
                ),
            });
        }
        Ok(())
    })
}
