//! Errors of the serving layer, and the typed error a client gets on the wire.

use serde::{Deserialize, Serialize};

/// The most bytes of a cause's message a [`DecodeError`] quotes: serde_json quotes an
/// offending string whole (`invalid type: string "..."`), and a client's payload is not to come
/// back to it, or into a log, at any size.
pub const MAX_QUOTED: usize = 256;

/// Writes at most [`MAX_QUOTED`] bytes of a message (cut at a character boundary), then `...`
/// when it was longer; the rest is never formatted.
pub(crate) struct Bounded<'a, T: ?Sized>(pub(crate) &'a T);

struct Limit<'a, 'b> {
    out: &'a mut std::fmt::Formatter<'b>,
    left: usize,
    cut: bool,
    failed: bool,
}

impl std::fmt::Write for Limit<'_, '_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let mut end = s.len().min(self.left);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        if self.out.write_str(&s[..end]).is_err() {
            self.failed = true;
            return Err(std::fmt::Error);
        }
        self.left -= end;
        if end < s.len() {
            // Stops the formatting of the rest.
            self.cut = true;
            self.left = 0;
            return Err(std::fmt::Error);
        }
        Ok(())
    }
}

impl<T: std::fmt::Display + ?Sized> std::fmt::Display for Bounded<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut w = Limit {
            out: f,
            left: MAX_QUOTED,
            cut: false,
            failed: false,
        };
        let _ = std::fmt::Write::write_fmt(&mut w, format_args!("{}", self.0));
        if w.failed {
            return Err(std::fmt::Error);
        }
        if w.cut {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// Why a payload could not become a kernel input. Its message quotes at most [`MAX_QUOTED`]
/// bytes of the cause's.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A `Pod` message has a fixed size and the payload has another.
    #[error("payload is {actual} bytes, the message type is {expected} bytes")]
    WrongSize {
        /// Size of the message type.
        expected: usize,
        /// Size of the payload.
        actual: usize,
    },
    /// The payload is not the expected JSON.
    #[error("payload is not the expected JSON: {}", Bounded(.0))]
    Json(#[source] serde_json::Error),
    /// The JSON parsed but its value is not a valid input.
    #[error("invalid input: {}", Bounded(.0))]
    Invalid(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Why an output could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// serde_json refused the value.
    #[error("cannot encode the output as JSON: {0}")]
    Json(#[source] serde_json::Error),
}

/// The serving layer's errors.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Subscribing to the request subject failed.
    #[error("cannot subscribe to '{subject}': {source}")]
    Subscribe {
        /// The subject.
        subject: String,
        /// The client's error.
        #[source]
        source: async_nats::SubscribeError,
    },
    /// A JetStream API call (stream or consumer set-up) failed.
    #[error("JetStream {op} failed: {source}")]
    JetStream {
        /// What was attempted (names the stream or consumer).
        op: String,
        /// The client's error.
        #[source]
        source: async_nats::Error,
    },
    /// Connecting to the server failed (the error names the cause: credentials refused, TLS,
    /// plaintext refused, a bad file, unreachable).
    #[error(transparent)]
    Connect(#[from] crate::connect::ConnectError),
    /// The server refused this worker while it served (credentials refused on a reconnect, a
    /// publish or subscribe not permitted): retrying cannot help, so the worker stops. Inputs
    /// whose outputs were not stored are not acknowledged.
    #[error("the NATS server refused this worker: {0}")]
    Refused(crate::connect::Fault),
    /// The options are not usable.
    #[error("invalid serving options: {0}")]
    Options(&'static str),
    /// A keyed kernel's checkpoint in the KV bucket is not readable as this kernel's states.
    #[error("checkpoint of partition {partition} unreadable: {source}")]
    Checkpoint {
        /// The partition.
        partition: u32,
        /// What is wrong with it.
        #[source]
        source: CheckpointError,
    },
}

/// The kind of a failed request, as a client sees it: the `Resident-Error` header of an error
/// reply (core NATS) or of a dead letter (JetStream), and the `error` field of its JSON body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The payload could not be decoded (wrong size, bad JSON, invalid value).
    BadInput,
    /// The kernel's input queue was full (backpressure); retry later.
    Busy,
    /// The kernel did not answer within the call timeout.
    Timeout,
    /// The kernel failed.
    KernelFailed,
    /// The handler produced no output for this input.
    NoReply,
    /// The kernel is not accepting messages (terminating, terminated, not active).
    Unavailable,
    /// The output could not be encoded, or another internal fault.
    Internal,
}

impl ErrorKind {
    /// The header value / JSON name (`bad_input`, `busy`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadInput => "bad_input",
            ErrorKind::Busy => "busy",
            ErrorKind::Timeout => "timeout",
            ErrorKind::KernelFailed => "kernel_failed",
            ErrorKind::NoReply => "no_reply",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }

    /// Parses a header value.
    pub fn parse(s: &str) -> Option<ErrorKind> {
        Some(match s {
            "bad_input" => ErrorKind::BadInput,
            "busy" => ErrorKind::Busy,
            "timeout" => ErrorKind::Timeout,
            "kernel_failed" => ErrorKind::KernelFailed,
            "no_reply" => ErrorKind::NoReply,
            "unavailable" => ErrorKind::Unavailable,
            "internal" => ErrorKind::Internal,
            _ => return None,
        })
    }

    /// The kind of a runtime error returned by `call`/`send`.
    pub fn of(e: &resident::Error) -> ErrorKind {
        use resident::Error as E;
        match e {
            E::QueueFull { .. } => ErrorKind::Busy,
            // A send that waited for room in vain carries its message back.
            E::Timeout {
                message: Some(_), ..
            } => ErrorKind::Busy,
            E::Timeout { .. } => ErrorKind::Timeout,
            E::KernelFailed { .. } => ErrorKind::KernelFailed,
            E::NoReply { .. } => ErrorKind::NoReply,
            E::NotAccepting { .. } | E::InvalidState { .. } | E::UnknownKernel { .. } => {
                ErrorKind::Unavailable
            }
            _ => ErrorKind::Internal,
        }
    }

    /// Whether trying the same input again later can succeed.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorKind::Busy | ErrorKind::Timeout | ErrorKind::Unavailable
        )
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The JSON body of an error reply or dead letter: `{"error": "bad_input", "message": "..."}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// What went wrong.
    pub error: ErrorKind,
    /// A human-readable explanation.
    pub message: String,
}

/// Header naming the error kind on error replies and dead letters.
pub const ERROR_HEADER: &str = "Resident-Error";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_map_runtime_errors() {
        for k in [
            ErrorKind::BadInput,
            ErrorKind::Busy,
            ErrorKind::Timeout,
            ErrorKind::KernelFailed,
            ErrorKind::NoReply,
            ErrorKind::Unavailable,
            ErrorKind::Internal,
        ] {
            assert_eq!(ErrorKind::parse(k.as_str()), Some(k));
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
        }
        assert_eq!(ErrorKind::parse("nope"), None);
        let e = resident::Error::NoReply {
            id: "k".into(),
            message_id: 3,
        };
        assert_eq!(ErrorKind::of(&e), ErrorKind::NoReply);
        let e = resident::Error::Timeout {
            id: "k".into(),
            op: resident::Op::Call,
            timeout: std::time::Duration::from_secs(1),
            message: None,
        };
        assert_eq!(ErrorKind::of(&e), ErrorKind::Timeout);
        assert!(ErrorKind::Timeout.is_transient());
        assert!(!ErrorKind::BadInput.is_transient());
    }
}

/// Why a checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The value is not a checkpoint of this format.
    #[error("not a resident checkpoint (bad magic or version)")]
    Format,
    /// The value's length does not match its header.
    #[error("checkpoint of {actual} bytes, its header says {expected}")]
    Length {
        /// Bytes the header implies.
        expected: usize,
        /// Bytes found.
        actual: usize,
    },
    /// The checkpoint holds states of another type or another key count.
    #[error("checkpoint holds {keys} states of {size} bytes, expected {expected_keys} of {expected_size}")]
    Shape {
        /// States in the checkpoint.
        keys: u32,
        /// Bytes per state in the checkpoint.
        size: u32,
        /// States expected.
        expected_keys: u32,
        /// Bytes per state expected.
        expected_size: u32,
    },
}
