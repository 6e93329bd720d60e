//! The report: wall time split into handler, queue, transfer, launch and idle
//! ("utilization"), the bottleneck named, the figures behind it and the remedy.
//!
//! The accounted time is the sum over every track (kernel or device) of its window (first span
//! to last), which splits into handler, transfer, launch and idle time, plus the time messages
//! spent waiting in a queue while the kernel was busy with earlier batches, beyond
//! [`QUEUE_ALLOWANCE_BATCHES`](super::QUEUE_ALLOWANCE_BATCHES) batch lengths (the longer of the
//! batch that handled them and the kernel's mean batch) (waiting behind the batch in hand and a short
//! backlog is normal for a busy kernel; waiting longer means producers outrun it). Per message, that is the wall time of the executors behind it plus its own excess
//! wait, so `fractions` say where a message's time and the capacity spent on it went; they sum
//! to 1. The bottleneck is the largest part.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::{Inner, Track, TrackKind};

/// What limits the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bottleneck {
    /// Copies between host and device dominate.
    Transfer,
    /// Launch overhead of one-shot kernels dominates.
    Launch,
    /// The executors sit idle: too little work per wake-up or launch.
    Utilization,
    /// Messages wait in queues: producers outrun the kernel.
    Queue,
    /// The handler's own work dominates.
    Handler,
}

impl Bottleneck {
    /// The JSON name (`"transfer"`, `"launch"`, `"utilization"`, `"queue"`, `"handler"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Bottleneck::Transfer => "transfer",
            Bottleneck::Launch => "launch",
            Bottleneck::Utilization => "utilization",
            Bottleneck::Queue => "queue",
            Bottleneck::Handler => "handler",
        }
    }

    /// Every part, in report order.
    pub const ALL: [Bottleneck; 5] = [
        Bottleneck::Handler,
        Bottleneck::Queue,
        Bottleneck::Transfer,
        Bottleneck::Launch,
        Bottleneck::Utilization,
    ];
}

impl std::fmt::Display for Bottleneck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The figures behind the fractions (totals over every track; times in nanoseconds).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Sum of the parts below: the denominator of `fractions`.
    pub accounted_ns: u64,
    /// First span start to last span end over all tracks.
    pub window_ns: u64,
    /// Handler and one-shot kernel work.
    pub handler_ns: u64,
    /// Message time spent waiting in queues (send to start of handling), all of it.
    pub queue_wait_ns: u64,
    /// The part of `queue_wait_ns` spent while the kernel was busy with earlier batches, beyond
    /// `QUEUE_ALLOWANCE_BATCHES` batch lengths: the `queue` part of the fractions.
    pub queue_excess_ns: u64,
    /// Copies both ways.
    pub transfer_ns: u64,
    /// Copies host to device.
    pub transfer_to_device_ns: u64,
    /// Copies device to host.
    pub transfer_to_host_ns: u64,
    /// Bytes copied host to device.
    pub bytes_to_device: u64,
    /// Bytes copied device to host.
    pub bytes_to_host: u64,
    /// Copies made (both ways).
    pub copies: u64,
    /// Transfer rate over the copy time, GB/s (0 without copies).
    pub transfer_gb_per_s: f64,
    /// One-shot kernel launch overhead.
    pub launch_ns: u64,
    /// One-shot kernels launched.
    pub launches: u64,
    /// Mean launch overhead per one-shot launch.
    pub mean_launch_overhead_ns: u64,
    /// Executors' idle time.
    pub idle_ns: u64,
    /// Busy share of the executors' windows (handler + transfer + launch over window).
    pub utilization: f64,
    /// Messages handled (host batches and device pushes).
    pub messages: u64,
    /// Batches handled.
    pub batches: u64,
    /// Mean messages per batch.
    pub mean_batch: f64,
    /// Mean queue wait per message.
    pub mean_queue_wait_ns: u64,
    /// Longest queue wait.
    pub max_queue_wait_ns: u64,
    /// Mean handler time per message (0 without messages).
    pub handler_per_message_ns: u64,
}

