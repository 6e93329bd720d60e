//! The workloads' WGSL handlers (`resident_workloads::device::wgsl`) on the wgpu backend
//! (lavapipe in CI), at small sizes, checked against the sequential f64 references. The
//! handlers compute in f32, so the checks use f32 tolerances measured here (each test prints
//! the largest relative error it saw). Without an adapter each test prints `SKIP:` and
//! returns, unless `RESIDENT_REQUIRE_WGPU=1`, then it fails.

use std::time::Duration;

use resident::backend::{self, DeviceHandle};
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::UnifiedBuffer;
use resident_workloads::anomaly::{self, AlertMsg, ReadingMsg, SensorStats};
use resident_workloads::device::wgsl::{
    run_stateless_wgpu, ANOMALY_STATELESS_WGSL, PAGERANK_WGSL, PIPELINE_WGSL, VECTOR_ADD_WGSL,
};
use resident_workloads::input::{generate_graph, generate_readings, EdgeList};
use resident_workloads::pagerank::{self, Csr, PageRankStep, StepDone};
use resident_workloads::pipeline::{self, Normalized, Raw, Scored};
use resident_workloads::vector_add::{self, AddRange, RangeDone};

const T: Duration = Duration::from_secs(60);

/// Relative tolerances for the f32 handlers (the observed maxima are printed by the tests and
/// sit well below these).
const PIPELINE_TOL: f64 = 1e-6;
const ANOMALY_TOL: f64 = 1e-4;
const PAGERANK_TOL: f64 = 1e-5;

fn wgpu(test: &str) -> Option<(Runtime, DeviceHandle)> {
    let r = Runtime::builder()
        .backend(Backend::Wgpu)
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| Ok((rt, backend::open(Backend::Wgpu).map_err(|e| e.to_string())?)));
    match r {
        Ok(x) => Some(x),
        Err(e) => {
            if std::env::var("RESIDENT_REQUIRE_WGPU").as_deref() == Ok("1") {
                panic!("RESIDENT_REQUIRE_WGPU=1 but the wgpu backend is unavailable: {e}");
            }
            println!("SKIP: {test}: {e}");
            None
        }
    }
}

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
    }
}

#[test]
fn vector_add_wgsl_matches_the_reference() {
    let Some((rt, d)) = wgpu("vector_add_wgsl_matches_the_reference") else {
        return;
    };
    let (a, b) = vector_add::inputs(10_007, 3);
    let n = a.len();
    let o = BufferOptions::default();
    let k = rt
        .launch(
            RingKernel::<AddRange, RangeDone>::new("va-wgsl")
                .queue_size(1024)
                .bind("a", UnifiedBuffer::from_slice(&d, &a, o).unwrap())
                .bind("b", UnifiedBuffer::from_slice(&d, &b, o).unwrap())
                .bind(
                    "c",
                    UnifiedBuffer::<f32>::from_slice(&d, &vec![0.0; n], o).unwrap(),
                )
                .wgsl(WgslHandler::new(VECTOR_ADD_WGSL).function("vector_add")),
        )
        .unwrap();
    k.activate().unwrap();
    let ranges: Vec<AddRange> = (0..n)
        .step_by(500)
        .map(|s| AddRange {
            offset: s as u64,
            len: 500.min(n - s) as u64,
        })
        .collect();
    let mut sent = 0;
    while sent < ranges.len() {
        sent += k.send_batch(&ranges[sent..]).unwrap();
    }
    for _ in 0..ranges.len() {
        assert_eq!(k.receive(T).unwrap().ok, 1);
    }
    let c = k.read_buffer::<f32>("c", T).unwrap().to_vec();
    vector_add::check(&a, &b, &c).unwrap();
    let max = a
        .iter()
        .zip(&b)
        .zip(&c)
        .map(|((&x, &y), &z)| rel(z as f64, x as f64 + y as f64))
        .fold(0.0, f64::max);
    println!("vector add: max relative error {max:e} (f32 addition, correctly rounded)");
    // Ranges past the buffers or overflowing answer ok = 0 and write nothing.
    for bad in [
        AddRange {
            offset: n as u64 - 5,
            len: 10,
        },
        AddRange {
            offset: u64::MAX - 2,
            len: 5,
        },
        AddRange {
            offset: 3,
            len: 1 << 32,
        },
    ] {
        let done = k.call(bad, T).unwrap();
        assert_eq!((done.ok, done.offset, done.len), (0, bad.offset, bad.len));
    }
    assert_eq!(k.read_buffer::<f32>("c", T).unwrap().to_vec(), c);
    k.terminate().unwrap();
}

