//! Fuzzing on stable Rust: one target per decoder of untrusted bytes, driven by a seeded,
//! coverage-free but structure-aware generator (`resident fuzz --target T --inputs N`).
//!
//! Each input is a seed-corpus input (`crates/resident-bench/fuzz/corpus/<target>/`, built into
//! the binary) or a structure-aware one from the target's own generator, then mutated 0 to 9
//! times: bit flips, bytes set, inserted, deleted, repeated and swapped, truncation, splicing
//! with another corpus input, numbers at the edges of their types, tokens of the format,
//! invalid UTF-8, and rarely a huge run of up to [`FuzzOptions::huge`] bytes. The same seed
//! gives the same inputs on every machine.
//!
//! An input fails ([`CrashKind`]) when a decoder panics (caught with `catch_unwind`), when an
//! error's message is longer than [`MAX_ERROR_DISPLAY`] bytes ([`MAX_COMPILE_ERROR_DISPLAY`]
//! for an error that carries a compiler's log), when decoding held more than
//! [`alloc_bound`] bytes at once (measured when [`alloc::CountingAlloc`] is the global
//! allocator), or when what a decoder accepted breaks its invariants. Every rejection is
//! classified by its error type's variant (an exhaustive match, so an untyped rejection cannot
//! compile), and the report counts the variants seen.

pub mod alloc;
mod cuda_gen;
mod gen;
mod layout;
mod sink;
mod targets;
mod wgsl_gen;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::{self, Display};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{json, Value};

pub use gen::Rng;

/// The longest message an error may have, for an input of any size.
pub const MAX_ERROR_DISPLAY: usize = 512;

/// The longest message a compile error may have (the `cuda` target's
/// `PersistentError::Compile`), for an input of any size: the compiler's log, which
/// resident-cuda keeps to [`resident_cuda::MAX_LOG_BYTES`] (4 KiB, each line cut to
/// [`resident_cuda::MAX_LOG_LINE`] bytes; see [`resident_cuda::bounded_log`]), after a header
/// of at most [`MAX_ERROR_DISPLAY`] bytes. Larger than `MAX_ERROR_DISPLAY` on purpose: 512
/// bytes hold one or two of NVRTC's errors with their quoted lines, and a compile error must
/// show its first errors in full to be of use.
pub const MAX_COMPILE_ERROR_DISPLAY: usize = resident_cuda::MAX_LOG_BYTES + MAX_ERROR_DISPLAY;

/// The most bytes one input's decoding may hold at once: a fixed 256 KiB plus 32 bytes per
/// input byte (the decoders keep what they parse: an edge list of `"0 1\n"` lines holds its
/// pairs, their ids and the dense map).
pub fn alloc_bound(input_len: usize) -> usize {
    256 * 1024 + 32 * input_len
}

/// [`alloc_bound`] for one target: `wgsl` has 512 bytes per input byte (naga's parser builds
/// an expression of up to about 280 bytes for each one-byte token: a 557,860-byte handler whose
/// type was cut by a run of unary `*` held 157 MB; its 10^7-input run at seed 1 saw 281 bytes
/// per byte at most, after the engine stopped having naga render excerpts of thousands of
/// lines);
/// `cuda` has 1 MiB plus 64 bytes per input byte (the text, read with replacement characters,
/// is in up to three fields and the translation unit, which holds the 53 KB template, while
/// it grows; `compile_ptx` renders it again, and NVRTC's log is read whole once, before it is
/// bounded).
pub fn target_alloc_bound(target: Target, input_len: usize) -> usize {
    match target {
        Target::Wgsl => 256 * 1024 + 512 * input_len,
        Target::Cuda => (1 << 20) + 64 * input_len,
        _ => alloc_bound(input_len),
    }
}

