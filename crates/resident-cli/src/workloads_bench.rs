//! `resident bench workloads`: the reference workloads at large sizes, each run checked against
//! its f64 reference, with the baselines of issue 11 measured in the same run, repeated, and
//! drawn (SVG and PNG).
//!
//! - anomaly: the actor (statistics resident in a bound buffer) vs the stateless batch
//!   (statistics uploaded, updated by a one-shot kernel and downloaded per micro-batch), on the
//!   same backend, micro-batches 100 / 500 / 1000;
//! - streaming PageRank: incremental refresh vs recompute from scratch per update batch;
//! - full PageRank on the large graph: seconds per backend.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::{json, Value};

use resident::backend;
use resident_bench::stats::{median_or_nan as median, quantile, spread};
use resident_workloads::input;
use resident_workloads::{anomaly, pagerank};

use crate::workloads::{bar, BackendChoice, DemoError};

/// Options of `bench workloads`.
#[derive(Args, Debug)]
pub struct Options {
    /// Small sizes, about a minute on a 2-vCPU machine with CPU, CudaSim and lavapipe, every
    /// workload still checked against its reference on every backend (defaults below; a size
    /// flag you give overrides them); the committed results use the full defaults.
    #[arg(long)]
    pub quick: bool,
    /// Backends to measure (those not present are listed in the JSON with the reason).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![BackendChoice::Cpu, BackendChoice::CudaSim, BackendChoice::Wgpu, BackendChoice::Cuda])]
    pub backends: Vec<BackendChoice>,
    /// Repetitions of every measurement (the spread is reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Existing folder for the JSON and the pictures [default: bench/results in the
    /// repository, from any folder].
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// File name prefix of the JSON and the pictures [default: workloads (workloads-quick with
    /// --quick) in a folder you name with --out-dir; workloads-latest (workloads-quick-latest)
    /// in the default folder, names git ignores, so the committed results there are
    /// overwritten only when asked: --prefix workloads].
    #[arg(long)]
    pub prefix: Option<String>,
    /// PageRank graph nodes (edges: 5 per node drawn) [default: 1000000; 5000 with --quick].
    #[arg(long)]
    pub nodes: Option<usize>,
    /// PageRank's second, tight tolerance (the first is networkx's 1e-6).
    #[arg(long, default_value_t = 1e-9)]
    pub tight_tol: f64,
    /// Anomaly readings per run [default: 2000000; 20000 with --quick].
    #[arg(long)]
    pub readings: Option<usize>,
    /// Anomaly sensors [default: 10000; 1000 with --quick].
    #[arg(long)]
    pub sensors: Option<usize>,
    /// Anomaly readings per run on CudaSim (the first of the stream): CudaSim runs every CUDA
    /// thread as an OS thread with futex barriers, thousands of readings per second, so it is
    /// checked at this size; its speed says nothing about a GPU [default: 20000; 2000 with
    /// --quick].
    #[arg(long)]
    pub sim_readings: Option<usize>,
}

/// The sizes a run uses: the full defaults, or the quick ones; a flag given overrides either.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sizes {
    nodes: usize,
    readings: usize,
    sensors: usize,
    sim_readings: usize,
    sweep_sensors: [usize; 2],
}

impl Sizes {
    const FULL: Sizes = Sizes {
        nodes: 1_000_000,
        readings: 2_000_000,
        sensors: 10_000,
        sim_readings: 20_000,
        sweep_sensors: [1000, 100_000],
    };
    /// Measured on the shared 2-vCPU VM: at the former quick sizes (20000 nodes, 20000
    /// readings on every backend) CudaSim took most of the 170-200 s, its anomaly runs
    /// alone about 70 s at a few thousand readings/s and its PageRank runs about 2 s each.
    const QUICK: Sizes = Sizes {
        nodes: 5_000,
        readings: 20_000,
        sensors: 1000,
        sim_readings: 2000,
        sweep_sensors: [100, 10_000],
    };

    fn of(o: &Options) -> Sizes {
        let d = if o.quick { Self::QUICK } else { Self::FULL };
        Sizes {
            nodes: o.nodes.unwrap_or(d.nodes),
            readings: o.readings.unwrap_or(d.readings),
            sensors: o.sensors.unwrap_or(d.sensors),
            sim_readings: o.sim_readings.unwrap_or(d.sim_readings),
            sweep_sensors: d.sweep_sensors,
        }
    }
}

/// One backend's anomaly figures.
struct AnomalyRow {
    batch: usize,
    actor_rps: Vec<f64>,
    /// The actor with one micro-batch in flight (send, wait for its results, repeat).
    actor_sync_rps: Vec<f64>,
    stateless_rps: Vec<f64>,
    /// Micro-batch latencies in microseconds of the last repetition, sorted.
    actor_lat: Vec<f64>,
    stateless_lat: Vec<f64>,
}

