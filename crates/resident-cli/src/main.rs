//! The `resident` command-line tool: demos and benchmarks of ring kernels.

mod bench;
mod demo;
mod gpu_bench;
mod info;
mod profile;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
        /// Where the benchmark JSON goes.
        #[arg(long, default_value = "bench/results/cpu-latest.json")]
        out: PathBuf,
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
    /// GPU: persistent ring kernel vs launch-per-batch vs CUDA graph (needs a device).
    BenchRing {
        /// Round trips per latency point.
        #[arg(long, default_value_t = 20_000)]
        iters: usize,
        /// Messages in flight for the throughput points.
        #[arg(long, default_value_t = 4096)]
        in_flight: usize,
        /// Folder for ring-<device>-<date>.json.
        #[arg(long, default_value = "bench/results")]
        out_dir: PathBuf,
    },
    /// Backends and devices found here, and why a backend is unavailable.
    Info {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A three-stage sensor anomaly pipeline with telemetry.
    Demo {
        /// Readings to push through the pipeline.
        #[arg(long, default_value_t = 1_000_000)]
        messages: u32,
    },
    /// Runs a workload under the profiler: where the time goes, the bottleneck, the remedy.
    Profile(ProfileArgs),
    /// CPU-backend benchmarks against rtrb and crossbeam, measured in the same run.
    Bench {
        /// Shorter runs (a few seconds in all).
        #[arg(long)]
        quick: bool,
        /// Where the JSON goes.
        #[arg(long, default_value = "bench/results/cpu-latest.json")]
        out: PathBuf,
    },
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info { json } => return info::run(json),
        Command::BenchTransfer {
            iterations,
            out_dir,
        } => return gpu_exit(gpu_bench::transfer(iterations, &out_dir)),
        Command::BenchRing {
            iters,
            in_flight,
            out_dir,
        } => return gpu_exit(gpu_bench::ring(iters, in_flight, &out_dir)),
        Command::All { out } => {
            info::run(false);
            println!();
            demo::run(1_000_000)
        }
        .and_then(|_| {
            println!();
            bench::run(&bench::Options { quick: true }, Some(&out)).map(|_| ())
        }),
        Command::Demo { messages } => demo::run(messages),
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
        Command::Bench { quick, out } => {
            bench::run(&bench::Options { quick }, Some(&out)).map(|_| ())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
