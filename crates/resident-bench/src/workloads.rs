//! `resident bench workloads`: the reference workloads at large sizes, each run checked against
//! its f64 reference, with the baselines of issue 11 measured in the same run and repeated:
//!
//! - anomaly: the actor (statistics resident in a bound buffer) vs the stateless batch
//!   (statistics uploaded, updated by a one-shot kernel and downloaded per micro-batch), on the
//!   same backend, micro-batches 100 / 500 / 1000, and across sensor counts;
//! - streaming PageRank: incremental refresh vs recompute from scratch per update batch;
//! - full PageRank on the large graph: seconds per backend.
//!
//! [`run`] measures and returns a [`Report`]: its JSON and the figures the CLI draws.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use resident::backend::{self, DeviceHandle};
use resident::prelude::*;
use resident_workloads::{anomaly, input, pagerank, Precision};
use serde_json::{json, Value};

use crate::error::OutputCheck;
use crate::provenance::{command, machine, today};
use crate::stats::{median_or_nan as median, quantile, spread};
use crate::BenchError;

/// The sizes a run uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizes {
    /// PageRank graph nodes (5 edges per node drawn).
    pub nodes: usize,
    /// Anomaly readings per run.
    pub readings: usize,
    /// Anomaly sensors.
    pub sensors: usize,
    /// Anomaly readings per run on CudaSim (the first of the stream).
    pub sim_readings: usize,
    /// Sensor counts of the micro-batch-100 sweep.
    pub sweep_sensors: [usize; 2],
}

impl Sizes {
    /// The full sizes (the committed results).
    pub const FULL: Sizes = Sizes {
        nodes: 1_000_000,
        readings: 2_000_000,
        sensors: 10_000,
        sim_readings: 20_000,
        sweep_sensors: [1000, 100_000],
    };
    /// The quick sizes. Measured on the shared 2-vCPU VM: at the former quick sizes (20000
    /// nodes, 20000 readings on every backend) CudaSim took most of the 170-200 s, its anomaly
    /// runs alone about 70 s at a few thousand readings/s and its PageRank runs about 2 s each.
    pub const QUICK: Sizes = Sizes {
        nodes: 5_000,
        readings: 20_000,
        sensors: 1000,
        sim_readings: 2000,
        sweep_sensors: [100, 10_000],
    };
}

/// Options of a run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The quick sizes were asked for (recorded in the report; `sizes` holds the sizes used).
    pub quick: bool,
    /// The sizes.
    pub sizes: Sizes,
    /// Repetitions of every measurement (at least 1).
    pub repeats: usize,
    /// PageRank's second, tight tolerance (the first is networkx's 1e-6).
    pub tight_tol: f64,
}

/// Progress of the long parts of a run (the CLI draws bars; `()` shows nothing).
pub trait Progress {
    /// A new part of `len` steps named `what` begins.
    fn start(&self, len: u64, what: &str);
    /// `steps` more steps are done.
    fn advance(&self, steps: u64);
    /// The part is over.
    fn finish(&self);
}