/// A decoder under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// The NATS payload codecs (`PodCodec`, `JsonCodec` into plain types and into a serde
    /// struct with a fallible conversion), `ErrorKind::parse` of a header value, and
    /// `parse_reply` of a reply with the error header.
    NatsCodec,
    /// `resident_workloads::input::parse_edge_list` (`--graph FILE`).
    EdgeList,
    /// `resident_workloads::input::parse_readings` (`--input FILE`, CSV).
    Readings,
    /// `StructLayout::new` of field descriptors as the Python binding gives them from a numpy
    /// dtype (name, scalar code, array extents, offset; a text form, one field a line), then
    /// its C declaration and WGSL structs.
    Layout,
    /// WGSL handler source through naga's parse and validation: as given (a one-shot kernel's
    /// module) and as the module `WgslHandler::module_source` assembles around a handler.
    Wgsl,
    /// A ring handler's CUDA C, and at times its other user-supplied fields (names, type
    /// declarations, bound buffers, key field), through `KernelSource::render`; every
    /// [`FuzzOptions::compile_every`]-th input and the seed corpus also through NVRTC
    /// (`template::compile_ptx` for `compute_90`), when NVRTC is present. A compile error is
    /// judged against [`MAX_COMPILE_ERROR_DISPLAY`].
    Cuda,
}

impl Target {
    /// Every target.
    pub const ALL: [Target; 6] = [
        Target::NatsCodec,
        Target::EdgeList,
        Target::Readings,
        Target::Layout,
        Target::Wgsl,
        Target::Cuda,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Target::NatsCodec => "nats-codec",
            Target::EdgeList => "edge-list",
            Target::Readings => "readings",
            Target::Layout => "layout",
            Target::Wgsl => "wgsl",
            Target::Cuda => "cuda",
        }
    }

    /// The target of a name.
    pub fn from_name(name: &str) -> Result<Target, FuzzError> {
        Target::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| FuzzError::UnknownTarget(name.chars().take(64).collect()))
    }
}

impl Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a fuzzing run could not run (a failing input is not an error: it is in the report).
#[derive(Debug, thiserror::Error)]
pub enum FuzzError {
    /// No target has this name.
    #[error(
        "unknown fuzz target '{0}' (nats-codec, edge-list, readings, layout, wgsl, cuda or all)"
    )]
    UnknownTarget(String),
    /// A failing input could not be saved.
    #[error("cannot save the failing input to {path}: {source}")]
    Save {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

/// The `cuda` target compiles every this many inputs with NVRTC ([`FuzzOptions::compile_every`]).
pub const DEFAULT_COMPILE_EVERY: u64 = 250;

/// How many inputs, from which seed, how large.
#[derive(Clone, Debug)]
pub struct FuzzOptions {
    /// Inputs to run.
    pub inputs: u64,
    /// The generator's seed (each target mixes in its own).
    pub seed: u64,
    /// Most bytes of an ordinary input.
    pub max_len: usize,
    /// Most bytes of the rare huge run a mutation inserts.
    pub huge: usize,
    /// Where failing inputs are saved (`<target>-<seed>-<index>.bin`); none: not saved.
    pub crash_dir: Option<PathBuf>,
    /// The `cuda` target also compiles with NVRTC each input whose index is a multiple of this
    /// (and each seed-corpus input); 0: none. An NVRTC compile of the ring template takes
    /// about 0.6 s when it succeeds and 20 to 150 ms when it fails (0.15 s on average over
    /// the fuzzed inputs), against some 70 us for the rest of an input (a debug build, on a
    /// shared 2-vCPU VM): at the default [`DEFAULT_COMPILE_EVERY`], CI's 10^5 inputs compile
    /// 400 of them and take about a minute.
    pub compile_every: u64,
    /// Threads that judge inputs (1: the calling thread alone; more: one thread draws the
    /// inputs and this many judge them). The report does not depend on it.
    pub jobs: std::num::NonZeroUsize,
    /// How often [`run_with_progress`] reports (none: never).
    pub progress_every: Option<std::time::Duration>,
}

impl Default for FuzzOptions {
    /// 10 000 inputs, seed 1, inputs up to 4 KiB, huge runs up to 1 MiB, nothing saved, every
    /// [`DEFAULT_COMPILE_EVERY`]th `cuda` input compiled, one job, no progress reports.
    fn default() -> Self {
        FuzzOptions {
            inputs: 10_000,
            seed: 1,
            max_len: 4096,
            huge: 1 << 20,
            crash_dir: None,
            compile_every: DEFAULT_COMPILE_EVERY,
            jobs: std::num::NonZeroUsize::MIN,
            progress_every: None,
        }
    }
}

/// Why an input failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrashKind {
    /// A decoder panicked.
    Panic {
        /// The panic's message and location.
        message: String,
    },
    /// An error's message is longer than [`MAX_ERROR_DISPLAY`] (a compile error's, than
    /// [`MAX_COMPILE_ERROR_DISPLAY`]).
    LongError {
        /// The decoder.
        decoder: &'static str,
        /// The error's variant.
        kind: &'static str,
        /// The message's length.
        bytes: usize,
        /// The most it may have.
        max: usize,
    },
    /// Decoding held more than [`alloc_bound`] bytes at once.
    Alloc {
        /// Bytes held at the peak.
        peak: usize,
        /// The bound for this input.
        bound: usize,
    },
    /// What a decoder returned breaks its invariants.
    Invariant {
        /// The decoder.
        decoder: &'static str,
        /// What is wrong (at most [`MAX_ERROR_DISPLAY`] bytes).
        what: String,
    },
}

