//! Model check of the wake-up [`Signal`] with loom: a waiter that parks on a condition another
//! thread makes true (then notifies) always returns, in every interleaving loom explores. A
//! lost wake-up leaves the waiter parked on the condvar forever, which loom reports as a
//! deadlock (every thread blocked).
//!
//! The two-thread models are explored exhaustively; the three-thread ones with at most
//! [`THREE_THREAD_PREEMPTIONS`] preemptions per execution (unless `LOOM_MAX_PREEMPTIONS` is
//! set), which keeps them to seconds.
//!
//! Removing either SeqCst fence of `Signal` (in `notify` or in `wait_until`) makes every
//! model here fail with a loom deadlock.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p resident-ring --test loom_signal --release`
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use resident_ring::wait::Signal;
use resident_ring::WaitStrategy;

/// Preemption bound of the three-thread models when `LOOM_MAX_PREEMPTIONS` is not set.
const THREE_THREAD_PREEMPTIONS: usize = 4;

fn model_three_threads(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(THREE_THREAD_PREEMPTIONS);
    }
    builder.check(f);
}

/// One notifier publishes a flag then notifies; one waiter waits for the flag.
fn one_waiter(strategy: WaitStrategy) {
    loom::model(move || {
        let sig = Arc::new(Signal::new());
        let flag = Arc::new(AtomicBool::new(false));
        let (s2, f2) = (sig.clone(), flag.clone());
        let notifier = loom::thread::spawn(move || {
            f2.store(true, Ordering::Release);
            s2.notify();
        });
        let ok = sig.wait_until(strategy, None, || flag.load(Ordering::Acquire));
        assert!(
            ok,
            "a wait without deadline returns only when the flag is up"
        );
        notifier.join().unwrap();
    });
}

#[test]
fn signal_parking_waiter_is_always_woken() {
    one_waiter(WaitStrategy::Park);
}

#[test]
fn signal_spin_then_park_waiter_is_always_woken() {
    // Under loom the spin phase is a couple of yielding checks, then the park path.
    one_waiter(WaitStrategy::default());
}

#[test]
fn signal_two_waiters_are_both_woken() {
    model_three_threads(|| {
        let sig = Arc::new(Signal::new());
        let flag = Arc::new(AtomicBool::new(false));
        let woken = Arc::new(AtomicUsize::new(0));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (sig, flag, woken) = (sig.clone(), flag.clone(), woken.clone());
                loom::thread::spawn(move || {
                    let ok =
                        sig.wait_until(WaitStrategy::Park, None, || flag.load(Ordering::Acquire));
                    assert!(ok);
                    woken.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        flag.store(true, Ordering::Release);
        sig.notify();
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(woken.load(Ordering::Relaxed), 2);
    });
}

#[test]
fn signal_counter_condition_with_two_notifiers() {
    // The waiter needs both notifiers' progress (a counter reaching 2): the wake-up of the
    // first must not be the only one it can get.
    model_three_threads(|| {
        let sig = Arc::new(Signal::new());
        let count = Arc::new(AtomicUsize::new(0));
        let notifiers: Vec<_> = (0..2)
            .map(|_| {
                let (sig, count) = (sig.clone(), count.clone());
                loom::thread::spawn(move || {
                    count.fetch_add(1, Ordering::Release);
                    sig.notify();
                })
            })
            .collect();
        let ok = sig.wait_until(WaitStrategy::Park, None, || {
            count.load(Ordering::Acquire) == 2
        });
        assert!(ok);
        for n in notifiers {
            n.join().unwrap();
        }
    });
}
