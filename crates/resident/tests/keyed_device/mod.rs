//! The keyed-kernel tests shared by the device engines (`keyed_sim.rs` for CudaSim,
//! `keyed_wgpu.rs` for wgpu): per-key order with many producers, the key range, snapshots and
//! bulk initialisation, 10^6 keys in one kernel, and terminate racing producers. Each engine
//! file gives its handler source and an [`Engine`]; the tests are written once, here.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use resident::prelude::*;

device_message! {
    /// The `seq`-th message `producer` sent to key `key`.
    #[derive(PartialEq, Eq)]
    pub struct KMsg { pub key: u32, pub producer: u32, pub seq: u32, pub value: u32 }
}

impl Keyed for KMsg {
    fn key(&self) -> u32 {
        self.key
    }
}

device_message! {
    /// Per-key state (32 bytes): next sequence number per producer, messages handled, order
    /// violations seen, sum of values.
    pub struct KState { pub next: [u32; 4], pub handled: u32, pub out_of_order: u32, pub sum: u32, pub pad: u32 }
}

/// What a device engine's test file supplies.
pub struct Engine {
    /// The test file (for `SKIP:` lines).
    pub file: &'static str,
    /// The engine's name in messages.
    pub label: &'static str,
    /// The backend.
    pub backend: Backend,
    /// Where its kernels run.
    pub kind: resident::backend::BackendKind,
    /// The variable that turns a missing engine from a skip into a failure.
    pub require: &'static str,
    /// Gives a keyed kernel the engine's keyed handler.
    pub keyed: fn(RingKernel<KMsg, KMsg, Keys<KState>>) -> RingKernel<KMsg, KMsg, Keys<KState>>,
    /// Gives a keyed kernel a plain (not keyed) device handler: refused at launch.
    pub plain: fn(RingKernel<KMsg, KMsg, Keys<KState>>) -> RingKernel<KMsg, KMsg, Keys<KState>>,
    /// Batch size of the few-keys order case (CudaSim's barrier is one of OS threads).
    pub few_keys_batch: usize,
}

pub const T: Duration = Duration::from_secs(120);
const PRODUCERS: u32 = 4;

fn zero() -> KState {
    bytemuck::Zeroable::zeroed()
}

/// A keyed kernel of `keys` keys with the engine's handler.
pub fn kernel(e: &Engine, id: &str, keys: u32) -> RingKernel<KMsg, KMsg, Keys<KState>> {
    (e.keyed)(
        RingKernel::<KMsg, KMsg>::new(id)
            .queue_size(4096)
            .keyed(keys, zero()),
    )
}

/// The engine's runtime, or `None` after a visible `SKIP:` line.
pub fn runtime(e: &Engine, test: &str) -> Option<Runtime> {
    match Runtime::builder().backend(e.backend).build() {
        Ok(rt) => Some(rt),
        Err(err) => {
            if std::env::var(e.require).as_deref() == Ok("1") {
                panic!("{}=1 but {} is unavailable: {err}", e.require, e.label);
            }
            println!("SKIP: {}::{test}: {} unavailable: {err}", e.file, e.label);
            None
        }
    }
}

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// `PRODUCERS` threads send `per` messages each to random keys of `0..keys`; returns per
/// producer the messages it sent to each key.
fn produce(h: &KernelHandle<KMsg, KMsg>, keys: u32, per: u32) -> Vec<HashMap<u32, u32>> {
    let ps: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let h = h.clone();
            thread::spawn(move || {
                let mut r = rng(p as u64 + 3);
                let mut next: HashMap<u32, u32> = HashMap::new();
                for i in 0..per {
                    let key = (r() % keys as u64) as u32;
                    let seq = next.entry(key).or_insert(0);
                    h.send(KMsg {
                        key,
                        producer: p,
                        seq: *seq,
                        value: i % 5,
                    })
                    .unwrap();
                    *seq += 1;
                }
                next
            })
        })
        .collect();
    ps.into_iter().map(|p| p.join().unwrap()).collect()
}

