//! Kernel telemetry: counters, a lock-free latency histogram, throughput over a recent window,
//! and the Prometheus text export.
//!
//! Counters are always kept (a few relaxed atomic adds per batch). With telemetry disabled on
//! the builder, latency recording and throughput sampling are skipped.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::state::KernelState;

/// Sub-buckets per power of two: values are kept to within 1/16 (about 6%).
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// Values below `2 * SUB` have a bucket each; above, `SUB` buckets per power of two.
const BUCKETS: usize = (2 * SUB + (64 - SUB_BITS as u64 - 1) * SUB) as usize;

/// A log-linear histogram of nanosecond values; recording is one relaxed atomic add.
pub struct LatencyHistogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }
}

fn bucket_of(v: u64) -> usize {
    if v < 2 * SUB {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros() as u64; // >= SUB_BITS + 1
    let sub = (v >> (msb - SUB_BITS as u64)) & (SUB - 1);
    (2 * SUB + (msb - SUB_BITS as u64 - 1) * SUB + sub) as usize
}

/// The largest value that falls in bucket `b` (so percentiles never under-report).
fn bucket_high(b: usize) -> u64 {
    let b = b as u64;
    if b < 2 * SUB {
        return b;
    }
    let msb = (b - 2 * SUB) / SUB + SUB_BITS as u64 + 1;
    let sub = (b - 2 * SUB) % SUB;
    let low = (1u64 << msb) | (sub << (msb - SUB_BITS as u64));
    low + ((1u64 << (msb - SUB_BITS as u64)) - 1)
}

impl LatencyHistogram {
    /// Records one value in nanoseconds.
    pub fn record(&self, ns: u64) {
        self.buckets[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(ns, Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
    }

    /// Percentiles of everything recorded so far.
    pub fn summary(&self) -> LatencySummary {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let count: u64 = counts.iter().sum();
        let max = self.max.load(Ordering::Relaxed);
        let quantile = |q: f64| -> u64 {
            if count == 0 {
                return 0;
            }
            let rank = ((q * count as f64).ceil() as u64).clamp(1, count);
            let mut seen = 0;
            for (b, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return bucket_high(b).min(max);
                }
            }
            max
        };
        LatencySummary {
            count,
            mean_ns: self
                .sum
                .load(Ordering::Relaxed)
                .checked_div(count)
                .unwrap_or(0),
            p50_ns: quantile(0.50),
            p95_ns: quantile(0.95),
            p99_ns: quantile(0.99),
            p999_ns: quantile(0.999),
            max_ns: max,
        }
    }
}

/// Latency percentiles from send to response (or to the end of processing when the handler
/// returns no output), in nanoseconds, within about 6%.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Mean.
    pub mean_ns: u64,
    /// Median.
    pub p50_ns: u64,
    /// 95th percentile.
    pub p95_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest value.
    pub max_ns: u64,
}

/// How far back `throughput` looks.
pub const THROUGHPUT_WINDOW: Duration = Duration::from_secs(1);

/// A count an engine keeps and the core reads when asked (the outputs a forward target's
/// kernel has taken from this kernel's device ring in the current link).
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub type LiveCount = Box<dyn Fn() -> u64 + Send>;

/// The live counters of one kernel, written by its thread and its senders.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub struct KernelMetrics {
    pub enabled: bool,
    pub started: Instant,
    pub processed: AtomicU64,
    pub batches: AtomicU64,
    pub errors: AtomicU64,
    pub late_replies: AtomicU64,
    /// Outputs a device kernel lost because it had to exit with its output ring full.
    pub device_undelivered: AtomicU64,
    /// Outputs produced by a host thread that terminate had already given up on (abandoned):
    /// its report was built, so they are counted as dropped.
    pub late_outputs: AtomicU64,
    /// Inputs a device took and never handled because it did not stop when asked.
    pub lost_in_device: AtomicU64,
    /// Inputs not handled because their deadline had passed when the kernel took them.
    pub expired: AtomicU64,
    /// Device-side forwarding: outputs the forward target's kernel took in links that ended,
    /// and what it has taken in the current link so far (read live from the engine's ring), so
    /// `KernelHandle::forwarding` is exact.
    pub forwarded_device: Mutex<(u64, Option<LiveCount>)>,
    /// Outputs this kernel's host thread relayed into its forward target's input queue.
    pub forwarded_host: AtomicU64,
    /// Inputs this kernel's device took straight from a producer's output ring (they never
    /// entered its input queue): part of `messages_received`.
    pub peer_received: AtomicU64,
    pub latency: LatencyHistogram,
    /// (time, processed) samples for the throughput window; oldest first.
    samples: Mutex<VecDeque<(Instant, u64)>>,
    last_sample_ns: AtomicU64,
}

