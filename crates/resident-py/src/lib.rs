//! `resident._resident`: the compiled half of the `resident` Python package.
//!
//! A Python-handled kernel is a `RingKernel<u64, u64>` of the Rust engine in its loop form: the
//! engine's mailbox queues *handles* (keys into a per-kernel `Store` of Python objects), so
//! lanes, priorities, backpressure, `call` matching, accounting and telemetry are the engine's.
//! The kernel's own thread runs the user's `async def f(ctx)` on a private event loop; every
//! wait in Rust releases the GIL, and waits made for a Python caller run in bounded slices with
//! a signal check between them, so Ctrl-C interrupts them.
//!
//! A handle lives in the store from the moment its object is sent until it is taken out again:
//! received by the handler (input) or by the caller (output), handed back by a refused send,
//! discarded by a drop policy (`send_tracked` says which one), or returned in a terminate
//! report, or released when its call is given up (the request, if the kernel has not taken
//! it; the reply, when the kernel publishes it). What the engine discards without telling
//! otherwise (an output dropped by the output queue's drop policy) is released when the
//! kernel terminates, and a terminated kernel is freed (`forget`).
//!
//! Event loops wait without threads: each kernel has a `Bell` that its thread rings when it
//! publishes, takes an input, ends or changes state; a ring writes one byte to the socket of
//! every subscribed event loop (`Waker`) that has a coroutine waiting, and wakes the
//! handler's own `wait_active`.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use numpy::{PyArray1, PyReadonlyArray1};
use parking_lot::{Condvar, Mutex};
use pyo3::exceptions::{PyAttributeError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList};
use resident::prelude::*;

mod batch;
mod buffer;
mod device;
mod dlpack;
mod ids;
mod keyed;
mod workloads;

/// How long one uninterrupted wait for a Python caller lasts before signals are checked.
const SLICE: Duration = Duration::from_millis(20);

/// How long a wait for a Python kernel's input or output (GIL released) looks again and again
/// before it parks in the engine. Each look that finds nothing yields the core: on a machine
/// with fewer free cores than busy threads the thread that produces what this one waits for
/// often shares its core, and a pure spin would hold that core until the scheduler takes it
/// away (measured on a shared 2-vCPU VM: an echo round trip of 25 us with the engine's spin,
/// 7 us with this loop). With a free core, a yield returns at once and this is a spin.
const POLL: Duration = Duration::from_micros(50);

/// Longest a thread waits, GIL released, for the other side of a hand-off to release the GIL
/// first (see `Handoff`).
const HANDOFF_SPIN: Duration = Duration::from_micros(20);

/// Envelopes of received messages a kernel's ctx keeps for replies matched by `correlation_id`.
const PENDING_MAX: usize = 4096;

// ---- GIL hand-offs -----------------------------------------------------------------------

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
struct Handoff {
    /// Python threads now waiting, GIL released, for this kernel's outputs or call replies.
    waiting: AtomicUsize,
    /// Whether the kernel's thread is (or is about to be) running Python code.
    kernel_in_python: AtomicBool,
}

/// Calls `f` until it returns something or `limit` passed, yielding the core between calls
/// (see `POLL`).
fn poll_for<R>(limit: Duration, mut f: impl FnMut() -> Option<R>) -> Option<R> {
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
struct Waiter<'a> {
    hand: &'a Handoff,
    counted: AtomicBool,
}

impl<'a> Waiter<'a> {
    fn new(hand: &'a Handoff) -> Self {
        Waiter {
            hand,
            counted: AtomicBool::new(false),
        }
    }

