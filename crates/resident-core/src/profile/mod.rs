//! The profiler: where the time of ring kernels and devices goes, as spans, a Chrome/Perfetto
//! trace and a report that names the bottleneck.
//!
//! ```
//! use resident::prelude::*;
//! use resident::profile::Profiler;
//! use std::time::Duration;
//!
//! let profiler = Profiler::new();
//! let rt = Runtime::builder().backend(Backend::Cpu).profiler(profiler.clone()).build()?;
//! let k = rt.launch(RingKernel::<u32, u32>::new("double").handler(|_, x: u32| Some(2 * x)))?;
//! k.activate()?;
//! for i in 0..100 {
//!     k.call(i, Duration::from_secs(5))?;
//! }
//! let report = profiler.report();
//! assert_eq!(report.figures.messages, 100);
//! let sum: f64 = report.fractions.values().sum();
//! assert!((sum - 1.0).abs() < 1e-9);
//! println!("{} bound: {}", report.bottleneck, report.remedy);
//! # Ok::<(), resident::Error>(())
//! ```
//!
//! What is recorded, per track (one per kernel, one per device):
//! * **handler**: a host handler's batch (dequeue to outputs published) minus the transfers
//!   and launch overhead nested in it; the work of a one-shot kernel (first index started to
//!   last finished on the CPU; enqueue-to-completion on CUDA).
//! * **queue**: for every message, send timestamp to the start of the batch that handles it
//!   (for a device-hosted kernel: to the pump's push onto the device queue). The report's
//!   `queue` part counts only the wait while the kernel was busy with earlier batches, beyond
//!   [`QUEUE_ALLOWANCE_BATCHES`] batch lengths (the longer of that batch and the kernel's mean
//!   batch): waiting behind the batch in hand and a short backlog is normal for a busy kernel
//!   (whose limit is then its handler), a longer wait means producers outrun it; waiting for an
//!   idle kernel to wake up is idle time.
//! * **transfer**: bytes and time each direction: device copies (which `UnifiedBuffer` uses)
//!   and the pump's pushes and pulls of a device-hosted kernel.
//! * **launch**: launch overhead of one-shot kernels (submit to first work, last work to return
//!   on the CPU; the enqueue call on CUDA).
//! * **idle**: a track's window (first to last span) minus its busy time.
//!
//! Spans go into a bounded lock-free ring (the last `capacity`, default 65 536; contended
//! writes are dropped and counted) and into running per-track totals, so memory stays fixed
//! however long it runs. Off by default: a runtime without a profiler pays one `None` check per
//! batch; a paused profiler one relaxed atomic load. Device-layer spans (copies, one-shot
//! launches) are process-wide: every enabled profiler records them, and the device layer pays
//! one relaxed load per copy or launch while none is enabled.

pub mod report;
mod ring;
pub mod trace;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};
use std::time::Instant;

use parking_lot::Mutex;
use rayon::prelude::*;
use resident_ring::Slot;

pub use report::{Bottleneck, Figures, GpuTelemetry, Report, TrackReport};
pub use ring::{SpanKind, SpanRecord};

/// A message's queue wait up to this many batch lengths (the longer of the batch that handled
/// it and the kernel's mean batch so far) counts as normal (the batch in hand plus a short
/// backlog); only the wait beyond it is the report's `queue` part.
pub const QUEUE_ALLOWANCE_BATCHES: u64 = 8;

/// Default number of spans the ring keeps.
pub const DEFAULT_CAPACITY: usize = 1 << 16;

