//! The synchronisation primitives of the ring protocol, the wake-up [`Signal`](crate::wait::Signal)
//! and the [`CallSlot`](crate::call::CallSlot), swapped for `loom`'s under `--cfg loom` so the
//! model checker sees every access, lock, park and unpark.
//!
//! Without loom these are plain re-exports (std atomics, `parking_lot`'s `Mutex`/`Condvar`,
//! `std::thread`): no wrapper, no extra indirection on any hot path. Under loom, thin wrappers
//! give loom's `Mutex`/`Condvar` the `parking_lot` API the code is written against.
//!
//! Time cannot be modelled: under loom a timed condvar wait or `park_timeout` is an untimed
//! wait (allowed, since a timed wait may also return early or late), so models use no deadline
//! or one that has already passed.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

#[cfg(not(loom))]
pub(crate) use parking_lot::{Condvar, Mutex};

/// Thread handles, park and unpark.
#[cfg(not(loom))]
pub(crate) mod thread {
    pub(crate) use std::thread::{current, park, park_timeout, yield_now, Thread};
}

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Arc;

#[cfg(loom)]
pub(crate) use self::loom_lock::{Condvar, Mutex};

/// Thread handles, park and unpark (loom's).
#[cfg(loom)]
pub(crate) mod thread {
    pub(crate) use loom::thread::{current, park, Thread};

    /// Loom has no timed park: modelled as an untimed park (a timed park may wake at any
    /// time, so every caller already re-checks its condition in a loop).
    pub(crate) fn park_timeout(_dur: std::time::Duration) {
        park();
    }
}

/// `parking_lot`-shaped wrappers over loom's `Mutex` and `Condvar`.
#[cfg(loom)]
mod loom_lock {
    use std::ops::{Deref, DerefMut};
    use std::time::Instant;

    /// A mutex whose `lock` returns the guard directly, as `parking_lot`'s does.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            // Poisoning only follows a panic, which already fails the model.
            MutexGuard(Some(self.0.lock().unwrap_or_else(|e| e.into_inner())))
        }
    }

    /// The guard; `Option` only so `Condvar::wait` can hand it to loom by value and back.
    pub(crate) struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0
                .as_ref()
                .expect("guard present outside a condvar wait")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0
                .as_mut()
                .expect("guard present outside a condvar wait")
        }
    }

    /// A condition variable taking `&mut guard`, as `parking_lot`'s does.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }

        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let g = guard.0.take().expect("guard present");
            guard.0 = Some(self.0.wait(g).unwrap_or_else(|e| e.into_inner()));
        }

        /// Modelled as an untimed wait: loom has no time.
        pub(crate) fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, _deadline: Instant) {
            self.wait(guard);
        }
    }
}

/// Keeps a hot value alone on a 128-byte line (two 64-byte lines, for adjacent prefetch).
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