impl Progress for () {
    fn start(&self, _: u64, _: &str) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

/// One micro-batch size's anomaly figures on one backend.
#[derive(Debug, Clone, Default)]
pub struct AnomalyRow {
    /// Readings per micro-batch.
    pub batch: usize,
    /// The actor, micro-batches pipelined: readings/s per repetition.
    pub actor_rps: Vec<f64>,
    /// The actor with one micro-batch in flight (send, wait for its results, repeat).
    pub actor_sync_rps: Vec<f64>,
    /// The stateless batch: readings/s per repetition.
    pub stateless_rps: Vec<f64>,
    /// Micro-batch latencies in microseconds of the last repetition (actor, one in flight),
    /// sorted.
    pub actor_lat: Vec<f64>,
    /// The same for the stateless batch, sorted.
    pub stateless_lat: Vec<f64>,
}

impl AnomalyRow {
    /// Actor over stateless readings/s, per repetition.
    pub fn ratios(&self) -> Vec<f64> {
        crate::stats::ratios(&self.actor_rps, &self.stateless_rps)
    }
}

/// Micro-batch 100 at one sensor count.
#[derive(Debug, Clone)]
pub struct SweepPoint {
    /// Sensors.
    pub sensors: usize,
    /// The actor's readings/s per repetition.
    pub actor_rps: Vec<f64>,
    /// The stateless batch's readings/s per repetition.
    pub stateless_rps: Vec<f64>,
}

impl SweepPoint {
    /// Actor over stateless readings/s, per repetition.
    pub fn ratios(&self) -> Vec<f64> {
        crate::stats::ratios(&self.actor_rps, &self.stateless_rps)
    }
}

/// PageRank figures at one tolerance.
#[derive(Debug, Clone)]
pub struct PrRun {
    /// The tolerance.
    pub tol: f64,
    /// The L1 distance allowed between incremental and recomputed ranks here.
    pub stream_tol: f64,
    /// Graph to ranks: CSR build, buffers bound, launch, iteration, ranks read back.
    pub full_secs: Vec<f64>,
    /// The iteration alone (the run message's round trip).
    pub kernel_secs: Vec<f64>,
    /// Iterations of the full run.
    pub iterations: u32,
    /// Recompute over incremental seconds, per repetition of the stream.
    pub stream_ratio: Vec<f64>,
    /// Every stream repetition's steps, as they go into the JSON.
    pub stream: Vec<Value>,
    /// The largest L1 distance between incremental and recomputed ranks seen.
    pub worst_l1: f64,
}

/// One backend's figures.
#[derive(Debug, Clone)]
pub struct BackendRun {
    /// The backend's name.
    pub name: String,
    /// Anomaly readings per run on this backend.
    pub readings: usize,
    /// Micro-batch 100 across sensor counts.
    pub sweep: Vec<SweepPoint>,
    /// Per micro-batch size.
    pub anomaly: Vec<AnomalyRow>,
    /// Per PageRank tolerance.
    pub pr: Vec<PrRun>,
    /// Wall seconds of this backend's parts: anomaly, sensor sweep, PageRank (full and
    /// streaming), each including set-up and the checks against the reference.
    pub secs: [f64; 3],
}

/// A run's result: the JSON for the results file and the figures, for pictures.
#[derive(Debug, Clone)]
pub struct Report {
    /// The results file's content.
    pub json: Value,
    /// The backends measured, in order.
    pub runs: Vec<BackendRun>,
    /// Anomaly sensors of the main runs.
    pub sensors: usize,
}

/// Readings/s of a run.
fn rate(readings: usize, elapsed: Duration) -> f64 {
    readings as f64 / elapsed.as_secs_f64()
}

/// Micro-batch latencies in microseconds, sorted.
fn micros(v: &[Duration]) -> Vec<f64> {
    let mut x: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    x.sort_by(f64::total_cmp);
    x
}

/// Runs to one decimal, for printing.
fn tenths(v: &[f64]) -> Vec<f64> {
    v.iter().map(|r| (r * 10.0).round() / 10.0).collect()
}

/// Measures the workloads on each of `backends` in turn, opening each with `open` when its
/// turn comes (a backend that does not open is listed in the report with `open`'s error, and
/// `say` gets a `SKIP:` line). `name` is a backend's name in the report and the lines.
pub fn run<B: Copy, E: std::fmt::Display>(
    o: &Options,
    backends: &[B],
    name: impl Fn(B) -> String,
    mut open: impl FnMut(B) -> Result<(Runtime, DeviceHandle), E>,
    progress: &dyn Progress,
    say: &mut dyn FnMut(String),
) -> Result<Report, BenchError> {
    let repeats = o.repeats.max(1);
    let sizes = o.sizes;
    let (nodes, readings, sensors) = (sizes.nodes, sizes.readings, sizes.sensors);
    let (stream_batches, updates) = (5, 100);
    say(format!(
        "== bench workloads ({} sizes): {repeats} repeats; PageRank {nodes} nodes x 5 edges; anomaly {readings} readings over {sensors} sensors ({} on CudaSim), sensor sweep {:?} ==",
        if o.quick { "quick" } else { "full" },
        sizes.sim_readings.min(readings),
        sizes.sweep_sensors
    ));
    let started = Instant::now();
    let t = Instant::now();
    let graph = input::generate_graph(nodes, 5, 42)?;
    say(format!(
        "graph: {} nodes, {} edges ({:.1} s to generate)",
        graph.nodes(),
        graph.edges.len(),
        t.elapsed().as_secs_f64()
    ));
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
    for &b in backends {
        let name = name(b);
        let (rt, d) = match open(b) {
            Ok(x) => x,
            Err(e) => {
                say(format!("{name}: SKIP: {e}"));
                absent.push(json!({"backend": name, "reason": e.to_string()}));
                continue;
            }
        };
        say(format!("-- {name} --"));
        let t_backend = Instant::now();
        let prec = Precision::of(d.kind());
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
        let step = |k: usize| progress.advance(k as u64);
        for batch in [100usize, 500, 1000] {
            let mut row = AnomalyRow {
                batch,
                ..Default::default()
            };
            progress.start((3 * repeats * readings) as u64, &format!("anomaly/{batch}"));
            for _ in 0..repeats {
                // Latency: one micro-batch in flight, like the stateless batch.
                let one = anomaly::run_actor(&rt, &d, &slotted, batch, 1, step)?;
                anomaly::check_with(&one, &slotted, prec)?;
                row.actor_sync_rps.push(rate(readings, one.elapsed));
                // Throughput: micro-batches pipelined (the statistics stay in the kernel, so
                // micro-batch k+1 need not wait for k's results; a stateless batch must).
                let a = anomaly::run_actor(&rt, &d, &slotted, batch, anomaly::IN_FLIGHT, step)?;
                anomaly::check_with(&a, &slotted, prec)?;
                let alerted: HashSet<u64> = a.alerts.iter().map(|x| x.index).collect();
                if let Some(&i) = spikes.iter().find(|&&i| !alerted.contains(&(i as u64))) {
                    return Err(BenchError::Check {
                        variant: "anomaly actor",
                        check: OutputCheck::MissedAlert { reading: i as u64 },
                    });
                }
                let s = anomaly::run_stateless(&d, &slotted, batch, step)?;
                anomaly::check_with(&s, &slotted, prec)?;
                row.actor_rps.push(rate(readings, a.elapsed));
                row.stateless_rps.push(rate(readings, s.elapsed));
                row.actor_lat = micros(&one.batch_latency);
                row.stateless_lat = micros(&s.batch_latency);
            }
            progress.finish();
            let ratios = row.ratios();
            say(format!(
                "anomaly micro-batch {batch:>4}: actor {:.2} M/s ({} in flight; {:.2} M/s with 1), stateless {:.3} M/s, actor/stateless x{:.1} (runs {:?}); latency p50 actor {:.1} us, stateless {:.1} us",
                median(&row.actor_rps) / 1e6,
                anomaly::IN_FLIGHT,
                median(&row.actor_sync_rps) / 1e6,
                median(&row.stateless_rps) / 1e6,
                median(&ratios),
                tenths(&ratios),
                quantile(&row.actor_lat, 0.5).unwrap_or(f64::NAN),
                quantile(&row.stateless_lat, 0.5).unwrap_or(f64::NAN)
            ));
            run.anomaly.push(row);
        }
        run.secs[0] = t_backend.elapsed().as_secs_f64();
        for &ns in &sweep_sensors {
            let (rs2, _) = input::generate_readings(sweep_readings, ns, 0, 3)?;
            let sl = anomaly::slot(&rs2);
            let mut point = SweepPoint {
                sensors: ns,
                actor_rps: vec![],
                stateless_rps: vec![],
            };
            progress.start((2 * repeats * readings) as u64, &format!("sensors/{ns}"));
            for _ in 0..repeats {
                let a = anomaly::run_actor(&rt, &d, &sl, 100, anomaly::IN_FLIGHT, step)?;
                anomaly::check_with(&a, &sl, prec)?;
                let s = anomaly::run_stateless(&d, &sl, 100, step)?;
                anomaly::check_with(&s, &sl, prec)?;
                point.actor_rps.push(rate(readings, a.elapsed));
                point.stateless_rps.push(rate(readings, s.elapsed));
            }
            progress.finish();
            let ratios = point.ratios();
            say(format!(
                "anomaly micro-batch 100, {ns:>6} sensors: actor {:.2} M/s, stateless {:.3} M/s, x{:.1} (runs {:?})",
                median(&point.actor_rps) / 1e6, median(&point.stateless_rps) / 1e6, median(&ratios),
                tenths(&ratios)
            ));
            run.sweep.push(point);
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
            progress.start(repeats as u64, "pagerank");
            for _ in 0..repeats {
                let t = Instant::now();
                let got = pagerank::run_full(&rt, &d, &graph, p)?;
                pr.full_secs.push(t.elapsed().as_secs_f64());
                pr.kernel_secs.push(got.kernel_time.as_secs_f64());
                pagerank::check_full_with(&got, reference, prec)?;
                pr.iterations = got.iterations;
                progress.advance(1);
            }
            progress.finish();
            say(format!(
                "full PageRank, tol {tol:e}: {:.3} s median end to end, {:.3} s in the kernel ({} iterations; sequential reference {:.2} s), runs {:?}",
                median(&pr.full_secs),
                median(&pr.kernel_secs),
                pr.iterations,
                reference_secs,
                pr.full_secs.iter().map(|s| (s * 1000.0).round() / 1000.0).collect::<Vec<_>>()
            ));
            // Streaming PageRank: the same definition on every backend (the graph in bound
            // buffers on a device, the handler's state on the CPU).
            progress.start((repeats * stream_batches) as u64, "stream");
            for _ in 0..repeats {
                let (steps, _) = pagerank::run_stream(&rt, &d, &graph, p, &update_batches, |_| {
                    progress.advance(1)
                })?;
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
            progress.finish();
            say(format!(
                "streaming PageRank, tol {tol:e} ({stream_batches} batches x {updates} updates): recompute/incremental x{:.1} median (runs {:?}); worst L1 distance {:.2e} <= {:.2e}",
                median(&pr.stream_ratio),
                pr.stream_ratio.iter().map(|r| r.round()).collect::<Vec<_>>(),
                pr.worst_l1,
                pagerank::stream_tolerance_with(graph.nodes(), p, prec)
            ));
            run.pr.push(pr);
        }
        run.secs[2] = t_backend.elapsed().as_secs_f64() - run.secs[0] - run.secs[1];
        say(format!(
            "{name}: {:.1} s (anomaly {:.1} s, sensor sweep {:.1} s, PageRank {:.1} s)",
            run.secs.iter().sum::<f64>(),
            run.secs[0],
            run.secs[1],
            run.secs[2]
        ));
        runs.push(run);
    }

    let json = json!({
        "benchmark": "workloads",
        "command": command(),
        "date": today(),
        "machine": machine(),
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
        "backends": runs.iter().map(backend_json).collect::<Vec<_>>(),
    });
    Ok(Report {
        json,
        runs,
        sensors,
    })
}

/// One backend's entry of `backends` in the results file.
fn backend_json(r: &BackendRun) -> Value {
    let latency = |v: &[f64]| json!({"p50": quantile(v, 0.5), "p90": quantile(v, 0.9), "p99": quantile(v, 0.99), "max": quantile(v, 1.0)});
    json!({
        "backend": r.name,
        "anomaly_readings": r.readings,
        "seconds": {"anomaly": r.secs[0], "sensor_sweep": r.secs[1], "pagerank": r.secs[2]},
        "anomaly": r.anomaly.iter().map(|a| {
            json!({
                "micro_batch": a.batch,
                "actor_readings_per_s": spread(&a.actor_rps),
                "actor_one_in_flight_readings_per_s": spread(&a.actor_sync_rps),
                "ratio_actor_one_in_flight_vs_stateless": spread(&a.actor_sync_rps.iter().zip(&a.stateless_rps).map(|(x, y)| x / y).collect::<Vec<_>>()),
                "stateless_readings_per_s": spread(&a.stateless_rps),
                "ratio_actor_vs_stateless": spread(&a.ratios()),
                "actor_batch_latency_us_one_in_flight": latency(&a.actor_lat),
                "stateless_batch_latency_us": latency(&a.stateless_lat),
            })
        }).collect::<Vec<_>>(),
        "anomaly_sensor_sweep_micro_batch_100": r.sweep.iter().map(|s| {
            json!({"sensors": s.sensors, "actor_readings_per_s": spread(&s.actor_rps), "stateless_readings_per_s": spread(&s.stateless_rps), "ratio_actor_vs_stateless": spread(&s.ratios())})
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_sizes_are_smaller_than_full_ones() {
        let (q, f) = (Sizes::QUICK, Sizes::FULL);
        assert!(q.nodes < f.nodes && q.readings < f.readings && q.sensors < f.sensors);
        assert!(q.sim_readings < f.sim_readings && q.sim_readings <= q.readings);
    }

    #[test]
    fn a_backend_entry_has_the_results_files_fields() {
        let r = BackendRun {
            name: "cpu".into(),
            readings: 10,
            sweep: vec![SweepPoint {
                sensors: 5,
                actor_rps: vec![4.0],
                stateless_rps: vec![2.0],
            }],
            anomaly: vec![AnomalyRow {
                batch: 100,
                actor_rps: vec![6.0, 8.0],
                actor_sync_rps: vec![3.0, 4.0],
                stateless_rps: vec![2.0, 2.0],
                actor_lat: vec![1.0, 2.0, 3.0],
                stateless_lat: vec![],
            }],
            pr: vec![],
            secs: [1.0, 2.0, 3.0],
        };
        let j = backend_json(&r);
        assert_eq!(j["seconds"]["sensor_sweep"], 2.0);
        let a = &j["anomaly"][0];
        assert_eq!(a["ratio_actor_vs_stateless"]["runs"], json!([3.0, 4.0]));
        assert_eq!(a["ratio_actor_one_in_flight_vs_stateless"]["median"], 1.5);
        assert_eq!(a["actor_batch_latency_us_one_in_flight"]["p50"], 2.0);
        assert_eq!(a["actor_batch_latency_us_one_in_flight"]["max"], 3.0);
        assert!(a["stateless_batch_latency_us"]["p50"].is_null());
        let s = &j["anomaly_sensor_sweep_micro_batch_100"][0];
        assert_eq!(s["ratio_actor_vs_stateless"]["median"], 2.0);
        assert_eq!(j["pagerank"], json!([]));
    }
}
