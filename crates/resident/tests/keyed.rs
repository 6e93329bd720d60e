//! Keyed kernels on the CPU engine: per-key order under many keys and many producers, the key
//! range checked at send, snapshots, bulk initialisation, lifecycle, terminate accounting racing
//! producers, a panicking and a stuck handler, and 10^6 keys in one kernel.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use resident::prelude::*;
use resident::runtime::keyed::MAX_SNAPSHOT_KEYS;

device_message! {
    /// A message for key `key`: the `seq`-th message `producer` sent to that key.
    #[derive(PartialEq, Eq)]
    pub struct KMsg { pub key: u32, pub producer: u32, pub seq: u32, pub value: u32 }
}

impl Keyed for KMsg {
    fn key(&self) -> u32 {
        self.key
    }
}

const PRODUCERS: usize = 4;
const T: Duration = Duration::from_secs(60);

/// Per-key state: the next sequence number expected from each producer, messages handled,
/// order violations seen, and a running sum of values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Track {
    next: [u32; PRODUCERS],
    handled: u32,
    out_of_order: u32,
    sum: u64,
}

/// Checks order per (key, producer): every message must carry exactly the next sequence
/// number that producer used for that key.
fn tracking(id: &str, keys: u32) -> RingKernel<KMsg, KMsg, Keys<Track>> {
    RingKernel::<KMsg, KMsg>::new(id)
        .queue_size(4096)
        .keyed(keys, Track::default())
        .key_handler(|ks: &mut KeyContext<Track>, m: KMsg| {
            let key = ks.key();
            let st = ks.state_mut();
            assert_eq!(key, m.key, "the handler sees the message's key");
            if m.seq < st.next[m.producer as usize] {
                st.out_of_order += 1;
            }
            st.next[m.producer as usize] = m.seq + 1;
            st.handled += 1;
            st.sum += m.value as u64;
            Some(KMsg {
                value: st.handled,
                ..m
            })
        })
}

fn rt() -> Runtime {
    Runtime::builder()
        .backend(Backend::Cpu)
        .enable_telemetry(true)
        .build()
        .unwrap()
}

/// xorshift: a different stream per producer, no dependency.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Producers send `per` messages each to random keys; returns, per producer, the messages it
/// sent to each key (count) — the expected `next` of every key.
fn produce(h: &KernelHandle<KMsg, KMsg>, keys: u32, per: u32) -> Vec<HashMap<u32, u32>> {
    let producers: Vec<_> = (0..PRODUCERS as u32)
        .map(|p| {
            let h = h.clone();
            thread::spawn(move || {
                let mut r = rng(p as u64 + 1);
                let mut next: HashMap<u32, u32> = HashMap::new();
                let mut batch = Vec::with_capacity(64);
                for i in 0..per {
                    let key = (r() % keys as u64) as u32;
                    let seq = next.entry(key).or_insert(0);
                    batch.push(KMsg {
                        key,
                        producer: p,
                        seq: *seq,
                        value: i % 7,
                    });
                    *seq += 1;
                    if batch.len() == 64 || i + 1 == per {
                        // Every other chunk one by one, to mix both send paths.
                        if i % 128 < 64 {
                            let mut sent = 0;
                            while sent < batch.len() {
                                sent += h.send_batch(&batch[sent..]).unwrap_or(0);
                            }
                        } else {
                            for m in &batch {
                                h.send(*m).unwrap();
                            }
                        }
                        batch.clear();
                    }
                }
                next
            })
        })
        .collect();
    producers.into_iter().map(|p| p.join().unwrap()).collect()
}

fn drain_outputs(h: &KernelHandle<KMsg, KMsg>, n: usize) -> Vec<KMsg> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        got.push(h.receive(T).unwrap());
        h.receive_batch(&mut got, 4096).unwrap();
    }
    got
}