    /// Called inside the GIL-released closure: the GIL is free from here on.
    fn released(&self) {
        if !self.counted.swap(true, Ordering::Relaxed) {
            self.hand.waiting.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Called inside the closure once the wait got something: lets the kernel's thread leave
    /// Python before this thread takes the GIL back.
    fn got(&self) {
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
struct InPython;

impl InPython {
    fn enter() -> Self {
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
fn handlers_in_python() -> usize {
    IN_PYTHON.load(Ordering::SeqCst)
}

/// The object `KernelCtx.recv` and `Runtime.take` return when there is no message (any Python
/// object, `None` included, may be a message).
static NOTHING: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn nothing(py: Python<'_>) -> PyResult<Py<PyAny>> {
    NOTHING
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("builtins")?.getattr("object")?.call0()?.unbind())
        })
        .map(|o| o.clone_ref(py))
}

// ---- wake-ups for event loops -----------------------------------------------------------

/// How long a handler's `wait_active` sleeps at most before it looks at the kernel's flags
/// again when no activate or terminate of this binding woke it (a shutdown's terminate, made
/// inside the engine, is seen by this look).
const ACTIVE_LOOK: Duration = Duration::from_millis(100);

/// One event loop's wake-up: a socket pair whose read end the loop watches
/// (`loop.add_reader`). A `Bell` rings it with one byte, without the GIL, while the loop has
/// a coroutine waiting (`armed`), at most once until the loop drains it (`pending`).
struct WakeReg {
    rx: UnixStream,
    tx: UnixStream,
    armed: AtomicUsize,
    pending: AtomicBool,
    /// The loop's thread: a ring made on it calls `local` instead of writing the socket.
    owner: ThreadId,
    /// Called (GIL taken) for a ring made on the loop's own thread: settles the loop's
    /// waiting futures directly (no socket, no round through the selector).
    local: Mutex<Option<Py<PyAny>>>,
}

impl WakeReg {
    /// A ring made on the loop's own thread: the loop's waiters are woken by completing
    /// their futures now (the loop runs them at its next turn).
    fn ring_local(&self) {
        Python::attach(|py| {
            let cb = self.local.lock().as_ref().map(|c| c.clone_ref(py));
            if let Some(cb) = cb {
                if let Err(e) = cb.call0(py) {
                    e.write_unraisable(py, None);
                }
            } else {
                // No local wake-up set: the socket, as from another thread.
                self.ring();
            }
        })
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
struct Waker(Arc<WakeReg>);

#[pymethods]
impl Waker {
    #[new]
    fn new() -> PyResult<Self> {
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
            owner: std::thread::current().id(),
            local: Mutex::new(None),
        })))
    }

    /// Sets what a ring made on this loop's own thread calls (the thread that made this
    /// waker), instead of writing the socket: `f()` settles the loop's waiting futures.
    fn set_local(&self, f: Py<PyAny>) {
        *self.0.local.lock() = Some(f);
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
    room: AtomicUsize,
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
        let mut here: Vec<Arc<WakeReg>> = Vec::new();
        {
            let me = std::thread::current().id();
            let loops = self.loops.lock();
            for w in loops.iter() {
                if let Some(r) = w.upgrade() {
                    if r.owner == me {
                        here.push(r);
                    } else {
                        r.ring();
                    }
                }
            }
        }
        for r in here {
            r.ring_local();
        }
        // Taking the lock orders this ring after a sleeper's look at its condition.
        drop(self.lock.lock());
        self.cv.notify_all();
    }

    fn subscribe(&self, r: &Arc<WakeReg>) {
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
    fn sleep_unless(&self, t: Duration, done: impl Fn() -> bool) {
        let mut g = self.lock.lock();
        if !done() {
            self.cv.wait_for(&mut g, t);
        }
    }
}

// ---- the object store ------------------------------------------------------------------

/// Python objects queued in a kernel, by handle.
#[derive(Default)]
struct Store {
    next: AtomicU64,
    objects: Mutex<HashMap<u64, Py<PyAny>>>,
    /// The message the handler raised on (handed back by its ctx), for the report.
    failed: Mutex<Option<Py<PyAny>>>,
    /// Message ids of calls given up while the kernel had their request (newest last, at
    /// most `ABANDONED_MAX`): their replies are released when published.
    gave_up: Mutex<VecDeque<u64>>,
}

/// Calls given up with their request in the kernel's hands that a store remembers.
const ABANDONED_MAX: usize = 4096;

impl Store {
    fn put(&self, obj: Py<PyAny>) -> u64 {
        let key = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.objects.lock().insert(key, obj);
        key
    }

    fn take(&self, key: u64) -> Option<Py<PyAny>> {
        self.objects.lock().remove(&key)
    }

    /// The objects of `keys` (those still held), in order, under one lock.
    fn take_all(&self, keys: impl IntoIterator<Item = u64>) -> Vec<Py<PyAny>> {
        let mut g = self.objects.lock();
        keys.into_iter().filter_map(|k| g.remove(&k)).collect()
    }

    fn len(&self) -> usize {
        self.objects.lock().len()
    }

    /// Whether any of `keys` is held now.
    fn holds_any(&self, mut keys: impl Iterator<Item = u64>) -> bool {
        let g = self.objects.lock();
        keys.any(|k| g.contains_key(&k))
    }

    /// Remembers that the caller of call `id` gave up while the kernel had its request.
    fn abandon(&self, id: u64) {
        let mut g = self.gave_up.lock();
        g.push_back(id);
        while g.len() > ABANDONED_MAX {
            g.pop_front();
        }
    }

    /// Whether call `id` was given up (forgets it).
    fn abandoned(&self, id: u64) -> bool {
        let mut g = self.gave_up.lock();
        match g.iter().rposition(|&x| x == id) {
            Some(i) => {
                g.remove(i);
                true
            }
            None => false,
        }
    }

    /// Releases every object left (the kernel is terminated: nothing can reach them).
    fn clear(&self) -> usize {
        let all: Vec<_> = self.objects.lock().drain().collect();
        all.len()
    }
}

// ---- errors ------------------------------------------------------------------------------

/// An engine error as Python sees it: the `resident.errors` class, text, kernel id, detail.
pub(crate) struct Described {
    pub class: &'static str,
    pub text: String,
    pub id: Option<String>,
    pub detail: Option<String>,
}

fn describe(e: &Error, has_message: bool) -> Described {
    let text = e.to_string();
    let id = e.kernel_id().map(str::to_string);
    let (class, detail) = match e {
        Error::UnknownKernel { .. } => ("KernelNotFoundError", None),
        Error::InvalidState { state, .. } => ("KernelStateError", Some(state.to_string())),
        Error::DuplicateKernel { state, .. } => ("DuplicateKernelError", Some(state.to_string())),
        Error::NotAccepting { state, .. } => ("KernelNotAcceptingError", Some(state.to_string())),
        Error::QueueFull { .. } => ("QueueFullError", None),
        Error::Timeout { op, .. } => (
            match *op {
                "send" | "call" if has_message => "SendTimeoutError",
                "send_batch" => "SendTimeoutError",
                "call" => "CallTimeoutError",
                "receive" => "ReceiveTimeoutError",
                _ => "KernelTimeoutError",
            },
            Some(op.to_string()),
        ),
        Error::KernelFailed { reason, .. } => ("KernelFailedError", Some(reason.to_string())),
        Error::Dropped { .. } => ("MessageDroppedError", None),
        Error::NoReply { .. } => ("NoReplyError", None),
        Error::BackendUnavailable { .. } => ("BackendNotAvailableError", None),
        Error::Device { source, .. } => (
            if matches!(
                &**source,
                resident::backend::DeviceError::Cuda(
                    resident::cuda::persistent::PersistentError::JitLinkUnavailable(_)
                )
            ) {
                // A numba= handler's kernel on a GPU without nvJitLink: the extra brings it.
                "NumbaNotAvailableError"
            } else if device::is_compile_error(source) {
                "CompilationError"
            } else {
                "DeviceError"
            },
            None,
        ),
        Error::InvalidConfig { reason, .. } => ("InvalidConfigError", Some(reason.clone())),
        _ => ("ResidentError", None),
    };
    Described {
        class,
        text,
        id,
        detail,
    }
}

/// Builds the Python exception: `class(text, kernel_id, detail, message)`.
pub(crate) fn build(py: Python<'_>, d: Described, returned: Option<Py<PyAny>>) -> PyErr {
    let cls = match py
        .import("resident.errors")
        .and_then(|m| m.getattr(d.class))
    {
        Ok(c) => c,
        Err(e) => return e,
    };
    let r = match returned {
        Some(o) => cls.call1((d.text, d.id, d.detail, o)),
        None => cls.call1((d.text, d.id, d.detail)),
    };
    match r {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    }
}

/// The Python exception for an engine error that carries no Python object.
pub(crate) fn engine_error(py: Python<'_>, e: &Error) -> PyErr {
    build(py, describe(e, false), None)
}

/// The Python exception for a refused send: the object it carried is taken back out of the
/// store and handed back in the exception's `message`.
///
/// `sent` is the caller's own reference to the object: a terminate that raced with this send
/// may already have released the store's.
fn refused(py: Python<'_>, store: &Store, e: Error, sent: Py<PyAny>) -> PyErr {
    let has = matches!(
        e,
        Error::QueueFull { .. }
            | Error::NotAccepting { .. }
            | Error::Timeout {
                message: Some(_),
                ..
            }
    );
    let d = describe(&e, has);
    let obj = e.into_message::<u64>().map(|k| {
        store.take(k);
        sent
    });
    build(py, d, obj)
}

// ---- the kernel context (the handler's `ctx`) --------------------------------------------

type Lctx = LoopContext<u64, u64, ()>;
/// A kernel on its caller's event loop (no thread): its loop context, held by its ctx until
/// the kernel's task ends.
type Outside = Arc<Mutex<Option<OutsideLoop<u64, u64, ()>>>>;

/// The engine's loop context, reachable from Python only on the kernel's own thread and only
/// while the loop body runs.
struct CtxPtr(*mut Lctx);
// SAFETY: the pointer is dereferenced only on the thread that owns the `LoopContext` (checked
// against `thread` in `with`), and only while that thread is inside the loop body (the pointer
// is cleared before the body returns).
unsafe impl Send for CtxPtr {}
unsafe impl Sync for CtxPtr {}

/// The `ctx` a Python kernel's coroutine receives (wrapped by `resident.KernelContext`).
#[pyclass(frozen, module = "resident._resident")]
struct KernelCtx {
    ptr: Mutex<CtxPtr>,
    /// Set for a kernel on its caller's event loop (`launch(..., outside=True)`): its loop
    /// context, used on the loop's thread (`thread`) and never waiting.
    outside: Option<Outside>,
    thread: ThreadId,
    store: Arc<Store>,
    kernel_id: String,
    hand: Arc<Handoff>,
    bell: Arc<Bell>,
    /// The store key of the last message received (0: none yet), for `hand_back`.
    last_key: AtomicU64,
    /// `message_id` of a received message -> its `Env`, for replies matched by
    /// `correlation_id` (insertion order: the oldest goes first past `PENDING_MAX`).
    pending: Py<PyDict>,
}

/// A received message's envelope, kept for its reply.
#[pyclass(frozen, module = "resident._resident")]
struct Env(Envelope);

impl KernelCtx {
    fn with<R>(&self, f: impl FnOnce(&mut Lctx) -> R) -> PyResult<R> {
        if std::thread::current().id() != self.thread {
            return Err(PyRuntimeError::new_err(format!(
                "kernel '{}': its ctx may only be used by the kernel's own coroutine",
                self.kernel_id
            )));
        }
        if let Some(o) = &self.outside {
            let mut g = o.lock();
            return match g.as_mut() {
                Some(ol) if !ol.is_finished() => Ok(f(ol)),
                _ => Err(PyRuntimeError::new_err(format!(
                    "kernel '{}': ctx used after the kernel's coroutine ended",
                    self.kernel_id
                ))),
            };
        }
        let p = self.ptr.lock().0;
        if p.is_null() {
            return Err(PyRuntimeError::new_err(format!(
                "kernel '{}': ctx used after the kernel's coroutine ended",
                self.kernel_id
            )));
        }
        // SAFETY: see `CtxPtr`: same thread, body still running.
        Ok(f(unsafe { &mut *p }))
    }

    /// Runs `f` with the GIL released, telling waiters that this thread is out of Python
    /// until `f` returned.
    fn outside<R: Send>(&self, py: Python<'_>, f: impl FnOnce() -> R + Send) -> R {
        let hand = &self.hand;
        py.detach(move || {
            hand.kernel_in_python.store(false, Ordering::Release);
            let r = f();
            hand.kernel_in_python.store(true, Ordering::Release);
            r
        })
    }

    /// The next message, waiting up to `t` (GIL released): `(envelope, handle)`.
    fn next_message(&self, py: Python<'_>, t: Duration) -> PyResult<Option<(Envelope, u64)>> {
        // Room for a sender waiting on a full lane: the engine's `on_take` hook rings (see
        // the launch).
        self.next_message_inner(py, t)
    }

    /// Up to `max` messages, waiting up to `t` (GIL released) for the first: one engine
    /// call for what is there, one wait, and (once the GIL is back) a second look for what
    /// came meanwhile, so a sender's whole `send_batch` arrives as one batch.
    fn next_messages(
        &self,
        py: Python<'_>,
        max: usize,
        t: Duration,
    ) -> PyResult<Vec<(Envelope, u64)>> {
        let got = self.with(|c| {
            let now = c.receive_batch_envelopes(max, Duration::ZERO);
            if !now.is_empty() || t.is_zero() || self.outside.is_some() {
                return now;
            }
            let p = SendPtr(c as *mut Lctx);
            let hand = &*self.hand;
            let mut got = self.outside(py, move || {
                let p = p;
                // SAFETY: same thread, body running (see `CtxPtr`).
                let c = unsafe { &mut *p.0 };
                let got = poll_for(POLL.min(t), || {
                    let v = c.receive_batch_envelopes(max, Duration::ZERO);
                    (!v.is_empty()).then_some(v)
                })
                .unwrap_or_else(|| c.receive_batch_envelopes(max, t));
                if !got.is_empty() {
                    // A sender is on its way to wait for the outputs: take the GIL once it
                    // let it go (see `Handoff`).
                    poll_for(HANDOFF_SPIN, || {
                        (hand.waiting.load(Ordering::SeqCst) > 0).then_some(())
                    });
                }
                got
            });
            if !got.is_empty() && got.len() < max {
                // A sender holding the GIL finished its batch while this thread waited.
                got.extend(c.receive_batch_envelopes(max - got.len(), Duration::ZERO));
            }
            got
        })?;
        Ok(got)
    }

    fn next_message_inner(&self, py: Python<'_>, t: Duration) -> PyResult<Option<(Envelope, u64)>> {
        self.with(|c| {
            let now = c.receive_envelope(Duration::ZERO);
            if now.is_some() || t.is_zero() || self.outside.is_some() {
                return now;
            }
            let p = SendPtr(c as *mut Lctx);
            let hand = &*self.hand;
            self.outside(py, move || {
                let p = p;
                // SAFETY: same thread, body running (see `CtxPtr`).
                let c = unsafe { &mut *p.0 };
                let got = poll_for(POLL.min(t), || c.receive_envelope(Duration::ZERO))
                    .or_else(|| c.receive_envelope(t));
                if got.is_some() {
                    // The sender is on its way to wait for the reply: take the GIL once it
                    // let it go (see `Handoff`).
                    poll_for(HANDOFF_SPIN, || {
                        (hand.waiting.load(Ordering::SeqCst) > 0).then_some(())
                    });
                }
                got
            })
        })
    }

    /// Publishes `key` as the reply to `request` (or to the last message received).
    fn publish(&self, py: Python<'_>, key: u64, request: Option<Envelope>) -> PyResult<()> {
        let call = request
            .as_ref()
            .filter(|e| e.flags & resident::ring::FLAG_CALL != 0)
            .map(|e| e.message_id);
        let r = self.publish_inner(py, key, request);
        if call.is_some_and(|id| self.store.abandoned(id)) {
            // Its caller gave up before: the engine discarded the reply.
            self.store.take(key);
        }
        self.bell.ring();
        r
    }

    /// Publishes `items` (request envelope or None, store key) in order: each run that fits
    /// the output queue in one engine call (GIL held: it cannot wait), one output at a time
    /// with the GIL released while the queue is full.
    fn publish_many(&self, py: Python<'_>, items: &[(Option<Envelope>, u64)]) -> PyResult<()> {
        let mut i = 0;
        while i < items.len() {
            let room = self.with(|c| c.output_room())?;
            if room > 0 {
                let n = room.min(items.len() - i);
                self.with(|c| c.send_replies(items[i..i + n].iter().copied()))?;
                i += n;
            } else {
                let (request, key) = items[i];
                self.publish_inner(py, key, request)?;
                i += 1;
            }
        }
        Ok(())
    }

    fn publish_inner(&self, py: Python<'_>, key: u64, request: Option<Envelope>) -> PyResult<()> {
        self.with(|c| {
            if c.output_has_room() || self.outside.is_some() {
                // The kernel is its output's only producer: this send does not wait (one on
                // its caller's loop awaits room before it sends: `KernelContext.send`).
                return match request {
                    Some(env) => c.send_reply(&env, key),
                    None => c.send(key),
                };
            }
            let p = SendPtr(c as *mut Lctx);
            self.outside(py, move || {
                let p = p;
                // SAFETY: same thread, body running (see `CtxPtr`).
                let c = unsafe { &mut *p.0 };
                match request {
                    Some(env) => c.send_reply(&env, key),
                    None => c.send(key),
                }
            })
        })
    }
}

/// An envelope as Python sees it: (message_id, priority, flags, timestamp_ns).
type EnvTuple = (u64, u8, u8, u64);

fn env_tuple(e: &Envelope) -> EnvTuple {
    (e.message_id, e.priority, e.flags, e.timestamp_ns)
}

fn env_from(t: EnvTuple) -> Envelope {
    let mut e = Envelope::new(t.0, t.1, t.3);
    e.flags = t.2;
    e
}

/// `KernelContext._forget` on the context's books: removes engine id `eid`'s entry and
/// returns its envelope (None when it was answered or forgotten already). `mid_gone`: its
/// `by_mid` entry was taken out already.
fn forget_entry<'py>(
    py: Python<'py>,
    eid: u64,
    mid_gone: bool,
    envs: &Bound<'py, PyDict>,
    by_mid: &Bound<'py, PyDict>,
    by_obj: &Bound<'py, PyDict>,
    calls: &Bound<'py, PyDict>,
) -> PyResult<Option<Envelope>> {
    let Some(entry) = envs.get_item(eid)? else {
        return Ok(None);
    };
    envs.del_item(eid)?;
    let (env, mid, oid): (EnvTuple, Option<Bound<'py, PyAny>>, Bound<'py, PyAny>) =
        entry.extract()?;
    if calls.contains(eid)? {
        calls.del_item(eid)?;
    }
    let is_eid = |v: Option<Bound<'py, PyAny>>| -> bool {
        v.and_then(|v| v.extract::<u64>().ok()) == Some(eid)
    };
    if let Some(mid) = mid.filter(|m| !mid_gone && !m.is_none()) {
        if is_eid(by_mid.get_item(&mid).unwrap_or(None)) {
            by_mid.del_item(&mid)?;
        }
    }
    if is_eid(by_obj.get_item(&oid)?) {
        by_obj.del_item(&oid)?;
    }
    let _ = py;
    Ok(Some(env_from(env)))
}

