//! NATS serving benchmark (starts its own `nats-server -js` on a loopback port), every figure
//! against a baseline measured in the same run:
//! * request/reply latency, one request at a time, JSON: a plain NATS echo responder (the
//!   baseline), the serving layer with no kernel behind it (`serve_requests` around a service
//!   that answers in place: the layer's own cost), the anomaly kernel served (one `call`), and
//!   the two-kernel pipeline served;
//! * JetStream outputs/s (inputs stored first, time from the workers' start until every output
//!   is stored): a plain relay with no kernel doing the same pull (batch of the free slots),
//!   publish-with-id (`Nats-Msg-Id`, pipelined) and acknowledge-after-stored protocol (the
//!   baseline; grouped like the served path: one task per group of inputs that arrived
//!   together waits for the stream's acks), with 1 and 2 relays; the served anomaly kernel (unordered, one `call_batch` per group of inputs that
//!   arrived together, one ack-waiting task per group) with 1 and 2 workers; and the relay with other in-flight limits (what the pipelining depth changes).
//!
//! Each measurement is repeated; the JSON has every repeat and the spread.
//!
//! cargo run --release -p resident-bench --example bench_nats -- [--out FILE] [--repeats 3]
//!     [--requests 2000] [--inputs 5000]

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use resident::prelude::*;
use resident_bench::stats::spread;
use resident_nats::async_nats;
use resident_nats::async_nats::jetstream::{self, AckKind};
use resident_nats::demo::{
    self, AnomalyReply, AnomalyRequest, DemoOptions, Pipeline, PipelineReply, PipelineRequest,
};
use resident_nats::testing::{connect_options, nats_server_binary, NatsServer};
use resident_nats::{
    serve_jetstream, serve_requests, JetStreamOptions, JetStreamStats, JsonCodec, RequestOptions,
    RequestStats, Service,
};
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

/// The `p`-quantile of sorted samples (NaN when there are none: `null` in the JSON).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    resident_bench::stats::quantile(sorted, p).unwrap_or(f64::NAN)
}

/// The serving layer with nothing behind it: answers in place (no kernel, no thread of its
/// own). Served, it measures what `serve_requests` itself adds to a round trip.
struct NoKernel;

impl Service for NoKernel {
    type In = demo::Reading;
    type Out = demo::Verdict;
    fn call(&self, r: demo::Reading, _: Duration) -> resident::Result<demo::Verdict> {
        Ok(demo::Verdict {
            z: r.value,
            anomaly: 0,
            _pad: 0,
        })
    }
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
    us.sort_by(f64::total_cmp);
    Ok((percentile(&us, 0.5), percentile(&us, 0.99)))
}

/// Stores `inputs` JSON readings on `subject` (each with its own `Nats-Msg-Id`).
async fn store_inputs(
    js: &jetstream::Context,
    subject: &str,
    inputs: usize,
) -> Result<(), BoxError> {
    // The client allows 5000 publish acknowledgements outstanding and a pending one holds
    // its slot until awaited, so they are awaited in chunks below that.
    let mut acks = Vec::with_capacity(1000);
    for i in 0..inputs {
        let body = serde_json::to_vec(&AnomalyRequest {
            sensor: (i % 16) as u32,
            value: 20.0 + (i % 7) as f64,
        })?;
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("in-{i}").as_str());
        acks.push(
            js.publish_with_headers(subject.to_string(), h, body.into())
                .await?,
        );
        if acks.len() == 1000 {
            for a in acks.drain(..) {
                a.await?;
            }
        }
    }
    for a in acks {
        a.await?;
    }
    Ok(())
}

