//! Against a real `nats-server` (started here on a loopback port, killed on drop): request/reply
//! round trips, a queue group sharing load, typed errors for garbage, JetStream dead letters,
//! and a server restart survived with nothing acknowledged lost.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use resident::prelude::*;
use resident_nats::demo::{
    self, AnomalyReply, AnomalyRequest, DemoOptions, Pipeline, PipelineReply, PipelineRequest,
};
use resident_nats::testing::{connect_options, NatsServer};
use resident_nats::{
    parse_reply, serve_jetstream, serve_requests, ErrorKind, JetStreamOptions, JetStreamStats,
    JsonCodec, PodCodec, Reply, RequestOptions, RequestStats,
};
use tokio::sync::oneshot;

const T: Duration = Duration::from_secs(10);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn connect(url: &str) -> async_nats::Client {
    tokio::time::timeout(T, connect_options().connect(url))
        .await
        .expect("connect within 10 s")
        .expect("connect")
}

/// Waits (at most 10 s) until every worker's subscription is known to the server.
async fn ready(stats: &[&RequestStats]) {
    let deadline = Instant::now() + T;
    while !stats.iter().all(|s| s.ready.load(Ordering::Acquire)) {
        assert!(
            Instant::now() < deadline,
            "workers not subscribed within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn request(c: &async_nats::Client, subject: &str, body: Vec<u8>) -> Reply {
    let m = tokio::time::timeout(T, c.request(subject.to_string(), body.into()))
        .await
        .expect("reply within 10 s")
        .expect("request");
    parse_reply(&m)
}

/// Starts a pipeline worker; returns its stop switch, stats and task.
fn pipeline_worker(
    rt: &Runtime,
    prefix: &str,
    client: async_nats::Client,
    opts: RequestOptions,
) -> (
    oneshot::Sender<()>,
    Arc<RequestStats>,
    tokio::task::JoinHandle<()>,
) {
    let p = Arc::new(Pipeline::launch(rt, prefix, DemoOptions::default()).unwrap());
    let stats = Arc::new(RequestStats::default());
    let (tx, rx) = oneshot::channel();
    let st = stats.clone();
    let task = tokio::spawn(async move {
        serve_requests(
            client,
            p,
            Arc::new(JsonCodec::<PipelineRequest, PipelineReply>::new()),
            opts,
            st,
            async {
                let _ = rx.await;
            },
        )
        .await
        .unwrap();
    });
    (tx, stats, task)
}

#[test]
fn request_reply_round_trip_and_typed_errors_for_garbage() {
    let Some(server) = NatsServer::start_or_skip("request_reply_round_trip") else {
        return;
    };
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    rt().block_on(async {
        let worker = connect(&server.url()).await;
        let client = connect(&server.url()).await;
        let (stop, stats, task) = pipeline_worker(
            &kernels,
            "rr",
            worker.clone(),
            RequestOptions::new("t.pipeline"),
        );
        ready(&[&stats]).await;
        for v in [-3.0, 0.0, 30.0, 54.7, 60.0, 99.0, 140.0] {
            let body = serde_json::to_vec(&PipelineRequest { value: v }).unwrap();
            let Reply::Output(bytes) = request(&client, "t.pipeline", body).await else {
                panic!("error reply for {v}");
            };
            let r: PipelineReply = serde_json::from_slice(&bytes).unwrap();
            let (score, class) = demo::score(demo::normalize(v));
            assert_eq!(r, PipelineReply { score, class });
        }
        // Garbage: bad JSON, wrong fields, wrong type. Each gets a typed error...
        for junk in [
            &b"{\"value\":"[..],
            b"{\"v\": 1}",
            b"\x00\x01\x02",
            b"{\"value\": \"x\"}",
        ] {
            match request(&client, "t.pipeline", junk.to_vec()).await {
                Reply::Error(e) => assert_eq!(e.error, ErrorKind::BadInput, "{e:?}"),
                Reply::Output(o) => panic!("garbage {junk:?} answered {o:?}"),
            }
        }
        // ...and the worker keeps serving.
        let Reply::Output(bytes) =
            request(&client, "t.pipeline", br#"{"value": 100}"#.to_vec()).await
        else {
            panic!("worker stopped serving after garbage");
        };
        let r: PipelineReply = serde_json::from_slice(&bytes).unwrap();
        assert_eq!((r.score, r.class), (1.0, demo::Class::High));
        stop.send(()).unwrap();
        tokio::time::timeout(T, task).await.unwrap().unwrap();
        assert_eq!(stats.bad_input.load(Ordering::Relaxed), 4);
        assert_eq!(stats.replies.load(Ordering::Relaxed), 8);
        assert_eq!(stats.error_replies.load(Ordering::Relaxed), 4);
    });
}

#[test]
fn raw_pod_bytes_and_wrong_size_error() {
    let Some(server) = NatsServer::start_or_skip("raw_pod_bytes") else {
        return;
    };
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let anomaly = demo::launch_anomaly(&kernels, "pod-anomaly", DemoOptions::default()).unwrap();
    rt().block_on(async {
        let worker = connect(&server.url()).await;
        let client = connect(&server.url()).await;
        let (tx, rx) = oneshot::channel::<()>();
        let stats = Arc::new(RequestStats::default());
        let handle = anomaly.clone();
        let task = tokio::spawn(serve_requests(
            worker,
            Arc::new(anomaly),
            Arc::new(PodCodec),
            RequestOptions::new("t.raw"),
            stats.clone(),
            async {
                let _ = rx.await;
            },
        ));
        ready(&[&stats]).await;
        let mut st = demo::SensorStats::default();
        for i in 0..300u32 {
            let x = if i == 250 {
                90.0
            } else {
                10.0 + (i % 7) as f64 * 0.1
            };
            let reading = demo::Reading {
                value: x,
                sensor: 3,
                _pad: 0,
            };
            let Reply::Output(b) =
                request(&client, "t.raw", bytemuck::bytes_of(&reading).to_vec()).await
            else {
                panic!("error reply");
            };
            let v: demo::Verdict = bytemuck::pod_read_unaligned(&b);
            let (anomaly, z) = st.observe(x);
            assert_eq!((v.anomaly != 0, v.z), (anomaly, z), "reading {i}");
            assert_eq!(anomaly, i == 250);
        }
        match request(&client, "t.raw", vec![1, 2, 3]).await {
            Reply::Error(e) => {
                assert_eq!(e.error, ErrorKind::BadInput);
                assert!(e.message.contains("3 bytes"), "{}", e.message);
            }
            Reply::Output(_) => panic!("3 bytes decoded as a Reading"),
        }
        // A kernel that is gone: a typed `unavailable` reply, and the worker is still there.
        let report = handle.terminate().unwrap();
        assert!(report.undelivered.is_empty());
        let reading = demo::Reading {
            value: 1.0,
            sensor: 1,
            _pad: 0,
        };
        for _ in 0..2 {
            match request(&client, "t.raw", bytemuck::bytes_of(&reading).to_vec()).await {
                Reply::Error(e) => assert_eq!(e.error, ErrorKind::Unavailable, "{e:?}"),
                Reply::Output(_) => panic!("a terminated kernel answered"),
            }
        }
        tx.send(()).unwrap();
        tokio::time::timeout(T, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    });
}

#[test]
fn two_workers_in_a_queue_group_share_the_load() {
    let Some(server) = NatsServer::start_or_skip("queue_group_shares_load") else {
        return;
    };
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    rt().block_on(async {
        let mut opts = RequestOptions::new("t.shared");
        opts.queue_group = Some("g".into());
        let (s1, st1, t1) =
            pipeline_worker(&kernels, "w1", connect(&server.url()).await, opts.clone());
        let (s2, st2, t2) = pipeline_worker(&kernels, "w2", connect(&server.url()).await, opts);
        ready(&[&st1, &st2]).await;
        let client = connect(&server.url()).await;
        // 400 requests, 16 at a time.
        let mut answered = 0;
        for chunk in 0..25 {
            let futs: Vec<_> = (0..16)
                .map(|i| {
                    let c = client.clone();
                    let v = ((chunk * 16 + i) % 101) as f64;
                    async move {
                        let body = serde_json::to_vec(&PipelineRequest { value: v }).unwrap();
                        (v, request(&c, "t.shared", body).await)
                    }
                })
                .collect();
            for (v, r) in futures_util::future::join_all(futs).await {
                let Reply::Output(b) = r else {
                    panic!("error reply")
                };
                let r: PipelineReply = serde_json::from_slice(&b).unwrap();
                assert_eq!(r.score, demo::score(demo::normalize(v)).0);
                answered += 1;
            }
        }
        assert_eq!(answered, 400);
        // A worker counts a reply after publishing it, so the client can hold the last reply
        // a moment before the count moves (seen once under a load average of 60): wait for
        // the counts to settle (bounded), then check each request was answered exactly once.
        let settle = Instant::now() + Duration::from_secs(5);
        let count = || {
            (
                st1.replies.load(Ordering::Relaxed),
                st2.replies.load(Ordering::Relaxed),
            )
        };
        while count().0 + count().1 < 400 && Instant::now() < settle {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (a, b) = count();
        println!("queue group: worker 1 answered {a}, worker 2 answered {b}");
        assert_eq!(a + b, 400, "each request answered once");
        assert!(a > 0 && b > 0, "both workers got some ({a}, {b})");
        s1.send(()).unwrap();
        s2.send(()).unwrap();
        tokio::time::timeout(T, t1).await.unwrap().unwrap();
        tokio::time::timeout(T, t2).await.unwrap().unwrap();
    });
}

/// Every message in the output stream on `subject`, by `Nats-Msg-Id`.
async fn outputs_by_id(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
) -> HashMap<String, Vec<bytes::Bytes>> {
    let s = js.get_stream(stream).await.unwrap();
    let last = s.get_info().await.unwrap().state.last_sequence;
    let mut by_id: HashMap<String, Vec<bytes::Bytes>> = HashMap::new();
    for seq in 1..=last {
        let Ok(m) = s.get_raw_message(seq).await else {
            continue;
        };
        if m.subject.as_str() != subject {
            continue;
        }
        let id = m.headers.get("Nats-Msg-Id").unwrap().as_str().to_string();
        by_id.entry(id).or_default().push(m.payload);
    }
    by_id
}

async fn wait_for_messages(js: &jetstream::Context, stream: &str, n: u64, within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    loop {
        let have = match js.get_stream(stream).await {
            Ok(s) => s.get_info().await.map(|i| i.state.messages).unwrap_or(0),
            Err(_) => 0,
        };
        if have >= n || Instant::now() > deadline {
            return have;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn jetstream_dead_letters_garbage_and_keeps_serving() {
    let Some(server) = NatsServer::start_or_skip("jetstream_dead_letters") else {
        return;
    };
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let anomaly = demo::launch_anomaly(&kernels, "js-anomaly", DemoOptions::default()).unwrap();
    rt().block_on(async {
        let client = connect(&server.url()).await;
        let js = jetstream::new(client.clone());
        let opts = JetStreamOptions::new("DL", "t.dl", "dl-workers");
        resident_nats::ensure_streams(&js, &opts).await.unwrap();
        // Inputs, with garbage in between, published before the worker starts.
        let mut expected = Vec::new();
        let mut st = demo::SensorStats::default();
        for i in 0..50u32 {
            let id = format!("in-{i}");
            let body = if i % 10 == 5 {
                b"{\"sensor\": -1, \"value\": 2}".to_vec()
            } else {
                let value = 5.0 + (i % 3) as f64;
                expected.push((id.clone(), st.observe(value)));
                serde_json::to_vec(&AnomalyRequest { sensor: 1, value }).unwrap()
            };
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", id.as_str());
            js.publish_with_headers("t.dl", h, body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let stats = Arc::new(JetStreamStats::default());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_jetstream(
            connect(&server.url()).await,
            Arc::new(anomaly),
            Arc::new(JsonCodec::<AnomalyRequest, AnomalyReply>::new()),
            opts.clone(),
            stats.clone(),
            async {
                let _ = rx.await;
            },
        ));
        assert_eq!(wait_for_messages(&js, "DL_OUT", 50, T).await, 50);
        let outs = outputs_by_id(&js, "DL_OUT", "t.dl.out").await;
        assert_eq!(outs.len(), expected.len());
        for (id, (anomaly, z)) in &expected {
            let got = &outs[id];
            assert_eq!(got.len(), 1, "{id}: one output");
            let r: AnomalyReply = serde_json::from_slice(&got[0]).unwrap();
            assert_eq!((r.anomaly, r.z), (*anomaly, *z), "{id}: in stream order");
        }
        let dead = outputs_by_id(&js, "DL_OUT", "t.dl.dead").await;
        assert_eq!(dead.len(), 5);
        assert!(dead.contains_key("dead:in-5"));
        let s = js.get_stream("DL_OUT").await.unwrap();
        let seq = s.get_info().await.unwrap().state.last_sequence;
        let mut kinds = 0;
        for q in 1..=seq {
            let m = s.get_raw_message(q).await.unwrap();
            if m.subject.as_str() == "t.dl.dead" {
                assert_eq!(
                    m.headers.get("Resident-Error").unwrap().as_str(),
                    "bad_input"
                );
                kinds += 1;
            }
        }
        assert_eq!(kinds, 5);
        tx.send(()).unwrap();
        tokio::time::timeout(T, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(stats.dead_letters.load(Ordering::Relaxed), 5);
        assert_eq!(stats.outputs.load(Ordering::Relaxed), 45);
        // Everything acknowledged or terminated: nothing pending on the consumer.
        let mut c: jetstream::consumer::PullConsumer = js
            .get_stream("DL")
            .await
            .unwrap()
            .get_consumer("dl-workers")
            .await
            .unwrap();
        let info = c.info().await.unwrap();
        assert_eq!((info.num_ack_pending, info.num_pending), (0, 0));
    });
}

#[test]
fn a_server_restart_is_survived_and_nothing_acknowledged_is_lost() {
    let Some(mut server) = NatsServer::start_or_skip("server_restart") else {
        return;
    };
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let pipeline = Arc::new(Pipeline::launch(&kernels, "rs", DemoOptions::default()).unwrap());
    let tokio_rt = rt();
    let _enter = tokio_rt.enter();
    let url = server.url();
    let mut opts = JetStreamOptions::new("RS", "t.rs", "rs-workers");
    opts.ack_wait = Duration::from_secs(2);
    opts.ordered = false;
    let stats = Arc::new(JetStreamStats::default());
    let (tx, rx) = oneshot::channel::<()>();
    let (task, publisher) = tokio_rt.block_on(async {
        let publisher = connect(&url).await;
        let js = jetstream::new(publisher.clone());
        resident_nats::ensure_streams(&js, &opts).await.unwrap();
        let task = tokio::spawn(serve_jetstream(
            connect(&url).await,
            pipeline.clone(),
            Arc::new(JsonCodec::<PipelineRequest, PipelineReply>::new()),
            opts.clone(),
            stats.clone(),
            async {
                let _ = rx.await;
            },
        ));
        (task, publisher)
    });
    let publish = |from: u32, to: u32| {
        tokio_rt.block_on(async {
            let js = jetstream::new(publisher.clone());
            for i in from..to {
                let body = serde_json::to_vec(&PipelineRequest {
                    value: (i % 101) as f64,
                })
                .unwrap();
                let mut h = async_nats::HeaderMap::new();
                h.insert("Nats-Msg-Id", format!("in-{i}").as_str());
                // Retry until the stream acknowledges: only acknowledged inputs count.
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let r = async {
                        js.publish_with_headers("t.rs", h.clone(), body.clone().into())
                            .await?
                            .await
                            .map_err(async_nats::Error::from)
                    };
                    match tokio::time::timeout(Duration::from_secs(3), r).await {
                        Ok(Ok(_)) => break,
                        _ if Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(100)).await
                        }
                        other => panic!("input {i} not acknowledged within 30 s: {other:?}"),
                    }
                }
            }
        })
    };
    publish(0, 300);
    let js = jetstream::new(publisher.clone());
    let before = tokio_rt.block_on(wait_for_messages(&js, "RS_OUT", 100, T));
    assert!(before >= 100);
    server.restart().expect("server restarts");
    publish(300, 600);
    let after = tokio_rt.block_on(wait_for_messages(
        &js,
        "RS_OUT",
        600,
        Duration::from_secs(60),
    ));
    assert_eq!(
        after, 600,
        "every acknowledged input has its output after the restart"
    );
    let outs = tokio_rt.block_on(outputs_by_id(&js, "RS_OUT", "t.rs.out"));
    for i in 0..600u32 {
        let got = &outs[&format!("in-{i}")];
        assert_eq!(got.len(), 1, "in-{i}: exactly one output");
        let r: PipelineReply = serde_json::from_slice(&got[0]).unwrap();
        assert_eq!(r.score, demo::score(demo::normalize((i % 101) as f64)).0);
    }
    tx.send(()).unwrap();
    tokio_rt
        .block_on(tokio::time::timeout(T, task))
        .unwrap()
        .unwrap()
        .unwrap();
    println!(
        "restart: outputs {}, duplicates dropped by the stream {}, pull errors while away {}",
        stats.outputs.load(Ordering::Relaxed),
        stats.duplicates.load(Ordering::Relaxed),
        stats.pull_errors.load(Ordering::Relaxed)
    );
}

#[test]
fn a_slow_kernel_slows_the_consumer_instead_of_dropping() {
    let Some(server) = NatsServer::start_or_skip("slow_kernel_backpressure") else {
        return;
    };
    const N: u32 = 200;
    const SLOTS: usize = 8;
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    // 2 ms per message and a queue of 8: far slower than the inputs arrive.
    let slow = demo::launch_anomaly(
        &kernels,
        "slow",
        DemoOptions {
            queue_size: SLOTS,
            delay: Duration::from_millis(2),
        },
    )
    .unwrap();
    rt().block_on(async {
        let client = connect(&server.url()).await;
        let js = jetstream::new(client.clone());
        let mut opts = JetStreamOptions::new("SLOW", "t.slow", "slow-workers");
        opts.max_in_flight = SLOTS;
        resident_nats::ensure_streams(&js, &opts).await.unwrap();
        let mut st = demo::SensorStats::default();
        let mut expected = Vec::new();
        for i in 0..N {
            let value = 1.0 + (i % 5) as f64;
            expected.push(st.observe(value));
            let body = serde_json::to_vec(&AnomalyRequest { sensor: 0, value }).unwrap();
            js.publish("t.slow", body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let stats = Arc::new(JetStreamStats::default());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_jetstream(
            connect(&server.url()).await,
            Arc::new(slow.clone()),
            Arc::new(JsonCodec::<AnomalyRequest, AnomalyReply>::new()),
            opts,
            stats.clone(),
            async {
                let _ = rx.await;
            },
        ));
        // While it works, the server never has more than SLOTS inputs out for it.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut max_pending = 0;
        let mut samples = 0;
        loop {
            if let Ok(s) = js.get_stream("SLOW").await {
                if let Ok(mut c) = s
                    .get_consumer::<jetstream::consumer::pull::Config>("slow-workers")
                    .await
                {
                    if let Ok(i) = c.info().await {
                        max_pending = max_pending.max(i.num_ack_pending);
                        samples += 1;
                    }
                }
            }
            let done = wait_for_messages(&js, "SLOW_OUT", N as u64, Duration::ZERO).await;
            if done >= N as u64 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "only {done} of {N} outputs in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("slow kernel: {samples} samples, at most {max_pending} inputs pending");
        assert!(
            max_pending <= SLOTS,
            "{max_pending} pending > {SLOTS} slots"
        );
        assert!(max_pending > 0, "the sampling saw the work");
        // Nothing dropped or refused anywhere, nothing handed back.
        let t = slow.telemetry();
        assert_eq!((t.messages_dropped, t.messages_refused), (0, 0));
        assert_eq!(stats.naks.load(Ordering::Relaxed), 0);
        // The kernel saw the inputs in stream order; each output names its input.
        let s = js.get_stream("SLOW_OUT").await.unwrap();
        let mut seen = vec![false; N as usize];
        for q in 1..=N as u64 {
            let m = s.get_raw_message(q).await.unwrap();
            let seq: usize = m
                .headers
                .get("Resident-Input-Seq")
                .unwrap()
                .as_str()
                .parse()
                .unwrap();
            assert_eq!(
                m.headers.get("Nats-Msg-Id").unwrap().as_str(),
                format!("SLOW:{seq}")
            );
            let r: AnomalyReply = serde_json::from_slice(&m.payload).unwrap();
            assert_eq!((r.anomaly, r.z), expected[seq - 1], "input {seq}");
            assert!(
                !std::mem::replace(&mut seen[seq - 1], true),
                "input {seq} twice"
            );
            // One ordered worker, no redelivery: outputs are even stored in input order.
            assert_eq!(seq as u64, q, "output order");
        }
        tx.send(()).unwrap();
        tokio::time::timeout(T, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    });
}
