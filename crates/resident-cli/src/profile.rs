//! `resident profile <demo>`: runs a workload under the profiler and prints the report (or its
//! JSON), optionally writing a Chrome/Perfetto trace; `--tune` measures the demo's kernel at
//! several batch and queue sizes instead.
//!
//! The constructed demos are each built to be limited by one thing:
//! * `launch-bound`: a kernel that relaunches sixteen unfused one-shot kernels of 4 elements for
//!   every message (batches of one, tiny work per launch), three callers in closed loops;
//! * `transfer-bound`: every message moves a 16 MiB payload to the device and back, three
//!   callers;
//! * `handler-bound`: a slow handler (about 10 ms of arithmetic per message), three callers;
//! * `queue-bound`: a producer sends as fast as it can to a kernel with a few microseconds of
//!   work per message, so messages wait in a deep queue;
//! * `utilization-bound`: one message every 500 us to a kernel with almost no work;
//! * `pipeline`: the three-kernel sensor demo (`resident demo`).

use std::path::PathBuf;
use std::time::Duration;

use resident::backend::{self, DeviceHandle};
use resident::prelude::*;
use resident::profile::tune::{parse_duration, tune, TuneOptions};
use resident::profile::Report;
use resident::{Kernel, KernelArg, LaunchConfig};

device_message! {
    /// A unit of arithmetic: `iters` dependent multiply-adds starting from `x`.
    pub struct Work { pub x: f32, pub iters: u32 }
}

device_message! {
    /// The result of a `Work`.
    pub struct Done { pub x: f32, pub iters: u32 }
}

/// The same work on every backend: `iters` dependent multiply-adds.
const WORK_CUDA: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    float x = in->x;
    for (unsigned i = 0; i < in->iters; ++i) { x = x * 0.999f + 0.5f; }
    out->x = x; out->iters = in->iters; return true;
}"#;

fn work(w: Work) -> Done {
    let mut x = w.x;
    for _ in 0..w.iters {
        x = std::hint::black_box(x * 0.999 + 0.5);
    }
    Done { x, iters: w.iters }
}

/// Multiply-adds per message of the handler-bound demo (about 10 ms on a 3 GHz core).
const HANDLER_ITERS: u32 = 2_500_000;

/// Demo names.
pub const DEMOS: [&str; 6] = [
    "launch-bound",
    "transfer-bound",
    "handler-bound",
    "queue-bound",
    "utilization-bound",
    "pipeline",
];

/// Options of `resident profile`.
pub struct Options {
    pub demo: String,
    pub trace: Option<PathBuf>,
    pub json: bool,
    pub tune: bool,
    pub p99_target: String,
    pub messages: Option<usize>,
    /// Measure the profiler's own overhead instead (rounds, output file).
    pub overhead: Option<(usize, PathBuf)>,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn kernel_for(demo: &str) -> RingKernel<Work, Done> {
    RingKernel::<Work, Done>::new(demo)
        .backpressure(Backpressure::Block(Duration::from_secs(10)))
        .priority_lanes(1)
        .output_queue_size(1 << 16)
        .handler(|_, w: Work| Some(work(w)))
        .cuda(CudaHandler::new(WORK_CUDA))
}

/// Runs the demo under a fresh profiler and returns its report (and the profiler).
pub fn run_demo(
    demo: &str,
    messages: Option<usize>,
    verbose: bool,
) -> Result<(Report, Profiler), String> {
    let profiler = Profiler::new();
    match demo {
        "launch-bound" => launch_bound(&profiler, messages.unwrap_or(1000))?,
        "transfer-bound" => transfer_bound(&profiler, messages.unwrap_or(60))?,
        "handler-bound" => closed_loop(&profiler, demo, HANDLER_ITERS, messages.unwrap_or(60))?,
        "queue-bound" => queue_bound(&profiler, messages.unwrap_or(60_000))?,
        "utilization-bound" => utilization_bound(&profiler, messages.unwrap_or(300))?,
        "pipeline" => crate::demo::run_with(
            messages.unwrap_or(200_000) as u32,
            Some(profiler.clone()),
            verbose,
        )
        .map_err(err)?,
        other => {
            return Err(format!(
                "unknown demo `{other}`; choose one of: {}",
                DEMOS.join(", ")
            ))
        }
    }
    Ok((profiler.report(), profiler))
}

/// `callers` threads call `k` in closed loops, `messages` calls in all, so the kernel always
/// has the next message while one caller waits for its reply.
fn call_from<In: Message, Out: Message>(
    k: &KernelHandle<In, Out>,
    callers: usize,
    messages: usize,
    make: impl Fn(usize) -> In + Sync,
    check: impl Fn(usize, Out) -> Result<(), String> + Sync,
) -> Result<(), String> {
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..callers)
            .map(|c| {
                let (make, check) = (&make, &check);
                s.spawn(move || {
                    for i in (c..messages).step_by(callers) {
                        let out = k.call(make(i), Duration::from_secs(10)).map_err(err)?;
                        check(i, out)?;
                    }
                    Ok::<(), String>(())
                })
            })
            .collect();
        threads
            .into_iter()
            .try_for_each(|t| t.join().map_err(|_| "caller panicked".to_string())?)
    })
}

