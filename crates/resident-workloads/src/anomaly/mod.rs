//! Real-time anomaly detection over sensor readings, as one keyed ring kernel: the sensor is
//! the key, and each sensor's statistics ([`SensorStats`]) are its key's state, kept where the
//! kernel runs for the kernel's whole life.
//!
//! The definition (issue 11): per sensor an exponentially weighted mean `m` and variance `v`
//! with `a = 0.01`. A sensor's first reading sets `m = x, v = 0`. Every later reading `x` is
//! first scored, `z = |x - m| / sqrt(v)` (no score while `v = 0`), then folded in:
//! `d = x - m; m += a d; v = (1 - a)(v + a d^2)`. A reading is an anomaly when `z > 4.0` and its
//! sensor had already seen at least 100 readings before it.
//!
//! Readings travel as messages keyed by their sensor's dense slot; the keyed kernel handles a
//! sensor's readings in the order sent (sharded over every core on the CPU, one device thread
//! per reading on CUDA/CudaSim and one leader per sensor and batch on wgpu) and different
//! sensors in parallel. See [`run_actor`] for how the host knows a micro-batch is done.
//!
//! Tolerance against [`reference()`]: the same alerts (index and sensor), and `z` and the final
//! statistics within relative `1e-9` (the CPU kernel does the same f64 operations in the same
//! order, so in practice they are equal).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use resident::backend::{BackendKind, DeviceHandle};
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::{Kernel, KernelArg, LaunchConfig, UnifiedBuffer};

use crate::error::WorkloadError;
use crate::input::SensorReading;

mod stateless;
pub use stateless::*;

/// EWMA weight.
pub const ALPHA: f64 = 0.01;
/// Score threshold.
pub const Z_THRESHOLD: f64 = 4.0;
/// Readings a sensor must have seen before one of its readings can be an anomaly.
pub const WARMUP: u64 = 100;
/// Relative tolerance of the reference check.
pub const TOLERANCE: f64 = 1e-9;

resident::ring::device_message! {
    /// Per-sensor statistics (the bound buffer `stats`): weighted mean `m`, weighted variance
    /// `v`, readings folded so far `n`.
    #[derive(Default, PartialEq)]
    pub struct SensorStats {
        /// Weighted mean.
        pub m: f64,
        /// Weighted variance.
        pub v: f64,
        /// Readings folded so far.
        pub n: u64,
    }
}

/// Scores `x` against `s`, folds it in, and returns `Some(z)` when it is an anomaly.
#[inline]
pub fn observe(s: &mut SensorStats, x: f64) -> Option<f64> {
    match score_and_fold(s, x) {
        (z, true) => z,
        _ => None,
    }
}

/// Scores `x` against `s` and folds it in, as [`observe`] does, for a caller that needs the
/// score of every reading (the NATS demo answers each one): the z-score against the
/// statistics before `x` (`None` on the sensor's first reading and while `v = 0`), and
/// whether `x` is an anomaly.
#[inline]
pub fn score_and_fold(s: &mut SensorStats, x: f64) -> (Option<f64>, bool) {
    if s.n == 0 {
        *s = SensorStats { m: x, v: 0.0, n: 1 };
        return (None, false);
    }
    let z = (s.v > 0.0).then(|| (x - s.m).abs() / s.v.sqrt());
    let d = x - s.m;
    s.m += ALPHA * d;
    s.v = (1.0 - ALPHA) * (s.v + ALPHA * d * d);
    let prior = s.n;
    s.n += 1;
    (z, z.is_some_and(|z| z > Z_THRESHOLD && prior >= WARMUP))
}

/// One anomaly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Alert {
    /// Position of the reading in the input (0-based).
    pub index: u64,
    /// Sensor id as given.
    pub sensor: u64,
    /// The reading.
    pub value: f64,
    /// Its score.
    pub z: f64,
}

