//! NATS serving benchmark (starts its own `nats-server -js` on a loopback port):
//! * request/reply latency, one request at a time: a plain NATS echo responder (no kernel) vs
//!   the anomaly kernel (one `call`) vs the two-kernel pipeline, all JSON, same run;
//! * JetStream throughput of the pipeline with 1 and 2 workers (inputs stored first, time until
//!   every output is stored).
//!
//! Each measurement is repeated; the JSON has every repeat and the spread.
//!
//! cargo run --release -p resident-nats --example bench_nats -- [--out FILE] [--repeats 3]
//!     [--requests 2000] [--inputs 4000]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures_util::StreamExt;
use resident::prelude::*;
use resident_nats::demo::{
    self, AnomalyReply, AnomalyRequest, DemoOptions, Pipeline, PipelineReply, PipelineRequest,
};
use resident_nats::testing::{connect_options, nats_server_binary, NatsServer};
use resident_nats::{
    serve_jetstream, serve_requests, JetStreamOptions, JetStreamStats, JsonCodec, RequestOptions,
    RequestStats,
};
use serde_json::{json, Value};
use tokio::sync::watch;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn spread(xs: &[f64]) -> Value {
    let mut s = xs.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    json!({"median": percentile(&s, 0.5), "min": s[0], "max": s[s.len() - 1]})
}

async fn latency(
    client: &async_nats::Client,
    subject: &str,
    body: &[u8],
    n: usize,
) -> Result<(f64, f64), BoxError> {
    for _ in 0..200 {
        client
            .request(subject.to_string(), body.to_vec().into())
            .await?;
    }
    let mut us = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let m = tokio::time::timeout(
            Duration::from_secs(5),
            client.request(subject.to_string(), body.to_vec().into()),
        )
        .await??;
        us.push(t.elapsed().as_secs_f64() * 1e6);
        if m.headers.is_some() {
            return Err(format!("error reply on {subject}: {:?}", m.payload).into());
        }
    }
    us.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok((percentile(&us, 0.5), percentile(&us, 0.99)))
}