struct BackendRun {
    name: String,
    /// Anomaly readings per run on this backend.
    readings: usize,
    /// Micro-batch 100 across sensor counts: (sensors, actor, stateless readings/s).
    sweep: Vec<(usize, Vec<f64>, Vec<f64>)>,
    anomaly: Vec<AnomalyRow>,
    pr: Vec<PrRun>,
    /// Wall seconds of this backend's parts: anomaly, sensor sweep, PageRank (full and
    /// streaming), each including set-up and the checks against the reference.
    secs: [f64; 3],
}

/// PageRank figures at one tolerance.
struct PrRun {
    tol: f64,
    /// The L1 distance allowed between incremental and recomputed ranks here.
    stream_tol: f64,
    /// Graph to ranks: CSR build, buffers bound, launch, iteration, ranks read back.
    full_secs: Vec<f64>,
    /// The iteration alone (the run message's round trip).
    kernel_secs: Vec<f64>,
    iterations: u32,
    stream_ratio: Vec<f64>,
    stream: Vec<Value>,
    worst_l1: f64,
}

pub fn run(o: &Options) -> Result<(), DemoError> {
    let out_dir = crate::paths::output(o.out_dir.clone(), "bench/results", "--out-dir")
        .map_err(DemoError::Usage)?;
    if !out_dir.is_dir() {
        return Err(DemoError::Usage(format!(
            "--out-dir {} is not an existing folder",
            out_dir.display()
        )));
    }
    let prefix = match (&o.prefix, o.quick) {
        (Some(p), _) if p.is_empty() || p.contains(['/', '\\']) => {
            return Err(DemoError::Usage(format!(
                "--prefix {p:?} must be a plain, non-empty file name prefix"
            )))
        }
        (Some(p), _) => p.clone(),
        (None, quick) => {
            let base = if quick {
                "workloads-quick"
            } else {
                "workloads"
            };
            match o.out_dir {
                Some(_) => base.to_string(),
                None => format!("{base}-latest"),
            }
        }
    };
    let repeats = o.repeats.max(1);
    let sizes = Sizes::of(o);
    let (nodes, readings, sensors) = (sizes.nodes, sizes.readings, sizes.sensors);
    let (stream_batches, updates) = (5, 100);
    println!(
        "== bench workloads ({} sizes): {repeats} repeats; PageRank {nodes} nodes x 5 edges; anomaly {readings} readings over {sensors} sensors ({} on CudaSim), sensor sweep {:?} ==",
        if o.quick { "quick" } else { "full" },
        sizes.sim_readings.min(readings),
        sizes.sweep_sensors
    );
    let started = Instant::now();
    let t = Instant::now();
    let graph = input::generate_graph(nodes, 5, 42)?;
    println!(
        "graph: {} nodes, {} edges ({:.1} s to generate)",
        graph.nodes(),
        graph.edges.len(),
        t.elapsed().as_secs_f64()
    );
    let (rs, spikes) = input::generate_readings(readings, sensors, 997, 7)?;
    let slotted = anomaly::slot(&rs);
    let p = pagerank::Params::default();
    // networkx's tol, and a tight one: at N = 1M networkx's rule (L1 change < N x 1e-6 = 1)
    // stops after one iteration, so the tight tolerance is what shows real iteration work.
    let mut references = Vec::new();
    for tol in [pagerank::TOL, o.tight_tol] {
        let t = Instant::now();
        let r = pagerank::reference(
            &graph,
            pagerank::Params {
                tol,
                ..Default::default()
            },
        )?;
        references.push((tol, r, t.elapsed().as_secs_f64()));
    }
    let sweep_sensors = sizes.sweep_sensors;
    let update_batches = pagerank::generate_updates(&graph, stream_batches, updates, 9);

    let mut runs: Vec<BackendRun> = Vec::new();
    let mut absent: Vec<Value> = Vec::new();
    for &b in &o.backends {
        let name = format!("{b:?}").to_lowercase();
        let (rt, d) = match b.open() {
            Ok(x) => x,
            Err(e) => {
                println!("{name}: SKIP: {e}");
                absent.push(json!({"backend": name, "reason": e.to_string()}));
                continue;
            }
        };
        println!("-- {name} --");
        let t_backend = Instant::now();
        let prec = resident_workloads::Precision::of(d.kind());
        // CudaSim: the first `sim_readings` of the same stream.
        let full_readings = readings;
        let (readings, slotted, spikes, sweep_readings) =
            if d.kind() == backend::BackendKind::CudaSim && sizes.sim_readings < full_readings {
                let k = sizes.sim_readings.max(1);
                let sub = anomaly::slot(&rs[..k]);
                let sp: Vec<usize> = spikes.iter().copied().filter(|&i| i < k).collect();
                (k, sub, sp, k)
            } else {
                (
                    full_readings,
                    slotted.clone(),
                    spikes.clone(),
                    full_readings,
                )
            };
        let mut run = BackendRun {
            name: name.clone(),
            readings,
            sweep: vec![],
            anomaly: vec![],
            pr: vec![],
            secs: [0.0; 3],
        };
        for batch in [100usize, 500, 1000] {
            let mut row = AnomalyRow {
                batch,
                actor_rps: vec![],
                actor_sync_rps: vec![],
                stateless_rps: vec![],
                actor_lat: vec![],
                stateless_lat: vec![],
            };
            let pb = bar((3 * repeats * readings) as u64, &format!("anomaly/{batch}"));
            for _ in 0..repeats {
                // Latency: one micro-batch in flight, like the stateless batch.
                let one = anomaly::run_actor(&rt, &d, &slotted, batch, 1, |k| pb.inc(k as u64))?;
                anomaly::check_with(&one, &slotted, prec)?;
                row.actor_sync_rps
                    .push(readings as f64 / one.elapsed.as_secs_f64());
                // Throughput: micro-batches pipelined (the statistics stay in the kernel, so
                // micro-batch k+1 need not wait for k's results; a stateless batch must).
                let a = anomaly::run_actor(&rt, &d, &slotted, batch, anomaly::IN_FLIGHT, |k| {
                    pb.inc(k as u64)
                })?;
                anomaly::check_with(&a, &slotted, prec)?;
                let alerted: std::collections::HashSet<u64> =
                    a.alerts.iter().map(|x| x.index).collect();
                if let Some(i) = spikes.iter().find(|&&i| !alerted.contains(&(i as u64))) {
                    return Err(DemoError::Usage(format!(
                        "injected spike at {i} not alerted"
                    )));
                }
                let s = anomaly::run_stateless(&d, &slotted, batch, |k| pb.inc(k as u64))?;
                anomaly::check_with(&s, &slotted, prec)?;
                row.actor_rps
                    .push(readings as f64 / a.elapsed.as_secs_f64());
                row.stateless_rps
                    .push(readings as f64 / s.elapsed.as_secs_f64());
                let us = |v: &[Duration]| {
                    let mut x: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e6).collect();
                    x.sort_by(f64::total_cmp);
                    x
                };
                row.actor_lat = us(&one.batch_latency);
                row.stateless_lat = us(&s.batch_latency);
            }
            pb.finish_and_clear();
            let ratios: Vec<f64> = row
                .actor_rps
                .iter()
                .zip(&row.stateless_rps)
                .map(|(a, s)| a / s)
                .collect();
            println!(
                "anomaly micro-batch {batch:>4}: actor {:.2} M/s ({} in flight; {:.2} M/s with 1), stateless {:.3} M/s, actor/stateless x{:.1} (runs {:?}); latency p50 actor {:.1} us, stateless {:.1} us",
                median(&row.actor_rps) / 1e6,
                anomaly::IN_FLIGHT,
                median(&row.actor_sync_rps) / 1e6,
                median(&row.stateless_rps) / 1e6,
                median(&ratios),
                ratios.iter().map(|r| (r * 10.0).round() / 10.0).collect::<Vec<_>>(),
                quantile(&row.actor_lat, 0.5).unwrap_or(f64::NAN),
                quantile(&row.stateless_lat, 0.5).unwrap_or(f64::NAN)
            );
            run.anomaly.push(row);
        }
        run.secs[0] = t_backend.elapsed().as_secs_f64();
        for &ns in &sweep_sensors {
            let (rs2, _) = input::generate_readings(sweep_readings, ns, 0, 3)?;
            let sl = anomaly::slot(&rs2);
            let (mut ar, mut sr) = (vec![], vec![]);
            let pb = bar((2 * repeats * readings) as u64, &format!("sensors/{ns}"));
            for _ in 0..repeats {
                let a = anomaly::run_actor(&rt, &d, &sl, 100, anomaly::IN_FLIGHT, |k| {
                    pb.inc(k as u64)
                })?;
                anomaly::check_with(&a, &sl, prec)?;
                let s = anomaly::run_stateless(&d, &sl, 100, |k| pb.inc(k as u64))?;
                anomaly::check_with(&s, &sl, prec)?;
                ar.push(readings as f64 / a.elapsed.as_secs_f64());
                sr.push(readings as f64 / s.elapsed.as_secs_f64());
            }
            pb.finish_and_clear();
            let ratios: Vec<f64> = ar.iter().zip(&sr).map(|(a, s)| a / s).collect();
            println!(
                "anomaly micro-batch 100, {ns:>6} sensors: actor {:.2} M/s, stateless {:.3} M/s, x{:.1} (runs {:?})",
                median(&ar) / 1e6, median(&sr) / 1e6, median(&ratios),
                ratios.iter().map(|r| (r * 10.0).round() / 10.0).collect::<Vec<_>>()
            );
            run.sweep.push((ns, ar, sr));
        }
        run.secs[1] = t_backend.elapsed().as_secs_f64() - run.secs[0];
        for (tol, reference, reference_secs) in &references {
            let p = pagerank::Params {
                tol: *tol,
                ..Default::default()
            };
            let mut pr = PrRun {
                tol: *tol,
                stream_tol: pagerank::stream_tolerance_with(graph.nodes(), p, prec),
                full_secs: vec![],
                kernel_secs: vec![],
                iterations: 0,
                stream_ratio: vec![],
                stream: vec![],
                worst_l1: 0.0,
            };
            let pb = bar(repeats as u64, "pagerank");
            for _ in 0..repeats {
                let t = Instant::now();
                let got = pagerank::run_full(&rt, &d, &graph, p)?;
                pr.full_secs.push(t.elapsed().as_secs_f64());
                pr.kernel_secs.push(got.kernel_time.as_secs_f64());
                pagerank::check_full_with(&got, reference, prec)?;
                pr.iterations = got.iterations;
                pb.inc(1);
            }
            pb.finish_and_clear();
            println!(
                "full PageRank, tol {tol:e}: {:.3} s median end to end, {:.3} s in the kernel ({} iterations; sequential reference {:.2} s), runs {:?}",
                median(&pr.full_secs),
                median(&pr.kernel_secs),
                pr.iterations,
                reference_secs,
                pr.full_secs.iter().map(|s| (s * 1000.0).round() / 1000.0).collect::<Vec<_>>()
            );
            // Streaming PageRank: the same definition on every backend (the graph in bound
            // buffers on a device, the handler's state on the CPU).
            let pb = bar((repeats * stream_batches) as u64, "stream");
            for _ in 0..repeats {
                let (steps, _) =
                    pagerank::run_stream(&rt, &d, &graph, p, &update_batches, |_| pb.inc(1))?;
                let inc: f64 = steps.iter().map(|s| s.incremental.as_secs_f64()).sum();
                let full: f64 = steps.iter().map(|s| s.recompute.as_secs_f64()).sum();
                pr.stream_ratio.push(full / inc);
                pr.worst_l1 = steps.iter().map(|s| s.l1_diff).fold(pr.worst_l1, f64::max);
                pr.stream.push(json!({
                    "incremental_s": inc, "recompute_s": full,
                    "steps": steps.iter().map(|s| json!({
                        "incremental_s": s.incremental.as_secs_f64(), "pushes": s.pushes, "incremental_work": s.incremental_work,
                        "recompute_s": s.recompute.as_secs_f64(), "recompute_iterations": s.recompute_iterations, "recompute_work": s.recompute_work,
                        "l1_diff": s.l1_diff, "l1_bound": s.bound, "residual_mismatch": s.check.mismatch, "residual_mismatch_bound": s.check.mismatch_bound,
                        "applied": s.applied, "push_rounds": s.rounds,
                    })).collect::<Vec<_>>(),
                }));
            }
            pb.finish_and_clear();
            println!(
                "streaming PageRank, tol {tol:e} ({stream_batches} batches x {updates} updates): recompute/incremental x{:.1} median (runs {:?}); worst L1 distance {:.2e} <= {:.2e}",
                median(&pr.stream_ratio),
                pr.stream_ratio.iter().map(|r| r.round()).collect::<Vec<_>>(),
                pr.worst_l1,
                pagerank::stream_tolerance_with(graph.nodes(), p, prec)
            );
            run.pr.push(pr);
        }
        run.secs[2] = t_backend.elapsed().as_secs_f64() - run.secs[0] - run.secs[1];
        println!(
            "{name}: {:.1} s (anomaly {:.1} s, sensor sweep {:.1} s, PageRank {:.1} s)",
            run.secs.iter().sum::<f64>(),
            run.secs[0],
            run.secs[1],
            run.secs[2]
        );
        runs.push(run);
    }

    let command: Vec<String> = std::env::args().collect();
    let report = json!({
        "benchmark": "workloads",
        "command": command.join(" "),
        "date": resident_bench::provenance::today(),
        "machine": resident_bench::provenance::machine(),
        "note": "shared, noisy 2-vCPU x86_64 VM without a GPU; ratios are measured in the same run on the same backend; every run's results were checked against the sequential f64 reference at the backend's precision (f64 on cpu/cudasim/cuda, f32 in WGSL; tolerances in resident-workloads); wgpu ran on Mesa lavapipe (Vulkan on the CPU); cudasim runs every CUDA thread as an OS thread with futex barriers, so its figures measure the simulator, not a GPU, and its anomaly runs use the first sim_readings readings",
        "repeats": repeats,
        "quick": o.quick,
        "sizes": {"nodes": nodes, "readings": readings, "sensors": sensors, "cudasim_readings": sizes.sim_readings.min(readings), "sensor_sweep": sizes.sweep_sensors, "stream_batches": stream_batches, "updates_per_batch": updates},
        "total_s": started.elapsed().as_secs_f64(),
        "absent_backends": absent,
        "pagerank_graph": {"nodes": graph.nodes(), "edges": graph.edges.len(), "generator": "--nodes N --edges-per-node 5 --seed 42", "params": {"damping": p.damping, "tols": references.iter().map(|r| r.0).collect::<Vec<_>>(), "max_iter": p.max_iter}, "sequential_reference_s": references.iter().map(|r| r.2).collect::<Vec<_>>()},
        "pagerank_stream": {"batches": stream_batches, "updates_per_batch": updates},
        "anomaly_input": {"readings": readings, "sensors": sensors, "spikes_injected": spikes.len(), "spike_every": 997, "actor_micro_batches_in_flight": anomaly::IN_FLIGHT},
        "targets": {"anomaly_actor_vs_stateless_at_100": 5.0, "stream_pagerank_incremental_vs_recompute": 10.0},
        "backends": runs.iter().map(|r| json!({
            "backend": r.name,
            "anomaly_readings": r.readings,
            "seconds": {"anomaly": r.secs[0], "sensor_sweep": r.secs[1], "pagerank": r.secs[2]},
            "anomaly": r.anomaly.iter().map(|a| {
                let ratios: Vec<f64> = a.actor_rps.iter().zip(&a.stateless_rps).map(|(x, y)| x / y).collect();
                json!({
                    "micro_batch": a.batch,
                    "actor_readings_per_s": spread(&a.actor_rps),
                    "actor_one_in_flight_readings_per_s": spread(&a.actor_sync_rps),
                    "ratio_actor_one_in_flight_vs_stateless": spread(&a.actor_sync_rps.iter().zip(&a.stateless_rps).map(|(x, y)| x / y).collect::<Vec<_>>()),
                    "stateless_readings_per_s": spread(&a.stateless_rps),
                    "ratio_actor_vs_stateless": spread(&ratios),
                    "actor_batch_latency_us_one_in_flight": {"p50": quantile(&a.actor_lat, 0.5), "p90": quantile(&a.actor_lat, 0.9), "p99": quantile(&a.actor_lat, 0.99), "max": quantile(&a.actor_lat, 1.0)},
                    "stateless_batch_latency_us": {"p50": quantile(&a.stateless_lat, 0.5), "p90": quantile(&a.stateless_lat, 0.9), "p99": quantile(&a.stateless_lat, 0.99), "max": quantile(&a.stateless_lat, 1.0)},
                })
            }).collect::<Vec<_>>(),
            "anomaly_sensor_sweep_micro_batch_100": r.sweep.iter().map(|(ns, a, s)| {
                let ratios: Vec<f64> = a.iter().zip(s).map(|(x, y)| x / y).collect();
                json!({"sensors": ns, "actor_readings_per_s": spread(a), "stateless_readings_per_s": spread(s), "ratio_actor_vs_stateless": spread(&ratios)})
            }).collect::<Vec<_>>(),
            "pagerank": r.pr.iter().map(|pr| json!({
                "tol": pr.tol,
                "full_s": spread(&pr.full_secs),
                "full_kernel_s": spread(&pr.kernel_secs),
                "full_iterations": pr.iterations,
                "stream_ratio_recompute_vs_incremental": spread(&pr.stream_ratio),
                "stream_worst_l1_distance": pr.worst_l1,
                "stream_tolerance_l1": pr.stream_tol,
                "stream_runs": pr.stream,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    let json_path = out_dir.join(format!("{prefix}.json"));
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&report).expect("json"),
    )
    .map_err(|source| DemoError::Write {
        path: json_path.clone(),
        source,
    })?;
    println!("wrote {}", json_path.display());
    draw_all(&out_dir, &prefix, &runs, sensors)?;
    Ok(())
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

fn font_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // DejaVu Sans ships with the CLI so PNGs render the same offline on any machine.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            include_bytes!("../assets/DejaVuSans.ttf"),
        );
    });
}

/// A log-axis tick label only at 1, 2 and 5 x 10^k (plotters offers every minor tick, whose
/// labels collide at the top of a decade); compact figures.
fn log_tick(x: f64) -> String {
    if x.is_nan() || x <= 0.0 {
        return String::new();
    }
    let e = x.log10().floor();
    let m = x / 10f64.powf(e);
    if [1.0, 2.0, 5.0, 10.0]
        .iter()
        .all(|&k| (m - k).abs() > 0.02 * k)
    {
        return String::new();
    }
    match x {
        x if x >= 1e6 => format!("{}M", x / 1e6),
        x if x >= 1e3 => format!("{}k", x / 1e3),
        x if x >= 1.0 => format!("{x:.0}"),
        x => format!("{}", (x * 1e6).round() / 1e6),
    }
}

/// Points m x 10^k within `lo..=hi` for the mantissas `ms`: a log axis's labelled (1, 2, 5) or
/// grid (1..9) points. plotters' own log axis offers none below the first power of ten in
/// range, which left data between, say, 90 and 1000 us without a label.
fn log_points(lo: f64, hi: f64, ms: &[f64]) -> Vec<f64> {
    let mut v = Vec::new();
    if !(lo > 0.0 && hi >= lo && hi.is_finite()) {
        return v;
    }
    let mut e = lo.log10().floor() as i32;
    while 10f64.powi(e) <= hi {
        for &m in ms {
            let x = m * 10f64.powi(e);
            if x >= lo && x <= hi {
                v.push(x);
            }
        }
        e += 1;
    }
    v
}

/// One legend entry: a line (solid or dashed, of `width`) and its text, drawn at `(x, y)`
/// of a plain drawing area beside a chart, where it covers no data.
fn legend_entry<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    color: RGBColor,
    dashed: bool,
    width: u32,
    text: &str,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let style = color.stroke_width(width);
    if dashed {
        area.draw(&PathElement::new(vec![(x, y), (x + 9, y)], style))?;
        area.draw(&PathElement::new(vec![(x + 15, y), (x + 24, y)], style))?;
    } else {
        area.draw(&PathElement::new(vec![(x, y), (x + 24, y)], style))?;
    }
    area.draw(&Text::new(
        text.to_string(),
        (x + 32, y - 7),
        ("sans-serif", 13),
    ))?;
    Ok(())
}

fn draw_all(
    dir: &Path,
    prefix: &str,
    runs: &[BackendRun],
    sensors: usize,
) -> Result<(), DemoError> {
    font_once();
    let fail = |path: &Path, e: Box<dyn std::error::Error>| DemoError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    };
    macro_rules! picture {
        ($name:expr, $draw:ident) => {
            picture!($name, $draw, (960, 560))
        };
        ($name:expr, $draw:ident, $size:expr) => {{
            let svg_path = dir.join(format!("{prefix}-{}.svg", $name));
            let png_path = dir.join(format!("{prefix}-{}.png", $name));
            {
                let root = SVGBackend::new(&svg_path, $size).into_drawing_area();
                $draw(&root, runs, sensors).map_err(|e| fail(&svg_path, e))?;
                root.present().map_err(|e| fail(&svg_path, e.into()))?;
            }
            {
                let root = BitMapBackend::new(&png_path, $size).into_drawing_area();
                $draw(&root, runs, sensors).map_err(|e| fail(&png_path, e))?;
                root.present().map_err(|e| fail(&png_path, e.into()))?;
            }
            println!("wrote {} and .png", svg_path.display());
        }};
    }
    picture!(
        "latency",
        draw_latency,
        (960, 60 + 260 * runs.len().max(1) as u32)
    );
    picture!("throughput", draw_throughput);
    picture!("actor-vs-stateless", draw_ratios);
    Ok(())
}

