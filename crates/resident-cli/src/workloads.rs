//! `resident demo <vector-add|pagerank|pipeline|anomaly>`: the reference workloads of
//! `resident-workloads` on a chosen backend, each checked against its f64 reference, with
//! progress bars (hidden when stderr is not a terminal) and output files.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use resident::backend::{self, DeviceHandle};
use resident::prelude::*;
use resident_workloads::input::{self, EdgeList, SensorReading};
use resident_workloads::{anomaly, pagerank, pipeline, vector_add, Precision};

/// Errors of the workload demos (printed with their causes; exit status 1).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The workload failed (input, runtime, reference check).
    #[error(transparent)]
    Workload(#[from] resident_workloads::WorkloadError),
    /// The backend is not in this build or not usable here.
    #[error("backend '{name}' is not available: {reason}")]
    Backend {
        /// The name given.
        name: String,
        /// Why.
        reason: String,
    },
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The runtime failed (the sensors demo).
    #[error(transparent)]
    Runtime(#[from] resident::Error),
    /// Options that do not go together.
    #[error("{0}")]
    Usage(String),
    /// A benchmark failed (`bench workloads`: a workload, its input, or a result check).
    #[error(transparent)]
    Bench(Box<resident_bench::BenchError>),
}

impl From<resident_workloads::InputError> for DemoError {
    fn from(e: resident_workloads::InputError) -> Self {
        DemoError::Workload(e.into())
    }
}

/// Backend names the CLI accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// Threads and rayon on the host (always available).
    Cpu,
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
    /// The CUDA kernel source on host threads (needs a host C++ compiler).
    CudaSim,
    /// Vulkan/Metal/DX12 through wgpu (lavapipe on a machine without a GPU).
    Wgpu,
    /// CUDA when a device works, else the CPU.
    Auto,
}

impl BackendChoice {
    /// A runtime and a device for the choice, or a clear error.
    pub fn open(self) -> Result<(Runtime, DeviceHandle), DemoError> {
        let name = self
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        let b = match self {
            BackendChoice::Cpu => Backend::Cpu,
            BackendChoice::Cuda => Backend::Cuda,
            BackendChoice::Auto => Backend::Auto,
            BackendChoice::CudaSim => Backend::CudaSim,
            BackendChoice::Wgpu => Backend::Wgpu,
        };
        let fail = |reason: String| DemoError::Backend {
            name: name.clone(),
            reason,
        };
        let rt = Runtime::builder()
            .backend(b)
            .build()
            .map_err(|e| fail(e.to_string()))?;
        let d = backend::open(b).map_err(|e| fail(e.to_string()))?;
        Ok((rt, d))
    }
}

/// `--backend`.
#[derive(Args, Debug, Clone)]
pub struct BackendArg {
    /// Where the kernels run.
    #[arg(long, value_enum, default_value_t = BackendChoice::Cpu)]
    pub backend: BackendChoice,
}

/// The workload demos.
#[derive(Subcommand, Debug)]
pub enum DemoCommand {
    /// The original three-stage sensor pipeline with telemetry (the default demo).
    Sensors {
        /// Readings to push through the pipeline.
        #[arg(long, default_value_t = 1_000_000)]
        messages: u32,
    },
    /// c = a + b by an actor over bound buffers; messages carry offset and length.
    VectorAdd {
        #[command(flatten)]
        backend: BackendArg,
        /// Elements [default: 10000000; on cuda-sim 1000000].
        #[arg(long)]
        n: Option<usize>,
        /// Elements per message (one device thread loops over a message's range; lavapipe cuts
        /// a WGSL invocation off after 65 535 loop iterations).
        #[arg(long, default_value_t = 16_384)]
        chunk: usize,
    },
    /// PageRank (networkx's definition) over an edge-list file or a generated graph.
    Pagerank(PagerankArgs),
    /// normalizer -> scorer, kernel to kernel.
    Pipeline {
        #[command(flatten)]
        backend: BackendArg,
        /// Readings [default: 1000000; on cuda-sim 20000].
        #[arg(long)]
        n: Option<usize>,
    },
    /// EWMA anomaly detection with per-sensor statistics resident in the kernel.
    Anomaly(AnomalyArgs),
}

