//! Keyed state that survives its worker, against a real `nats-server`: a worker killed without
//! any shutdown (its whole async runtime dropped) and a server killed and restarted, with the
//! key states checked against a replay in the test and every output checked by id and value.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;
use resident::prelude::*;
use resident_nats::testing::fold::{self, FoldInput, FoldOutput, FoldState};
use resident_nats::testing::{connect_options, NatsServer};
use resident_nats::{read_checkpoint, serve_keyed_jetstream, KeyedOptions, KeyedStats, PodCodec};

const T: Duration = Duration::from_secs(10);
const KEYS: u32 = 16;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn options(owner: &str) -> KeyedOptions {
    let mut o = KeyedOptions::new("FOLD", "fold", "fold", KEYS, 4);
    o.lease = Duration::from_millis(1000);
    o.standby_delay = Duration::from_millis(500);
    o.checkpoint_every = 40;
    o.checkpoint_interval = Duration::from_millis(300);
    o.owner = owner.into();
    o
}

/// A worker in a tokio runtime of its own, so that it can be killed without any shutdown.
struct Worker {
    rt: Option<tokio::runtime::Runtime>,
    stats: Arc<KeyedStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), resident_nats::ServeError>>>,
    _kernels: Arc<Runtime>,
}

impl Worker {
    fn start(url: &str, opts: KeyedOptions) -> Worker {
        let rt = runtime();
        let kernels = Arc::new(Runtime::builder().backend(Backend::Cpu).build().unwrap());
        let stats = Arc::new(KeyedStats::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (url, st, k) = (url.to_string(), stats.clone(), kernels.clone());
        let task = rt.spawn(async move {
            let client = tokio::time::timeout(T, connect_options().connect(url))
                .await
                .expect("connect within 10 s")
                .expect("connect");
            let launch =
                Arc::new(move |id: &str, states: Vec<FoldState>| fold::launch(&k, id, states));
            serve_keyed_jetstream(
                client,
                launch,
                Arc::new(PodCodec),
                FoldState::default(),
                opts,
                st,
                async {
                    let _ = rx.await;
                },
            )
            .await
        });
        let deadline = Instant::now() + T;
        while !stats.ready.load(Ordering::Acquire) {
            if task.is_finished() {
                panic!("worker stopped: {:?}", rt.block_on(task));
            }
            assert!(Instant::now() < deadline, "worker not ready within 10 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        Worker {
            rt: Some(rt),
            stats,
            stop: Some(tx),
            task: Some(task),
            _kernels: kernels,
        }
    }

    /// Gone at once: no checkpoint, no lease released, nothing flushed.
    fn kill(mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }

    /// Graceful: a last checkpoint, the lease released.
    fn stop(mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        let (rt, task) = (self.rt.take().unwrap(), self.task.take().unwrap());
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .expect("stopped within 20 s")
                .expect("task")
                .expect("serve");
        });
    }
}

/// Publishes inputs `from..to` (key `n % KEYS`), each acknowledged; returns them in stream
/// order (one publisher awaiting every acknowledgement).
async fn produce(
    js: &jetstream::Context,
    opts: &KeyedOptions,
    from: u64,
    to: u64,
) -> Vec<FoldInput> {
    let mut out = Vec::new();
    for n in from..to {
        let input = FoldInput {
            key: (n % KEYS as u64) as u32,
            pad: 0,
            n,
            value: n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 7,
        };
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("in-{n}").as_str());
        // Retried while the server is away; the input stream de-duplicates by id.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let sent = js
                .publish_with_headers(
                    opts.subject_for_key(input.key),
                    h.clone(),
                    bytemuck::bytes_of(&input).to_vec().into(),
                )
                .await;
            let acked = match sent {
                Ok(f) => tokio::time::timeout(Duration::from_secs(2), f)
                    .await
                    .ok()
                    .and_then(|r| r.ok()),
                Err(_) => None,
            };
            if acked.is_some() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "input {n} not stored within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        out.push(input);
    }
    out
}

/// Every message of the output stream: (id, output).
async fn outputs(js: &jetstream::Context) -> Vec<(String, FoldOutput)> {
    let mut stream = js.get_stream("FOLD_OUT").await.expect("output stream");
    let total = stream.info().await.expect("info").state.messages;
    if total == 0 {
        return Vec::new();
    }
    let c = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            filter_subject: "fold.out".into(),
            inactive_threshold: Duration::from_secs(5),
            ..Default::default()
        })
        .await
        .expect("consumer");
    let mut msgs = c.messages().await.expect("messages");
    let mut out = Vec::new();
    while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_secs(2), msgs.next()).await {
        let id = m
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        let o: FoldOutput = bytemuck::pod_read_unaligned(&m.payload);
        out.push((id, o));
        if m.info().map(|i| i.pending == 0).unwrap_or(false) {
            break;
        }
    }
    out
}

