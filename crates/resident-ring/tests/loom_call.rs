//! Model check of the [`CallSlot`] with loom.
//!
//! * A completer and a waiting caller: in every interleaving loom explores, the caller gets
//!   exactly the value (a lost unpark leaves it parked forever: loom reports a deadlock).
//! * The timeout race of the runtime's call table: the caller gives up and removes its entry
//!   while the completer removes it to complete. Exactly one of {the caller gets the value,
//!   the completer finds no entry and counts a late reply} happens, and nobody hangs.
//!
//! Time cannot be modelled: a caller that "times out" waits with a deadline that has already
//! passed, so it gives up at its first check that misses `done`, at whatever point of the
//! completer's progress loom schedules that check.
//!
//! The caller runs on a thread of its own, and the model's main thread only joins: loom's
//! `unpark` makes a thread runnable whatever it is blocked on, so a (legitimately) late unpark
//! arriving while the caller sat in `join` would trip an internal loom assertion, where the
//! real `std::thread::unpark` only leaves a token for a later `park`.
//!
//! These models fail (deadlock or the accounting assertion) when the fence on either side of
//! the handshake is removed, when the caller does not wait again after finding its entry gone,
//! and also for the same handshake written with SeqCst loads/stores instead of fences: loom
//! treats SeqCst accesses as AcqRel (a documented loom limitation), which is why `CallSlot`
//! uses SeqCst fences, the form loom checks exactly, at the same cost on x86-64.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p resident-ring --test loom_call --release`
#![cfg(loom)]

use std::time::Instant;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use resident_ring::call::CallSlot;
use resident_ring::WaitStrategy;

/// A reply that is not `Copy`, shaped like the runtime's `Result<Out, Error>`.
type Reply = Result<Vec<u32>, &'static str>;

fn reply() -> Reply {
    Ok(vec![7, 8])
}

fn completer_vs_waiter(strategy: WaitStrategy) {
    loom::model(move || {
        let (tx, rx) = loom::sync::mpsc::channel();
        let caller = loom::thread::spawn(move || {
            let slot = Arc::new(CallSlot::<Reply>::new());
            tx.send(slot.clone()).unwrap();
            assert_eq!(slot.wait(None, strategy), Some(reply()));
            // The value was taken: nothing is left for a second wait.
            assert_eq!(slot.wait(Some(Instant::now()), WaitStrategy::Park), None);
        });
        let completer = loom::thread::spawn(move || rx.recv().unwrap().complete(reply()));
        caller.join().unwrap();
        completer.join().unwrap();
    });
}

#[test]
fn call_parking_caller_always_gets_the_value() {
    completer_vs_waiter(WaitStrategy::Park);
}

#[test]
fn call_spin_then_park_caller_always_gets_the_value() {
    // Under loom the spin phase is a couple of yielding checks of `done`, then the park path.
    completer_vs_waiter(WaitStrategy::default());
}

/// The runtime's shape: a table entry holds the slot; the completer takes the entry and
/// completes, or counts a late reply when the entry is gone. The caller waits (here: gives up
/// at once when `done` is not yet set), then removes its entry; finding it gone, it knows the
/// reply is coming and waits for it without deadline.
fn timeout_race(strategy: WaitStrategy) {
    loom::model(move || {
        let table: Arc<Mutex<Option<Arc<CallSlot<Reply>>>>> = Arc::new(Mutex::new(None));
        let late = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = loom::sync::mpsc::channel::<()>();

        let t1 = table.clone();
        let caller = loom::thread::spawn(move || {
            let slot = Arc::new(CallSlot::<Reply>::new());
            *t1.lock().unwrap() = Some(slot.clone());
            // "The request is sent": the completer may start.
            tx.send(()).unwrap();
            match slot.wait(Some(Instant::now()), strategy) {
                Some(r) => Some(r),
                None => {
                    let removed = t1.lock().unwrap().take();
                    if removed.is_none() {
                        // The completer took the entry: its reply is certain to come.
                        let r = slot.wait(None, WaitStrategy::Park);
                        assert!(r.is_some(), "entry taken by the completer, but no value");
                        r
                    } else {
                        None
                    }
                }
            }
        });

        let (t2, late2) = (table.clone(), late.clone());
        let completer = loom::thread::spawn(move || {
            rx.recv().unwrap();
            let entry = t2.lock().unwrap().take();
            match entry {
                Some(slot) => slot.complete(reply()),
                None => {
                    late2.fetch_add(1, Ordering::Relaxed);
                }
            }
        });

        let got = caller.join().unwrap();
        completer.join().unwrap();
        let late = late.load(Ordering::Relaxed);
        match got {
            Some(r) => {
                assert_eq!(r, reply());
                assert_eq!(
                    late, 0,
                    "the caller got the value and a late reply was counted"
                );
            }
            None => assert_eq!(
                late, 1,
                "the caller timed out but no late reply was counted"
            ),
        }
    });
}

#[test]
fn call_timeout_race_parking_caller() {
    timeout_race(WaitStrategy::Park);
}

#[test]
fn call_timeout_race_spin_then_park_caller() {
    timeout_race(WaitStrategy::default());
}
