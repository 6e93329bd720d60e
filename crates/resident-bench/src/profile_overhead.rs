//! The profiler's own cost (`resident profile --overhead`): a kernel with no profiler, with a
//! paused one and with a recording one, interleaved in one run; throughput, call round trip,
//! and the per-batch hooks alone.

use std::time::{Duration, Instant};

use resident::prelude::*;
use serde_json::{json, Value};

use crate::provenance::{machine, today};
use crate::stats::{median_or_nan, spread};
use crate::BenchError;

/// How a measured run profiles.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// No profiler attached (the default): one `None` check per batch.
    Off,
    /// A profiler attached but paused: one relaxed load per batch.
    Paused,
    /// Recording.
    On,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Paused => "paused",
            Mode::On => "on",
        }
    }
}

fn mode_runtime(mode: Mode) -> Result<Runtime, BenchError> {
    let b = Runtime::builder().backend(Backend::Cpu);
    let b = match mode {
        Mode::Off => b,
        Mode::Paused => {
            let p = Profiler::new();
            p.set_enabled(false);
            b.profiler(p)
        }
        Mode::On => b.profiler(Profiler::new()),
    };
    Ok(b.build()?)
}

/// Messages per second through a kernel with a trivial handler, sent as fast as it takes them.
fn throughput(mode: Mode, messages: usize) -> Result<f64, BenchError> {
    let rt = mode_runtime(mode)?;
    let k = rt.launch(
        RingKernel::<u64, u64>::new("overhead")
            .queue_size(4096)
            .priority_lanes(1)
            .batch_size(64)
            .handler(|_, x: u64| {
                std::hint::black_box(x);
                None
            }),
    )?;
    k.activate()?;
    let msgs: Vec<u64> = (0..messages as u64).collect();
    let t = Instant::now();
    let mut sent = 0;
    while sent < msgs.len() {
        sent += k.send_batch(&msgs[sent..(sent + 256).min(msgs.len())])?;
    }
    k.drain(Duration::from_secs(60))?;
    let rate = messages as f64 / t.elapsed().as_secs_f64();
    k.terminate()?;
    Ok(rate)
}

/// Mean round trip of `call` (a batch per message: the per-batch cost at its largest share).
fn round_trip(mode: Mode, calls: usize) -> Result<f64, BenchError> {
    let rt = mode_runtime(mode)?;
    let k = rt.launch(RingKernel::<u64, u64>::new("overhead-rt").handler(|_, x: u64| Some(x)))?;
    k.activate()?;
    let t = Instant::now();
    for i in 0..calls as u64 {
        k.call(i, Duration::from_secs(10))?;
    }
    let ns = t.elapsed().as_nanos() as f64 / calls as f64;
    k.terminate()?;
    Ok(ns)
}

/// Measures the profiler's cost, off vs paused vs on, interleaved in one run of `rounds`
/// rounds (at least 1), and returns the report (`benchmark`, `command`, `date`, `machine`,
/// `note`, `throughput`, `round_trip`, `hook_ns_per_batch`, each mode with its spread and the
/// ratios to `off`). `command` is what reproduces the run.
pub fn run(rounds: usize, command: &str) -> Result<Value, BenchError> {
    let rounds = rounds.max(1);
    let modes = [Mode::Off, Mode::Paused, Mode::On];
    let (messages, calls) = (100_000, 5_000);
    // The hooks alone, per batch of 64 and of 1: best of the rounds (least disturbed).
    let mut hook: Vec<[f64; 3]> = Vec::new();
    let mut hook1: Vec<[f64; 3]> = Vec::new();
    for _ in 0..rounds {
        hook.push(resident::profile::hook_cost_per_batch(20_000, 64));
        hook1.push(resident::profile::hook_cost_per_batch(200_000, 1));
    }
    let mut thr: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut rtt: Vec<Vec<f64>> = vec![Vec::new(); 3];
    throughput(Mode::Off, messages / 4)?; // warm-up
    for r in 0..rounds {
        // Rotate the order each round so drift on the shared machine hits every mode alike.
        for j in 0..3 {
            let i = (j + r) % 3;
            thr[i].push(throughput(modes[i], messages)?);
            rtt[i].push(round_trip(modes[i], calls)?);
        }
    }
    let ratio = |v: &Vec<Vec<f64>>, i: usize| median_or_nan(&v[i]) / median_or_nan(&v[0]);
    let mut doc = json!({
        "benchmark": "profiler-overhead",
        "command": command,
        "date": today(),
        "machine": machine(),
        "note": "shared, noisy 2-vCPU x86_64 VM (other builds running), no GPU; modes interleaved in one run",
        "throughput": {
            "what": "messages/s through a kernel with a trivial handler, 100000 messages sent with send_batch, batch_size 64",
        },
        "round_trip": {
            "what": "mean ns per call() (one message per batch, so per-batch profiler cost at its largest share), 5000 calls",
        },
    });
    doc["hook_ns_per_batch"] = json!({
        "what": "ns per batch spent in the profiler's batch hooks (plus the tracing batch span, no subscriber), measured alone on one thread",
    });
    for (i, m) in modes.iter().enumerate() {
        let h64: Vec<f64> = hook.iter().map(|h| h[i]).collect();
        let h1: Vec<f64> = hook1.iter().map(|h| h[i]).collect();
        doc["hook_ns_per_batch"]["batch_64"][m.name()] = spread(&h64);
        doc["hook_ns_per_batch"]["batch_1"][m.name()] = spread(&h1);
        doc["throughput"][m.name()] = spread(&thr[i]);
        doc["round_trip"][m.name()] = spread(&rtt[i]);
    }
    doc["throughput"]["ratio_on_vs_off"] = json!(ratio(&thr, 2));
    doc["throughput"]["ratio_paused_vs_off"] = json!(ratio(&thr, 1));
    doc["round_trip"]["ratio_on_vs_off"] = json!(ratio(&rtt, 2));
    doc["round_trip"]["ratio_paused_vs_off"] = json!(ratio(&rtt, 1));
    Ok(doc)
}
