//! The anomaly detector's stateless baseline on the devices: every micro-batch uploads the
//! statistics and its readings (with their tickets: the one-shot kernels fold a micro-batch's
//! readings in parallel on CUDA, so they need each reading's place among its sensor's), runs
//! one one-shot kernel and downloads the statistics and scores (see
//! [`run_stateless`](super::run_stateless)).

use resident::backend::{DeviceHandle, Kernel, KernelArg, LaunchConfig};
use resident::memory::BufferOptions;
use resident::ring::DeviceMessage;
use resident::UnifiedBuffer;

use super::{drive_stateless, RunReport, SensorStats, SlottedReadings};
use crate::error::WorkloadError;

/// The stateless anomaly baseline's one-shot kernel (needs `SensorStats` declared first: see
/// [`anomaly_stateless_source`]).
pub const ANOMALY_STATELESS_CU: &str = include_str!("anomaly_stateless.cu");
/// Its `extern "C"` entry.
pub const ANOMALY_STATELESS_ENTRY: &str = "anomaly_stateless";

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
    let block = crate::batch_size(device.kind(), STATELESS_BLOCK as usize) as u32;
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
