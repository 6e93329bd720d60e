//! The two demo workloads that `resident serve --demo` puts on NATS, as ring kernels, with
//! their JSON wire types. The definitions are `resident-workloads`' (issue 11), not a copy:
//!
//! * **pipeline**: the pipeline workload's two kernels ([`pipeline::normalizer`] and
//!   [`pipeline::scorer`]): the normalizer (clamp to 0..100, scale to [0, 1]) forwards kernel
//!   to kernel to the scorer (x^2; `low` below 0.3, `medium` below 0.7, else `high`). A reply
//!   cannot come back through `call` across two kernels (the scorer's output correlates with
//!   the normalizer's output, not with the caller), so [`Pipeline`] is the call-equivalent: it
//!   tags each input (the workload's `seq`), sends it to the normalizer, and one collector
//!   thread routes the scorer's outputs back to their callers by tag.
//! * **anomaly**: one kernel keeps per-sensor EWMA statistics (a = 0.01) in its state, folded
//!   by the anomaly workload's [`anomaly::score_and_fold`]: the first reading sets m = x,
//!   v = 0; every later reading is scored z = |x - m| / sqrt(v) (z = 0 and no anomaly while
//!   v = 0), then folded in: d = x - m; m += a d; v = (1 - a)(v + a d^2). Anomaly when z > 4.0
//!   and the sensor had already seen at least 100 readings before this one. The workload's own
//!   kernel is keyed over dense sensor slots and answers anomalies only; served over NATS every
//!   reading needs its verdict, and sensors are any `u32`, so this kernel is the demo's own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytemuck::{Pod, Zeroable};
use parking_lot::Mutex;
use resident::prelude::*;
use resident_workloads::pipeline::{Normalized, Raw, Scored};
use resident_workloads::{anomaly, pipeline};
use serde::{Deserialize, Serialize};

use crate::service::Service;

/// EWMA weight of the anomaly detector.
pub const ANOMALY_ALPHA: f64 = anomaly::ALPHA;
/// z above which a reading is an anomaly.
pub const ANOMALY_Z: f64 = anomaly::Z_THRESHOLD;
/// Readings a sensor must have seen before one of its readings can be an anomaly.
pub const ANOMALY_WARMUP: u64 = anomaly::WARMUP;

// ---------------------------------------------------------------------------------------------
// Reference definitions (plain f64; the workloads'), used by the kernels and by the tests.

/// The normalizer: clamp to 0..100, scale to [0, 1]. NaN becomes 0.
pub use resident_workloads::pipeline::normalize;

/// The scorer's class of a normalized value's score.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// score < 0.3
    Low,
    /// 0.3 <= score < 0.7
    Medium,
    /// score >= 0.7
    High,
}

impl Class {
    /// The class of the pipeline workload's `level` ([`pipeline::LOW`], `MEDIUM`, `HIGH`).
    fn of_level(level: u32) -> Class {
        match level {
            pipeline::LOW => Class::Low,
            pipeline::MEDIUM => Class::Medium,
            _ => Class::High,
        }
    }
}

/// The scorer: score = x^2 and its class.
pub fn score(x: f64) -> (f64, Class) {
    let (s, level) = pipeline::score(x);
    (s, Class::of_level(level))
}

/// Per-sensor EWMA statistics: the anomaly workload's ([`anomaly::SensorStats`]: mean `m`,
/// variance `v`, readings seen `n`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SensorStats(pub anomaly::SensorStats);

impl SensorStats {
    /// Scores `x` against the statistics so far, then folds it in. Returns (anomaly, z), z = 0
    /// on the sensor's first reading and while its variance is 0.
    pub fn observe(&mut self, x: f64) -> (bool, f64) {
        let (z, anomaly) = anomaly::score_and_fold(&mut self.0, x);
        (anomaly, z.unwrap_or(0.0))
    }
}

