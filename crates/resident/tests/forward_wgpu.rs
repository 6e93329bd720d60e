//! `RingKernel::forward_to` between two WGSL ring kernels on wgpu (lavapipe in CI): the
//! producer's batches and the consumer's dispatch over their outputs go to the device in one
//! submission, the producer's outputs are not read back. Checked here: order and checksums
//! through the chain with `forwarded_on_device` counted at the consumer, either launch order,
//! the host relay (`ForwardPath::HostRelay`) giving the same results, backpressure from a consumer
//! that takes nothing, and terminate racing forwarded messages with every accepted message
//! accounted for exactly once. Without an adapter each test prints `SKIP:` and returns, unless
//! `RESIDENT_REQUIRE_WGPU=1`, then it fails.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use resident::prelude::*;

device_message! {
    /// What the host sends to the producer.
    pub struct Reading { pub seq: u32, pub value: u32 }
}
device_message! {
    /// The producer's output, the consumer's input.
    #[derive(PartialEq)]
    pub struct Scaled { pub seq: u32, pub value: u32 }
}
device_message! {
    /// The consumer's output.
    #[derive(PartialEq)]
    pub struct Checked { pub seq: u32, pub value: u32, pub check: u32, pub pad: u32 }
}
device_message! {
    /// Both kernels' device state.
    pub struct Counts { pub count: u32, pub sum: u32 }
}

/// Drops every reading with `seq % 7 == 3` (no output: the consumer must not see it).
const PRODUCER: &str = r#"
fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    atomicAdd(&state.count, 1u);
    if (input.seq % 7u == 3u) { return false; }
    (*out).seq = input.seq;
    (*out).value = input.value * 3u + 1u;
    return true;
}
"#;

const CONSUMER: &str = r#"
fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    atomicAdd(&state.count, 1u);
    atomicAdd(&state.sum, input.value);
    (*out).seq = input.seq;
    (*out).value = input.value;
    (*out).check = (input.seq * 2654435761u) ^ input.value;
    (*out).pad = 0u;
    return true;
}
"#;

const T: Duration = Duration::from_secs(30);
const ZERO: Counts = Counts { count: 0, sum: 0 };

fn require() -> bool {
    std::env::var("RESIDENT_REQUIRE_WGPU").as_deref() == Ok("1")
}

fn wgpu_runtime(test: &str) -> Option<Runtime> {
    match Runtime::builder()
        .backend(Backend::Wgpu)
        .enable_telemetry(true)
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            if require() {
                panic!("RESIDENT_REQUIRE_WGPU=1 but the wgpu backend is unavailable: {e}");
            }
            println!("SKIP: {test}: {e}");
            None
        }
    }
}

fn producer(id: &str, target: &str) -> RingKernel<Reading, Scaled> {
    RingKernel::<Reading, Scaled>::new(id)
        .queue_size(1024)
        .batch_size(128)
        .forward_to(target)
        .wgsl(WgslHandler::new(PRODUCER).state(ZERO))
}

fn consumer(id: &str) -> RingKernel<Scaled, Checked> {
    RingKernel::<Scaled, Checked>::new(id)
        .queue_size(1024)
        .batch_size(128)
        .wgsl(WgslHandler::new(CONSUMER).state(ZERO))
}

fn reading(seq: u32) -> Reading {
    Reading {
        seq,
        value: seq.wrapping_mul(7).wrapping_add(11),
    }
}

fn forwarded(seq: u32) -> bool {
    seq % 7 != 3
}

/// The consumer's output for `seq`, as the two handlers compute it.
fn expected(seq: u32) -> Checked {
    let value = reading(seq).value.wrapping_mul(3).wrapping_add(1);
    Checked {
        seq,
        value,
        check: seq.wrapping_mul(2654435761) ^ value,
        pad: 0,
    }
}