/// The baseline: what `serve_jetstream` does minus the kernel and the codec. Pulls as many
/// inputs as it has free slots, publishes each payload unchanged to the output subject with
/// the input's id as `Nats-Msg-Id` (not waiting: publishes are pipelined), and acknowledges
/// the input once the stream has stored the output.
async fn relay(
    client: async_nats::Client,
    opts: JetStreamOptions,
    mut stop: watch::Receiver<bool>,
) -> Result<(), BoxError> {
    let js = jetstream::new(client.clone());
    let consumer = resident_nats::ensure_consumer(&js, &opts).await?;
    let permits = Arc::new(Semaphore::new(opts.max_in_flight));
    while !*stop.borrow() {
        let first = tokio::select! {
            _ = stop.changed() => break,
            p = permits.clone().acquire_owned() => p?,
        };
        let want = permits.available_permits() + 1;
        drop(first);
        let mut batch = consumer
            .batch()
            .max_messages(want)
            .expires(opts.fetch_expires)
            .messages()
            .await?;
        // Like serve_jetstream: the inputs already here form a group, and one task per
        // group waits for the stream's acks and then acks the inputs (so the baseline pays
        // no more task spawns per input than the served path does).
        let mut ended = false;
        while let Some(msg) = if ended { None } else { batch.next().await } {
            let mut group = Vec::new();
            let mut next = Some(msg?);
            while let Some(msg) = next.take() {
                let permit = permits.clone().acquire_owned().await?;
                let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
                let id = msg
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Msg-Id"))
                    .map(|v| v.as_str().to_string())
                    .unwrap_or_else(|| format!("{}:{seq}", opts.stream));
                let mut h = async_nats::HeaderMap::new();
                h.insert("Nats-Msg-Id", id.as_str());
                h.insert("Resident-Input-Seq", seq.to_string().as_str());
                let stored = js
                    .publish_with_headers(opts.output_subject.clone(), h, msg.payload.clone())
                    .await?;
                group.push((msg, stored, permit));
                match batch.next().now_or_never() {
                    Some(Some(m)) => next = Some(m?),
                    Some(None) => ended = true,
                    None => {}
                }
            }
            tokio::spawn(futures_util::future::join_all(group.into_iter().map(
                |(msg, stored, permit)| async move {
                    match tokio::time::timeout(Duration::from_secs(5), stored).await {
                        Ok(Ok(_)) => {
                            let _ = msg.ack().await;
                        }
                        _ => {
                            let _ = msg.ack_with(AckKind::Nak(None)).await;
                        }
                    }
                    drop(permit);
                },
            )));
        }
    }
    let _ = permits.acquire_many(opts.max_in_flight as u32).await;
    Ok(())
}

#[derive(Clone, Copy)]
enum Feeder {
    Relay,
    Anomaly,
}

