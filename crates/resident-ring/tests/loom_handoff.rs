//! Model check of the in-hand handoff ([`InHand`]) with loom: a kernel's host thread works
//! through a batch of three messages while `terminate` gives up on it (`abandon`) at any point.
//!
//! In every interleaving loom explores:
//! * every message of the batch is owned by exactly one side: published by the host (it
//!   claimed past it, or finished the batch), or reported by the abandoner (as the stuck
//!   message, or as not started), never both, never neither;
//! * the stuck message, if any, is the one the host was handling;
//! * what the handler did for the messages the host owns is visible to the abandoner once
//!   `abandon` returned (the handler's effects are plain, non-atomic writes: loom reports a
//!   causality violation if the claim/abandon pair does not order them).
//!
//! These models fail when the claims (`start`, `finish`) or `abandon` are weakened to
//! `Relaxed` (checked by hand when they were written).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p resident-ring --test loom_handoff --release`
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use resident_ring::handoff::InHand;

const N: usize = 3;

/// What the handler of message `i` did: a plain write, read by the abandoner afterwards.
struct Effects([UnsafeCell<u32>; N]);

// SAFETY: accesses are ordered by the handoff under test; loom checks that they are.
unsafe impl Sync for Effects {}

/// The host thread's loop, as the CPU host runs it; returns the messages whose outputs it
/// published.
fn host(hand: &InHand<usize>, effects: &Effects) -> Vec<usize> {
    let mut published = Vec::new();
    let mut batch = Vec::new();
    let Ok(n) = hand.take(&mut batch, |b| {
        b.extend(0..N);
        N
    }) else {
        return published;
    };
    for i in 0..n {
        if hand.start(i).is_err() {
            return published; // the abandoner holds i-1 onwards
        }
        if i > 0 {
            published.push(batch[i - 1]);
        }
        // The handler of message i.
        effects.0[i].with_mut(|e| unsafe { *e = 1 });
    }
    if hand.finish(n).is_ok() {
        published.push(batch[n - 1]);
    }
    published
}

fn check(published: &[usize], stuck: Option<usize>, not_started: &[usize]) {
    let mut all: Vec<usize> = published.to_vec();
    all.extend(stuck);
    all.extend_from_slice(not_started);
    all.sort_unstable();
    let whole = all == (0..N).collect::<Vec<_>>();
    let nothing_taken = stuck.is_none() && not_started.is_empty() && published.is_empty();
    assert!(
        whole || nothing_taken,
        "published {published:?}, stuck {stuck:?}, not started {not_started:?}"
    );
    if let Some(s) = stuck {
        // The stuck message is the one after the last the host published.
        assert_eq!(published.len(), s);
    }
}

#[test]
fn every_message_is_owned_by_exactly_one_side() {
    loom::model(|| {
        let hand = Arc::new(InHand::<usize>::new());
        let effects = Arc::new(Effects(std::array::from_fn(|_| UnsafeCell::new(0))));
        let (h, e) = (hand.clone(), effects.clone());
        let host_thread = loom::thread::spawn(move || host(&h, &e));
        let (stuck, not_started) = hand.abandon();
        // What the finished messages did is visible now: every message before the stuck one
        // (or before the first not started) ran its handler.
        let finished = stuck.or(not_started.first().copied()).unwrap_or(0);
        for i in 0..finished {
            let v = effects.0[i].with(|e| unsafe { *e });
            assert_eq!(v, 1, "message {i} finished but its effects are not visible");
        }
        let published = host_thread.join().unwrap();
        check(&published, stuck, &not_started);
        assert!(hand.is_abandoned());
    });
}

#[test]
fn no_abandon_means_the_host_publishes_everything() {
    loom::model(|| {
        let hand = Arc::new(InHand::<usize>::new());
        let effects = Arc::new(Effects(std::array::from_fn(|_| UnsafeCell::new(0))));
        let (h, e) = (hand.clone(), effects.clone());
        let published = loom::thread::spawn(move || host(&h, &e)).join().unwrap();
        assert_eq!(published, (0..N).collect::<Vec<_>>());
        assert!(!hand.is_abandoned());
        assert_eq!(
            hand.abandon(),
            (None, Vec::new()),
            "no batch in hand after finish"
        );
    });
}