// ---------------------------------------------------------------------------------------------
// Messages (Pod: they are also the raw wire format under `PodCodec`).

/// Pipeline input: a raw value and the tag [`Pipeline`] routes the answer by.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct PipelineIn {
    /// The reading, any number (clamped by the normalizer).
    pub value: f64,
    /// Set by [`Pipeline::call`]; callers leave it 0.
    pub tag: u64,
}

/// Pipeline output.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct PipelineOut {
    /// x^2.
    pub score: f64,
    /// 0 low, 1 medium, 2 high.
    pub class: u32,
    /// Padding (0).
    pub _pad: u32,
    /// The input's tag.
    pub tag: u64,
}

/// Anomaly input.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Reading {
    /// The value.
    pub value: f64,
    /// Sensor id.
    pub sensor: u32,
    /// Padding (0).
    pub _pad: u32,
}

/// Anomaly output.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct Verdict {
    /// The reading's z score (0 while the sensor's variance is 0).
    pub z: f64,
    /// 1 when the reading is an anomaly.
    pub anomaly: u32,
    /// Padding (0).
    pub _pad: u32,
}

// ---------------------------------------------------------------------------------------------
// JSON wire types.

/// `{"value": <number>}`
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineRequest {
    /// The reading.
    pub value: f64,
}

/// `{"score": <number>, "class": "low"|"medium"|"high"}`
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PipelineReply {
    /// x^2 of the normalized value.
    pub score: f64,
    /// Its class.
    pub class: Class,
}

/// `{"sensor": <int>, "value": <number>}`
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnomalyRequest {
    /// Sensor id (a non-negative integer that fits u32).
    pub sensor: u32,
    /// The reading.
    pub value: f64,
}

/// `{"anomaly": <bool>, "z": <number>}`
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnomalyReply {
    /// Whether the reading is an anomaly.
    pub anomaly: bool,
    /// Its z score.
    pub z: f64,
}

impl From<PipelineRequest> for PipelineIn {
    fn from(r: PipelineRequest) -> Self {
        PipelineIn {
            value: r.value,
            tag: 0,
        }
    }
}

impl From<PipelineOut> for PipelineReply {
    fn from(o: PipelineOut) -> Self {
        PipelineReply {
            score: o.score,
            class: Class::of_level(o.class),
        }
    }
}

impl From<PipelineIn> for Raw {
    /// The tag travels through both kernels as the workload's `seq`.
    fn from(m: PipelineIn) -> Self {
        Raw {
            seq: m.tag,
            value: m.value,
        }
    }
}

impl From<Scored> for PipelineOut {
    fn from(s: Scored) -> Self {
        PipelineOut {
            score: s.score,
            class: s.level,
            _pad: 0,
            tag: s.seq,
        }
    }
}

impl From<AnomalyRequest> for Reading {
    fn from(r: AnomalyRequest) -> Self {
        Reading {
            value: r.value,
            sensor: r.sensor,
            _pad: 0,
        }
    }
}