impl Display for CrashKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrashKind::Panic { message } => write!(f, "panic: {message}"),
            CrashKind::LongError {
                decoder,
                kind,
                bytes,
                max,
            } => write!(
                f,
                "{decoder}: a {kind} error of {bytes} bytes (at most {max})"
            ),
            CrashKind::Alloc { peak, bound } => {
                write!(f, "held {peak} bytes at once, bound {bound}")
            }
            CrashKind::Invariant { decoder, what } => write!(f, "{decoder}: {what}"),
        }
    }
}

/// One failing input.
#[derive(Clone, Debug)]
pub struct Crash {
    /// Its index in the run (the run's seed and this index reproduce it).
    pub index: u64,
    /// Its length.
    pub len: usize,
    /// Why it failed.
    pub kind: CrashKind,
    /// Where it was saved.
    pub saved: Option<PathBuf>,
}

/// What a run of one target found.
#[derive(Clone, Debug)]
pub struct TargetReport {
    /// The target.
    pub target: Target,
    /// Inputs run.
    pub inputs: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// The seed.
    pub seed: u64,
    /// Failing inputs (at most the first 20 kept; [`TargetReport::crash_count`] counts all).
    pub crashes: Vec<Crash>,
    /// Failing inputs in all.
    pub crash_count: u64,
    /// Decoder calls that accepted their input, by decoder.
    pub accepted: BTreeMap<&'static str, u64>,
    /// Rejections by decoder and error variant (`decoder: Variant`).
    pub error_kinds: BTreeMap<(&'static str, &'static str), u64>,
    /// The longest error message seen (of those judged against [`MAX_ERROR_DISPLAY`]).
    pub longest_error: usize,
    /// The longest compile error's message seen (judged against
    /// [`MAX_COMPILE_ERROR_DISPLAY`]; the `cuda` target's NVRTC compiles).
    pub longest_compile_error: usize,
    /// Decoder calls that did not run, by decoder and why (`cuda` without NVRTC).
    pub skipped: BTreeMap<(&'static str, &'static str), u64>,
    /// Every how many inputs the `cuda` target compiles one ([`FuzzOptions::compile_every`]).
    pub compile_every: u64,
    /// The longest input.
    pub longest_input: usize,
    /// The most bytes one input's decoding held at once, and that input's length (none
    /// without the counting allocator).
    pub alloc_peak: Option<(usize, usize)>,
}