/// Latency distribution (CDF) of anomaly micro-batches, actor and stateless, per backend and
/// micro-batch size.
fn draw_latency<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[BackendRun],
    sensors: usize,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "Anomaly detection, {sensors} sensors: latency per micro-batch (CDF, one in flight)"
        ),
        ("sans-serif", 22),
    )?;
    // One panel per backend (their latencies are decades apart), one color per micro-batch
    // size, the actor solid and the stateless batch dashed; the legend beside the panels.
    let (plots, legend) = root.split_horizontally(root.dim_in_pixel().0 as i32 - 200);
    let batches: Vec<usize> = runs
        .iter()
        .flat_map(|r| r.anomaly.iter().map(|a| a.batch))
        .fold(Vec::new(), |mut v, b| {
            if !v.contains(&b) {
                v.push(b);
            }
            v
        });
    legend.draw(&Text::new(
        "colour: micro-batch",
        (8, 40),
        ("sans-serif", 14),
    ))?;
    let mut y = 64;
    for (k, b) in batches.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        legend_entry(
            &legend,
            (8, y),
            color,
            false,
            3,
            &format!("actor, batch {b}"),
        )?;
        legend_entry(
            &legend,
            (8, y + 20),
            color,
            true,
            2,
            &format!("stateless, batch {b}"),
        )?;
        y += 48;
    }
    for (i, line) in [
        "solid: the actor keeps",
        "the statistics resident",
        "dashed: stateless, they",
        "are uploaded and read",
        "back per micro-batch",
    ]
    .iter()
    .enumerate()
    {
        legend.draw(&Text::new(
            *line,
            (8, y + 10 + 17 * i as i32),
            ("sans-serif", 12),
        ))?;
    }
    let panels = plots.split_evenly((runs.len().max(1), 1));
    for (r, panel) in runs.iter().zip(&panels) {
        let all: Vec<f64> = r
            .anomaly
            .iter()
            .flat_map(|a| a.actor_lat.iter().chain(&a.stateless_lat).copied())
            .collect();
        let lo = all.iter().copied().fold(f64::INFINITY, f64::min).max(0.1);
        let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
        let mut chart = ChartBuilder::on(panel)
            .caption(&r.name, ("sans-serif", 17))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(
                (lo * 0.8..hi * 1.25)
                    .log_scale()
                    .with_key_points(log_points(lo * 0.8, hi * 1.25, &[1.0, 2.0, 5.0]))
                    .with_light_points(log_points(
                        lo * 0.8,
                        hi * 1.25,
                        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
                    )),
                0f64..1f64,
            )?;
        chart
            .configure_mesh()
            .x_label_formatter(&|x| log_tick(*x))
            .x_desc("micro-batch latency, microseconds (log scale)")
            .y_desc("fraction")
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .draw()?;
        for (k, a) in r.anomaly.iter().enumerate() {
            let color =
                COLORS[batches.iter().position(|&b| b == a.batch).unwrap_or(k) % COLORS.len()];
            for (lat, dashed) in [(&a.actor_lat, false), (&a.stateless_lat, true)] {
                let n = lat.len().max(1) as f64;
                let pts: Vec<(f64, f64)> = lat
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| (x, (i + 1) as f64 / n))
                    .collect();
                if dashed {
                    chart.draw_series(DashedLineSeries::new(pts, 8, 5, color.stroke_width(2)))?;
                } else {
                    chart.draw_series(LineSeries::new(pts, color.stroke_width(3)))?;
                }
            }
        }
    }
    Ok(())
}