#[test]
fn pipeline_wgsl_matches_the_reference() {
    let Some((rt, _d)) = wgpu("pipeline_wgsl_matches_the_reference") else {
        return;
    };
    let mut values: Vec<f64> = (0..3000)
        .map(|i| ((i * 7919) % 12_000) as f64 / 100.0 - 10.0)
        .collect();
    values.extend([
        f64::NAN,
        -1.0,
        0.0,
        100.0,
        100.5,
        1e300,
        -1e300,
        54.772,
        83.666,
    ]);
    let normalizer = rt
        .launch(
            RingKernel::<Raw, Normalized>::new("normalize-wgsl").wgsl(
                WgslHandler::new(PIPELINE_WGSL)
                    .function("normalize")
                    .declare::<Scored>(),
            ),
        )
        .unwrap();
    let scorer = rt
        .launch(
            RingKernel::<Normalized, Scored>::new("score-wgsl").wgsl(
                WgslHandler::new(PIPELINE_WGSL)
                    .function("score")
                    .declare::<Raw>(),
            ),
        )
        .unwrap();
    normalizer.activate().unwrap();
    scorer.activate().unwrap();
    // Kernel to kernel by hand (the runtime's forwarding is wired by the workload itself).
    let raws: Vec<Raw> = values
        .iter()
        .enumerate()
        .map(|(i, &v)| Raw {
            seq: i as u64,
            value: v,
        })
        .collect();
    let mut scored = Vec::new();
    for chunk in raws.chunks(500) {
        let mut sent = 0;
        while sent < chunk.len() {
            sent += normalizer.send_batch(&chunk[sent..]).unwrap();
        }
        let normalized: Vec<Normalized> = (0..chunk.len())
            .map(|_| normalizer.receive(T).unwrap())
            .collect();
        let mut sent = 0;
        while sent < normalized.len() {
            sent += scorer.send_batch(&normalized[sent..]).unwrap();
        }
        scored.extend((0..chunk.len()).map(|_| scorer.receive(T).unwrap()));
    }
    let want = pipeline::reference(&values);
    assert_eq!(scored.len(), want.len());
    let (mut max_x, mut max_s, mut levels_near_threshold) = (0.0f64, 0.0f64, 0);
    for (g, w) in scored.iter().zip(&want) {
        assert_eq!(g.seq, w.seq);
        let (ex, es) = (rel(g.x, w.x), rel(g.score, w.score));
        assert!(ex <= PIPELINE_TOL && es <= PIPELINE_TOL, "{g:?} vs {w:?}");
        max_x = max_x.max(ex);
        max_s = max_s.max(es);
        if g.level != w.level {
            // Only a score within f32 rounding of a threshold may land on the other side.
            assert!(
                [0.3, 0.7]
                    .iter()
                    .any(|t| (w.score - t).abs() <= PIPELINE_TOL * t),
                "{g:?} vs {w:?}"
            );
            levels_near_threshold += 1;
        }
    }
    // NaN -> 0, clamped at both ends.
    let at = |v: f64| {
        scored[values
            .iter()
            .position(|x| x.to_bits() == v.to_bits())
            .unwrap()]
    };
    assert_eq!((at(f64::NAN).x, at(f64::NAN).level), (0.0, 0));
    assert_eq!(at(-1e300).x, 0.0);
    assert_eq!(
        (at(1e300).x, at(1e300).score, at(1e300).level),
        (1.0, 1.0, 2)
    );
    println!(
        "pipeline: max relative error x {max_x:e}, score {max_s:e}; {levels_near_threshold} levels differ at a threshold"
    );
    normalizer.terminate().unwrap();
    scorer.terminate().unwrap();
}