fn runtime(p: &Profiler) -> Result<Runtime, String> {
    Runtime::builder()
        .backend(Backend::Cpu)
        .profiler(p.clone())
        .build()
        .map_err(err)
}

fn launch_bound(p: &Profiler, messages: usize) -> Result<(), String> {
    let rt = runtime(p)?;
    let dev: DeviceHandle = backend::open(Backend::Cpu).map_err(err)?;
    let cfg = LaunchConfig::for_elements(4);
    let out = dev.alloc(cfg.index_space() as usize * 4).map_err(err)?;
    let scale = Kernel::new("scale").cpu(|t| {
        let a = t.scalar::<f32>(0)?;
        t.output::<f32>(1)?.set(a * t.index() as f32)
    });
    // Stateless relaunch: every message (a batch of one) launches the one-shot kernel again.
    let k = rt
        .launch(
            RingKernel::<f32, f32>::new("relaunch")
                .batch_size(1)
                .state((dev, out))
                .handler(move |ctx, a: f32| {
                    let (dev, out) = ctx.state_mut();
                    // Sixteen unfused stages, each its own launch over 4 elements.
                    for stage in 0..16 {
                        let args = [
                            KernelArg::scalar(a + stage as f32),
                            KernelArg::buffer_mut(out),
                        ];
                        dev.launch(&scale, cfg, &args, None).ok()?;
                    }
                    Some(a)
                }),
        )
        .map_err(err)?;
    k.activate().map_err(err)?;
    // Warm-up: the first launch starts the rayon pool.
    k.call(0.0, Duration::from_secs(10)).map_err(err)?;
    call_from(&k, 3, messages, |i| i as f32, |_, _| Ok(()))?;
    k.terminate().map_err(err)?;
    Ok(())
}

fn transfer_bound(p: &Profiler, messages: usize) -> Result<(), String> {
    const PAYLOAD: usize = 16 << 20;
    let rt = runtime(p)?;
    let dev: DeviceHandle = backend::open(Backend::Cpu).map_err(err)?;
    let mem = dev.alloc(PAYLOAD).map_err(err)?;
    let host = vec![1u8; PAYLOAD];
    // Each message ships a large payload to the device and its result back: the copies are
    // the work.
    let k = rt
        .launch(
            RingKernel::<u32, u32>::new("copy-per-message")
                .batch_size(1)
                .state((dev, mem, host))
                .handler(|ctx, seq: u32| {
                    let (dev, mem, host) = ctx.state_mut();
                    host[0] = seq as u8;
                    dev.copy_to_device(mem, host).ok()?;
                    dev.copy_to_host(host, mem).ok()?;
                    Some(host[0] as u32 + host[PAYLOAD - 1] as u32)
                }),
        )
        .map_err(err)?;
    k.activate().map_err(err)?;
    call_from(
        &k,
        3,
        messages,
        |i| i as u32,
        |i, r| match r == (i as u8) as u32 + 1 {
            true => Ok(()),
            false => Err(format!("transfer-bound: wrong result {r} for message {i}")),
        },
    )?;
    k.terminate().map_err(err)?;
    Ok(())
}

fn closed_loop(p: &Profiler, demo: &str, iters: u32, messages: usize) -> Result<(), String> {
    let rt = runtime(p)?;
    let k = rt.launch(kernel_for(demo).batch_size(1)).map_err(err)?;
    k.activate().map_err(err)?;
    call_from(
        &k,
        3,
        messages,
        |i| Work { x: i as f32, iters },
        |i, d: Done| match d.x.to_bits() == work(Work { x: i as f32, iters }).x.to_bits() {
            true => Ok(()),
            false => Err(format!("{demo}: wrong reply to message {i}")),
        },
    )?;
    k.terminate().map_err(err)?;
    Ok(())
}

fn queue_bound(p: &Profiler, messages: usize) -> Result<(), String> {
    let rt = runtime(p)?;
    let k = rt
        .launch(kernel_for("queue-bound").queue_size(8192).batch_size(64))
        .map_err(err)?;
    k.activate().map_err(err)?;
    let consumer = {
        let k = k.clone();
        std::thread::spawn(move || {
            let mut got = 0usize;
            let mut buf = Vec::new();
            while got < messages {
                buf.clear();
                match k.receive_batch(&mut buf, 4096) {
                    Ok(0) => std::thread::sleep(Duration::from_micros(100)),
                    Ok(n) => got += n,
                    Err(_) => break,
                }
            }
            got
        })
    };
    let msgs: Vec<Work> = (0..messages)
        .map(|i| Work {
            x: i as f32,
            iters: 2_000,
        })
        .collect();
    let mut sent = 0;
    while sent < msgs.len() {
        sent += k
            .send_batch(&msgs[sent..(sent + 512).min(msgs.len())])
            .map_err(err)?;
    }
    k.drain(Duration::from_secs(60)).map_err(err)?;
    let got = consumer
        .join()
        .map_err(|_| "consumer panicked".to_string())?;
    k.terminate().map_err(err)?;
    if got != messages {
        return Err(format!("queue-bound: received {got} of {messages}"));
    }
    Ok(())
}

