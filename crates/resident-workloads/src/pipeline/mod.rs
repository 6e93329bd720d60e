//! A two-stage streaming pipeline, kernel to kernel: `normalizer` clamps a raw value to
//! `0..=100` and scales it to `[0, 1]` (NaN counts as 0); the runtime forwards its outputs to
//! the scorer (`RingKernel::forward_to`); `scorer` computes `score = x^2` and a level: low below 0.3,
//! medium below 0.7, else high. The host sends to the normalizer and receives from the scorer.
//!
//! Tolerance: the kernels do the same f64 operations as [`reference()`]; checked with `1e-12`.

use std::time::{Duration, Instant};

use resident::prelude::*;

use crate::error::WorkloadError;

resident::ring::device_message! {
    /// A raw reading.
    pub struct Raw {
        /// Position in the input.
        pub seq: u64,
        /// The reading.
        pub value: f64,
    }
}

resident::ring::device_message! {
    /// A normalized reading.
    pub struct Normalized {
        /// Position in the input.
        pub seq: u64,
        /// The normalized value in `[0, 1]`.
        pub x: f64,
    }
}

resident::ring::device_message! {
    /// A scored reading; `level` is [`LOW`], [`MEDIUM`] or [`HIGH`].
    pub struct Scored {
        /// Position in the input.
        pub seq: u64,
        /// The normalized value.
        pub x: f64,
        /// Its score.
        pub score: f64,
        /// `LOW`, `MEDIUM` or `HIGH`.
        pub level: u32,
        /// Padding (zero).
        pub _pad: u32,
    }
}

/// Score below 0.3.
pub const LOW: u32 = 0;
/// Score below 0.7.
pub const MEDIUM: u32 = 1;
/// Otherwise.
pub const HIGH: u32 = 2;

/// Tolerance of the reference check.
pub const TOLERANCE: f64 = 1e-12;

/// The normalizer's function.
pub fn normalize(v: f64) -> f64 {
    if v.is_nan() {
        0.0
    } else {
        v.clamp(0.0, 100.0) / 100.0
    }
}

/// The scorer's function: (score, level).
pub fn score(x: f64) -> (f64, u32) {
    let s = x * x;
    (
        s,
        if s < 0.3 {
            LOW
        } else if s < 0.7 {
            MEDIUM
        } else {
            HIGH
        },
    )
}

/// The sequential reference.
pub fn reference(values: &[f64]) -> Vec<Scored> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let x = normalize(v);
            let (score, level) = score(x);
            Scored {
                seq: i as u64,
                x,
                score,
                level,
                _pad: 0,
            }
        })
        .collect()
}

/// Input (per lane) and output queue size of both kernels.
const QUEUE: usize = 4096;

/// The normalizer kernel: its outputs are forwarded to `scorer_id` by the runtime
/// (`RingKernel::forward_to`), so the same handler works on every backend.
pub fn normalizer(id: &str, scorer_id: &str) -> RingKernel<Raw, Normalized> {
    RingKernel::<Raw, Normalized>::new(id)
        .queue_size(QUEUE)
        .batch_size(256)
        .forward_to(scorer_id)
        .cuda(normalizer_handler())
        .wgsl(
            WgslHandler::new(PIPELINE_WGSL)
                .function("normalize")
                .declare::<Scored>(),
        )
        .handler(|_: &mut Context<()>, r: Raw| {
            Some(Normalized {
                seq: r.seq,
                x: normalize(r.value),
            })
        })
}

/// The scorer kernel.
pub fn scorer(id: &str) -> RingKernel<Normalized, Scored> {
    RingKernel::<Normalized, Scored>::new(id)
        .queue_size(QUEUE)
        .batch_size(256)
        .cuda(scorer_handler())
        .wgsl(
            WgslHandler::new(PIPELINE_WGSL)
                .function("score")
                .declare::<Raw>(),
        )
        .handler(|_: &mut Context<()>, n: Normalized| {
            let (score, level) = score(n.x);
            Some(Scored {
                seq: n.seq,
                x: n.x,
                score,
                level,
                _pad: 0,
            })
        })
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// Results in input order.
    pub scored: Vec<Scored>,
    /// Whole run.
    pub elapsed: Duration,
    /// How the normalizer's outputs reached the scorer (on the device, or relayed by the
    /// host).
    pub forwarding: resident::prelude::ForwardingStats,
}

/// Runs `values` through the two kernels launched on `rt`.
pub fn run(
    rt: &Runtime,
    values: &[f64],
    progress: impl FnMut(usize),
) -> Result<Report, WorkloadError> {
    run_with(rt, values, resident::prelude::ForwardPath::Device, progress)
}