/// One track's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrackReport {
    /// Kernel id or device name.
    pub name: String,
    /// Kernel or device.
    pub kind: TrackKind,
    /// Its part of the time (same parts as the report's).
    pub fractions: BTreeMap<String, f64>,
    /// Its figures.
    pub figures: Figures,
}

/// NVML readings of one GPU at report time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuTelemetry {
    /// Device index.
    pub index: u32,
    /// Name.
    pub name: Option<String>,
    /// GPU utilization, percent.
    pub gpu_utilization_pct: Option<u32>,
    /// Memory controller utilization, percent.
    pub memory_utilization_pct: Option<u32>,
    /// Memory in use, bytes.
    pub memory_used: Option<u64>,
    /// Memory total, bytes.
    pub memory_total: Option<u64>,
    /// Power draw, milliwatts.
    pub power_mw: Option<u32>,
    /// Temperature, degrees Celsius.
    pub temperature_c: Option<u32>,
}

/// What [`Profiler::report`](super::Profiler::report) returns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The largest part: `"transfer"`, `"launch"`, `"utilization"`, `"queue"` or `"handler"`.
    pub bottleneck: Bottleneck,
    /// Each part's share of the accounted time; they sum to 1.
    pub fractions: BTreeMap<String, f64>,
    /// What to do about it, in words.
    pub remedy: String,
    /// Totals behind the fractions.
    pub figures: Figures,
    /// Per kernel.
    pub kernels: Vec<TrackReport>,
    /// Per device.
    pub devices: Vec<TrackReport>,
    /// NVML telemetry of each GPU, where NVML is present.
    pub device_telemetry: Vec<GpuTelemetry>,
    /// Why there is no device telemetry, when there is none.
    pub device_telemetry_note: Option<String>,
    /// Spans recorded, kept in the ring, and dropped (contention); totals count every span.
    pub spans: SpanCounts,
}

/// Span bookkeeping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpanCounts {
    /// Recorded since the profiler started.
    pub recorded: u64,
    /// Still in the ring (exported to traces).
    pub kept: u64,
    /// Not kept because two writers met on one slot.
    pub dropped: u64,
}

#[derive(Default, Clone, Copy)]
struct Raw {
    handler: u64,
    queue: u64,
    excess: u64,
    to_dev: u64,
    to_host: u64,
    bytes_to_dev: u64,
    bytes_to_host: u64,
    copies: u64,
    launch: u64,
    launches: u64,
    busy: u64,
    window: u64,
    first: u64,
    last: u64,
    messages: u64,
    batches: u64,
    max_wait: u64,
}

impl Raw {
    fn of(t: &Track) -> Raw {
        let a = &t.agg;
        let l = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
        let (first, last) = (l(&a.first_ns), l(&a.last_ns));
        Raw {
            handler: l(&a.handler_ns),
            queue: l(&a.queue_wait_ns),
            excess: l(&a.queue_excess_ns),
            to_dev: l(&a.to_device_ns),
            to_host: l(&a.to_host_ns),
            bytes_to_dev: l(&a.bytes_to_device),
            bytes_to_host: l(&a.bytes_to_host),
            copies: l(&a.copies_to_device) + l(&a.copies_to_host),
            launch: l(&a.launch_ns),
            launches: l(&a.launches),
            busy: l(&a.busy_ns),
            window: if first == u64::MAX {
                0
            } else {
                last.saturating_sub(first)
            },
            first,
            last,
            messages: l(&a.messages),
            batches: l(&a.batches),
            max_wait: l(&a.queue_wait_max_ns),
        }
    }

    fn idle(&self) -> u64 {
        // Concurrent device-layer spans (several threads copying at once) can make busy time
        // exceed the window: then nothing was idle.
        self.window.saturating_sub(self.busy)
    }

