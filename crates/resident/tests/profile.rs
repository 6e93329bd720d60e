//! The profiler through the public API: spans and totals of a real kernel, the Chrome trace's
//! structure, `tracing` events and batch spans seen by a subscriber, and the cost when off.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use resident::backend;
use resident::prelude::*;
use resident::profile::{Bottleneck, SpanKind};

fn run_some(p: &Profiler, id: &str, n: u32) {
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .profiler(p.clone())
        .build()
        .unwrap();
    let k = rt
        .launch(RingKernel::<u32, u32>::new(id).handler(|_, x: u32| Some(x + 1)))
        .unwrap();
    k.activate().unwrap();
    for i in 0..n {
        assert_eq!(k.call(i, Duration::from_secs(10)).unwrap(), i + 1);
    }
    k.terminate().unwrap();
}

#[test]
fn report_counts_every_message_and_fractions_sum_to_one() {
    let p = Profiler::new();
    run_some(&p, "count", 500);
    let r = p.report();
    assert_eq!(r.figures.messages, 500);
    assert!(r.figures.batches >= 1 && r.figures.batches <= 500);
    let sum: f64 = r.fractions.values().sum();
    assert!((sum - 1.0).abs() < 1e-9, "fractions sum to {sum}");
    let keys: Vec<&str> = r.fractions.keys().map(|s| s.as_str()).collect();
    assert_eq!(
        keys,
        ["handler", "launch", "queue", "transfer", "utilization"]
    );
    assert_eq!(r.kernels.len(), 1);
    assert_eq!(r.kernels[0].name, "count");
    assert!(!r.remedy.is_empty());
    // The JSON carries the contract's field names and a lowercase bottleneck.
    let v = serde_json::to_value(&r).unwrap();
    let b = v["bottleneck"].as_str().unwrap();
    assert!(["transfer", "launch", "utilization", "queue", "handler"].contains(&b));
    assert!(v["fractions"].is_object() && v["remedy"].is_string());
    // Batch spans in the ring add up to the messages.
    let batch_msgs: u64 = p
        .spans()
        .iter()
        .filter(|s| s.kind == SpanKind::Batch)
        .map(|s| s.a)
        .sum();
    assert_eq!(batch_msgs, 500);
}

#[test]
fn a_paused_profiler_or_none_records_nothing() {
    let p = Profiler::new();
    p.set_enabled(false);
    run_some(&p, "paused", 50);
    assert_eq!(p.report().figures.messages, 0);
    assert!(p.spans().iter().all(|s| s.kind == SpanKind::Setup));
    // Off by default: a runtime without a profiler has none.
    let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    assert!(rt.profiler().is_none());
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .enable_profiling(true)
        .build()
        .unwrap();
    assert!(rt.profiler().is_some_and(|p| p.is_enabled()));
}

#[test]
fn copies_and_one_shot_launches_are_recorded_on_the_device_track() {
    let p = Profiler::new();
    let d = backend::open(Backend::Cpu).unwrap();
    let mut mem = d.alloc(1 << 20).unwrap();
    let mut host = vec![7u8; 1 << 20];
    d.copy_to_device(&mut mem, &host).unwrap();
    d.copy_to_host(&mut host, &mem).unwrap();
    let k = resident::Kernel::new("fill").cpu(|t| t.output::<u32>(0)?.set(t.index() as u32));
    let cfg = resident::LaunchConfig::for_elements(1024);
    let mut out = d.alloc(cfg.index_space() as usize * 4).unwrap();
    d.launch(&k, cfg, &[resident::KernelArg::buffer_mut(&mut out)], None)
        .unwrap();
    let mut back = vec![0u8; out.len()];
    d.copy_to_host(&mut back, &out).unwrap();
    assert_eq!(&back[4..8], &1u32.to_ne_bytes()); // the instrumented launch really ran
    let r = p.report();
    let dev = r
        .devices
        .iter()
        .find(|t| t.name == "cpu")
        .expect("cpu device track");
    // Other tests may copy concurrently (device spans are process-wide): at least ours.
    assert!(dev.figures.bytes_to_device >= 1 << 20);
    assert!(dev.figures.bytes_to_host >= (1 << 20) + out.len() as u64);
    assert!(dev.figures.launches >= 1);
    let kinds: HashSet<SpanKind> = p.spans().iter().map(|s| s.kind).collect();
    for k in [
        SpanKind::ToDevice,
        SpanKind::ToHost,
        SpanKind::Launch,
        SpanKind::Compute,
    ] {
        assert!(kinds.contains(&k), "no {k:?} span");
    }
}