impl From<Verdict> for AnomalyReply {
    fn from(v: Verdict) -> Self {
        AnomalyReply {
            anomaly: v.anomaly != 0,
            z: v.z,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels.

/// Options shared by the demo kernels.
#[derive(Clone, Copy, Debug)]
pub struct DemoOptions {
    /// Messages per input lane (and the in-flight limit the server uses).
    pub queue_size: usize,
    /// Simulated device time per message (0 = none): makes a slow kernel for tests of
    /// backpressure and of a worker dying with messages in flight (the CPU handlers: the
    /// anomaly kernel, and the pipeline's normalizer where it runs on the CPU).
    pub delay: Duration,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            queue_size: 1024,
            delay: Duration::ZERO,
        }
    }
}

/// The anomaly kernel: `RingKernel<Reading, Verdict>` with per-sensor statistics as its state.
pub fn launch_anomaly(
    rt: &Runtime,
    id: &str,
    opts: DemoOptions,
) -> resident::Result<KernelHandle<Reading, Verdict>> {
    let delay = opts.delay;
    let k = rt.launch(
        RingKernel::<Reading, Verdict>::new(id)
            .queue_size(opts.queue_size)
            .backpressure(Backpressure::Block(Duration::from_secs(1)))
            .state(HashMap::<u32, SensorStats>::new())
            .handler(
                move |ctx: &mut Context<HashMap<u32, SensorStats>>, r: Reading| {
                    if !delay.is_zero() {
                        std::thread::sleep(delay);
                    }
                    let (anomaly, z) = ctx
                        .state_mut()
                        .entry(r.sensor)
                        .or_default()
                        .observe(r.value);
                    Some(Verdict {
                        z,
                        anomaly: anomaly as u32,
                        _pad: 0,
                    })
                },
            ),
    )?;
    k.activate()?;
    Ok(k)
}

/// The two-kernel pipeline as a [`Service`]: `call` tags the input, sends it to the normalizer
/// kernel, whose outputs the runtime forwards (kernel to kernel) to the scorer kernel; a
/// collector thread takes the scorer's outputs and hands each to the caller waiting for its
/// tag.
pub struct Pipeline {
    normalizer: KernelHandle<Raw, Normalized>,
    scorer: KernelHandle<Normalized, Scored>,
    waiters: Arc<Mutex<HashMap<u64, SyncSender<PipelineOut>>>>,
    next_tag: AtomicU64,
    stop: Arc<AtomicBool>,
    collector: Option<JoinHandle<()>>,
    late: Arc<AtomicU64>,
}

impl Pipeline {
    /// Launches `<prefix>-normalizer` and `<prefix>-scorer` on `rt`, activated: the pipeline
    /// workload's kernels ([`pipeline::normalizer`], [`pipeline::scorer`]) with the demo's
    /// queue size and backpressure. Like every workload kernel they run where `rt` runs
    /// device kernels (the workload's CUDA C on CUDA and CudaSim, in f64; its WGSL on wgpu, in
    /// f32) and on the CPU otherwise; `opts.delay` slows the CPU normalizer only.
    pub fn launch(rt: &Runtime, prefix: &str, opts: DemoOptions) -> resident::Result<Pipeline> {
        let scorer_id = format!("{prefix}-scorer");
        // Under Block backpressure a full scorer queue makes the normalizer wait for room; if
        // it still fails the caller's wait times out (a typed Timeout), nothing panics.
        let block = Backpressure::Block(Duration::from_secs(1));
        let scorer = rt.launch(
            pipeline::scorer(&scorer_id)
                .queue_size(opts.queue_size)
                .backpressure(block),
        )?;
        let mut normalizer = pipeline::normalizer(&format!("{prefix}-normalizer"), &scorer_id)
            .queue_size(opts.queue_size)
            .backpressure(block);
        let delay = opts.delay;
        if !delay.is_zero() {
            // The slow kernel of the tests: the workload's normalizer, after the delay.
            normalizer = normalizer.handler(move |_ctx: &mut Context<()>, r: Raw| {
                std::thread::sleep(delay);
                Some(Normalized {
                    seq: r.seq,
                    x: normalize(r.value),
                })
            });
        }
        let normalizer = rt.launch(normalizer)?;
        scorer.activate()?;
        normalizer.activate()?;
        let waiters: Arc<Mutex<HashMap<u64, SyncSender<PipelineOut>>>> = Default::default();
        let stop = Arc::new(AtomicBool::new(false));
        let late = Arc::new(AtomicU64::new(0));
        let collector = {
            let (scorer, waiters, stop, late) =
                (scorer.clone(), waiters.clone(), stop.clone(), late.clone());
            std::thread::Builder::new()
                .name(format!("{prefix}-collector"))
                .spawn(move || {
                    // Bounded: every receive waits at most 50 ms, and the loop ends when
                    // `stop` is set or the scorer is gone.
                    while !stop.load(Ordering::Acquire) {
                        match scorer.receive(Duration::from_millis(50)) {
                            Ok(scored) => match waiters.lock().remove(&scored.seq) {
                                Some(tx) => {
                                    let _ = tx.try_send(PipelineOut::from(scored));
                                }
                                None => {
                                    late.fetch_add(1, Ordering::Relaxed);
                                }
                            },
                            Err(resident::Error::Timeout { .. }) => {}
                            Err(_) => break,
                        }
                    }
                })
                .map_err(|source| resident::Error::Spawn {
                    id: format!("{prefix}-collector"),
                    source,
                })?
        };
        Ok(Pipeline {
            normalizer,
            scorer,
            waiters,
            next_tag: AtomicU64::new(1),
            stop,
            collector: Some(collector),
            late,
        })
    }

