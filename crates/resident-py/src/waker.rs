//! Wake-ups for event loops: the `Waker` pyclass (one per event loop) and the `Bell` a kernel
//! rings.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::ThreadId;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PySet;

/// One event loop's wake-up: a socket pair whose read end the loop watches
/// (`loop.add_reader`). A `Bell` rings it with one byte, without the GIL, while the loop has
/// a coroutine waiting (`armed`), at most once until the loop drains it (`pending`).
pub(crate) struct WakeReg {
    rx: UnixStream,
    tx: UnixStream,
    armed: AtomicUsize,
    pending: AtomicBool,
    /// The loop's thread: a ring made on it settles `futs` instead of writing the socket.
    owner: ThreadId,
    /// The loop's waiting futures (a Python set: its waits add and discard their own). A
    /// ring made on the loop's own thread settles them directly (no socket, no round through
    /// the selector, and nothing at all when none waits).
    futs: Py<PySet>,
}

impl WakeReg {
    /// A ring made on the loop's own thread: the loop's waiters are woken by completing
    /// their futures now (the loop runs them at its next turn).
    fn ring_local(&self) {
        Python::attach(|py| {
            if let Err(e) = self.settle(py) {
                e.write_unraisable(py, None);
            }
        })
    }

    /// Completes every future of `futs` not done yet (and empties it). A future whose loop
    /// was closed meanwhile (nobody awaits it) is left as it is.
    fn settle(&self, py: Python<'_>) -> PyResult<()> {
        let set = self.futs.bind(py);
        if set.is_empty() {
            return Ok(());
        }
        let all: Vec<Bound<'_, PyAny>> = set.iter().collect();
        set.clear();
        for f in all {
            if f.call_method0(intern!(py, "done"))?.is_truthy()? {
                continue;
            }
            if let Err(e) = f.call_method1(intern!(py, "set_result"), (py.None(),)) {
                if !e.is_instance_of::<PyRuntimeError>(py) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn ring(&self) {
        if self.armed.load(Ordering::SeqCst) > 0 && !self.pending.swap(true, Ordering::SeqCst) {
            // A full socket buffer already holds a byte that wakes the loop.
            let _ = (&self.tx).write(&[1]);
        }
    }
}

/// An event loop's wake-up as Python sees it (`resident.runtime` keeps one per loop).
#[pyclass(frozen, module = "resident._resident")]
pub(crate) struct Waker(pub(crate) Arc<WakeReg>);

#[pymethods]
impl Waker {
    #[new]
    fn new(py: Python<'_>) -> PyResult<Self> {
        let (rx, tx) = UnixStream::pair()
            .map_err(|e| PyRuntimeError::new_err(format!("wake-up socket pair: {e}")))?;
        for s in [&rx, &tx] {
            s.set_nonblocking(true)
                .map_err(|e| PyRuntimeError::new_err(format!("wake-up socket pair: {e}")))?;
        }
        Ok(Waker(Arc::new(WakeReg {
            rx,
            tx,
            armed: AtomicUsize::new(0),
            pending: AtomicBool::new(false),
            owner: this_thread(),
            futs: PySet::empty(py)?.unbind(),
        })))
    }

    /// The set of this loop's waiting futures: a wait adds its future before it looks and
    /// discards it when it ends; a ring completes them (`settle`).
    #[getter]
    fn futs(&self, py: Python<'_>) -> Py<PySet> {
        self.0.futs.clone_ref(py)
    }

    /// Completes the waiting futures (what the loop does when the socket is readable, after
    /// `drain`; a ring made on the loop's own thread does it at once).
    fn settle(&self, py: Python<'_>) -> PyResult<()> {
        self.0.settle(py)
    }

    /// The file descriptor the loop watches for reading (owned by this object).
    fn fileno(&self) -> i32 {
        self.0.rx.as_raw_fd()
    }

    /// One more coroutine waits: rings write a byte from now on.
    fn arm(&self) {
        self.0.armed.fetch_add(1, Ordering::SeqCst);
    }

    /// One coroutine less waits.
    fn disarm(&self) {
        let _ = self
            .0
            .armed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Empties the socket (called by the loop when it is readable); the next ring writes again.
    ///
    /// Reads first, then clears `pending`: cleared first, a ring between the two would write
    /// a byte that this read swallows, leaving `pending` set with an empty socket, and no
    /// ring would ever write again (the loop's waits then ended only by their periodic
    /// look). A ring between the read and the clear writes nothing, and needs not: the loop
    /// settles every waiting future right after this drain, and a waiter that looks later
    /// sees what that ring announced.
    fn drain(&self) {
        let mut buf = [0u8; 256];
        while let Ok(n) = (&self.0.rx).read(&mut buf) {
            if n < buf.len() {
                break;
            }
        }
        self.0.pending.store(false, Ordering::SeqCst);
    }
}

/// What a kernel rings when something a waiter may be waiting for happened: an output or a
/// reply published, an input taken (room for a blocked send), the handler ended, a lifecycle
/// change. Rings every subscribed event loop (`Waker`) and the handler's own `wait_active`.
#[derive(Default)]
pub(crate) struct Bell {
    loops: Mutex<Vec<Weak<WakeReg>>>,
    lock: Mutex<()>,
    cv: Condvar,
    /// Coroutines waiting for room in the kernel's input queue (`want_room`): an input taken
    /// rings the bell only while there is one (otherwise it would wake waiters for outputs
    /// for nothing, once per message or batch taken).
    pub(crate) room: AtomicUsize,
    /// Threads in `sleep_unless` (or on their way): a ring notifies the condition variable
    /// only while there is one.
    sleepers: AtomicUsize,
}

thread_local! {
    /// This thread's id (`std::thread::current()` clones a handle each call).
    static ME: ThreadId = std::thread::current().id();
}

/// The calling thread's id.
pub(crate) fn this_thread() -> ThreadId {
    ME.with(|t| *t)
}

impl Bell {
    /// Rings for an input taken: only when someone waits for room (see `room`).
    pub(crate) fn ring_room(&self) {
        // Pairs with `want_room`'s fence: either this load sees the waiter, or the waiter's
        // look (after its fence) sees the room this take made.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.room.load(Ordering::SeqCst) > 0 {
            self.ring();
        }
    }

    pub(crate) fn ring(&self) {
        // Pairs with the waiter's `arm` (SeqCst) before it looks at the engine's state.
        std::sync::atomic::fence(Ordering::SeqCst);
        // Loops running on this thread are woken directly, after the lock is let go (their
        // wake-up takes the GIL).
        // (The first without an allocation: usually the only one.)
        let mut first: Option<Arc<WakeReg>> = None;
        let mut more: Vec<Arc<WakeReg>> = Vec::new();
        {
            let me = this_thread();
            let loops = self.loops.lock();
            for w in loops.iter() {
                if let Some(r) = w.upgrade() {
                    if r.owner != me {
                        r.ring();
                    } else if first.is_none() {
                        first = Some(r);
                    } else {
                        more.push(r);
                    }
                }
            }
        }
        for r in first.into_iter().chain(more) {
            r.ring_local();
        }
        // Without a sleeper nothing to notify: one that comes later registers (SeqCst)
        // before it looks at its condition, after the fence above, so it sees what this
        // ring announces; a sleeper without a condition (a linger) misses a ring made before
        // it slept, as it would with the notification.
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this ring after a sleeper's look at its condition.
            drop(self.lock.lock());
            self.cv.notify_all();
        }
    }

    pub(crate) fn subscribe(&self, r: &Arc<WakeReg>) {
        let mut loops = self.loops.lock();
        loops.retain(|w| w.strong_count() > 0);
        if !loops
            .iter()
            .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(r)))
        {
            loops.push(Arc::downgrade(r));
        }
    }

    /// Sleeps (no GIL needed) until rung or `t` passed, unless `done()` holds already.
    pub(crate) fn sleep_unless(&self, t: Duration, done: impl Fn() -> bool) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        {
            let mut g = self.lock.lock();
            if !done() {
                self.cv.wait_for(&mut g, t);
            }
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}