impl KernelCtx {
    /// A kernel on its caller's loop whose loop ended (finished, or terminated from the
    /// loop's own thread).
    fn ended(&self) -> bool {
        self.outside
            .as_ref()
            .is_some_and(|o| o.lock().as_ref().is_none_or(|ol| ol.is_finished()))
    }
}

struct SendPtr(*mut Lctx);
// SAFETY: moved into `py.detach` on the same thread (detach runs the closure on the calling
// thread); only the GIL is released.
unsafe impl Send for SendPtr {}

#[pymethods]
impl KernelCtx {
    #[getter]
    fn kernel_id(&self) -> &str {
        &self.kernel_id
    }

    #[getter]
    fn should_terminate(&self) -> PyResult<bool> {
        if self.ended() {
            return Ok(true);
        }
        self.with(|c| c.should_terminate())
    }

    #[getter]
    fn is_active(&self) -> PyResult<bool> {
        if self.ended() {
            return Ok(false);
        }
        self.with(|c| c.is_active())
    }

    /// Whether the kernel runs as a task of its caller's event loop (no thread).
    #[getter]
    fn on_loop(&self) -> bool {
        self.outside.is_some()
    }

    /// How many outputs the output queue takes now before a send would wait.
    #[getter]
    fn output_room(&self) -> PyResult<usize> {
        self.with(|c| c.output_room())
    }

    /// Ends a kernel on its caller's loop (its task ended): `error` (the exception its
    /// coroutine raised) fails it, as a handler that raised on a thread fails its kernel;
    /// without, it ends as terminated (or fails as a loop that returned early). Once.
    #[pyo3(signature = (error=None))]
    fn finish(&self, py: Python<'_>, error: Option<Bound<'_, PyAny>>) {
        let failure = error.map(|e| {
            format!(
                "Python handler raised: {}",
                py_failure(py, PyErr::from_value(e))
            )
        });
        if let Some(o) = &self.outside {
            let taken = o.lock().take();
            if let Some(mut ol) = taken {
                ol.finish(failure);
            }
        }
        // Waiters look again (the failure, if any, is recorded now).
        self.bell.ring();
    }

    /// Next message within `timeout` seconds (GIL released while waiting): `(obj, envelope)`,
    /// or `None` on timeout, while inactive, or once terminating.
    fn receive(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<(Py<PyAny>, EnvTuple)>> {
        loop {
            let got = self.next_message(py, secs(timeout)?)?;
            let Some((env, key)) = got else {
                return Ok(None);
            };
            self.last_key.store(key, Ordering::Relaxed);
            if let Some(obj) = self.store.take(key) {
                return Ok(Some((obj, env_tuple(&env))));
            }
            // A request whose caller gave up (its object released). On the caller's loop
            // the kernel parks after an empty look, so it looks again for what follows.
            if self.outside.is_none() {
                return Ok(None);
            }
        }
    }

    /// Up to `max` messages within `timeout` seconds (one engine call; GIL released while
    /// waiting), or None when none came (timeout, inactive, terminating). Each message is
    /// noted for its reply in the Python context's books, as `KernelContext._note` does:
    /// `envs` (engine id -> (envelope, message_id or None, id(obj))), `by_mid`
    /// (message_id -> engine id), `by_obj` (id(obj) -> engine id), `calls` (unanswered
    /// calls). Returns the objects and the last one's engine id.
    #[allow(clippy::too_many_arguments)]
    fn receive_many<'py>(
        &self,
        py: Python<'py>,
        max: usize,
        timeout: f64,
        envs: &Bound<'py, PyDict>,
        by_mid: &Bound<'py, PyDict>,
        by_obj: &Bound<'py, PyDict>,
        calls: &Bound<'py, PyDict>,
    ) -> PyResult<Option<(Bound<'py, PyList>, u64)>> {
        if max == 0 {
            return Ok(None);
        }
        let mut got = self.next_messages(py, max, secs(timeout)?)?;
        // Requests whose callers gave up hold no object: a batch of only those is no batch
        // (the caller's `objs[-1]` needs one), and on the caller's loop the kernel parks
        // after an empty look, so look again past them (without waiting).
        while !got.is_empty() && !self.store.holds_any(got.iter().map(|(_, k)| *k)) {
            got = self.next_messages(py, max, Duration::ZERO)?;
        }
        let Some(&(_, last_key)) = got.last() else {
            return Ok(None);
        };
        self.last_key.store(last_key, Ordering::Relaxed);
        let mut eids = Vec::with_capacity(got.len());
        let objs = {
            let mut g = self.store.objects.lock();
            got.iter()
                .filter_map(|(env, key)| {
                    let o = g.remove(key)?;
                    eids.push(*env);
                    Some(o)
                })
                .collect::<Vec<_>>()
        };
        let out = PyList::empty(py);
        let mut last = 0;
        for (env, obj) in eids.iter().zip(objs) {
            let obj = obj.into_bound(py);
            let eid = env.message_id;
            let mut mid = match obj.getattr(intern!(py, "message_id")) {
                Ok(m) if !m.is_none() => Some(m),
                Ok(_) => None,
                Err(e) if e.is_instance_of::<PyAttributeError>(py) => None,
                Err(e) => return Err(e),
            };
            if let Some(m) = &mid {
                match by_mid.set_item(m, eid) {
                    Ok(()) => {}
                    // An unhashable id: found by identity or order instead.
                    Err(e) if e.is_instance_of::<PyTypeError>(py) => mid = None,
                    Err(e) => return Err(e),
                }
            }
            let oid = obj.as_ptr() as usize;
            envs.set_item(eid, (env_tuple(env), mid, oid))?;
            by_obj.set_item(oid, eid)?;
            if env.flags & resident::ring::FLAG_CALL != 0 {
                calls.set_item(eid, py.None())?;
            }
            out.append(obj)?;
            last = eid;
        }
        Ok(Some((out, last)))
    }