    /// The normalizer kernel (first stage).
    pub fn normalizer(&self) -> &KernelHandle<Raw, Normalized> {
        &self.normalizer
    }

    /// The scorer kernel (second stage).
    pub fn scorer(&self) -> &KernelHandle<Normalized, Scored> {
        &self.scorer
    }

    /// Outputs that arrived after their caller had given up.
    pub fn late_outputs(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }
}

impl Service for Pipeline {
    type In = PipelineIn;
    type Out = PipelineOut;

    fn call(&self, msg: PipelineIn, timeout: Duration) -> resident::Result<PipelineOut> {
        let started = self.start(msg)?;
        self.finish(started, Instant::now() + timeout, timeout)
    }

    /// Sends every input to the normalizer first, then collects the answers (all waited for
    /// until `timeout` after the start), so a batch flows through both kernels together.
    fn call_batch(
        &self,
        msgs: Vec<PipelineIn>,
        timeout: Duration,
    ) -> Vec<resident::Result<PipelineOut>> {
        let deadline = Instant::now() + timeout;
        let started: Vec<_> = msgs.into_iter().map(|m| self.start(m)).collect();
        started
            .into_iter()
            .map(|s| self.finish(s?, deadline, timeout))
            .collect()
    }
}

impl Pipeline {
    /// Tags `msg`, registers its waiter and sends it to the normalizer.
    fn start(&self, mut msg: PipelineIn) -> resident::Result<(u64, Receiver<PipelineOut>)> {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        msg.tag = tag;
        let (tx, rx) = sync_channel(1);
        self.waiters.lock().insert(tag, tx);
        if let Err(e) = self.normalizer.send(Raw::from(msg)) {
            self.waiters.lock().remove(&tag);
            return Err(e);
        }
        Ok((tag, rx))
    }

    /// Waits until `deadline` for the answer of a started input.
    fn finish(
        &self,
        (tag, rx): (u64, Receiver<PipelineOut>),
        deadline: Instant,
        timeout: Duration,
    ) -> resident::Result<PipelineOut> {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(out) => Ok(out),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                self.waiters.lock().remove(&tag);
                // The collector may have delivered between the timeout and the removal.
                if let Ok(out) = rx.try_recv() {
                    return Ok(out);
                }
                Err(resident::Error::Timeout {
                    id: self.normalizer.id().to_string(),
                    op: resident::Op::Call,
                    timeout,
                    message: None,
                })
            }
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.collector.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_anomaly(readings: &[(u32, f64)]) -> Vec<(bool, f64)> {
        // An independent, deliberately plain version: counts, means and variances in vectors.
        let mut count = vec![0u64; 64];
        let mut m = vec![0f64; 64];
        let mut v = vec![0f64; 64];
        let mut out = Vec::new();
        for &(s, x) in readings {
            let s = s as usize;
            if count[s] == 0 {
                m[s] = x;
                v[s] = 0.0;
                count[s] = 1;
                out.push((false, 0.0));
                continue;
            }
            let z = if v[s] == 0.0 {
                0.0
            } else {
                (x - m[s]).abs() / v[s].sqrt()
            };
            out.push((v[s] != 0.0 && z > 4.0 && count[s] >= 100, z));
            let d = x - m[s];
            m[s] += 0.01 * d;
            v[s] = (1.0 - 0.01) * (v[s] + 0.01 * d * d);
            count[s] += 1;
        }
        out
    }