    fn merge(&mut self, o: &Raw) {
        self.handler += o.handler;
        self.queue += o.queue;
        self.excess += o.excess;
        self.to_dev += o.to_dev;
        self.to_host += o.to_host;
        self.bytes_to_dev += o.bytes_to_dev;
        self.bytes_to_host += o.bytes_to_host;
        self.copies += o.copies;
        self.launch += o.launch;
        self.launches += o.launches;
        self.busy += o.busy;
        self.window += o.window;
        self.messages += o.messages;
        self.batches += o.batches;
        self.max_wait = self.max_wait.max(o.max_wait);
        self.first = self.first.min(o.first);
        self.last = self.last.max(o.last);
    }

    fn parts(&self, idle: u64) -> [(Bottleneck, u64); 5] {
        [
            (Bottleneck::Handler, self.handler),
            (Bottleneck::Queue, self.excess),
            (Bottleneck::Transfer, self.to_dev + self.to_host),
            (Bottleneck::Launch, self.launch),
            (Bottleneck::Utilization, idle),
        ]
    }

    fn figures(&self, idle: u64) -> Figures {
        let transfer = self.to_dev + self.to_host;
        let accounted = self.parts(idle).iter().map(|p| p.1).sum();
        let div = |a: u64, b: u64| a.checked_div(b).unwrap_or(0);
        Figures {
            accounted_ns: accounted,
            window_ns: if self.first == u64::MAX {
                0
            } else {
                self.last.saturating_sub(self.first)
            },
            handler_ns: self.handler,
            queue_wait_ns: self.queue,
            queue_excess_ns: self.excess,
            transfer_ns: transfer,
            transfer_to_device_ns: self.to_dev,
            transfer_to_host_ns: self.to_host,
            bytes_to_device: self.bytes_to_dev,
            bytes_to_host: self.bytes_to_host,
            copies: self.copies,
            transfer_gb_per_s: if transfer == 0 {
                0.0
            } else {
                (self.bytes_to_dev + self.bytes_to_host) as f64 / transfer as f64
            },
            launch_ns: self.launch,
            launches: self.launches,
            mean_launch_overhead_ns: div(self.launch, self.launches),
            idle_ns: idle,
            utilization: if self.window == 0 {
                0.0
            } else {
                (self.busy.min(self.window)) as f64 / self.window as f64
            },
            messages: self.messages,
            batches: self.batches,
            mean_batch: if self.batches == 0 {
                0.0
            } else {
                self.messages as f64 / self.batches as f64
            },
            mean_queue_wait_ns: div(self.queue, self.messages),
            max_queue_wait_ns: self.max_wait,
            handler_per_message_ns: div(self.handler, self.messages),
        }
    }
}

/// Shares of `parts`, summing to 1 (all idle when nothing was recorded).
fn fractions(parts: &[(Bottleneck, u64); 5]) -> (BTreeMap<String, f64>, Bottleneck) {
    let total: u64 = parts.iter().map(|p| p.1).sum();
    let mut m = BTreeMap::new();
    if total == 0 {
        for (b, _) in parts {
            m.insert(b.as_str().to_string(), 0.0);
        }
        m.insert(Bottleneck::Utilization.as_str().to_string(), 1.0);
        return (m, Bottleneck::Utilization);
    }
    let mut best = parts[0];
    for &(b, v) in parts {
        m.insert(b.as_str().to_string(), v as f64 / total as f64);
        if v > best.1 {
            best = (b, v);
        }
    }
    (m, best.0)
}

