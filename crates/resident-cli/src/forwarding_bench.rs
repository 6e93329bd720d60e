//! `resident bench forwarding`: the pipeline workload (normalizer -> scorer, `forward_to`)
//! with its forwarding on the device against the same kernels relayed through the host
//! (`RingKernel::forward_via_host`), alternated in one run on each backend asked for.
//!
//! Each run sends `--messages` readings through the two kernels and receives every scored
//! reading (checked against the sequential reference, in order); messages per second is
//! messages / wall time of the run. On wgpu "device" links the two WGSL kernels (one
//! submission per batch holds both dispatches, the normalizer's outputs are not read back);
//! backends without a device link (cpu) forward through the host both ways, so their ratio
//! measures noise. Results go to JSON with the command, the machine and its load.

use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value};

use resident_workloads::pipeline::{self, Forwarding};

use crate::bench::{machine, BenchError};
use crate::workloads::BackendChoice;

/// Options of `bench forwarding`.
#[derive(Args, Debug)]
pub struct Options {
    /// Backends to measure (those not present are listed in the JSON with the reason).
    #[arg(long = "backend", value_enum, value_delimiter = ',', default_values_t = vec![BackendChoice::Wgpu])]
    pub backends: Vec<BackendChoice>,
    /// Readings per run.
    #[arg(long, default_value_t = 200_000)]
    pub messages: usize,
    /// Runs per variant (device and host alternate).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Where the JSON goes [default: bench/results/forwarding-<backends>-<date>.json in the
    /// repository].
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The command that reproduces this run, from the repository (the binary's own path left out).
fn command() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let release = if cfg!(debug_assertions) {
        ""
    } else {
        "--release "
    };
    format!("cargo run {release}-p resident-cli -- {}", args.join(" "))
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Median, min and max of `v` (not empty).
fn spread(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    json!({"median": median, "min": v[0], "max": v[n - 1], "all": v})
}

/// The readings: a deterministic mix of in-range, out-of-range and NaN values.
fn values(n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| match i % 97 {
            0 => f64::NAN,
            1 => -5.0,
            2 => 250.0,
            k => (k as f64 * 1.37 + (i / 97) as f64 * 0.11) % 100.0,
        })
        .collect()
}

/// One run of the pipeline; messages per second and how many went on the device.
fn once(
    rt: &resident::prelude::Runtime,
    vals: &[f64],
    forwarding: Forwarding,
    prec: resident_workloads::Precision,
) -> Result<(f64, u64), BenchError> {
    let r = pipeline::run_with(rt, vals, forwarding, |_| {})?;
    pipeline::check_with(&r.scored, vals, prec)?;
    Ok((
        vals.len() as f64 / r.elapsed.as_secs_f64(),
        r.forwarded_on_device,
    ))
}

/// Runs the benchmark and writes its JSON.
pub fn run(o: &Options) -> Result<(), BenchError> {
    let date = resident::cuda::bench::utc_date(std::time::SystemTime::now());
    let names: Vec<String> = o
        .backends
        .iter()
        .map(|b| format!("{b:?}").to_lowercase())
        .collect();
    let out = crate::paths::output(
        o.out.clone(),
        &format!("bench/results/forwarding-{}-{date}.json", names.join("-")),
        "--out",
    )?;
    crate::paths::check_parent(&out, "--out")?;
    let load_before = load();
    let vals = values(o.messages.max(1));
    let mut backends = Vec::new();
    let mut absent = Vec::new();
    for (&b, name) in o.backends.iter().zip(&names) {
        let (rt, d) = match b.open() {
            Ok(x) => x,
            Err(e) => {
                println!("{name}: SKIP: {e}");
                absent.push(json!({"backend": name, "reason": e.to_string()}));
                continue;
            }
        };
        let prec = resident_workloads::Precision::of(d.kind());
        // Warm-up (pipeline compilation, first allocations), not measured.
        once(&rt, &vals[..vals.len().min(20_000)], Forwarding::Default, prec)?;
        once(&rt, &vals[..vals.len().min(20_000)], Forwarding::ViaHost, prec)?;
        let (mut device, mut host, mut on_device) = (Vec::new(), Vec::new(), Vec::new());
        let mut loads = Vec::new();
        for round in 0..o.repeats.max(1) {
            // Alternate which goes first, so a drift in the machine's load hits both.
            let order = if round % 2 == 0 {
                [Forwarding::Default, Forwarding::ViaHost]
            } else {
                [Forwarding::ViaHost, Forwarding::Default]
            };
            for f in order {
                let (mps, fwd) = once(&rt, &vals, f, prec)?;
                match f {
                    Forwarding::Default => {
                        device.push(mps);
                        on_device.push(fwd);
                    }
                    Forwarding::ViaHost => {
                        if fwd != 0 {
                            return Err(format!(
                                "{name}: the host-relayed run counted {fwd} messages forwarded on the device"
                            )
                            .into());
                        }
                        host.push(mps);
                    }
                }
                println!(
                    "{name} round {round}: {:>6} {mps:>12.0} messages/s{}",
                    if f == Forwarding::Default {
                        "device"
                    } else {
                        "host"
                    },
                    if f == Forwarding::Default {
                        format!(" ({fwd} forwarded on the device)")
                    } else {
                        String::new()
                    }
                );
            }
            loads.push(load());
        }
        let ratios: Vec<f64> = device.iter().zip(&host).map(|(d, h)| d / h).collect();
        let (sd, sh) = (spread(device.clone()), spread(host.clone()));
        let ratio = sd["median"].as_f64().unwrap_or(0.0) / sh["median"].as_f64().unwrap_or(f64::NAN);
        println!(
            "{name}: device {:.0} messages/s, host {:.0} messages/s (medians): x{ratio:.2}",
            sd["median"].as_f64().unwrap_or(0.0),
            sh["median"].as_f64().unwrap_or(0.0)
        );
        backends.push(json!({
            "backend": name,
            "device": d.info().name,
            "device_link": on_device.iter().all(|&n| n > 0),
            "forwarded_on_device_per_run": on_device,
            "messages_per_s": {"device_forwarded": sd, "host_relayed": sh},
            "ratio_device_over_host_median": ratio,
            "ratio_per_round": spread(ratios),
            "load_after_each_round": loads,
        }));
    }
    let doc = json!({
        "what": "the pipeline workload (normalizer -> scorer, RingKernel::forward_to) on each backend: 'device_forwarded' = forward_to as is (on wgpu the two WGSL kernels are linked: one submission per batch holds the normalizer's and the scorer's dispatches, the normalizer's outputs are never read back), 'host_relayed' = the same kernels with forward_via_host (outputs read back, relayed through the host into the scorer's queue). Messages/s = messages / wall time of one run (send, forward, receive every scored reading, checked against the reference in order). Alternated in one run after one warm-up of each",
        "command": command(),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "date": date,
        "machine": "shared 2-vCPU VM, no GPU, Mesa lavapipe",
        "machine_detail": machine(),
        "load_before": load_before,
        "load_after": load(),
        "params": {"messages": o.messages, "repeats": o.repeats, "batch": 256, "queue": 4096},
        "backends": backends,
        "absent_backends": absent,
    });
    std::fs::write(&out, serde_json::to_string_pretty(&doc)? + "\n")
        .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}
