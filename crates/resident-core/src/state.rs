//! The lifecycle of a ring kernel and the runtime's typed errors.
//!
//! `Created -> Launched -> Active <-> Inactive -> Terminating -> Terminated`, plus
//! `Failed(`[`Failure`]`)` from any live state when a handler panics, its loop ends early, it is
//! abandoned, or its device fails.

use std::any::Any;
use std::fmt;
use std::time::Duration;

use parking_lot::Mutex;
// Ids come from users (Python strings, CLI arguments): errors quote at most 64 bytes of each.
use resident_ring::message::quoted_name;

/// Where a kernel is in its lifecycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelState {
    /// Defined, not launched.
    Created,
    /// Launched (queues and thread exist); messages queue up, nothing is processed yet.
    Launched,
    /// Processing messages.
    Active,
    /// Intake stopped; messages queue up until `activate`.
    Inactive,
    /// `terminate` is in progress.
    Terminating,
    /// Stopped; its queues are gone.
    Terminated,
    /// The kernel failed: a handler panicked, its loop ended early, its handler was
    /// abandoned by `terminate`, or its device faulted. The [`Failure`] says which.
    Failed(Failure),
}

/// Why a kernel failed: carried by [`KernelState::Failed`], [`Error::KernelFailed`] and the
/// terminate report, typed so that callers can match the cause (and reach a device's own
/// error through [`std::error::Error::source`]).
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// The handler panicked while handling a message.
    #[error("handler panicked on message {message_id}: {panic}")]
    HandlerPanicked {
        /// The message being handled.
        message_id: u64,
        /// The panic's text.
        panic: String,
    },
    /// The loop form's loop panicked.
    #[error("run loop panicked: {panic}")]
    LoopPanicked {
        /// The panic's text.
        panic: String,
    },
    /// The loop form's loop returned before `terminate` asked it to.
    #[error("run loop returned before terminate was requested")]
    LoopReturned,
    /// `terminate` (or `deactivate`) gave up waiting for the kernel's thread: its handler did
    /// not return within the terminate timeout, so the thread was abandoned (what it produces
    /// if it ever returns is counted as dropped).
    #[error("{}", abandoned_text(*timeout, *message_id))]
    Abandoned {
        /// The terminate timeout that ran out.
        timeout: Duration,
        /// The message in the handler, if one was.
        message_id: Option<u64>,
    },
    /// The kernel's device side failed (a fault, a device lost, a device that did not stop
    /// or exited on its own); the engine's own error is the source.
    #[error("device kernel failed: {0}")]
    Device(#[source] std::sync::Arc<crate::engine::error::DeviceError>),
    /// A task that was calling the kernel on a caller's behalf ended abnormally (panicked or
    /// was cancelled), e.g. a serving task; its own error is the source.
    #[error("a task calling the kernel ended abnormally: {0}")]
    CallerTask(#[source] std::sync::Arc<dyn std::error::Error + Send + Sync>),
}

fn abandoned_text(timeout: Duration, message_id: Option<u64>) -> String {
    match message_id {
        Some(m) => format!(
            "handler did not return within {timeout:?} (message {m}); its thread was abandoned"
        ),
        None => format!("host thread did not exit within {timeout:?}; it was abandoned"),
    }
}

impl Failure {
    /// The device's error, for a device failure.
    pub fn device_error(&self) -> Option<&crate::engine::error::DeviceError> {
        match self {
            Failure::Device(e) => Some(e),
            _ => None,
        }
    }
}

/// Two failures are equal when they have the same cause and text (a device error is compared
/// by its text: engine errors carry no equality of their own).
impl PartialEq for Failure {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
            && self.to_string() == other.to_string()
    }
}

impl Eq for Failure {}

impl KernelState {
    /// Whether sends are accepted in this state.
    pub fn accepts_messages(&self) -> bool {
        matches!(
            self,
            KernelState::Launched | KernelState::Active | KernelState::Inactive
        )
    }
}

impl fmt::Display for KernelState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelState::Created => f.write_str("created"),
            KernelState::Launched => f.write_str("launched"),
            KernelState::Active => f.write_str("active"),
            KernelState::Inactive => f.write_str("inactive"),
            KernelState::Terminating => f.write_str("terminating"),
            KernelState::Terminated => f.write_str("terminated"),
            KernelState::Failed(r) => write!(f, "failed ({r})"),
        }
    }
}

/// A message handed back inside an error, so a refused send loses nothing.
/// Take it out with [`Error::into_message`].
pub struct Returned {
    value: Mutex<Option<Box<dyn Any + Send>>>,
    type_name: &'static str,
}

impl Returned {
    pub(crate) fn new<T: Send + 'static>(value: T) -> Self {
        Returned {
            value: Mutex::new(Some(Box::new(value))),
            type_name: std::any::type_name::<T>(),
        }
    }
}

impl fmt::Debug for Returned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Returned<{}>", self.type_name)
    }
}

