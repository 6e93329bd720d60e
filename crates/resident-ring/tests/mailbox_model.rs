//! Model-based tests of [`Mailbox`].
//!
//! * `mailbox_matches_reference_model` (proptest): random sequences of `send` / `send_with`
//!   (random priority, every [`Backpressure`] policy, `Block` with a zero or 200 us timeout),
//!   `send_batch`, `try_recv`, `recv_batch(max)`, `recv_timeout(0)`, `close`, `drain`, `len`
//!   run against the mailbox and against a plain reference model: one `VecDeque` per lane with
//!   the lane's capacity, the documented lane mapping `p * lanes / 256`, highest lane first,
//!   FIFO within a lane, `DropOldest` / `DropNewest` as documented. Every returned value
//!   (including the message handed back on refusal and the one dropped by `DropOldest`) and
//!   the counters (`accepted`, `dropped`, `delivered`, `refused`) are compared after every
//!   step; lanes 1/2/4/256, capacities 1/2/4.
//! * `close_racing_senders_loses_nothing`: producer threads `send` (every policy in turn)
//!   while the main thread calls `close()` then `drain()`, 600 rounds. Every message whose
//!   send returned `Ok` with the message queued is received exactly once (by a concurrent
//!   receiver or in the drain), except the ones `DropOldest` handed back as dropped; nothing
//!   is left in the mailbox after the drain; the counters agree with what the senders saw.
#![cfg(not(loom))]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use proptest::prelude::*;
use resident_ring::mailbox::{
    lane_of, Backpressure, Mailbox, MailboxConfig, MailboxCounters, RecvError, SendError, Sent,
};
use resident_ring::{Envelope, Slot, WaitStrategy};

type Msg = Slot<u64>;

fn msg(id: u64, priority: u8) -> Msg {
    // The payload is derived from the id, so a mixed-up payload shows too.
    Slot::new(
        Envelope::new(id, priority, id * 3),
        id.wrapping_mul(0x9E37_79B9_7F4A_7C15),
    )
}

/// The reference: what the documentation says a mailbox does, written the obvious way.
struct Model {
    lanes: Vec<VecDeque<Msg>>,
    capacity: usize,
    policy: Backpressure,
    closed: bool,
    counters: MailboxCounters,
}

impl Model {
    fn new(lanes: usize, capacity: usize, policy: Backpressure) -> Self {
        Model {
            lanes: vec![VecDeque::new(); lanes],
            capacity,
            policy,
            closed: false,
            counters: MailboxCounters::default(),
        }
    }

    fn lane(&self, priority: u8) -> usize {
        // The documented mapping, computed independently of `lane_of`.
        priority as usize * self.lanes.len() / 256
    }

    fn send_with(&mut self, m: Msg, policy: Backpressure) -> Result<Sent<Msg>, SendError<Msg>> {
        if self.closed {
            self.counters.refused += 1;
            return Err(SendError::Closed(m));
        }
        let lane = self.lane(m.env.priority);
        let capacity = self.capacity;
        let q = &mut self.lanes[lane];
        if q.len() < capacity {
            q.push_back(m);
            self.counters.accepted += 1;
            return Ok(Sent::Queued);
        }
        match policy {
            Backpressure::Reject => {
                self.counters.refused += 1;
                Err(SendError::Full(m))
            }
            // Single-threaded: nobody makes room during the wait.
            Backpressure::Block(_) => {
                self.counters.refused += 1;
                Err(SendError::Timeout(m))
            }
            Backpressure::DropNewest => {
                self.counters.dropped += 1;
                Ok(Sent::DroppedNewest)
            }
            Backpressure::DropOldest => {
                let old = q.pop_front().expect("a full lane has an oldest message");
                q.push_back(m);
                self.counters.accepted += 1;
                self.counters.dropped += 1;
                Ok(Sent::QueuedDroppedOldest(old))
            }
        }
    }

    /// Message by message with the mailbox's policy; stops at the first refusal.
    fn send_batch(&mut self, ms: &[Msg]) -> (usize, Option<SendError<Msg>>) {
        for (i, m) in ms.iter().enumerate() {
            if let Err(e) = self.send_with(*m, self.policy) {
                return (i, Some(e));
            }
        }
        (ms.len(), None)
    }

    fn recv_batch(&mut self, max: usize) -> Vec<Msg> {
        let mut out = Vec::new();
        for q in self.lanes.iter_mut().rev() {
            while out.len() < max {
                match q.pop_front() {
                    Some(m) => out.push(m),
                    None => break,
                }
            }
        }
        self.counters.delivered += out.len() as u64;
        out
    }

    fn try_recv(&mut self) -> Option<Msg> {
        self.recv_batch(1).pop()
    }