fn us(ns: u64) -> String {
    if ns >= 10_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else if ns >= 10_000 {
        format!("{:.0} us", ns as f64 / 1e3)
    } else {
        format!("{:.2} us", ns as f64 / 1e3)
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// The remedy in words, from the figures.
pub(crate) fn remedy(b: Bottleneck, f: &Figures, frac: &BTreeMap<String, f64>) -> String {
    let pct = |k: Bottleneck| 100.0 * frac.get(k.as_str()).copied().unwrap_or(0.0);
    match b {
        Bottleneck::Transfer => format!(
            "Transfer-bound: {:.0}% of the time moves data ({} to the device, {} back in {} copies, \
             {:.1} GB/s). Keep the data where it is used: bound buffers (a `UnifiedBuffer` that stays \
             on the device between kernels, with messages carrying its handle instead of the payload), \
             pinned buffers (`BufferOptions::pinned()`) for the copies that remain so they run at full \
             DMA speed and overlap with work on a stream, and fewer, larger copies (raise the batch size). \
             On the CPU backend device memory is host memory: every explicit copy there is pure overhead.",
            pct(b),
            mib(f.bytes_to_device),
            mib(f.bytes_to_host),
            f.copies,
            f.transfer_gb_per_s
        ),
        Bottleneck::Launch => format!(
            "Launch-bound: {:.0}% of the time is launch overhead, {} one-shot launches at {} each, with \
             {} of handler time per message besides. Do more work per launch: raise the batch size so one launch covers \
             many messages, fuse consecutive kernels, or stop relaunching: a resident ring kernel is \
             launched once and fed through its queue (its handler on the device with `.cuda(..)`), \
             and for this little work per launch the CPU backend's plain handler avoids launches altogether.",
            pct(b),
            f.launches,
            us(f.mean_launch_overhead_ns),
            us(f.handler_per_message_ns)
        ),
        Bottleneck::Utilization => format!(
            "Low utilization: the executors were idle {:.0}% of the time (busy {:.0}% of their window, \
             {:.1} messages per batch). The work arrives too thinly to keep them busy: send in batches \
             (`send_batch`) and raise the batch size so each wake-up does more, keep more messages in \
             flight (a larger queue size, more concurrent callers), or host fewer, busier kernels. If the \
             load really is this light, the CPU backend serves it with the least latency: a device only \
             pays off when it is kept busy.",
            pct(b),
            100.0 * f.utilization,
            f.mean_batch
        ),
        Bottleneck::Queue => format!(
            "Queue-bound: messages waited {} on average (up to {}) in the queue for {} of handling each: \
             producers outrun the kernel ({:.0}% of the time is waiting). A larger queue only adds latency. \
             Raise the kernel's throughput (a larger batch size amortizes per-batch costs; split the stream \
             over several kernels by key), or bound the wait: a smaller queue size with `Backpressure::Reject` \
             or `Block(timeout)` pushes back on producers instead of letting latency grow.",
            us(f.mean_queue_wait_ns),
            us(f.max_queue_wait_ns),
            us(f.handler_per_message_ns),
            pct(b)
        ),
        Bottleneck::Handler => format!(
            "Handler-bound: {:.0}% of the time is the handler's own work, {} per message. The queues, \
             copies and launches are not the problem: make the handler cheaper, spread messages over several \
             kernels, or move the heavy part to a device (a one-shot kernel on bound buffers, or a device \
             handler with `.cuda(..)` on a GPU backend) if it is data-parallel. Batch size and queue size \
             will not help much here.",
            pct(b),
            us(f.handler_per_message_ns)
        ),
    }
}

fn track_report(t: &Track) -> TrackReport {
    let r = Raw::of(t);
    let idle = r.idle();
    let (fr, _) = fractions(&r.parts(idle));
    TrackReport {
        name: t.name.clone(),
        kind: t.kind,
        fractions: fr,
        figures: r.figures(idle),
    }
}

pub(crate) fn build(inner: &Inner) -> Report {
    let tracks = inner.tracks();
    let mut total = Raw {
        first: u64::MAX,
        ..Raw::default()
    };
    let mut idle = 0;
    for t in &tracks {
        let r = Raw::of(t);
        idle += r.idle();
        total.merge(&r);
    }
    let parts = total.parts(idle);
    let (fr, bottleneck) = fractions(&parts);
    let figures = total.figures(idle);
    let remedy = if figures.accounted_ns == 0 {
        "Nothing was recorded: attach the profiler to the runtime before launching kernels \
         (`RuntimeBuilder::profiler`), and activate them."
            .to_string()
    } else {
        remedy(bottleneck, &figures, &fr)
    };
    let (device_telemetry, device_telemetry_note) = match inner.device_telemetry() {
        Some(read) => read(),
        None => (
            Vec::new(),
            Some("no GPU telemetry: this profiler was given to no runtime".into()),
        ),
    };
    let kept = inner.ring.snapshot().len() as u64;
    Report {
        bottleneck,
        fractions: fr,
        remedy,
        figures,
        kernels: tracks
            .iter()
            .filter(|t| t.kind == TrackKind::Kernel)
            .map(|t| track_report(t))
            .collect(),
        devices: tracks
            .iter()
            .filter(|t| t.kind == TrackKind::Device)
            .map(|t| track_report(t))
            .collect(),
        device_telemetry,
        device_telemetry_note,
        spans: SpanCounts {
            recorded: inner.ring.offered(),
            kept,
            dropped: inner.ring.dropped(),
        },
    }
}

impl Report {
    /// The report as a few lines of text.
    pub fn to_text(&self) -> String {
        let f = &self.figures;
        // In text one word each: "idle" for the idle share (the JSON key "utilization"),
        // "busy" for the busy share (figures.utilization).
        let label = |b: Bottleneck| match b {
            Bottleneck::Utilization => "idle",
            b => b.as_str(),
        };
        let mut s = format!("bottleneck: {}\n", label(self.bottleneck));
        s += "time split:";
        for b in Bottleneck::ALL {
            let v = self.fractions.get(b.as_str()).copied().unwrap_or(0.0);
            s += &format!("  {} {:.1}%", label(b), 100.0 * v);
        }
        s += &format!(
            "\nmessages {} in {} batches (mean {:.1}); queue wait mean {} max {}; handler {} per message\n",
            f.messages,
            f.batches,
            f.mean_batch,
            us(f.mean_queue_wait_ns),
            us(f.max_queue_wait_ns),
            us(f.handler_per_message_ns)
        );
        s += &format!(
            "transfer {} to device, {} to host, {} copies, {:.2} GB/s; launches {} (overhead {} each); busy {:.0}%\n",
            mib(f.bytes_to_device),
            mib(f.bytes_to_host),
            f.copies,
            f.transfer_gb_per_s,
            f.launches,
            us(f.mean_launch_overhead_ns),
            100.0 * f.utilization
        );
        for t in self.kernels.iter().chain(&self.devices) {
            let top = t
                .fractions
                .iter()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(k, v)| format!("{k} {:.0}%", 100.0 * v))
                .unwrap_or_default();
            if t.figures.accounted_ns == 0 {
                s += &format!(
                    "  {:?} {}: all its time was inside kernel batches\n",
                    t.kind, t.name
                );
                continue;
            }
            s += &format!(
                "  {:?} {}: {} messages, busy {:.0}%, largest part {}\n",
                t.kind,
                t.name,
                t.figures.messages,
                100.0 * t.figures.utilization,
                top
            );
        }
        if let Some(n) = &self.device_telemetry_note {
            s += &format!("device telemetry: {n}\n");
        }
        for g in &self.device_telemetry {
            s += &format!(
                "  GPU {} {}: util {:?}%, memory {:?}/{:?} B, power {:?} mW\n",
                g.index,
                g.name.as_deref().unwrap_or("?"),
                g.gpu_utilization_pct,
                g.memory_used,
                g.memory_total,
                g.power_mw
            );
        }
        s += &format!("remedy: {}\n", self.remedy);
        s
    }
}