fn check_order(h: &KernelHandle<KMsg, KMsg>, keys: u32, sent: &[HashMap<u32, u32>]) {
    let states: Vec<Track> = h.snapshot_keys(0..keys).unwrap();
    assert_eq!(states.len(), keys as usize);
    let mut total = 0u64;
    for (k, st) in states.iter().enumerate() {
        assert_eq!(
            st.out_of_order, 0,
            "key {k}: messages handled out of order: {st:?}"
        );
        for (p, s) in sent.iter().enumerate() {
            let want = s.get(&(k as u32)).copied().unwrap_or(0);
            assert_eq!(st.next[p], want, "key {k} producer {p}: {st:?}");
        }
        total += st.handled as u64;
    }
    let want: u64 = sent
        .iter()
        .flat_map(|s| s.values())
        .map(|&n| n as u64)
        .sum();
    assert_eq!(total, want);
}

#[test]
fn per_key_order_many_keys_many_producers() {
    let rt = rt();
    let keys = 10_000;
    for workers in [1, 2, 4] {
        let h = rt
            .launch(tracking(&format!("order-{workers}"), keys).workers(workers))
            .unwrap();
        h.activate().unwrap();
        let per = 25_000;
        let receiver = {
            let h = h.clone();
            thread::spawn(move || drain_outputs(&h, PRODUCERS * per as usize))
        };
        let sent = produce(&h, keys, per);
        let outs = receiver.join().unwrap();
        // Outputs of one key come out in that key's order: `value` counts the key's messages.
        let mut last: HashMap<u32, u32> = HashMap::new();
        for o in &outs {
            let l = last.entry(o.key).or_insert(0);
            assert_eq!(o.value, *l + 1, "key {}: outputs out of order", o.key);
            *l = o.value;
        }
        check_order(&h, keys, &sent);
        assert_eq!(
            h.telemetry().messages_processed,
            PRODUCERS as u64 * per as u64
        );
        let report = h.terminate().unwrap();
        assert!(report.failure.is_none());
        assert_eq!(report.returned(), 0);
    }
}

#[test]
fn priorities_keep_fifo_within_a_lane() {
    // Two lanes; per (key, lane) the order is the order sent; the high lane drains first.
    let rt = rt();
    let h = rt
        .launch(
            RingKernel::<KMsg, KMsg>::new("lanes")
                .priority_lanes(2)
                .keyed(8, Vec::<(u32, u32)>::new())
                .key_handler(|ks: &mut KeyContext<Vec<(u32, u32)>>, m: KMsg| {
                    ks.state_mut().push((m.producer, m.seq));
                    None
                }),
        )
        .unwrap();
    for seq in 0..200u32 {
        let lane = (seq / 8) % 2; // producer field names the lane
        let prio = if lane == 1 { 255 } else { 0 };
        h.send_with_priority(
            KMsg {
                key: seq % 8,
                producer: lane,
                seq,
                value: 0,
            },
            prio,
        )
        .unwrap();
    }
    h.activate().unwrap();
    h.drain(T).unwrap();
    let states: Vec<Vec<(u32, u32)>> = h.snapshot_keys(0..8).unwrap();
    for (k, st) in states.iter().enumerate() {
        assert_eq!(st.len(), 25, "key {k}");
        for lane in 0..2 {
            let seqs: Vec<u32> = st.iter().filter(|e| e.0 == lane).map(|e| e.1).collect();
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "key {k} lane {lane}: {seqs:?}"
            );
        }
        // Queued before activation: the whole high lane came first.
        let first_low = st.iter().position(|e| e.0 == 0).unwrap();
        assert!(st[first_low..].iter().all(|e| e.0 == 0), "key {k}: {st:?}");
    }
}