    fn len(&self) -> usize {
        self.lanes.iter().map(VecDeque::len).sum()
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// `send` (the mailbox's policy) when `policy` is `None`, else `send_with`.
    Send {
        priority: u8,
        policy: Option<Backpressure>,
    },
    SendBatch(Vec<u8>),
    TryRecv,
    RecvBatch(usize),
    RecvTimeoutZero,
    Close,
    Drain,
    Len,
}

fn policy() -> impl Strategy<Value = Backpressure> {
    prop_oneof![
        Just(Backpressure::Reject),
        Just(Backpressure::DropOldest),
        Just(Backpressure::DropNewest),
        Just(Backpressure::Block(Duration::ZERO)),
        Just(Backpressure::Block(Duration::from_micros(200))),
    ]
}

fn priority() -> impl Strategy<Value = u8> {
    // Few distinct priorities fill lanes often; any priority exercises the mapping.
    prop_oneof![
        3 => prop::sample::select(vec![0u8, 1, 63, 64, 127, 128, 129, 191, 192, 255]),
        1 => any::<u8>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (priority(), prop::option::of(policy()))
            .prop_map(|(priority, policy)| Op::Send { priority, policy }),
        2 => prop::collection::vec(priority(), 0..7).prop_map(Op::SendBatch),
        4 => Just(Op::TryRecv),
        2 => (0usize..7).prop_map(Op::RecvBatch),
        1 => Just(Op::RecvTimeoutZero),
        1 => Just(Op::Close),
        1 => Just(Op::Drain),
        1 => Just(Op::Len),
    ]
}

fn config() -> impl Strategy<Value = (usize, usize, Backpressure)> {
    (
        prop::sample::select(vec![1usize, 2, 4, 256]),
        prop::sample::select(vec![1usize, 2, 4]),
        policy(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 768, ..ProptestConfig::default() })]