impl TargetReport {
    /// The report as JSON: `{target, inputs, seconds, crashes, error_kinds: [...], ...}`.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "target": self.target.name(),
            "inputs": self.inputs,
            "seconds": (self.seconds * 1000.0).round() / 1000.0,
            "seed": self.seed,
            "crashes": self.crash_count,
            "crash_examples": self.crashes.iter().map(|c| json!({
                "index": c.index,
                "len": c.len,
                "why": c.kind.to_string(),
                "saved": c.saved.as_ref().map(|p| p.display().to_string()),
            })).collect::<Vec<_>>(),
            "error_kinds": self.error_kinds.keys()
                .map(|(d, k)| format!("{d}: {k}")).collect::<Vec<_>>(),
            "error_counts": self.error_kinds.iter()
                .map(|((d, k), n)| (format!("{d}: {k}"), json!(n)))
                .collect::<serde_json::Map<_, _>>(),
            "accepted": self.accepted,
            "longest_error_bytes": self.longest_error,
            "skipped": self.skipped.iter()
                .map(|((d, why), n)| (format!("{d}: {why}"), json!(n)))
                .collect::<serde_json::Map<_, _>>(),
            "longest_input_bytes": self.longest_input,
            "alloc_peak": self.alloc_peak.map(|(peak, len)| json!({
                "bytes": peak, "input_bytes": len, "bound": target_alloc_bound(self.target, len),
            })),
        });
        if self.target == Target::Cuda {
            v["compile_every"] = json!(self.compile_every);
            v["longest_compile_error_bytes"] = json!(self.longest_compile_error);
            v["max_compile_error_display"] = json!(MAX_COMPILE_ERROR_DISPLAY);
        }
        v
    }
}

/// The outcome of one input, as the runner collects it.
#[derive(Default)]
struct Record {
    accepted: BTreeMap<&'static str, u64>,
    error_kinds: BTreeMap<(&'static str, &'static str), u64>,
    skipped: BTreeMap<(&'static str, &'static str), u64>,
    longest_error: usize,
    longest_compile_error: usize,
    failure: Option<CrashKind>,
}

impl Record {
    fn judge_error(
        &mut self,
        decoder: &'static str,
        kind: &'static str,
        error: &dyn Display,
        max: usize,
    ) -> usize {
        *self.error_kinds.entry((decoder, kind)).or_default() += 1;
        let bytes = sink::display_len(error);
        if bytes > max && self.failure.is_none() {
            self.failure = Some(CrashKind::LongError {
                decoder,
                kind,
                bytes,
                max,
            });
        }
        bytes
    }
}

impl sink::Sink for Record {
    fn accepted(&mut self, decoder: &'static str) {
        *self.accepted.entry(decoder).or_default() += 1;
    }

    fn rejected(&mut self, decoder: &'static str, kind: &'static str, error: &dyn Display) {
        let bytes = self.judge_error(decoder, kind, error, MAX_ERROR_DISPLAY);
        self.longest_error = self.longest_error.max(bytes);
    }

    fn rejected_with_log(
        &mut self,
        decoder: &'static str,
        kind: &'static str,
        error: &dyn Display,
    ) {
        let bytes = self.judge_error(decoder, kind, error, MAX_COMPILE_ERROR_DISPLAY);
        self.longest_compile_error = self.longest_compile_error.max(bytes);
    }

    fn skipped(&mut self, decoder: &'static str, why: &'static str) {
        *self.skipped.entry((decoder, why)).or_default() += 1;
    }

    fn violation(&mut self, decoder: &'static str, what: fmt::Arguments<'_>) {
        if self.failure.is_none() {
            let mut what = what.to_string();
            truncate(&mut what, MAX_ERROR_DISPLAY);
            self.failure = Some(CrashKind::Invariant { decoder, what });
        }
    }
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
}

thread_local! {
    /// Set while this thread runs an input: its panics are recorded here, not printed.
    static FUZZING: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
}

/// Installs (once) a panic hook that records the panics of fuzzing threads and passes every
/// other panic to the hook that was there.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let mine = FUZZING.with(|f| match f.try_borrow_mut() {
                Ok(mut slot) if slot.is_some() => {
                    let mut message = info.to_string();
                    truncate(&mut message, MAX_ERROR_DISPLAY);
                    *slot = Some(Some(message));
                    true
                }
                _ => false,
            });
            if !mine {
                previous(info);
            }
        }));
    });
}