/// `demo pagerank`.
#[derive(Args, Debug)]
pub struct PagerankArgs {
    #[command(flatten)]
    backend: BackendArg,
    /// Edge list: `src dst` per line, `#` comments.
    #[arg(long, conflicts_with_all = ["nodes", "edges_per_node", "seed"])]
    graph: Option<PathBuf>,
    /// Generated graph: nodes [default, without --graph: 1000000; on cuda-sim 20000].
    #[arg(long)]
    nodes: Option<usize>,
    /// Generated graph: out-edges drawn per node.
    #[arg(long, default_value_t = 5)]
    edges_per_node: usize,
    /// Generated graph: seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// networkx's tol (stop at L1 change < N x tol).
    #[arg(long, default_value_t = pagerank::TOL)]
    tol: f64,
    /// networkx's max_iter.
    #[arg(long, default_value_t = pagerank::MAX_ITER)]
    max_iter: u32,
    /// Streaming mode: edge updates in batches, incremental refresh vs recompute.
    #[arg(long)]
    stream: bool,
    /// Streaming: update batches.
    #[arg(long, default_value_t = 10)]
    batches: usize,
    /// Streaming: edge updates per batch (half removals, half additions).
    #[arg(long, default_value_t = 100)]
    updates_per_batch: usize,
    /// Write every node's rank (`node rank` per line, original ids).
    #[arg(long)]
    ranks_out: Option<PathBuf>,
}

/// `demo anomaly`.
#[derive(Args, Debug)]
pub struct AnomalyArgs {
    #[command(flatten)]
    backend: BackendArg,
    /// Readings CSV: `sensor,value` per line.
    #[arg(long, conflicts_with_all = ["readings", "sensors", "spike_every", "seed"])]
    input: Option<PathBuf>,
    /// Generated stream: readings [default: 1000000; on cuda-sim 20000].
    #[arg(long)]
    readings: Option<usize>,
    /// Generated stream: sensors.
    #[arg(long, default_value_t = 1000)]
    sensors: usize,
    /// Generated stream: a spike every this many readings.
    #[arg(long, default_value_t = 997)]
    spike_every: usize,
    /// Generated stream: seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Readings per micro-batch.
    #[arg(long, default_value_t = 100)]
    micro_batch: usize,
    /// Actor: micro-batches outstanding at once (1 = wait for each before sending the next).
    #[arg(long, default_value_t = anomaly::IN_FLIGHT)]
    in_flight: usize,
    /// Run the stateless baseline instead of the actor.
    #[arg(long)]
    stateless: bool,
    /// Write every alert (`index,sensor,value,z` per line).
    #[arg(long)]
    alerts_out: Option<PathBuf>,
}

/// A progress bar on stderr, hidden when stderr is not a terminal.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len);
    b.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    b.set_message(what.to_string());
    b
}