impl KernelMetrics {
    pub fn new(enabled: bool) -> Self {
        let started = Instant::now();
        KernelMetrics {
            enabled,
            started,
            processed: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            late_replies: AtomicU64::new(0),
            device_undelivered: AtomicU64::new(0),
            late_outputs: AtomicU64::new(0),
            lost_in_device: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            forwarded_device: Mutex::new((0, None)),
            forwarded_host: AtomicU64::new(0),
            peer_received: AtomicU64::new(0),
            latency: LatencyHistogram::default(),
            samples: Mutex::new(VecDeque::from([(started, 0)])),
            last_sample_ns: AtomicU64::new(0),
        }
    }

    /// Counts `n` handled messages. Only the kernel's own thread writes `processed`, so a plain
    /// load and store suffice (no locked read-modify-write on the hot path). Call it before
    /// publishing the messages' outputs, so whoever sees an output also sees it counted.
    pub fn messages_done(&self, n: u64) {
        let p = self.processed.load(Ordering::Relaxed);
        // Release: pairs with the Acquire load in `KernelHandle::telemetry`, so a reader that
        // sees this count also sees the batch counted before it (`batch_taken`).
        self.processed.store(p + n, Ordering::Release);
    }

    /// Counts a batch as soon as it is taken, before any of its messages counts as processed,
    /// so a reader never sees `batches: 0` beside a processed message. One writer (the kernel's
    /// host thread): a plain load and store.
    pub fn batch_taken(&self) {
        self.batches
            .store(self.batches.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// After a batch: every 50 ms at most, samples the throughput window.
    pub fn batch_done(&self, now: Instant) {
        let total = self.processed.load(Ordering::Relaxed);
        if self.enabled {
            let at = now.duration_since(self.started).as_nanos() as u64;
            if at.saturating_sub(self.last_sample_ns.load(Ordering::Relaxed)) >= 50_000_000 {
                self.last_sample_ns.store(at, Ordering::Relaxed);
                self.sample(now, total);
            }
        }
    }

    fn sample(&self, now: Instant, total: u64) {
        let mut s = self.samples.lock();
        s.push_back((now, total));
        while s.len() > 2 && now.duration_since(s[1].0) > 2 * THROUGHPUT_WINDOW {
            s.pop_front();
        }
    }

    /// Messages per second over about the last [`THROUGHPUT_WINDOW`].
    pub fn throughput(&self) -> f64 {
        if !self.enabled {
            return 0.0;
        }
        let now = Instant::now();
        let total = self.processed.load(Ordering::Relaxed);
        self.sample(now, total);
        let s = self.samples.lock();
        // The newest sample at least one window old, else the oldest we have.
        let base = s
            .iter()
            .rev()
            .find(|(t, _)| now.duration_since(*t) >= THROUGHPUT_WINDOW)
            .or(s.front())
            .copied()
            .unwrap_or((self.started, 0));
        let secs = now.duration_since(base.0).as_secs_f64();
        if secs <= 0.0 {
            0.0
        } else {
            (total - base.1) as f64 / secs
        }
    }
}

/// A snapshot of one kernel's telemetry.
#[derive(Clone, Debug, PartialEq)]
pub struct Telemetry {
    /// Kernel id.
    pub kernel_id: String,
    /// Lifecycle state.
    pub state: KernelState,
    /// Messages accepted into the input queue.
    pub messages_received: u64,
    /// Messages the handler has finished.
    pub messages_processed: u64,
    /// Messages discarded by a drop policy (input and output) or replies that came after their
    /// caller gave up.
    pub messages_dropped: u64,
    /// Sends refused (full, timed out, not accepting); those messages went back to the sender.
    pub messages_refused: u64,
    /// Messages not handled because their deadline (a `call`'s timeout, a send's TTL) had
    /// passed when the kernel took them; a `call`'s caller got `Error::Timeout`.
    pub messages_expired: u64,
    /// Messages this kernel received straight from a producer on the device
    /// (`RingKernel::forward_to` between two kernels of one device engine, counted at the
    /// consumer): they never passed through the input queue, and they are counted in
    /// `messages_received` (and in `messages_processed` once handled). 0 for messages
    /// forwarded through the host (CPU kernels, `ForwardPath::HostRelay`).
    pub forwarded_on_device: u64,
    /// Handler failures (panics).
    pub errors: u64,
    /// Messages waiting in the input queue now.
    pub queue_depth: usize,
    /// Outputs waiting to be received now.
    pub output_depth: usize,
    /// Batches the kernel has drained.
    pub batches: u64,
    /// Processed messages per second over about the last second.
    pub throughput: f64,
    /// Send -> response latency.
    pub latency: LatencySummary,
    /// Time since launch.
    pub uptime: Duration,
}

/// Telemetry of every kernel of a runtime, with totals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimeTelemetry {
    /// Per kernel, sorted by id.
    pub kernels: Vec<Telemetry>,
    /// Sum of `messages_received`.
    pub messages_received: u64,
    /// Sum of `messages_processed`.
    pub messages_processed: u64,
    /// Sum of `messages_dropped`.
    pub messages_dropped: u64,
    /// Sum of `messages_expired`.
    pub messages_expired: u64,
    /// Sum of `queue_depth`.
    pub queue_depth: usize,
    /// Sum of `throughput`.
    pub throughput: f64,
}

impl RuntimeTelemetry {
    pub(crate) fn from_kernels(mut kernels: Vec<Telemetry>) -> Self {
        kernels.sort_by(|a, b| a.kernel_id.cmp(&b.kernel_id));
        RuntimeTelemetry {
            messages_received: kernels.iter().map(|k| k.messages_received).sum(),
            messages_processed: kernels.iter().map(|k| k.messages_processed).sum(),
            messages_dropped: kernels.iter().map(|k| k.messages_dropped).sum(),
            messages_expired: kernels.iter().map(|k| k.messages_expired).sum(),
            queue_depth: kernels.iter().map(|k| k.queue_depth).sum(),
            throughput: kernels.iter().map(|k| k.throughput).sum(),
            kernels,
        }
    }