    /// Sends every object of `objs` on the output queue, in order, each as the reply its
    /// own `send` would make (see `KernelContext.send`), or, with `eids`, to the message
    /// each names (engine ids; None: the last message received). One engine call per run of
    /// outputs that fits the queue (a full queue waits for room, GIL released) and one ring
    /// of the bell for the whole batch. `last` is the last message received's engine id.
    #[pyo3(signature = (objs, eids, envs, by_mid, by_obj, calls, last))]
    #[allow(clippy::too_many_arguments)]
    fn send_many<'py>(
        &self,
        py: Python<'py>,
        objs: Vec<Py<PyAny>>,
        eids: Option<Vec<Option<u64>>>,
        envs: &Bound<'py, PyDict>,
        by_mid: &Bound<'py, PyDict>,
        by_obj: &Bound<'py, PyDict>,
        calls: &Bound<'py, PyDict>,
        last: Option<u64>,
    ) -> PyResult<()> {
        if objs.is_empty() {
            return Ok(());
        }
        if eids.as_ref().is_some_and(|e| e.len() != objs.len()) {
            return Err(PyValueError::new_err(
                "send_batch: reply_to must name one received message per output",
            ));
        }
        let mut items: Vec<(Option<Envelope>, u64)> = Vec::with_capacity(objs.len());
        for (i, obj) in objs.into_iter().enumerate() {
            let eid = match &eids {
                Some(e) => e[i].map(|e| (e, false)),
                None => {
                    let b = obj.bind(py);
                    let cid = match b.getattr(intern!(py, "correlation_id")) {
                        Ok(c) if !c.is_none() => Some(c),
                        Ok(_) => None,
                        Err(e) if e.is_instance_of::<PyAttributeError>(py) => None,
                        Err(e) => return Err(e),
                    };
                    let mut eid = None;
                    if let Some(c) = &cid {
                        // Taken out of `by_mid` at once: one hash of the id (a UUID's hash
                        // is a Python call), not one here and two in `forget_entry`.
                        eid = match by_mid.call_method1(intern!(py, "pop"), (c, py.None())) {
                            Ok(v) if v.is_none() => None,
                            Ok(v) => Some(v.extract::<u64>()?),
                            Err(e) if e.is_instance_of::<PyTypeError>(py) => None,
                            Err(e) => return Err(e),
                        };
                    }
                    let by_cid = eid.is_some();
                    if eid.is_none() && cid.is_none() {
                        if let Some((k, _)) = calls.iter().next() {
                            eid = Some(k.extract::<u64>()?);
                        }
                    }
                    eid.map(|e| (e, by_cid)).or(last.map(|e| (e, false)))
                }
            };
            let env = match eid {
                Some((eid, mid_gone)) => {
                    forget_entry(py, eid, mid_gone, envs, by_mid, by_obj, calls)?
                }
                None => None,
            };
            items.push((env, self.store.put(obj)));
        }
        let r = self.publish_many(py, &items);
        for (env, key) in &items {
            if let Some(env) = env.filter(|e| e.flags & resident::ring::FLAG_CALL != 0) {
                if self.store.abandoned(env.message_id) {
                    // Its caller gave up before: the engine discarded the reply.
                    self.store.take(*key);
                }
            }
        }
        self.bell.ring();
        r
    }

    /// Puts `obj` (the last message received, which the handler failed on) back under its
    /// key, so that the kernel's report hands it back as `failed_message`.
    fn hand_back(&self, obj: Py<PyAny>) {
        if self.last_key.load(Ordering::Relaxed) != 0 {
            *self.store.failed.lock() = Some(obj);
        }
    }

    /// The next message within `timeout` seconds (GIL released while waiting), or
    /// `NOTHING` on timeout, while inactive, or once terminating. Its envelope is kept under
    /// its `message_id` (when it has a hashable one) for the reply `reply` matches to it.
    fn recv(&self, py: Python<'_>, timeout: f64) -> PyResult<Py<PyAny>> {
        let got = self.next_message(py, secs(timeout)?)?;
        let Some((env, obj)) = got.and_then(|(env, key)| self.store.take(key).map(|o| (env, o)))
        else {
            return nothing(py);
        };
        let mid = match obj.bind(py).getattr(intern!(py, "message_id")) {
            Ok(m) => m,
            Err(e) if e.is_instance_of::<PyAttributeError>(py) => return Ok(obj),
            Err(e) => return Err(e),
        };
        if mid.is_none() {
            return Ok(obj);
        }
        let pending = self.pending.bind(py);
        match pending.set_item(mid, Env(env)) {
            Ok(()) => {
                if pending.len() > PENDING_MAX {
                    let oldest = pending.iter().next().map(|(k, _)| k);
                    if let Some(k) = oldest {
                        pending.del_item(k)?;
                    }
                }
            }
            // An unhashable id: its reply goes to the last message received.
            Err(e) if e.is_instance_of::<PyTypeError>(py) => {}
            Err(e) => return Err(e),
        }
        Ok(obj)
    }

    /// Sends `obj` on the output queue: as the reply to the message whose `message_id` is
    /// `obj.correlation_id` if this kernel received it (and has not answered it yet), else
    /// as the reply to the last message received. May wait for room on a full output queue
    /// (GIL released).
    fn reply(&self, py: Python<'_>, obj: Py<PyAny>) -> PyResult<()> {
        let mut request = None;
        match obj.bind(py).getattr(intern!(py, "correlation_id")) {
            Ok(cid) if !cid.is_none() => {
                let pending = self.pending.bind(py);
                match pending.get_item(&cid) {
                    Ok(Some(env)) => {
                        request = Some(env.cast::<Env>()?.get().0);
                        pending.del_item(&cid)?;
                    }
                    Ok(None) => {}
                    Err(e) if e.is_instance_of::<PyTypeError>(py) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(_) => {}
            Err(e) if e.is_instance_of::<PyAttributeError>(py) => {}
            Err(e) => return Err(e),
        }
        let key = self.store.put(obj);
        self.publish(py, key, request)
    }

    /// Sends `obj` as the reply to `request` (an envelope from `receive`), or to the last
    /// message received when `request` is None. May wait for room on a full output queue
    /// (GIL released).
    #[pyo3(signature = (obj, request=None))]
    fn send(&self, py: Python<'_>, obj: Py<PyAny>, request: Option<EnvTuple>) -> PyResult<()> {
        let key = self.store.put(obj);
        self.publish(py, key, request.map(env_from))
    }

    /// Waits (GIL released) up to `timeout` seconds until the kernel is active or
    /// terminating; returns `is_active`.
    fn wait_active(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let t = secs(timeout)?;
        if self.outside.is_some() {
            // On the caller's loop: never waits (the coroutine awaits the bell instead).
            return self.with(|c| c.is_active());
        }
        let bell = &*self.bell;
        self.with(|c| {
            let p = SendPtr(c as *mut Lctx);
            self.outside(py, move || {
                let p = p;
                // SAFETY: same thread, body running (see `CtxPtr`).
                let c = unsafe { &mut *p.0 };
                let deadline = Instant::now() + t;
                // Parks until this binding's activate or terminate rings the kernel's bell
                // (no CPU while idle), looking at the flags every `ACTIVE_LOOK` at most.
                loop {
                    if c.is_active() || c.should_terminate() {
                        break;
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    let c = &*c;
                    bell.sleep_unless(left.min(ACTIVE_LOOK), || {
                        c.is_active() || c.should_terminate()
                    });
                }
                c.is_active()
            })
        })
    }
}

/// A message's priority for a batch send: its `priority` attribute (128 without one), an
/// int in 0-255 (`ValueError` otherwise, as `send` raises).
fn priority_of(obj: &Bound<'_, PyAny>) -> PyResult<u8> {
    let py = obj.py();
    match obj.getattr(intern!(py, "priority")) {
        Ok(p) => {
            let ok = p.is_instance_of::<pyo3::types::PyInt>();
            match p.extract::<u8>() {
                Ok(v) if ok => Ok(v),
                _ => Err(PyValueError::new_err(format!(
                    "priority must be an int in 0-255, got {}",
                    p.repr().map(|r| r.to_string()).unwrap_or_default()
                ))),
            }
        }
        Err(e) if e.is_instance_of::<PyAttributeError>(py) => Ok(128),
        Err(e) => Err(e),
    }
}

/// An output as Python gets it: the object and (message_id, correlation_id).
type Output = (Py<PyAny>, (u64, u64));

fn secs(s: f64) -> PyResult<Duration> {
    if !s.is_finite() || s < 0.0 {
        return Err(PyValueError::new_err(format!(
            "timeout must be a finite number of seconds >= 0, got {s}"
        )));
    }
    Ok(Duration::from_secs_f64(s.min(1e9)))
}

// ---- the runtime ---------------------------------------------------------------------------

/// The lifecycle operations every kernel kind shares.
pub(crate) trait KernelOps: Send + Sync {
    fn activate(&self) -> resident::Result<()>;
    fn deactivate(&self) -> resident::Result<()>;
    fn state(&self) -> KernelState;
    fn telemetry(&self) -> Telemetry;
}

impl<In: resident::ring::Message, Out: resident::ring::Message> KernelOps
    for KernelHandle<In, Out>
{
    fn activate(&self) -> resident::Result<()> {
        KernelHandle::activate(self)
    }
    fn deactivate(&self) -> resident::Result<()> {
        KernelHandle::deactivate(self)
    }
    fn state(&self) -> KernelState {
        KernelHandle::state(self)
    }
    fn telemetry(&self) -> Telemetry {
        KernelHandle::telemetry(self)
    }
}

/// A Python exception raised by a handler, as a failure reason (with its traceback).
pub(crate) fn py_failure(py: Python<'_>, e: PyErr) -> String {
    let tb = e
        .traceback(py)
        .and_then(|t| t.format().ok())
        .unwrap_or_default();
    format!("{e}\n{tb}").trim_end().to_string()
}

struct Kern {
    handle: KernelHandle<u64, u64>,
    store: Arc<Store>,
    hand: Arc<Handoff>,
    bell: Arc<Bell>,
    /// Sends under `Block` may wait (GIL released); the other policies never wait.
    blocks: bool,
    /// The block timeout under `Block` (how long a send waits for room).
    block: Duration,
    /// Runs on its caller's event loop (no thread): inputs sent ring its bell.
    outside: bool,
}

impl Kern {
    /// After inputs were queued: a kernel on its caller's loop learns of them by its bell
    /// (a kernel on a thread waits in the engine).
    fn inputs_sent(&self) {
        if self.outside {
            self.bell.ring();
        }
    }
}

/// How many terminated kernels the binding remembers (id, final state) after freeing them,
/// as the engine's `recently_terminated` does.
const GONE_MAX: usize = 256;

/// The engine's runtime and the Python kernels launched on it.
#[pyclass(frozen, name = "Runtime", module = "resident._resident")]
struct PyRuntime {
    rt: Mutex<Option<resident::runtime::Runtime>>,
    kernels: Mutex<HashMap<String, Arc<Kern>>>,
    batch: Mutex<HashMap<String, Arc<dyn batch::BatchKernel>>>,
    /// Every live kernel's bell (Python and batch kernels).
    bells: Mutex<HashMap<String, Arc<Bell>>>,
    /// Kernels terminated and freed, newest last: (id, final state).
    gone: Mutex<VecDeque<(String, KernelState)>>,
    backend: String,
}

pub(crate) fn parse_backend(s: &str) -> PyResult<Backend> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "auto" => Backend::Auto,
        "cpu" => Backend::Cpu,
        "cuda" => Backend::Cuda,
        "wgpu" => Backend::Wgpu,
        "cudasim" | "cuda-sim" | "cuda_sim" => Backend::CudaSim,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown backend '{other}': expected auto, cpu, cuda, wgpu or cudasim"
            )))
        }
    })
}

fn parse_policy(s: &str, block_timeout: f64) -> PyResult<Backpressure> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "block" => Backpressure::Block(secs(block_timeout)?),
        "reject" => Backpressure::Reject,
        "drop_oldest" => Backpressure::DropOldest,
        "drop_newest" => Backpressure::DropNewest,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown backpressure '{other}': expected block, reject, drop_oldest or \
                 drop_newest"
            )))
        }
    })
}