/// Sends `0..n` to `p` while receiving from `c`; returns what `c` answered, in order.
fn run_chain(
    p: &KernelHandle<Reading, Scaled>,
    c: &KernelHandle<Scaled, Checked>,
    n: u32,
) -> Vec<Checked> {
    let want = (0..n).filter(|&s| forwarded(s)).count();
    let sender = {
        let p = p.clone();
        std::thread::spawn(move || {
            for s in 0..n {
                p.send(reading(s)).unwrap();
            }
        })
    };
    let mut got = Vec::with_capacity(want);
    while got.len() < want {
        got.push(c.receive(T).expect("every forwarded reading arrives"));
    }
    sender.join().unwrap();
    got
}

fn check_chain(got: &[Checked], n: u32) {
    let want: Vec<Checked> = (0..n).filter(|&s| forwarded(s)).map(expected).collect();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w, "out of order or wrong checksum");
    }
}

#[test]
fn a_chain_runs_on_the_device_in_order() {
    let Some(rt) = wgpu_runtime("a_chain_runs_on_the_device_in_order") else {
        return;
    };
    const N: u32 = 20_000;
    let c = rt.launch(consumer("consumer")).unwrap();
    let p = rt.launch(producer("producer", "consumer")).unwrap();
    c.activate().unwrap();
    p.activate().unwrap();
    let got = run_chain(&p, &c, N);
    check_chain(&got, N);
    let handed = got.len() as u64;
    let (tp, tc) = (p.telemetry(), c.telemetry());
    assert_eq!(tp.messages_processed, N as u64, "{tp:?}");
    assert_eq!(tc.messages_processed, handed, "{tc:?}");
    assert_eq!(
        tc.forwarded_on_device, handed,
        "every message reached the consumer on the device: {tc:?}"
    );
    // Counted once, as received on the device (none went through its input queue).
    assert_eq!(tc.messages_received, handed, "{tc:?}");
    assert_eq!(tc.queue_depth, 0, "{tc:?}");
    assert_eq!(tp.forwarded_on_device, 0);
    // The producer's side of the same count.
    let f = p.forwarding();
    assert_eq!((f.on_device, f.via_host), (handed, 0), "{f:?}");
    assert_eq!((tp.messages_dropped, tc.messages_dropped), (0, 0));
    assert!(
        tp.latency.count >= handed,
        "producer latency recorded: {tp:?}"
    );
    // Device states: the producer saw every reading, the consumer every forwarded one.
    let sp: Counts = p.snapshot_state().unwrap();
    let sc: Counts = c.snapshot_state().unwrap();
    assert_eq!(sp.count, N);
    assert_eq!(sc.count as u64, handed);
    let sum = (0..N)
        .filter(|&s| forwarded(s))
        .fold(0u32, |a, s| a.wrapping_add(expected(s).value));
    assert_eq!(sc.sum, sum);
    // A call to the linked producer is answered to its caller, not forwarded.
    let r = p.call(reading(5), T).unwrap();
    assert_eq!(
        r,
        Scaled {
            seq: 5,
            value: reading(5).value * 3 + 1
        }
    );
    assert!(matches!(
        p.call(reading(3), T),
        Err(resident::Error::NoReply { .. })
    ));
    assert_eq!(
        c.try_receive().unwrap(),
        None,
        "call replies are not forwarded"
    );
    let rp = p.terminate().unwrap();
    let rc = c.terminate().unwrap();
    assert!(
        rp.failure.is_none() && rc.failure.is_none(),
        "{rp:?} {rc:?}"
    );
    assert_eq!(rp.processed, N as u64 + 2);
    assert!(rp.undelivered.is_empty() && rp.unreceived.is_empty());
}

#[test]
fn the_host_relay_gives_the_same_results_and_counts_nothing_on_the_device() {
    let Some(rt) = wgpu_runtime("the_host_relay_gives_the_same_results") else {
        return;
    };
    const N: u32 = 5_000;
    let c = rt.launch(consumer("c")).unwrap();
    let p = rt
        .launch(producer("p", "c").forward_path(ForwardPath::HostRelay))
        .unwrap();
    c.activate().unwrap();
    p.activate().unwrap();
    let got = run_chain(&p, &c, N);
    check_chain(&got, N);
    let tc = c.telemetry();
    assert_eq!(tc.forwarded_on_device, 0, "{tc:?}");
    assert_eq!(tc.messages_received, got.len() as u64, "{tc:?}");
    p.terminate().unwrap();
    c.terminate().unwrap();
}

