//! Stress: several producer threads push millions of messages through one mailbox (priority
//! lanes, MPSC front) to one consumer; per-producer sequence numbers and checksums prove
//! every accepted message arrived exactly once and in FIFO order within its producer and lane.

#![cfg(not(loom))]

use std::time::Duration;

use resident_ring::mailbox::{Backpressure, Mailbox, MailboxConfig, Sent};
use resident_ring::{Envelope, Slot, WaitStrategy};

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Msg {
    producer: u32,
    lane_seq: u32,
    value: u64,
}

fn run(producers: u32, per_producer: u32, backpressure: Backpressure) -> (u64, u64) {
    let mb = Mailbox::<Msg>::new(MailboxConfig {
        capacity: 256,
        lanes: 4,
        backpressure,
        wait: WaitStrategy::default(),
    })
    .unwrap();
    let mut handles = Vec::new();
    for p in 0..producers {
        let mb = mb.clone();
        handles.push(std::thread::spawn(move || {
            // Each producer sends on one priority so FIFO per producer is checkable.
            let prio = (p * 64 + 5) as u8;
            let mut sum = 0u64;
            let mut batch = Vec::with_capacity(32);
            let mut i = 0;
            while i < per_producer {
                batch.clear();
                for k in i..(i + 32).min(per_producer) {
                    let value = (p as u64) << 40 | k as u64;
                    batch.push(Slot::new(
                        Envelope::new(0, prio, 0),
                        Msg {
                            producer: p,
                            lane_seq: k,
                            value,
                        },
                    ));
                }
                let (n, err) = mb.send_batch(&batch);
                assert!(err.is_none(), "blocking send failed: {err:?}");
                assert_eq!(n, batch.len());
                for s in &batch {
                    sum = sum.wrapping_add(s.payload.value.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                }
                i += n as u32;
            }
            sum
        }));
    }
    let consumer = {
        let mb = mb.clone();
        std::thread::spawn(move || {
            let total = producers as u64 * per_producer as u64;
            let mut next = vec![0u32; producers as usize];
            let mut sum = 0u64;
            let mut got = 0u64;
            let mut out = Vec::with_capacity(256);
            while got < total {
                out.clear();
                if mb.recv_batch(&mut out, 256) == 0 {
                    mb.wait_nonempty(
                        resident_ring::wait::deadline_after(Duration::from_secs(10)),
                        || false,
                    );
                    continue;
                }
                for s in &out {
                    let m = s.payload;
                    assert_eq!(
                        m.lane_seq, next[m.producer as usize],
                        "producer {} out of order",
                        m.producer
                    );
                    next[m.producer as usize] += 1;
                    sum = sum.wrapping_add(m.value.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    got += 1;
                }
            }
            (sum, got)
        })
    };
    let sent: u64 = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .fold(0, u64::wrapping_add);
    let (received, got) = consumer.join().unwrap();
    assert_eq!(sent, received, "checksum mismatch");
    let c = mb.counters();
    assert_eq!(c.accepted, got);
    assert_eq!(c.delivered, got);
    (got, c.dropped)
}

#[test]
fn many_producers_exactly_once_blocking() {
    let (got, dropped) = run(4, 500_000, Backpressure::Block(Duration::from_secs(30)));
    assert_eq!(got, 2_000_000);
    assert_eq!(dropped, 0);
}

#[test]
fn drop_policies_account_for_every_message() {
    // With DropNewest and a slow consumer some messages are dropped; accepted + dropped must
    // equal what was sent, and every accepted one must be received exactly once.
    for policy in [Backpressure::DropNewest, Backpressure::DropOldest] {
        let mb = Mailbox::<u64>::new(MailboxConfig {
            capacity: 8,
            lanes: 1,
            backpressure: policy,
            ..Default::default()
        })
        .unwrap();
        let tx = mb.clone();
        let n = 100_000u64;
        let producer = std::thread::spawn(move || {
            let mut dropped_oldest = Vec::new();
            for i in 0..n {
                match tx.send(Slot::new(Envelope::new(i + 1, 128, 0), i)).unwrap() {
                    Sent::QueuedDroppedOldest(old) => dropped_oldest.push(old.payload),
                    Sent::Queued | Sent::DroppedNewest => {}
                }
            }
            tx.close();
            dropped_oldest
        });
        let mut seen = Vec::new();
        while let Ok(s) = mb.recv_timeout(Duration::from_secs(10)) {
            seen.push(s.payload);
        }
        let dropped_oldest = producer.join().unwrap();
        let c = mb.counters();
        assert_eq!(seen.len() as u64, c.delivered);
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{policy:?}: FIFO");
        match policy {
            Backpressure::DropNewest => {
                assert_eq!(
                    c.accepted, c.delivered,
                    "every accepted message is delivered"
                );
                assert_eq!(
                    c.accepted + c.dropped,
                    n,
                    "every sent message is accepted or counted"
                );
            }
            _ => {
                assert_eq!(c.accepted, n);
                assert_eq!(
                    c.accepted,
                    c.delivered + c.dropped,
                    "accepted = delivered + evicted"
                );
                assert_eq!(c.dropped as usize, dropped_oldest.len());
                assert_eq!(seen.len() + dropped_oldest.len(), n as usize);
            }
        }
    }
}

/// The one `Writer` racing `close` (the output side of a kernel being terminated): every
/// message whose send returned `Ok` is received before the close or found by the `drain`
/// after it, exactly once, in order; every refused one came back. Repeated so that the close
/// lands at every point of the writer's push (with `close` not waiting for the writer, this
/// fails within a run or two).
#[test]
fn writer_racing_close_loses_nothing() {
    for round in 0..1500u32 {
        for policy in [
            Backpressure::Block(Duration::from_millis(5)),
            Backpressure::Reject,
            Backpressure::DropOldest,
        ] {
            let (mut w, mb) = Mailbox::<u64>::with_writer(MailboxConfig {
                capacity: 64,
                lanes: 1,
                backpressure: policy,
                wait: WaitStrategy::Spin,
            })
            .unwrap();
            let receiver = mb.clone();
            // A receiver takes some messages while the writer runs.
            let rx = std::thread::spawn(move || {
                let mut got = Vec::new();
                for _ in 0..(round % 7) * 20 {
                    if let Some(s) = receiver.try_recv() {
                        got.push(s.payload);
                    }
                }
                got
            });
            let writer = std::thread::spawn(move || {
                let (mut accepted, mut dropped) = (Vec::new(), Vec::new());
                let mut returned = 0u64;
                let mut batch = Vec::new();
                for i in 0..200_000u64 {
                    let slot = Slot::new(Envelope::new(i, 128, 0), i);
                    if i % 3 == 0 {
                        batch.clear();
                        batch.push(slot);
                        match w.send_batch(&batch, i % 2 == 0) {
                            (1, None) => accepted.push(i),
                            (_, Some(_)) => returned += 1,
                            other => panic!("{other:?}"),
                        }
                    } else {
                        match w.send(slot) {
                            Ok(Sent::Queued) => accepted.push(i),
                            Ok(Sent::QueuedDroppedOldest(old)) => {
                                accepted.push(i);
                                dropped.push(old.payload);
                            }
                            Ok(Sent::DroppedNewest) => unreachable!(),
                            Err(_) => returned += 1,
                        }
                    }
                    if w.is_closed() && returned > 4 {
                        break;
                    }
                }
                (accepted, dropped, returned)
            });
            // Close at a point that moves from round to round.
            for _ in 0..(round * 37) % 2000 {
                std::hint::spin_loop();
            }
            mb.close();
            let drained: Vec<u64> = mb.drain().into_iter().map(|s| s.payload).collect();
            let (accepted, dropped, _returned) = writer.join().unwrap();
            let mut got = rx.join().unwrap();
            got.extend(drained);
            // Every message accepted is exactly one of: received or drained (once each), or
            // dropped by the policy (counted; `send` also hands the dropped one back).
            let mut seen = got.clone();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(
                seen.len(),
                got.len(),
                "round {round} {policy:?}: duplicates"
            );
            let acc: std::collections::HashSet<u64> = accepted.iter().copied().collect();
            assert!(
                got.iter().all(|g| acc.contains(g)),
                "round {round}: unknown"
            );
            assert!(dropped.iter().all(|d| acc.contains(d) && !got.contains(d)));
            let c = mb.counters();
            assert_eq!(
                accepted.len() as u64,
                got.len() as u64 + c.dropped,
                "round {round} {policy:?}: {} accepted, {} received or drained, {} dropped",
                accepted.len(),
                got.len(),
                c.dropped
            );
            // In order (one lane, one writer).
            assert!(got.windows(2).all(|w| w[0] < w[1]), "round {round}: order");
            assert_eq!(mb.counters().accepted, accepted.len() as u64);
        }
    }
}

/// A mailbox whose writer is a `Writer` refuses every other sender, handing the message back.
#[test]
fn writer_owned_mailbox_refuses_other_senders() {
    let (_w, mb) = Mailbox::<u64>::with_writer(MailboxConfig::default()).unwrap();
    let slot = Slot::new(Envelope::new(1, 128, 0), 9);
    assert_eq!(mb.send(slot).unwrap_err().into_inner().payload, 9);
    let (n, e) = mb.send_batch(&[slot]);
    assert_eq!((n, e.unwrap().into_inner().payload), (0, 9));
    assert_eq!(mb.counters().refused, 2);
    assert_eq!(mb.len(), 0);
}