/// Throughput against micro-batch size, actor and stateless, per backend.
fn draw_throughput<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[BackendRun],
    sensors: usize,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let hi = runs
        .iter()
        .flat_map(|r| {
            r.anomaly
                .iter()
                .flat_map(|a| a.actor_rps.iter().chain(&a.stateless_rps).copied())
        })
        .fold(1.0, f64::max)
        / 1e6;
    let lo = runs
        .iter()
        .flat_map(|r| {
            r.anomaly.iter().flat_map(|a| {
                a.actor_rps
                    .iter()
                    .chain(&a.stateless_rps)
                    .chain(&a.actor_sync_rps)
                    .copied()
            })
        })
        .fold(f64::INFINITY, f64::min)
        / 1e6;
    let root = root.titled(
        &format!("Anomaly detection, {sensors} sensors: throughput vs micro-batch size"),
        ("sans-serif", 22),
    )?;
    // The legend beside the chart (it covers no data); the axis fitted to the data.
    let (plot, legend) = root.split_horizontally(root.dim_in_pixel().0 as i32 - 250);
    legend.draw(&Text::new("colour: backend", (8, 30), ("sans-serif", 14)))?;
    for (i, r) in runs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        legend_entry(&legend, (8, 56 + 22 * i as i32), color, false, 3, &r.name)?;
    }
    let y0 = 56 + 22 * runs.len() as i32 + 16;
    legend.draw(&Text::new("line: mode", (8, y0), ("sans-serif", 14)))?;
    let grey = RGBColor(90, 90, 90);
    legend_entry(
        &legend,
        (8, y0 + 26),
        grey,
        false,
        3,
        "actor, statistics resident",
    )?;
    legend.draw(&Text::new(
        format!("({} micro-batches in flight)", anomaly::IN_FLIGHT),
        (40, y0 + 36),
        ("sans-serif", 12),
    ))?;
    legend_entry(
        &legend,
        (8, y0 + 64),
        grey,
        true,
        2,
        "stateless: upload, update,",
    )?;
    legend.draw(&Text::new(
        "download per micro-batch",
        (40, y0 + 74),
        ("sans-serif", 12),
    ))?;
    legend_entry(
        &legend,
        (8, y0 + 102),
        grey,
        false,
        1,
        "actor, one micro-batch",
    )?;
    legend.draw(&Text::new(
        "in flight (hollow points)",
        (40, y0 + 112),
        ("sans-serif", 12),
    ))?;
    legend.draw(&Text::new(
        "bars: min..max of repeats",
        (8, y0 + 142),
        ("sans-serif", 12),
    ))?;
    let mut chart = ChartBuilder::on(&plot)
        .margin(18)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            (80f64..1250f64).log_scale(),
            (lo.max(1e-4) * 0.6..hi * 1.6).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_labels(4)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| log_tick(*y))
        .x_desc("readings per micro-batch (log scale)")
        .y_desc("million readings / s (log scale)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()?;
    for (i, r) in runs.iter().enumerate() {
        // j: actor (resident statistics), stateless, actor with one micro-batch in flight.
        for j in 0..3 {
            // One color per backend; the line says which mode: solid (actor), dashed
            // (stateless), thin with hollow points (actor, one micro-batch in flight).
            let color = COLORS[i % COLORS.len()];
            let pick = |a: &AnomalyRow| -> Vec<f64> {
                match j {
                    0 => a.actor_rps.clone(),
                    1 => a.stateless_rps.clone(),
                    _ => a.actor_sync_rps.clone(),
                }
            };
            let pts: Vec<(f64, f64)> = r
                .anomaly
                .iter()
                .map(|a| (a.batch as f64, median(&pick(a)) / 1e6))
                .collect();
            // Spread: min..max of the repetitions as a vertical bar.
            for a in &r.anomaly {
                let v = &pick(a);
                let (mn, mx) = (
                    v.iter().copied().fold(f64::INFINITY, f64::min) / 1e6,
                    v.iter().copied().fold(0.0, f64::max) / 1e6,
                );
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(a.batch as f64, mn), (a.batch as f64, mx)],
                    color.stroke_width(2),
                )))?;
            }
            match j {
                0 => chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))?,
                1 => chart.draw_series(DashedLineSeries::new(
                    pts.clone(),
                    10,
                    6,
                    color.stroke_width(2),
                ))?,
                _ => chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(1)))?,
            };
            chart.draw_series(pts.iter().map(|&(x, y)| {
                let style = if j == 2 {
                    color.stroke_width(2)
                } else {
                    color.filled()
                };
                Circle::new((x, y), 5, style)
            }))?;
        }
    }
    Ok(())
}