/// Runs one input through a target's decoders (`full`: its slow stages too, the `cuda`
/// target's NVRTC compile) and judges it.
fn judge(target: Target, input: &[u8], counting: bool, full: bool) -> (Record, Option<usize>) {
    let mut record = Record::default();
    FUZZING.with(|f| *f.borrow_mut() = Some(None));
    if counting {
        alloc::begin();
    }
    let result = catch_unwind(AssertUnwindSafe(|| {
        targets::run(target, input, &mut record, full);
    }));
    let peak = counting.then(alloc::end);
    let panic = FUZZING.with(|f| f.borrow_mut().take()).flatten();
    if result.is_err() {
        record.failure = Some(CrashKind::Panic {
            message: panic.unwrap_or_else(|| "a panic without a message".into()),
        });
    } else if let Some(peak) = peak.filter(|&p| p > target_alloc_bound(target, input.len())) {
        record.failure.get_or_insert(CrashKind::Alloc {
            peak,
            bound: target_alloc_bound(target, input.len()),
        });
    }
    (record, peak)
}

/// Runs one input through `target` as a fuzzing run would (for regression tests), its slow
/// stages included (the `cuda` target compiles it): `Err` with why it fails.
pub fn replay(target: Target, input: &[u8]) -> Result<(), CrashKind> {
    install_panic_hook();
    let (record, _) = judge(target, input, alloc::installed(), true);
    record.failure.map_or(Ok(()), Err)
}

/// How far a run has got ([`run_with_progress`]).
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// The target.
    pub target: Target,
    /// Inputs judged so far.
    pub judged: u64,
    /// Inputs the run will judge.
    pub inputs: u64,
    /// Failing inputs so far.
    pub failing: u64,
    /// Wall-clock seconds so far.
    pub seconds: f64,
}

/// Runs `opts.inputs` inputs through `target` (see [`run_with_progress`]).
pub fn run(target: Target, opts: &FuzzOptions) -> Result<TargetReport, FuzzError> {
    run_with_progress(target, opts, &|_| {})
}