/// Waits until the output stream holds an output for every one of `n` inputs.
async fn wait_outputs(
    js: &jetstream::Context,
    n: usize,
    within: Duration,
) -> Vec<(String, FoldOutput)> {
    let deadline = Instant::now() + within;
    loop {
        let outs = outputs(js).await;
        let distinct: std::collections::HashSet<&str> =
            outs.iter().map(|(i, _)| i.as_str()).collect();
        if distinct.len() >= n || Instant::now() > deadline {
            return outs;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks every input has exactly one distinct output with the replayed value, and the
/// checkpoints equal the replayed states. Returns the duplicates (same id, same value) seen.
async fn verify(js: &jetstream::Context, opts: &KeyedOptions, inputs: &[FoldInput]) -> usize {
    let outs = wait_outputs(js, inputs.len(), Duration::from_secs(30)).await;
    let mut states = vec![FoldState::default(); KEYS as usize];
    let mut expected = HashMap::new();
    for i in inputs {
        let s = &mut states[i.key as usize];
        fold::step(s, i.value);
        expected.insert(
            format!("in-{}", i.n),
            FoldOutput {
                key: i.key,
                pad: 0,
                n: i.n,
                state: *s,
            },
        );
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (id, o) in &outs {
        let want = expected
            .get(id)
            .unwrap_or_else(|| panic!("output for unknown input {id}"));
        assert_eq!(o, want, "output of {id}");
        *seen.entry(id.as_str()).or_default() += 1;
    }
    if seen.len() != inputs.len() {
        let mut by_partition = HashMap::<u32, (usize, u64, u64)>::new();
        for i in inputs {
            if !seen.contains_key(format!("in-{}", i.n).as_str()) {
                let e = by_partition
                    .entry(opts.partition_of(i.key))
                    .or_insert((0, u64::MAX, 0));
                e.0 += 1;
                e.1 = e.1.min(i.n);
                e.2 = e.2.max(i.n);
            }
        }
        panic!(
            "{} of {} inputs have no output; by partition (count, first, last): {by_partition:?}",
            inputs.len() - seen.len(),
            inputs.len()
        );
    }
    let dups = outs.len() - seen.len();
    // The checkpoints hold the replayed states once the workers stopped.
    let store = js.get_key_value("FOLD_STATE").await.expect("bucket");
    for p in 0..opts.partitions {
        let (cp, _) = read_checkpoint::<FoldState>(&store, opts, p)
            .await
            .expect("readable")
            .expect("a checkpoint");
        let want: Vec<FoldState> = opts.partition_keys(p).map(|k| states[k as usize]).collect();
        assert_eq!(cp.states, want, "partition {p}'s states");
    }
    dups
}

fn server(test: &str) -> Option<NatsServer> {
    NatsServer::start_or_skip(test)
}

#[test]
fn keyed_state_survives_a_killed_worker() {
    let Some(server) = server("keyed_state_survives_a_killed_worker") else {
        return;
    };
    let url = server.url();
    let a = Worker::start(&url, options("a"));
    let rt = runtime();
    rt.block_on(async {
        let client = connect_options().connect(&url).await.unwrap();
        let js = jetstream::new(client);
        let opts = options("test");
        let mut inputs = produce(&js, &opts, 0, 400).await;
        wait_outputs(&js, 400, T).await;
        // More inputs, and the worker killed while it serves them.
        let more = {
            let (js, opts) = (js.clone(), opts.clone());
            tokio::spawn(async move { produce(&js, &opts, 400, 800).await })
        };
        tokio::time::sleep(Duration::from_millis(150)).await;
        let a_stats = a.stats.clone();
        a.kill();
        inputs.extend(more.await.unwrap());
        // A new worker takes the partitions once the dead one's leases run out.
        let b = Worker::start(&url, options("b"));
        inputs.extend(produce(&js, &opts, 800, 1000).await);
        wait_outputs(&js, inputs.len(), Duration::from_secs(30)).await;
        let b_stats = b.stats.clone();
        tokio::task::block_in_place(|| b.stop());
        let dups = verify(&js, &opts, &inputs).await;
        let applied = a_stats.applied.load(Ordering::Relaxed) + b_stats.applied.load(Ordering::Relaxed);
        println!(
            "inputs {} applied {applied} restores {} duplicates stored {dups} duplicates dropped {}",
            inputs.len(),
            b_stats.restores.load(Ordering::Relaxed),
            b_stats.duplicates.load(Ordering::Relaxed)
        );
        assert!(b_stats.acquired.load(Ordering::Relaxed) >= 4, "b took every partition");
        assert!(b_stats.checkpoints.load(Ordering::Relaxed) > 0);
    });
}

#[test]
fn keyed_state_survives_a_server_restart_with_two_workers() {
    let Some(mut server) = server("keyed_state_survives_a_server_restart_with_two_workers") else {
        return;
    };
    let url = server.url();
    let mut oa = options("a");
    oa.preferred = Some(vec![0, 2]);
    let mut ob = options("b");
    ob.preferred = Some(vec![1, 3]);
    let a = Worker::start(&url, oa);
    let b = Worker::start(&url, ob);
    let rt = runtime();
    rt.block_on(async {
        let client = connect_options().connect(&url).await.unwrap();
        let js = jetstream::new(client);
        let opts = options("test");
        let mut inputs = produce(&js, &opts, 0, 300).await;
        let more = {
            let (js, opts) = (js.clone(), opts.clone());
            tokio::spawn(async move { produce(&js, &opts, 300, 900).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t0 = Instant::now();
        tokio::task::block_in_place(|| server.restart()).expect("restart");
        inputs.extend(more.await.unwrap());
        let produced_s = t0.elapsed().as_secs_f64();
        wait_outputs(&js, inputs.len(), Duration::from_secs(30)).await;
        let outputs_s = t0.elapsed().as_secs_f64();
        println!(
            "after the restart: inputs stored in {produced_s:.2} s, outputs in {outputs_s:.2} s"
        );
        // A restart costs a second or two, not a timeout per output whose ack was lost.
        assert!(
            outputs_s < produced_s + 15.0,
            "outputs {outputs_s:.1} s after the restart"
        );
        let (sa, sb) = (a.stats.clone(), b.stats.clone());
        println!("worker a: {sa:?}\nworker b: {sb:?}");
        tokio::task::block_in_place(|| {
            a.stop();
            b.stop();
        });
        let dups = verify(&js, &opts, &inputs).await;
        println!(
            "inputs {} applied {} duplicates stored {dups}",
            inputs.len(),
            sa.applied.load(Ordering::Relaxed) + sb.applied.load(Ordering::Relaxed)
        );
    });
}

#[test]
fn garbage_and_misrouted_inputs_are_dead_lettered_without_touching_state() {
    let Some(server) = server("garbage_and_misrouted_inputs_are_dead_lettered") else {
        return;
    };
    let url = server.url();
    let w = Worker::start(&url, options("w"));
    let rt = runtime();
    rt.block_on(async {
        let client = connect_options().connect(&url).await.unwrap();
        let js = jetstream::new(client);
        let opts = options("test");
        let mut inputs = produce(&js, &opts, 0, 50).await;
        // Wrong size, then key 1 on partition 0's subject, then a key out of range.
        for (i, (subject, payload)) in [
            (opts.partition_subject(0), b"garbage".to_vec()),
            (
                opts.partition_subject(0),
                bytemuck::bytes_of(&FoldInput {
                    key: 1,
                    pad: 0,
                    n: 9999,
                    value: 1,
                })
                .to_vec(),
            ),
            (
                opts.partition_subject(0),
                bytemuck::bytes_of(&FoldInput {
                    key: KEYS * 4,
                    pad: 0,
                    n: 9998,
                    value: 1,
                })
                .to_vec(),
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", format!("bad-{i}").as_str());
            js.publish_with_headers(subject, h, payload.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        inputs.extend(produce(&js, &opts, 50, 100).await);
        wait_outputs(&js, inputs.len(), T).await;
        let deadline = Instant::now() + T;
        while w.stats.dead_letters.load(Ordering::Relaxed) < 3 {
            assert!(Instant::now() < deadline, "3 dead letters within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::task::block_in_place(|| w.stop());
        assert_eq!(verify(&js, &opts, &inputs).await, 0);
        let mut dead = js.get_stream("FOLD_OUT").await.unwrap();
        let info = dead.info().await.unwrap();
        assert_eq!(info.state.messages, inputs.len() as u64 + 3);
    });
}