impl PyRuntime {
    fn kern(&self, py: Python<'_>, id: &str) -> PyResult<Arc<Kern>> {
        self.kernels
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| self.missing(py, id, "use"))
    }

    /// The final state of a kernel terminated and freed, if it is still remembered.
    fn gone_state(&self, id: &str) -> Option<KernelState> {
        self.gone
            .lock()
            .iter()
            .rev()
            .find(|(g, _)| g == id)
            .map(|(_, st)| st.clone())
    }

    /// The error for an operation on a kernel that is not live: its final state when it was
    /// terminated (and is still remembered), else unknown.
    fn missing(&self, py: Python<'_>, id: &str, op: &'static str) -> PyErr {
        match self.gone_state(id) {
            Some(state) => engine_error(
                py,
                &Error::InvalidState {
                    id: id.to_string(),
                    op,
                    state,
                },
            ),
            None => engine_error(py, &Error::UnknownKernel { id: id.to_string() }),
        }
    }

    /// A send to a kernel that is not live: refused with `obj` handed back when the kernel
    /// was terminated, else unknown.
    fn refuse_missing(&self, py: Python<'_>, id: &str, op: &str, obj: Py<PyAny>) -> PyErr {
        match self.gone_state(id) {
            Some(state) => build(
                py,
                Described {
                    class: "KernelNotAcceptingError",
                    text: format!("kernel '{id}' is {state}: {op} refused, message returned"),
                    id: Some(id.to_string()),
                    detail: Some(state.to_string()),
                },
                Some(obj),
            ),
            None => engine_error(py, &Error::UnknownKernel { id: id.to_string() }),
        }
    }

    /// Frees a terminated kernel (queues, store, bell): the binding keeps only its id and
    /// final state among the last `GONE_MAX`, so a late operation gets the same typed error.
    fn forget_kernel(&self, id: &str, state: KernelState) {
        let k = self.kernels.lock().remove(id);
        let b = self.batch.lock().remove(id);
        let bell = self.bells.lock().remove(id);
        if let Some(bell) = bell {
            bell.ring();
        }
        if k.is_some() || b.is_some() {
            let mut gone = self.gone.lock();
            gone.retain(|(g, _)| g != id);
            gone.push_back((id.to_string(), state));
            while gone.len() > GONE_MAX {
                gone.pop_front();
            }
        }
    }

    /// Rings a live kernel's bell (after a lifecycle change).
    fn ring(&self, id: &str) {
        let b = self.bells.lock().get(id).cloned();
        if let Some(b) = b {
            b.ring();
        }
    }

    fn bell(&self, py: Python<'_>, id: &str) -> PyResult<Arc<Bell>> {
        self.bells
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| self.missing(py, id, "wait"))
    }

    /// Any kernel's lifecycle operations.
    fn ops(&self, py: Python<'_>, id: &str, op: &'static str) -> PyResult<Arc<dyn KernelOps>> {
        if let Some(k) = self.kernels.lock().get(id) {
            return Ok(Arc::new(k.handle.clone()));
        }
        if let Some(b) = self.batch.lock().get(id) {
            return Ok(Arc::new(BatchOps(b.clone())));
        }
        Err(self.missing(py, id, op))
    }

    /// A live kernel's state, or a freed kernel's final state.
    fn state_of(&self, py: Python<'_>, id: &str) -> PyResult<KernelState> {
        match self.ops(py, id, "read the state of") {
            Ok(k) => Ok(k.state()),
            Err(e) => self.gone_state(id).ok_or(e),
        }
    }

    fn batch_kern(&self, py: Python<'_>, id: &str) -> PyResult<Arc<dyn batch::BatchKernel>> {
        self.batch
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| self.missing(py, id, "use"))
    }

    /// Runs a blocking engine wait in slices with the GIL released, checking for signals
    /// between slices; `f(slice)` returns `None` to go on waiting. A wait for a Python
    /// kernel's outputs passes its `Handoff` (counted as a waiter; see there).
    fn sliced<R: Send>(
        py: Python<'_>,
        hand: Option<&Handoff>,
        timeout: Duration,
        mut f: impl FnMut(Duration) -> Option<R> + Send,
    ) -> PyResult<Option<R>> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let left = deadline.map_or(SLICE, |d| d.saturating_duration_since(Instant::now()));
            let slice = left.min(SLICE);
            let got = match hand {
                Some(hand) => {
                    let w = Waiter::new(hand);
                    py.detach(|| {
                        w.released();
                        let r = f(slice);
                        if r.is_some() {
                            w.got();
                        }
                        r
                    })
                }
                None => py.detach(|| f(slice)),
            };
            if let Some(r) = got {
                return Ok(Some(r));
            }
            py.check_signals()?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// Waits (GIL released, in slices with Ctrl-C honoured) until kernel `k`'s input queue
    /// has room, up to its block timeout: a send under `Block` to a full queue waits here
    /// rather than inside the engine, where a signal would not be seen until the block timeout.
    /// `Ok(false)`: no room came in time (the send would time out) and the kernel still
    /// accepts messages; a kernel that stopped accepting ends the wait at once (`Ok(true)`,
    /// the send is then refused by the engine with the message handed back).
    fn wait_room(py: Python<'_>, k: &Kern) -> PyResult<bool> {
        let h = &k.handle;
        let ready = || h.input_has_room() || !h.state().accepts_messages();
        let got = Self::sliced(py, None, k.block, |slice| {
            let end = Instant::now() + slice;
            let mut spins = 0u32;
            loop {
                if ready() {
                    return Some(());
                }
                if Instant::now() >= end {
                    return None;
                }
                if spins < 64 {
                    spins += 1;
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        })?;
        Ok(got.is_some() || ready())
    }

    /// The `SendTimeoutError` of a send to kernel `kernel_id` that found no room within its
    /// block timeout, `obj` handed back.
    fn room_timeout(
        py: Python<'_>,
        kernel_id: &str,
        k: &Kern,
        op: &'static str,
        obj: Py<PyAny>,
    ) -> PyErr {
        let e = Error::Timeout {
            id: kernel_id.to_string(),
            op,
            timeout: k.block,
            message: None,
        };
        build(py, describe(&e, true), Some(obj))
    }

    /// The next output of a Python kernel if one is ready, or comes within `wait` (one
    /// short wait, GIL released, at most a slice).
    fn output_within(
        py: Python<'_>,
        k: &Kern,
        wait: Duration,
    ) -> PyResult<Option<(Envelope, Py<PyAny>)>> {
        let w = wait.min(SLICE);
        let mut r = k.handle.receive_envelope(Duration::ZERO);
        if !w.is_zero() && matches!(r, Err(Error::Timeout { .. })) {
            let waiter = Waiter::new(&k.hand);
            r = py.detach(|| {
                waiter.released();
                let r = match poll_for(POLL.min(w), || {
                    k.handle.receive_envelope(Duration::ZERO).ok()
                }) {
                    Some(x) => Ok(x),
                    None => k.handle.receive_envelope(w),
                };
                if r.is_ok() {
                    waiter.got();
                }
                r
            });
        }
        match r {
            Ok((env, key)) => Ok(k.store.take(key).map(|o| (env, o))),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(engine_error(py, &e)),
        }
    }
}

/// A report as a dict: counts, failure, and the Python objects handed back.
fn report_dict<'py>(
    py: Python<'py>,
    r: TerminateReport<u64, u64>,
    store: &Store,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kernel_id", &r.kernel_id)?;
    d.set_item("processed", r.processed)?;
    d.set_item("dropped", r.dropped)?;
    let undelivered = PyList::empty(py);
    let mut lost = 0usize;
    for (env, key) in &r.undelivered {
        match store.take(*key) {
            Some(o) => undelivered.append((o, env_tuple(env)))?,
            None => lost += 1,
        }
    }
    let unreceived = PyList::empty(py);
    for (env, key) in &r.unreceived {
        match store.take(*key) {
            Some(o) => unreceived.append((o, env_tuple(env)))?,
            None => lost += 1,
        }
    }
    d.set_item("undelivered", undelivered)?;
    d.set_item("unreceived", unreceived)?;
    match &r.failure {
        Some((reason, msg)) => {
            d.set_item("failure", reason.to_string())?;
            let m = msg
                .as_ref()
                .and_then(|(env, k)| store.take(*k).map(|o| (o, Some(env_tuple(env)))));
            // A Python handler that raised: its ctx handed the message back.
            let m = m.or_else(|| store.failed.lock().take().map(|o| (o, None)));
            d.set_item("failed_message", m)?;
        }
        None => {
            d.set_item("failure", py.None())?;
            d.set_item("failed_message", py.None())?;
        }
    }
    // Objects the engine discarded without telling (outputs dropped by policy, late replies).
    d.set_item("released", store.clear())?;
    d.set_item("missing", lost)?;
    Ok(d)
}

impl Drop for PyRuntime {
    /// A runtime dropped without `shutdown` (garbage collected) shuts down with the GIL
    /// released, so its Python kernels can see the request and end instead of being waited
    /// for until the shutdown timeout. (At interpreter exit the package's `atexit` hook has
    /// shut every runtime down already.)
    fn drop(&mut self) {
        if let Some(rt) = self.rt.get_mut().take() {
            Python::attach(|py| py.detach(move || drop(rt.shutdown())));
        }
    }
}

/// A batch kernel's report as a dict; records as one uint8 array each.
fn bytes_report_dict<'py>(
    py: Python<'py>,
    id: &str,
    r: batch::BytesReport,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kernel_id", id)?;
    d.set_item("processed", r.processed)?;
    d.set_item("dropped", r.dropped)?;
    d.set_item("undelivered", PyArray1::from_vec(py, r.undelivered))?;
    d.set_item("unreceived", PyArray1::from_vec(py, r.unreceived))?;
    d.set_item("failure", r.failure)?;
    d.set_item("failed_message", py.None())?;
    d.set_item("released", 0)?;
    d.set_item("missing", 0)?;
    Ok(d)
}

/// A batch kernel seen through its lifecycle operations.
struct BatchOps(Arc<dyn batch::BatchKernel>);

impl KernelOps for BatchOps {
    fn activate(&self) -> resident::Result<()> {
        self.0.ops().activate()
    }
    fn deactivate(&self) -> resident::Result<()> {
        self.0.ops().deactivate()
    }
    fn state(&self) -> KernelState {
        self.0.ops().state()
    }
    fn telemetry(&self) -> Telemetry {
        self.0.ops().telemetry()
    }
}

#[pymethods]
impl PyRuntime {
    #[new]
    #[pyo3(signature = (backend="auto", enable_telemetry=true, shutdown_timeout=5.0, terminate_timeout=10.0))]
    fn new(
        py: Python<'_>,
        backend: &str,
        enable_telemetry: bool,
        shutdown_timeout: f64,
        terminate_timeout: f64,
    ) -> PyResult<Self> {
        let b = parse_backend(backend)?;
        let (st, tt) = (secs(shutdown_timeout)?, secs(terminate_timeout)?);
        let rt = py
            .detach(|| {
                resident::runtime::Runtime::builder()
                    .backend(b)
                    .enable_telemetry(enable_telemetry)
                    .shutdown_timeout(st)
                    .terminate_timeout(tt)
                    .build()
            })
            .map_err(|e| engine_error(py, &e))?;
        let backend = match rt.backend() {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Wgpu => "wgpu",
            Backend::CudaSim => "cudasim",
            Backend::Auto => "auto",
        }
        .to_string();
        Ok(PyRuntime {
            rt: Mutex::new(Some(rt)),
            kernels: Mutex::new(HashMap::new()),
            batch: Mutex::new(HashMap::new()),
            bells: Mutex::new(HashMap::new()),
            gone: Mutex::new(VecDeque::new()),
            backend,
        })
    }

    /// The backend the runtime resolved to (`auto` becomes what was found).
    #[getter]
    fn backend(&self) -> &str {
        &self.backend
    }