fn utilization_bound(p: &Profiler, messages: usize) -> Result<(), String> {
    let rt = runtime(p)?;
    let k = rt
        .launch(RingKernel::<u32, u32>::new("trickle").handler(|_, x: u32| Some(x + 1)))
        .map_err(err)?;
    k.activate().map_err(err)?;
    for i in 0..messages as u32 {
        k.send(i).map_err(err)?;
        std::thread::sleep(Duration::from_micros(500));
        k.receive(Duration::from_secs(10)).map_err(err)?;
    }
    k.terminate().map_err(err)?;
    Ok(())
}

fn tune_demo(o: &Options) -> Result<(), String> {
    let target = parse_duration(&o.p99_target).ok_or_else(|| {
        format!(
            "--p99-target `{}`: expected a duration such as 200us, 1.5ms or 2s",
            o.p99_target
        )
    })?;
    let iters = match o.demo.as_str() {
        "handler-bound" => HANDLER_ITERS,
        "queue-bound" => 2_000,
        "utilization-bound" | "pipeline" | "launch-bound" | "transfer-bound" => 20,
        other => {
            return Err(format!(
                "unknown demo `{other}`; choose one of: {}",
                DEMOS.join(", ")
            ))
        }
    };
    let messages = o
        .messages
        .unwrap_or(if iters > 100_000 { 100 } else { 20_000 });
    let opts = TuneOptions {
        batch_sizes: vec![1, 16, 128, 1024],
        queue_sizes: vec![16, 128, 1024, 8192],
        messages,
        p99_target: target,
        timeout: Duration::from_secs(120),
    };
    let demo = o.demo.clone();
    let r = tune(
        &opts,
        |_b, _q| kernel_for(&demo),
        |i| Work { x: i as f32, iters },
    )
    .map_err(err)?;
    if o.json {
        let mut v = serde_json::to_value(&r).map_err(err)?;
        v["demo"] = serde_json::json!(o.demo);
        v["handler_iterations"] = serde_json::json!(iters);
        println!("{}", serde_json::to_string_pretty(&v).map_err(err)?);
        return Ok(());
    }
    println!(
        "== tune {}: {} messages per setting, {} multiply-adds each, p99 target {} ==",
        o.demo, messages, iters, o.p99_target
    );
    println!(
        "{:<8} {:>6} {:>6} {:>14} {:>12} {:>12}  meets",
        "backend", "batch", "queue", "messages/s", "p50", "p99"
    );
    for p in &r.points {
        println!(
            "{:<8} {:>6} {:>6} {:>14.0} {:>12} {:>12}  {}",
            p.backend,
            p.batch_size,
            p.queue_size,
            p.throughput_per_s,
            crate::demo::fmt_ns(p.p50_ns),
            crate::demo::fmt_ns(p.p99_ns),
            if p.meets_target { "yes" } else { "no" }
        );
    }
    println!("{}", r.verdict);
    Ok(())
}

/// `resident profile`.
pub fn run(o: &Options) -> Result<(), String> {
    if let Some((rounds, out)) = &o.overhead {
        return overhead((*rounds).max(1), out);
    }
    if o.tune {
        return tune_demo(o);
    }
    let (report, profiler) = run_demo(&o.demo, o.messages, !o.json)?;
    if let Some(path) = &o.trace {
        profiler.write_chrome_trace(path).map_err(err)?;
        if !o.json {
            println!(
                "trace: {} ({} spans)",
                path.display(),
                profiler.spans().len()
            );
        }
    }
    if o.json {
        let mut v = serde_json::to_value(&report).map_err(err)?;
        v["demo"] = serde_json::json!(o.demo);
        v["backend"] = serde_json::json!("cpu");
        println!("{}", serde_json::to_string_pretty(&v).map_err(err)?);
    } else {
        println!("== profile {} (CPU backend) ==", o.demo);
        print!("{}", report.to_text());
    }
    Ok(())
}

/// `resident profile --overhead`: the profiler's cost, off vs paused vs on, interleaved in one
/// run (measured by `resident_bench::profile_overhead`), written as JSON and printed.
pub fn overhead(rounds: usize, out: &std::path::Path) -> Result<(), String> {
    let command = format!(
        "./target/release/resident profile queue-bound --overhead --rounds {rounds} --out {}",
        out.display()
    );
    let doc = resident_bench::profile_overhead::run(rounds, &command).map_err(err)?;
    let text = serde_json::to_string_pretty(&doc).map_err(err)?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    std::fs::write(out, &text).map_err(|e| format!("writing {}: {e}", out.display()))?;
    println!("{text}");
    Ok(())
}
