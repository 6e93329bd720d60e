//! How a waiting thread waits: spin briefly (lowest latency), then park (no CPU while idle).
//!
//! [`Signal`] is the wake-up channel between a side that makes progress (a push or a pop) and
//! a side that waits for it, without losing a wake-up: the waiter announces itself in
//! `waiters` and re-checks its condition under the lock; the notifier publishes its progress,
//! then checks `waiters`. Sequentially consistent fences on both sides make it impossible for
//! both to miss each other (the store-buffering pattern).
//!
//! Under `--cfg loom` the primitives are loom's (see `tests/loom_signal.rs`); the spin phase
//! is then a couple of checks instead of a timed loop, since a model has no time.

use std::time::{Duration, Instant};

#[cfg(not(loom))]
use crate::sync::thread;
use crate::sync::{fence, AtomicUsize, Condvar, Mutex, Ordering};

/// How receivers and idle kernels wait for work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStrategy {
    /// Spin until the condition holds or the deadline passes: lowest latency, burns a core.
    Spin,
    /// Spin for up to this long (yielding the core now and then), then park.
    SpinThenPark(Duration),
    /// Park at once: no CPU use while waiting, wake-up costs a few microseconds.
    Park,
}

impl Default for WaitStrategy {
    /// Spin for 50 us, then park: sub-microsecond hand-offs under load, zero CPU when idle.
    fn default() -> Self {
        WaitStrategy::SpinThenPark(Duration::from_micros(50))
    }
}

/// Checks of the condition in the spin phase under loom (where a spin cannot be timed).
#[cfg(loom)]
pub(crate) const LOOM_SPIN_CHECKS: usize = 2;

/// A deadline `timeout` from now; `None` when it does not fit in an `Instant` (wait forever).
pub fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// A wake-up channel for threads waiting on a condition that other threads make true.
#[derive(Default)]
pub struct Signal {
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Signal {
    /// A signal with no waiters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes every parked waiter. Call after publishing the progress they wait for.
    /// Costs one fence and one load when nobody is parked.
    pub fn notify(&self) {
        // SeqCst fence: orders our earlier publication (e.g. a ring's Release store) before the
        // load of `waiters`; pairs with the fence in `wait_until` (store-buffering pattern).
        fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::Relaxed) != 0 {
            // Taking the lock orders this notify after a waiter's check-under-lock, so a
            // waiter that saw the old state is already inside `cv.wait` and gets woken.
            let _guard = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// Like [`Signal::notify`] without the fence: cheaper, but a waiter that is just parking
    /// may miss it. Only for signals whose waiters wait in short bounded slices and re-check.
    pub fn notify_unfenced(&self) {
        if self.waiters.load(Ordering::Relaxed) != 0 {
            let _guard = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// Waits until `ready()` is true (returns `true`) or `deadline` passes (returns `false`).
    /// `ready` must only read state that notifiers publish before calling [`Signal::notify`].
    pub fn wait_until(
        &self,
        strategy: WaitStrategy,
        deadline: Option<Instant>,
        mut ready: impl FnMut() -> bool,
    ) -> bool {
        if ready() {
            return true;
        }
        let spin_for = match strategy {
            WaitStrategy::Spin => None,
            WaitStrategy::SpinThenPark(d) => Some(d),
            WaitStrategy::Park => Some(Duration::ZERO),
        };
        #[cfg(loom)]
        if spin_for != Some(Duration::ZERO) {
            // A model has no time: a bounded spin of checks stands for the spin phase, so
            // loom explores a wake-up caught while spinning as well as one caught after
            // parking. No `yield_now` here: loom runs the other threads to a standstill
            // after a yield, which would hide the park path.
            for _ in 0..LOOM_SPIN_CHECKS {
                if ready() {
                    return true;
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return ready();
            }
        }
        #[cfg(not(loom))]
        if spin_for != Some(Duration::ZERO) {
            let start = Instant::now();
            let spin_end = match (spin_for.and_then(|d| start.checked_add(d)), deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let mut rounds: u32 = 0;
            loop {
                // One pause per check: a pause costs up to ~140 cycles on recent x86, so
                // checking less often would add that much to every wake-up.
                core::hint::spin_loop();
                if ready() {
                    return true;
                }
                rounds = rounds.wrapping_add(1);
                if rounds.is_multiple_of(64) {
                    if spin_end.is_some_and(|end| Instant::now() >= end) {
                        break;
                    }
                    // After about a microsecond of pure spinning, give the core away at every
                    // time check: on small machines the thread we wait for may need it.
                    if rounds >= 256 {
                        thread::yield_now();
                    }
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return ready();
            }
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        // SeqCst fence: our announcement in `waiters` is ordered before the re-check of the
        // condition; pairs with the fence in `notify`.
        fence(Ordering::SeqCst);
        let result = loop {
            let mut guard = self.lock.lock();
            if ready() {
                break true;
            }
            match deadline {
                Some(d) => {
                    if Instant::now() >= d {
                        break false;
                    }
                    self.cv.wait_until(&mut guard, d);
                }
                None => self.cv.wait(&mut guard),
            }
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn wakes_a_parked_waiter() {
        for strategy in [
            WaitStrategy::Park,
            WaitStrategy::default(),
            WaitStrategy::Spin,
        ] {
            let sig = Arc::new(Signal::new());
            let flag = Arc::new(AtomicBool::new(false));
            let (s2, f2) = (sig.clone(), flag.clone());
            let t = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                f2.store(true, Ordering::Release);
                s2.notify();
            });
            let ok = sig.wait_until(strategy, deadline_after(Duration::from_secs(10)), || {
                flag.load(Ordering::Acquire)
            });
            assert!(ok, "{strategy:?}");
            t.join().unwrap();
        }
    }

    #[test]
    fn times_out() {
        let sig = Signal::new();
        let start = Instant::now();
        let ok = sig.wait_until(
            WaitStrategy::Park,
            deadline_after(Duration::from_millis(30)),
            || false,
        );
        assert!(!ok);
        assert!(start.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn no_lost_wakeups_under_churn() {
        // Ping-pong 20k times through two signals with parking waiters: a lost wake-up would
        // stall a side until the 10 s deadline and fail the test.
        let a = Arc::new((Signal::new(), std::sync::atomic::AtomicU64::new(0)));
        let b = a.clone();
        let n = 20_000u64;
        let t = std::thread::spawn(move || {
            for i in 0..n {
                let ok = b.0.wait_until(
                    WaitStrategy::Park,
                    deadline_after(Duration::from_secs(10)),
                    || b.1.load(Ordering::Acquire) == 2 * i + 1,
                );
                assert!(ok, "stalled at {i}");
                b.1.store(2 * i + 2, Ordering::Release);
                b.0.notify();
            }
        });
        for i in 0..n {
            a.1.store(2 * i + 1, Ordering::Release);
            a.0.notify();
            let ok = a.0.wait_until(
                WaitStrategy::Park,
                deadline_after(Duration::from_secs(10)),
                || a.1.load(Ordering::Acquire) == 2 * i + 2,
            );
            assert!(ok, "stalled at {i}");
        }
        t.join().unwrap();
    }
}