    /// Prometheus text exposition format (version 0.0.4).
    pub fn to_prometheus(&self) -> String {
        let mut out = String::new();
        let counters: [Family; 7] = [
            (
                "resident_messages_received_total",
                "Messages accepted into the input queue.",
                |t| t.messages_received as f64,
            ),
            (
                "resident_messages_processed_total",
                "Messages the handler finished.",
                |t| t.messages_processed as f64,
            ),
            (
                "resident_messages_dropped_total",
                "Messages discarded by a drop policy or replies after timeout.",
                |t| t.messages_dropped as f64,
            ),
            (
                "resident_messages_refused_total",
                "Sends refused and handed back to the sender.",
                |t| t.messages_refused as f64,
            ),
            (
                "resident_messages_expired_total",
                "Messages not handled because their deadline passed before the kernel took them.",
                |t| t.messages_expired as f64,
            ),
            ("resident_errors_total", "Handler failures.", |t| {
                t.errors as f64
            }),
            ("resident_batches_total", "Batches drained.", |t| {
                t.batches as f64
            }),
        ];
        let gauges: [Family; 4] = [
            (
                "resident_queue_depth",
                "Messages waiting in the input queue.",
                |t| t.queue_depth as f64,
            ),
            (
                "resident_output_depth",
                "Outputs waiting to be received.",
                |t| t.output_depth as f64,
            ),
            (
                "resident_throughput_messages_per_second",
                "Processed messages per second, last second.",
                |t| t.throughput,
            ),
            ("resident_uptime_seconds", "Seconds since launch.", |t| {
                t.uptime.as_secs_f64()
            }),
        ];
        for (kind, list) in [("counter", &counters[..]), ("gauge", &gauges[..])] {
            for (name, help, get) in list {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
                for t in &self.kernels {
                    let _ = writeln!(
                        out,
                        "{name}{{kernel=\"{}\"}} {}",
                        escape(&t.kernel_id),
                        get(t)
                    );
                }
            }
        }
        let name = "resident_latency_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Send to response latency.\n# TYPE {name} summary"
        );
        for t in &self.kernels {
            let k = escape(&t.kernel_id);
            let l = &t.latency;
            for (q, v) in [
                ("0.5", l.p50_ns),
                ("0.95", l.p95_ns),
                ("0.99", l.p99_ns),
                ("0.999", l.p999_ns),
            ] {
                let _ = writeln!(
                    out,
                    "{name}{{kernel=\"{k}\",quantile=\"{q}\"}} {}",
                    v as f64 / 1e9
                );
            }
            let _ = writeln!(
                out,
                "{name}_sum{{kernel=\"{k}\"}} {}",
                (l.mean_ns as f64 * l.count as f64) / 1e9
            );
            let _ = writeln!(out, "{name}_count{{kernel=\"{k}\"}} {}", l.count);
        }
        out
    }
}

