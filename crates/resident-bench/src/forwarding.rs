//! `resident bench forwarding`: the pipeline workload (normalizer -> scorer,
//! `RingKernel::forward_to`) with the normalizer's outputs forwarded on the device against the
//! same run relayed by the host (`ForwardPath::HostRelay`), alternating in one run, on one
//! backend (on CudaSim the device link is the scorer's persistent kernel consuming the
//! normalizer's output ring). Every run's results are checked against the reference. Results
//! go to JSON with the command, the machine and its load.

use resident::backend::BackendKind;
use resident::prelude::*;
use resident_workloads::{pipeline, Precision};
use serde_json::{json, Value};

use crate::provenance::{cargo_command, load, machine, today};
use crate::stats::{quantile, sorted};
use crate::BenchError;

/// Options of a run.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Readings through the pipeline per run (at least 1).
    pub messages: usize,
    /// Runs per variant (host relay and device alternate; at least 1).
    pub repeats: usize,
}

fn one(
    rt: &Runtime,
    kind: BackendKind,
    values: &[f64],
    path: ForwardPath,
    round: usize,
    say: &mut dyn FnMut(String),
) -> Result<Value, BenchError> {
    let r = pipeline::run_with(rt, values, path, |_| {})?;
    pipeline::check_with(&r.scored, values, Precision::of(kind))?;
    let s = r.elapsed.as_secs_f64();
    let rate = values.len() as f64 / s;
    say(format!(
        "{:>10} round {round}: {:>10.0} readings/s ({:.3} s); forwarded on the device {}, by the host {}",
        match path {
            ForwardPath::Device => "device",
            ForwardPath::HostRelay => "host relay",
        },
        rate,
        s,
        r.forwarding.on_device,
        r.forwarding.via_host
    ));
    Ok(json!({
        "seconds": s,
        "readings_per_s": rate,
        "forwarded_on_device": r.forwarding.on_device,
        "forwarded_via_host": r.forwarding.via_host,
    }))
}

fn summary(runs: &[Value]) -> Value {
    let v: Vec<f64> = runs
        .iter()
        .filter_map(|r| r["readings_per_s"].as_f64())
        .collect();
    let v = sorted(&v);
    let (min, max) = (v.first().copied(), v.last().copied());
    json!({
        "readings_per_s_median": quantile(&v, 0.5),
        "readings_per_s_min": min,
        "readings_per_s_max": max,
        "spread_max_over_min": max.zip(min).map(|(hi, lo)| hi / lo),
    })
}

/// Runs the benchmark on `rt`, whose engine is `kind`, and returns its report (`what`,
/// `command`, `build`, `backend`, `date`, `machine`, `load_before`, `load_after`, `params`,
/// `runs: {host_relay, device}`, `summary: {host_relay, device,
/// device_over_host_relay_median}`). `say` gets one line per run.
pub fn run(
    rt: &Runtime,
    kind: BackendKind,
    o: &Options,
    say: &mut dyn FnMut(String),
) -> Result<Value, BenchError> {
    let date = today();
    let mut rng = resident_workloads::rng::SplitMix64::new(5);
    let values: Vec<f64> = (0..o.messages.max(1))
        .map(|_| rng.unit() * 140.0 - 20.0)
        .collect();
    let load_before = load();
    // One untimed warm-up run (compiles or loads the kernels' sources once).
    one(
        rt,
        kind,
        &values[..values.len().min(2000)],
        ForwardPath::Device,
        0,
        say,
    )?;
    let (mut host, mut device) = (Vec::new(), Vec::new());
    for round in 0..o.repeats.max(1) {
        host.push(one(rt, kind, &values, ForwardPath::HostRelay, round, say)?);
        device.push(one(rt, kind, &values, ForwardPath::Device, round, say)?);
    }
    let (h, dv) = (summary(&host), summary(&device));
    let ratio = dv["readings_per_s_median"].as_f64().unwrap_or(0.0)
        / h["readings_per_s_median"].as_f64().unwrap_or(f64::NAN);
    Ok(json!({
        "what": "the pipeline workload (normalizer -> scorer by RingKernel::forward_to), readings through both kernels per second: device = ForwardPath::Device (on CudaSim the scorer's persistent kernel takes the normalizer's output ring, no host hop), host_relay = ForwardPath::HostRelay (the normalizer's host pump relays every output into the scorer's input queue); alternated in one run, each run checked against the reference",
        "command": cargo_command("resident-cli"),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "backend": format!("{kind:?}"),
        "date": date,
        "machine": machine(),
        "load_before": load_before,
        "load_after": load(),
        "params": {"messages": values.len(), "repeats": o.repeats},
        "runs": {"host_relay": host, "device": device},
        "summary": {"host_relay": h, "device": dv, "device_over_host_relay_median": ratio},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_takes_median_and_spread_of_the_runs() {
        let runs: Vec<Value> = [3.0, 1.0, 2.0]
            .iter()
            .map(|r| json!({"readings_per_s": r}))
            .collect();
        let s = summary(&runs);
        assert_eq!(s["readings_per_s_median"], 2.0);
        assert_eq!(s["readings_per_s_min"], 1.0);
        assert_eq!(s["readings_per_s_max"], 3.0);
        assert_eq!(s["spread_max_over_min"], 3.0);
        assert!(summary(&[])["readings_per_s_median"].is_null());
    }
}
