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
    /// A variant's own check of its outputs or state failed: its figures would be of a wrong
    /// computation, so there are none.
    #[error("benchmark {variant}: {check}")]
    Check {
        /// The variant measured.
        variant: &'static str,
        /// What was wrong.
        #[source]
        check: OutputCheck,
    },
    /// A benchmark parameter out of range.
    #[error("invalid benchmark parameter: {name} = {value}; it must be {must}")]
    Parameter {
        /// The parameter.
        name: &'static str,
        /// The value given.
        value: u64,
        /// What it must be.
        must: &'static str,
    },
    /// Outputs or a run did not finish within the benchmark's bound.
    #[error("{what} did not finish within {limit:?}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// The bound.
        limit: std::time::Duration,
    },
    /// A CudaSim kernel object carries no bus model (the shim it was built from is older).
    #[error(
        "this CudaSim kernel has no bus model (its object was built without the shim's counters)"
    )]
    NoBusModel,
    /// The persistent-kernel layer failed (no driver or NVRTC, compile, launch, device fault).
    #[error(transparent)]
    Persistent(#[from] resident_engine_cuda::persistent::PersistentError),
    /// A call of the CUDA layer failed.
    #[error(transparent)]
    Cuda(#[from] resident_cuda::CudaError),
    /// A backend could not be opened, or one of its calls failed.
    #[error(transparent)]
    Backend(#[from] resident::backend::BackendError),
    /// A device-hosted kernel's device side failed.
    #[error(transparent)]
    Device(#[from] resident::backend::DeviceError),
    /// A WGSL ring kernel's device side could not be built.
    #[error(transparent)]
    WgslLaunch(#[from] resident::backend::wgpu::ring::WgslLaunchError),
    /// A workload refused its input or its results differ from the reference.
    #[error(transparent)]
    Workload(#[from] resident_workloads::WorkloadError),
    /// A workload's input could not be generated.
    #[error(transparent)]
    Input(#[from] resident_workloads::InputError),
    /// A thread of the benchmark could not be started.
    #[error("cannot spawn {what}: {source}")]
    Spawn {
        /// The thread.
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A thread of the benchmark panicked (named).
    #[error("the benchmark's {0} thread panicked")]
    ThreadPanicked(&'static str),
    /// The results could not be written.
    #[error(transparent)]
    Write(#[from] crate::provenance::WriteError),
}

/// What a benchmark's check of a kernel's outputs or state found wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputCheck {
    /// An output holds a value the reference does not give.
    #[error("the output of message {message} holds {got}, expected {want}")]
    Value {
        /// The message (its id).
        message: u64,
        /// The first wrong word.
        got: u64,
        /// What the reference says.
        want: u64,
    },
    /// Outputs came back out of order.
    #[error("output {want} expected next, got output {got}")]
    Order {
        /// The id expected next.
        want: u64,
        /// The id that came.
        got: u64,
    },
    /// Fewer or more outputs than inputs.
    #[error("{got} outputs for {want} inputs")]
    Count {
        /// Outputs received.
        got: u64,
        /// Inputs sent.
        want: u64,
    },
    /// The state counts a different number of messages than were run.
    #[error("the state counts {got} messages, {want} were run")]
    StateCount {
        /// What the state counts.
        got: u64,
        /// Messages run.
        want: u64,
    },
    /// The variants of one point computed different outputs (their checksums differ).
    #[error("the variants computed different outputs (checksum {got}, first variant {want})")]
    Checksum {
        /// This variant's checksum.
        got: u64,
        /// The first variant's.
        want: u64,
    },
    /// A reading the input was built to make anomalous raised no alert.
    #[error("the spike injected at reading {reading} raised no alert")]
    MissedAlert {
        /// The reading's index in the stream.
        reading: u64,
    },
    /// A latency run (one message in flight) found the input lane full.
    #[error("the input lane was full with one message in flight")]
    LaneFull,
}