#[test]
fn chrome_trace_has_tracks_spans_and_paired_flows() {
    let p = Profiler::new();
    run_some(&p, "alpha", 200);
    run_some(&p, "beta", 100);
    let path = std::env::temp_dir().join(format!("resident-trace-{}.json", std::process::id()));
    p.write_chrome_trace(&path).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let ev = v["traceEvents"].as_array().expect("traceEvents array");
    let mut names: HashMap<(u64, u64), String> = HashMap::new();
    let mut procs: HashMap<u64, String> = HashMap::new();
    let mut flows: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    let mut complete = 0;
    for e in ev {
        let ph = e["ph"].as_str().expect("ph is a string");
        let pid = e["pid"].as_u64().expect("pid is an integer");
        let tid = e["tid"].as_u64().expect("tid is an integer");
        assert!(e["name"].is_string());
        match ph {
            "M" => {
                let n = e["args"]["name"].as_str().map(str::to_string);
                match e["name"].as_str().unwrap() {
                    "process_name" => {
                        procs.insert(pid, n.unwrap());
                    }
                    "thread_name" => {
                        names.insert((pid, tid), n.unwrap());
                    }
                    _ => {}
                }
            }
            "X" => {
                complete += 1;
                assert!(e["ts"].is_number() && e["dur"].is_number());
                assert!(e["dur"].as_f64().unwrap() >= 0.0);
                assert!(names.contains_key(&(pid, tid)), "span on an unnamed track");
            }
            "s" | "f" => {
                assert!(e["ts"].is_number());
                let id = e["id"].as_u64().unwrap();
                let f = flows.entry(id).or_default();
                if ph == "s" {
                    f.0 += 1;
                } else {
                    assert_eq!(e["bp"], "e");
                    f.1 += 1;
                }
            }
            other => panic!("unexpected phase {other}"),
        }
    }
    assert!(complete > 0);
    assert_eq!(procs.get(&1).map(String::as_str), Some("resident kernels"));
    assert_eq!(procs.get(&2).map(String::as_str), Some("resident devices"));
    let tracks: HashSet<&str> = names.values().map(String::as_str).collect();
    for t in [
        "kernel alpha",
        "kernel alpha queue",
        "kernel beta",
        "kernel beta queue",
    ] {
        assert!(tracks.contains(t), "track {t} missing: {tracks:?}");
    }
    assert!(!flows.is_empty(), "no flow arrows");
    assert!(
        flows.values().all(|&(s, f)| s == 1 && f == 1),
        "unpaired flows"
    );
}

#[test]
fn a_report_with_nothing_recorded_is_all_idle() {
    let p = Profiler::with_capacity(16);
    p.set_enabled(false);
    let r = p.report();
    assert_eq!(r.bottleneck, Bottleneck::Utilization);
    assert_eq!(r.fractions.values().sum::<f64>(), 1.0);
}

/// A subscriber that keeps every event's target and fields, and every span's name.
#[derive(Default, Clone)]
struct Capture {
    events: Arc<Mutex<Vec<(String, String)>>>,
    spans: Arc<Mutex<Vec<String>>>,
}

struct Fields(String);
impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        self.0 += &format!("{}={:?} ", f.name(), v);
    }
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        self.0 += &format!("{}={} ", f.name(), v);
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut f = Fields(String::new());
        e.record(&mut f);
        self.events
            .lock()
            .unwrap()
            .push((e.metadata().target().to_string(), f.0));
    }
    fn on_new_span(
        &self,
        a: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut f = Fields(String::new());
        a.record(&mut f);
        self.spans
            .lock()
            .unwrap()
            .push(format!("{} {}", a.metadata().name(), f.0));
    }
}