/// A metric family: name, help text, and how to read it from a kernel's telemetry.
type Family = (&'static str, &'static str, fn(&Telemetry) -> f64);

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..100_000u64).chain([1 << 40, u64::MAX / 3, u64::MAX]) {
            let b = bucket_of(v);
            assert!(b >= last || v > 100_000, "non-monotonic at {v}");
            assert!(b < BUCKETS);
            last = b;
            let hi = bucket_high(b);
            assert!(hi >= v, "bucket {b} high {hi} < {v}");
            assert!(hi - v <= v / 8 + 1, "bucket too wide at {v}");
        }
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let h = LatencyHistogram::default();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert_eq!(s.max_ns, 1_000_000);
        assert!((500_000..=532_000).contains(&s.p50_ns), "{s:?}");
        assert!((990_000..=1_000_000).contains(&s.p99_ns), "{s:?}");
        assert_eq!(s.mean_ns, 500_500);
        assert_eq!(
            LatencyHistogram::default().summary(),
            LatencySummary::default()
        );
    }

    #[test]
    fn prometheus_text_has_every_family() {
        let t = Telemetry {
            kernel_id: "a\"b".into(),
            state: KernelState::Active,
            messages_received: 3,
            messages_processed: 2,
            messages_dropped: 1,
            messages_refused: 0,
            messages_expired: 4,
            forwarded_on_device: 0,
            errors: 0,
            queue_depth: 1,
            output_depth: 0,
            batches: 1,
            throughput: 2.0,
            latency: LatencySummary {
                count: 2,
                mean_ns: 1000,
                p50_ns: 1000,
                ..Default::default()
            },
            uptime: Duration::from_secs(1),
        };
        let text = RuntimeTelemetry::from_kernels(vec![t]).to_prometheus();
        assert!(
            text.contains("resident_messages_processed_total{kernel=\"a\\\"b\"} 2"),
            "{text}"
        );
        assert!(text.contains("# TYPE resident_latency_seconds summary"));
        assert!(
            text.contains("resident_latency_seconds{kernel=\"a\\\"b\",quantile=\"0.5\"} 0.000001")
        );
        assert!(text.contains("resident_queue_depth{kernel=\"a\\\"b\"} 1"));
        assert!(text.contains("# TYPE resident_messages_expired_total counter"));
        assert!(
            text.contains("resident_messages_expired_total{kernel=\"a\\\"b\"} 4"),
            "{text}"
        );
    }
}