/// Writes `lines` to `path` (never creates directories); any failure is an error.
pub fn write_lines(
    path: &Path,
    mut f: impl FnMut(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), DemoError> {
    let err = |source| DemoError::Write {
        path: path.to_path_buf(),
        source,
    };
    let file = File::create(path).map_err(err)?;
    let mut w = BufWriter::new(file);
    f(&mut w).map_err(err)?;
    w.into_inner()
        .map_err(|e| err(e.into_error()))?
        .sync_all()
        .map_err(err)?;
    Ok(())
}

/// A size flag: the value given (at least 1, else an error naming the flag), or the default,
/// smaller on CudaSim with a note saying why.
fn size(
    flag: &str,
    given: Option<usize>,
    backend: BackendChoice,
    default: usize,
    on_sim: usize,
) -> Result<usize, DemoError> {
    match given {
        Some(0) => Err(DemoError::Usage(format!(
            "{flag} must be at least 1 (there would be nothing to compute and nothing to check)"
        ))),
        Some(n) => Ok(n),
        None if backend == BackendChoice::CudaSim => {
            println!(
                "note: CudaSim is a simulator (one OS thread per CUDA thread, for correctness, \
                 not speed): {flag} defaults to {on_sim} here instead of {default}"
            );
            Ok(on_sim)
        }
        None => Ok(default),
    }
}

/// Memory this machine has available now (Linux: `MemAvailable`), if known.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Refuses a size whose working set (`bytes_per_item` each, a rough upper estimate of what the
/// demo and its reference hold) cannot fit in the memory available now, naming the flag: an
/// absurd size is a message, not an allocation failure halfway through.
fn fits(flag: &str, n: usize, bytes_per_item: u64) -> Result<(), DemoError> {
    let need = (n as u64).saturating_mul(bytes_per_item);
    match available_memory() {
        Some(avail) if need > avail => Err(DemoError::Usage(format!(
            "{flag} {n} needs about {:.1} GiB, more than the {:.1} GiB available here",
            need as f64 / (1u64 << 30) as f64,
            avail as f64 / (1u64 << 30) as f64
        ))),
        _ => Ok(()),
    }
}

/// An error for a zero flag.
fn at_least_one(flag: &str, v: usize) -> Result<(), DemoError> {
    match v {
        0 => Err(DemoError::Usage(format!("{flag} must be at least 1"))),
        _ => Ok(()),
    }
}

/// Runs one demo.
pub fn run(cmd: DemoCommand) -> Result<(), DemoError> {
    match cmd {
        DemoCommand::Sensors { messages } => Ok(crate::demo::run(messages)?),
        DemoCommand::VectorAdd { backend, n, chunk } => {
            let n = size("--n", n, backend.backend, 10_000_000, 1_000_000)?;
            at_least_one("--chunk", chunk)?;
            fits("--n", n, 40)?; // a, b, c on the host and on the device, and the check
            let (rt, d) = backend.backend.open()?;
            println!(
                "== demo vector-add: {n} elements, {chunk} per message, backend {:?} ==",
                rt.backend()
            );
            let (a, b) = vector_add::inputs(n, 1);
            let r = vector_add::run(&rt, &d, &a, &b, chunk).map_err(DemoError::from)?;
            vector_add::check(&a, &b, &r.c)?;
            println!(
                "{:.3} s, {:.1} M elements/s; every element within f32::EPSILON x |a+b| of the f64 reference",
                r.elapsed.as_secs_f64(),
                n as f64 / r.elapsed.as_secs_f64() / 1e6
            );
            Ok(())
        }
        DemoCommand::Pipeline { backend, n } => {
            let n = size("--n", n, backend.backend, 1_000_000, 20_000)?;
            fits("--n", n, 200)?; // values, messages, results, the reference
            let (rt, d) = backend.backend.open()?;
            println!(
                "== demo pipeline: normalizer -> scorer, {n} readings, backend {:?} ==",
                rt.backend()
            );
            let mut rng = resident_workloads::rng::SplitMix64::new(5);
            let values: Vec<f64> = (0..n).map(|_| rng.unit() * 140.0 - 20.0).collect();
            let pb = bar(n as u64, "readings");
            let r = pipeline::run(&rt, &values, |k| pb.inc(k as u64))?;
            pb.finish_and_clear();
            pipeline::check_with(&r.scored, &values, Precision::of(d.kind()))?;
            let mut levels = [0usize; 3];
            for s in &r.scored {
                levels[s.level as usize] += 1;
            }
            println!(
                "{:.3} s, {:.2} M readings/s; low {} medium {} high {}; checked against the f64 reference",
                r.elapsed.as_secs_f64(),
                n as f64 / r.elapsed.as_secs_f64() / 1e6,
                levels[0],
                levels[1],
                levels[2]
            );
            Ok(())
        }
        DemoCommand::Pagerank(a) => run_pagerank(a),
        DemoCommand::Anomaly(a) => run_anomaly(a),
    }
}

/// `demo pagerank`'s generated graph without `--graph` or `--nodes`: the size of the
/// committed PageRank benchmark (1M nodes, 5M edges; `bench workloads`), on every backend but
/// CudaSim, which is a simulator and gets a graph it ranks in seconds.
const PAGERANK_NODES: usize = 1_000_000;
/// The same on CudaSim.
const PAGERANK_NODES_SIM: usize = 20_000;

/// The generated graph's nodes: `--nodes`, or the backend's default (see [`PAGERANK_NODES`]).
fn pagerank_nodes(a: &PagerankArgs) -> Result<usize, DemoError> {
    size(
        "--nodes",
        a.nodes,
        a.backend.backend,
        PAGERANK_NODES,
        PAGERANK_NODES_SIM,
    )
}

fn load_graph(a: &PagerankArgs) -> Result<EdgeList, DemoError> {
    match &a.graph {
        Some(p) => {
            let g = input::read_edge_list(p)?;
            match g.edges.is_empty() {
                true => Err(resident_workloads::InputError::Empty {
                    path: p.clone(),
                    what: "no edges (expected 'src dst' lines): nothing to rank",
                }
                .into()),
                false => Ok(g),
            }
        }
        None => {
            let n = pagerank_nodes(a)?;
            // Edges as pairs, CSR both ways, ranks and the reference.
            fits("--nodes", n, 64 + 40 * a.edges_per_node as u64)?;
            Ok(input::generate_graph(n, a.edges_per_node, a.seed)?)
        }
    }
}

fn run_pagerank(a: PagerankArgs) -> Result<(), DemoError> {
    if !(a.tol > 0.0 && a.tol.is_finite()) {
        return Err(DemoError::Usage(format!(
            "--tol must be a positive number, got {}",
            a.tol
        )));
    }
    at_least_one("--max-iter", a.max_iter as usize)?;
    if a.stream {
        at_least_one("--batches", a.batches)?;
        at_least_one("--updates-per-batch", a.updates_per_batch)?;
    }
    let (rt, d) = a.backend.backend.open()?;
    let t = Instant::now();
    let g = load_graph(&a)?;
    println!(
        "== demo pagerank{}: {} nodes, {} edges (loaded in {:.2} s), backend {:?} ==",
        if a.stream { " (streaming)" } else { "" },
        g.nodes(),
        g.edges.len(),
        t.elapsed().as_secs_f64(),
        rt.backend()
    );
    let p = pagerank::Params {
        tol: a.tol,
        max_iter: a.max_iter,
        ..Default::default()
    };
    let ranks = if a.stream {
        let batches = pagerank::generate_updates(&g, a.batches, a.updates_per_batch, a.seed);
        let pb = bar(batches.len() as u64, "batches");
        let (steps, ranks) = pagerank::run_stream(&rt, &d, &g, p, &batches, |_| pb.inc(1))?;
        pb.finish_and_clear();
        let inc: f64 = steps.iter().map(|s| s.incremental.as_secs_f64()).sum();
        let full: f64 = steps.iter().map(|s| s.recompute.as_secs_f64()).sum();
        let worst = steps.iter().map(|s| s.l1_diff).fold(0.0, f64::max);
        let bound = steps.iter().map(|s| s.bound).fold(0.0, f64::max);
        let mismatch = steps
            .iter()
            .map(|s| s.check.mismatch / s.check.mismatch_bound)
            .fold(0.0, f64::max);
        let tol = pagerank::stream_tolerance_with(g.nodes(), p, Precision::of(d.kind()));
        println!(
            "{} batches of {} updates: incremental {:.4} s, recompute {:.4} s (x{:.1}); worst L1 distance {:.2e} <= {:.2e} (the residuals left; worst case {:.2e}); kernel residual = host residual of its ranks on the expected graph within {:.1e} of the rounding allowance",
            steps.len(),
            a.updates_per_batch,
            inc,
            full,
            full / inc.max(1e-12),
            worst,
            bound,
            tol,
            mismatch
        );
        // The final ranks against the sequential f64 reference on the final graph.
        let want = pagerank::reference(&pagerank::apply_updates(&g, &batches), p)?;
        let l1: f64 = ranks
            .iter()
            .zip(&want.ranks)
            .map(|(x, y)| (x - y).abs())
            .sum();
        if l1.is_nan() || l1 > tol {
            return Err(resident_workloads::WorkloadError::Mismatch {
                workload: "pagerank-stream",
                detail: format!(
                    "final ranks at L1 distance {l1:e} from the reference, more than {tol:e}"
                ),
            }
            .into());
        }
        println!(
            "final ranks within L1 {l1:.2e} of the sequential f64 reference on the final graph"
        );
        ranks
    } else {
        let pb = bar(1, "pagerank");
        pb.enable_steady_tick(Duration::from_millis(200));
        let t = Instant::now();
        let got = pagerank::run_full(&rt, &d, &g, p)?;
        let secs = t.elapsed().as_secs_f64();
        pb.finish_and_clear();
        let want = pagerank::reference(&g, p)?;
        pagerank::check_full_with(&got, &want, Precision::of(d.kind()))?;
        let check = match Precision::of(d.kind()) {
            Precision::F64 => format!(
                "every rank within relative {:e} of the sequential f64 reference",
                pagerank::FULL_TOLERANCE
            ),
            Precision::F32 => format!(
                "f32 ranks within L1 {:e} of the sequential f64 reference",
                pagerank::FULL_TOLERANCE_F32
            ),
        };
        println!(
            "{} iterations in {:.3} s (L1 change {:.2e}); {check}",
            got.iterations, secs, got.err
        );
        // The iterations alone (after the CSR is built and the kernel launched): what
        // bench/python/pagerank_scipy.py compares with scipy's power iteration.
        println!(
            "kernel {:.6} s for {} iterations: {:.6} s per iteration",
            got.kernel_time.as_secs_f64(),
            got.iterations,
            got.kernel_time.as_secs_f64() / got.iterations.max(1) as f64
        );
        got.ranks
    };
    if let Some(path) = &a.ranks_out {
        write_lines(path, |w| {
            for (id, r) in g.ids.iter().zip(&ranks) {
                writeln!(w, "{id} {r}")?;
            }
            Ok(())
        })?;
        println!("wrote {} ranks to {}", ranks.len(), path.display());
    }
    Ok(())
}

fn run_anomaly(a: AnomalyArgs) -> Result<(), DemoError> {
    if a.micro_batch == 0 {
        return Err(DemoError::Usage("--micro-batch must be at least 1".into()));
    }
    at_least_one("--in-flight", a.in_flight)?;
    let (readings, spikes): (Vec<SensorReading>, Option<Vec<usize>>) = match &a.input {
        Some(p) => {
            let r = input::read_readings(p)?;
            if r.is_empty() {
                return Err(resident_workloads::InputError::Empty {
                    path: p.clone(),
                    what: "no readings (expected 'sensor,value' lines): nothing to check",
                }
                .into());
            }
            (r, None)
        }
        None => {
            let n = size(
                "--readings",
                a.readings,
                a.backend.backend,
                1_000_000,
                20_000,
            )?;
            fits("--readings", n, 200)?; // readings, slots, messages, the reference
            let (r, s) = input::generate_readings(n, a.sensors, a.spike_every, a.seed)?;
            (r, Some(s))
        }
    };
    let (rt, d) = a.backend.backend.open()?;
    let r = anomaly::slot(&readings);
    println!(
        "== demo anomaly{}: {} readings, {} sensors, micro-batch {}, backend {:?} ==",
        if a.stateless {
            " (stateless baseline)"
        } else {
            ""
        },
        readings.len(),
        r.sensor_ids.len(),
        a.micro_batch,
        rt.backend()
    );
    let pb = bar(readings.len() as u64, "readings");
    let report = if a.stateless {
        anomaly::run_stateless(&d, &r, a.micro_batch, |k| pb.inc(k as u64))?
    } else {
        anomaly::run_actor(&rt, &d, &r, a.micro_batch, a.in_flight, |k| {
            pb.inc(k as u64)
        })?
    };
    pb.finish_and_clear();
    anomaly::check_with(&report, &r, Precision::of(d.kind()))?;
    let mut lat: Vec<Duration> = report.batch_latency.clone();
    lat.sort_unstable();
    let q = |f: f64| {
        lat.get(((lat.len() as f64 - 1.0) * f) as usize)
            .map(|d| d.as_secs_f64() * 1e6)
            .unwrap_or(0.0)
    };
    println!(
        "{} alerts; {:.3} s, {:.2} M readings/s; micro-batch latency p50 {:.1} us p99 {:.1} us; checked against the f64 reference",
        report.alerts.len(),
        report.elapsed.as_secs_f64(),
        readings.len() as f64 / report.elapsed.as_secs_f64().max(1e-12) / 1e6,
        q(0.5),
        q(0.99)
    );
    if let Some(spikes) = spikes {
        let alerted: std::collections::HashSet<u64> =
            report.alerts.iter().map(|x| x.index).collect();
        let caught = spikes
            .iter()
            .filter(|&&i| alerted.contains(&(i as u64)))
            .count();
        println!("injected spikes alerted: {caught} of {}", spikes.len());
        if caught != spikes.len() {
            return Err(DemoError::Usage(format!(
                "{} injected spikes were not alerted",
                spikes.len() - caught
            )));
        }
    }
    if let Some(path) = &a.alerts_out {
        write_lines(path, |w| {
            for x in &report.alerts {
                writeln!(w, "{},{},{},{}", x.index, x.sensor, x.value, x.z)?;
            }
            Ok(())
        })?;
        println!("wrote {} alerts to {}", report.alerts.len(), path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// `resident demo ...`, parsed as the binary parses it.
    #[derive(Parser)]
    struct Demo {
        #[command(subcommand)]
        cmd: DemoCommand,
    }

    fn pagerank_args(args: &[&str]) -> PagerankArgs {
        let argv = ["demo", "pagerank"].iter().chain(args);
        match Demo::try_parse_from(argv).unwrap().cmd {
            DemoCommand::Pagerank(a) => a,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn pagerank_has_a_default_graph_on_every_backend() {
        // Neither --graph nor --nodes: a generated graph of the backend's default size.
        for (backend, want) in [
            (None, PAGERANK_NODES),
            (Some("cpu"), PAGERANK_NODES),
            (Some("cuda"), PAGERANK_NODES),
            (Some("wgpu"), PAGERANK_NODES),
            (Some("auto"), PAGERANK_NODES),
            (Some("cuda-sim"), PAGERANK_NODES_SIM),
        ] {
            let args: Vec<&str> = backend.iter().flat_map(|b| ["--backend", *b]).collect();
            let a = pagerank_args(&args);
            assert!(a.graph.is_none() && a.nodes.is_none(), "{args:?}");
            assert_eq!(pagerank_nodes(&a).unwrap(), want, "{args:?}");
        }
        // --nodes wins on every backend; zero is refused naming the flag.
        for b in ["cpu", "cuda", "cuda-sim", "wgpu"] {
            let a = pagerank_args(&["--backend", b, "--nodes", "50"]);
            assert_eq!(pagerank_nodes(&a).unwrap(), 50, "{b}");
            let a = pagerank_args(&["--backend", b, "--nodes", "0"]);
            let e = pagerank_nodes(&a).unwrap_err().to_string();
            assert!(e.contains("--nodes"), "{b}: {e}");
        }
        // A file and --nodes still do not go together.
        let argv = ["demo", "pagerank", "--graph", "g.txt", "--nodes", "5"];
        assert!(Demo::try_parse_from(argv).is_err());
    }
}
