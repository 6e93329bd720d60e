//! The benchmarks' one error type.

/// Why a benchmark did not produce its figures.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The runtime refused or failed (launch, send, receive, call, terminate).
    #[error(transparent)]
    Runtime(#[from] resident::Error),
    /// A kernel answered something other than the reference: the figures would be of a wrong
    /// computation, so there are none.
    #[error("output {index} was {got}, expected {want}")]
    WrongOutput {
        /// Position of the message.
        index: u64,
        /// What came back.
        got: u64,
        /// What the reference says.
        want: u64,
    },
    /// The terminate report does not account for every accepted message.
    #[error("accounting: {reported} messages in the report against {accepted} accepted")]
    Accounting {
        /// Messages the kernel accepted.
        accepted: u64,
        /// Handled, expired and returned in its report.
        reported: u64,
    },
    /// A thread of the benchmark panicked (named).
    #[error("the benchmark's {0} thread panicked")]
    ThreadPanicked(&'static str),
    /// The results could not be written.
    #[error(transparent)]
    Write(#[from] crate::provenance::WriteError),
}
