//! `resident bench-wgpu`: on one wgpu adapter in one run, a ring kernel that keeps its state on
//! the device (pipelined batches through the runtime) against the same WGSL handler run
//! stateless (state uploaded, dispatch, outputs and state downloaded, per batch), for 64-byte
//! messages and batch sizes 64 / 1024 / 16384: messages per second and per-batch round-trip
//! p50/p99, each point repeated, with the spread.
//!
//! The baseline runs without the runtime (no host queues, no pump): it is the cheaper path on
//! the host, so the ratio is conservative for the ring kernel. On a software adapter
//! (lavapipe) the absolute figures are CPU figures; the ratio is what carries over.

use std::time::{Duration, Instant};

use resident::backend::wgpu::ring::StatelessBatches;
use resident::backend::wgpu::WgpuContext;
use resident::prelude::*;
use resident::ring::Slot;
use serde_json::{json, Value};

device_message! {
    /// A 64-byte message.
    pub struct Msg64 { pub v: [u32; 16] }
}

/// Histogram bins in the device state (4 bytes each).
const BINS: usize = 4096;

device_message! {
    /// Device state: a histogram the handler updates per message (16 KiB).
    pub struct Hist { pub bins: [u32; 4096] }
}

const HANDLER: &str = r#"
fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    var m = input;
    var acc = 0u;
    for (var i = 0u; i < 16u; i = i + 1u) {
        acc = acc * 31u + m.v[i];
        (*out).v[i] = m.v[i] ^ acc;
    }
    atomicAdd(&state.bins[acc % 4096u], 1u);
    return true;
}
"#;

const T: Duration = Duration::from_secs(120);

fn handler() -> WgslHandler<Msg64, Msg64> {
    WgslHandler::new(HANDLER).state(Hist { bins: [0; BINS] })
}

