//! `resident demo`: a three-stage sensor pipeline of ring kernels on the runtime's backend.
//!
//! `ingest` validates raw readings and forwards them to `detect` by kernel id; `detect` keeps
//! per-sensor running statistics in its state and forwards anomalies to `alert`; the host
//! receives alerts from `alert`. Ends with each kernel's telemetry and the terminate reports.

use std::time::{Duration, Instant};

use resident::prelude::*;

resident::ring::device_message! {
    /// One raw sensor reading.
    pub struct Reading { pub sensor: u32, pub seq: u32, pub value: f32, pub _pad: u32 }
}

resident::ring::device_message! {
    /// A reading far from its sensor's running mean.
    pub struct Alert { pub sensor: u32, pub seq: u32, pub value: f32, pub zscore: f32 }
}

const SENSORS: usize = 16;

/// Welford running mean/variance per sensor.
#[derive(Clone, Copy, Default)]
struct Stats {
    n: u64,
    mean: f64,
    m2: f64,
}

pub fn run(messages: u32) -> Result<()> {
    run_with(messages, None, true)
}

/// Prints to stdout, or to stderr when stdout is reserved for JSON.
macro_rules! say {
    ($verbose:expr, $($t:tt)*) => {
        if $verbose { println!($($t)*) } else { eprintln!($($t)*) }
    };
}