async fn jetstream_run(
    url: &str,
    kernels: &Runtime,
    run: usize,
    workers: usize,
    inputs: usize,
) -> Result<f64, BoxError> {
    let client = connect_options().connect(url).await?;
    let js = jetstream::new(client.clone());
    let stream = format!("B{run}W{workers}");
    let subject = format!("bench.js.{run}.{workers}");
    let mut opts = JetStreamOptions::new(stream.clone(), subject.clone(), "bench");
    opts.max_in_flight = 256;
    opts.ordered = false;
    resident_nats::ensure_streams(&js, &opts).await?;
    let mut acks = Vec::with_capacity(inputs);
    for i in 0..inputs {
        let body = serde_json::to_vec(&PipelineRequest {
            value: (i % 101) as f64,
        })?;
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("in-{i}").as_str());
        acks.push(
            js.publish_with_headers(subject.clone(), h, body.into())
                .await?,
        );
    }
    for a in acks {
        a.await?;
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let t0 = Instant::now();
    for w in 0..workers {
        let p = Arc::new(Pipeline::launch(
            kernels,
            &format!("js{run}-{workers}-{w}"),
            DemoOptions::default(),
        )?);
        let c = connect_options().connect(url).await?;
        let mut rx = stop_rx.clone();
        tasks.push(tokio::spawn(serve_jetstream(
            c,
            p,
            Arc::new(JsonCodec::<PipelineRequest, PipelineReply>::new()),
            opts.clone(),
            Arc::new(JetStreamStats::default()),
            async move {
                let _ = rx.wait_for(|s| *s).await;
            },
        )));
    }
    let out = format!("{stream}_OUT");
    let deadline = Instant::now() + Duration::from_secs(120);
    let elapsed = loop {
        let n = js.get_stream(&out).await?.get_info().await?.state.messages;
        if n >= inputs as u64 {
            break t0.elapsed();
        }
        if Instant::now() > deadline {
            return Err(format!("only {n} of {inputs} outputs in 120 s").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    stop_tx.send(true)?;
    for t in tasks {
        t.await??;
    }
    js.delete_stream(&stream).await?;
    js.delete_stream(&out).await?;
    Ok(inputs as f64 / elapsed.as_secs_f64())
}

fn main() -> Result<(), BoxError> {
    let repeats: usize = arg("--repeats", "3").parse()?;
    let requests: usize = arg("--requests", "2000").parse()?;
    let inputs: usize = arg("--inputs", "4000").parse()?;
    let out = arg("--out", "bench/results/nats-latest.json");
    let bin = nats_server_binary().ok_or("nats-server is not installed")?;
    let server = NatsServer::start(bin.clone())?;
    let version = std::process::Command::new(&bin).arg("--version").output()?;
    let kernels = Runtime::builder().backend(Backend::Cpu).build()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let url = server.url();
    let result: Result<Value, BoxError> = rt.block_on(async {
        // Responders, each on its own connection.
        let echo = connect_options().connect(url.as_str()).await?;
        let mut sub = echo.subscribe("bench.echo").await?;
        let echo2 = echo.clone();
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                if let Some(r) = m.reply {
                    let _ = echo2.publish(r, m.payload).await;
                }
            }
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let anomaly = Arc::new(demo::launch_anomaly(&kernels, "bench-anomaly", DemoOptions::default())?);
        let direct = (*anomaly).clone();
        let pipeline = Arc::new(Pipeline::launch(&kernels, "bench-pipeline", DemoOptions::default())?);
        let mut rx1 = stop_rx.clone();
        let t1 = tokio::spawn(serve_requests(
            connect_options().connect(url.as_str()).await?,
            anomaly,
            Arc::new(JsonCodec::<AnomalyRequest, AnomalyReply>::new()),
            RequestOptions::new("bench.anomaly"),
            Arc::new(RequestStats::default()),
            async move {
                let _ = rx1.wait_for(|s| *s).await;
            },
        ));
        let mut rx2 = stop_rx.clone();
        let t2 = tokio::spawn(serve_requests(
            connect_options().connect(url.as_str()).await?,
            pipeline,
            Arc::new(JsonCodec::<PipelineRequest, PipelineReply>::new()),
            RequestOptions::new("bench.pipeline"),
            Arc::new(RequestStats::default()),
            async move {
                let _ = rx2.wait_for(|s| *s).await;
            },
        ));
        let client = connect_options().connect(url.as_str()).await?;
        client.flush().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let reading = br#"{"sensor": 3, "value": 20.5}"#;
        let value = br#"{"value": 42.0}"#;
        let mut rows = Vec::new();
        let mut c50 = vec![];
        let (mut e50, mut a50, mut p50, mut a_ratio, mut p_ratio) =
            (vec![], vec![], vec![], vec![], vec![]);
        let (mut e99, mut a99, mut p99) = (vec![], vec![], vec![]);
        for r in 0..repeats {
            // The kernel alone: `call` from a plain thread, one at a time, no NATS.
            let k = direct.clone();
            let call = tokio::task::spawn_blocking(move || -> resident::Result<f64> {
                let r = demo::Reading { value: 20.5, sensor: 3, _pad: 0 };
                for _ in 0..200 {
                    k.call(r, Duration::from_secs(5))?;
                }
                let mut us = Vec::with_capacity(requests);
                for _ in 0..requests {
                    let t = Instant::now();
                    k.call(r, Duration::from_secs(5))?;
                    us.push(t.elapsed().as_secs_f64() * 1e6);
                }
                us.sort_by(|a, b| a.partial_cmp(b).unwrap());
                Ok(percentile(&us, 0.5))
            })
            .await??;
            c50.push(call);
            let echo = latency(&client, "bench.echo", reading, requests).await?;
            let an = latency(&client, "bench.anomaly", reading, requests).await?;
            let pi = latency(&client, "bench.pipeline", value, requests).await?;
            println!(
                "repeat {r}: p50/p99 us  echo {:.1}/{:.1}  anomaly kernel {:.1}/{:.1}  pipeline {:.1}/{:.1}  (call alone p50 {call:.1})",
                echo.0, echo.1, an.0, an.1, pi.0, pi.1
            );
            rows.push(json!({"repeat": r, "call_alone_p50_us": call,
                "echo_us": {"p50": echo.0, "p99": echo.1},
                "anomaly_kernel_us": {"p50": an.0, "p99": an.1},
                "pipeline_kernels_us": {"p50": pi.0, "p99": pi.1}}));
            e50.push(echo.0);
            e99.push(echo.1);
            a50.push(an.0);
            a99.push(an.1);
            p50.push(pi.0);
            p99.push(pi.1);
            a_ratio.push(an.0 / echo.0);
            p_ratio.push(pi.0 / echo.0);
        }
        stop_tx.send(true)?;
        t1.await??;
        t2.await??;
        let mut js_rows = Vec::new();
        let (mut one, mut two, mut scale) = (vec![], vec![], vec![]);
        for r in 0..repeats {
            let w1 = jetstream_run(&url, &kernels, r, 1, inputs).await?;
            let w2 = jetstream_run(&url, &kernels, r, 2, inputs).await?;
            println!("repeat {r}: JetStream pipeline  1 worker {w1:.0}/s  2 workers {w2:.0}/s");
            js_rows.push(json!({"repeat": r, "one_worker_per_s": w1, "two_workers_per_s": w2}));
            one.push(w1);
            two.push(w2);
            scale.push(w2 / w1);
        }
        Ok(json!({
            "request_reply": {
                "requests_per_repeat": requests,
                "one_request_at_a_time": true,
                "payload": "JSON, ~30 bytes",
                "repeats": rows,
                "summary": {
                    "call_alone_no_nats_p50_us": spread(&c50),
                    "echo_p50_us": spread(&e50), "echo_p99_us": spread(&e99),
                    "anomaly_p50_us": spread(&a50), "anomaly_p99_us": spread(&a99),
                    "pipeline_p50_us": spread(&p50), "pipeline_p99_us": spread(&p99),
                    "anomaly_over_echo_p50": spread(&a_ratio),
                    "pipeline_over_echo_p50": spread(&p_ratio),
                }
            },
            "jetstream": {
                "inputs_per_repeat": inputs,
                "kernel": "pipeline (normalizer -> scorer), unordered, max_in_flight 256",
                "measured": "from workers' start to the last output stored (inputs stored beforehand)",
                "repeats": js_rows,
                "summary": {
                    "one_worker_per_s": spread(&one),
                    "two_workers_per_s": spread(&two),
                    "two_over_one": spread(&scale),
                }
            }
        }))
    });
    let mut v = result?;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cmd: Vec<String> = std::env::args().skip(1).collect();
    v["command"] = json!(format!(
        "cargo run --release -p resident-nats --example bench_nats -- {}",
        cmd.join(" ")
    ));
    v["machine"] = json!(format!(
        "{cpu}, {} vCPUs (shared, noisy VM, no GPU); server, workers and client on one machine over 127.0.0.1",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    ));
    v["date"] = json!(date);
    v["nats_server"] = json!(String::from_utf8_lossy(&version.stdout).trim());
    v["backend"] = json!("cpu");
    if let Some(dir) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&v)?)?;
    println!("wrote {out}");
    drop(server);
    Ok(())
}