/// The operation an [`Error::Timeout`] is about: what a caller branches on (a send's timeout
/// hands its message back, a call's may be retried, a receive's means no output yet). Shown as
/// the method's name (`send_batch`, `snapshot_keys`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// `send` (and the sends of a handler's context).
    Send,
    /// `send_batch`.
    SendBatch,
    /// A handler's `send_to` another kernel.
    SendTo,
    /// `call`: a request and its reply.
    Call,
    /// A kernel's outputs forwarded to its target.
    Forward,
    /// `receive`.
    Receive,
    /// `deactivate`.
    Deactivate,
    /// `drain`.
    Drain,
    /// `snapshot_state`.
    SnapshotState,
    /// `snapshot_key`.
    SnapshotKey,
    /// `snapshot_keys`.
    SnapshotKeys,
}

impl Op {
    /// The method's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::SendBatch => "send_batch",
            Op::SendTo => "send_to",
            Op::Call => "call",
            Op::Forward => "forward",
            Op::Receive => "receive",
            Op::Deactivate => "deactivate",
            Op::Drain => "drain",
            Op::SnapshotState => "snapshot_state",
            Op::SnapshotKey => "snapshot_key",
            Op::SnapshotKeys => "snapshot_keys",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The runtime's errors. Every one names the kernel; refused sends carry the message back.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The operation is not valid in the kernel's current state.
    #[error("kernel '{qid}': cannot {op} while {state}", qid = quoted_name(.id))]
    InvalidState {
        /// Kernel id.
        id: String,
        /// What was attempted.
        op: &'static str,
        /// The state it was in.
        state: KernelState,
    },
    /// A send to a kernel that no longer accepts messages (terminating, terminated, failed).
    #[error("kernel '{qid}' is {state}: {op} refused, message returned", qid = quoted_name(.id))]
    NotAccepting {
        /// Kernel id.
        id: String,
        /// What was attempted.
        op: &'static str,
        /// The state it was in.
        state: KernelState,
        /// The message.
        message: Returned,
    },
    /// The input lane was full under `Backpressure::Reject`.
    #[error("kernel '{qid}': input queue full, {op} rejected, message returned", qid = quoted_name(.id))]
    QueueFull {
        /// Kernel id.
        id: String,
        /// What was attempted.
        op: &'static str,
        /// The message.
        message: Returned,
    },
    /// Nothing happened within the timeout.
    #[error("kernel '{qid}': {op} timed out after {timeout:?}", qid = quoted_name(.id))]
    Timeout {
        /// Kernel id.
        id: String,
        /// What timed out.
        op: Op,
        /// The timeout.
        timeout: Duration,
        /// The message, for a send that waited for room in vain.
        message: Option<Returned>,
    },
    /// The kernel failed; waiting callers and receivers get this promptly.
    #[error("kernel '{qid}' failed: {reason}", qid = quoted_name(.id))]
    KernelFailed {
        /// Kernel id.
        id: String,
        /// The cause (a device failure's own error is its `source`).
        #[source]
        reason: Failure,
    },
    /// A `call` was answered with no output (the handler returned `None`).
    #[error("kernel '{qid}': the handler produced no reply to message {message_id}", qid = quoted_name(.id))]
    NoReply {
        /// Kernel id.
        id: String,
        /// The request.
        message_id: u64,
    },
    /// No kernel has this id.
    #[error("no kernel with id '{qid}'", qid = quoted_name(.id))]
    UnknownKernel {
        /// The id asked for.
        id: String,
    },
    /// The kernel exists with other message types.
    #[error("kernel '{qid}' is RingKernel<{actual}>, not RingKernel<{expected}>", qid = quoted_name(.id))]
    TypeMismatch {
        /// Kernel id.
        id: String,
        /// Types asked for.
        expected: String,
        /// Types it has.
        actual: String,
    },
    /// A live kernel already has this id.
    #[error("kernel '{qid}' already exists and is {state}; terminate it first", qid = quoted_name(.id))]
    DuplicateKernel {
        /// Kernel id.
        id: String,
        /// Its state.
        state: KernelState,
    },
    /// The kernel definition is not usable.
    #[error("kernel '{qid}': invalid configuration: {reason}", qid = quoted_name(.id))]
    InvalidConfig {
        /// Kernel id.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// The requested backend cannot be used here; `source` says why (no driver, no device,
    /// no adapter, no host compiler).
    #[error("backend {backend:?} unavailable: {source}")]
    BackendUnavailable {
        /// The backend asked for.
        backend: crate::engine::Backend,
        /// Why it cannot be opened.
        #[source]
        source: Box<crate::engine::BackendError>,
    },
    /// The kernel's device refused an operation (`op`: "launch", "snapshot_state"): a
    /// handler that does not compile (the compiler's message and line inside), a layout the
    /// device language cannot match, a residency or adapter limit, a lost device. `source` is
    /// the backend's own error: match it to tell e.g. `ResidencyExceeded`, `DeviceLost` or a
    /// compile error apart.
    #[error("kernel '{qid}': {op} failed: {source}", qid = quoted_name(.id))]
    Device {
        /// Kernel id.
        id: String,
        /// What was attempted.
        op: &'static str,
        /// The device's error.
        #[source]
        source: Box<crate::engine::error::DeviceError>,
    },
    /// A queue or buffer is too large for this machine's memory.
    #[error("kernel '{qid}': cannot allocate {bytes} bytes for its {what}", qid = quoted_name(.id))]
    OutOfMemory {
        /// Kernel id.
        id: String,
        /// What the memory was for.
        what: &'static str,
        /// Bytes asked for.
        bytes: usize,
    },
    /// A `call`'s request was dropped by the kernel's `DropOldest`/`DropNewest` policy.
    #[error("kernel '{qid}': request {message_id} was dropped by the backpressure policy", qid = quoted_name(.id))]
    Dropped {
        /// Kernel id.
        id: String,
        /// The request.
        message_id: u64,
    },
    /// A keyed kernel was sent (or asked for) a key it does not have: nothing was queued.
    #[error("kernel '{qid}': {op} with key {key}, but the kernel has keys 0..{keys}", qid = quoted_name(.id))]
    KeyOutOfRange {
        /// Kernel id.
        id: String,
        /// What was attempted.
        op: &'static str,
        /// The key named.
        key: u64,
        /// How many keys the kernel has.
        keys: u32,
        /// The message, for a refused send.
        message: Option<Returned>,
    },
    /// `snapshot_keys` was asked for more keys than one snapshot reads
    /// (`runtime::keyed::MAX_SNAPSHOT_KEYS`).
    #[error("kernel '{qid}': snapshot_keys of {len} keys, more than the {max} one snapshot reads", qid = quoted_name(.id))]
    KeyRangeTooLarge {
        /// Kernel id.
        id: String,
        /// Keys asked for.
        len: u64,
        /// The most one snapshot reads.
        max: u32,
    },
    /// The kernel's thread could not be started.
    #[error("kernel '{qid}': cannot start its thread: {source}", qid = quoted_name(.id))]
    Spawn {
        /// Kernel id.
        id: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl Error {
    /// The message a refused send handed back, if this error carries one of type `T`.
    pub fn into_message<T: 'static>(self) -> Option<T> {
        let returned = match self {
            Error::NotAccepting { message, .. } | Error::QueueFull { message, .. } => message,
            Error::KeyOutOfRange {
                message: Some(message),
                ..
            } => message,
            Error::Timeout {
                message: Some(message),
                ..
            } => message,
            _ => return None,
        };
        let boxed = returned.value.into_inner()?;
        boxed.downcast::<T>().ok().map(|b| *b)
    }

    /// The device error underneath a device operation that failed, if any.
    pub fn device_error(&self) -> Option<&crate::engine::error::DeviceError> {
        match self {
            Error::Device { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The id of the kernel the error is about, if any.
    pub fn kernel_id(&self) -> Option<&str> {
        match self {
            Error::InvalidState { id, .. }
            | Error::NotAccepting { id, .. }
            | Error::QueueFull { id, .. }
            | Error::Timeout { id, .. }
            | Error::KernelFailed { id, .. }
            | Error::NoReply { id, .. }
            | Error::UnknownKernel { id }
            | Error::TypeMismatch { id, .. }
            | Error::DuplicateKernel { id, .. }
            | Error::InvalidConfig { id, .. }
            | Error::Device { id, .. }
            | Error::OutOfMemory { id, .. }
            | Error::Dropped { id, .. }
            | Error::KeyOutOfRange { id, .. }
            | Error::KeyRangeTooLarge { id, .. }
            | Error::Spawn { id, .. } => Some(id),
            Error::BackendUnavailable { .. } => None,
        }
    }
}

/// `Result` with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Kernel ids come from users (Python strings, CLI arguments): an error quotes at most 64
    /// bytes of one, with its length (a 1 MB id printed whole was the case).
    #[test]
    fn errors_quote_long_ids_short() {
        let id = "k".repeat(1 << 20);
        let unknown = Error::UnknownKernel { id: id.clone() }.to_string();
        let bind = crate::runtime::bind::BindError::NoBindings { kernel: id }.to_string();
        for text in [unknown, bind] {
            assert!(text.len() < 160, "{} bytes", text.len());
            assert!(text.contains("(1048576 bytes)"), "{text}");
        }
        // Short ids are quoted whole, as before.
        let short = Error::UnknownKernel {
            id: "pagerank".into(),
        }
        .to_string();
        assert_eq!(short, "no kernel with id 'pagerank'");
    }

    #[test]
    fn errors_hand_back_messages_and_name_the_kernel() {
        let e = Error::QueueFull {
            id: "k".into(),
            op: "send",
            message: Returned::new(42u64),
        };
        assert_eq!(
            e.to_string(),
            "kernel 'k': input queue full, send rejected, message returned"
        );
        assert_eq!(e.kernel_id(), Some("k"));
        assert_eq!(e.into_message::<u64>(), Some(42));
        let e = Error::NotAccepting {
            id: "k".into(),
            op: "send",
            state: KernelState::Terminated,
            message: Returned::new(1u8),
        };
        assert!(e.to_string().contains("terminated"));
        assert_eq!(e.into_message::<u32>(), None, "wrong type gives None");
        fn is_send_sync<T: Send + Sync + 'static>() {}
        is_send_sync::<Error>();
    }
}
