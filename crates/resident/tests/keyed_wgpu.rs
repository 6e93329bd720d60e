//! Keyed kernels with a WGSL handler on wgpu (lavapipe in CI): the handler gets its key's state
//! as `ptr<function, KeyState>` (loaded and stored back by the key's leader), one invocation per message, per-key order kept on the
//! device (the first message of each key in a batch leads its key; no host-side ticket), the
//! states read back with `snapshot_key(s)`, 10^6 keys in one kernel, and terminate accounting
//! racing producers. Without an adapter the tests print `SKIP:` (and fail with
//! `RESIDENT_REQUIRE_WGPU=1`).

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

/// Plain loads and stores: the key's leader runs its messages one after another.
const WGSL_SRC: &str = r#"
fn handle(ks: ptr<function, KeyState>, input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    let p = input.producer & 3u;
    if (input.seq < (*ks).next[p]) { (*ks).out_of_order += 1u; }
    (*ks).next[p] = input.seq + 1u;
    (*ks).handled += 1u;
    (*ks).sum += input.value;
    (*out).key = input.key;
    (*out).producer = input.producer;
    (*out).seq = input.seq;
    (*out).value = (*ks).handled;
    return true;
}
"#;

const T: Duration = Duration::from_secs(120);
const PRODUCERS: u32 = 4;

fn zero() -> KState {
    bytemuck::Zeroable::zeroed()
}

fn handler() -> WgslHandler<KMsg, KMsg> {
    WgslHandler::new(WGSL_SRC).keyed("key")
}

fn kernel(id: &str, keys: u32) -> RingKernel<KMsg, KMsg, Keys<KState>> {
    RingKernel::<KMsg, KMsg>::new(id)
        .queue_size(4096)
        .keyed(keys, zero())
        .key_wgsl(handler())
}

/// The wgpu runtime, or `None` after a visible `SKIP:` line.
fn wgpu(test: &str) -> Option<Runtime> {
    match Runtime::builder().backend(Backend::Wgpu).build() {
        Ok(rt) => Some(rt),
        Err(e) => {
            if std::env::var("RESIDENT_REQUIRE_WGPU").as_deref() == Ok("1") {
                panic!("RESIDENT_REQUIRE_WGPU=1 but the wgpu backend is unavailable: {e}");
            }
            println!("SKIP: keyed_wgpu::{test}: wgpu unavailable: {e}");
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

fn order_case(rt: &Runtime, keys: u32, per: u32, batch: usize) {
    let h = rt
        .launch(
            kernel(&format!("order-{keys}"), keys)
                .batch_size(batch)
                .backpressure(Backpressure::Block(T)),
        )
        .unwrap();
    assert_eq!(
        h.placement(),
        Placement::Device(resident::backend::BackendKind::Wgpu)
    );
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

/// Few keys (one leader runs hundreds of messages of its key per batch) and many keys.
#[test]
fn per_key_order_on_wgpu_with_many_producers() {
    let Some(rt) = wgpu("per_key_order_on_wgpu_with_many_producers") else {
        return;
    };
    order_case(&rt, 3, 2000, 256);
    order_case(&rt, 5000, 3000, 1024);
}

#[test]
fn key_range_snapshots_and_bulk_init() {
    let Some(rt) = wgpu("key_range_snapshots_and_bulk_init") else {
        return;
    };
    let init: Vec<KState> = (0..100u32)
        .map(|k| KState {
            sum: k * 10,
            ..zero()
        })
        .collect();
    let h = rt
        .launch(
            RingKernel::<KMsg, KMsg>::new("range")
                .keyed_from(init)
                .key_wgsl(handler()),
        )
        .unwrap();
    h.activate().unwrap();
    let m = KMsg {
        key: 100,
        producer: 0,
        seq: 0,
        value: 1,
    };
    let e = h.send(m).unwrap_err();
    assert!(
        matches!(
            e,
            Error::KeyOutOfRange {
                key: 100,
                keys: 100,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.into_message::<KMsg>(), Some(m));
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
    // A plain CUDA handler on a keyed kernel is refused at launch, typed.
    let plain = RingKernel::<KMsg, KMsg>::new("plain")
        .keyed(4, zero())
        .wgsl(WgslHandler::new(WGSL_SRC));
    assert!(matches!(rt.launch(plain), Err(Error::InvalidConfig { .. })));
}

/// 10^6 keys of 32 bytes (32 MB of storage buffer) in one kernel; every 97th key gets a message.
#[test]
fn a_million_keys_on_wgpu() {
    let Some(rt) = wgpu("a_million_keys_on_wgpu") else {
        return;
    };
    let keys = 1_000_000u32;
    let h = rt.launch(kernel("million", keys)).unwrap();
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
#[test]
fn terminate_racing_producers_on_wgpu() {
    let Some(rt) = wgpu("terminate_racing_producers_on_wgpu") else {
        return;
    };
    for round in 0..3u32 {
        let h = rt
            .launch(
                RingKernel::<KMsg, KMsg>::new(format!("race-{round}"))
                    .queue_size(256)
                    .backpressure(Backpressure::Block(Duration::from_millis(1)))
                    .keyed(50, zero())
                    .key_wgsl(handler()),
            )
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
                            Err(e) => panic!("unexpected send error: {e}"),
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