/// Readings with their sensors mapped to dense slots `0..sensors` (in order of first
/// appearance), so statistics can sit in one buffer.
#[derive(Clone, Debug)]
pub struct SlottedReadings {
    /// Slot of each reading.
    pub slots: Vec<u32>,
    /// Value of each reading.
    pub values: Vec<f64>,
    /// Original sensor id of each slot.
    pub sensor_ids: Vec<u64>,
    /// Each reading's ticket: how many readings of its slot come before it (mod 2^32). Only
    /// the stateless CUDA baseline's one-shot kernel uses them (it folds a micro-batch's
    /// readings in parallel); the detector actor, a keyed kernel, keeps per-sensor order itself.
    pub tickets: Vec<u32>,
}

/// Maps sensors to slots.
pub fn slot(readings: &[SensorReading]) -> SlottedReadings {
    let mut map: HashMap<u64, u32> = HashMap::new();
    let mut sensor_ids = Vec::new();
    let slots = readings
        .iter()
        .map(|r| {
            *map.entry(r.sensor).or_insert_with(|| {
                sensor_ids.push(r.sensor);
                (sensor_ids.len() - 1) as u32
            })
        })
        .collect();
    let slots: Vec<u32> = slots;
    let mut seen = vec![0u32; sensor_ids.len()];
    let tickets = slots
        .iter()
        .map(|&s| {
            let t = seen[s as usize];
            seen[s as usize] = t.wrapping_add(1);
            t
        })
        .collect();
    SlottedReadings {
        slots,
        values: readings.iter().map(|r| r.value).collect(),
        sensor_ids,
        tickets,
    }
}

/// The sequential f64 reference: every alert in input order, and the final statistics per slot.
pub fn reference(r: &SlottedReadings) -> (Vec<Alert>, Vec<SensorStats>) {
    let mut stats = vec![SensorStats::default(); r.sensor_ids.len()];
    let mut alerts = Vec::new();
    for (i, (&s, &x)) in r.slots.iter().zip(&r.values).enumerate() {
        if let Some(z) = observe(&mut stats[s as usize], x) {
            alerts.push(Alert {
                index: i as u64,
                sensor: r.sensor_ids[s as usize],
                value: x,
                z,
            });
        }
    }
    (alerts, stats)
}

resident::ring::device_message! {
    /// A reading for the detector, a keyed kernel whose key is `slot` (the sensor's dense
    /// slot, see [`slot()`]): the kernel keeps each slot's readings in the order sent and folds
    /// them into that slot's [`SensorStats`]. `flush != 0` marks a barrier instead of a
    /// reading: it leaves the statistics alone and is answered with an [`AlertMsg`] whose
    /// `slot` is [`FLUSH`] and whose `index` is the marker's (see [`run_actor`]).
    pub struct ReadingMsg {
        /// Position in the stream (for a flush marker: any tag the answer repeats).
        pub index: u64,
        /// The reading.
        pub value: f64,
        /// Dense sensor slot: the key (`0..sensors`; a flush marker names any valid slot).
        pub slot: u32,
        /// Non-zero for a flush marker.
        pub flush: u32,
    }
}

impl Keyed for ReadingMsg {
    fn key(&self) -> u32 {
        self.slot
    }
}

resident::ring::device_message! {
    /// An anomaly, or (`slot == FLUSH`) the answer to a flush marker (`index` repeats the
    /// marker's, `value` and `z` are zero).
    pub struct AlertMsg {
        /// The reading's position (for a flush answer: the marker's `index`).
        pub index: u64,
        /// The reading.
        pub value: f64,
        /// Its z-score.
        pub z: f64,
        /// The sensor slot, or `FLUSH`.
        pub slot: u32,
        /// Padding (zero).
        pub _pad: u32,
    }
}

/// The slot of a flush marker's answer.
pub const FLUSH: u32 = u32::MAX;

/// A flush marker (a barrier: see [`run_actor`]) tagged `index`, sent on slot 0.
pub fn flush_marker(index: u64) -> ReadingMsg {
    ReadingMsg {
        index,
        value: 0.0,
        slot: 0,
        flush: 1,
    }
}