    /// A small deterministic generator (xorshift) so the test needs no crate.
    fn readings(n: usize) -> Vec<(u32, f64)> {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|i| {
                let sensor = (next() * 8.0) as u32;
                let mut x = 20.0 + next() * 2.0;
                if i > 2000 && i % 397 == 0 {
                    x += 40.0; // spike
                }
                (sensor, x)
            })
            .collect()
    }

    #[test]
    fn pipeline_kernels_match_the_reference() {
        let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
        let p = Pipeline::launch(&rt, "p", DemoOptions::default()).unwrap();
        for value in [
            -5.0,
            0.0,
            10.0,
            54.7,
            54.8,
            83.6,
            83.7,
            100.0,
            250.0,
            f64::NAN,
        ] {
            let out = p
                .call(PipelineIn { value, tag: 0 }, Duration::from_secs(5))
                .unwrap();
            let x = normalize(value);
            let (s, c) = (x * x, x * x);
            let class = if c < 0.3 {
                Class::Low
            } else if c < 0.7 {
                Class::Medium
            } else {
                Class::High
            };
            let reply = PipelineReply::from(out);
            assert_eq!(reply.score, s, "value {value}");
            assert_eq!(reply.class, class, "value {value}");
        }
        assert_eq!(score(0.5478).1, Class::Medium);
        assert_eq!(score(0.5477).1, Class::Low);
        assert_eq!(score(0.8366).1, Class::Medium);
        assert_eq!(score(0.8367).1, Class::High);
    }