/// Runs `opts.inputs` inputs through `target` on [`FuzzOptions::jobs`] threads, calling
/// `progress` about every [`FuzzOptions::progress_every`].
///
/// One thread draws the inputs in order from the seeded generator, so a seed gives the same
/// inputs whatever the number of jobs; with more than one job, `jobs` threads judge them as
/// they come (the NVRTC compiles of the `cuda` target, 90% of its time, run side by side).
/// The report is the same for any number of jobs but for its seconds: counts are summed,
/// failing inputs ordered by index (the first 20 kept; each job saves at most its own first 20
/// to [`FuzzOptions::crash_dir`]), and the allocation peak is the earliest input's on a tie.
pub fn run_with_progress(
    target: Target,
    opts: &FuzzOptions,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<TargetReport, FuzzError> {
    install_panic_hook();
    let counting = alloc::installed();
    let mut inputs = Inputs::new(target, opts);
    let start = Instant::now();
    let mut ticker = Ticker {
        target,
        inputs: opts.inputs,
        start,
        last: start,
        every: opts.progress_every,
        progress,
    };
    let jobs = opts.jobs.get();
    let mut tally = if jobs == 1 {
        let mut tally = Tally::new(target, opts);
        let mut input = Vec::with_capacity(opts.max_len);
        for index in 0..opts.inputs {
            inputs.next(index, &mut input);
            let (record, peak) = judge(
                target,
                &input,
                counting,
                opts.full(index, inputs.corpus_len()),
            );
            tally.add(index, &input, record, peak, opts)?;
            ticker.tick(index + 1, index + 1, tally.report.crash_count);
        }
        tally
    } else {
        run_parallel(target, opts, counting, jobs, &mut inputs, &mut ticker)?
    };
    tally.report.seconds = start.elapsed().as_secs_f64();
    Ok(tally.report)
}

/// [`run_with_progress`] with more than one job: this thread draws, `jobs` threads judge.
fn run_parallel(
    target: Target,
    opts: &FuzzOptions,
    counting: bool,
    jobs: usize,
    inputs: &mut Inputs,
    ticker: &mut Ticker<'_>,
) -> Result<Tally, FuzzError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{mpsc, Arc, Mutex, PoisonError};

    // Bounded: at most 4 inputs a job wait (each at most 2 * `huge` bytes).
    let (tx, rx) = mpsc::sync_channel::<(u64, Vec<u8>)>(4 * jobs);
    let rx = Arc::new(Mutex::new(rx));
    // Counters for the progress line only (Relaxed: nothing is ordered by them).
    let judged = AtomicU64::new(0);
    let failing = AtomicU64::new(0);
    let corpus_len = inputs.corpus_len();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..jobs)
            .map(|_| {
                // Each job holds a handle to the queue: when every job has ended (a failing
                // input that could not be saved ends one), the queue closes and the drawing
                // below stops instead of waiting for room.
                let rx = Arc::clone(&rx);
                let (judged, failing) = (&judged, &failing);
                s.spawn(move || -> Result<Tally, FuzzError> {
                    let mut tally = Tally::new(target, opts);
                    loop {
                        // The lock is held while waiting: the other jobs wait for the lock
                        // instead of the queue, and inputs go out in order either way.
                        let next = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
                        let Ok((index, input)) = next else {
                            return Ok(tally);
                        };
                        let full = opts.full(index, corpus_len);
                        let (record, peak) = judge(target, &input, counting, full);
                        if record.failure.is_some() {
                            failing.fetch_add(1, Ordering::Relaxed);
                        }
                        tally.add(index, &input, record, peak, opts)?;
                        judged.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        drop(rx);
        for index in 0..opts.inputs {
            let mut input = Vec::with_capacity(opts.max_len);
            inputs.next(index, &mut input);
            if tx.send((index, input)).is_err() {
                break; // every job has ended: its error is returned below
            }
            ticker.tick(
                index + 1,
                judged.load(Ordering::Relaxed),
                failing.load(Ordering::Relaxed),
            );
        }
        drop(tx);
        let mut total = Tally::new(target, opts);
        let mut first_error = None;
        for w in workers {
            match w.join() {
                Ok(Ok(part)) => total.merge(part),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                // `judge` catches the decoders' panics; one here is the harness's own.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(total),
        }
    })
}

impl FuzzOptions {
    /// Whether input `index` also runs the slow stages: the seed corpus and every
    /// [`FuzzOptions::compile_every`]-th input.
    fn full(&self, index: u64, corpus_len: usize) -> bool {
        (index as usize) < corpus_len
            || (self.compile_every > 0 && index.is_multiple_of(self.compile_every))
    }
}

/// The seeded input sequence of one target.
struct Inputs {
    rng: Rng,
    corpus: &'static [&'static [u8]],
    dict: &'static [&'static str],
    target: Target,
    max_len: usize,
    huge: usize,
}

impl Inputs {
    fn new(target: Target, opts: &FuzzOptions) -> Inputs {
        let salt = match target {
            Target::NatsCodec => 0x6e61_7473,
            Target::EdgeList => 0x6564_6765,
            Target::Readings => 0x7265_6164,
            Target::Layout => 0x6c61_796f,
            Target::Wgsl => 0x7767_736c,
            Target::Cuda => 0x6375_6461,
        };
        Inputs {
            rng: Rng::new(opts.seed ^ salt),
            corpus: targets::corpus(target),
            dict: targets::dict(target),
            target,
            max_len: opts.max_len,
            huge: opts.huge,
        }
    }

    fn corpus_len(&self) -> usize {
        self.corpus.len()
    }

    /// Input `index` (called for 0, 1, 2, ... in turn) into `input`: the corpus as it is
    /// first, then mutated corpus and generated inputs.
    fn next(&mut self, index: u64, input: &mut Vec<u8>) {
        input.clear();
        let (rng, corpus) = (&mut self.rng, self.corpus);
        if (index as usize) < corpus.len() {
            input.extend_from_slice(corpus[index as usize]);
            return;
        }
        if rng.one_in(2) {
            input.extend_from_slice(corpus[rng.below(corpus.len())]);
        } else {
            targets::generate(self.target, rng, input);
        }
        let mutations = if rng.one_in(5) { 0 } else { 1 + rng.below(9) };
        let mut huge = false;
        for _ in 0..mutations {
            huge |= gen::mutate(rng, input, corpus, self.dict, self.huge);
            input.truncate(if huge { 2 * self.huge } else { self.max_len });
        }
    }
}

/// Calls the progress callback about every [`FuzzOptions::progress_every`].
struct Ticker<'a> {
    target: Target,
    inputs: u64,
    start: Instant,
    last: Instant,
    every: Option<std::time::Duration>,
    progress: &'a (dyn Fn(&Progress) + Sync),
}