/// The demo, recorded by `profiler` when given; `verbose = false` prints to stderr.
pub fn run_with(messages: u32, profiler: Option<Profiler>, verbose: bool) -> Result<()> {
    if messages == 0 {
        return Err(Error::InvalidConfig {
            id: "demo".into(),
            reason: "--messages must be at least 1 (nothing to send, nothing to check)".into(),
        });
    }
    let mut builder = Runtime::builder()
        .backend(Backend::Auto)
        .enable_telemetry(true);
    if let Some(p) = profiler {
        builder = builder.profiler(p);
    }
    let rt = builder.build()?;
    say!(
        verbose,
        "== demo: sensor anomaly pipeline, {messages} readings, backend {:?} ==",
        rt.backend()
    );

    let ingest = rt.launch(
        RingKernel::<Reading, Reading>::new("ingest")
            .queue_size(4096)
            .handler(|ctx: &mut Context<()>, r: Reading| {
                if r.value.is_finite() && (r.sensor as usize) < SENSORS {
                    // Block policy of `detect` applies; an error here would mean it stopped.
                    let _ = ctx.send_to("detect", r);
                }
                None
            }),
    )?;
    let detect = rt.launch(
        RingKernel::<Reading, Alert>::new("detect")
            .queue_size(4096)
            .state([Stats::default(); SENSORS])
            .handler(|ctx: &mut Context<[Stats; SENSORS]>, r: Reading| {
                let s = &mut ctx.state_mut()[r.sensor as usize];
                let x = r.value as f64;
                let z = if s.n > 30 {
                    (x - s.mean) / (s.m2 / (s.n - 1) as f64).sqrt().max(1e-9)
                } else {
                    0.0
                };
                s.n += 1;
                let d = x - s.mean;
                s.mean += d / s.n as f64;
                s.m2 += d * (x - s.mean);
                if z.abs() > 4.0 {
                    let _ = ctx.send_to(
                        "alert",
                        Alert {
                            sensor: r.sensor,
                            seq: r.seq,
                            value: r.value,
                            zscore: z as f32,
                        },
                    );
                }
                None
            }),
    )?;
    let alert = rt.launch(
        RingKernel::<Alert, Alert>::new("alert")
            .handler(|_ctx: &mut Context<()>, a: Alert| Some(a)),
    )?;
    alert.activate()?;
    detect.activate()?;
    ingest.activate()?;

    // Deterministic readings: a noisy sine per sensor with a spike every 997 readings.
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let start = Instant::now();
    let mut batch = Vec::with_capacity(256);
    let mut spikes = 0;
    for seq in 0..messages {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let noise = (rng % 1000) as f32 / 1000.0 - 0.5;
        let sensor = seq % SENSORS as u32;
        let spike = seq > 1000 && seq % 997 == 0;
        spikes += spike as u32;
        let value = (seq as f32 / 500.0).sin() + noise + if spike { 25.0 } else { 0.0 };
        batch.push(Reading {
            sensor,
            seq,
            value,
            _pad: 0,
        });
        if batch.len() == batch.capacity() {
            send_all(&ingest, &batch)?;
            batch.clear();
        }
    }
    send_all(&ingest, &batch)?;
    ingest.drain(Duration::from_secs(30))?;
    detect.drain(Duration::from_secs(30))?;
    alert.drain(Duration::from_secs(30))?;
    let elapsed = start.elapsed();
    let mut alerts = Vec::new();
    while let Some(a) = alert.try_receive()? {
        alerts.push(a);
    }
    say!(verbose,
        "processed {messages} readings through 3 kernels in {:.1} ms ({:.2} M readings/s end to end)",
        elapsed.as_secs_f64() * 1e3,
        messages as f64 / elapsed.as_secs_f64() / 1e6
    );
    say!(
        verbose,
        "alerts: {} (injected spikes: {spikes})",
        alerts.len()
    );
    for a in alerts.iter().take(3) {
        say!(
            verbose,
            "  sensor {:2} seq {:6} value {:7.2} z {:6.1}",
            a.sensor,
            a.seq,
            a.value,
            a.zscore
        );
    }
    say!(
        verbose,
        "\n{:<8} {:>9} {:>10} {:>8} {:>6} {:>12} {:>10} {:>10} {:>10}",
        "kernel",
        "received",
        "processed",
        "dropped",
        "queue",
        "msgs/s",
        "p50",
        "p99",
        "max"
    );
    for t in rt.telemetry().kernels {
        // No response recorded is no measurement: print "-", not "0 ns".
        let lat = |ns: u64| match t.latency.count {
            0 => "-".to_string(),
            _ => fmt_ns(ns),
        };
        say!(
            verbose,
            "{:<8} {:>9} {:>10} {:>8} {:>6} {:>12.0} {:>10} {:>10} {:>10}",
            t.kernel_id,
            t.messages_received,
            t.messages_processed,
            t.messages_dropped,
            t.queue_depth,
            t.throughput,
            lat(t.latency.p50_ns),
            lat(t.latency.p99_ns),
            lat(t.latency.max_ns)
        );
    }
    say!(
        verbose,
        "(latency is send -> response; \"-\": the kernel answers nothing, its outputs go on to the next kernel)"
    );
    let report = |r: TerminateReport<Reading, Reading>| {
        say!(
            verbose,
            "terminate {}: processed {}, undelivered {}, unreceived {}",
            r.kernel_id,
            r.processed,
            r.undelivered.len(),
            r.unreceived.len()
        );
    };
    report(ingest.terminate()?);
    let d = detect.terminate()?;
    say!(
        verbose,
        "terminate {}: processed {}, undelivered {}, unreceived {}",
        d.kernel_id,
        d.processed,
        d.undelivered.len(),
        d.unreceived.len()
    );
    let a = alert.terminate()?;
    say!(
        verbose,
        "terminate {}: processed {}, undelivered {}, unreceived {}",
        a.kernel_id,
        a.processed,
        a.undelivered.len(),
        a.unreceived.len()
    );
    if alerts.len() < spikes as usize {
        eprintln!("warning: fewer alerts than injected spikes");
    }
    Ok(())
}

/// Sends every reading, resending what a full queue left over.
fn send_all(k: &KernelHandle<Reading, Reading>, mut msgs: &[Reading]) -> Result<()> {
    while !msgs.is_empty() {
        let n = k.send_batch(msgs)?;
        msgs = &msgs[n..];
    }
    Ok(())
}

pub fn fmt_ns(ns: u64) -> String {
    if ns < 10_000 {
        format!("{ns} ns")
    } else if ns < 10_000_000 {
        format!("{:.1} us", ns as f64 / 1e3)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}