/// Errors of the profiler.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Writing a trace or report failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Serializing to JSON failed.
    #[error("serializing {what}: {source}")]
    Json {
        /// What was being serialized.
        what: &'static str,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

/// Number of enabled profilers: the device layer's fast path reads only this (Relaxed: a
/// profiler enabled a moment ago may miss a copy that raced with enabling it).
static ENABLED_SINKS: AtomicUsize = AtomicUsize::new(0);
/// Every live profiler, for device-layer spans.
static SINKS: RwLock<Vec<Weak<Inner>>> = RwLock::new(Vec::new());

thread_local! {
    /// Device-layer time spent on this thread inside the batch in hand, so the batch's
    /// handler time excludes it and the kernel's track is charged for it.
    static NEST: Cell<Nest> = const { Cell::new(Nest::ZERO) };
}

#[derive(Clone, Copy)]
struct Nest {
    in_batch: bool,
    to_device_ns: u64,
    to_host_ns: u64,
    bytes_to_device: u64,
    bytes_to_host: u64,
    copies_to_device: u64,
    copies_to_host: u64,
    launch_ns: u64,
    launches: u64,
}

impl Nest {
    const ZERO: Nest = Nest {
        in_batch: false,
        to_device_ns: 0,
        to_host_ns: 0,
        bytes_to_device: 0,
        bytes_to_host: 0,
        copies_to_device: 0,
        copies_to_host: 0,
        launch_ns: 0,
        launches: 0,
    };
}

/// Whether a track is a kernel's or a device's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrackKind {
    /// A ring kernel's thread (handler batches, or a device pump's pushes and pulls).
    Kernel,
    /// A device (one-shot launches and copies not made inside a kernel's batch).
    Device,
}

/// Running totals of one track. Every field is a counter updated with Relaxed `fetch_add` /
/// `fetch_min` / `fetch_max`: nothing is published through them, and a report taken while
/// kernels run may see one span's fields partly applied (off by at most the spans in flight).
pub(crate) struct Aggregates {
    pub handler_ns: AtomicU64,
    pub to_device_ns: AtomicU64,
    pub to_host_ns: AtomicU64,
    pub bytes_to_device: AtomicU64,
    pub bytes_to_host: AtomicU64,
    pub copies_to_device: AtomicU64,
    pub copies_to_host: AtomicU64,
    pub launch_ns: AtomicU64,
    pub launches: AtomicU64,
    pub batches: AtomicU64,
    pub messages: AtomicU64,
    pub queue_wait_ns: AtomicU64,
    pub queue_wait_max_ns: AtomicU64,
    /// Queue wait while the kernel was busy, beyond `QUEUE_ALLOWANCE_BATCHES` batch lengths.
    pub queue_excess_ns: AtomicU64,
    pub busy_ns: AtomicU64,
    /// Start of the first span (`u64::MAX` before any).
    pub first_ns: AtomicU64,
    /// End of the last span.
    pub last_ns: AtomicU64,
}

impl Aggregates {
    fn new() -> Self {
        let z = || AtomicU64::new(0);
        Aggregates {
            handler_ns: z(),
            to_device_ns: z(),
            to_host_ns: z(),
            bytes_to_device: z(),
            bytes_to_host: z(),
            copies_to_device: z(),
            copies_to_host: z(),
            launch_ns: z(),
            launches: z(),
            batches: z(),
            messages: z(),
            queue_wait_ns: z(),
            queue_wait_max_ns: z(),
            queue_excess_ns: z(),
            busy_ns: z(),
            first_ns: AtomicU64::new(u64::MAX),
            last_ns: z(),
        }
    }

    fn add(&self, a: &AtomicU64, v: u64) {
        if v != 0 {
            a.fetch_add(v, Ordering::Relaxed);
        }
    }

    fn window(&self, start: u64, end: u64) {
        self.first_ns.fetch_min(start, Ordering::Relaxed);
        self.last_ns.fetch_max(end, Ordering::Relaxed);
    }

    fn add_nest(&self, n: &Nest) {
        self.add(&self.to_device_ns, n.to_device_ns);
        self.add(&self.to_host_ns, n.to_host_ns);
        self.add(&self.bytes_to_device, n.bytes_to_device);
        self.add(&self.bytes_to_host, n.bytes_to_host);
        self.add(&self.copies_to_device, n.copies_to_device);
        self.add(&self.copies_to_host, n.copies_to_host);
        self.add(&self.launch_ns, n.launch_ns);
        self.add(&self.launches, n.launches);
    }
}

