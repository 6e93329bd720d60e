//! The `resident` command-line tool: demos and benchmarks of ring kernels.

mod bench;
mod demo;
mod forwarding_bench;
mod fuzz;
mod gpu_bench;
mod info;
mod paths;
mod profile;
mod serve;
mod soak;
mod wgpu_bench;
mod workloads;
mod workloads_bench;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Counts the bytes a fuzzed input's decoding holds (`resident fuzz`); for every other command
/// it is the system allocator with one thread-local read per allocation.
#[global_allocator]
static ALLOC: resident_bench::fuzz::alloc::CountingAlloc =
    resident_bench::fuzz::alloc::CountingAlloc;

#[derive(Parser)]
#[command(
    name = "resident",
    version,
    about = "Persistent GPU actors: demos, benchmarks, devices"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main job: devices, the demo pipeline, then the quick benchmark (JSON into bench/results/).
    All {
        /// Where the benchmark JSON goes [default: bench/results/cpu-latest.json in the
        /// repository, from any folder].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// GPU: pinned vs pageable transfers against a plain cuMemcpy baseline (needs a device).
    BenchTransfer {
        /// Copies per size.
        #[arg(long, default_value_t = 20)]
        iterations: u32,
        /// Folder for transfer-<device>-<date>.json.
        #[arg(long, default_value = "bench/results")]
        out_dir: PathBuf,
    },
    /// GPU: persistent ring kernel vs launch-per-batch vs CUDA graph (needs a device), with
    /// CudaSim's bus figures beside the times; `--model`: the bus figures alone (no GPU).
    BenchRing {
        /// Round trips per latency point.
        #[arg(long, default_value_t = 20_000)]
        iters: usize,
        /// Depths for the throughput and batch points, comma-separated (the round trip at one
        /// message in flight is always measured).
        #[arg(long, value_delimiter = ',', default_value = "64,1024,4096,65536")]
        in_flight: Vec<usize>,
        /// Folder for ring-<device>-<date>.json.
        #[arg(long, default_value = "bench/results")]
        out_dir: PathBuf,
        /// Only CudaSim's bus model (no GPU needed): reads, writes, bytes and dependent reads
        /// per message and per batch, exact -> ring-bus-model-<date>.json.
        #[arg(long)]
        model: bool,
        /// Only the persistent kernel's round trip at one message in flight, by block size
        /// (32/256/1024) and idle backoff (32/256/2048 ns) -> ring-sweep-<device>-<date>.json.
        #[arg(long, conflicts_with = "model")]
        sweep: bool,
        /// With the GPU times, leave out CudaSim's bus model (it compiles the simulator).
        #[arg(long, conflicts_with = "model")]
        no_model: bool,
    },
    /// wgpu: a ring kernel with state on the device vs the same WGSL handler stateless
    /// (state uploaded and downloaded per batch), batches of 64 / 1024 / 16384.
    BenchWgpu {
        /// Repeats of every point (the JSON gives the spread).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Fewer batches per point.
        #[arg(long)]
        quick: bool,
        /// Folder for wgpu-<adapter>-<date>.json.
        #[arg(long, default_value = "bench/results")]
        out_dir: PathBuf,
    },
    /// Backends and devices found here, and why a backend is unavailable.
    Info {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Demos: `vector-add`, `pagerank`, `pipeline`, `anomaly` (the reference workloads) or
    /// `sensors` (a three-stage sensor pipeline with telemetry, also what `demo` alone runs).
    #[command(args_conflicts_with_subcommands = true)]
    Demo {
        #[command(subcommand)]
        which: Option<workloads::DemoCommand>,
        /// Readings to push through the sensors pipeline (when no demo is named).
        #[arg(long, default_value_t = 1_000_000)]
        messages: u32,
    },
    /// Runs a workload under the profiler: where the time goes, the bottleneck, the remedy.
    Profile(ProfileArgs),
    /// CPU-backend benchmarks against rtrb and crossbeam, measured in the same run;
    /// `bench workloads` measures the reference workloads and draws pictures.
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        #[command(subcommand)]
        which: Option<BenchCommand>,
        /// Shorter runs (a few seconds in all).
        #[arg(long)]
        quick: bool,
        /// Where the JSON goes [default: bench/results/cpu-latest.json in the repository].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Serve a demo ring kernel over NATS (request/reply, queue groups, JetStream).
    Serve(Box<serve::ServeArgs>),
    /// Fuzz the decoders of untrusted bytes (NATS payloads and replies, edge lists, readings):
    /// no panic, short typed errors, bounded allocation; exit status 1 on a failing input.
    Fuzz(fuzz::FuzzArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The workloads: anomaly actor vs stateless per micro-batch size, streaming PageRank
    /// incremental vs recompute, full PageRank; JSON and SVG/PNG pictures.
    Workloads(workloads_bench::Options),
    /// Call deadlines: a storm of short calls against a slow handler, then the time until a
    /// fresh call is served, with the deadline check off (before) and on (after).
    Deadlines(bench::DeadlinesArgs),
    /// Device-side forwarding: the pipeline workload forwarded on the device against the same
    /// run relayed by the host (`ForwardPath::HostRelay`), alternating, on CudaSim by default.
    Forwarding(forwarding_bench::Options),
    /// A keyed kernel served over JetStream by worker processes under faults drawn from a seed
    /// (SIGKILLed workers, nats-server restarted, workers SIGSTOPped past their lease); proves
    /// every input has exactly one output and the key states equal a replay -> soak-<date>.json.
    Soak(soak::Options),
    /// A worker of `bench soak` (started by it).
    #[command(hide = true)]
    SoakWorker(soak::WorkerOptions),
}

#[derive(clap::Args)]
struct ProfileArgs {
    /// launch-bound, transfer-bound, handler-bound, queue-bound, utilization-bound or pipeline.
    demo: String,
    /// Write a Chrome/Perfetto trace (JSON) here.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Measure the demo's kernel at several batch and queue sizes and recommend one.
    #[arg(long)]
    tune: bool,
    /// Latency target for --tune (e.g. 200us, 1ms).
    #[arg(long, default_value = "200us")]
    p99_target: String,
    /// Messages to send (default: per demo).
    #[arg(long)]
    messages: Option<usize>,
    /// Measure the profiler's overhead (off / paused / on, interleaved) instead.
    #[arg(long)]
    overhead: bool,
    /// Rounds of --overhead.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Where --overhead writes its JSON.
    #[arg(long, default_value = "bench/results/profile-overhead.json")]
    out: PathBuf,
}

fn gpu_exit(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Prints an error with its causes; exit status 1.
fn demo_exit(r: Result<(), workloads::DemoError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            let mut last = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                // A transparent wrapper repeats its cause's message: print it once.
                let text = s.to_string();
                if !last.contains(&text) {
                    eprintln!("  caused by: {text}");
                }
                last = text;
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

/// Restores the default SIGPIPE action, so that output piped into a reader that stops early
/// (`resident profile x --json | head -1`) ends the process quietly, as for any Unix tool,
/// instead of a panic on the failed write. Not for `serve`, which writes to sockets: there a
/// closed peer must stay an error, not end the server.
#[cfg(unix)]
fn quiet_broken_pipe() {
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    const SIGPIPE: i32 = 13; // Linux, macOS and the BSDs
    const SIG_DFL: usize = 0;
    // SAFETY: called first thing in main, before any other thread exists.
    unsafe {
        signal(SIGPIPE, SIG_DFL);
    }
}

#[cfg(not(unix))]
fn quiet_broken_pipe() {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        quiet_broken_pipe();
    }
    let result = match cli.command {
        Command::Info { json } => return info::run(json),
        Command::Serve(args) => return serve::run(*args),
        Command::Fuzz(args) => return fuzz::run(args),
        Command::BenchTransfer {
            iterations,
            out_dir,
        } => return gpu_exit(gpu_bench::transfer(iterations, &out_dir)),
        Command::BenchRing {
            iters,
            in_flight,
            out_dir,
            model,
            sweep,
            no_model,
        } => {
            return gpu_exit(if model {
                gpu_bench::ring_model(&out_dir)
            } else if sweep {
                gpu_bench::ring_sweep(iters, &out_dir)
            } else {
                gpu_bench::ring(iters, &in_flight, !no_model, &out_dir)
            })
        }
        Command::BenchWgpu {
            repeats,
            quick,
            out_dir,
        } => return gpu_exit(wgpu_bench::run(repeats.max(1), quick, &out_dir)),
        Command::All { out } => {
            // Where the results go is settled before any work is done.
            let out = match paths::output(out, "bench/results/cpu-latest.json", "--out")
                .and_then(|p| paths::check_parent(&p, "--out").map(|()| p))
            {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            info::run(false);
            println!();
            demo::run(1_000_000)
                .map_err(bench::BenchError::from)
                .and_then(|_| {
                    println!();
                    bench::cpu(true, Some(&out)).map(|_| ())
                })
        }
        Command::Demo {
            which: None,
            messages,
        } => demo::run(messages).map_err(bench::BenchError::from),
        Command::Demo { which: Some(w), .. } => return demo_exit(workloads::run(w)),
        Command::Profile(a) => {
            return gpu_exit(profile::run(&profile::Options {
                demo: a.demo,
                trace: a.trace,
                json: a.json,
                tune: a.tune,
                p99_target: a.p99_target,
                messages: a.messages,
                overhead: a.overhead.then_some((a.rounds, a.out)),
            }))
        }
        Command::Bench {
            which: Some(BenchCommand::Workloads(o)),
            ..
        } => return demo_exit(workloads_bench::run(&o)),
        Command::Bench {
            which: Some(BenchCommand::Deadlines(o)),
            ..
        } => bench::deadlines(&o),
        Command::Bench {
            which: Some(BenchCommand::Soak(o)),
            ..
        } => return soak::run(&o),
        Command::Bench {
            which: Some(BenchCommand::SoakWorker(o)),
            ..
        } => return soak::worker(o),
        Command::Bench {
            which: Some(BenchCommand::Forwarding(o)),
            ..
        } => forwarding_bench::run(&o),
        Command::Bench {
            which: None,
            quick,
            out,
        } => paths::output(out, "bench/results/cpu-latest.json", "--out")
            .map_err(bench::BenchError::from)
            .and_then(|out| bench::cpu(quick, Some(&out)).map(|_| ())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