    /// Launches a Python kernel: `runner(func, ctx)` runs on the kernel's own thread. With
    /// `outside`, no thread: the kernel's ctx is returned, for the caller to run the
    /// coroutine as a task of its event loop (on this thread) and `finish` it when it ends.
    #[pyo3(signature = (kernel_id, runner, func, queue_size, backpressure, block_timeout, priority_lanes, output_queue_size=None, outside=false))]
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        py: Python<'_>,
        kernel_id: String,
        runner: Py<PyAny>,
        func: Py<PyAny>,
        queue_size: usize,
        backpressure: &str,
        block_timeout: f64,
        priority_lanes: usize,
        output_queue_size: Option<usize>,
        outside: bool,
    ) -> PyResult<Option<Py<KernelCtx>>> {
        let policy = parse_policy(backpressure, block_timeout)?;
        let blocks = matches!(policy, Backpressure::Block(_));
        let block = match policy {
            Backpressure::Block(d) => d,
            _ => Duration::ZERO,
        };
        if queue_size == 0 {
            return Err(PyValueError::new_err("queue_size must be at least 1"));
        }
        let store = Arc::new(Store::default());
        let body_store = store.clone();
        let hand = Arc::new(Handoff::default());
        let body_hand = hand.clone();
        let bell = Arc::new(Bell::default());
        let body_bell = bell.clone();
        let id = kernel_id.clone();
        let mut k = RingKernel::<u64, u64>::new(kernel_id.clone())
            .queue_size(queue_size)
            .priority_lanes(priority_lanes)
            .backpressure(policy);
        if let Some(n) = output_queue_size {
            k = k.output_queue_size(n);
        }
        // The binding looks for inputs and outputs itself first (`POLL`); the engine's waits
        // after that park at once instead of spinning again.
        k = k.wait_strategy(WaitStrategy::Park);
        // Inputs taken: room for a sender waiting on a full lane (rings only while one waits).
        let take_bell = bell.clone();
        k = k.on_take(move || take_bell.ring_room());
        let slot: Outside = Arc::new(Mutex::new(None));
        let k = if outside {
            // The loop's task learns of a terminate (also the engine's own, at shutdown) by
            // the bell.
            let term_bell = bell.clone();
            let put = slot.clone();
            drop((runner, func, body_store, body_hand, body_bell, id));
            k.on_terminate(move || term_bell.ring())
                .run_outside(move |ol| *put.lock() = Some(ol))
        } else {
            k.run(move |lctx: &mut Lctx| {
                let in_python = InPython::enter();
                let outcome: PyResult<()> = Python::attach(|py| {
                    body_hand.kernel_in_python.store(true, Ordering::Release);
                    let ctx = KernelCtx {
                        ptr: Mutex::new(CtxPtr(lctx as *mut Lctx)),
                        outside: None,
                        thread: std::thread::current().id(),
                        store: body_store,
                        kernel_id: id.clone(),
                        hand: body_hand.clone(),
                        bell: body_bell.clone(),
                        last_key: AtomicU64::new(0),
                        pending: PyDict::new(py).unbind(),
                    };
                    let ctx = Py::new(py, ctx)?;
                    let r = runner.call1(py, (func.clone_ref(py), ctx.clone_ref(py)));
                    ctx.get().ptr.lock().0 = std::ptr::null_mut();
                    body_hand.kernel_in_python.store(false, Ordering::Release);
                    r.map(|_| ())
                });
                // Waiters look again (the engine marks a failure after this returns: they see
                // it at their next periodic look).
                body_bell.ring();
                if let Err(e) = outcome {
                    // The exception's text and traceback (formatted under the GIL).
                    let reason = Python::attach(|py| py_failure(py, e));
                    drop(in_python);
                    // The engine turns a panic of the loop body into `Failed(reason)` and tells
                    // waiting callers at once.
                    std::panic::resume_unwind(Box::new(format!("Python handler raised: {reason}")));
                }
            })
        };
        let rt = self.rt.lock();
        let rt = rt
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("the runtime was shut down"))?;
        let handle = py
            .detach(|| rt.launch(k))
            .map_err(|e| engine_error(py, &e))?;
        let ctx = if outside {
            let ctx = KernelCtx {
                ptr: Mutex::new(CtxPtr(std::ptr::null_mut())),
                outside: Some(slot),
                thread: std::thread::current().id(),
                store: store.clone(),
                kernel_id: kernel_id.clone(),
                hand: hand.clone(),
                bell: bell.clone(),
                last_key: AtomicU64::new(0),
                pending: PyDict::new(py).unbind(),
            };
            Some(Py::new(py, ctx)?)
        } else {
            None
        };
        self.bells.lock().insert(kernel_id.clone(), bell.clone());
        self.kernels.lock().insert(
            kernel_id,
            Arc::new(Kern {
                handle,
                store,
                hand,
                bell,
                blocks,
                block,
                outside,
            }),
        );
        Ok(ctx)
    }

    fn activate(&self, py: Python<'_>, kernel_id: &str) -> PyResult<()> {
        let k = self.ops(py, kernel_id, "activate")?;
        let r = k.activate().map_err(|e| engine_error(py, &e));
        self.ring(kernel_id);
        r
    }

    fn deactivate(&self, py: Python<'_>, kernel_id: &str) -> PyResult<()> {
        let k = self.ops(py, kernel_id, "deactivate")?;
        let r = py
            .detach(|| k.deactivate())
            .map_err(|e| engine_error(py, &e));
        self.ring(kernel_id);
        r
    }

    fn state(&self, py: Python<'_>, kernel_id: &str) -> PyResult<String> {
        Ok(match self.state_of(py, kernel_id)? {
            KernelState::Failed(_) => "failed".to_string(),
            s => s.to_string(),
        })
    }

    fn failure(&self, py: Python<'_>, kernel_id: &str) -> PyResult<Option<String>> {
        Ok(match self.state_of(py, kernel_id)? {
            KernelState::Failed(r) => Some(r.to_string()),
            _ => None,
        })
    }

    fn kernel_ids(&self) -> Vec<String> {
        let mut v: Vec<String> = self.kernels.lock().keys().cloned().collect();
        v.extend(self.batch.lock().keys().cloned());
        v.sort();
        v
    }

    /// Sends `obj` at `priority`; returns the engine's message id. A send dropped by
    /// `drop_newest` returns normally (counted in `messages_dropped`), as in the engine.
    fn send(&self, py: Python<'_>, kernel_id: &str, obj: Py<PyAny>, priority: u8) -> PyResult<u64> {
        let Some(k) = self.kernels.lock().get(kernel_id).cloned() else {
            return Err(self.refuse_missing(py, kernel_id, "send", obj));
        };
        if k.blocks && !k.handle.input_has_room() && !Self::wait_room(py, &k)? {
            return Err(Self::room_timeout(py, kernel_id, &k, "send", obj));
        }
        let sent = obj.clone_ref(py);
        let key = k.store.put(obj);
        // Under `Block` a send to a full lane waits, so the GIL is released then; with room
        // it cannot wait (only GIL holders send to a Python kernel, the kernel only takes).
        let r = if k.blocks && !k.handle.input_has_room() {
            py.detach(|| k.handle.send_tracked(key, priority))
        } else {
            k.handle.send_tracked(key, priority)
        };
        match r {
            Ok((id, SendOutcome::Queued)) => {
                k.inputs_sent();
                Ok(id)
            }
            Ok((id, SendOutcome::DroppedOldest(_, old))) => {
                k.store.take(old);
                // The discarded message may be a call: its caller looks again.
                k.bell.ring();
                Ok(id)
            }
            Ok((id, SendOutcome::DroppedNewest)) => {
                k.store.take(key);
                Ok(id)
            }
            Err(e) => Err(refused(py, &k.store, e, sent)),
        }
    }

    /// Whether a send or call to this Python kernel would wait now: its policy is `block`
    /// and its input queue is full. With the GIL held between this and the send, a `false`
    /// holds for the send (only GIL holders send to a Python kernel; its thread only takes).
    /// `false` for a kernel that is not live (the send is refused at once, message handed
    /// back).
    fn would_block(&self, kernel_id: &str) -> bool {
        let k = self.kernels.lock().get(kernel_id).cloned();
        k.is_some_and(|k| k.blocks && !k.handle.input_has_room())
    }

    /// How many more messages kernel `kernel_id`'s input queue takes now (one lane's capacity
    /// minus the messages queued in all lanes): two counters read, not the whole telemetry.
    fn input_room(&self, py: Python<'_>, kernel_id: &str) -> PyResult<usize> {
        if let Some(k) = self.kernels.lock().get(kernel_id) {
            return Ok(k.handle.input_room());
        }
        if let Some(b) = self.batch.lock().get(kernel_id) {
            return Ok(b.input_room());
        }
        Err(self.missing(py, kernel_id, "send to"))
    }

    /// One coroutine more (`on`) or less waits for room in kernel `kernel_id`'s input queue:
    /// while any does, the kernel rings its bell when it takes inputs.
    fn want_room(&self, py: Python<'_>, kernel_id: &str, on: bool) -> PyResult<()> {
        let bell = self.bell(py, kernel_id)?;
        if on {
            bell.room.fetch_add(1, Ordering::SeqCst);
            // Pairs with `Bell::ring_room`'s fence (see there).
            std::sync::atomic::fence(Ordering::SeqCst);
        } else {
            let _ = bell
                .room
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        }
        Ok(())
    }

    /// Sends the objects of `objs` in order (one engine call for the batch), each at
    /// `priority` or its own `priority` attribute (default 128; every one is checked before
    /// any is sent). Returns `(taken, error)`: `taken` were queued (or dropped by a drop
    /// policy, counted); when fewer than all, `objs[taken:]` were not sent and are still the
    /// caller's: `error` (an exception object, not raised) says why, with those objects
    /// handed back in its `message`, or is None when `wait` is false and the queue was full
    /// under `block` (the caller awaits room and sends the rest). With `wait`, a full queue
    /// under `block` waits (GIL released) up to the block timeout for each message.
    #[pyo3(signature = (kernel_id, objs, priority=None, wait=true))]
    fn send_many(
        &self,
        py: Python<'_>,
        kernel_id: &str,
        objs: Vec<Py<PyAny>>,
        priority: Option<u8>,
        wait: bool,
    ) -> PyResult<(usize, Option<Py<PyAny>>)> {
        let Some(k) = self.kernels.lock().get(kernel_id).cloned() else {
            let all = PyList::new(py, &objs)?.into_any().unbind();
            return Err(self.refuse_missing(py, kernel_id, "send_batch", all));
        };
        let prios = match priority {
            Some(p) => vec![p; objs.len()],
            None => objs
                .iter()
                .map(|o| priority_of(o.bind(py)))
                .collect::<PyResult<Vec<u8>>>()?,
        };
        // A kernel on its caller's loop learns of what was queued when this returns.
        struct Rung<'a>(&'a Kern);
        impl Drop for Rung<'_> {
            fn drop(&mut self) {
                self.0.inputs_sent();
            }
        }
        let _rung = Rung(&k);
        for (i, (obj, &p)) in objs.iter().zip(&prios).enumerate() {
            let full = k.blocks && !k.handle.input_has_room();
            if full && !wait {
                return Ok((i, None));
            }
            if full {
                // Ctrl-C while waiting for room: the exception says how many were taken.
                let room = Self::wait_room(py, &k).inspect_err(|e| {
                    let _ = e.value(py).setattr("sent", i);
                })?;
                if !room {
                    let e = Error::Timeout {
                        id: kernel_id.to_string(),
                        op: "send_batch",
                        timeout: k.block,
                        message: None,
                    };
                    let rest = PyList::new(py, &objs[i..])?.into_any().unbind();
                    let err = build(py, describe(&e, true), Some(rest));
                    return Ok((i, Some(err.into_value(py).into_any())));
                }
            }
            let key = k.store.put(obj.clone_ref(py));
            // Under `Block` a send to a full lane waits, so the GIL is released then; with
            // room it cannot wait (only GIL holders send to a Python kernel).
            let r = if full {
                py.detach(|| k.handle.send_tracked(key, p))
            } else {
                k.handle.send_tracked(key, p)
            };
            match r {
                Ok((_, SendOutcome::Queued)) => {}
                Ok((_, SendOutcome::DroppedOldest(_, old))) => {
                    k.store.take(old);
                    // The discarded message may be a call: its caller looks again.
                    k.bell.ring();
                }
                Ok((_, SendOutcome::DroppedNewest)) => {
                    k.store.take(key);
                }
                Err(e) => {
                    let d = describe(&e, true);
                    if let Some(key) = e.into_message::<u64>() {
                        k.store.take(key);
                    }
                    let rest = PyList::new(py, &objs[i..])?.into_any().unbind();
                    let err = build(py, d, Some(rest));
                    return Ok((i, Some(err.into_value(py).into_any())));
                }
            }
        }
        Ok((objs.len(), None))
    }

    /// Up to `max` outputs of a Python kernel that are ready now (one engine call), or that
    /// come within `wait` seconds for the first (one short wait, GIL released, at most a
    /// slice): a list, empty when none came.
    fn take_many<'py>(
        &self,
        py: Python<'py>,
        kernel_id: &str,
        max: usize,
        wait: f64,
    ) -> PyResult<Bound<'py, PyList>> {
        let k = self.kern(py, kernel_id)?;
        let w = secs(wait)?.min(SLICE);
        if max == 0 {
            return Ok(PyList::empty(py));
        }
        let mut keys = Vec::new();
        match k.handle.receive_batch(&mut keys, max) {
            Ok(_) => {}
            Err(e) => return Err(engine_error(py, &e)),
        }
        if keys.is_empty() && !w.is_zero() {
            if let Some((_, o)) = Self::output_within(py, &k, w)? {
                let first = o;
                let _ = k.handle.receive_batch(&mut keys, max - 1);
                let mut all = vec![first];
                all.extend(k.store.take_all(keys));
                return PyList::new(py, all);
            }
        }
        PyList::new(py, k.store.take_all(keys))
    }

    /// Up to `max` outputs of a Python kernel, waiting up to `timeout` seconds (None: without
    /// limit) for the first in slices with the GIL released and Ctrl-C honoured: a list,
    /// empty on timeout.
    #[pyo3(signature = (kernel_id, max, timeout=None))]
    fn receive_many<'py>(
        &self,
        py: Python<'py>,
        kernel_id: &str,
        max: usize,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let k = self.kern(py, kernel_id)?;
        let t = timeout.map(secs).transpose()?.unwrap_or(Duration::MAX);
        if max == 0 {
            return Ok(PyList::empty(py));
        }
        let mut keys = Vec::new();
        if let Err(e) = k.handle.receive_batch(&mut keys, max) {
            return Err(engine_error(py, &e));
        }
        if keys.is_empty() && !t.is_zero() {
            let h = k.handle.clone();
            let got = Self::sliced(py, Some(&k.hand), t, |slice| {
                match h.receive_envelope(slice) {
                    Err(Error::Timeout { .. }) => None,
                    other => Some(other),
                }
            })?;
            match got {
                Some(Ok((_, key))) => {
                    keys.push(key);
                    let _ = k.handle.receive_batch(&mut keys, max - 1);
                }
                Some(Err(e)) => return Err(engine_error(py, &e)),
                None => {}
            }
        }
        PyList::new(py, k.store.take_all(keys))
    }

    /// Waits, with the GIL released, until kernel `kernel_id` rings its bell (an output or
    /// reply published, an input taken, an end or a state change) or `seconds` pass (clamped
    /// to 0..=1 ms): the short linger an async wait makes before it parks on the loop's
    /// wake-up, so a reply that comes within it costs no round through the event loop. The
    /// caller looks after each return (a ring may be for something else).
    fn linger(&self, py: Python<'_>, kernel_id: &str, seconds: f64) -> PyResult<()> {
        let bell = self.bell(py, kernel_id)?;
        let t = Duration::from_secs_f64(if seconds.is_finite() {
            seconds.clamp(0.0, 1e-3)
        } else {
            0.0
        });
        if t.is_zero() {
            return Ok(());
        }
        let hand = self.kernels.lock().get(kernel_id).map(|k| k.hand.clone());
        match hand {
            // A Python kernel: counted as a waiter with the GIL released, so its thread takes
            // the GIL at once for the message (see `Handoff`), and after a ring this thread
            // lets it leave Python before taking the GIL back.
            Some(hand) => {
                let w = Waiter::new(&hand);
                py.detach(|| {
                    w.released();
                    bell.sleep_unless(t, || false);
                    w.got();
                });
            }
            None => py.detach(|| bell.sleep_unless(t, || false)),
        }
        Ok(())
    }

    /// Rings `waker` whenever kernel `kernel_id` publishes an output or reply, takes an
    /// input, ends, or changes state, while `waker` is armed.
    fn subscribe(&self, py: Python<'_>, kernel_id: &str, waker: &Waker) -> PyResult<()> {
        self.bell(py, kernel_id)?.subscribe(&waker.0);
        Ok(())
    }

    /// Starts a `call`: the request is queued, the reply waited for with `PendingCall`. With
    /// `timeout` (seconds) the request carries that deadline, as Rust's `call` does: a request
    /// the kernel has not taken by then is not handled but counted (`messages_expired`).
    #[pyo3(signature = (kernel_id, obj, priority, timeout=None))]
    fn call_start(
        &self,
        py: Python<'_>,
        kernel_id: &str,
        obj: Py<PyAny>,
        priority: u8,
        timeout: Option<f64>,
    ) -> PyResult<PendingCallPy> {
        let Some(k) = self.kernels.lock().get(kernel_id).cloned() else {
            return Err(self.refuse_missing(py, kernel_id, "call", obj));
        };
        let timeout = timeout.map(secs).transpose()?;
        if k.blocks && !k.handle.input_has_room() && !Self::wait_room(py, &k)? {
            return Err(Self::room_timeout(py, kernel_id, &k, "call", obj));
        }
        let sent = obj.clone_ref(py);
        let key = k.store.put(obj);
        let start = |h: &KernelHandle<u64, u64>| match timeout {
            Some(t) => h.call_start_with_timeout(key, priority, t),
            None => h.call_start(key, priority),
        };
        // Under `Block` a send to a full lane waits, so the GIL is released then; with room
        // it cannot wait (only GIL holders send to a Python kernel, the kernel only takes).
        let r = if k.blocks && !k.handle.input_has_room() {
            py.detach(|| start(&k.handle))
        } else {
            start(&k.handle)
        };
        match r {
            Ok(pc) => {
                k.inputs_sent();
                Ok(PendingCallPy {
                    pc: Mutex::new(Some(pc)),
                    kern: k.clone(),
                    request: key,
                })
            }
            Err(e) => Err(refused(py, &k.store, e, sent)),
        }
    }

    /// The next output if one is ready, or comes within `wait` seconds (one short wait, GIL
    /// released, meant for well under a millisecond): `(obj, (message_id, correlation_id))`,
    /// or None.
    fn try_receive(&self, py: Python<'_>, kernel_id: &str, wait: f64) -> PyResult<Option<Output>> {
        let k = self.kern(py, kernel_id)?;
        let got = Self::output_within(py, &k, secs(wait)?)?;
        Ok(got.map(|(env, o)| (o, (env.message_id, env.correlation_id))))
    }

    /// Like `try_receive`, the object alone, or `NOTHING` when no output came.
    fn take(&self, py: Python<'_>, kernel_id: &str, wait: f64) -> PyResult<Py<PyAny>> {
        let k = self.kern(py, kernel_id)?;
        match Self::output_within(py, &k, secs(wait)?)? {
            Some((_, o)) => Ok(o),
            None => nothing(py),
        }
    }

    /// The next output, waiting up to `timeout` seconds (None: without limit) in slices
    /// with the GIL released and Ctrl-C honoured.
    #[pyo3(signature = (kernel_id, timeout=None))]
    fn receive(&self, py: Python<'_>, kernel_id: &str, timeout: Option<f64>) -> PyResult<Output> {
        let k = self.kern(py, kernel_id)?;
        let t = timeout.map(secs).transpose()?.unwrap_or(Duration::MAX);
        let h = k.handle.clone();
        let got = Self::sliced(py, Some(&k.hand), t, |slice| {
            match h.receive_envelope(slice) {
                Err(Error::Timeout { .. }) => None,
                other => Some(other),
            }
        })?;
        match got {
            Some(Ok((env, key))) => match k.store.take(key) {
                Some(o) => Ok((o, (env.message_id, env.correlation_id))),
                None => Err(PyRuntimeError::new_err("output handle without an object")),
            },
            Some(Err(e)) => Err(engine_error(py, &e)),
            None => Err(engine_error(
                py,
                &Error::Timeout {
                    id: kernel_id.to_string(),
                    op: "receive",
                    timeout: t,
                    message: None,
                },
            )),
        }
    }

    /// Telemetry as a dict (all figures from the engine).
    fn telemetry<'py>(&self, py: Python<'py>, kernel_id: &str) -> PyResult<Bound<'py, PyDict>> {
        let k = self.ops(py, kernel_id, "read the telemetry")?;
        let held = self
            .kernels
            .lock()
            .get(kernel_id)
            .map_or(0, |k| k.store.len());
        let t = k.telemetry();
        let d = PyDict::new(py);
        d.set_item("kernel_id", &t.kernel_id)?;
        d.set_item(
            "state",
            match &t.state {
                KernelState::Failed(_) => "failed".to_string(),
                s => s.to_string(),
            },
        )?;
        d.set_item("messages_received", t.messages_received)?;
        d.set_item("messages_processed", t.messages_processed)?;
        d.set_item("messages_dropped", t.messages_dropped)?;
        d.set_item("messages_refused", t.messages_refused)?;
        d.set_item("messages_expired", t.messages_expired)?;
        d.set_item("errors", t.errors)?;
        d.set_item("queue_depth", t.queue_depth)?;
        d.set_item("output_depth", t.output_depth)?;
        d.set_item("batches", t.batches)?;
        d.set_item("throughput", t.throughput)?;
        d.set_item("latency_count", t.latency.count)?;
        d.set_item("latency_mean_ns", t.latency.mean_ns)?;
        d.set_item("latency_p50_ns", t.latency.p50_ns)?;
        d.set_item("latency_p95_ns", t.latency.p95_ns)?;
        d.set_item("latency_p99_ns", t.latency.p99_ns)?;
        d.set_item("latency_p999_ns", t.latency.p999_ns)?;
        d.set_item("latency_max_ns", t.latency.max_ns)?;
        d.set_item("uptime_seconds", t.uptime.as_secs_f64())?;
        d.set_item("objects_held", held)?;
        Ok(d)
    }

    /// Terminates one kernel; returns its report (objects handed back).
    #[pyo3(signature = (kernel_id, timeout=None))]
    fn terminate<'py>(
        &self,
        py: Python<'py>,
        kernel_id: &str,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let t = timeout.map(secs).transpose()?;
        // The caller frees the kernel once it has what it needs from it (`forget`).
        let batch = self.batch.lock().get(kernel_id).cloned();
        if let Some(b) = batch {
            let r = py
                .detach(|| b.terminate(t))
                .map_err(|e| engine_error(py, &e))?;
            return bytes_report_dict(py, kernel_id, r);
        }
        let k = self.kernels.lock().get(kernel_id).cloned();
        let Some(k) = k else {
            return Err(self.missing(py, kernel_id, "terminate"));
        };
        let r = py.detach(|| match t {
            Some(t) => k.handle.terminate_within(t),
            None => k.handle.terminate(),
        });
        k.bell.ring();
        let r = r.map_err(|e| engine_error(py, &e))?;
        report_dict(py, r, &k.store)
    }

    /// Frees a terminated kernel as the engine does (its queues, the objects they held, its
    /// bell): only its id and final state stay known, among the last `GONE_MAX`. Refused
    /// (`KernelStateError`) while the kernel is not terminated or failed.
    fn forget(&self, py: Python<'_>, kernel_id: &str) -> PyResult<()> {
        let k = match self.ops(py, kernel_id, "forget") {
            Ok(k) => k,
            Err(_) if self.gone_state(kernel_id).is_some() => return Ok(()),
            Err(e) => return Err(e),
        };
        let state = k.state();
        if !matches!(state, KernelState::Terminated | KernelState::Failed(_)) {
            return Err(engine_error(
                py,
                &Error::InvalidState {
                    id: kernel_id.to_string(),
                    op: "forget",
                    state,
                },
            ));
        }
        self.forget_kernel(kernel_id, state);
        Ok(())
    }

    /// Launches a batch kernel: records of `record` bytes (one of 8, 16, ..., 256), drained
    /// `max_batch` at a time and handed to `runner(func, state, uint8_array, n)`, which returns
    /// the outputs as a uint8 array of whole records.
    #[pyo3(signature = (kernel_id, record, runner, func, state, queue_size, backpressure, block_timeout, priority_lanes, max_batch, device=None, buffers=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn launch_batch(
        &self,
        py: Python<'_>,
        kernel_id: String,
        record: usize,
        runner: Py<PyAny>,
        func: Py<PyAny>,
        state: Py<PyAny>,
        queue_size: usize,
        backpressure: &str,
        block_timeout: f64,
        priority_lanes: usize,
        max_batch: usize,
        device: Option<Py<device::DeviceSpec>>,
        buffers: Vec<(String, String, Vec<u8>)>,
    ) -> PyResult<()> {
        let policy = parse_policy(backpressure, block_timeout)?;
        if queue_size == 0 || max_batch == 0 {
            return Err(PyValueError::new_err(
                "queue_size and max_batch must be at least 1",
            ));
        }
        let rt = self.rt.lock();
        let rt = rt
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("the runtime was shut down"))?;
        let id = kernel_id.clone();
        let bell = Arc::new(Bell::default());
        let body_bell = bell.clone();
        let k = py
            .detach(|| {
                batch::launch(
                    rt,
                    id,
                    record,
                    queue_size,
                    policy,
                    priority_lanes,
                    runner,
                    func,
                    state,
                    max_batch,
                    device.as_ref().map(|d| d.get()),
                    buffers,
                    body_bell,
                )
            })
            .map_err(|e| match e {
                batch::LaunchError::Engine(e) => engine_error(py, &e),
                batch::LaunchError::Layout(e) => device::layout_error(py, &e),
                batch::LaunchError::Buffer(text) => build(
                    py,
                    Described {
                        class: "InvalidConfigError",
                        text,
                        id: Some(kernel_id.clone()),
                        detail: None,
                    },
                    None,
                ),
            })?;
        self.bells.lock().insert(kernel_id.clone(), bell);
        self.batch.lock().insert(kernel_id, k);
        Ok(())
    }

    /// Where a batch or device kernel's handler runs: `host` (the vectorized Python
    /// function on the kernel's thread) or its device (`cuda`, `cudasim`, `wgpu`).
    fn placement(&self, py: Python<'_>, kernel_id: &str) -> PyResult<String> {
        Ok(self.batch_kern(py, kernel_id)?.placement())
    }

    /// The device state of a device kernel (`size` bytes, its padded layout), read back by
    /// the engine: on wgpu its value after every batch submitted so far, on CUDA and CudaSim
    /// its value between two batches (the kernel parked for the copy). Waits with the GIL
    /// released; a kernel that does not park in time is a typed engine error.
    fn snapshot_state<'py>(
        &self,
        py: Python<'py>,
        kernel_id: &str,
        size: usize,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let b = self.batch_kern(py, kernel_id)?;
        let v = py
            .detach(|| b.snapshot_state(size))
            .map_err(|e| engine_error(py, &e))?;
        Ok(PyArray1::from_vec(py, v))
    }

    /// The bound buffer `name` of a device kernel (elements of numpy scalar `code`) as bytes,
    /// synchronized with the kernel: its values between two batches. Waits (GIL released) up
    /// to `timeout` seconds.
    fn read_buffer<'py>(
        &self,
        py: Python<'py>,
        kernel_id: &str,
        name: &str,
        code: &str,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let b = self.batch_kern(py, kernel_id)?;
        let t = secs(timeout)?;
        let v = py
            .detach(|| b.read_buffer(name, code, t))
            .map_err(|e| device::bind_error(py, kernel_id, &e))?;
        Ok(PyArray1::from_vec(py, v))
    }

    /// Replaces the bound buffer `name`'s values with `data` (exactly its bytes); the
    /// kernel's next batch sees all of them.
    fn write_buffer(
        &self,
        py: Python<'_>,
        kernel_id: &str,
        name: &str,
        code: &str,
        data: PyReadonlyArray1<'_, u8>,
        timeout: f64,
    ) -> PyResult<()> {
        let b = self.batch_kern(py, kernel_id)?;
        let t = secs(timeout)?;
        let bytes = data.as_slice()?;
        py.detach(|| b.write_buffer(name, code, bytes, t))
            .map_err(|e| device::bind_error(py, kernel_id, &e))
    }

    /// Sends the records in `data` (a uint8 array of whole records); returns how many were
    /// taken (queued, or dropped by a drop policy). Fewer than all: the rest were refused
    /// (full lane under `reject`, `block` timed out) and are still the caller's.
    fn send_batch(
        &self,
        py: Python<'_>,
        kernel_id: &str,
        data: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<usize> {
        let b = self.batch_kern(py, kernel_id)?;
        let bytes = data.as_slice()?;
        let n = b.record();
        if bytes.len() % n != 0 {
            return Err(PyValueError::new_err(format!(
                "{} bytes are not whole records of {n} bytes",
                bytes.len()
            )));
        }
        if bytes.is_empty() {
            return Ok(0);
        }
        // When nothing was taken the records stay the caller's (they are in `data`).
        py.detach(|| b.send_bytes(bytes))
            .map_err(|e| engine_error(py, &e))
    }

    /// Up to `max` outputs as a uint8 array of whole records, waiting up to `timeout` seconds
    /// (in slices, GIL released, Ctrl-C honoured) for the first; empty on timeout.
    fn receive_batch<'py>(
        &self,
        py: Python<'py>,
        kernel_id: &str,
        max: usize,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let b = self.batch_kern(py, kernel_id)?;
        let t = secs(timeout)?;
        let first = b
            .recv_bytes(max, Duration::ZERO)
            .map_err(|e| engine_error(py, &e))?;
        if !first.is_empty() || t.is_zero() {
            return Ok(PyArray1::from_vec(py, first));
        }
        let got = Self::sliced(py, None, t, |slice| match b.recv_bytes(max, slice) {
            Ok(v) if v.is_empty() => None,
            other => Some(other),
        })?;
        match got {
            Some(Ok(v)) => Ok(PyArray1::from_vec(py, v)),
            Some(Err(e)) => Err(engine_error(py, &e)),
            None => Ok(PyArray1::from_vec(py, Vec::new())),
        }
    }

    /// Lets active kernels drain (up to the shutdown timeout), terminates every kernel and
    /// returns one report per kernel. Later calls return an empty list.
    fn shutdown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let rt = self.rt.lock().take();
        let out = PyList::empty(py);
        let Some(rt) = rt else { return Ok(out) };
        let reports = py.detach(move || rt.shutdown());
        // The kernels stay known: a late send is refused by the terminated kernel (message
        // handed back), not told that the kernel never existed.
        let kernels: HashMap<String, Arc<Kern>> = self.kernels.lock().clone();
        let batch: HashMap<String, Arc<dyn batch::BatchKernel>> = self.batch.lock().clone();
        for rep in reports {
            let id = rep.kernel_id.clone();
            if let Some(b) = batch.get(&id) {
                if let Some(r) = b.report_of(rep) {
                    out.append(bytes_report_dict(py, &id, r)?)?;
                }
                continue;
            }
            if let (Ok(r), Some(k)) = (rep.into_typed::<u64, u64>(), kernels.get(&id)) {
                out.append(report_dict(py, r, &k.store)?)?;
            }
        }
        Ok(out)
    }
}

