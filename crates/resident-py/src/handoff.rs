//! GIL hand-offs between a Python kernel's thread and the threads waiting for its outputs
//! (`Handoff`, `Waiter`), and the count of kernel threads still in Python (`InPython`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// Longest a thread waits, GIL released, for the other side of a hand-off to release the GIL
/// first (see `Handoff`).
pub(crate) const HANDOFF_SPIN: Duration = Duration::from_micros(20);

/// Who of a Python kernel's thread and the Python threads waiting for its outputs is outside
/// Python now, so that each takes the GIL back when the other has let it go.
///
/// Taking the GIL while another thread holds it puts the taker to sleep until that thread
/// lets go, and waking it costs a scheduler round trip, twice per request and reply when the
/// two threads run on two cores. So a waiter whose output came looks, GIL released, for at
/// most `HANDOFF_SPIN` whether the kernel's thread is still in Python (it lets the GIL go in
/// its next wait), and the kernel's thread, when a message came during its wait, looks as
/// long whether a waiter has let the GIL go yet (the sender is on its way to wait for the
/// reply). Both are hints: a wrong guess costs at most one bounded wait, never a missed
/// message or wake-up (the engine's waits decide those).
#[derive(Default)]
pub(crate) struct Handoff {
    /// Python threads now waiting, GIL released, for this kernel's outputs or call replies.
    pub(crate) waiting: AtomicUsize,
    /// Whether the kernel's thread is (or is about to be) running Python code.
    pub(crate) kernel_in_python: AtomicBool,
}

/// Calls `f` until it returns something or `limit` passed, yielding the core between calls
/// (see `POLL`).
pub(crate) fn poll_for<R>(limit: Duration, mut f: impl FnMut() -> Option<R>) -> Option<R> {
    if let Some(r) = f() {
        return Some(r);
    }
    let start = Instant::now();
    loop {
        std::thread::yield_now();
        if let Some(r) = f() {
            return Some(r);
        }
        if start.elapsed() >= limit {
            return None;
        }
    }
}

/// Counts a waiter in `Handoff::waiting` from inside its GIL-released wait until it holds the
/// GIL again (dropped after `detach` returned).
pub(crate) struct Waiter<'a> {
    hand: &'a Handoff,
    counted: AtomicBool,
}

impl<'a> Waiter<'a> {
    pub(crate) fn new(hand: &'a Handoff) -> Self {
        Waiter {
            hand,
            counted: AtomicBool::new(false),
        }
    }

    /// Called inside the GIL-released closure: the GIL is free from here on.
    pub(crate) fn released(&self) {
        if !self.counted.swap(true, Ordering::Relaxed) {
            self.hand.waiting.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Called inside the closure once the wait got something: lets the kernel's thread leave
    /// Python before this thread takes the GIL back.
    pub(crate) fn got(&self) {
        poll_for(HANDOFF_SPIN, || {
            (!self.hand.kernel_in_python.load(Ordering::Acquire)).then_some(())
        });
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if *self.counted.get_mut() {
            self.hand.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Python kernels' threads that may still run Python (their loop body has not returned).
static IN_PYTHON: AtomicUsize = AtomicUsize::new(0);

/// Counts a Python kernel's thread in `IN_PYTHON` until dropped (after its last use of
/// Python), so that interpreter exit can wait for abandoned handlers to leave.
pub(crate) struct InPython;

impl InPython {
    pub(crate) fn enter() -> Self {
        IN_PYTHON.fetch_add(1, Ordering::SeqCst);
        InPython
    }
}

impl Drop for InPython {
    fn drop(&mut self) {
        IN_PYTHON.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many Python kernels' threads may still run Python (see `InPython`).
#[pyfunction]
pub(crate) fn handlers_in_python() -> usize {
    IN_PYTHON.load(Ordering::SeqCst)
}
