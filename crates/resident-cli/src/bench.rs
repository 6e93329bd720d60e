//! `resident bench` (the CPU backend against `rtrb` and `crossbeam`) and `resident bench
//! deadlines` (the call storm): the arguments, the printing and the files. The measuring is
//! in `resident_bench`.

use std::path::{Path, PathBuf};

use clap::Args;
use resident_bench::provenance::{today, write_json};
use serde_json::Value;

/// Errors of the benchmark commands, printed by `main`.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// `resident bench [--quick]`: measures, prints each figure as it comes, then writes the JSON
/// to `out` (whose folder is checked before anything is measured).
pub fn cpu(quick: bool, out: Option<&Path>) -> Result<Value, BenchError> {
    if let Some(path) = out {
        crate::paths::check_parent(path, "--out")?;
    }
    let report = resident_bench::cpu::run(&resident_bench::cpu::Options { quick }, &mut |line| {
        println!("{line}")
    })?;
    if let Some(path) = out {
        write_json(path, &report)?;
        println!("wrote {}", path.display());
    }
    Ok(report)
}

/// Options of `bench deadlines`.
#[derive(Args, Debug)]
pub struct DeadlinesArgs {
    /// Calls in the storm.
    #[arg(long, default_value_t = 2400)]
    pub calls: u32,
    /// Timeout of each storm call, in milliseconds.
    #[arg(long, default_value_t = 1)]
    pub timeout_ms: u64,
    /// Time the handler takes per message, in milliseconds.
    #[arg(long, default_value_t = 2)]
    pub handler_ms: u64,
    /// Storms per variant (before, after alternate).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Where the JSON goes [default: bench/results/deadlines-<date>.json in the repository].
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `resident bench deadlines`.
pub fn deadlines(a: &DeadlinesArgs) -> Result<(), BenchError> {
    let out = crate::paths::output(
        a.out.clone(),
        &format!("bench/results/deadlines-{}.json", today()),
        "--out",
    )?;
    crate::paths::check_parent(&out, "--out")?;
    let options = resident_bench::deadlines::Options {
        calls: a.calls,
        timeout_ms: a.timeout_ms,
        handler_ms: a.handler_ms,
        repeats: a.repeats,
    };
    let doc = resident_bench::deadlines::run(&options, &mut |line| println!("{line}"))?;
    write_json(&out, &doc)?;
    println!("wrote {}", out.display());
    Ok(())
}