#[test]
fn key_out_of_range_is_refused_at_send() {
    let rt = rt();
    let h = rt.launch(tracking("range", 100)).unwrap();
    h.activate().unwrap();
    let bad = KMsg {
        key: 100,
        producer: 0,
        seq: 0,
        value: 9,
    };
    let e = h.send(bad).unwrap_err();
    assert!(
        matches!(
            e,
            Error::KeyOutOfRange {
                key: 100,
                keys: 100,
                op: "send",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.into_message::<KMsg>(),
        Some(bad),
        "the message comes back"
    );
    let e = h.call(bad, T).unwrap_err();
    assert!(
        matches!(e, Error::KeyOutOfRange { op: "call", .. }),
        "{e:?}"
    );
    let good = KMsg { key: 99, ..bad };
    let e = h.send_batch(&[good, good, bad]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::KeyOutOfRange {
                op: "send_batch",
                ..
            }
        ),
        "{e:?}"
    );
    let e = h
        .send(KMsg {
            key: u32::MAX,
            ..bad
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::KeyOutOfRange {
                key: 4294967295,
                ..
            }
        ),
        "{e:?}"
    );
    // Nothing of the refused sends was queued.
    assert_eq!(h.telemetry().messages_received, 0);
    assert_eq!(h.call(good, T).unwrap().value, 1);
    assert_eq!(h.telemetry().messages_received, 1);
    assert_eq!(h.snapshot_key::<Track>(99).unwrap().sum, 9);
}

#[test]
fn snapshots_are_checked_and_bounded() {
    let rt = rt();
    let keys = MAX_SNAPSHOT_KEYS + 10;
    let h = rt
        .launch(
            RingKernel::<KMsg, KMsg>::new("snap")
                .keyed(keys, 7u32)
                .key_handler(|ks: &mut KeyContext<u32>, m: KMsg| {
                    *ks.state_mut() += m.value;
                    None
                }),
        )
        .unwrap();
    h.activate().unwrap();
    h.send(KMsg {
        key: keys - 1,
        producer: 0,
        seq: 0,
        value: 5,
    })
    .unwrap();
    h.drain(T).unwrap();
    assert_eq!(h.snapshot_key::<u32>(keys - 1).unwrap(), 12);
    assert_eq!(h.snapshot_key::<u32>(0).unwrap(), 7);
    assert_eq!(
        h.snapshot_keys::<u32>(keys - 3..keys).unwrap(),
        vec![7, 7, 12]
    );
    assert_eq!(h.snapshot_keys::<u32>(5..5).unwrap(), Vec::<u32>::new());
    assert_eq!(
        h.snapshot_keys::<u32>(0..MAX_SNAPSHOT_KEYS).unwrap().len(),
        MAX_SNAPSHOT_KEYS as usize
    );
    let e = h
        .snapshot_keys::<u32>(0..MAX_SNAPSHOT_KEYS + 1)
        .unwrap_err();
    assert!(matches!(e, Error::KeyRangeTooLarge { .. }), "{e:?}");
    let e = h.snapshot_key::<u32>(keys).unwrap_err();
    assert!(
        matches!(
            e,
            Error::KeyOutOfRange {
                op: "snapshot_key",
                ..
            }
        ),
        "{e:?}"
    );
    let e = h.snapshot_keys::<u32>(keys - 1..keys + 1).unwrap_err();
    assert!(
        matches!(
            e,
            Error::KeyOutOfRange {
                op: "snapshot_keys",
                ..
            }
        ),
        "{e:?}"
    );
    let e = h.snapshot_key::<u64>(0).unwrap_err();
    assert!(
        matches!(e, Error::InvalidConfig { .. }),
        "wrong type: {e:?}"
    );
    // A kernel that is not keyed.
    let plain = rt
        .launch(RingKernel::<u32, u32>::new("plain").handler(|_: &mut Context<()>, x| Some(x)))
        .unwrap();
    let e = plain.snapshot_key::<u32>(0).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e:?}");
    // After terminate the last states stay readable.
    h.terminate().unwrap();
    assert_eq!(h.snapshot_key::<u32>(keys - 1).unwrap(), 12);
}

#[test]
fn bulk_initialisation_from_a_vec() {
    let rt = rt();
    let keys = 50_000u32;
    let init: Vec<u64> = (0..keys as u64).map(|k| k * 3).collect();
    let h = rt
        .launch(
            RingKernel::<KMsg, u64>::new("bulk")
                .keyed_from(init)
                .workers(3)
                .key_handler(|ks: &mut KeyContext<u64>, m: KMsg| {
                    *ks.state_mut() += m.value as u64;
                    Some(*ks.state())
                }),
        )
        .unwrap();
    h.activate().unwrap();
    let before: Vec<u64> = h.snapshot_keys(0..keys).unwrap();
    assert!(before.iter().enumerate().all(|(k, &v)| v == k as u64 * 3));
    for k in (0..keys).step_by(7) {
        assert_eq!(
            h.call(
                KMsg {
                    key: k,
                    producer: 0,
                    seq: 0,
                    value: 1
                },
                T
            )
            .unwrap(),
            k as u64 * 3 + 1
        );
    }
    let after: Vec<u64> = h.snapshot_keys(0..keys).unwrap();
    for (k, v) in after.iter().enumerate() {
        assert_eq!(*v, k as u64 * 3 + u64::from(k % 7 == 0), "key {k}");
    }
}

