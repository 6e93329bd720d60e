//! `resident bench forwarding`: the pipeline workload (normalizer -> scorer,
//! `RingKernel::forward_to`) with the normalizer's outputs forwarded on the device against the
//! same run relayed by the host (`ForwardPath::HostRelay`), alternating in one run, on one
//! backend (CudaSim by default: the device link is the scorer's persistent kernel consuming
//! the normalizer's output ring). The measuring is `resident_bench::forwarding`; here are the
//! arguments, the output path, the file and the printing.

use std::path::PathBuf;

use clap::Args;
use resident_bench::provenance::{today, write_json};

use crate::bench::BenchError;
use crate::workloads::BackendChoice;

/// Options of `bench forwarding`.
#[derive(Args, Debug)]
pub struct Options {
    /// Readings through the pipeline per run.
    #[arg(long, default_value_t = 100_000)]
    pub messages: usize,
    /// Runs per variant (host relay and device alternate).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// The backend.
    #[arg(long, value_enum, default_value_t = BackendChoice::CudaSim)]
    pub backend: BackendChoice,
    /// Where the JSON goes [default: bench/results/forwarding-<backend>-<date>.json].
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs the benchmark and writes its JSON.
pub fn run(o: &Options) -> Result<(), BenchError> {
    let (rt, d) = o.backend.open().map_err(|e| e.to_string())?;
    let kind = d.kind();
    let date = today();
    let name = format!("{kind:?}").to_lowercase();
    let out = crate::paths::output(
        o.out.clone(),
        &format!("bench/results/forwarding-{name}-{date}.json"),
        "--out",
    )?;
    crate::paths::check_parent(&out, "--out")?;
    let doc = resident_bench::forwarding::run(
        &rt,
        kind,
        &resident_bench::forwarding::Options {
            messages: o.messages,
            repeats: o.repeats,
        },
        &mut |line| println!("{line}"),
    )?;
    let (h, dv) = (&doc["summary"]["host_relay"], &doc["summary"]["device"]);
    let ratio = doc["summary"]["device_over_host_relay_median"]
        .as_f64()
        .unwrap_or(f64::NAN);
    write_json(&out, &doc)?;
    println!(
        "pipeline on {kind:?}: device {:.0}/s, host relay {:.0}/s (medians, device/host x{ratio:.2}); wrote {}",
        dv["readings_per_s_median"].as_f64().unwrap_or(0.0),
        h["readings_per_s_median"].as_f64().unwrap_or(0.0),
        out.display()
    );
    Ok(())
}
