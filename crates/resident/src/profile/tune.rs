//! Tuning: measure a kernel at several batch and queue sizes, on every backend present, and
//! recommend the setting with the highest throughput that meets a p99 latency target (the way
//! cuDNN's benchmark mode tries algorithms), saying plainly whether the CPU backend or a
//! device serves the workload better.

use std::time::{Duration, Instant};

use resident_ring::Message;
use serde::{Deserialize, Serialize};

use crate::backend::{Backend, BackendKind};
use crate::runtime::Runtime;
use resident_core::runtime::kernel::RingKernel;
use resident_core::state::{Error, Result};

/// What to try.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// Batch sizes to try.
    pub batch_sizes: Vec<usize>,
    /// Queue sizes (per lane) to try.
    pub queue_sizes: Vec<usize>,
    /// Messages sent per setting.
    pub messages: usize,
    /// Latency target for the 99th percentile (send to handled).
    pub p99_target: Duration,
    /// Longest one setting may take to drain.
    pub timeout: Duration,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            batch_sizes: vec![1, 8, 64, 256],
            queue_sizes: vec![64, 1024, 8192],
            messages: 100_000,
            p99_target: Duration::from_micros(200),
            timeout: Duration::from_secs(60),
        }
    }
}

/// One measured setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunePoint {
    /// Backend it ran on (`"cpu"`, `"cuda"`).
    pub backend: String,
    /// Batch size.
    pub batch_size: usize,
    /// Queue size per lane.
    pub queue_size: usize,
    /// Messages handled per second (all sent, then drained).
    pub throughput_per_s: f64,
    /// Median latency, send to handled.
    pub p50_ns: u64,
    /// 99th percentile latency.
    pub p99_ns: u64,
    /// Whether `p99_ns` is within the target.
    pub meets_target: bool,
}

/// What [`tune`] found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneReport {
    /// The target, nanoseconds.
    pub p99_target_ns: u64,
    /// Messages per setting.
    pub messages: usize,
    /// Every setting measured, in order.
    pub points: Vec<TunePoint>,
    /// The highest-throughput setting that met the target (none if none did).
    pub recommended: Option<TunePoint>,
    /// Backends measured.
    pub backends_measured: Vec<String>,
    /// Backends not measured, with the reason.
    pub backends_absent: Vec<(String, String)>,
    /// The recommendation and the CPU-or-device answer, in words.
    pub verdict: String,
}

fn measure<In: Message, Out: Message, S: Send + 'static>(
    backend: Backend,
    kernel: RingKernel<In, Out, S>,
    message: &dyn Fn(u64) -> In,
    opts: &TuneOptions,
    batch: usize,
    queue: usize,
) -> Result<TunePoint> {
    let rt = Runtime::builder()
        .backend(backend)
        .enable_telemetry(true)
        .build()?;
    let k = rt.launch(kernel)?;
    k.activate()?;
    let receiver = {
        let k = k.clone();
        std::thread::spawn(move || {
            let mut sink = Vec::with_capacity(4096);
            // Drains outputs so a full output queue never stalls the kernel; ends when the
            // kernel terminates (receive fails).
            loop {
                sink.clear();
                match k.receive_batch(&mut sink, 4096) {
                    Ok(0) => std::thread::sleep(Duration::from_micros(50)),
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        })
    };
    let deadline = Instant::now() + opts.timeout;
    let msgs: Vec<In> = (0..opts.messages as u64).map(message).collect();
    let start = Instant::now();
    let mut sent = 0;
    while sent < msgs.len() {
        // Chunks no larger than the queue: `send_batch` stamps a chunk when it is built, so a
        // chunk that has to wait for room would count the sender's blocking as latency.
        let end = (sent + queue.clamp(1, 256)).min(msgs.len());
        match k.send_batch(&msgs[sent..end]) {
            Ok(n) => sent += n,
            Err(Error::QueueFull { .. }) | Err(Error::Timeout { .. }) => std::thread::yield_now(),
            Err(e) => return Err(e),
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                id: k.id().to_string(),
                op: crate::Op::SendBatch,
                timeout: opts.timeout,
                message: None,
            });
        }
    }
    k.drain(deadline.saturating_duration_since(Instant::now()))?;
    let elapsed = start.elapsed();
    let t = k.telemetry();
    let _ = k.terminate();
    drop(rt);
    let _ = receiver.join();
    Ok(TunePoint {
        backend: match backend {
            Backend::Cuda => "cuda".into(),
            _ => "cpu".into(),
        },
        batch_size: batch,
        queue_size: queue,
        throughput_per_s: t.messages_processed as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_ns: t.latency.p50_ns,
        p99_ns: t.latency.p99_ns,
        meets_target: t.latency.p99_ns <= opts.p99_target.as_nanos() as u64,
    })
}

fn best(points: &[TunePoint], backend: &str) -> Option<TunePoint> {
    points
        .iter()
        .filter(|p| p.backend == backend && p.meets_target)
        .max_by(|a, b| a.throughput_per_s.total_cmp(&b.throughput_per_s))
        .cloned()
}

fn fmt_us(ns: u64) -> String {
    format!("{:.1} us", ns as f64 / 1e3)
}