/// A kernel's or a device's row in traces and reports.
pub(crate) struct Track {
    pub id: u32,
    pub name: String,
    pub kind: TrackKind,
    pub agg: Aggregates,
}

pub(crate) struct Inner {
    enabled: AtomicBool,
    epoch: Instant,
    ring: ring::SpanRing,
    /// Index = track id. Locked only to add a track or look one up by name (at launch, and
    /// per device-layer span while profiling), never per batch.
    tracks: Mutex<Vec<Arc<Track>>>,
    /// Where the report reads the GPUs' telemetry: the engines of the first runtime this
    /// profiler was given to (`Engines::device_telemetry`).
    device_telemetry: std::sync::OnceLock<DeviceTelemetry>,
}

/// Reads the GPUs' telemetry for the report, or says why there is none
/// (`Engines::device_telemetry`).
pub type DeviceTelemetry = fn() -> (Vec<GpuTelemetry>, Option<String>);

impl Inner {
    pub(crate) fn device_telemetry(&self) -> Option<DeviceTelemetry> {
        self.device_telemetry.get().copied()
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    fn track(&self, name: &str, kind: TrackKind) -> Arc<Track> {
        let mut tracks = self.tracks.lock();
        if let Some(t) = tracks.iter().find(|t| t.kind == kind && t.name == name) {
            return t.clone();
        }
        let t = Arc::new(Track {
            id: tracks.len() as u32,
            name: name.to_string(),
            kind,
            agg: Aggregates::new(),
        });
        tracks.push(t.clone());
        t
    }

    pub(crate) fn tracks(&self) -> Vec<Arc<Track>> {
        self.tracks.lock().clone()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if *self.enabled.get_mut() {
            ENABLED_SINKS.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Records spans of ring kernels and devices; cheap to clone (a shared handle). Attach it
/// with `RuntimeBuilder::profiler` or `RuntimeBuilder::enable_profiling` (the runtime, above
/// this module).
#[derive(Clone)]
pub struct Profiler {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Profiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Profiler")
            .field("enabled", &self.is_enabled())
            .field("capacity", &self.inner.ring.capacity())
            .field("spans", &self.inner.ring.offered())
            .finish()
    }
}

impl Default for Profiler {
    fn default() -> Self {
        Profiler::new()
    }
}

impl Profiler {
    /// An enabled profiler keeping the last [`DEFAULT_CAPACITY`] spans.
    pub fn new() -> Profiler {
        Profiler::with_capacity(DEFAULT_CAPACITY)
    }

    /// An enabled profiler keeping the last `spans` spans (rounded up to a power of two).
    pub fn with_capacity(spans: usize) -> Profiler {
        let inner = Arc::new(Inner {
            enabled: AtomicBool::new(true),
            epoch: Instant::now(),
            ring: ring::SpanRing::new(spans),
            tracks: Mutex::new(Vec::new()),
            device_telemetry: std::sync::OnceLock::new(),
        });
        ENABLED_SINKS.fetch_add(1, Ordering::Relaxed);
        let mut sinks = SINKS.write().unwrap_or_else(|e| e.into_inner());
        sinks.retain(|w| w.strong_count() > 0);
        sinks.push(Arc::downgrade(&inner));
        Profiler { inner }
    }

    /// Where the report reads the GPUs' telemetry; the first call wins (a runtime given this
    /// profiler sets its engines').
    #[doc(hidden)] // set by `RuntimeBuilder::build`, not the API
    pub fn read_device_telemetry_with(&self, f: DeviceTelemetry) {
        let _ = self.inner.device_telemetry.set(f);
    }

    /// Pauses (`false`) or resumes recording. Paused, each batch costs one relaxed load.
    pub fn set_enabled(&self, on: bool) {
        if self.inner.enabled.swap(on, Ordering::Relaxed) != on {
            if on {
                ENABLED_SINKS.fetch_add(1, Ordering::Relaxed);
            } else {
                ENABLED_SINKS.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Whether it records.
    pub fn is_enabled(&self) -> bool {
        self.inner.enabled.load(Ordering::Relaxed)
    }

    /// Nanoseconds since the profiler was made (the time base of its spans).
    pub fn now_ns(&self) -> u64 {
        self.inner.ns(Instant::now())
    }

    /// The spans still in the ring, oldest first.
    pub fn spans(&self) -> Vec<SpanRecord> {
        self.inner.ring.snapshot()
    }

    /// Spans not kept because two writers met on one ring slot (the running totals still
    /// count them).
    pub fn dropped_spans(&self) -> u64 {
        self.inner.ring.dropped()
    }

    /// Spans recorded so far (kept, overwritten by newer ones, or dropped).
    pub fn recorded_spans(&self) -> u64 {
        self.inner.ring.offered()
    }

    /// Names and kinds of the tracks, by track id.
    pub fn tracks(&self) -> Vec<(u32, String, TrackKind)> {
        self.inner
            .tracks()
            .iter()
            .map(|t| (t.id, t.name.clone(), t.kind))
            .collect()
    }

    /// The report: where the time went, the bottleneck and the remedy.
    pub fn report(&self) -> Report {
        report::build(&self.inner)
    }

    /// The kept spans as a Chrome trace event JSON document (Perfetto and
    /// `chrome://tracing` open it).
    pub fn chrome_trace(&self) -> serde_json::Value {
        trace::chrome_trace(&self.inner)
    }

    /// Writes [`chrome_trace`](Self::chrome_trace) to `path`.
    pub fn write_chrome_trace(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<(), ProfileError> {
        let path = path.as_ref();
        let text =
            serde_json::to_vec(&self.chrome_trace()).map_err(|source| ProfileError::Json {
                what: "trace",
                source,
            })?;
        std::fs::write(path, text).map_err(|source| ProfileError::Write {
            path: path.display().to_string(),
            source,
        })
    }

    fn kernel_probe(&self, kernel: &str, runtime_epoch: Instant) -> KernelProbe {
        let offset_ns = if runtime_epoch >= self.inner.epoch {
            (runtime_epoch - self.inner.epoch).as_nanos() as i64
        } else {
            -((self.inner.epoch - runtime_epoch).as_nanos() as i64)
        };
        KernelProbe {
            inner: self.inner.clone(),
            track: self.inner.track(kernel, TrackKind::Kernel),
            offset_ns,
        }
    }
}

/// A kernel's link to its runtime's profiler.
pub(crate) struct KernelProbe {
    inner: Arc<Inner>,
    track: Arc<Track>,
    /// Runtime clock (envelope timestamps) to profiler clock.
    offset_ns: i64,
}

impl KernelProbe {
    #[inline]
    fn on(&self) -> bool {
        // Relaxed: pausing takes effect within a batch or two; nothing is published by it.
        self.inner.enabled.load(Ordering::Relaxed)
    }

    fn sent_ns(&self, runtime_ns: u64) -> u64 {
        (runtime_ns as i64).saturating_add(self.offset_ns).max(0) as u64
    }

    /// Records the queue wait of `slots` handled from `start` in a batch of `dur`; returns the
    /// oldest send time.
    fn waits<T>(&self, slots: &[Slot<T>], start: u64, dur: u64) -> u64 {
        let a = &self.track.agg;
        // Relaxed reads of our own track's totals (this thread is their writer for batches).
        let batches = a.batches.load(Ordering::Relaxed);
        let mean = a.busy_ns.load(Ordering::Relaxed) / batches.max(1);
        let allowance = QUEUE_ALLOWANCE_BATCHES * dur.max(mean);
        // End of the kernel's previous span: a wait after it is the kernel waking from idle
        // (counted in its idle time), not a backlog.
        let prev_end = a.last_ns.load(Ordering::Relaxed).min(start);
        let (mut sum, mut excess, mut max, mut oldest) = (0u64, 0u64, 0u64, u64::MAX);
        for s in slots {
            let sent = self.sent_ns(s.env.timestamp_ns);
            let w = start.saturating_sub(sent);
            sum += w;
            excess += prev_end.saturating_sub(sent).saturating_sub(allowance);
            max = max.max(w);
            oldest = oldest.min(sent);
        }
        a.add(&a.queue_wait_ns, sum);
        a.add(&a.queue_excess_ns, excess);
        a.queue_wait_max_ns.fetch_max(max, Ordering::Relaxed);
        oldest
    }

    fn push(&self, kind: SpanKind, start: u64, end: u64, a: u64, b: u64) {
        self.inner.ring.push(&SpanRecord {
            kind,
            track: self.track.id,
            start_ns: start,
            dur_ns: end.saturating_sub(start),
            a,
            b,
        });
    }
}

// ---------------------------------------------------------------------------------------
// Hooks. Each call site in the runtime and the backends is one line: `profile::<hook>(..)`.
// ---------------------------------------------------------------------------------------

/// Hook (`Runtime::launch`): emits the `launched` event and, with a profiler, attaches the
/// kernel to it (its track) and records the set-up span from `t0`.
pub(crate) fn launched(
    profiler: Option<&Profiler>,
    slot: &OnceLock<KernelProbe>,
    kernel: &str,
    runtime_epoch: Instant,
    t0: Instant,
) {
    // `KernelState::Launched`, as it displays (the lifecycle lives above this module).
    lifecycle(kernel, "launch", &"launched");
    if let Some(p) = profiler {
        let probe = p.kernel_probe(kernel, runtime_epoch);
        if probe.on() {
            let (s, e) = (p.inner.ns(t0), p.inner.ns(Instant::now()));
            probe.push(SpanKind::Setup, s, e, 0, 0);
        }
        let _ = slot.set(probe);
    }
}

/// What [`batch_start`] hands to [`batch_end`].
pub(crate) struct BatchScope {
    /// Start, profiler clock; meaningful only when `on`.
    t0: u64,
    on: bool,
    _span: tracing::span::EnteredSpan,
}

/// Hook (`run_handler`, after a batch of `n` was taken): opens the `tracing` span of the batch
/// and, when profiling, starts timing it.
#[inline]
pub(crate) fn batch_start(p: Option<&KernelProbe>, kernel: &str, n: usize) -> BatchScope {
    let span =
        tracing::debug_span!(target: "resident::batch", "batch", kernel, messages = n).entered();
    match p {
        Some(p) if p.on() => {
            NEST.with(|c| {
                c.set(Nest {
                    in_batch: true,
                    ..Nest::ZERO
                })
            });
            BatchScope {
                t0: p.inner.ns(Instant::now()),
                on: true,
                _span: span,
            }
        }
        _ => BatchScope {
            t0: 0,
            on: false,
            _span: span,
        },
    }
}

/// Hook (`run_handler`, after the batch's outputs are published): records the batch span, the
/// queue wait of each message and the device-layer time nested in the batch.
#[inline]
pub(crate) fn batch_end<In>(p: Option<&KernelProbe>, scope: BatchScope, batch: &[Slot<In>]) {
    let Some(p) = p.filter(|_| scope.on) else {
        return;
    };
    let t1 = p.inner.ns(Instant::now());
    let nest = NEST.with(|c| c.replace(Nest::ZERO));
    let dur = t1.saturating_sub(scope.t0);
    let oldest = p.waits(batch, scope.t0, dur);
    let a = &p.track.agg;
    let nested = nest.to_device_ns + nest.to_host_ns + nest.launch_ns;
    a.add(&a.handler_ns, dur.saturating_sub(nested));
    a.add_nest(&nest);
    a.add(&a.busy_ns, dur);
    a.add(&a.batches, 1);
    a.add(&a.messages, batch.len() as u64);
    a.window(scope.t0, t1);
    p.push(SpanKind::Batch, scope.t0, t1, batch.len() as u64, oldest);
}

/// Hook (`run_device`): the time before a push or pull, when profiling.
#[inline]
pub(crate) fn now(p: Option<&KernelProbe>) -> Option<Instant> {
    match p {
        Some(p) if p.on() => Some(Instant::now()),
        _ => None,
    }
}

/// Hook (`run_device`, after `push`): `pushed` went onto the device's queues since `t0`.
#[inline]
pub(crate) fn device_push<In>(p: Option<&KernelProbe>, t0: Option<Instant>, pushed: &[Slot<In>]) {
    let (Some(p), Some(t0)) = (p, t0) else { return };
    if pushed.is_empty() {
        return;
    }
    let (s, e) = (p.inner.ns(t0), p.inner.ns(Instant::now()));
    let bytes = std::mem::size_of_val(pushed) as u64;
    let oldest = p.waits(pushed, s, e - s);
    let a = &p.track.agg;
    a.add(&a.to_device_ns, e - s);
    a.add(&a.bytes_to_device, bytes);
    a.add(&a.copies_to_device, 1);
    a.add(&a.busy_ns, e - s);
    a.add(&a.messages, pushed.len() as u64);
    a.add(&a.batches, 1);
    a.window(s, e);
    p.push(SpanKind::DevicePush, s, e, pushed.len() as u64, oldest);
}

/// Hook (`run_device`, after `pull`): `pulled` came off the device's output queue since `t0`.
#[inline]
pub(crate) fn device_pull<Out>(p: Option<&KernelProbe>, t0: Option<Instant>, pulled: &[Slot<Out>]) {
    let (Some(p), Some(t0)) = (p, t0) else { return };
    if pulled.is_empty() {
        return;
    }
    let (s, e) = (p.inner.ns(t0), p.inner.ns(Instant::now()));
    let a = &p.track.agg;
    a.add(&a.to_host_ns, e - s);
    a.add(&a.bytes_to_host, std::mem::size_of_val(pulled) as u64);
    a.add(&a.copies_to_host, 1);
    a.add(&a.busy_ns, e - s);
    a.window(s, e);
    p.push(SpanKind::DevicePull, s, e, pulled.len() as u64, 0);
}

/// Direction of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Host to device.
    ToDevice,
    /// Device to host.
    ToHost,
}

/// Calls `f` for every enabled profiler.
fn each_sink(mut f: impl FnMut(&Inner)) {
    let sinks = SINKS.read().unwrap_or_else(|e| e.into_inner());
    for w in sinks.iter() {
        if let Some(inner) = w.upgrade() {
            if inner.enabled.load(Ordering::Relaxed) {
                f(&inner);
            }
        }
    }
}

/// Records device-layer spans: on the device's track for the trace; in the running totals of
/// the enclosing batch's kernel when made inside one (see [`batch_end`]), else the device's.
fn record_device(device: &str, spans: &[(SpanKind, Instant, Instant, u64)]) {
    let nested = NEST.with(|c| {
        let mut n = c.get();
        if !n.in_batch {
            return false;
        }
        for &(kind, s, e, a) in spans {
            let d = e.saturating_duration_since(s).as_nanos() as u64;
            match kind {
                SpanKind::ToDevice => {
                    n.to_device_ns += d;
                    n.bytes_to_device += a;
                    n.copies_to_device += 1;
                }
                SpanKind::ToHost => {
                    n.to_host_ns += d;
                    n.bytes_to_host += a;
                    n.copies_to_host += 1;
                }
                SpanKind::Launch => n.launch_ns += d,
                // The work of a one-shot kernel stays in the enclosing handler's time.
                _ => {}
            }
        }
        n.launches += spans.iter().any(|s| s.0 == SpanKind::Compute) as u64;
        c.set(n);
        true
    });
    each_sink(|inner| {
        let track = inner.track(device, TrackKind::Device);
        let a = &track.agg;
        for &(kind, s, e, count) in spans {
            let (s, e) = (inner.ns(s), inner.ns(e));
            inner.ring.push(&SpanRecord {
                kind,
                track: track.id,
                start_ns: s,
                dur_ns: e.saturating_sub(s),
                a: count,
                b: 0,
            });
            if nested {
                continue;
            }
            let d = e.saturating_sub(s);
            match kind {
                SpanKind::ToDevice => {
                    a.add(&a.to_device_ns, d);
                    a.add(&a.bytes_to_device, count);
                    a.add(&a.copies_to_device, 1);
                }
                SpanKind::ToHost => {
                    a.add(&a.to_host_ns, d);
                    a.add(&a.bytes_to_host, count);
                    a.add(&a.copies_to_host, 1);
                }
                SpanKind::Launch => a.add(&a.launch_ns, d),
                SpanKind::Compute => {
                    a.add(&a.handler_ns, d);
                    a.add(&a.launches, 1);
                }
                _ => {}
            }
            a.add(&a.busy_ns, d);
            a.window(s, e);
        }
    });
}

/// Hook for backends: runs the copy `f` of `bytes` bytes on `device` and records it. Costs
/// one relaxed load when no profiler is enabled.
#[inline]
pub fn transfer<R>(device: &str, dir: Direction, bytes: usize, f: impl FnOnce() -> R) -> R {
    // Relaxed: see `ENABLED_SINKS`.
    if ENABLED_SINKS.load(Ordering::Relaxed) == 0 {
        return f();
    }
    let t0 = Instant::now();
    let r = f();
    let kind = match dir {
        Direction::ToDevice => SpanKind::ToDevice,
        Direction::ToHost => SpanKind::ToHost,
    };
    record_device(device, &[(kind, t0, Instant::now(), bytes as u64)]);
    r
}

/// Hook for backends whose launch is asynchronous: `t0` before the launch call, `t1` when it
/// returned (enqueued), `t2` when the kernel had finished (synchronized). `t0..t1` counts as
/// launch overhead, `t1..t2` as the kernel's work.
pub fn device_launch(device: &str, elements: u64, t0: Instant, t1: Instant, t2: Instant) {
    if ENABLED_SINKS.load(Ordering::Relaxed) == 0 {
        return;
    }
    record_device(
        device,
        &[
            (SpanKind::Launch, t0, t1, elements),
            (SpanKind::Compute, t1, t2, elements),
        ],
    );
}

/// Whether any profiler records device-layer spans (one relaxed load).
#[inline]
pub fn device_profiling() -> bool {
    ENABLED_SINKS.load(Ordering::Relaxed) != 0
}

/// Hook (`run_cpu`): when a profiler is enabled, runs the one-shot CPU kernel `body` over
/// `elements` indices on the rayon pool itself, timing submit-to-first-work and
/// last-work-to-return (launch overhead) apart from the work; `None` when no profiler is
/// enabled (the caller runs it as usual).
pub(crate) fn cpu_launch<E: Send>(
    elements: u64,
    body: impl Fn(usize) -> Result<(), E> + Sync + Send,
) -> Option<Result<(), E>> {
    if !device_profiling() {
        return None;
    }
    let t0 = Instant::now();
    let ns = |t: Instant| t.saturating_duration_since(t0).as_nanos() as u64;
    // Relaxed min/max: read only after the parallel loop returned, and rayon's join makes
    // every worker's updates visible to the caller.
    let first = AtomicU64::new(u64::MAX);
    let last = AtomicU64::new(0);
    let r = (0..elements as usize)
        .into_par_iter()
        .try_fold(|| ns(Instant::now()), |start, i| body(i).map(|()| start))
        .try_for_each(|piece| {
            piece.map(|start| {
                first.fetch_min(start, Ordering::Relaxed);
                last.fetch_max(ns(Instant::now()), Ordering::Relaxed);
            })
        });
    let end = Instant::now();
    let (f, l) = (first.into_inner(), last.into_inner());
    let d = |n: u64| t0 + std::time::Duration::from_nanos(n);
    if f == u64::MAX {
        record_device("cpu", &[(SpanKind::Launch, t0, end, elements)]);
    } else {
        let (f, l) = (d(f), d(l.max(f)));
        record_device(
            "cpu",
            &[
                (SpanKind::Launch, t0, f, elements),
                (SpanKind::Compute, f, l, elements),
                (SpanKind::Launch, l, end, elements),
            ],
        );
    }
    Some(r)
}

// ---------------------------------------------------------------------------------------
// `tracing` events: lifecycle, faults, drops, refusals. Always emitted (cheap when no
// subscriber listens), with or without a profiler.
// ---------------------------------------------------------------------------------------

/// Hook: a lifecycle transition of `kernel` by `op` into `state` (a `KernelState`).
pub(crate) fn lifecycle(kernel: &str, op: &'static str, state: &dyn std::fmt::Display) {
    tracing::info!(target: "resident::lifecycle", kernel, op, state = %state, "kernel {op}: now {state}");
}

/// Hook: `kernel` failed (handler panic, device fault, loop ended early).
pub(crate) fn fault(kernel: &str, reason: &str) {
    tracing::error!(target: "resident::fault", kernel, reason, "kernel failed");
}

/// Hook: a send to `kernel` was refused (full, timed out, closed); the message went back to
/// the sender.
pub(crate) fn refused<T>(kernel: &str, op: &'static str, e: &resident_ring::mailbox::SendError<T>) {
    use resident_ring::mailbox::SendError;
    let why = match e {
        SendError::Full(_) => "full",
        SendError::Timeout(_) => "timeout",
        SendError::Closed(_) => "closed",
    };
    tracing::debug!(target: "resident::refused", kernel, op, why, "send refused");
}

/// Hook: a message to `kernel` was dropped by its backpressure policy.
pub(crate) fn dropped(kernel: &str, op: &'static str, policy: &'static str) {
    tracing::debug!(target: "resident::dropped", kernel, op, policy, "message dropped");
}

/// Cost of the per-batch hooks, for the overhead benchmark: mean nanoseconds per batch of
/// `batch_len` messages over `batches` batches, with no profiler (`None`), a paused one and a
/// recording one, in that order. Runs on the calling thread.
#[doc(hidden)]
pub fn hook_cost_per_batch(batches: usize, batch_len: usize) -> [f64; 3] {
    use resident_ring::Envelope;
    let p = Profiler::with_capacity(1 << 12);
    let probe = p.kernel_probe("hook-cost", p.inner.epoch);
    let slots: Vec<Slot<u64>> = (0..batch_len as u64)
        .map(|i| Slot::new(Envelope::new(i + 1, 128, p.now_ns()), i))
        .collect();
    let mut out = [0.0; 3];
    for (i, mode) in [None, Some(false), Some(true)].into_iter().enumerate() {
        if let Some(on) = mode {
            p.set_enabled(on);
        }
        let probe = mode.map(|_| &probe);
        let t = Instant::now();
        for _ in 0..batches {
            let scope = batch_start(std::hint::black_box(probe), "hook-cost", batch_len);
            batch_end(probe, scope, std::hint::black_box(&slots[..]));
        }
        out[i] = t.elapsed().as_nanos() as f64 / batches as f64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paused_profiler_records_nothing_and_counts_enabled_sinks() {
        let p = Profiler::new();
        assert!(device_profiling());
        p.set_enabled(false);
        p.set_enabled(false);
        let before = p.recorded_spans();
        let probe = p.kernel_probe("k", p.inner.epoch);
        let scope = batch_start(Some(&probe), "k", 0);
        assert!(!scope.on);
        batch_end::<u32>(Some(&probe), scope, &[]);
        assert_eq!(p.recorded_spans(), before);
        p.set_enabled(true);
        assert!(p.is_enabled());
    }
}
