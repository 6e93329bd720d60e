//! `resident fuzz`: the decoders of untrusted bytes under a seeded, structure-aware generator
//! (resident_bench::fuzz); exit status 1 when an input fails.

use std::path::PathBuf;
use std::process::ExitCode;

use resident_bench::fuzz::{self, FuzzOptions, Target};
use resident_bench::provenance;
use serde_json::json;

/// Arguments of `resident fuzz`.
#[derive(clap::Args)]
pub struct FuzzArgs {
    /// nats-codec, edge-list, readings, layout, wgsl, cuda, or all.
    #[arg(long, default_value = "all")]
    target: String,
    /// Inputs per target.
    #[arg(long, default_value_t = 100_000)]
    inputs: u64,
    /// The generator's seed (the same seed gives the same inputs).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where failing inputs are saved.
    #[arg(long, default_value = "target/fuzz-crashes")]
    crash_dir: PathBuf,
    /// Write the results as JSON here (command, date, machine, one entry per target).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Describe the machine in the JSON with this text instead of its CPU and cores.
    #[arg(long)]
    machine: Option<String>,
    /// The cuda target also compiles with NVRTC every input whose index is a multiple of this,
    /// and its seed corpus (0: none; a compile takes 20 to 600 ms).
    #[arg(long, default_value_t = fuzz::DEFAULT_COMPILE_EVERY)]
    compile_every: u64,
    /// Threads that judge inputs (one more draws them); the report does not depend on it.
    #[arg(long, default_value_t = std::num::NonZeroUsize::MIN)]
    jobs: std::num::NonZeroUsize,
    /// Print a progress line to stderr every this many seconds (0: none).
    #[arg(long, default_value_t = 60)]
    progress: u64,
}

pub fn run(a: FuzzArgs) -> ExitCode {
    let targets = if a.target == "all" {
        Target::ALL.to_vec()
    } else {
        match Target::from_name(&a.target) {
            Ok(t) => vec![t],
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    };
    let opts = FuzzOptions {
        inputs: a.inputs,
        seed: a.seed,
        crash_dir: Some(a.crash_dir),
        compile_every: a.compile_every,
        jobs: a.jobs,
        progress_every: (a.progress > 0).then(|| std::time::Duration::from_secs(a.progress)),
        ..FuzzOptions::default()
    };
    if !fuzz::alloc::installed() {
        eprintln!("warning: the counting allocator is not installed; allocation is not measured");
    }
    let mut reports = Vec::new();
    let mut failed = false;
    for t in targets {
        let r = match fuzz::run_with_progress(t, &opts, &|p| {
            eprintln!(
                "{}: {} of {} inputs judged, {} failing, {:.0} s",
                p.target, p.judged, p.inputs, p.failing, p.seconds
            )
        }) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        println!(
            "{:<11} {} inputs in {:.1} s: {} failing, {} error kinds, longest error {} bytes, \
             peak {}",
            t.name(),
            r.inputs,
            r.seconds,
            r.crash_count,
            r.error_kinds.len(),
            r.longest_error,
            r.alloc_peak
                .map_or("not measured".to_string(), |(p, len)| format!(
                    "{p} bytes held for a {len}-byte input (bound {})",
                    fuzz::target_alloc_bound(t, len)
                )),
        );
        for ((decoder, kind), n) in &r.error_kinds {
            println!("    {decoder}: {kind} x{n}");
        }
        for ((decoder, why), n) in &r.skipped {
            println!("    {decoder}: skipped x{n} ({why})");
        }
        if t == Target::Cuda {
            println!(
                "    longest compile error {} bytes (at most {}), {}",
                r.longest_compile_error,
                fuzz::MAX_COMPILE_ERROR_DISPLAY,
                match r.compile_every {
                    0 => "no input compiled".to_string(),
                    k => format!("the corpus and every {k}th input compiled"),
                }
            );
        }
        for c in &r.crashes {
            failed = true;
            println!(
                "  FAIL input {} ({} bytes): {}{}",
                c.index,
                c.len,
                c.kind,
                c.saved
                    .as_ref()
                    .map(|p| format!(" [saved: {}]", p.display()))
                    .unwrap_or_default()
            );
        }
        failed |= r.crash_count > 0;
        reports.push(r);
    }
    if let Some(out) = a.out {
        let doc = json!({
            "command": provenance::cargo_command("resident-cli"),
            "date": provenance::today(),
            "machine": a.machine.map_or_else(provenance::machine, |m| json!(m)),
            "load": provenance::load(),
            "seed": a.seed,
            "jobs": a.jobs.get(),
            "max_error_display": fuzz::MAX_ERROR_DISPLAY,
            "max_compile_error_display": fuzz::MAX_COMPILE_ERROR_DISPLAY,
            "alloc_bound": "256 KiB + 32 bytes per input byte, per input (peak held at once); wgsl 256 KiB + 512, cuda 1 MiB + 64 per input byte (each target's alloc_peak.bound)",
            "targets": reports.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
        });
        if let Err(e) = provenance::write_json(&out, &doc) {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
        println!("wrote {}", out.display());
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