    #[test]
    fn pipeline_serves_concurrent_callers() {
        let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
        let p = Arc::new(Pipeline::launch(&rt, "pc", DemoOptions::default()).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for i in 0..500 {
                        let value = ((t * 500 + i) % 101) as f64;
                        let out = p
                            .call(PipelineIn { value, tag: 0 }, Duration::from_secs(5))
                            .unwrap();
                        assert_eq!(out.score, score(normalize(value)).0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(p.late_outputs(), 0);
    }

    #[test]
    fn anomaly_kernel_matches_the_reference() {
        let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
        let k = launch_anomaly(&rt, "a", DemoOptions::default()).unwrap();
        let input = readings(6000);
        let expected = reference_anomaly(&input);
        let mut anomalies = 0;
        for (&(sensor, value), &(anomaly, z)) in input.iter().zip(&expected) {
            let v = k
                .call(
                    Reading {
                        value,
                        sensor,
                        _pad: 0,
                    },
                    Duration::from_secs(5),
                )
                .unwrap();
            let r = AnomalyReply::from(v);
            assert_eq!(r.anomaly, anomaly);
            assert!(
                (r.z - z).abs() <= 1e-12 * z.abs().max(1.0),
                "{} vs {z}",
                r.z
            );
            anomalies += anomaly as usize;
        }
        assert!(anomalies > 5, "the spikes are found ({anomalies})");
        // The first 100 readings of a sensor never alert, whatever their z.
        let mut st = SensorStats::default();
        st.observe(1.0);
        st.observe(1.1);
        assert!(!st.observe(1000.0).0);
    }

    /// `call_batch` on a kernel (sends the whole batch, then collects) answers every input in
    /// order, with the state carried from batch to batch exactly as one call at a time does.
    #[test]
    fn anomaly_call_batch_matches_the_reference_in_order() {
        let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
        let k = launch_anomaly(&rt, "ab", DemoOptions::default()).unwrap();
        let input = readings(3000);
        let expected = reference_anomaly(&input);
        let mut got = Vec::new();
        // Uneven batch sizes, up to the queue size (64).
        for chunk in input.chunks(61) {
            let msgs = chunk
                .iter()
                .map(|&(sensor, value)| Reading {
                    value,
                    sensor,
                    _pad: 0,
                })
                .collect();
            let outs = Service::call_batch(&k, msgs, Duration::from_secs(5));
            assert_eq!(outs.len(), chunk.len());
            got.extend(outs.into_iter().map(|o| AnomalyReply::from(o.unwrap())));
        }
        for (r, &(anomaly, z)) in got.iter().zip(&expected) {
            assert_eq!(r.anomaly, anomaly);
            assert!((r.z - z).abs() <= 1e-12 * z.abs().max(1.0));
        }
        assert_eq!(got.len(), expected.len());
        // An empty batch is an empty answer, not a wait.
        assert!(Service::call_batch(&k, Vec::new(), Duration::from_secs(5)).is_empty());
    }

    #[test]
    fn pipeline_call_batch_answers_each_input() {
        let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
        let p = Pipeline::launch(&rt, "pb", DemoOptions::default()).unwrap();
        let values: Vec<f64> = (0..50).map(|i| (i * 7 % 101) as f64).collect();
        let msgs = values
            .iter()
            .map(|&value| PipelineIn { value, tag: 0 })
            .collect();
        let outs = p.call_batch(msgs, Duration::from_secs(5));
        assert_eq!(outs.len(), values.len());
        for (out, &value) in outs.into_iter().zip(&values) {
            assert_eq!(out.unwrap().score, score(normalize(value)).0);
        }
        assert_eq!(p.late_outputs(), 0);
    }

    /// With a delay the normalizer is the demo's slow kernel, and still the workload's
    /// normalizer: the same answers, in order.
    #[test]
    fn pipeline_with_a_delay_answers_as_without() {
        let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
        let opts = DemoOptions {
            delay: Duration::from_millis(1),
            ..DemoOptions::default()
        };
        let p = Pipeline::launch(&rt, "pd", opts).unwrap();
        let values = [-1.0, 30.0, 54.8, 83.7, f64::NAN];
        let msgs = values
            .iter()
            .map(|&value| PipelineIn { value, tag: 0 })
            .collect();
        let outs = p.call_batch(msgs, Duration::from_secs(5));
        for (out, &value) in outs.into_iter().zip(&values) {
            let reply = PipelineReply::from(out.unwrap());
            let (score, class) = score(normalize(value));
            assert_eq!(reply, PipelineReply { score, class }, "value {value}");
        }
        assert_eq!(p.late_outputs(), 0);
    }

    /// A batch whose replies cannot come in time fails each input with a timeout within
    /// the one batch timeout (not one timeout per input).
    #[test]
    fn call_batch_timeout_bounds_the_whole_batch() {
        let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
        let k = launch_anomaly(
            &rt,
            "at",
            DemoOptions {
                delay: Duration::from_millis(50),
                ..DemoOptions::default()
            },
        )
        .unwrap();
        let msgs = (0..10)
            .map(|i| Reading {
                value: i as f64,
                sensor: 1,
                _pad: 0,
            })
            .collect();
        let t0 = Instant::now();
        let outs = Service::call_batch(&k, msgs, Duration::from_millis(120));
        let took = t0.elapsed();
        assert_eq!(outs.len(), 10);
        assert!(outs[0].is_ok(), "{:?}", outs[0].as_ref().err());
        assert!(matches!(
            outs[9],
            Err(resident::Error::Timeout {
                op: resident::Op::Call,
                ..
            })
        ));
        // 10 x 50 ms of work, one 120 ms bound: the batch gives up well before 10 timeouts.
        assert!(took < Duration::from_millis(1000), "{took:?}");
    }
}