    #[test]
    fn mailbox_matches_reference_model(
        (lanes, capacity, backpressure) in config(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mb = Mailbox::<u64>::new(MailboxConfig {
            capacity,
            lanes,
            backpressure,
            wait: WaitStrategy::default(),
        })
        .unwrap();
        let mut model = Model::new(lanes, capacity, backpressure);
        let mut next_id = 1u64;
        let mut fresh = |p: u8| {
            next_id += 1;
            msg(next_id, p)
        };
        for (step, op) in ops.iter().enumerate() {
            match op {
                Op::Send { priority, policy } => {
                    prop_assert_eq!(lane_of(*priority, lanes), model.lane(*priority));
                    let m = fresh(*priority);
                    let got = match policy {
                        None => mb.send(m),
                        Some(p) => mb.send_with(m, *p),
                    };
                    let want = model.send_with(m, policy.unwrap_or(backpressure));
                    prop_assert_eq!(got, want, "step {}: {:?}", step, op);
                }
                Op::SendBatch(priorities) => {
                    let ms: Vec<Msg> = priorities.iter().map(|p| fresh(*p)).collect();
                    prop_assert_eq!(mb.send_batch(&ms), model.send_batch(&ms), "step {}", step);
                }
                Op::TryRecv => {
                    prop_assert_eq!(mb.try_recv(), model.try_recv(), "step {}", step);
                }
                Op::RecvBatch(max) => {
                    let mut got = Vec::new();
                    let n = mb.recv_batch(&mut got, *max);
                    let want = model.recv_batch(*max);
                    prop_assert_eq!(n, want.len(), "step {}", step);
                    prop_assert_eq!(got, want, "step {}", step);
                }
                Op::RecvTimeoutZero => {
                    let got = mb.recv_timeout(Duration::ZERO);
                    let want = match model.try_recv() {
                        Some(m) => Ok(m),
                        None if model.closed => Err(RecvError::Closed),
                        None => Err(RecvError::Timeout),
                    };
                    prop_assert_eq!(got, want, "step {}", step);
                }
                Op::Close => {
                    mb.close();
                    model.closed = true;
                }
                Op::Drain => {
                    let want = model.recv_batch(usize::MAX);
                    prop_assert_eq!(mb.drain(), want, "step {}", step);
                }
                Op::Len => {}
            }
            prop_assert_eq!(mb.len(), model.len(), "step {}: len", step);
            prop_assert_eq!(mb.is_empty(), model.len() == 0, "step {}: is_empty", step);
            prop_assert_eq!(mb.is_closed(), model.closed, "step {}: is_closed", step);
            prop_assert_eq!(mb.counters(), model.counters, "step {}: counters", step);
        }
    }
}

/// What one producer saw in one round.
#[derive(Default)]
struct ProducerLog {
    /// Ids whose send returned `Ok(Queued)` or `Ok(QueuedDroppedOldest(_))`.
    queued: Vec<u64>,
    /// Ids handed back by `QueuedDroppedOldest` (dropped from the queue).
    dropped_oldest: Vec<u64>,
    dropped_newest: u64,
    refused: u64,
    /// Refusals other than `Closed` (full / timed out).
    refused_open: u64,
    closed_seen: bool,
}

const PRODUCERS: u64 = 4;
const ROUNDS: u64 = 600;

#[test]
fn close_racing_senders_loses_nothing() {
    let policies = [
        Backpressure::Reject,
        Backpressure::Block(Duration::from_millis(2)),
        Backpressure::DropOldest,
        Backpressure::DropNewest,
    ];
    for round in 0..ROUNDS {
        let policy = policies[(round % 4) as usize];
        let mb = Mailbox::<u64>::new(MailboxConfig {
            capacity: 16,
            lanes: 4,
            backpressure: policy,
            wait: WaitStrategy::default(),
        })
        .unwrap();
        let start = Arc::new(Barrier::new(PRODUCERS as usize + 2));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (mb, start) = (mb.clone(), start.clone());
                std::thread::spawn(move || {
                    let mut log = ProducerLog::default();
                    start.wait();
                    for seq in 0u64.. {
                        let id = (p << 32) | seq;
                        // Priorities spread over all four lanes.
                        let prio = (seq.wrapping_mul(97).wrapping_add(p * 31) % 256) as u8;
                        match mb.send(msg(id, prio)) {
                            Ok(Sent::Queued) => log.queued.push(id),
                            Ok(Sent::QueuedDroppedOldest(old)) => {
                                log.queued.push(id);
                                log.dropped_oldest.push(old.env.message_id);
                            }
                            Ok(Sent::DroppedNewest) => log.dropped_newest += 1,
                            Err(e) => {
                                log.refused += 1;
                                let closed = matches!(e, SendError::Closed(_));
                                let back = e.into_inner();
                                assert_eq!(back, msg(id, prio), "refused message handed back");
                                if closed {
                                    log.closed_seen = true;
                                    break;
                                }
                                log.refused_open += 1;
                            }
                        }
                    }
                    log
                })
            })
            .collect();
        // A receiver that keeps lanes moving until the mailbox is closed and empty.
        let done = Arc::new(AtomicBool::new(false));
        let receiver = {
            let (mb, start, done) = (mb.clone(), start.clone(), done.clone());
            std::thread::spawn(move || {
                let mut got = Vec::new();
                start.wait();
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    if mb.recv_batch(&mut buf, 3) == 0 {
                        if done.load(Ordering::Acquire) {
                            break;
                        }
                        std::thread::yield_now();
                    }
                    got.extend(buf.iter().map(|s| s.env.message_id));
                }
                got
            })
        };
        start.wait();
        // Let the producers run for a varying while, then close and drain.
        std::thread::sleep(Duration::from_micros(round % 7 * 50));
        mb.close();
        let drained = mb.drain();
        done.store(true, Ordering::Release);
        let logs: Vec<ProducerLog> = producers.into_iter().map(|t| t.join().unwrap()).collect();
        let received = receiver.join().unwrap();

        // Nothing may arrive after close + drain: every push that returned Ok finished
        // before `close` returned.
        let late = mb.drain();
        assert!(
            late.is_empty(),
            "round {round} {policy:?}: {} messages queued after close + drain",
            late.len()
        );
        assert_eq!(mb.len(), 0);

        // Exactly once: received + drained == queued - dropped by DropOldest.
        let mut seen: Vec<u64> = received;
        seen.extend(drained.iter().map(|s| {
            assert_eq!(*s, msg(s.env.message_id, s.env.priority), "payload intact");
            s.env.message_id
        }));
        let mut want: Vec<u64> = logs.iter().flat_map(|l| l.queued.iter().copied()).collect();
        let mut dropped: Vec<u64> = logs
            .iter()
            .flat_map(|l| l.dropped_oldest.iter().copied())
            .collect();
        dropped.sort_unstable();
        want.sort_unstable();
        want.retain(|id| dropped.binary_search(id).is_err());
        let mut sorted_seen = seen.clone();
        sorted_seen.sort_unstable();
        let checksum = |v: &[u64]| {
            v.iter().fold(0u64, |a, id| {
                a.wrapping_add(id.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            })
        };
        assert_eq!(
            (sorted_seen.len(), checksum(&sorted_seen)),
            (want.len(), checksum(&want)),
            "round {round} {policy:?}: count/checksum of received vs queued"
        );
        assert_eq!(sorted_seen, want, "round {round} {policy:?}");

        // Counters agree with what the senders saw.
        assert!(logs.iter().all(|l| l.closed_seen));
        let c = mb.counters();
        let sum = |f: fn(&ProducerLog) -> u64| logs.iter().map(f).sum::<u64>();
        assert_eq!(c.accepted, sum(|l| l.queued.len() as u64), "round {round}");
        assert_eq!(
            c.dropped,
            sum(|l| l.dropped_oldest.len() as u64 + l.dropped_newest),
            "round {round}"
        );
        assert_eq!(c.refused, sum(|l| l.refused), "round {round}");
        assert_eq!(c.delivered, seen.len() as u64, "round {round}");
        if matches!(policy, Backpressure::DropOldest | Backpressure::DropNewest) {
            assert_eq!(
                sum(|l| l.refused_open),
                0,
                "drop policies never refuse an open mailbox"
            );
        }
    }
}