/// [`run`] with the normalizer's outputs forwarded along `path` (`ForwardPath::HostRelay`
/// forces the host relay, the baseline of device-side forwarding).
pub fn run_with(
    rt: &Runtime,
    values: &[f64],
    path: resident::prelude::ForwardPath,
    mut progress: impl FnMut(usize),
) -> Result<Report, WorkloadError> {
    let tag = unique();
    let (nid, sid) = (format!("normalizer-{tag}"), format!("scorer-{tag}"));
    let batch = crate::batch_size(crate::kind_of(rt.backend()), 256);
    let s = rt.launch(scorer(&sid).batch_size(batch))?;
    let n = rt.launch(normalizer(&nid, &sid).batch_size(batch).forward_path(path))?;
    s.activate()?;
    n.activate()?;
    let t = Instant::now();
    let result = (|| {
        let mut scored = Vec::with_capacity(values.len());
        let msgs: Vec<Raw> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| Raw {
                seq: i as u64,
                value: v,
            })
            .collect();
        // At most the scorer's output queue's size unanswered: with more, on a slow backend
        // (CudaSim) the output queue, both input queues and the send would fill up and the
        // send would time out while this thread is not receiving.
        let window = QUEUE;
        let wait = Duration::from_secs(30);
        let timeout = |e: resident::Error| match e {
            resident::Error::Timeout { .. } => WorkloadError::Timeout {
                workload: "pipeline",
                waited: wait,
            },
            e => e.into(),
        };
        let mut buf = Vec::with_capacity(window);
        let mut sent = 0;
        while scored.len() < values.len() {
            let room = window - (sent - scored.len());
            if room > 0 && sent < msgs.len() {
                let end = (sent + room.min(1024)).min(msgs.len());
                let k = n.send_batch(&msgs[sent..end])?;
                sent += k;
                progress(k);
            }
            buf.clear();
            if s.receive_batch(&mut buf, window)? > 0 {
                scored.extend_from_slice(&buf);
            } else if sent == msgs.len() || sent - scored.len() == window {
                // Nothing ready and nothing more to send now: wait for the next answer.
                scored.push(s.receive(wait).map_err(timeout)?);
            }
        }
        let elapsed = t.elapsed();
        Ok(Report {
            scored,
            elapsed,
            forwarding: n.forwarding(),
        })
    })();
    n.terminate()?;
    s.terminate()?;
    result
}

/// Checks results against the reference, in order, at f64 precision.
pub fn check(got: &[Scored], values: &[f64]) -> Result<(), WorkloadError> {
    check_with(got, values, crate::Precision::F64)
}

/// Tolerance of `x` and `score` for handlers that compute in f32 (`x` in `[0, 1]`: about 4
/// f32 ulps of 1).
pub const TOLERANCE_F32: f64 = 5e-7;

/// Checks results against the reference, in order: `x` and `score` within [`TOLERANCE`] (f64)
/// or [`TOLERANCE_F32`] (f32); the level must match, except where the reference score lies
/// within that tolerance of a level boundary (0.3, 0.7), where either side is right.
pub fn check_with(
    got: &[Scored],
    values: &[f64],
    precision: crate::Precision,
) -> Result<(), WorkloadError> {
    let tol = match precision {
        crate::Precision::F64 => TOLERANCE,
        crate::Precision::F32 => TOLERANCE_F32,
    };
    let want = reference(values);
    let bad = |detail: String| WorkloadError::Mismatch {
        workload: "pipeline",
        detail,
    };
    if got.len() != want.len() {
        return Err(bad(format!(
            "{} results for {} inputs",
            got.len(),
            want.len()
        )));
    }
    for (g, w) in got.iter().zip(&want) {
        let near_boundary = [0.3, 0.7].iter().any(|b| (w.score - b).abs() <= tol);
        if g.seq != w.seq
            || (g.level != w.level && !near_boundary)
            || (g.x - w.x).abs() > tol
            || (g.score - w.score).abs() > tol
        {
            return Err(bad(format!("{g:?}, reference {w:?}")));
        }
    }
    Ok(())
}

fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The pipeline's two stages (`pipeline_normalize`, `pipeline_score`; templates, so each
/// kernel instantiates only its own).
pub const PIPELINE_CU: &str = include_str!("pipeline.cu");
/// The normalizer's handler function.
pub const NORMALIZE_FN: &str = "pipeline_normalize";
/// The scorer's handler function.
pub const SCORE_FN: &str = "pipeline_score";
/// The pipeline's normalizer (function `normalize`) and scorer (function `score`).
pub const PIPELINE_WGSL: &str = include_str!("pipeline.wgsl");

/// The pipeline's normalizer.
pub fn normalizer_handler() -> CudaHandler<Raw, Normalized> {
    CudaHandler::new(PIPELINE_CU).function(NORMALIZE_FN)
}

/// The pipeline's scorer.
pub fn scorer_handler() -> CudaHandler<Normalized, Scored> {
    CudaHandler::new(PIPELINE_CU).function(SCORE_FN)
}
