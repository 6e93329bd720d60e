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

use resident::backend::wgpu::ring::{ResidentBatches, StatelessBatches};
use resident::backend::wgpu::WgpuContext;
use resident::prelude::*;
use resident::ring::Slot;
use serde_json::{json, Value};

use crate::error::OutputCheck;
use crate::provenance::{command, machine, today};
use crate::stats::{quantile, spread};
use crate::BenchError;

device_message! {
    /// A 64-byte message.
    struct Msg64 { v: [u32; 16] }
}

device_message! {
    /// Device state: a histogram the handler updates per message (16 KiB).
    struct Hist16K { bins: [u32; 4096] }
}

device_message! {
    /// Device state: a histogram the handler updates per message (1 MiB).
    struct Hist1M { bins: [u32; 262144] }
}

/// Options of the run.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Repeats of every point (the JSON gives the spread); at least 1.
    pub repeats: usize,
    /// Fewer batches per point.
    pub quick: bool,
}

fn handler_source(bins: usize) -> String {
    format!(
        r#"
fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {{
    var m = input;
    var acc = 0u;
    for (var i = 0u; i < 16u; i = i + 1u) {{
        acc = acc * 31u + m.v[i];
        (*out).v[i] = m.v[i] ^ acc;
    }}
    atomicAdd(&state.bins[acc % {bins}u], 1u);
    return true;
}}
"#
    )
}

/// The bound on every wait of the benchmark.
const T: Duration = Duration::from_secs(120);

/// A histogram state of some size: the only thing the benchmark varies between state sizes.
trait HistState: DeviceMessage + Copy {
    const BINS: usize;
}
impl HistState for Hist16K {
    const BINS: usize = 4096;
}
impl HistState for Hist1M {
    const BINS: usize = 262144;
}

fn handler<S: HistState>() -> WgslHandler<Msg64, Msg64> {
    WgslHandler::new(handler_source(S::BINS)).state(<S as bytemuck::Zeroable>::zeroed())
}

fn total_count(state_bytes: &[u8]) -> u64 {
    bytemuck::cast_slice::<u8, u32>(state_bytes)
        .iter()
        .map(|&b| b as u64)
        .sum()
}

/// The state must count every message run, or the figures are of a wrong computation.
fn check_count(variant: &'static str, got: u64, want: u64) -> Result<(), BenchError> {
    if got == want {
        Ok(())
    } else {
        Err(BenchError::Check {
            variant,
            check: OutputCheck::StateCount { got, want },
        })
    }
}

fn msg(i: u64) -> Msg64 {
    let mut v = [0u32; 16];
    for (k, x) in v.iter_mut().enumerate() {
        *x = (i as u32).wrapping_mul(2654435761).wrapping_add(k as u32);
    }
    Msg64 { v }
}

struct Point {
    msgs_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    checksum: u64,
}

impl Point {
    fn new(total: usize, secs: f64, mut rts: Vec<f64>, checksum: u64) -> Point {
        rts.sort_by(|a, b| a.total_cmp(b));
        Point {
            msgs_per_s: total as f64 / secs,
            p50_us: quantile(&rts, 0.5).unwrap_or(f64::NAN),
            p99_us: quantile(&rts, 0.99).unwrap_or(f64::NAN),
            checksum,
        }
    }
}

fn receive_n(
    h: &KernelHandle<Msg64, Msg64>,
    n: usize,
    buf: &mut Vec<Msg64>,
) -> Result<(), BenchError> {
    buf.clear();
    while buf.len() < n {
        let got = h.receive_batch(buf, n - buf.len())?;
        if got == 0 {
            buf.push(h.receive(T)?);
        }
    }
    Ok(())
}

fn send_all(h: &KernelHandle<Msg64, Msg64>, msgs: &[Msg64]) -> Result<(), BenchError> {
    let mut sent = 0;
    while sent < msgs.len() {
        sent += h.send_batch(&msgs[sent..])?;
    }
    Ok(())
}