/// Compares a run with the f64 reference: the same alerts except where the reference z sits
/// within the tolerance of the threshold, z and the final statistics within `tol`.
/// Returns the largest relative errors (z, m, v).
fn check_anomaly(
    got: &anomaly::RunReport,
    r: &anomaly::SlottedReadings,
    tol: f64,
) -> (f64, f64, f64) {
    let (want, stats) = anomaly::reference(r);
    let near = |z: f64| (z - anomaly::Z_THRESHOLD).abs() <= tol * anomaly::Z_THRESHOLD;
    let mut max_z = 0.0f64;
    let (mut gi, mut wi) = (0, 0);
    while gi < got.alerts.len() || wi < want.len() {
        match (got.alerts.get(gi), want.get(wi)) {
            (Some(g), Some(w)) if g.index == w.index => {
                assert_eq!(g.sensor, w.sensor);
                assert_eq!(g.value, w.value);
                let e = rel(g.z, w.z);
                assert!(e <= tol, "{g:?} vs {w:?}");
                max_z = max_z.max(e);
                gi += 1;
                wi += 1;
            }
            (Some(g), w) if w.is_none_or(|w| g.index < w.index) => {
                assert!(near(g.z), "an alert the reference does not have: {g:?}");
                gi += 1;
            }
            (_, Some(w)) => {
                assert!(near(w.z), "a reference alert missing: {w:?}");
                wi += 1;
            }
            _ => unreachable!(),
        }
    }
    assert_eq!(got.stats.len(), stats.len());
    let (mut max_m, mut max_v) = (0.0f64, 0.0f64);
    for (g, w) in got.stats.iter().zip(&stats) {
        assert_eq!(g.n, w.n);
        max_m = max_m.max(rel(g.m, w.m));
        max_v = max_v.max(rel(g.v, w.v));
    }
    assert!(max_m <= tol && max_v <= tol, "m {max_m:e}, v {max_v:e}");
    (max_z, max_m, max_v)
}

fn readings() -> anomaly::SlottedReadings {
    // 12 sensors x about 1000 readings each: past the 100-reading warm-up, with spikes.
    let (readings, spikes) = generate_readings(12_000, 12, 97, 7).unwrap();
    assert!(spikes.len() > 50);
    anomaly::slot(&readings)
}