fn order_case(e: &Engine, rt: &Runtime, keys: u32, per: u32, batch: usize) {
    let h = rt
        .launch(
            kernel(e, &format!("order-{keys}"), keys)
                .batch_size(batch)
                .backpressure(Backpressure::Block(T)),
        )
        .unwrap();
    assert_eq!(h.placement(), Placement::Device(e.kind));
    h.activate().unwrap();
    let total = (PRODUCERS * per) as usize;
    let receiver = {
        let h = h.clone();
        thread::spawn(move || {
            let mut got = Vec::with_capacity(total);
            while got.len() < total {
                got.push(h.receive(T).unwrap());
                h.receive_batch(&mut got, 4096).unwrap();
            }
            got
        })
    };
    let sent = produce(&h, keys, per);
    let outs = receiver.join().unwrap();
    // A key's outputs come out in its order: `value` counts the key's messages.
    let mut last: HashMap<u32, u32> = HashMap::new();
    for o in &outs {
        let l = last.entry(o.key).or_insert(0);
        assert_eq!(o.value, *l + 1, "key {}: outputs out of order", o.key);
        *l = o.value;
    }
    let states: Vec<KState> = h.snapshot_keys(0..keys).unwrap();
    let mut handled = 0u64;
    for (k, st) in states.iter().enumerate() {
        assert_eq!(
            st.out_of_order, 0,
            "key {k}: out of order on the device: {st:?}"
        );
        for (p, s) in sent.iter().enumerate() {
            assert_eq!(
                st.next[p],
                s.get(&(k as u32)).copied().unwrap_or(0),
                "key {k} producer {p}"
            );
        }
        handled += st.handled as u64;
    }
    assert_eq!(handled, total as u64);
    let report = h.terminate().unwrap();
    assert!(report.failure.is_none(), "{:?}", report.failure);
    assert_eq!(report.returned(), 0);
}

/// Few keys (many messages of one key in every batch, in batches of `e.few_keys_batch`) and
/// many keys (full batches).
pub fn per_key_order_with_many_producers(e: &Engine, test: &str) {
    let Some(rt) = runtime(e, test) else {
        return;
    };
    order_case(e, &rt, 3, 2000, e.few_keys_batch);
    order_case(e, &rt, 5000, 3000, 1024);
}