impl Ticker<'_> {
    /// After `drawn` inputs were drawn (the clock is read every 256).
    fn tick(&mut self, drawn: u64, judged: u64, failing: u64) {
        let Some(every) = self.every else { return };
        if !drawn.is_multiple_of(256) {
            return;
        }
        let now = Instant::now();
        if now.duration_since(self.last) >= every {
            self.last = now;
            (self.progress)(&Progress {
                target: self.target,
                judged,
                inputs: self.inputs,
                failing,
                seconds: now.duration_since(self.start).as_secs_f64(),
            });
        }
    }
}

/// Adds the counts of `from` to those of `into`.
fn sum_into<K: Ord>(into: &mut BTreeMap<K, u64>, from: BTreeMap<K, u64>) {
    for (k, n) in from {
        *into.entry(k).or_default() += n;
    }
}

/// A report being summed up, with the index of the allocation peak's input (the earliest
/// input wins a tie, whichever job judged it).
struct Tally {
    report: TargetReport,
    peak_index: u64,
}

impl Tally {
    fn new(target: Target, opts: &FuzzOptions) -> Tally {
        Tally {
            report: TargetReport {
                target,
                inputs: opts.inputs,
                seconds: 0.0,
                seed: opts.seed,
                crashes: Vec::new(),
                crash_count: 0,
                accepted: BTreeMap::new(),
                error_kinds: BTreeMap::new(),
                longest_error: 0,
                longest_compile_error: 0,
                skipped: BTreeMap::new(),
                compile_every: opts.compile_every,
                longest_input: 0,
                alloc_peak: None,
            },
            peak_index: 0,
        }
    }

    /// Counts input `index` (inputs come to one tally in increasing index); saves it when it
    /// fails and is among the first 20 failing.
    fn add(
        &mut self,
        index: u64,
        input: &[u8],
        record: Record,
        peak: Option<usize>,
        opts: &FuzzOptions,
    ) -> Result<(), FuzzError> {
        let report = &mut self.report;
        report.longest_input = report.longest_input.max(input.len());
        report.longest_error = report.longest_error.max(record.longest_error);
        report.longest_compile_error = report
            .longest_compile_error
            .max(record.longest_compile_error);
        if let Some(peak) = peak {
            if report.alloc_peak.is_none_or(|(p, _)| peak > p) {
                report.alloc_peak = Some((peak, input.len()));
                self.peak_index = index;
            }
        }
        sum_into(&mut report.accepted, record.accepted);
        sum_into(&mut report.error_kinds, record.error_kinds);
        sum_into(&mut report.skipped, record.skipped);
        if let Some(kind) = record.failure {
            report.crash_count += 1;
            if report.crashes.len() < 20 {
                let saved = match &opts.crash_dir {
                    Some(dir) => Some(save(dir, report.target, opts.seed, index, input)?),
                    None => None,
                };
                report.crashes.push(Crash {
                    index,
                    len: input.len(),
                    kind,
                    saved,
                });
            }
        }
        Ok(())
    }

