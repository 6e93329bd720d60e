//! Chrome trace event format export (the JSON that Perfetto and `chrome://tracing` open).
//!
//! Layout: process 1 "resident kernels" holds two threads per kernel, `kernel <id>` (its
//! batches, or a device pump's pushes and pulls) and `kernel <id> queue` (how long the oldest
//! message of each batch waited); process 2 "resident devices" holds one thread per device
//! (copies, launch overhead, one-shot kernel work). Spans are complete events (`"ph": "X"`,
//! microseconds); a flow arrow (`"s"` -> `"f"`, one per batch) runs from the oldest message's
//! send to the start of the batch that handled it. Idle gaps between a kernel's batches are
//! shown as `idle` spans.

use serde_json::{json, Value};

use super::{Inner, SpanKind, TrackKind};

/// Process id of the kernels' tracks.
pub const KERNEL_PID: u64 = 1;
/// Process id of the devices' tracks.
pub const DEVICE_PID: u64 = 2;

/// Thread id of a track's main row.
pub fn track_tid(track: u32) -> u64 {
    2 * track as u64 + 1
}

/// Thread id of a kernel's queue row.
pub fn queue_tid(track: u32) -> u64 {
    2 * track as u64 + 2
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

pub(crate) fn chrome_trace(inner: &Inner) -> Value {
    let tracks = inner.tracks();
    let spans = inner.ring.snapshot();
    let mut ev: Vec<Value> = Vec::with_capacity(spans.len() * 2 + tracks.len() * 2 + 4);
    ev.push(
        json!({"name": "process_name", "ph": "M", "pid": KERNEL_PID, "tid": 0,
                   "args": {"name": "resident kernels"}}),
    );
    ev.push(
        json!({"name": "process_name", "ph": "M", "pid": DEVICE_PID, "tid": 0,
                   "args": {"name": "resident devices"}}),
    );
    let pid_of = |track: u32| match tracks.get(track as usize).map(|t| t.kind) {
        Some(TrackKind::Device) => DEVICE_PID,
        _ => KERNEL_PID,
    };
    for t in &tracks {
        match t.kind {
            TrackKind::Kernel => {
                ev.push(json!({"name": "thread_name", "ph": "M", "pid": KERNEL_PID,
                               "tid": track_tid(t.id), "args": {"name": format!("kernel {}", t.name)}}));
                ev.push(json!({"name": "thread_name", "ph": "M", "pid": KERNEL_PID,
                               "tid": queue_tid(t.id), "args": {"name": format!("kernel {} queue", t.name)}}));
                ev.push(
                    json!({"name": "thread_sort_index", "ph": "M", "pid": KERNEL_PID,
                               "tid": track_tid(t.id), "args": {"sort_index": 2 * t.id}}),
                );
                ev.push(
                    json!({"name": "thread_sort_index", "ph": "M", "pid": KERNEL_PID,
                               "tid": queue_tid(t.id), "args": {"sort_index": 2 * t.id + 1}}),
                );
            }
            TrackKind::Device => {
                ev.push(json!({"name": "thread_name", "ph": "M", "pid": DEVICE_PID,
                               "tid": track_tid(t.id), "args": {"name": format!("device {}", t.name)}}));
            }
        }
    }
    // Last batch end per kernel track, for idle gaps.
    let mut last_end: Vec<Option<u64>> = vec![None; tracks.len()];
    // End of the last queue-wait span per kernel track: queue spans are clipped to it so the
    // queue row never holds overlapping slices.
    let mut last_queue: Vec<u64> = vec![0; tracks.len()];
    let mut flow_id: u64 = 0;
    for s in &spans {
        let pid = pid_of(s.track);
        let tid = track_tid(s.track);
        let cat = match s.kind {
            SpanKind::Batch | SpanKind::Compute => "handler",
            SpanKind::ToDevice | SpanKind::ToHost | SpanKind::DevicePush | SpanKind::DevicePull => {
                "transfer"
            }
            SpanKind::Launch | SpanKind::Setup => "launch",
        };
        let args = match s.kind {
            SpanKind::Batch | SpanKind::DevicePush | SpanKind::DevicePull => {
                json!({"messages": s.a})
            }
            SpanKind::ToDevice | SpanKind::ToHost => json!({"bytes": s.a}),
            SpanKind::Launch | SpanKind::Compute => json!({"elements": s.a}),
            SpanKind::Setup => json!({}),
        };
        if pid == KERNEL_PID && matches!(s.kind, SpanKind::Batch | SpanKind::DevicePush) {
            let idx = s.track as usize;
            if let Some(Some(prev)) = last_end.get(idx) {
                if s.start_ns > *prev {
                    ev.push(
                        json!({"name": "idle", "cat": "idle", "ph": "X", "ts": us(*prev),
                                   "dur": us(s.start_ns - prev), "pid": pid, "tid": tid}),
                    );
                }
            }
            if let Some(l) = last_end.get_mut(idx) {
                *l = Some(s.start_ns + s.dur_ns);
            }
            // Queue wait of the batch's oldest message, with a flow arrow into the batch.
            let from = s.b.max(last_queue.get(idx).copied().unwrap_or(0));
            if s.a > 0 && from < s.start_ns {
                flow_id += 1;
                if let Some(l) = last_queue.get_mut(idx) {
                    *l = s.start_ns;
                }
                let q = queue_tid(s.track);
                ev.push(
                    json!({"name": "queue wait", "cat": "queue", "ph": "X", "ts": us(from),
                               "dur": us(s.start_ns - from), "pid": pid, "tid": q,
                               "args": {"messages": s.a, "oldest_sent_us": us(s.b)}}),
                );
                ev.push(
                    json!({"name": "message", "cat": "flow", "ph": "s", "id": flow_id,
                               "ts": us(from), "pid": pid, "tid": q}),
                );
                ev.push(
                    json!({"name": "message", "cat": "flow", "ph": "f", "bp": "e", "id": flow_id,
                               "ts": us(s.start_ns), "pid": pid, "tid": tid}),
                );
            }
        }
        ev.push(
            json!({"name": s.kind.name(), "cat": cat, "ph": "X", "ts": us(s.start_ns),
                       "dur": us(s.dur_ns), "pid": pid, "tid": tid, "args": args}),
        );
    }
    json!({
        "traceEvents": ev,
        "displayTimeUnit": "ns",
        "otherData": {
            "producer": "resident profiler",
            "spans_recorded": inner.ring.offered(),
            "spans_dropped": inner.ring.dropped(),
        }
    })
}