#[test]
fn tracing_subscribers_see_lifecycle_faults_refusals_drops_and_batches() {
    use tracing_subscriber::layer::SubscriberExt;
    let cap = Capture::default();
    let subscriber = tracing_subscriber::registry().with(cap.clone());
    // Kernel threads are other threads: install globally (this is the only test here that does).
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let k = rt
        .launch(
            RingKernel::<u32, u32>::new("traced")
                .queue_size(2)
                .priority_lanes(1)
                .backpressure(Backpressure::Reject)
                .handler(|_, x: u32| {
                    if x == 99 {
                        panic!("boom");
                    }
                    Some(x)
                }),
        )
        .unwrap();
    // Not active yet: the queue (2) fills and the third send is refused.
    k.send(1).unwrap();
    k.send(2).unwrap();
    assert!(k.send(3).is_err());
    k.activate().unwrap();
    assert_eq!(k.receive(Duration::from_secs(5)).unwrap(), 1);
    k.deactivate().unwrap();
    k.activate().unwrap();
    k.send(99).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !matches!(k.state(), KernelState::Failed(_)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = k.terminate();
    // A drop policy: the third send is dropped (counted), and said so.
    let d = rt
        .launch(
            RingKernel::<u32, u32>::new("dropping")
                .queue_size(2)
                .priority_lanes(1)
                .backpressure(Backpressure::DropNewest)
                .handler(|_, x: u32| Some(x)),
        )
        .unwrap();
    for i in 0..3 {
        d.send(i).unwrap();
    }
    assert_eq!(d.telemetry().messages_dropped, 1);
    let events = cap.events.lock().unwrap().clone();
    assert!(events.iter().any(|(t, f)| t == "resident::dropped"
        && f.contains("kernel=dropping")
        && f.contains("policy=DropNewest")));
    let has = |target: &str, needle: &str| {
        events
            .iter()
            .any(|(t, f)| t == target && f.contains("kernel=traced") && f.contains(needle))
    };
    assert!(has("resident::lifecycle", "op=launch"), "{events:?}");
    assert!(has("resident::lifecycle", "op=activate"));
    assert!(has("resident::lifecycle", "op=deactivate"));
    assert!(has("resident::lifecycle", "op=terminate"));
    assert!(has("resident::refused", "why=full"));
    assert!(has("resident::fault", "boom"));
    let spans = cap.spans.lock().unwrap().clone();
    assert!(
        spans
            .iter()
            .any(|s| s.starts_with("batch ") && s.contains("kernel=traced")),
        "{spans:?}"
    );
}

resident::ring::device_message! {
    /// A device message for the pump test.
    pub struct Num { pub v: u32, pub pad: u32 }
}

/// A device-hosted kernel (CudaSim runs the CUDA source over the same queue memory): the
/// pump's pushes and pulls are recorded as transfers, each message's queue wait ends at its push.
#[cfg(feature = "cudasim")]
#[test]
fn device_pump_pushes_and_pulls_are_recorded() {
    let p = Profiler::new();
    let rt = match Runtime::builder()
        .backend(Backend::CudaSim)
        .profiler(p.clone())
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            println!("SKIP: device_pump_pushes_and_pulls_are_recorded: CudaSim: {e}");
            return;
        }
    };
    let src = "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, \
               const Envelope* env) { out->v = in->v + 1; return true; }";
    let k = rt
        .launch(RingKernel::<Num, Num>::new("pumped").cuda(CudaHandler::new(src)))
        .unwrap();
    k.activate().unwrap();
    for i in 0..200 {
        let r = k
            .call(Num { v: i, pad: 0 }, Duration::from_secs(10))
            .unwrap();
        assert_eq!(r.v, i + 1);
    }
    k.terminate().unwrap();
    let r = p.report();
    let t = r.kernels.iter().find(|t| t.name == "pumped").unwrap();
    assert_eq!(t.figures.messages, 200);
    let slot = 32 + std::mem::size_of::<Num>() as u64; // envelope + payload
    assert_eq!(t.figures.bytes_to_device, 200 * slot);
    assert_eq!(t.figures.bytes_to_host, 200 * slot);
    let kinds: HashSet<SpanKind> = p.spans().iter().map(|s| s.kind).collect();
    assert!(kinds.contains(&SpanKind::DevicePush) && kinds.contains(&SpanKind::DevicePull));
    assert!((r.fractions.values().sum::<f64>() - 1.0).abs() < 1e-9);
}