/// Key out of range at send, snapshots of one key and of a range, bulk initialisation, and a
/// plain (not keyed) handler refused at launch.
pub fn key_range_snapshots_and_bulk_init(e: &Engine, test: &str) {
    let Some(rt) = runtime(e, test) else {
        return;
    };
    let init: Vec<KState> = (0..100u32)
        .map(|k| KState {
            sum: k * 10,
            ..zero()
        })
        .collect();
    let h = rt
        .launch((e.keyed)(
            RingKernel::<KMsg, KMsg>::new("range").keyed_from(init),
        ))
        .unwrap();
    h.activate().unwrap();
    let m = KMsg {
        key: 100,
        producer: 0,
        seq: 0,
        value: 1,
    };
    let err = h.send(m).unwrap_err();
    assert!(
        matches!(
            err,
            Error::KeyOutOfRange {
                key: 100,
                keys: 100,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.into_message::<KMsg>(), Some(m));
    let r = h.call(KMsg { key: 42, ..m }, T).unwrap();
    assert_eq!((r.key, r.value), (42, 1));
    assert_eq!(h.snapshot_key::<KState>(42).unwrap().sum, 421);
    assert_eq!(h.snapshot_key::<KState>(41).unwrap().sum, 410);
    let all: Vec<KState> = h.snapshot_keys(0..100).unwrap();
    assert!(all
        .iter()
        .enumerate()
        .all(|(k, s)| s.sum == k as u32 * 10 + u32::from(k == 42)));
    assert!(matches!(
        h.snapshot_key::<KState>(100),
        Err(Error::KeyOutOfRange { .. })
    ));
    assert_eq!(
        h.telemetry().messages_received,
        1,
        "the refused send queued nothing"
    );
    // A plain (not keyed) device handler on a keyed kernel is refused at launch, typed.
    let plain = (e.plain)(RingKernel::<KMsg, KMsg>::new("plain").keyed(4, zero()));
    assert!(matches!(rt.launch(plain), Err(Error::InvalidConfig { .. })));
}

/// 10^6 keys of 32 bytes (32 MB of device memory) in one kernel; every 97th key gets a message.
pub fn a_million_keys(e: &Engine, test: &str) {
    let Some(rt) = runtime(e, test) else {
        return;
    };
    let keys = 1_000_000u32;
    let h = rt.launch(kernel(e, "million", keys)).unwrap();
    h.activate().unwrap();
    let msgs: Vec<KMsg> = (0..keys)
        .step_by(97)
        .map(|k| KMsg {
            key: k,
            producer: 1,
            seq: 0,
            value: 3,
        })
        .collect();
    let mut sent = 0;
    while sent < msgs.len() {
        sent += h.send_batch(&msgs[sent..]).unwrap();
    }
    let mut got = 0;
    while got < msgs.len() {
        h.receive(T).unwrap();
        got += 1;
    }
    let st: Vec<KState> = h.snapshot_keys(0..keys).unwrap();
    for (k, s) in st.iter().enumerate() {
        let hit = k % 97 == 0;
        assert_eq!(s.handled, u32::from(hit), "key {k}");
        assert_eq!(s.sum, if hit { 3 } else { 0 }, "key {k}");
    }
}

/// Terminate while producers send: every accepted message is received, in the report, or
/// counted dropped.
pub fn terminate_racing_producers(e: &Engine, test: &str) {
    let Some(rt) = runtime(e, test) else {
        return;
    };
    for round in 0..3u32 {
        let h = rt
            .launch((e.keyed)(
                RingKernel::<KMsg, KMsg>::new(format!("race-{round}"))
                    .queue_size(256)
                    .backpressure(Backpressure::Block(Duration::from_millis(1)))
                    .keyed(50, zero()),
            ))
            .unwrap();
        h.activate().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (h, stop) = (h.clone(), stop.clone());
                thread::spawn(move || {
                    let mut r = rng(p as u64 + 11 * round as u64);
                    let mut ok = Vec::new();
                    let mut seq = 0u32;
                    while !stop.load(Ordering::Relaxed) && seq < 100_000 {
                        let m = KMsg {
                            key: (r() % 50) as u32,
                            producer: p,
                            seq,
                            value: 1,
                        };
                        match h.send(m) {
                            Ok(_) => ok.push(seq),
                            Err(Error::NotAccepting { .. }) => break,
                            Err(Error::QueueFull { .. } | Error::Timeout { .. }) => {}
                            Err(err) => panic!("unexpected send error: {err}"),
                        }
                        seq += 1;
                    }
                    ok
                })
            })
            .collect();
        let receiver = {
            let h = h.clone();
            thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    match h.receive(Duration::from_millis(20)) {
                        Ok(m) => got.push(m),
                        Err(Error::Timeout { .. }) => continue,
                        Err(_) => break,
                    }
                }
                got
            })
        };
        thread::sleep(Duration::from_millis(200 + 100 * round as u64));
        let report = h.terminate().unwrap();
        stop.store(true, Ordering::Relaxed);
        let sent: Vec<Vec<u32>> = producers.into_iter().map(|p| p.join().unwrap()).collect();
        let received = receiver.join().unwrap();
        let mut seen: HashSet<(u32, u32)> = HashSet::new();
        for m in received
            .iter()
            .chain(report.unreceived.iter().map(|x| &x.1))
            .chain(report.undelivered.iter().map(|x| &x.1))
        {
            assert!(
                seen.insert((m.producer, m.seq)),
                "round {round}: ({},{}) twice",
                m.producer,
                m.seq
            );
        }
        let total: usize = sent.iter().map(Vec::len).sum();
        let missing = sent
            .iter()
            .enumerate()
            .flat_map(|(p, s)| s.iter().map(move |&q| (p as u32, q)))
            .filter(|pq| !seen.contains(pq))
            .count() as u64;
        assert_eq!(
            missing, report.dropped,
            "round {round}: {missing} of {total} unaccounted"
        );
        assert!(report.failure.is_none(), "{:?}", report.failure);
        assert!(total > 0);
    }
}