    /// Adds another job's tally.
    fn merge(&mut self, other: Tally) {
        let (a, b) = (&mut self.report, other.report);
        a.longest_input = a.longest_input.max(b.longest_input);
        a.longest_error = a.longest_error.max(b.longest_error);
        a.longest_compile_error = a.longest_compile_error.max(b.longest_compile_error);
        if let Some((peak, len)) = b.alloc_peak {
            let wins = match a.alloc_peak {
                None => true,
                Some((p, _)) => peak > p || (peak == p && other.peak_index < self.peak_index),
            };
            if wins {
                a.alloc_peak = Some((peak, len));
                self.peak_index = other.peak_index;
            }
        }
        sum_into(&mut a.accepted, b.accepted);
        sum_into(&mut a.error_kinds, b.error_kinds);
        sum_into(&mut a.skipped, b.skipped);
        a.crash_count += b.crash_count;
        a.crashes.extend(b.crashes);
        a.crashes.sort_by_key(|c| c.index);
        a.crashes.truncate(20);
    }
}

fn save(
    dir: &Path,
    target: Target,
    seed: u64,
    index: u64,
    input: &[u8],
) -> Result<PathBuf, FuzzError> {
    let path = dir.join(format!("{}-{seed}-{index}.bin", target.name()));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, input))
        .map_err(|source| FuzzError::Save {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failing(kind: &str) -> Record {
        Record {
            failure: Some(CrashKind::Invariant {
                decoder: "test",
                what: kind.into(),
            }),
            ..Record::default()
        }
    }

    /// Two jobs' tallies merge into the one a single job makes: failing inputs by index, the
    /// first 20 kept, every one counted, the earliest input's allocation peak on a tie.
    #[test]
    fn tallies_merge_as_one_job_counts() {
        let opts = FuzzOptions::default();
        let mut one = Tally::new(Target::Layout, &opts);
        let mut parts = [
            Tally::new(Target::Layout, &opts),
            Tally::new(Target::Layout, &opts),
        ];
        for index in 0..50u64 {
            let input = vec![0u8; index as usize];
            let (record, peak) = if index % 2 == 0 {
                (failing("even"), Some(1000))
            } else {
                (
                    Record::default(),
                    Some(if index == 7 { 5000 } else { 1000 }),
                )
            };
            let record2 = Record {
                failure: record.failure.clone(),
                ..Record::default()
            };
            one.add(index, &input, record, peak, &opts).unwrap();
            // Job 0 takes the inputs below 10 and over 30, job 1 the rest.
            let job = usize::from((10..=30).contains(&index));
            parts[job].add(index, &input, record2, peak, &opts).unwrap();
        }
        let [a, b] = parts;
        let mut merged = Tally::new(Target::Layout, &opts);
        merged.merge(b);
        merged.merge(a);
        let (one, merged) = (one.report, merged.report);
        assert_eq!(merged.crash_count, 25);
        assert_eq!(merged.crash_count, one.crash_count);
        let idx = |r: &TargetReport| r.crashes.iter().map(|c| c.index).collect::<Vec<_>>();
        assert_eq!(idx(&merged), (0..40).step_by(2).collect::<Vec<_>>());
        assert_eq!(idx(&merged), idx(&one));
        assert_eq!(merged.alloc_peak, Some((5000, 7)));
        assert_eq!(merged.alloc_peak, one.alloc_peak);
        assert_eq!(merged.longest_input, 49);

        // A tie: the earliest input's length, whichever job's tally is merged first.
        let mut x = Tally::new(Target::Layout, &opts);
        x.add(9, &[0; 9], Record::default(), Some(100), &opts)
            .unwrap();
        let mut y = Tally::new(Target::Layout, &opts);
        y.add(3, &[0; 3], Record::default(), Some(100), &opts)
            .unwrap();
        let mut m = Tally::new(Target::Layout, &opts);
        m.merge(x);
        m.merge(y);
        assert_eq!(m.report.alloc_peak, Some((100, 3)));
    }
}
