//! The errors of the workloads: input files (with line numbers), the runtime, bound buffers, and
//! failed reference checks.

use std::path::PathBuf;

/// A bad input file or generator parameter.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line that does not parse.
    #[error("{path}:{line}: {reason}")]
    BadLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        #[source]
        reason: LineError,
    },
    /// A file with nothing to compute on: no edges, no readings. A workload over no data would
    /// "pass" its reference check trivially, so the runners that read files refuse it.
    #[error("{path}: {what}")]
    Empty {
        /// The file.
        path: PathBuf,
        /// What is missing.
        what: &'static str,
    },
    /// A generator or size parameter out of range.
    #[error("bad parameter {name} = {value}: {reason}")]
    BadParameter {
        /// The parameter.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
}

/// What is wrong with one line of an input file ([`InputError::BadLine`] adds the file and
/// the line number). A field or line it quotes is an excerpt: at most [`MAX_EXCERPT`] bytes of
/// it, then `...` and its length, so that a file holding one 50 MB line gives a short error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// The line is not UTF-8 text.
    #[error("not UTF-8 text")]
    NotUtf8,
    /// The line does not have the expected fields.
    #[error("expected '{expected}', got '{got}'")]
    Fields {
        /// The expected form, e.g. `src dst`.
        expected: &'static str,
        /// The line's content (an excerpt).
        got: String,
    },
    /// The line has a field past the expected ones.
    #[error("expected '{expected}', got a third field '{extra}'")]
    ExtraField {
        /// The expected form.
        expected: &'static str,
        /// The first field too many (an excerpt).
        extra: String,
    },
    /// An id field is not a `u64`.
    #[error("{what} '{field}' is not a non-negative integer below 2^64")]
    BadId {
        /// Which field (`src`, `dst`, `sensor`).
        what: &'static str,
        /// The field as written (an excerpt).
        field: String,
    },
    /// A value field is not a number.
    #[error("value '{value}' is not a number")]
    NotANumber {
        /// The field as written (an excerpt).
        value: String,
    },
    /// A value field is a number but not finite (NaN, infinity).
    #[error("value '{value}' is not finite")]
    NotFinite {
        /// The field as written (an excerpt).
        value: String,
    },
}

/// The most bytes of a line or field a [`LineError`] quotes.
pub const MAX_EXCERPT: usize = 64;

/// At most [`MAX_EXCERPT`] bytes of `s` (cut at a character boundary), then `... (N bytes)`
/// when it is longer.
pub(crate) fn excerpt(s: &str) -> String {
    if s.len() <= MAX_EXCERPT {
        return s.to_string();
    }
    let mut end = MAX_EXCERPT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}

/// Errors of running a workload.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// Bad input.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The runtime refused or a kernel failed.
    #[error("runtime: {0}")]
    Runtime(#[from] resident::Error),
    /// A bound buffer could not be accessed.
    #[error("bound buffer: {0}")]
    Bind(#[from] resident::prelude::BindError),
    /// A buffer could not be made.
    #[error("memory: {0}")]
    Memory(#[from] resident::MemoryError),
    /// A backend could not be opened.
    #[error("backend: {0}")]
    Backend(#[from] resident::BackendError),
    /// PageRank did not converge within `max_iter` (networkx raises
    /// `PowerIterationFailedConvergence` here).
    #[error("PageRank did not converge in {iterations} iterations (last L1 change {err:e}, needed < {threshold:e})")]
    NotConverged {
        /// Iterations run.
        iterations: u32,
        /// Last L1 change.
        err: f64,
        /// N x tol.
        threshold: f64,
    },
    /// A kernel result differs from the sequential reference beyond the stated tolerance.
    #[error("{workload}: result differs from the f64 reference: {detail}")]
    Mismatch {
        /// Which workload.
        workload: &'static str,
        /// Where and by how much.
        detail: String,
    },
    /// A kernel reported that a message was out of range (or the host would have sent one).
    #[error("{workload}: {detail}")]
    OutOfRange {
        /// Which workload.
        workload: &'static str,
        /// What.
        detail: String,
    },
    /// A kernel refused work it had accepted and said so (never silently): `count` items,
    /// and why.
    #[error("{workload}: the kernel refused {count} {reason}")]
    Refused {
        /// Which workload.
        workload: &'static str,
        /// How many.
        count: u64,
        /// What and why.
        reason: String,
    },
    /// A kernel did not answer in time.
    #[error("{workload}: no answer from the kernel within {waited:?}")]
    Timeout {
        /// Which workload.
        workload: &'static str,
        /// How long.
        waited: std::time::Duration,
    },
}
