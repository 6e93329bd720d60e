//! The reply slot of a waiting request/response `call`.
//!
//! A caller makes a [`CallSlot`] (it remembers the calling thread), shares it (in an `Arc`)
//! with whoever will answer, and waits; the answering side stores the value with
//! [`CallSlot::complete`]. The caller spins briefly on `done`, then parks; `complete` unparks it
//! only when it has announced that it parks, so a reply to a caller still spinning costs no
//! system call.
//!
//! The handshake is the store-buffering pattern: the caller stores `parked` then loads `done`,
//! the completer stores `done` then loads `parked`, with a sequentially consistent fence
//! between the store and the load on each side. The fences forbid both loads from missing the
//! other side's store, so a caller that parks is always unparked (checked by the loom model in
//! `tests/loom_call.rs`).
//!
//! ```
//! use std::sync::Arc;
//! use resident_ring::call::CallSlot;
//! use resident_ring::WaitStrategy;
//! let slot = Arc::new(CallSlot::<u32>::new());
//! let s2 = slot.clone();
//! let t = std::thread::spawn(move || s2.complete(7));
//! assert_eq!(slot.wait(None, WaitStrategy::default()), Some(7));
//! t.join().unwrap();
//! ```

use std::time::Instant;

use crate::sync::{fence, thread, AtomicBool, Mutex, Ordering};
use crate::wait::WaitStrategy;

/// Where the reply of one `call` lands, and how its caller waits for it.
///
/// One caller (the thread that called [`CallSlot::new`]) waits; one completer calls
/// [`CallSlot::complete`] once. The runtime keeps slots in a table keyed by correlation id: the
/// completer removes the entry before completing, and a caller that times out removes it too;
/// whoever removes it decides (a caller that finds it gone waits again, without deadline, for
/// the reply that is then certain to come).
pub struct CallSlot<T> {
    /// Set (after `value`) by `complete`.
    done: AtomicBool,
    /// Set by the caller before it parks; never cleared.
    parked: AtomicBool,
    value: Mutex<Option<T>>,
    caller: thread::Thread,
}

impl<T> CallSlot<T> {
    /// An empty slot whose waiter is the current thread.
    pub fn new() -> Self {
        CallSlot {
            done: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            value: Mutex::new(None),
            caller: thread::current(),
        }
    }

    /// Stores the reply and wakes the caller if it parked. Call at most once per slot (a
    /// second value would replace an untaken first one).
    pub fn complete(&self, value: T) {
        *self.value.lock() = Some(value);
        // Release: a caller that sees `done` sees the value (it also goes through the lock).
        self.done.store(true, Ordering::Release);
        // SeqCst fence between our store of `done` and our load of `parked`, against the
        // caller's fence between its store of `parked` and its load of `done`
        // (store-buffering): at least one side sees the other's store, so a caller that parks
        // after missing `done` is seen here as parked and unparked.
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::Relaxed) {
            self.caller.unpark();
        }
    }

    /// Whether [`CallSlot::complete`] has stored a value (not yet taken or not).
    pub fn is_complete(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Waits for the reply until `deadline` (`None`: no deadline); `None` when the deadline
    /// passed first. Must be called by the thread that created the slot (the one `complete`
    /// unparks). `strategy` says how long to spin before parking. The value is taken: a
    /// second `wait` after a `Some` returns `None` at once.
    pub fn wait(&self, deadline: Option<Instant>, strategy: WaitStrategy) -> Option<T> {
        #[cfg(not(loom))]
        {
            let spin_until = match strategy {
                WaitStrategy::Spin => deadline,
                WaitStrategy::SpinThenPark(d) => Instant::now().checked_add(d),
                WaitStrategy::Park => None,
            };
            let mut i = 0u32;
            while let Some(until) = spin_until {
                // Acquire: pairs with the Release store in `complete`; the value is there.
                if self.done.load(Ordering::Acquire) {
                    return self.value.lock().take();
                }
                std::hint::spin_loop();
                i = i.wrapping_add(1);
                if i.is_multiple_of(64) {
                    if Instant::now() >= until {
                        break;
                    }
                    if i >= 256 {
                        thread::yield_now();
                    }
                }
            }
        }
        #[cfg(loom)]
        if strategy != WaitStrategy::Park {
            // A model has no time: a few checks stand for the spin phase, so loom explores a
            // reply caught while spinning and one caught after parking (no `yield_now`: loom
            // runs the other threads to a standstill after a yield, hiding the park path).
            for _ in 0..crate::wait::LOOM_SPIN_CHECKS {
                if self.done.load(Ordering::Acquire) {
                    return self.value.lock().take();
                }
            }
        }
        loop {
            self.parked.store(true, Ordering::Relaxed);
            // SeqCst fence between our store of `parked` and our load of `done`; pairs with
            // the fence in `complete` (see there).
            fence(Ordering::SeqCst);
            // Acquire: pairs with the Release store in `complete`.
            if self.done.load(Ordering::Acquire) {
                return self.value.lock().take();
            }
            match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    thread::park_timeout(d - now);
                }
                None => thread::park(),
            }
        }
    }
}

impl<T> Default for CallSlot<T> {
    /// Same as [`CallSlot::new`]: the current thread waits.
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for CallSlot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallSlot")
            .field("done", &self.done.load(Ordering::Relaxed))
            .field("parked", &self.parked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn delivers_to_a_parked_or_spinning_caller() {
        for strategy in [
            WaitStrategy::Park,
            WaitStrategy::default(),
            WaitStrategy::Spin,
        ] {
            for delay_ms in [0, 20] {
                let slot = Arc::new(CallSlot::new());
                let s2 = slot.clone();
                let t = std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(delay_ms));
                    s2.complete(vec![1u8, 2, 3]);
                });
                let deadline = Instant::now() + Duration::from_secs(10);
                assert_eq!(
                    slot.wait(Some(deadline), strategy),
                    Some(vec![1, 2, 3]),
                    "{strategy:?} {delay_ms} ms"
                );
                assert!(slot.is_complete());
                t.join().unwrap();
            }
        }
    }

    #[test]
    fn times_out_without_a_reply_then_takes_a_late_one() {
        let slot = CallSlot::<u32>::new();
        let start = Instant::now();
        let got = slot.wait(
            Some(start + Duration::from_millis(30)),
            WaitStrategy::default(),
        );
        assert_eq!(got, None);
        assert!(start.elapsed() >= Duration::from_millis(30));
        slot.complete(5);
        assert_eq!(slot.wait(None, WaitStrategy::Park), Some(5));
        // Taken: nothing left.
        assert_eq!(slot.wait(Some(Instant::now()), WaitStrategy::Park), None);
    }

    #[test]
    fn many_round_trips_never_stall() {
        // A completer thread answers 20k calls made one after another by one caller that
        // parks at once: a lost unpark would stall until the 10 s deadline and fail.
        let (tx, rx) = std::sync::mpsc::channel::<Arc<CallSlot<u64>>>();
        let t = std::thread::spawn(move || {
            for (i, slot) in rx.into_iter().enumerate() {
                slot.complete(i as u64);
            }
        });
        for i in 0..20_000u64 {
            let slot = Arc::new(CallSlot::new());
            tx.send(slot.clone()).unwrap();
            let got = slot.wait(
                Some(Instant::now() + Duration::from_secs(10)),
                WaitStrategy::Park,
            );
            assert_eq!(got, Some(i), "stalled at {i}");
        }
        drop(tx);
        t.join().unwrap();
    }
}