/// A `call` in flight; `wait` takes the reply.
#[pyclass(frozen, module = "resident._resident")]
struct PendingCallPy {
    pc: Mutex<Option<PendingCall<u64, u64>>>,
    kern: Arc<Kern>,
    request: u64,
}

impl PendingCallPy {
    fn finish(&self, py: Python<'_>, r: Result<u64, Error>) -> PyResult<Py<PyAny>> {
        *self.pc.lock() = None;
        match r {
            Ok(key) => self
                .kern
                .store
                .take(key)
                .ok_or_else(|| PyRuntimeError::new_err("reply handle without an object")),
            Err(e) => {
                // A request dropped by a drop policy, or expired (its deadline passed before
                // the kernel took it): its object will never be taken.
                if matches!(e, Error::Dropped { .. } | Error::Timeout { .. }) {
                    self.kern.store.take(self.request);
                }
                Err(engine_error(py, &e))
            }
        }
    }
}

#[pymethods]
impl PendingCallPy {
    /// Looks for the reply without waiting: the reply object (any object, `None` included),
    /// or `NOTHING` if it is not there yet.
    fn poll(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let r = {
            let mut g = self.pc.lock();
            let Some(pc) = g.as_mut() else {
                return Err(PyRuntimeError::new_err(
                    "this call's reply was already taken",
                ));
            };
            pc.wait(Duration::ZERO)
        };
        match r {
            None => nothing(py),
            Some(r) => self.finish(py, r),
        }
    }