/// The anomaly detector: one keyed ring kernel with one key per sensor slot (`sensors` keys,
/// at least one), each key's state its [`SensorStats`] (zeroed: no sensor seen yet; 24 bytes
/// per sensor). On the CPU the sensors are sharded over every core (the kernel's worker
/// threads); on CUDA and CudaSim the CUDA C key handler ([`anomaly_handler`]) and on
/// wgpu the WGSL key handler ([`ANOMALY_WGSL`]) get the state of their reading's sensor,
/// kept in device memory for the kernel's life. Each sensor's readings are folded in the order
/// sent on every backend (the keyed kernel's per-key order: no tickets from the host). A
/// reading whose slot is not below `sensors` is refused at `send` (`Error::KeyOutOfRange`,
/// nothing queued).
pub fn kernel(
    id: &str,
    device: &DeviceHandle,
    sensors: usize,
) -> Result<RingKernel<ReadingMsg, AlertMsg, Keys<SensorStats>>, WorkloadError> {
    let keys = u32::try_from(sensors.max(1)).map_err(|_| WorkloadError::OutOfRange {
        workload: "anomaly",
        detail: format!(
            "{sensors} sensors; a keyed kernel holds at most {} keys",
            u32::MAX
        ),
    })?;
    let batch = match device.kind() {
        // The keyed default. On wgpu the host links each sensor's readings of a batch, so a
        // batch's work is linear in its size (the guide's keyed chapter), and fewer, larger
        // batches measured best (bench/results/anomaly-wgpu-keyed-on-2026-11-26.json).
        BackendKind::Cpu | BackendKind::Wgpu => resident::runtime::keyed::KEYED_BATCH,
        kind => crate::batch_size(kind, 1024),
    };
    Ok(RingKernel::<ReadingMsg, AlertMsg>::new(id)
        .queue_size(QUEUE)
        .keyed(keys, SensorStats::default())
        .batch_size(batch)
        .backpressure(Backpressure::Block(Duration::from_secs(10)))
        .key_cuda(anomaly_handler())
        .key_wgsl(
            WgslHandler::new(ANOMALY_WGSL)
                .function("anomaly")
                .keyed("slot"),
        )
        .key_handler(|ks: &mut KeyContext<SensorStats>, r: ReadingMsg| {
            if r.flush != 0 {
                // Handled after everything taken before it: see `run_actor`.
                return Some(AlertMsg {
                    index: r.index,
                    value: 0.0,
                    z: 0.0,
                    slot: FLUSH,
                    _pad: 0,
                });
            }
            let z = observe(ks.state_mut(), r.value)?; // scored before it is folded in
            Some(AlertMsg {
                index: r.index,
                value: r.value,
                z,
                slot: ks.key(),
                _pad: 0,
            })
        }))
}

/// The detector's input queue (per priority lane).
const QUEUE: usize = 8192;

/// What one run produced and how long each micro-batch took.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    /// Alerts in input order.
    pub alerts: Vec<Alert>,
    /// Final statistics per slot.
    pub stats: Vec<SensorStats>,
    /// Wall time of each micro-batch (send -> last result back).
    pub batch_latency: Vec<Duration>,
    /// Whole run.
    pub elapsed: Duration,
}

const WAIT: Duration = Duration::from_secs(30);

/// How often the host looks at the kernel's processed count while only that is behind.
const POLL: Duration = Duration::from_micros(20);

/// Micro-batches the actor keeps in flight by default: the host sends micro-batch `k` once
/// micro-batch `k - 16` is handled, so sending, the kernel and receiving overlap while
/// queueing stays bounded (at micro-batch 100, at most 1600 readings, well inside the
/// 8192-slot lane). The statistics stay in the kernel, so micro-batch `k + 1` never waits for
/// `k`'s results; a stateless batch must (it needs `k`'s statistics back first).
pub const IN_FLIGHT: usize = 16;