#[test]
fn a_producer_launched_first_links_later_and_keeps_the_order() {
    let Some(rt) = wgpu_runtime("a_producer_launched_first_links_later") else {
        return;
    };
    const N: u32 = 12_000;
    // The producer runs before its target exists: its first outputs wait in the host relay
    // (for up to the forward patience), then go into the consumer's queue; once the consumer
    // offers its inbox the producer hands its batches over on the device, behind them.
    let p = rt.launch(producer("early", "late")).unwrap();
    p.activate().unwrap();
    let sender = {
        let p = p.clone();
        std::thread::spawn(move || {
            for s in 0..N {
                p.send(reading(s)).unwrap();
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let c = rt.launch(consumer("late")).unwrap();
    c.activate().unwrap();
    let want = (0..N).filter(|&s| forwarded(s)).count();
    let mut got = Vec::with_capacity(want);
    while got.len() < want {
        got.push(c.receive(T).expect("every forwarded reading arrives"));
    }
    sender.join().unwrap();
    check_chain(&got, N);
    let tc = c.telemetry();
    // Each message came one way: received through the queue (relayed) or on the device,
    // and counted once in `messages_received`.
    assert_eq!(tc.messages_received, got.len() as u64, "{tc:?}");
    assert!(
        tc.messages_received > tc.forwarded_on_device,
        "the early outputs were relayed: {tc:?}"
    );
    let f = p.forwarding();
    assert_eq!(f.on_device + f.via_host, got.len() as u64, "{f:?}");
    assert!(tc.forwarded_on_device > 0, "the producer linked: {tc:?}");
    p.terminate().unwrap();
    c.terminate().unwrap();
}

#[test]
fn a_consumer_that_takes_nothing_holds_the_producer_back_and_nothing_is_dropped() {
    let Some(rt) = wgpu_runtime("a_consumer_that_takes_nothing") else {
        return;
    };
    let c = rt.launch(consumer("slow")).unwrap();
    let p = rt
        .launch(
            producer("fast", "slow")
                .queue_size(64)
                .backpressure(Backpressure::Block(Duration::from_millis(50))),
        )
        .unwrap();
    p.activate().unwrap();
    // Warm up the link with the consumer active, then stop it.
    c.activate().unwrap();
    for s in 0..4 {
        p.send(reading(s)).unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(c.receive(T).unwrap());
    }
    assert!(c.telemetry().forwarded_on_device >= 3);
    c.deactivate().unwrap();
    // Inactive, the consumer takes no batch: the producer's fused batch sets fill up, then
    // its queue, then sends wait and are refused (never dropped).
    let mut accepted = 4u32;
    let t0 = Instant::now();
    loop {
        match p.send(reading(accepted)) {
            Ok(_) => accepted += 1,
            Err(resident::Error::Timeout { .. }) | Err(resident::Error::QueueFull { .. }) => break,
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(t0.elapsed() < T, "the producer never pushed back");
        assert!(accepted < 100_000, "the producer never pushed back");
    }
    let held = p.telemetry();
    assert!(
        held.messages_processed < accepted as u64,
        "the producer is held back: {held:?}"
    );
    let before = c.telemetry().messages_processed;
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        c.telemetry().messages_processed,
        before,
        "an inactive consumer handles nothing"
    );
    c.activate().unwrap();
    let want = (0..accepted).filter(|&s| forwarded(s)).count();
    while got.len() < want {
        got.push(c.receive(T).expect("every accepted reading arrives"));
    }
    check_chain(&got, accepted);
    let (tp, tc) = (p.telemetry(), c.telemetry());
    assert_eq!((tp.messages_dropped, tc.messages_dropped), (0, 0));
    assert_eq!(tp.messages_processed, accepted as u64);
    assert!(tp.messages_refused >= 1, "{tp:?}");
    p.terminate().unwrap();
    c.terminate().unwrap();
}

/// One round: a sender feeds the producer, a receiver drains the consumer, and both kernels
/// are terminated while forwarded messages are in flight (order and gap vary by round).
/// Returns how many messages the consumer took on the device.
fn terminate_round(rt: &Runtime, round: u32) -> u64 {
    let (pid, cid) = (format!("p{round}"), format!("c{round}"));
    let c = rt.launch(consumer(&cid)).unwrap();
    let p = rt.launch(producer(&pid, &cid)).unwrap();
    c.activate().unwrap();
    p.activate().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (p, stop) = (p.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut accepted = Vec::new();
            let mut s = 0u32;
            while !stop.load(Ordering::Relaxed) && s < 200_000 {
                match p.send(reading(s)) {
                    Ok(_) => accepted.push(s),
                    Err(_) => break,
                }
                s += 1;
            }
            accepted
        })
    };
    let receiver = {
        let c = c.clone();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            loop {
                match c.receive(Duration::from_millis(20)) {
                    Ok(o) => got.push(o),
                    Err(resident::Error::Timeout { .. }) => {
                        if matches!(c.state(), KernelState::Terminated | KernelState::Failed(_)) {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            got
        })
    };
    std::thread::sleep(Duration::from_millis(20 + 7 * (round % 5) as u64));
    let (rp, rc) = match round % 3 {
        0 => {
            let rc = c.terminate().unwrap();
            (p.terminate().unwrap(), rc)
        }
        1 => {
            let rp = p.terminate().unwrap();
            (rp, c.terminate().unwrap())
        }
        _ => {
            let c2 = c.clone();
            let t = std::thread::spawn(move || c2.terminate().unwrap());
            let rp = p.terminate().unwrap();
            (rp, t.join().unwrap())
        }
    };
    stop.store(true, Ordering::Relaxed);
    let accepted = sender.join().unwrap();
    let received = receiver.join().unwrap();
    assert!(rp.failure.is_none(), "round {round}: {rp:?}");
    assert!(rc.failure.is_none(), "round {round}: {rc:?}");
    // Where each accepted reading ended: exactly one place.
    let mut seen: HashMap<u32, &'static str> = HashMap::new();
    let mut put = |seq: u32, place: &'static str| {
        if let Some(before) = seen.insert(seq, place) {
            panic!("round {round}: reading {seq} in {before} and in {place}");
        }
    };
    for o in &received {
        assert_eq!(*o, expected(o.seq), "round {round}");
        put(o.seq, "received");
    }
    for (_, o) in &rc.unreceived {
        assert_eq!(*o, expected(o.seq), "round {round}");
        put(o.seq, "consumer unreceived");
    }
    for (_, i) in &rc.undelivered {
        put(i.seq, "consumer undelivered");
    }
    for (_, o) in &rp.unreceived {
        put(o.seq, "producer unreceived");
    }
    for (_, i) in &rp.undelivered {
        put(i.seq, "producer undelivered");
    }
    for &s in &accepted {
        let place = seen.remove(&s);
        match place {
            Some(_) => {}
            // Dropped by the producer's handler: processed by the producer, no output.
            None if !forwarded(s) => {}
            None => panic!(
                "round {round}: accepted reading {s} is nowhere ({} accepted)",
                accepted.len()
            ),
        }
    }
    assert!(seen.is_empty(), "round {round}: never accepted: {seen:?}");
    // The producer's counts close too: processed + handed back = accepted.
    assert_eq!(
        rp.processed + rp.undelivered.len() as u64,
        accepted.len() as u64,
        "round {round}: {rp:?}"
    );
    assert_eq!(rp.dropped + rc.dropped, 0, "round {round}");
    c.telemetry().forwarded_on_device
}

#[test]
fn terminate_racing_forwarded_messages_accounts_for_each_once() {
    let Some(rt) = wgpu_runtime("terminate_racing_forwarded_messages") else {
        return;
    };
    let mut on_device = 0;
    for round in 0..30 {
        on_device += terminate_round(&rt, round);
    }
    assert!(on_device > 0, "the rounds forwarded on the device");
}