fn resident_point<S: HistState>(
    rt: &Runtime,
    batch: usize,
    iters: usize,
    total: usize,
    run: usize,
) -> Result<Point, BenchError> {
    let id = format!("bench-{batch}-{run}");
    let h = rt.launch(
        RingKernel::<Msg64, Msg64>::new(&id)
            .priority_lanes(1)
            .queue_size((batch * 4).max(4096))
            .batch_size(batch)
            .backpressure(Backpressure::Block(T))
            .wgsl(handler::<S>()),
    )?;
    h.activate()?;
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
        std::thread::spawn(move || -> Result<(), BenchError> {
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
    producer
        .join()
        .map_err(|_| BenchError::ThreadPanicked("producer"))??;
    let state = h.snapshot_state::<S>()?;
    check_count(
        "resident_runtime",
        total_count(bytemuck::bytes_of(&state)),
        (batch + iters * batch + total) as u64,
    )?;
    let checksum = out.iter().map(|m| m.v[15] as u64).sum();
    h.terminate()?;
    Ok(Point::new(total, secs, rts, checksum))
}

fn slots(batch: usize) -> Vec<Slot<Msg64>> {
    (0..batch as u64)
        .map(|i| Slot::new(Envelope::new(i + 1, 128, 0), msg(i)))
        .collect()
}

/// Backs off like the runtime's pump: a few yields, then 50 us sleeps (lavapipe's threads
/// share the CPU with this one).
fn backoff(idle: &mut u32) {
    *idle += 1;
    if *idle < 16 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Pulls until `n` outputs arrived (bounded), backing off between polls.
fn pull_n(
    k: &mut ResidentBatches<Msg64, Msg64>,
    n: usize,
    out: &mut Vec<Slot<Msg64>>,
) -> Result<(), BenchError> {
    out.clear();
    let deadline = Instant::now() + T;
    let mut idle = 0;
    while out.len() < n {
        if k.pull(out, n - out.len())? == 0 {
            if Instant::now() > deadline {
                return Err(BenchError::Timeout {
                    what: "the engine's outputs",
                    limit: T,
                });
            }
            backoff(&mut idle);
        } else {
            idle = 0;
        }
    }
    Ok(())
}

/// The ring kernel's device side driven directly (no runtime): residency and pipelining alone.
fn engine_point<S: HistState>(
    batch: usize,
    iters: usize,
    total: usize,
) -> Result<Point, BenchError> {
    let mut k = ResidentBatches::new(&handler::<S>(), batch)?;
    let input = slots(batch);
    let mut out = Vec::with_capacity(batch);
    let run_one = |k: &mut ResidentBatches<Msg64, Msg64>,
                   out: &mut Vec<Slot<Msg64>>|
     -> Result<(), BenchError> {
        let mut taken = 0;
        while taken < input.len() {
            taken += k.push(&input[taken..]);
        }
        pull_n(k, input.len(), out)
    };
    run_one(&mut k, &mut out)?;
    let mut rts = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        run_one(&mut k, &mut out)?;
        rts.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    // Throughput: keep the batch sets full, collect outputs as they complete.
    let t0 = Instant::now();
    let (mut sent, mut got) = (0usize, 0usize);
    let mut last = Vec::with_capacity(batch);
    let deadline = Instant::now() + T;
    let mut idle = 0;
    while got < total {
        let mut progressed = false;
        while sent < total {
            let want = (total - sent).min(batch);
            let n = k.push(&input[..want]);
            sent += n;
            if n == 0 {
                break;
            }
            progressed = true;
        }
        last.clear();
        let n = k.pull(&mut last, usize::MAX)?;
        got += n;
        if n == 0 && !progressed {
            if Instant::now() > deadline {
                return Err(BenchError::Timeout {
                    what: "the engine's throughput run",
                    limit: T,
                });
            }
            backoff(&mut idle);
        } else {
            idle = 0;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    k.finish(T)?;
    check_count(
        "resident_engine",
        total_count(&k.snapshot_state()?),
        (batch + iters * batch + total) as u64,
    )?;
    let checksum = out.iter().map(|s| s.payload.v[15] as u64).sum();
    Ok(Point::new(total, secs, rts, checksum))
}

fn stateless_point<S: HistState>(
    batch: usize,
    iters: usize,
    total: usize,
) -> Result<Point, BenchError> {
    let mut k = StatelessBatches::new(&handler::<S>(), batch)?;
    let input = slots(batch);
    let mut out = Vec::with_capacity(batch);
    k.run(&input, &mut out)?;
    let mut rts = Vec::with_capacity(iters);
    for _ in 0..iters {
        out.clear();
        let t0 = Instant::now();
        k.run(&input, &mut out)?;
        rts.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    let t0 = Instant::now();
    let mut left = total;
    while left > 0 {
        let n = left.min(batch);
        out.clear();
        k.run(&input[..n], &mut out)?;
        left -= n;
    }
    let secs = t0.elapsed().as_secs_f64();
    check_count(
        "stateless",
        total_count(k.state()),
        (batch + iters * batch + total) as u64,
    )?;
    let checksum = out.iter().map(|s| s.payload.v[15] as u64).sum();
    Ok(Point::new(total, secs, rts, checksum))
}

/// Latency batches and throughput messages of a point.
fn sizes(batch: usize, quick: bool) -> (usize, usize) {
    let iters = match (batch, quick) {
        (64, false) => 200,
        (1024, false) => 60,
        (_, false) => 12,
        (64, true) => 40,
        (1024, true) => 12,
        (_, true) => 4,
    };
    let total = if quick {
        (batch * 8).max(8192)
    } else {
        (batch * 16).max(65536)
    };
    (iters, total)
}

fn point<S: HistState>(
    rt: &Runtime,
    batch: usize,
    repeats: usize,
    quick: bool,
    say: &mut dyn FnMut(String),
) -> Result<Value, BenchError> {
    let (iters, total) = sizes(batch, quick);
    let (mut res, mut eng, mut base) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..repeats {
        // Rotate the order so drift on a shared machine does not favour one variant.
        for k in 0..3 {
            match (r + k) % 3 {
                0 => res.push(resident_point::<S>(rt, batch, iters, total, r)?),
                1 => eng.push(engine_point::<S>(batch, iters, total)?),
                _ => base.push(stateless_point::<S>(batch, iters, total)?),
            }
        }
    }
    let first = res[0].checksum;
    for (variant, v) in [
        ("resident_runtime", &res),
        ("resident_engine", &eng),
        ("stateless", &base),
    ] {
        if let Some(p) = v.iter().find(|p| p.checksum != first) {
            return Err(BenchError::Check {
                variant,
                check: OutputCheck::Checksum {
                    got: p.checksum,
                    want: first,
                },
            });
        }
    }
    let f = |v: &[Point], g: fn(&Point) -> f64| v.iter().map(g).collect::<Vec<_>>();
    let variant = |v: &[Point]| {
        json!({
            "msgs_per_s": spread(&f(v, |p| p.msgs_per_s)),
            "round_trip_p50_us": spread(&f(v, |p| p.p50_us)),
            "round_trip_p99_us": spread(&f(v, |p| p.p99_us)),
        })
    };
    let ratio = |a: &[Point], b: &[Point]| -> Vec<f64> {
        a.iter()
            .zip(b)
            .map(|(x, y)| x.msgs_per_s / y.msgs_per_s)
            .collect()
    };
    let p50 = |a: &[Point], b: &[Point]| -> Vec<f64> {
        a.iter().zip(b).map(|(x, y)| y.p50_us / x.p50_us).collect()
    };
    let row = json!({
        "batch": batch,
        "message_bytes": 64,
        "state_bytes": S::BINS * 4,
        "latency_batches": iters,
        "throughput_messages": total,
        "resident_runtime": variant(&res),
        "resident_engine": variant(&eng),
        "stateless": variant(&base),
        "throughput_ratio_runtime_over_stateless": spread(&ratio(&res, &base)),
        "throughput_ratio_engine_over_stateless": spread(&ratio(&eng, &base)),
        "p50_speedup_runtime_over_stateless": spread(&p50(&res, &base)),
        "p50_speedup_engine_over_stateless": spread(&p50(&eng, &base)),
    });
    let m = |v: &Value, k: &str, q: &str| v[k][q]["median"].as_f64().unwrap_or(0.0);
    say(format!(
        "state {:>4} KiB batch {batch:>5}: runtime {:>9.0} msg/s p50 {:>7.0} us | engine {:>9.0} msg/s p50 {:>7.0} us | stateless {:>9.0} msg/s p50 {:>7.0} us | engine/stateless x{:.2} [{:.2}..{:.2}], runtime/stateless x{:.2}",
        S::BINS * 4 / 1024,
        m(&row, "resident_runtime", "msgs_per_s"), m(&row, "resident_runtime", "round_trip_p50_us"),
        m(&row, "resident_engine", "msgs_per_s"), m(&row, "resident_engine", "round_trip_p50_us"),
        m(&row, "stateless", "msgs_per_s"), m(&row, "stateless", "round_trip_p50_us"),
        row["throughput_ratio_engine_over_stateless"]["median"].as_f64().unwrap_or(0.0),
        row["throughput_ratio_engine_over_stateless"]["min"].as_f64().unwrap_or(0.0),
        row["throughput_ratio_engine_over_stateless"]["max"].as_f64().unwrap_or(0.0),
        row["throughput_ratio_runtime_over_stateless"]["median"].as_f64().unwrap_or(0.0),
    ));
    Ok(row)
}

/// Runs the benchmark on the preferred wgpu adapter and returns its report (`benchmark`,
/// `command`, `date`, `machine`, `adapter: {name, api, device_type, software, driver}`,
/// `note`, `method`, `repeats`, `rows`). `say` gets the adapter line first, then one line per
/// point as it is measured.
///
/// The measuring runs on a thread of its own with a 64 MiB stack: the 1 MiB state type goes
/// into [`WgslHandler::state`] and comes out of `snapshot_state` by value, and an unoptimized
/// build keeps enough copies of it on the stack to overflow a main thread's 8 MiB.
pub fn run(o: &Options, say: &mut (dyn FnMut(String) + Send)) -> Result<Value, BenchError> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("bench-wgpu".into())
            .stack_size(STACK)
            .spawn_scoped(s, || measure(o, say))
            .map_err(|source| BenchError::Spawn {
                what: "the measuring thread",
                source,
            })?
            .join()
            .map_err(|_| BenchError::ThreadPanicked("measuring"))?
    })
}

/// The measuring thread's stack (16 MiB was measured to be enough for a debug build).
const STACK: usize = 64 << 20;

fn measure(o: &Options, say: &mut (dyn FnMut(String) + Send)) -> Result<Value, BenchError> {
    let repeats = o.repeats.max(1);
    let ctx = WgpuContext::shared(false)?;
    let a = ctx.properties().clone();
    let software = !a.kind.is_hardware();
    say(format!(
        "== bench-wgpu on {} ({}, {}){} ==",
        a.name,
        a.api,
        a.kind,
        if software {
            ": a software adapter, so these are CPU figures; the ratio is what carries over"
        } else {
            ""
        }
    ));
    let rt = Runtime::builder().backend(Backend::Wgpu).build()?;
    let mut rows = Vec::new();
    for state_kib in [16usize, 1024] {
        for &batch in &[64usize, 1024, 16384] {
            let row = if state_kib == 16 {
                point::<Hist16K>(&rt, batch, repeats, o.quick, say)?
            } else {
                point::<Hist1M>(&rt, batch, repeats, o.quick, say)?
            };
            rows.push(row);
        }
    }
    Ok(json!({
        "benchmark": "wgpu-ring-vs-stateless",
        "command": command(),
        "date": today(),
        "machine": machine(),
        "adapter": {
            "name": a.name, "api": a.api, "device_type": a.kind.to_string(),
            "software": software, "driver": a.driver,
        },
        "note": if software {
            "Software adapter (Mesa lavapipe: Vulkan compute on the host CPU). Absolute figures are CPU figures, not GPU figures; only the resident/stateless ratio carries over, and on a GPU the stateless side also pays PCIe transfers for the state."
        } else {
            "Hardware adapter."
        },
        "method": "Three variants of one WGSL handler (64 B message in and out, a histogram state of state_bytes updated with atomicAdd per message). resident_runtime: a ring kernel through Runtime/KernelHandle (state in a device buffer for the kernel's life, 3 batches in flight, host mailboxes and pump thread included). resident_engine: the same device side (ResidentBatches) driven directly without the runtime: what residency and pipelining alone give. stateless: the same compiled handler batch by batch with the state uploaded before and downloaded after every batch, no runtime. Round trip = one batch submitted until all its outputs are back (one batch at a time); msgs_per_s = a stream of throughput_messages. Every variant's outputs (checksum) and state (histogram total = messages run) are checked.",
        "repeats": repeats,
        "rows": rows,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_sizes_are_smaller_and_cover_a_batch() {
        for batch in [64, 1024, 16384] {
            let (qi, qt) = sizes(batch, true);
            let (fi, ft) = sizes(batch, false);
            assert!(qi < fi && qt < ft, "batch {batch}");
            assert!(qt >= batch && qt >= 8192);
        }
    }

    #[test]
    fn a_state_that_lost_messages_is_a_typed_check_failure() {
        assert!(check_count("stateless", 10, 10).is_ok());
        assert!(matches!(
            check_count("stateless", 9, 10),
            Err(BenchError::Check {
                variant: "stateless",
                check: OutputCheck::StateCount { got: 9, want: 10 }
            })
        ));
        let state = [1u32, 2, 3];
        assert_eq!(total_count(bytemuck::cast_slice(&state)), 6);
    }
}