/// Outputs/s of `workers` feeders of one kind on a fresh pair of streams.
async fn jetstream_run(
    url: &str,
    kernels: &Runtime,
    name: &str,
    feeder: Feeder,
    workers: usize,
    in_flight: usize,
    inputs: usize,
) -> Result<f64, BoxError> {
    let client = connect_options().connect(url).await?;
    let js = jetstream::new(client.clone());
    let stream = name.to_uppercase().replace(['-', '.'], "_");
    let subject = format!("bench.js.{name}");
    let mut opts = JetStreamOptions::new(stream.clone(), subject.clone(), "bench");
    opts.max_in_flight = in_flight;
    opts.ordered = false;
    resident_nats::ensure_streams(&js, &opts).await?;
    store_inputs(&js, &subject, inputs).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let t0 = Instant::now();
    for w in 0..workers {
        let c = connect_options().connect(url).await?;
        let mut rx = stop_rx.clone();
        let until = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        tasks.push(match feeder {
            Feeder::Relay => tokio::spawn(relay(c, opts.clone(), stop_rx.clone())),
            Feeder::Anomaly => {
                let k = Arc::new(demo::launch_anomaly(
                    kernels,
                    &format!("{name}-{w}"),
                    DemoOptions {
                        queue_size: in_flight,
                        ..DemoOptions::default()
                    },
                )?);
                let codec = Arc::new(JsonCodec::<AnomalyRequest, AnomalyReply>::new());
                let o = opts.clone();
                tokio::spawn(async move {
                    serve_jetstream(c, k, codec, o, Arc::new(JetStreamStats::default()), until)
                        .await
                        .map_err(BoxError::from)
                })
            }
        });
    }
    let out = format!("{stream}_OUT");
    let deadline = Instant::now() + Duration::from_secs(120);
    let elapsed = loop {
        let n = js.get_stream(&out).await?.get_info().await?.state.messages;
        if n >= inputs as u64 {
            break t0.elapsed();
        }
        if Instant::now() > deadline {
            return Err(format!("{name}: only {n} of {inputs} outputs in 120 s").into());
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

/// Starts `serve_requests` for `service` on `subject`; stops when `stop` turns true.
async fn serve_on<S: Service>(
    url: &str,
    subject: &str,
    service: Arc<S>,
    codec: Arc<impl resident_nats::Codec<S::In, S::Out>>,
    stop: &watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Result<(), resident_nats::ServeError>>, BoxError> {
    let mut rx = stop.clone();
    let c = connect_options().connect(url).await?;
    Ok(tokio::spawn(serve_requests(
        c,
        service,
        codec,
        RequestOptions::new(subject),
        Arc::new(RequestStats::default()),
        async move {
            let _ = rx.wait_for(|s| *s).await;
        },
    )))
}

fn main() -> Result<(), BoxError> {
    let repeats: usize = arg("--repeats", "3").parse()?;
    let requests: usize = arg("--requests", "2000").parse()?;
    let inputs: usize = arg("--inputs", "5000").parse()?;
    let out = arg("--out", "bench/results/nats-latest.json");
    let bin = nats_server_binary().ok_or("nats-server is not installed")?;
    let server = NatsServer::start(bin.clone())?;
    let version = std::process::Command::new(&bin).arg("--version").output()?;
    // How kernel threads and callers wait: the runtime's default, or `park` (no spinning: on
    // a machine with fewer cores than busy threads, a spinning caller delays the kernel it
    // waits for).
    let wait = arg("--kernel-wait", "default");
    let only = arg("--only", "all");
    let mut builder = Runtime::builder().backend(Backend::Cpu);
    match wait.as_str() {
        "default" => {}
        "park" => builder = builder.wait_strategy(WaitStrategy::Park),
        "spin" => builder = builder.wait_strategy(WaitStrategy::Spin),
        us => {
            let us: u64 = us
                .parse()
                .map_err(|_| "--kernel-wait: default, park, spin or a spin time in us")?;
            builder = builder.wait_strategy(WaitStrategy::SpinThenPark(Duration::from_micros(us)));
        }
    }
    let kernels = builder.build()?;
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
        let anomaly = Arc::new(demo::launch_anomaly(
            &kernels,
            "bench-anomaly",
            DemoOptions::default(),
        )?);
        let direct = (*anomaly).clone();
        let pipeline = Arc::new(Pipeline::launch(
            &kernels,
            "bench-pipeline",
            DemoOptions::default(),
        )?);
        let anomaly_codec = Arc::new(JsonCodec::<AnomalyRequest, AnomalyReply>::new());
        let servers = vec![
            serve_on(&url, "bench.nokernel", Arc::new(NoKernel), anomaly_codec.clone(), &stop_rx)
                .await?,
            serve_on(&url, "bench.anomaly", anomaly, anomaly_codec, &stop_rx).await?,
            serve_on(
                &url,
                "bench.pipeline",
                pipeline,
                Arc::new(JsonCodec::<PipelineRequest, PipelineReply>::new()),
                &stop_rx,
            )
            .await?,
        ];
        let client = connect_options().connect(url.as_str()).await?;
        client.flush().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let reading = br#"{"sensor": 3, "value": 20.5}"#;
        let value = br#"{"value": 42.0}"#;
        let mut rows = Vec::new();
        let mut c50 = vec![];
        let names = ["echo", "no_kernel", "anomaly", "pipeline"];
        let mut p50: Vec<Vec<f64>> = vec![vec![]; 4];
        let mut p99: Vec<Vec<f64>> = vec![vec![]; 4];
        let mut r50: Vec<Vec<f64>> = vec![vec![]; 4];
        let mut r99: Vec<Vec<f64>> = vec![vec![]; 4];
        let rr_repeats = if only == "js" { 0 } else { repeats };
        for r in 0..rr_repeats {
            // The kernel alone: `call` from a plain thread, one at a time, no NATS.
            let k = direct.clone();
            let call = tokio::task::spawn_blocking(move || -> resident::Result<f64> {
                let r = demo::Reading {
                    value: 20.5,
                    sensor: 3,
                    _pad: 0,
                };
                for _ in 0..200 {
                    k.call(r, Duration::from_secs(5))?;
                }
                let mut us = Vec::with_capacity(requests);
                for _ in 0..requests {
                    let t = Instant::now();
                    k.call(r, Duration::from_secs(5))?;
                    us.push(t.elapsed().as_secs_f64() * 1e6);
                }
                us.sort_by(f64::total_cmp);
                Ok(percentile(&us, 0.5))
            })
            .await??;
            c50.push(call);
            let mut row = json!({"repeat": r, "call_alone_p50_us": call});
            let mut line = format!("repeat {r}: p50/p99 us ");
            let mut echo = (0.0, 0.0);
            for (i, name) in names.iter().enumerate() {
                let (subject, body): (&str, &[u8]) = match *name {
                    "echo" => ("bench.echo", reading),
                    "no_kernel" => ("bench.nokernel", reading),
                    "anomaly" => ("bench.anomaly", reading),
                    _ => ("bench.pipeline", value),
                };
                let l = latency(&client, subject, body, requests).await?;
                if i == 0 {
                    echo = l;
                }
                p50[i].push(l.0);
                p99[i].push(l.1);
                r50[i].push(l.0 / echo.0);
                r99[i].push(l.1 / echo.1);
                row[*name] = json!({"p50_us": l.0, "p99_us": l.1,
                    "p50_over_echo": l.0 / echo.0, "p99_over_echo": l.1 / echo.1});
                line += &format!(" {name} {:.1}/{:.1}", l.0, l.1);
            }
            println!("{line}  (call alone p50 {call:.1})");
            rows.push(row);
        }
        stop_tx.send(true)?;
        for t in servers {
            t.await??;
        }
        let mut summary = json!({});
        for (i, name) in names.iter().enumerate().filter(|_| rr_repeats > 0) {
            summary["call_alone_no_nats_p50_us"] = spread(&c50);
            summary[*name] = json!({"p50_us": spread(&p50[i]), "p99_us": spread(&p99[i]),
                "p50_over_echo": spread(&r50[i]), "p99_over_echo": spread(&r99[i])});
        }

        // JetStream: each repeat runs every configuration once, in the same order.
        let configs: Vec<(&str, Feeder, usize, usize)> = vec![
            ("relay_1", Feeder::Relay, 1, 256),
            ("relay_2", Feeder::Relay, 2, 256),
            ("served_1", Feeder::Anomaly, 1, 256),
            ("served_2", Feeder::Anomaly, 2, 256),
            ("relay_1_in_flight_64", Feeder::Relay, 1, 64),
            ("relay_1_in_flight_1024", Feeder::Relay, 1, 1024),
        ];
        let mut js_rows = Vec::new();
        let mut rates: Vec<Vec<f64>> = vec![vec![]; configs.len()];
        let (mut s1, mut s2) = (vec![], vec![]);
        let js_repeats = if only == "rr" { 0 } else { repeats };
        for r in 0..js_repeats {
            let mut row = json!({"repeat": r});
            let mut line = format!("repeat {r}: JetStream outputs/s ");
            for (i, (name, feeder, workers, in_flight)) in configs.iter().enumerate() {
                let rate = jetstream_run(
                    &url,
                    &kernels,
                    &format!("{name}-{r}"),
                    *feeder,
                    *workers,
                    *in_flight,
                    inputs,
                )
                .await?;
                rates[i].push(rate);
                row[*name] = json!(rate);
                line += &format!(" {name} {rate:.0}");
            }
            let (relay1, served1, served2) = (rates[0][r], rates[2][r], rates[3][r]);
            s1.push(served1 / relay1);
            s2.push(served2 / relay1);
            row["served_1_over_relay_1"] = json!(served1 / relay1);
            row["served_2_over_relay_1"] = json!(served2 / relay1);
            println!("{line}");
            js_rows.push(row);
        }
        let mut js_summary = json!({});
        for (i, (name, ..)) in configs.iter().enumerate().filter(|_| js_repeats > 0) {
            js_summary["served_1_over_relay_1"] = spread(&s1);
            js_summary["served_2_over_relay_1"] = spread(&s2);
            js_summary[format!("{name}_per_s")] = spread(&rates[i]);
        }
        Ok(json!({
            "request_reply": {
                "requests_per_repeat": requests,
                "one_request_at_a_time": true,
                "payload": "JSON, ~30 bytes",
                "responders": {
                    "echo": "plain NATS subscriber publishing the payload back (the baseline)",
                    "no_kernel": "serve_requests (JSON decode, call, encode, reply) around a service that answers in place",
                    "anomaly": "serve_requests around the anomaly ring kernel (CPU backend)",
                    "pipeline": "serve_requests around the two-kernel pipeline (normalizer -> scorer)",
                },
                "repeats": rows,
                "summary": summary,
            },
            "jetstream": {
                "inputs_per_repeat": inputs,
                "feeders": {
                    "relay": "no kernel, no codec: pull the free slots, publish the payload with the input's Nats-Msg-Id (pipelined), ack the input after the stream stored the output; grouped like the served path (one ack-waiting task per group of inputs that arrived together)",
                    "served": "serve_jetstream around the anomaly kernel, JSON, unordered; the inputs of a pull that arrived together go to the kernel as one Service::call_batch (one blocking section per group)",
                },
                "in_flight": "256 unless the name says otherwise (max_ack_pending and pull size)",
                "measured": "from the workers' start to the last output stored (inputs stored beforehand)",
                "repeats": js_rows,
                "summary": js_summary,
            }
        }))
    });
    let mut v = result?;
    let cmd: Vec<String> = std::env::args().skip(1).collect();
    v["command"] = json!(format!(
        "cargo run --release -p resident-nats --example bench_nats -- {}",
        cmd.join(" ")
    ));
    v["machine"] = resident_bench::provenance::machine();
    v["setup"] =
        json!("shared, noisy VM, no GPU; server, workers and client on one machine over 127.0.0.1");
    v["date"] = json!(resident_bench::provenance::today());
    v["load"] = json!(resident_bench::provenance::load());
    v["nats_server"] = json!(String::from_utf8_lossy(&version.stdout).trim());
    v["backend"] = json!("cpu");
    v["kernel_wait"] = json!(wait);
    if let Some(dir) = std::path::Path::new(&out).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&v)?)?;
    println!("wrote {out}");
    drop(server);
    Ok(())
}
