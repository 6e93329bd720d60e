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

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use resident::prelude::*;
use resident::Op;

mod batch;
mod buffer;
mod device;
mod dlpack;
mod handoff;
mod ids;
mod kernel_ctx;
mod keyed;
mod runtime;
mod store;
mod waker;
mod workloads;

/// How long a wait for a Python kernel's input or output (GIL released) looks again and again
/// before it parks in the engine. Each look that finds nothing yields the core: on a machine
/// with fewer free cores than busy threads the thread that produces what this one waits for
/// often shares its core, and a pure spin would hold that core until the scheduler takes it
/// away (measured on a shared 2-vCPU VM: an echo round trip of 25 us with the engine's spin,
/// 7 us with this loop). With a free core, a yield returns at once and this is a spin.
const POLL: Duration = Duration::from_micros(50);

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

fn secs(s: f64) -> PyResult<Duration> {
    if !s.is_finite() || s < 0.0 {
        return Err(PyValueError::new_err(format!(
            "timeout must be a finite number of seconds >= 0, got {s}"
        )));
    }
    Ok(Duration::from_secs_f64(s.min(1e9)))
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
            match op {
                Op::Send | Op::Call if has_message => "SendTimeoutError",
                Op::SendBatch => "SendTimeoutError",
                Op::Call => "CallTimeoutError",
                Op::Receive => "ReceiveTimeoutError",
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
                source.engine::<resident::cuda::persistent::PersistentError>(),
                Some(resident::cuda::persistent::PersistentError::JitLinkUnavailable(_))
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
fn refused(py: Python<'_>, store: &store::Store, e: Error, sent: Py<PyAny>) -> PyErr {
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

/// A Python exception raised by a handler, as a failure reason (with its traceback).
pub(crate) fn py_failure(py: Python<'_>, e: PyErr) -> String {
    let tb = e
        .traceback(py)
        .and_then(|t| t.format().ok())
        .unwrap_or_default();
    format!("{e}\n{tb}").trim_end().to_string()
}

#[pymodule]
fn _resident(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<runtime::PyRuntime>()?;
    m.add_class::<kernel_ctx::KernelCtx>()?;
    m.add_class::<kernel_ctx::Env>()?;
    m.add("NOTHING", nothing(m.py())?)?;
    m.add_class::<runtime::PendingCallPy>()?;
    m.add_class::<waker::Waker>()?;
    m.add_function(wrap_pyfunction!(handoff::handlers_in_python, m)?)?;
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
