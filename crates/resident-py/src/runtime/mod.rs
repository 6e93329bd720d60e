//! The runtime: the `Runtime` pyclass (`PyRuntime`), the Python kernels launched on it and
//! their reports.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use numpy::{PyArray1, PyReadonlyArray1};
use parking_lot::Mutex;
use pyo3::exceptions::{PyAttributeError, PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use resident::prelude::*;
use resident::Op;

use crate::handoff::{poll_for, Handoff, InPython, Waiter};
use crate::kernel_ctx::{env_tuple, CtxPtr, KernelCtx, Lctx, Outside};
use crate::store::{Named, Store};
use crate::waker::{Bell, Waker};
use crate::{
    batch, build, describe, device, engine_error, nothing, parse_backend, parse_policy, py_failure,
    refused, secs, Described, KernelOps, POLL,
};

mod lookup;
mod pending;
mod reports;

pub(crate) use pending::PendingCallPy;
use reports::{bytes_report_dict, report_dict};

/// How long one uninterrupted wait for a Python caller lasts before signals are checked.
const SLICE: Duration = Duration::from_millis(20);

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

pub(crate) struct Kern {
    handle: KernelHandle<u64, u64>,
    pub(crate) store: Arc<Store>,
    pub(crate) hand: Arc<Handoff>,
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
pub(crate) struct PyRuntime {
    pub(crate) rt: Mutex<Option<resident::runtime::Runtime>>,
    kernels: Mutex<Named<Arc<Kern>>>,
    pub(crate) batch: Mutex<Named<Arc<dyn batch::BatchKernel>>>,
    /// Every live kernel's bell (Python and batch kernels).
    pub(crate) bells: Mutex<Named<Arc<Bell>>>,
    /// Kernels terminated and freed, newest last: (id, final state).
    gone: Mutex<VecDeque<(String, KernelState)>>,
    backend: String,
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
            kernels: Mutex::new(Named::default()),
            batch: Mutex::new(Named::default()),
            bells: Mutex::new(Named::default()),
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
    /// Without `wait`, a send that would wait for room (policy `block`, input queue full)
    /// sends nothing and returns None (`would_block` and the send in one call: the asyncio
    /// send awaits room then and sends again).
    #[pyo3(signature = (kernel_id, obj, priority, wait=true))]
    fn send(
        &self,
        py: Python<'_>,
        kernel_id: &str,
        obj: Py<PyAny>,
        priority: u8,
        wait: bool,
    ) -> PyResult<Option<u64>> {
        let Some(k) = self.kernels.lock().get(kernel_id).cloned() else {
            return Err(self.refuse_missing(py, kernel_id, "send", obj));
        };
        if !wait && k.blocks && !k.handle.input_has_room() {
            return Ok(None);
        }
        if k.blocks && !k.handle.input_has_room() && !Self::wait_room(py, &k)? {
            return Err(Self::room_timeout(py, kernel_id, &k, Op::Send, obj));
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
                Ok(Some(id))
            }
            Ok((id, SendOutcome::DroppedOldest(_, old))) => {
                k.store.take(old);
                // The discarded message may be a call: its caller looks again.
                k.bell.ring();
                Ok(Some(id))
            }
            Ok((id, SendOutcome::DroppedNewest)) => {
                k.store.take(key);
                Ok(Some(id))
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
                        op: Op::SendBatch,
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
            let got = Self::wait_output(py, &k, t)?;
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
            return Err(Self::room_timeout(py, kernel_id, &k, Op::Call, obj));
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
        let wait = secs(wait)?;
        if wait.is_zero() {
            // One look (no envelope, and no error value made when there is nothing).
            match k.handle.try_receive() {
                Ok(Some(key)) => {
                    return match k.store.take(key) {
                        Some(o) => Ok(o),
                        None => nothing(py),
                    }
                }
                Ok(None) => return nothing(py),
                // Ended: the look below, which takes an output that landed meanwhile.
                Err(_) => {}
            }
        }
        match Self::output_within(py, &k, wait)? {
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
        let got = Self::wait_output(py, &k, t)?;
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
                    op: Op::Receive,
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
        let kernels: Named<Arc<Kern>> = self.kernels.lock().clone();
        let batch: Named<Arc<dyn batch::BatchKernel>> = self.batch.lock().clone();
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