#[test]
fn invalid_keyed_configurations_are_typed_errors() {
    let rt = rt();
    let none = RingKernel::<KMsg, KMsg>::new("zero")
        .keyed_from(Vec::<u32>::new())
        .key_handler(|_: &mut KeyContext<u32>, _m: KMsg| None);
    assert!(matches!(rt.launch(none), Err(Error::InvalidConfig { .. })));
    let w0 = RingKernel::<KMsg, KMsg>::new("w0")
        .keyed(4, 0u32)
        .workers(0)
        .key_handler(|_: &mut KeyContext<u32>, _m: KMsg| None);
    assert!(matches!(rt.launch(w0), Err(Error::InvalidConfig { .. })));
    let nohandler = RingKernel::<KMsg, KMsg>::new("nh").keyed(4, 0u32);
    assert!(matches!(
        rt.launch(nohandler),
        Err(Error::InvalidConfig { .. })
    ));
    // More workers than keys: capped, still correct.
    let h = rt
        .launch(
            RingKernel::<KMsg, u32>::new("few")
                .keyed(2, 0u32)
                .workers(16)
                .key_handler(|ks: &mut KeyContext<u32>, _m: KMsg| {
                    *ks.state_mut() += 1;
                    Some(*ks.state())
                }),
        )
        .unwrap();
    h.activate().unwrap();
    let m = KMsg {
        key: 1,
        producer: 0,
        seq: 0,
        value: 0,
    };
    assert_eq!(h.call(m, T).unwrap(), 1);
    assert_eq!(h.call(m, T).unwrap(), 2);
}

#[test]
fn lifecycle_applies_to_every_shard() {
    let rt = rt();
    let keys = 1000;
    let h = rt.launch(tracking("life", keys).workers(4)).unwrap();
    // Launched, not active: queued, nothing handled.
    let msgs: Vec<KMsg> = (0..keys)
        .map(|k| KMsg {
            key: k,
            producer: 0,
            seq: 0,
            value: 1,
        })
        .collect();
    h.send_batch(&msgs).unwrap();
    thread::sleep(Duration::from_millis(50));
    assert_eq!(h.telemetry().messages_processed, 0);
    h.activate().unwrap();
    h.drain(T).unwrap();
    assert_eq!(h.telemetry().messages_processed, keys as u64);
    h.deactivate().unwrap();
    let more: Vec<KMsg> = msgs.iter().map(|m| KMsg { seq: 1, ..*m }).collect();
    h.send_batch(&more).unwrap();
    thread::sleep(Duration::from_millis(50));
    assert_eq!(
        h.telemetry().messages_processed,
        keys as u64,
        "inactive: no shard runs"
    );
    h.activate().unwrap();
    h.drain(T).unwrap();
    let st: Vec<Track> = h.snapshot_keys(0..keys).unwrap();
    assert!(st
        .iter()
        .all(|s| s.handled == 2 && s.out_of_order == 0 && s.next[0] == 2));
    let outs = drain_outputs(&h, 2 * keys as usize);
    assert_eq!(outs.len(), 2 * keys as usize);
}