/// Measures `kernel(batch, queue)` (a fresh kernel per setting) on every backend present,
/// sending `opts.messages` messages made by `message(i)` as fast as the kernel accepts them,
/// and recommends the fastest setting whose p99 latency meets the target. A device backend is
/// measured only when one is present and the kernel has a device handler (`.cuda(..)`).
pub fn tune<In, Out, S, K, M>(opts: &TuneOptions, kernel: K, message: M) -> Result<TuneReport>
where
    In: Message,
    Out: Message,
    S: Send + 'static,
    K: Fn(usize, usize) -> RingKernel<In, Out, S>,
    M: Fn(u64) -> In,
{
    let mut backends = vec![Backend::Cpu];
    let mut absent = Vec::new();
    let cuda = crate::backend::probe()
        .into_iter()
        .find(|r| r.backend == BackendKind::Cuda);
    match cuda.and_then(|r| r.unavailable) {
        Some(reason) => absent.push(("cuda".to_string(), reason)),
        None if !kernel(1, 64).has_device_handler_for(BackendKind::Cuda) => absent.push((
            "cuda".to_string(),
            "a device is present but the kernel has no device handler (.cuda(..))".to_string(),
        )),
        None => backends.push(Backend::Cuda),
    }
    let mut points = Vec::new();
    for &backend in &backends {
        for &q in &opts.queue_sizes {
            for &b in &opts.batch_sizes {
                let k = kernel(b, q).batch_size(b).queue_size(q);
                points.push(measure(backend, k, &message, opts, b, q)?);
            }
        }
    }
    let cpu = best(&points, "cpu");
    let dev = best(&points, "cuda");
    let recommended = match (&cpu, &dev) {
        (Some(c), Some(d)) if d.throughput_per_s > c.throughput_per_s => Some(d.clone()),
        (Some(c), _) => Some(c.clone()),
        (None, d) => d.clone(),
    };
    let target = opts.p99_target.as_nanos() as u64;
    let mut verdict = match &recommended {
        Some(r) => format!(
            "Recommended: batch size {} and queue size {} on the {} backend: {:.0} messages/s with p99 {} \
             (target {}).",
            r.batch_size,
            r.queue_size,
            r.backend,
            r.throughput_per_s,
            fmt_us(r.p99_ns),
            fmt_us(target)
        ),
        None => {
            let fastest = points
                .iter()
                .min_by_key(|p| p.p99_ns)
                .map(|p| format!(" (lowest p99: {} at batch {}, queue {})", fmt_us(p.p99_ns), p.batch_size, p.queue_size))
                .unwrap_or_default();
            format!(
                "No setting met the p99 target of {}{fastest}: the kernel cannot drain a burst of {} messages \
                 that fast; lower the burst (smaller queue size with Reject backpressure) or make the handler cheaper.",
                fmt_us(target),
                opts.messages
            )
        }
    };
    verdict += " ";
    verdict += &match (&cpu, &dev) {
        (Some(c), Some(d)) if c.throughput_per_s >= d.throughput_per_s => format!(
            "The CPU backend serves this workload better than the device: {:.0} vs {:.0} messages/s within the \
             target, measured here on both: the work per message is too small to pay for the device's queue round \
             trip and copies.",
            c.throughput_per_s, d.throughput_per_s
        ),
        (Some(c), Some(d)) => format!(
            "The device serves this workload better than the CPU backend: {:.0} vs {:.0} messages/s within the \
             target, measured here on both.",
            d.throughput_per_s, c.throughput_per_s
        ),
        (_, _) if backends.len() == 1 => {
            let why = absent
                .iter()
                .map(|(b, r)| format!("{b}: {r}"))
                .collect::<Vec<_>>()
                .join("; ");
            let per = cpu
                .as_ref()
                .map(|c| {
                    format!(
                        " On the CPU the kernel handled a message every {:.0} ns at that setting; a device \
                         would have to beat that including its launch or queue round trip and the copies.",
                        1e9 / c.throughput_per_s
                    )
                })
                .unwrap_or_default();
            format!(
                "No device backend was present to compare ({why}), so only the CPU backend was measured and \
                 this says nothing about a GPU.{per}"
            )
        }
        _ => "No setting met the target on one of the backends, so they are not compared.".to_string(),
    };
    Ok(TuneReport {
        p99_target_ns: target,
        messages: opts.messages,
        points,
        recommended,
        backends_measured: backends
            .iter()
            .map(|b| match b {
                Backend::Cuda => "cuda".to_string(),
                _ => "cpu".to_string(),
            })
            .collect(),
        backends_absent: absent,
        verdict,
    })
}

/// Parses a duration such as `200us`, `1.5ms`, `2s`, `500ns`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let ns = match unit.trim() {
        "ns" => v,
        "us" | "µs" => v * 1e3,
        "ms" => v * 1e6,
        "s" => v * 1e9,
        _ => return None,
    };
    (ns.is_finite() && ns >= 0.0).then(|| Duration::from_nanos(ns as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("200us"), Some(Duration::from_micros(200)));
        assert_eq!(parse_duration("1.5ms"), Some(Duration::from_micros(1500)));
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("7"), None);
        assert_eq!(parse_duration("ms"), None);
        assert_eq!(parse_duration("3 parsecs"), None);
    }
}