/// Actor vs stateless batch: speed-up per workload and backend, with the targets.
fn draw_ratios<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[BackendRun],
    sensors: usize,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let mut bars: Vec<(String, Vec<f64>, f64)> = Vec::new();
    for r in runs {
        for a in &r.anomaly {
            let ratios: Vec<f64> = a
                .actor_rps
                .iter()
                .zip(&a.stateless_rps)
                .map(|(x, y)| x / y)
                .collect();
            bars.push((
                format!(
                    "{}: anomaly, batch {}, {} sensors",
                    r.name, a.batch, sensors
                ),
                ratios,
                if a.batch == 100 { 5.0 } else { 0.0 },
            ));
        }
        for (ns, a, s) in &r.sweep {
            let ratios: Vec<f64> = a.iter().zip(s).map(|(x, y)| x / y).collect();
            bars.push((
                format!("{}: anomaly, batch 100, {ns} sensors", r.name),
                ratios,
                5.0,
            ));
        }
        for pr in r.pr.iter().filter(|pr| !pr.stream_ratio.is_empty()) {
            bars.push((
                format!("{}: streaming PageRank, tol {:e}", r.name, pr.tol),
                pr.stream_ratio.clone(),
                10.0,
            ));
        }
    }
    let hi = bars
        .iter()
        .flat_map(|b| b.1.iter().copied())
        .fold(10.0, f64::max)
        * 1.6;
    let lo = bars
        .iter()
        .flat_map(|b| b.1.iter().copied())
        .fold(0.5, f64::min)
        * 0.6;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut chart = ChartBuilder::on(root)
        .caption(
            "Resident actor vs stateless batch: speed-up (same run, same backend)",
            ("sans-serif", 22),
        )
        .margin(18)
        .margin_bottom(44) // room for the colour key
        .x_label_area_size(40)
        .y_label_area_size(330)
        .build_cartesian_2d(
            (lo..hi)
                .log_scale()
                .with_key_points(log_points(lo, hi, &[1.0, 2.0, 5.0]))
                .with_light_points(log_points(
                    lo,
                    hi,
                    &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
                )),
            -0.5f64..(bars.len() as f64 - 0.5),
        )?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len())
        .y_label_formatter(&|y| {
            let i = y.round();
            if (y - i).abs() < 1e-6 && i >= 0.0 { names.get(i as usize).cloned().unwrap_or_default() } else { String::new() }
        })
        .x_label_formatter(&|x| log_tick(*x))
        .x_desc("times faster than stateless (log scale; bar = median, whisker = min..max of the repeats)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    for (i, (_, v, target)) in bars.iter().enumerate() {
        let y = i as f64;
        let (m, mn, mx) = (
            median(v),
            v.iter().copied().fold(f64::INFINITY, f64::min),
            v.iter().copied().fold(0.0, f64::max),
        );
        let color = if *target > 0.0 && m < *target {
            COLORS[1]
        } else {
            COLORS[0]
        };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(lo, y - 0.3), (m.max(lo), y + 0.3)],
            color.mix(0.8).filled(),
        )))?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(mn.max(lo), y), (mx.max(lo), y)],
            BLACK.stroke_width(2),
        )))?;
        // The figure right of the whisker and the target mark, so nothing covers it.
        let right = mx.max(m).max(*target).max(lo) * 1.08;
        chart.draw_series(std::iter::once(Text::new(
            if m < 0.95 {
                format!("x{m:.2}")
            } else {
                format!("x{m:.1}")
            },
            (right, y + 0.25),
            ("sans-serif", 15),
        )))?;
        if *target > 0.0 {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(*target, y - 0.42), (*target, y + 0.42)],
                COLORS[1].stroke_width(3),
            )))?;
        }
    }
    // What the colours mean, in the empty band below the bars' labels.
    let (w, h) = root.dim_in_pixel();
    let key = [
        (COLORS[0], "blue bar: meets its target (or has none)"),
        (COLORS[1], "red bar: misses its target"),
    ];
    for (i, (c, t)) in key.iter().enumerate() {
        let x = 20 + 300 * i as i32;
        let y = h as i32 - 22;
        root.draw(&Rectangle::new(
            [(x, y - 6), (x + 18, y + 6)],
            c.mix(0.8).filled(),
        ))?;
        root.draw(&Text::new(*t, (x + 24, y - 7), ("sans-serif", 13)))?;
    }
    let x = (w as i32 - 300).max(620);
    root.draw(&PathElement::new(
        vec![(x, h as i32 - 30), (x, h as i32 - 14)],
        COLORS[1].stroke_width(3),
    ))?;
    root.draw(&Text::new(
        "red tick: the target (x5 anomaly, x10 PageRank)",
        (x + 8, h as i32 - 29),
        ("sans-serif", 13),
    ))?;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(1.0, -0.5), (1.0, bars.len() as f64 - 0.5)],
        BLACK.stroke_width(1),
    )))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::log_points;

    #[test]
    fn log_axis_points_cover_the_range_below_the_first_decade() {
        // 88..2900 us: plotters alone labels only 1000 and 2000 here.
        assert_eq!(
            log_points(88.0, 2900.0, &[1.0, 2.0, 5.0]),
            vec![100.0, 200.0, 500.0, 1000.0, 2000.0]
        );
        assert_eq!(log_points(3.0, 9.0, &[1.0, 2.0, 5.0]), vec![5.0]);
        assert!(log_points(0.0, 10.0, &[1.0]).is_empty());
        assert!(log_points(10.0, 1.0, &[1.0]).is_empty());
    }
}