fn msg(i: u64) -> Msg64 {
    let mut v = [0u32; 16];
    for (k, x) in v.iter_mut().enumerate() {
        *x = (i as u32).wrapping_mul(2654435761).wrapping_add(k as u32);
    }
    Msg64 { v }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

struct Point {
    msgs_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    checksum: u64,
}

fn receive_n(h: &KernelHandle<Msg64, Msg64>, n: usize, buf: &mut Vec<Msg64>) -> Result<(), String> {
    buf.clear();
    while buf.len() < n {
        let got = h.receive_batch(buf, n - buf.len()).map_err(|e| e.to_string())?;
        if got == 0 {
            buf.push(h.receive(T).map_err(|e| e.to_string())?);
        }
    }
    Ok(())
}

fn send_all(h: &KernelHandle<Msg64, Msg64>, msgs: &[Msg64]) -> Result<(), String> {
    let mut sent = 0;
    while sent < msgs.len() {
        sent += h.send_batch(&msgs[sent..]).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn resident_point(rt: &Runtime, batch: usize, iters: usize, total: usize, run: usize) -> Result<Point, String> {
    let id = format!("bench-{batch}-{run}");
    let h = rt
        .launch(
            RingKernel::<Msg64, Msg64>::new(&id)
                .priority_lanes(1)
                .queue_size((batch * 4).max(4096))
                .batch_size(batch)
                .backpressure(Backpressure::Block(T))
                .wgsl(handler()),
        )
        .map_err(|e| e.to_string())?;
    h.activate().map_err(|e| e.to_string())?;
    let input: Vec<Msg64> = (0..batch as u64).map(msg).collect();
    let mut out = Vec::with_capacity(batch);
    // Warm-up (pipeline compile, first-touch of buffers).
    send_all(&h, &input)?;
    receive_n(&h, batch, &mut out)?;
    // Round trip of one batch at a time.
    let mut rts = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        send_all(&h, &input)?;
        receive_n(&h, batch, &mut out)?;
        rts.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    // Throughput: a producer streams `total` messages while this thread receives.
    let producer = {
        let h = h.clone();
        let input = input.clone();
        std::thread::spawn(move || -> Result<(), String> {
            let mut left = total;
            while left > 0 {
                let n = left.min(input.len());
                send_all(&h, &input[..n])?;
                left -= n;
            }
            Ok(())
        })
    };
    let t0 = Instant::now();
    let mut got = 0;
    while got < total {
        let want = (total - got).min(batch);
        receive_n(&h, want, &mut out)?;
        got += want;
    }
    let secs = t0.elapsed().as_secs_f64();
    producer.join().map_err(|_| "producer panicked".to_string())??;
    let state = h.snapshot_state::<Hist>().map_err(|e| e.to_string())?;
    let counted: u64 = state.bins.iter().map(|&b| b as u64).sum();
    let expected = (batch + iters * batch + total) as u64;
    if counted != expected {
        return Err(format!("resident state counts {counted} messages, {expected} were sent"));
    }
    let checksum = out.iter().map(|m| m.v[15] as u64).sum();
    h.terminate().map_err(|e| e.to_string())?;
    rts.sort_by(|a, b| a.total_cmp(b));
    Ok(Point {
        msgs_per_s: total as f64 / secs,
        p50_us: pct(&rts, 0.5),
        p99_us: pct(&rts, 0.99),
        checksum,
    })
}

fn stateless_point(batch: usize, iters: usize, total: usize) -> Result<Point, String> {
    let mut k = StatelessBatches::new(&handler(), batch).map_err(|e| e.to_string())?;
    let input: Vec<Slot<Msg64>> = (0..batch as u64)
        .map(|i| Slot::new(Envelope::new(i + 1, 128, 0), msg(i)))
        .collect();
    let mut out = Vec::with_capacity(batch);
    k.run(&input, &mut out).map_err(|e| e.to_string())?;
    let mut rts = Vec::with_capacity(iters);
    for _ in 0..iters {
        out.clear();
        let t0 = Instant::now();
        k.run(&input, &mut out).map_err(|e| e.to_string())?;
        rts.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    let t0 = Instant::now();
    let mut left = total;
    while left > 0 {
        let n = left.min(batch);
        out.clear();
        k.run(&input[..n], &mut out).map_err(|e| e.to_string())?;
        left -= n;
    }
    let secs = t0.elapsed().as_secs_f64();
    let state: &[u32] = bytemuck::cast_slice(k.state());
    let counted: u64 = state.iter().map(|&b| b as u64).sum();
    let expected = (batch + iters * batch + total) as u64;
    if counted != expected {
        return Err(format!("stateless state counts {counted} messages, {expected} were run"));
    }
    let checksum = out.iter().map(|s| s.payload.v[15] as u64).sum();
    rts.sort_by(|a, b| a.total_cmp(b));
    Ok(Point {
        msgs_per_s: total as f64 / secs,
        p50_us: pct(&rts, 0.5),
        p99_us: pct(&rts, 0.99),
        checksum,
    })
}

fn spread(v: &[f64]) -> Value {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    json!({"runs": v, "median": s[s.len() / 2], "min": s[0], "max": s[s.len() - 1]})
}

/// Runs the benchmark; writes `wgpu-<adapter>-<date>.json` under `out_dir`.
pub fn run(repeats: usize, quick: bool, out_dir: &std::path::Path) -> Result<(), String> {
    let ctx = WgpuContext::shared(false).map_err(|e| e.to_string())?;
    let a = ctx.properties().clone();
    let software = !a.kind.is_hardware();
    println!(
        "== bench-wgpu on {} ({}, {}){} ==",
        a.name,
        a.api,
        a.kind,
        if software { ": a software adapter, so these are CPU figures; the ratio is what carries over" } else { "" }
    );
    let rt = Runtime::builder()
        .backend(Backend::Wgpu)
        .build()
        .map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for &batch in &[64usize, 1024, 16384] {
        let iters = match (batch, quick) {
            (64, false) => 200,
            (1024, false) => 60,
            (_, false) => 12,
            (64, true) => 40,
            (1024, true) => 12,
            (_, true) => 4,
        };
        let total = if quick { (batch * 8).max(8192) } else { (batch * 16).max(65536) };
        let mut res = Vec::new();
        let mut base = Vec::new();
        for r in 0..repeats {
            // Alternate the order so drift on a shared machine does not favour one side.
            if r % 2 == 0 {
                res.push(resident_point(&rt, batch, iters, total, r)?);
                base.push(stateless_point(batch, iters, total)?);
            } else {
                base.push(stateless_point(batch, iters, total)?);
                res.push(resident_point(&rt, batch, iters, total, r)?);
            }
        }
        if res.iter().chain(&base).any(|p| p.checksum != res[0].checksum) {
            return Err(format!("batch {batch}: the two variants computed different outputs"));
        }
        let f = |v: &[Point], g: fn(&Point) -> f64| v.iter().map(g).collect::<Vec<_>>();
        let ratios: Vec<f64> = res.iter().zip(&base).map(|(r, b)| r.msgs_per_s / b.msgs_per_s).collect();
        let p50_ratios: Vec<f64> = res.iter().zip(&base).map(|(r, b)| b.p50_us / r.p50_us).collect();
        let row = json!({
            "batch": batch,
            "message_bytes": 64,
            "state_bytes": BINS * 4,
            "latency_batches": iters,
            "throughput_messages": total,
            "resident": {
                "msgs_per_s": spread(&f(&res, |p| p.msgs_per_s)),
                "round_trip_p50_us": spread(&f(&res, |p| p.p50_us)),
                "round_trip_p99_us": spread(&f(&res, |p| p.p99_us)),
            },
            "stateless": {
                "msgs_per_s": spread(&f(&base, |p| p.msgs_per_s)),
                "round_trip_p50_us": spread(&f(&base, |p| p.p50_us)),
                "round_trip_p99_us": spread(&f(&base, |p| p.p99_us)),
            },
            "throughput_ratio_resident_over_stateless": spread(&ratios),
            "p50_speedup_resident_over_stateless": spread(&p50_ratios),
        });
        println!(
            "batch {batch:>5}: resident {:>10.0} msg/s (p50 {:>8.0} us, p99 {:>8.0} us) | stateless {:>10.0} msg/s (p50 {:>8.0} us, p99 {:>8.0} us) | throughput x{:.2} [{:.2}..{:.2}]",
            row["resident"]["msgs_per_s"]["median"].as_f64().unwrap_or(0.0),
            row["resident"]["round_trip_p50_us"]["median"].as_f64().unwrap_or(0.0),
            row["resident"]["round_trip_p99_us"]["median"].as_f64().unwrap_or(0.0),
            row["stateless"]["msgs_per_s"]["median"].as_f64().unwrap_or(0.0),
            row["stateless"]["round_trip_p50_us"]["median"].as_f64().unwrap_or(0.0),
            row["stateless"]["round_trip_p99_us"]["median"].as_f64().unwrap_or(0.0),
            row["throughput_ratio_resident_over_stateless"]["median"].as_f64().unwrap_or(0.0),
            row["throughput_ratio_resident_over_stateless"]["min"].as_f64().unwrap_or(0.0),
            row["throughput_ratio_resident_over_stateless"]["max"].as_f64().unwrap_or(0.0),
        );
        rows.push(row);
    }
    let date = resident::cuda::bench::utc_date(std::time::SystemTime::now());
    let command: Vec<String> = std::env::args().collect();
    let report = json!({
        "benchmark": "wgpu-ring-vs-stateless",
        "command": command.join(" "),
        "date": date,
        "machine": crate::bench::machine(),
        "adapter": {
            "name": a.name, "api": a.api, "device_type": a.kind.to_string(),
            "software": software, "driver": a.driver,
        },
        "note": if software {
            "Software adapter (Mesa lavapipe: Vulkan compute on the host CPU). Absolute figures are CPU figures, not GPU figures; only the resident/stateless ratio carries over, and on a GPU the stateless side also pays PCIe transfers for the state."
        } else {
            "Hardware adapter."
        },
        "method": "resident: one ring kernel per point through Runtime/KernelHandle (state in a device buffer for the kernel's life, 3 batches in flight); stateless: the same compiled WGSL handler run batch by batch with the 16 KiB state uploaded before and downloaded after every batch, without the runtime. Round trip = one batch sent until all its outputs are received (one batch at a time); msgs_per_s = a stream of throughput_messages. Both variants' outputs and state (histogram total = messages run) are checked.",
        "repeats": repeats,
        "rows": rows,
    });
    std::fs::create_dir_all(out_dir).map_err(|e| e.to_string())?;
    let slug: String = a
        .name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .split('-')
        .filter(|s| !s.is_empty())
        .take(2)
        .collect::<Vec<_>>()
        .join("-");
    let path = out_dir.join(format!("wgpu-{slug}-{date}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json")).map_err(|e| e.to_string())?;
    println!("wrote {}", path.display());
    Ok(())
}