#[test]
fn anomaly_actor_wgsl_matches_the_reference() {
    let Some((rt, d)) = wgpu("anomaly_actor_wgsl_matches_the_reference") else {
        return;
    };
    let r = readings();
    let sensors = r.sensor_ids.len();
    // The workload's keyed kernel runs its WGSL key handler on the device.
    let k = rt
        .launch(anomaly::kernel("anomaly-wgsl", &d, sensors).unwrap())
        .unwrap();
    assert_eq!(k.placement(), Placement::Device(backend::BackendKind::Wgpu));
    k.terminate().unwrap();
    for in_flight in [1, anomaly::IN_FLIGHT] {
        let report = anomaly::run_actor(&rt, &d, &r, 100, in_flight, |_| {}).unwrap();
        let (z, m, v) = check_anomaly(&report, &r, ANOMALY_TOL);
        println!(
            "anomaly actor ({in_flight} in flight): {} alerts, max relative error z {z:e}, m {m:e}, v {v:e}",
            report.alerts.len()
        );
    }
    // Every reading is processed once; a slot past the statistics is refused at send (typed,
    // nothing queued) and the statistics are untouched.
    let k = rt
        .launch(anomaly::kernel("anomaly-wgsl-refuse", &d, sensors).unwrap())
        .unwrap();
    k.activate().unwrap();
    let msgs: Vec<ReadingMsg> = (0..r.slots.len())
        .map(|i| ReadingMsg {
            index: i as u64,
            value: r.values[i],
            slot: r.slots[i],
            flush: 0,
        })
        .collect();
    let mut sent = 0;
    while sent < msgs.len() {
        sent += k.send_batch(&msgs[sent..]).unwrap();
        let mut got: Vec<AlertMsg> = Vec::new();
        k.receive_batch(&mut got, 4096).unwrap(); // the output queue must not fill
    }
    let t0 = std::time::Instant::now();
    while k.telemetry().messages_processed < msgs.len() as u64 {
        assert!(t0.elapsed() < T, "readings not processed within {T:?}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let a = k.call(anomaly::flush_marker(99), T).unwrap();
    assert_eq!((a.slot, a.index, a.value), (anomaly::FLUSH, 99, 0.0));
    assert_eq!(k.telemetry().messages_processed, msgs.len() as u64 + 1);
    let before = anomaly::read_stats(&k, sensors).unwrap();
    let e = k
        .send(ReadingMsg {
            index: 0,
            value: 1e6,
            slot: sensors as u32,
            flush: 0,
        })
        .unwrap_err();
    assert!(
        matches!(e, resident::Error::KeyOutOfRange { key, .. } if key == sensors as u64),
        "{e}"
    );
    let a = k.call(anomaly::flush_marker(100), T).unwrap();
    assert_eq!((a.slot, a.index), (anomaly::FLUSH, 100));
    assert_eq!(anomaly::read_stats(&k, sensors).unwrap(), before);
    k.terminate().unwrap();
}

#[test]
fn anomaly_stateless_wgsl_matches_the_reference() {
    let Some((_rt, d)) = wgpu("anomaly_stateless_wgsl_matches_the_reference") else {
        return;
    };
    // The source's struct is the generated one, byte for byte.
    use resident::ring::message::DeviceMessage;
    let decl = SensorStats::wgsl_declarations().unwrap();
    let body = decl.split_once("struct").unwrap().1;
    let squash = |s: &str| s.split_whitespace().collect::<String>();
    assert!(
        squash(ANOMALY_STATELESS_WGSL).contains(&squash(body)),
        "{decl}"
    );
    let r = readings();
    for batch in [100, 1000] {
        let mut done = 0;
        let report = run_stateless_wgpu(&d, &r, batch, |n| done += n).unwrap();
        assert_eq!(done, r.slots.len());
        assert_eq!(report.batch_latency.len(), r.slots.len().div_ceil(batch));
        let (z, m, v) = check_anomaly(&report, &r, ANOMALY_TOL);
        println!(
            "anomaly stateless (micro-batch {batch}): {} alerts, max relative error z {z:e}, m {m:e}, v {v:e}",
            report.alerts.len()
        );
    }
}

/// The generated graph with the out-edges of every 17th node removed (dangling nodes).
fn graph() -> EdgeList {
    let mut g = generate_graph(200, 5, 42).unwrap();
    g.edges.retain(|&(u, _)| u % 17 != 0);
    g
}

/// Launches the PageRank step kernel over `g` and drives the power iteration from the host
/// (all steps of iteration k, then k + 1) with `range` nodes per message. Returns the kernel,
/// the iteration count and where the final ranks start in `ranks`.
fn run_pagerank(
    rt: &Runtime,
    d: &DeviceHandle,
    g: &EdgeList,
    range: usize,
) -> (KernelHandle<PageRankStep, StepDone>, u32, usize) {
    let n = g.nodes();
    let csr = Csr::new(g);
    let p = pagerank::Params::default();
    let o = BufferOptions::default();
    let mut ranks = vec![0.0f64; 2 * n];
    ranks[..n].fill(1.0 / n as f64);
    let k = rt
        .launch(
            RingKernel::<PageRankStep, StepDone>::new(format!("pagerank-wgsl-{n}"))
                .queue_size(1024)
                .bind(
                    "in_offsets",
                    UnifiedBuffer::from_slice(d, &csr.in_offsets, o).unwrap(),
                )
                .bind(
                    "in_sources",
                    UnifiedBuffer::from_slice(d, &csr.in_sources, o).unwrap(),
                )
                .bind(
                    "out_degree",
                    UnifiedBuffer::from_slice(d, &csr.out_degree, o).unwrap(),
                )
                .bind("ranks", UnifiedBuffer::from_slice(d, &ranks, o).unwrap())
                .wgsl(WgslHandler::new(PAGERANK_WGSL).function("pagerank_step")),
        )
        .unwrap();
    k.activate().unwrap();
    let nf = n as f64;
    let mut dangling: f64 = (0..n)
        .filter(|&u| csr.out_degree[u] == 0)
        .map(|_| 1.0 / nf)
        .sum();
    for iter in 0..p.max_iter {
        let base = p.damping * dangling / nf + (1.0 - p.damping) / nf;
        let steps: Vec<PageRankStep> = (0..n)
            .step_by(range)
            .map(|lo| PageRankStep {
                base,
                damping: p.damping,
                iter,
                lo: lo as u32,
                hi: (lo + range).min(n) as u32,
                _pad: 0,
            })
            .collect();
        let mut sent = 0;
        while sent < steps.len() {
            sent += k.send_batch(&steps[sent..]).unwrap();
        }
        let (mut l1, mut next_dangling) = (0.0, 0.0);
        for _ in 0..steps.len() {
            let s = k.receive(T).unwrap();
            assert_eq!((s.ok, s.iter), (1, iter), "{s:?}");
            l1 += s.l1;
            next_dangling += s.dangling;
        }
        dangling = next_dangling;
        if l1 < nf * p.tol {
            return (k, iter + 1, ((iter as usize + 1) & 1) * n);
        }
    }
    panic!("no convergence in {} iterations", p.max_iter);
}

#[test]
fn pagerank_wgsl_matches_the_reference() {
    let Some((rt, d)) = wgpu("pagerank_wgsl_matches_the_reference") else {
        return;
    };
    let g = graph();
    let n = g.nodes();
    assert!(
        Csr::new(&g).out_degree.contains(&0),
        "the graph has dangling nodes"
    );
    let (k, iterations, at) = run_pagerank(&rt, &d, &g, 32);
    let p = pagerank::Params::default();
    let all = k.read_buffer::<f64>("ranks", T).unwrap().to_vec();
    let got = &all[at..at + n];
    let want = pagerank::reference(&g, p).unwrap();
    let max = got
        .iter()
        .zip(&want.ranks)
        .map(|(&a, &b)| rel(a, b))
        .fold(0.0, f64::max);
    println!(
        "pagerank: {iterations} iterations (reference {}), max relative error {max:e}",
        want.iterations
    );
    assert!(iterations.abs_diff(want.iterations) <= 1);
    assert!(max <= PAGERANK_TOL, "{max:e}");
    // Invalid steps answer ok = 0 and write nothing.
    for (lo, hi) in [(0, n as u32 + 1), (10, 5)] {
        let s = k
            .call(
                PageRankStep {
                    base: 1.0,
                    damping: 0.5,
                    iter: 0,
                    lo,
                    hi,
                    _pad: 0,
                },
                T,
            )
            .unwrap();
        assert_eq!(s.ok, 0);
    }
    assert_eq!(k.read_buffer::<f64>("ranks", T).unwrap().to_vec(), all);
    k.terminate().unwrap();
}

/// The same handlers at larger sizes, to tell what f32 costs in accuracy there (run with
/// `cargo test -p resident-workloads --test device_wgpu -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement at larger sizes (minutes on lavapipe), not a check"]
fn f32_errors_at_larger_sizes() {
    let Some((rt, d)) = wgpu("f32_errors_at_larger_sizes") else {
        return;
    };
    let (readings, _) = generate_readings(200_000, 1_000, 997, 11).unwrap();
    let r = anomaly::slot(&readings);
    let report = run_stateless_wgpu(&d, &r, 1000, |_| {}).unwrap();
    let (z, m, v) = check_anomaly(&report, &r, 1e-2);
    println!(
        "anomaly 200k readings / 1000 sensors: {} alerts, max relative error z {z:e}, m {m:e}, v {v:e}",
        report.alerts.len()
    );
    let g = generate_graph(20_000, 5, 9).unwrap();
    let (k, iterations, at) = run_pagerank(&rt, &d, &g, 256);
    let n = g.nodes();
    let got = k.read_buffer::<f64>("ranks", T).unwrap()[at..at + n].to_vec();
    let want = pagerank::reference(&g, pagerank::Params::default()).unwrap();
    let max = got
        .iter()
        .zip(&want.ranks)
        .map(|(&a, &b)| rel(a, b))
        .fold(0.0, f64::max);
    println!(
        "pagerank 20k nodes: {iterations} iterations (reference {}), max relative error {max:e}",
        want.iterations
    );
    k.terminate().unwrap();
}

/// The detector actor on wgpu driven like `anomaly::run_actor`: micro-batches of `batch`
/// readings plus a flush, at most `in_flight` micro-batches outstanding.
fn actor_run(
    rt: &Runtime,
    d: &DeviceHandle,
    r: &anomaly::SlottedReadings,
    batch: usize,
    in_flight: usize,
) -> anomaly::RunReport {
    anomaly::run_actor(rt, d, r, batch, in_flight, |_| {}).unwrap()
}

/// A rough timing of the actor against the stateless baseline on this adapter (not the
/// benchmark: `resident bench workloads` is). Run with `-- --ignored --nocapture`.
#[test]
#[ignore = "a timing, not a check"]
fn anomaly_actor_vs_stateless_timing() {
    let Some((rt, d)) = wgpu("anomaly_actor_vs_stateless_timing") else {
        return;
    };
    let (readings, _) = generate_readings(100_000, 1_000, 997, 3).unwrap();
    let r = anomaly::slot(&readings);
    for batch in [100, 500, 1000] {
        let mut ratios = Vec::new();
        for _ in 0..3 {
            let a = actor_run(&rt, &d, &r, batch, 16);
            check_anomaly(&a, &r, ANOMALY_TOL);
            let s = run_stateless_wgpu(&d, &r, batch, |_| {}).unwrap();
            check_anomaly(&s, &r, ANOMALY_TOL);
            let (ta, ts) = (a.elapsed.as_secs_f64(), s.elapsed.as_secs_f64());
            println!(
                "micro-batch {batch}: actor {:.0} readings/s, stateless {:.0} readings/s",
                r.slots.len() as f64 / ta,
                r.slots.len() as f64 / ts
            );
            ratios.push(ts / ta);
        }
        ratios.sort_by(f64::total_cmp);
        println!(
            "micro-batch {batch}: actor / stateless x{:.2} (min {:.2}, max {:.2})",
            ratios[1], ratios[0], ratios[2]
        );
    }
}