    /// Waits up to `timeout` seconds for the reply, GIL released, Ctrl-C honoured; `NOTHING`
    /// when it did not come (the call stays pending). Must run on the thread that started
    /// the call unless `timeout` is 0.
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<Py<PyAny>> {
        let t = secs(timeout)?;
        let r = Self::sliced_wait(py, &self.kern.hand, &self.pc, t)?;
        match r {
            None => nothing(py),
            Some(r) => self.finish(py, r),
        }
    }

    /// Gives up on the reply (a later reply is counted as dropped by the engine) and
    /// releases the request object if the kernel has not taken it: a request whose caller
    /// gave up is never handed to the handler (one with a deadline has expired; one without
    /// is withdrawn), so its object does not wait for the kernel's end.
    fn cancel(&self) {
        let pc = self.pc.lock().take();
        let Some(mut pc) = pc else { return };
        // A reply that came already: nobody will take it.
        if let Some(Ok(key)) = pc.wait(Duration::ZERO) {
            self.kern.store.take(key);
            return;
        }
        let id = pc.message_id();
        // Unregisters the call: a reply published from now on is discarded by the engine.
        drop(pc);
        if self.kern.store.take(self.request).is_none() {
            // The kernel has the request: release the reply it may still publish.
            self.kern.store.abandon(id);
        }
    }
}

impl PendingCallPy {
    fn sliced_wait(
        py: Python<'_>,
        hand: &Handoff,
        pc: &Mutex<Option<PendingCall<u64, u64>>>,
        t: Duration,
    ) -> PyResult<Option<Result<u64, Error>>> {
        PyRuntime::sliced(py, Some(hand), t, |slice| {
            let mut g = pc.lock();
            match g.as_mut() {
                None => Some(None),
                Some(pc) => poll_for(POLL.min(slice), || pc.wait(Duration::ZERO))
                    .or_else(|| pc.wait(slice))
                    .map(Some),
            }
        })
        .map(Option::flatten)
    }
}

#[pymodule]
fn _resident(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRuntime>()?;
    m.add_class::<KernelCtx>()?;
    m.add_class::<Env>()?;
    m.add("NOTHING", nothing(m.py())?)?;
    m.add_class::<PendingCallPy>()?;
    m.add_class::<Waker>()?;
    m.add_function(wrap_pyfunction!(handlers_in_python, m)?)?;
    m.add("FLAG_CALL", resident::ring::FLAG_CALL)?;
    buffer::register(m)?;
    dlpack::register(m)?;
    keyed::register(m)?;
    device::register(m)?;
    workloads::register(m)?;
    ids::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