/// Runs `readings` through a detector kernel launched on `rt` in micro-batches of `batch`, at
/// most `in_flight` micro-batches outstanding (1 = send, wait until processed, repeat), calling
/// `progress(n)` with each micro-batch's size as it completes.
///
/// How the end of a micro-batch is known without tickets: every micro-batch is followed by a
/// flush marker ([`flush_marker`], on slot 0), answered with `slot == FLUSH`. All messages go
/// in one priority lane, which the kernel takes in the order sent, so the marker runs in the
/// same batch as the micro-batch's last reading or a later one, and on the CPU a batch's
/// outputs are published once every shard finished it: when the answer is back, the
/// micro-batch is handled. On a device, whose threads finish a batch's messages in any order,
/// the host also waits for the kernel's processed count (`telemetry().messages_processed`) to
/// reach everything sent up to the marker. The host blocks on the output queue meanwhile (a
/// marker's answer or an alert wakes it), so no polling sets the latency: a micro-batch's
/// latency runs from sending its first reading to receiving its marker's answer.
///
/// The marker answers only say that the readings are handled, not that every alert of the
/// marker's batch is queued yet (on the CPU, shards publish one after another). So the
/// stream ends with one more flush marker sent as a `call` (a barrier) once every reading is
/// processed: it is taken in a later batch than every reading, and a batch's outputs are
/// published before the next batch runs (the CPU host publishes under the batch gate; a device
/// runs batches one after another and the pump delivers its outputs in order), so when its
/// answer is back every alert is queued. Alerts come in completion order (per sensor in input
/// order) and are sorted by index. The final statistics are read with `snapshot_keys`.
pub fn run_actor(
    rt: &Runtime,
    device: &DeviceHandle,
    r: &SlottedReadings,
    batch: usize,
    in_flight: usize,
    mut progress: impl FnMut(usize),
) -> Result<RunReport, WorkloadError> {
    let batch = batch.max(1);
    let in_flight = in_flight.max(1);
    let id = format!("anomaly-{}", unique());
    let sensors = r.sensor_ids.len();
    let k = rt.launch(kernel(&id, device, sensors)?)?;
    k.activate()?;
    let timeout = || WorkloadError::Timeout {
        workload: "anomaly",
        waited: WAIT,
    };
    let result = (|| {
        let mut report = RunReport::default();
        let n = r.slots.len();
        let total = n.div_ceil(batch);
        let hi_of = |b: usize| ((b + 1) * batch).min(n);
        // Messages sent up to and including micro-batch `b`'s marker (readings and markers).
        let upto = |b: usize| (hi_of(b) + b + 1) as u64;
        let mut sent_at: Vec<Instant> = Vec::with_capacity(total);
        let mut msgs: Vec<ReadingMsg> = Vec::with_capacity(batch + 1);
        let mut got: Vec<AlertMsg> = Vec::with_capacity(256);
        let mut done = 0usize;
        let mut answered = 0usize; // markers answered (they answer in order)
        let start = Instant::now();
        let mut last_progress = Instant::now();
        while done < total {
            // Send while the window has room.
            while sent_at.len() < total && sent_at.len() - done < in_flight {
                let b = sent_at.len();
                let lo = b * batch;
                msgs.clear();
                msgs.extend((lo..hi_of(b)).map(|i| ReadingMsg {
                    index: i as u64,
                    value: r.values[i],
                    slot: r.slots[i],
                    flush: 0,
                }));
                msgs.push(flush_marker(b as u64));
                sent_at.push(Instant::now());
                let mut sent = 0;
                while sent < msgs.len() {
                    sent += k.send_batch(&msgs[sent..])?;
                }
            }
            got.clear();
            if k.receive_batch(&mut got, 256)? == 0 {
                if answered > done {
                    // Only the processed count is behind (a device's batch still finishing).
                    if last_progress.elapsed() > WAIT {
                        return Err(timeout());
                    }
                    std::thread::sleep(POLL);
                } else {
                    match k.receive(WAIT) {
                        Ok(a) => got.push(a),
                        Err(resident::Error::Timeout { .. }) => return Err(timeout()),
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            for a in &got {
                if a.slot == FLUSH {
                    answered = answered.max(a.index as usize + 1);
                    continue;
                }
                report.alerts.push(Alert {
                    index: a.index,
                    sensor: r.sensor_ids[a.slot as usize],
                    value: a.value,
                    z: a.z,
                });
            }
            if answered > done {
                let processed = k.telemetry().messages_processed;
                while done < answered && processed >= upto(done) {
                    report.batch_latency.push(sent_at[done].elapsed());
                    progress(hi_of(done) - done * batch);
                    done += 1;
                    last_progress = Instant::now();
                }
            }
        }
        // The barrier: every reading is processed, so the marker runs in a later batch, after
        // every alert was published.
        let f = k
            .call(flush_marker(total as u64), WAIT)
            .map_err(|e| match e {
                resident::Error::Timeout { .. } => timeout(),
                e => e.into(),
            })?;
        if (f.slot, f.index) != (FLUSH, total as u64) {
            return Err(WorkloadError::Mismatch {
                workload: "anomaly",
                detail: format!("the flush marker was answered with {f:?}"),
            });
        }
        got.clear();
        while k.receive_batch(&mut got, 4096)? > 0 {}
        report
            .alerts
            .extend(got.iter().filter(|a| a.slot != FLUSH).map(|a| Alert {
                index: a.index,
                sensor: r.sensor_ids[a.slot as usize],
                value: a.value,
                z: a.z,
            }));
        report.elapsed = start.elapsed();
        report.alerts.sort_by_key(|a| a.index);
        report.stats = read_stats(&k, sensors)?;
        Ok(report)
    })();
    k.terminate()?;
    result
}

/// The final statistics of the first `sensors` keys of a detector kernel, read with
/// `snapshot_keys` in ranges of at most `MAX_SNAPSHOT_KEYS`.
pub fn read_stats(
    k: &KernelHandle<ReadingMsg, AlertMsg>,
    sensors: usize,
) -> Result<Vec<SensorStats>, WorkloadError> {
    let sensors = sensors as u64;
    let step = resident::runtime::keyed::MAX_SNAPSHOT_KEYS as u64;
    let mut out = Vec::with_capacity(sensors as usize);
    let mut lo = 0u64;
    while lo < sensors {
        let hi = (lo + step).min(sensors);
        out.extend(k.snapshot_keys::<SensorStats>(lo as u32..hi as u32)?);
        lo = hi;
    }
    Ok(out)
}

/// The stateless baseline on `device`'s backend: the statistics live on the host between
/// micro-batches; every micro-batch uploads them and its readings into `UnifiedBuffer`s, runs
/// one one-shot kernel and downloads the statistics and scores again. On the CPU that kernel
/// is [`run_stateless_cpu`]'s closure; on CUDA and CudaSim the CUDA C kernel of
/// [`run_stateless_cuda`]; on wgpu the WGSL kernel of [`run_stateless_wgpu`].
pub fn run_stateless(
    device: &DeviceHandle,
    r: &SlottedReadings,
    batch: usize,
    progress: impl FnMut(usize),
) -> Result<RunReport, WorkloadError> {
    match device.kind() {
        BackendKind::Wgpu => run_stateless_wgpu(device, r, batch, progress),
        BackendKind::Cuda | BackendKind::CudaSim => run_stateless_cuda(device, r, batch, progress),
        BackendKind::Cpu => run_stateless_cpu(device, r, batch, progress),
    }
}

/// One micro-batch's buffers for a stateless kernel, filled by [`drive_stateless`]: `stats`
/// (every sensor's statistics, uploaded), the readings' `slots`, `values` and `tickets`
/// (the first `n` elements), and `z` for the kernel to write (NaN = no alert).
pub struct StatelessBuffers {
    /// Statistics of every sensor (at least one element).
    pub stats: UnifiedBuffer<SensorStats>,
    /// Slot per reading.
    pub slots: UnifiedBuffer<u32>,
    /// Value per reading.
    pub values: UnifiedBuffer<f64>,
    /// Ticket per reading (uploaded only when the kernel asks for them).
    pub tickets: UnifiedBuffer<u32>,
    /// Score per reading, written by the kernel.
    pub z: UnifiedBuffer<f64>,
}

/// The stateless baseline's loop, shared by every backend: per micro-batch of `batch`
/// readings, upload the statistics and the readings (and their tickets when `tickets`), run
/// `launch(buffers, n)` (one one-shot kernel over the `n` readings), download the statistics
/// and the scores, and collect the alerts. `progress(n)` after each micro-batch.
pub fn drive_stateless(
    device: &DeviceHandle,
    r: &SlottedReadings,
    batch: usize,
    tickets: bool,
    mut progress: impl FnMut(usize),
    mut launch: impl FnMut(&mut StatelessBuffers, usize) -> Result<(), WorkloadError>,
) -> Result<RunReport, WorkloadError> {
    let batch = batch.max(1);
    let sensors = r.sensor_ids.len();
    let o = BufferOptions::default();
    let mut host_stats = vec![SensorStats::default(); sensors];
    let mut b = StatelessBuffers {
        stats: UnifiedBuffer::new(device, sensors.max(1), o)?,
        slots: UnifiedBuffer::new(device, batch, o)?,
        values: UnifiedBuffer::new(device, batch, o)?,
        tickets: UnifiedBuffer::new(device, if tickets { batch } else { 1 }, o)?,
        z: UnifiedBuffer::new(device, batch, o)?,
    };
    let mut report = RunReport::default();
    let start = Instant::now();
    for lo in (0..r.slots.len()).step_by(batch) {
        let t0 = Instant::now();
        let hi = (lo + batch).min(r.slots.len());
        let n = hi - lo;
        b.stats.host_mut()?[..sensors].copy_from_slice(&host_stats); // upload
        b.slots.host_mut()?[..n].copy_from_slice(&r.slots[lo..hi]);
        b.values.host_mut()?[..n].copy_from_slice(&r.values[lo..hi]);
        if tickets {
            b.tickets.host_mut()?[..n].copy_from_slice(&r.tickets[lo..hi]);
        } else {
            b.tickets.host_mut()?;
        }
        b.z.host_mut()?;
        launch(&mut b, n)?;
        host_stats.copy_from_slice(&b.stats.host()?[..sensors]); // download
        let z = b.z.host()?;
        for (j, &zj) in z[..n].iter().enumerate() {
            if !zj.is_nan() {
                let i = lo + j;
                report.alerts.push(Alert {
                    index: i as u64,
                    sensor: r.sensor_ids[r.slots[i] as usize],
                    value: r.values[i],
                    z: zj,
                });
            }
        }
        report.batch_latency.push(t0.elapsed());
        progress(n);
    }
    report.elapsed = start.elapsed();
    report.stats = host_stats;
    Ok(report)
}

/// The stateless baseline with a CPU closure (the same `observe` per reading, in order).
pub fn run_stateless_cpu(
    device: &DeviceHandle,
    r: &SlottedReadings,
    batch: usize,
    progress: impl FnMut(usize),
) -> Result<RunReport, WorkloadError> {
    // One index walks the micro-batch in order (readings of one sensor must fold in order);
    // scores are written per reading, NaN for "no alert".
    let k = Kernel::new("anomaly_stateless").cpu(|t| {
        let n = t.scalar::<u64>(0)? as usize;
        let (slots, values) = (t.input::<u32>(1)?, t.input::<f64>(2)?);
        let (stats, z) = (t.output::<SensorStats>(3)?, t.output::<f64>(4)?);
        for i in 0..n {
            let s = slots[i] as usize;
            // SAFETY: the launch has one index, so no other index touches these elements.
            unsafe {
                let mut st = stats.read_at(s)?;
                let a = observe(&mut st, values[i]);
                stats.write_at(s, st)?;
                z.write_at(i, a.unwrap_or(f64::NAN))?;
            }
        }
        Ok(())
    });
    drive_stateless(device, r, batch, false, progress, |b, n| {
        let (sv, vv) = (b.slots.device()?, b.values.device()?);
        let (mut stv, mut zv) = (b.stats.device_mut()?, b.z.device_mut()?);
        let args = [
            KernelArg::scalar(n as u64),
            sv.arg(),
            vv.arg(),
            stv.arg(),
            zv.arg(),
        ];
        device.launch(&k, LaunchConfig::for_elements(1), &args, None)?;
        Ok(())
    })
}

/// Checks a run against the reference at f64 precision (see the module docs).
pub fn check(report: &RunReport, r: &SlottedReadings) -> Result<(), WorkloadError> {
    check_with(report, r, crate::Precision::F64)
}

/// Relative tolerance of `z` for handlers that compute in f32: a reading whose reference `z`
/// lies within it of [`Z_THRESHOLD`] may be an alert or not.
pub const Z_TOLERANCE_F32: f64 = 1e-3;
/// Relative tolerance of the final `m` and `sqrt(v)` for handlers that compute in f32 (`m`
/// relative to `max(|m|, sqrt(v))`).
pub const STATS_TOLERANCE_F32: f64 = 1e-3;
/// What f32 cannot resolve: a deviation `x - m` below about `F32_RESOLUTION * |m|` (a few f32
/// ulps of the mean) is rounding, so `sqrt(v)` is compared with that much absolute slack and a
/// score's tolerance grows by `F32_RESOLUTION * |m| / sqrt(v)` (a sensor whose readings barely
/// move has a standard deviation f32 cannot pin down).
pub const F32_RESOLUTION: f64 = 1e-6;

/// Every reading's reference score before it was folded (`None` while `v = 0`), whether its
/// sensor had seen at least [`WARMUP`] readings, and the f32 tolerance of that score.
fn reference_scores(r: &SlottedReadings, ztol: f64) -> Vec<(Option<f64>, bool, f64)> {
    let mut stats = vec![SensorStats::default(); r.sensor_ids.len()];
    r.slots
        .iter()
        .zip(&r.values)
        .map(|(&s, &x)| {
            let st = &mut stats[s as usize];
            let scored = st.n > 0 && st.v > 0.0;
            let z = scored.then(|| (x - st.m).abs() / st.v.sqrt());
            let tol = if scored {
                ztol + F32_RESOLUTION * st.m.abs() / st.v.sqrt()
            } else {
                ztol
            };
            let warm = st.n >= WARMUP;
            observe(st, x);
            (z, warm, tol)
        })
        .collect()
}

/// Checks a run against the reference: at [`crate::Precision::F64`] the same alerts (index and
/// sensor) and `z` and final statistics within relative [`TOLERANCE`]; at `F32` the same
/// alerts except readings whose reference `z` is within [`Z_TOLERANCE_F32`] of the threshold,
/// `z` within that, the counts `n` exact and `m`, `v` within [`STATS_TOLERANCE_F32`].
pub fn check_with(
    report: &RunReport,
    r: &SlottedReadings,
    precision: crate::Precision,
) -> Result<(), WorkloadError> {
    let (alerts, stats) = reference(r);
    let bad = |detail: String| WorkloadError::Mismatch {
        workload: "anomaly",
        detail,
    };
    let (ztol, stol) = match precision {
        crate::Precision::F64 => (TOLERANCE, TOLERANCE),
        crate::Precision::F32 => (Z_TOLERANCE_F32, STATS_TOLERANCE_F32),
    };
    let close = |a: f64, b: f64, tol: f64| (a - b).abs() <= tol * b.abs().max(1e-300);
    if precision == crate::Precision::F64 {
        if report.alerts.len() != alerts.len() {
            return Err(bad(format!(
                "{} alerts, reference has {}",
                report.alerts.len(),
                alerts.len()
            )));
        }
        for (got, want) in report.alerts.iter().zip(&alerts) {
            if got.index != want.index || got.sensor != want.sensor || !close(got.z, want.z, ztol) {
                return Err(bad(format!("alert {got:?}, reference {want:?}")));
            }
        }
    } else {
        let scores = reference_scores(r, ztol);
        let mut got: Vec<&Alert> = report.alerts.iter().collect();
        got.sort_by_key(|a| a.index);
        let mut g = got.iter().peekable();
        for (i, &(z, warm, ztol)) in scores.iter().enumerate() {
            let want = warm && z.is_some_and(|z| z > Z_THRESHOLD);
            let borderline = z.is_some_and(|z| close(z, Z_THRESHOLD, ztol));
            let have = g.peek().filter(|a| a.index == i as u64).map(|a| **a);
            if have.is_some() {
                g.next();
            }
            match (want, have) {
                (true, Some(a)) => {
                    let zr = z.unwrap_or(f64::NAN);
                    if a.sensor != r.sensor_ids[r.slots[i] as usize] || !close(a.z, zr, ztol) {
                        return Err(bad(format!("alert {a:?}, reference z {zr}")));
                    }
                }
                (false, None) => {}
                _ if borderline => {}
                (true, None) => {
                    return Err(bad(format!(
                        "reading {i} (z {z:?}) is an anomaly, not alerted"
                    )))
                }
                (false, Some(a)) => {
                    return Err(bad(format!("alert {a:?}, reference z {z:?} is no anomaly")))
                }
            }
        }
        if let Some(a) = g.next() {
            return Err(bad(format!(
                "alert {a:?} for no reading (duplicate or past the input)"
            )));
        }
    }
    if report.stats.len() != stats.len() {
        return Err(bad(format!(
            "statistics of {} sensors, reference has {}",
            report.stats.len(),
            stats.len()
        )));
    }
    for (i, (g, w)) in report.stats.iter().zip(&stats).enumerate() {
        let scale = w.m.abs().max(w.v.sqrt());
        let (m_ok, v_ok) = match precision {
            crate::Precision::F64 => (close(g.m, w.m, stol), close(g.v, w.v, stol)),
            crate::Precision::F32 => (
                (g.m - w.m).abs() <= stol * scale.max(1e-300),
                (g.v.max(0.0).sqrt() - w.v.sqrt()).abs()
                    <= stol * w.v.sqrt() + F32_RESOLUTION * w.m.abs(),
            ),
        };
        if g.n != w.n || !m_ok || !v_ok {
            return Err(bad(format!(
                "sensor {} statistics {g:?}, reference {w:?}",
                r.sensor_ids[i]
            )));
        }
    }
    Ok(())
}

fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The anomaly detector (`anomaly_detect`).
pub const ANOMALY_CU: &str = include_str!("anomaly.cu");
/// Its handler function.
pub const ANOMALY_FN: &str = "anomaly_detect";
/// The anomaly detector as a keyed handler: key = `ReadingMsg::slot`, per-key state
/// [`SensorStats`] (the keyed kernel's buffer `keys`); launch it with `RingKernel::key_cuda`.
pub fn anomaly_handler() -> CudaHandler<ReadingMsg, AlertMsg> {
    CudaHandler::new(ANOMALY_CU)
        .function(ANOMALY_FN)
        .keyed::<SensorStats>("slot")
}

/// The anomaly detector actor: keyed handler `anomaly` (used with `WgslHandler::keyed("slot")`).
pub const ANOMALY_WGSL: &str = include_str!("anomaly.wgsl");