/// Terminate while 4 producers send to random keys: every accepted message ends as exactly one
/// of received, in the report, or counted dropped.
#[test]
fn terminate_racing_producers_accounts_every_message() {
    for round in 0..12u32 {
        let rt = rt();
        let policy = [
            Backpressure::Block(Duration::from_millis(1)),
            Backpressure::Reject,
            Backpressure::DropOldest,
        ][round as usize % 3];
        let h = rt
            .launch(
                tracking(&format!("race-{round}"), 5000)
                    .queue_size(256)
                    .batch_size(64 + round as usize * 50)
                    .backpressure(policy)
                    .workers(1 + round as usize % 4),
            )
            .unwrap();
        h.activate().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..PRODUCERS as u32)
            .map(|p| {
                let (h, stop) = (h.clone(), stop.clone());
                thread::spawn(move || {
                    let mut r = rng(p as u64 + 17 * round as u64);
                    let mut ok = Vec::new();
                    let mut seq = 0u32;
                    while !stop.load(Ordering::Relaxed) && seq < 200_000 {
                        let key = (r() % 5000) as u32;
                        let m = KMsg {
                            key,
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
        thread::sleep(Duration::from_millis(5 + (round % 5) as u64 * 7));
        let report = if round % 2 == 0 {
            h.terminate().unwrap()
        } else {
            let _ = h.drain(Duration::from_millis(3));
            h.terminate().unwrap()
        };
        stop.store(true, Ordering::Relaxed);
        let sent: Vec<Vec<u32>> = producers.into_iter().map(|p| p.join().unwrap()).collect();
        let received = receiver.join().unwrap();
        let mut seen: HashSet<(u32, u32)> = HashSet::new();
        let mut once = |m: &KMsg, what: &str| {
            assert!(
                seen.insert((m.producer, m.seq)),
                "round {round}: {what} ({},{}) accounted twice",
                m.producer,
                m.seq
            );
        };
        for m in &received {
            once(m, "received");
        }
        for (_, m) in &report.unreceived {
            once(m, "unreceived");
        }
        for (_, m) in &report.undelivered {
            once(m, "undelivered");
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
            "round {round} ({policy:?}): {missing} of {total} accepted messages unaccounted"
        );
        assert_eq!(seen.len() as u64 + missing, total as u64);
        assert!(report.failure.is_none(), "{:?}", report.failure);
        // What was handled is what the states saw, and handled = received + unreceived.
        let st: Vec<Track> = h.snapshot_keys(0..5000).unwrap();
        let handled: u64 = st.iter().map(|s| s.handled as u64).sum();
        assert_eq!(handled, report.processed, "round {round}");
        // Under DropOldest the output queue may drop too (counted in `dropped`).
        let delivered = (received.len() + report.unreceived.len()) as u64;
        if matches!(policy, Backpressure::DropOldest) {
            assert!(handled >= delivered, "round {round}");
        } else {
            assert_eq!(handled, delivered, "round {round}");
        }
        assert!(st.iter().all(|s| s.out_of_order == 0));
    }
}

#[test]
fn a_panicking_handler_fails_the_kernel_and_loses_nothing() {
    let rt = rt();
    let h = rt
        .launch(
            RingKernel::<KMsg, KMsg>::new("panics")
                .queue_size(4096)
                .keyed(64, 0u32)
                .workers(4)
                .key_handler(|ks: &mut KeyContext<u32>, m: KMsg| {
                    if m.value == 0xFA17 {
                        panic!("bad reading");
                    }
                    *ks.state_mut() += 1;
                    Some(m)
                }),
        )
        .unwrap();
    let mut msgs: Vec<KMsg> = (0..2000u32)
        .map(|i| KMsg {
            key: i % 64,
            producer: 0,
            seq: i,
            value: 1,
        })
        .collect();
    msgs[1000].value = 0xFA17;
    assert_eq!(h.send_batch(&msgs).unwrap(), 2000);
    h.activate().unwrap();
    let mut got = Vec::new();
    while let Ok(m) = h.receive(Duration::from_secs(5)) {
        got.push(m);
    }
    let report = h.terminate().unwrap();
    let (failure, failed) = report.failure.clone().expect("failed");
    assert!(
        matches!(failure, Failure::HandlerPanicked { .. }),
        "{failure:?}"
    );
    assert_eq!(failed.unwrap().1.seq, 1000);
    let mut seen = HashSet::new();
    for m in got
        .iter()
        .chain(report.unreceived.iter().map(|x| &x.1))
        .chain(report.undelivered.iter().map(|x| &x.1))
    {
        assert!(seen.insert(m.seq), "{} twice", m.seq);
    }
    assert!(seen.insert(1000));
    assert_eq!(seen.len(), 2000, "every message accounted");
    assert_eq!(
        report.processed as usize,
        got.len() + report.unreceived.len()
    );
}

#[test]
fn a_stuck_handler_is_abandoned_with_its_whole_batch_reported() {
    let rt = rt();
    let release = Arc::new(AtomicBool::new(false));
    let r2 = release.clone();
    let h = rt
        .launch(
            RingKernel::<KMsg, KMsg>::new("stuck")
                .keyed(16, 0u32)
                .workers(2)
                .terminate_timeout(Duration::from_millis(300))
                .key_handler(move |ks: &mut KeyContext<u32>, m: KMsg| {
                    if m.value == 0xDEAD {
                        while !r2.load(Ordering::Acquire) {
                            thread::sleep(Duration::from_millis(1));
                        }
                    }
                    *ks.state_mut() += 1;
                    Some(m)
                }),
        )
        .unwrap();
    h.activate().unwrap();
    // A first batch that completes.
    for i in 0..10u32 {
        h.call(
            KMsg {
                key: i,
                producer: 0,
                seq: i,
                value: 1,
            },
            T,
        )
        .unwrap();
    }
    h.deactivate().unwrap();
    let batch: Vec<KMsg> = (10..40u32)
        .map(|i| KMsg {
            key: i % 16,
            producer: 0,
            seq: i,
            value: if i == 20 { 0xDEAD } else { 1 },
        })
        .collect();
    h.send_batch(&batch).unwrap();
    h.activate().unwrap();
    thread::sleep(Duration::from_millis(100));
    let snap = h.snapshot_key::<u32>(0);
    assert!(
        matches!(snap, Err(Error::Timeout { .. })),
        "a batch is in hand: {snap:?}"
    );
    let report = h.terminate().unwrap();
    let (failure, _) = report.failure.clone().expect("abandoned");
    assert!(matches!(failure, Failure::Abandoned { .. }), "{failure:?}");
    let mut seqs: Vec<u32> = report.undelivered.iter().map(|x| x.1.seq).collect();
    seqs.sort();
    assert_eq!(
        seqs,
        (10..40).collect::<Vec<_>>(),
        "the whole batch in hand is reported"
    );
    assert_eq!(report.processed, 10);
    release.store(true, Ordering::Release);
}

/// 10^6 keys in one kernel (8 bytes of state per key), every key touched.
#[test]
fn a_million_keys_in_one_kernel() {
    let rt = rt();
    let keys = 1_000_000u32;
    let h = rt
        .launch(
            RingKernel::<KMsg, KMsg>::new("million")
                .queue_size(8192)
                .keyed(keys, 0u64)
                .key_handler(|ks: &mut KeyContext<u64>, m: KMsg| {
                    *ks.state_mut() = *ks.state() * 31 + m.value as u64 + 1;
                    None
                }),
        )
        .unwrap();
    h.activate().unwrap();
    // Every key twice, in a scattered order (value = pass).
    let mut sent = 0;
    let mut chunk = Vec::with_capacity(4096);
    for pass in 0..2u32 {
        for i in 0..keys {
            let key = (i as u64 * 7_919 % keys as u64) as u32;
            chunk.push(KMsg {
                key,
                producer: 0,
                seq: pass,
                value: pass,
            });
            if chunk.len() == 4096 {
                let mut done = 0;
                while done < chunk.len() {
                    done += h.send_batch(&chunk[done..]).unwrap();
                }
                sent += chunk.len();
                chunk.clear();
            }
        }
    }
    let mut done = 0;
    while done < chunk.len() {
        done += h.send_batch(&chunk[done..]).unwrap();
    }
    sent += chunk.len();
    assert_eq!(sent, 2 * keys as usize);
    h.drain(T).unwrap();
    // In order per key: pass 0 then pass 1 gives (0*31 + 0 + 1) * 31 + 1 + 1 = 33.
    let st: Vec<u64> = h.snapshot_keys(0..keys).unwrap();
    assert!(
        st.iter().all(|&v| v == 33),
        "every key saw pass 0 then pass 1"
    );
    assert_eq!(h.telemetry().messages_processed, 2 * keys as u64);
}

/// `on_publish` is called once a batch's outputs are in the output queue (whoever it wakes
/// finds them there), and not for a batch that published nothing.
#[test]
fn on_publish_announces_each_published_batch() {
    let rt = rt();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let h = rt
        .launch(
            RingKernel::<KMsg, KMsg>::new("announce")
                .keyed(4, 0u32)
                .workers(2)
                .key_handler(|ks: &mut KeyContext<u32>, m: KMsg| {
                    *ks.state_mut() += 1;
                    (m.value != 0).then_some(m)
                })
                .on_publish(move || {
                    let _ = tx.send(());
                }),
        )
        .unwrap();
    h.activate().unwrap();
    let msg = |key, value| KMsg {
        key,
        producer: 0,
        seq: 0,
        value,
    };
    // A batch without outputs announces nothing.
    h.send(msg(1, 0)).unwrap();
    let t0 = std::time::Instant::now();
    while h.telemetry().messages_processed < 1 {
        assert!(t0.elapsed() < T, "the message was not processed");
        thread::sleep(Duration::from_millis(1));
    }
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    // One message per batch (the next is sent once the previous was announced): each
    // announcement finds its output already receivable.
    for key in 0..4 {
        h.send(msg(key, 1)).unwrap();
        rx.recv_timeout(T).expect("announced");
        let mut got = Vec::new();
        h.receive_batch(&mut got, 8).unwrap();
        assert_eq!(
            got,
            vec![msg(key, 1)],
            "the output is visible when announced"
        );
    }
    assert!(rx.try_recv().is_err(), "one announcement per batch");
    h.terminate().unwrap();
}

/// `on_take` is called once inputs left the input queue: a sender woken by it finds room. A
/// full queue of 4, filled before activation, is drained in batches; each call finds the
/// room its batch made.
#[test]
fn on_take_announces_room_in_the_input_queue() {
    let rt = rt();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let h = rt
        .launch(
            RingKernel::<KMsg, KMsg>::new("take_room")
                .queue_size(4)
                .keyed(4, 0u32)
                .workers(1)
                .key_handler(|ks: &mut KeyContext<u32>, _: KMsg| {
                    *ks.state_mut() += 1;
                    None
                })
                .on_take(move || {
                    let _ = tx.send(());
                }),
        )
        .unwrap();
    let msg = |seq| KMsg {
        key: seq % 4,
        producer: 0,
        seq,
        value: 0,
    };
    let cap = h.input_room();
    assert!(cap >= 1, "an empty queue has room");
    for seq in 0..cap as u32 {
        h.send(msg(seq)).unwrap();
    }
    assert_eq!(h.input_room(), 0, "full before activation");
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "nothing taken while inactive"
    );
    h.activate().unwrap();
    rx.recv_timeout(T).expect("announced after the take");
    assert!(h.input_room() >= 1, "the room is there when announced");
    let t0 = std::time::Instant::now();
    while h.telemetry().messages_processed < cap as u64 {
        assert!(t0.elapsed() < T, "not processed");
        thread::sleep(Duration::from_millis(1));
    }
    let calls = 1 + rx.try_iter().count();
    assert!(
        calls <= cap,
        "once per batch taken, not per message: {calls} calls for {cap} messages"
    );
    h.terminate().unwrap();
}

/// A batch with more outputs than the output queue holds: the outputs queued are announced
/// before the kernel waits for room, so a receiver woken only by the hook drains them.
#[test]
fn on_publish_announces_before_waiting_for_output_room() {
    let rt = rt();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let h = rt
        .launch(
            RingKernel::<KMsg, KMsg>::new("announce_full")
                .output_queue_size(2)
                .keyed(4, 0u32)
                .workers(1)
                .key_handler(|_: &mut KeyContext<u32>, m: KMsg| Some(m))
                .on_publish(move || {
                    let _ = tx.send(());
                }),
        )
        .unwrap();
    // Queued before activation: one batch of 8 outputs into a queue of 2.
    for seq in 0..8 {
        h.send(KMsg {
            key: seq % 4,
            producer: 0,
            seq,
            value: 1,
        })
        .unwrap();
    }
    h.activate().unwrap();
    let mut got = Vec::new();
    while got.len() < 8 {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("announced before waiting for room");
        h.receive_batch(&mut got, 8).unwrap();
    }
    let seqs: Vec<u32> = got.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (0..8).collect::<Vec<_>>());
    h.terminate().unwrap();
}
