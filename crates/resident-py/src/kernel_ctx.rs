//! The kernel context (the handler's `ctx`): the `KernelCtx` pyclass and the `Env` of a
//! received message it keeps for the reply.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pyo3::exceptions::{PyAttributeError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use resident::prelude::*;

use crate::handoff::{poll_for, Handoff, HANDOFF_SPIN};
use crate::store::Store;
use crate::waker::Bell;
use crate::{nothing, py_failure, secs, POLL};

/// Envelopes of received messages a kernel's ctx keeps for replies matched by `correlation_id`.
const PENDING_MAX: usize = 4096;

/// How long a handler's `wait_active` sleeps at most before it looks at the kernel's flags
/// again when no activate or terminate of this binding woke it (a shutdown's terminate, made
/// inside the engine, is seen by this look).
const ACTIVE_LOOK: Duration = Duration::from_millis(100);

pub(crate) type Lctx = LoopContext<u64, u64, ()>;
/// A kernel on its caller's event loop (no thread): its loop context, held by its ctx until
/// the kernel's task ends.
pub(crate) type Outside = Arc<Mutex<Option<OutsideLoop<u64, u64, ()>>>>;

/// The engine's loop context, reachable from Python only on the kernel's own thread and only
/// while the loop body runs.
pub(crate) struct CtxPtr(pub(crate) *mut Lctx);
// SAFETY: the pointer is dereferenced only on the thread that owns the `LoopContext` (checked
// against `thread` in `with`), and only while that thread is inside the loop body (the pointer
// is cleared before the body returns).
unsafe impl Send for CtxPtr {}
unsafe impl Sync for CtxPtr {}

/// The `ctx` a Python kernel's coroutine receives (wrapped by `resident.KernelContext`).
#[pyclass(frozen, module = "resident._resident")]
pub(crate) struct KernelCtx {
    pub(crate) ptr: Mutex<CtxPtr>,
    /// Set for a kernel on its caller's event loop (`launch(..., outside=True)`): its loop
    /// context, used on the loop's thread (`thread`) and never waiting.
    pub(crate) outside: Option<Outside>,
    pub(crate) thread: ThreadId,
    pub(crate) store: Arc<Store>,
    pub(crate) kernel_id: String,
    pub(crate) hand: Arc<Handoff>,
    pub(crate) bell: Arc<Bell>,
    /// The store key of the last message received (0: none yet), for `hand_back`.
    pub(crate) last_key: AtomicU64,
    /// `message_id` of a received message -> its `Env`, for replies matched by
    /// `correlation_id` (insertion order: the oldest goes first past `PENDING_MAX`).
    pub(crate) pending: Py<PyDict>,
}

/// A received message's envelope, kept for its reply.
#[pyclass(frozen, module = "resident._resident")]
pub(crate) struct Env(Envelope);

impl KernelCtx {
    fn with<R>(&self, f: impl FnOnce(&mut Lctx) -> R) -> PyResult<R> {
        if crate::waker::this_thread() != self.thread {
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

pub(crate) fn env_tuple(e: &Envelope) -> EnvTuple {
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
    /// A lifecycle flag: `ended` for a kernel on its caller's loop whose loop ended
    /// (finished, or terminated from the loop's own thread), else `f` of the loop context
    /// (the loop context's lock taken once).
    fn flag(&self, ended: bool, f: impl FnOnce(&Lctx) -> bool) -> PyResult<bool> {
        if let Some(o) = &self.outside {
            let g = o.lock();
            match g.as_ref() {
                Some(ol) if !ol.is_finished() => {
                    if crate::waker::this_thread() == self.thread {
                        return Ok(f(ol));
                    }
                }
                _ => return Ok(ended),
            }
            drop(g);
            // Another thread: `with`'s error.
            return self.with(|c| f(c));
        }
        self.with(|c| f(c))
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
        self.flag(true, |c| c.should_terminate())
    }

    #[getter]
    fn is_active(&self) -> PyResult<bool> {
        self.flag(false, |c| c.is_active())
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
