//! The one error type of the CUDA layer. Every message names the call or the step that failed.

#[cfg(feature = "driver")]
use cudarc::driver::sys::CUresult;
#[cfg(feature = "driver")]
use cudarc::nvrtc::sys::nvrtcResult;
use std::path::PathBuf;

/// Everything that can go wrong in `resident-cuda`.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// `libcuda` could not be loaded (no NVIDIA driver on this machine).
    #[error("CUDA driver library not found (searched libcuda.so and its versioned names); install the NVIDIA driver or put libcuda on LD_LIBRARY_PATH")]
    DriverNotFound,
    /// `libnvrtc` could not be loaded.
    #[error("NVRTC library not found (searched libnvrtc.so, libnvrtc.so.13 and related names); run scripts/setup-nvrtc.sh and put its lib folder on LD_LIBRARY_PATH")]
    NvrtcNotFound,
    /// `libcuda` loaded but lacks functions this build calls (an older driver than the
    /// `cuda-13000` bindings expect); refused before any call could panic on the missing symbol.
    #[error(
        "the CUDA driver lacks {symbols:?}, which this build calls; install a newer NVIDIA driver"
    )]
    MissingDriverSymbols {
        /// The functions not found in libcuda.
        symbols: Vec<&'static str>,
    },
    /// NVRTC is newer than the driver: its PTX would be refused at load (PTX ISA too new).
    #[error("NVRTC {}.{} is newer than the CUDA driver ({}.{}): its PTX cannot be loaded; use an NVRTC of at most the driver's version or a newer driver", nvrtc.0, nvrtc.1, driver.0, driver.1)]
    NvrtcNewerThanDriver {
        /// NVRTC's version.
        nvrtc: (u32, u32),
        /// The driver's CUDA version.
        driver: (u32, u32),
    },
    #[cfg(feature = "driver")]
    /// `cuModuleLoadDataEx` failed; `log` is the JIT compiler's error log.
    #[error("cuModuleLoadDataEx failed: {code:?} ({message}); JIT log:\n{log}")]
    ModuleLoad {
        /// The driver's result code.
        code: CUresult,
        /// The driver's description.
        message: String,
        /// The JIT error log (empty when the driver wrote none).
        log: String,
    },
    /// The driver loaded but reports no CUDA device.
    #[error("the CUDA driver reports no device")]
    NoDevice,
    /// A device ordinal past the number of devices.
    #[error("CUDA device {ordinal} requested but only {count} present")]
    DeviceOutOfRange {
        /// Ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    #[cfg(feature = "driver")]
    /// A driver API call returned an error.
    #[error("{0}")]
    Driver(DriverFault),
    #[cfg(feature = "driver")]
    /// An NVRTC call other than compilation failed.
    #[error("{call} failed: {code:?}{}", nvrtc_hint(*code))]
    Nvrtc {
        /// The NVRTC function.
        call: &'static str,
        /// NVRTC's result code.
        code: nvrtcResult,
    },
    /// NVRTC rejected the source; `log` is the compiler's output.
    #[error("NVRTC could not compile `{name}` for {arch}:\n{log}")]
    Compile {
        /// Program name.
        name: String,
        /// Target architecture, e.g. `compute_90`.
        arch: String,
        /// The NVRTC program log.
        log: String,
    },
    /// NVRTC ran past the compile's wall-time limit (`RESIDENT_COMPILE_TIMEOUT_S`, see
    /// [`resident_limits`]): its process was killed.
    #[error("NVRTC did not compile `{name}` within {limit:?} (the compile was stopped; {env} sets the limit)", env = resident_limits::TIMEOUT_ENV)]
    CompileTimeout {
        /// Program name (at most 64 bytes).
        name: String,
        /// The limit.
        limit: std::time::Duration,
    },
    /// NVRTC ran out of the compile's address-space limit (`RESIDENT_COMPILE_MEMORY_MB`, see
    /// [`resident_limits`]) in its process, or the system killed that process for memory.
    #[error("NVRTC ran out of memory compiling `{name}` (limit {limit_mb} MiB above what the process held; {env} sets it)", env = resident_limits::MEMORY_ENV)]
    CompileOutOfMemory {
        /// Program name (at most 64 bytes).
        name: String,
        /// The limit, MiB.
        limit_mb: u64,
    },
    /// NVRTC's process died (a signal: its parser's stack overflowed, say) or could not be
    /// started; the process that asked goes on.
    #[error("NVRTC crashed compiling `{name}`: {reason}")]
    CompileCrashed {
        /// Program name (at most 64 bytes).
        name: String,
        /// The signal, or why the process could not run (at most 256 bytes).
        reason: String,
    },
    /// `libnvJitLink` could not be loaded (or lacks the CUDA 13 entry points): no kernel that
    /// links a function compiled elsewhere (LTO-IR, e.g. a Numba handler) can be built.
    #[error("nvJitLink library not found ({searched}); install it with `pip install nvidia-nvjitlink` (CUDA 13; `pip install resident[numba]` brings it) and put its lib folder on LD_LIBRARY_PATH, or name the library in RESIDENT_NVJITLINK")]
    JitLinkNotFound {
        /// The names tried and why each failed (bounded).
        searched: String,
    },
    /// An nvJitLink call failed: it refused an input (not LTO-IR, another architecture) or the
    /// link (an undefined symbol, a symbol that is not a function). A function of the right
    /// name with another signature is not caught (C names carry no types).
    #[error("{call} failed: {} ({code}){}{log}", jitlink_result_name(*code), if log.is_empty() { "" } else { "; nvJitLink's log:\n" })]
    JitLink {
        /// The nvJitLink function.
        call: &'static str,
        /// Its `nvJitLinkResult`.
        code: i32,
        /// nvJitLink's error log, then its info log, bounded ([`bounded_log`]); empty when it
        /// wrote none.
        log: String,
    },
    /// nvJitLink's link was stopped by the compile's limits in its own process, or crashed
    /// there ([`resident_limits`]).
    #[error("the link of `{name}`: {source}")]
    JitLinkStopped {
        /// The first input's name (at most 64 bytes).
        name: String,
        /// How it ended (`compiler` is `nvJitLink`).
        #[source]
        source: resident_limits::CompileStopped,
    },
    /// The kernel cache could not read or write its folder.
    #[error("kernel cache at {path}: {source}")]
    Cache {
        /// The file or folder involved.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    #[cfg(feature = "driver")]
    /// NVML (telemetry) is unavailable or failed.
    #[error("NVML {what} failed: {source}")]
    Nvml {
        /// What was asked.
        what: &'static str,
        /// NVML's error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[cfg(feature = "driver")]
    /// A device fault (trap, illegal address, ...) poisoned the device's CUDA context: every
    /// kernel, buffer and stream made on it before the fault is gone. Once every object from
    /// before the fault has been dropped the context is reset and the device opened again, if
    /// the driver allows it; the drivers measured so far do not (an H100 with driver 580 keeps
    /// answering the fault after a reset), and the device then stays lost to this process.
    #[error("CUDA device {ordinal} was lost to a device fault ({fault}); drop every kernel and buffer made on it before the fault and open it again, or, if the driver refuses a fresh context (this error again), restart the process")]
    DeviceLost {
        /// The device.
        ordinal: usize,
        /// The fault, as the driver reported it.
        #[source]
        fault: DriverFault,
    },
    /// Launching one more resident (persistent) kernel could leave some of them unable to run,
    /// because not all of them would be co-resident on the device.
    #[error("CUDA device {ordinal} already holds {resident} resident kernels, its limit (one per SM, at most the device's concurrent-kernel limit) is {limit}")]
    ResidencyExceeded {
        /// The device.
        ordinal: usize,
        /// Resident kernels now.
        resident: usize,
        /// The most this device keeps co-resident.
        limit: usize,
    },
    /// A call that waits for the whole device was refused because ring kernels are resident on
    /// it (they never finish, so it would wait forever).
    #[error("device {ordinal}: {call} refused: {resident} ring kernel(s) resident, the wait would never end")]
    WouldWaitForResident {
        /// The device.
        ordinal: usize,
        /// Resident kernels now.
        resident: usize,
        /// The refused call.
        call: &'static str,
    },
    /// The resident kernels of a device did not all park for an operation under the
    /// residency rule within its timeout.
    #[error("device {ordinal}: of the {kernels} resident kernel(s), {stuck:?} did not park in time (a handler that does not return?) for an operation that needs the device idle")]
    QuiesceTimeout {
        /// The device.
        ordinal: usize,
        /// Resident kernels asked to park.
        kernels: usize,
        /// The kernels that did not park (their names).
        stuck: Vec<String>,
    },
    /// A caller passed a value the call cannot accept.
    #[error("invalid argument to {call}: {reason}")]
    InvalidArgument {
        /// The function that rejected the value.
        call: &'static str,
        /// Why.
        reason: String,
    },
}

#[cfg(feature = "driver")]
/// A failed driver call: which call, the driver's `CUresult`, and the driver's description of
/// it. Compared by value (`fault.code == CUresult::CUDA_ERROR_ILLEGAL_ADDRESS`); `Clone`, so a
/// lost device can keep the fault that lost it and answer it to every later caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {code:?} ({message})")]
pub struct DriverFault {
    /// The driver function, e.g. `cuMemHostAlloc`.
    pub call: &'static str,
    /// The driver's result code.
    pub code: CUresult,
    /// The driver's description of the code (`cuGetErrorString`), "no description" when it
    /// gave none.
    pub message: String,
}

#[cfg(feature = "driver")]
impl DriverFault {
    /// Whether this code poisons the context (see [`CudaError::is_sticky`]).
    pub fn is_sticky(&self) -> bool {
        STICKY_CODES.contains(&self.code)
    }
}

#[cfg(feature = "driver")]
/// A hint for NVRTC codes that mean a missing companion library rather than a bad call.
fn nvrtc_hint(code: nvrtcResult) -> &'static str {
    match code {
        nvrtcResult::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE => {
            " (NVRTC's builtins library failed to load: is libnvrtc-builtins on LD_LIBRARY_PATH?)"
        }
        _ => "",
    }
}

#[cfg(feature = "driver")]
/// Driver errors after which the context is unusable ("sticky": every later call in the
/// context fails with the same error until it is reset). From the CUDA driver API's `CUresult`
/// documentation: every code documented as leaving "the context in an inconsistent state" or
/// requiring that "the process must be terminated and relaunched", plus `CUDA_ERROR_UNKNOWN`,
/// which a fault can surface as and after which nothing about the context is known.
const STICKY_CODES: &[CUresult] = &[
    CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
    CUresult::CUDA_ERROR_LAUNCH_FAILED,
    CUresult::CUDA_ERROR_LAUNCH_TIMEOUT,
    CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUresult::CUDA_ERROR_MISALIGNED_ADDRESS,
    CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE,
    CUresult::CUDA_ERROR_INVALID_PC,
    CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR,
    CUresult::CUDA_ERROR_ASSERT,
    CUresult::CUDA_ERROR_ECC_UNCORRECTABLE,
    CUresult::CUDA_ERROR_NVLINK_UNCORRECTABLE,
    CUresult::CUDA_ERROR_CONTAINED,
    CUresult::CUDA_ERROR_TENSOR_MEMORY_LEAK,
    CUresult::CUDA_ERROR_EXTERNAL_DEVICE,
    CUresult::CUDA_ERROR_UNKNOWN,
];

impl CudaError {
    /// Whether this error poisoned the context (a device fault; see [`CudaError::DeviceLost`]).
    pub fn is_sticky(&self) -> bool {
        match self {
            #[cfg(feature = "driver")]
            CudaError::Driver(fault) => fault.is_sticky(),
            #[cfg(feature = "driver")]
            CudaError::DeviceLost { .. } => true,
            _ => false,
        }
    }

    #[cfg(feature = "driver")]
    #[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
    pub fn invalid(call: &'static str, reason: impl Into<String>) -> Self {
        CudaError::InvalidArgument {
            call,
            reason: reason.into(),
        }
    }
}

/// The name of an `nvJitLinkResult` code (nvJitLink.h), for errors.
pub fn jitlink_result_name(code: i32) -> &'static str {
    const NAMES: [&str; 19] = [
        "NVJITLINK_SUCCESS",
        "NVJITLINK_ERROR_UNRECOGNIZED_OPTION",
        "NVJITLINK_ERROR_MISSING_ARCH",
        "NVJITLINK_ERROR_INVALID_INPUT",
        "NVJITLINK_ERROR_PTX_COMPILE",
        "NVJITLINK_ERROR_NVVM_COMPILE",
        "NVJITLINK_ERROR_INTERNAL",
        "NVJITLINK_ERROR_THREADPOOL",
        "NVJITLINK_ERROR_UNRECOGNIZED_INPUT",
        "NVJITLINK_ERROR_FINALIZE",
        "NVJITLINK_ERROR_NULL_INPUT",
        "NVJITLINK_ERROR_INCOMPATIBLE_OPTIONS",
        "NVJITLINK_ERROR_INCORRECT_INPUT_TYPE",
        "NVJITLINK_ERROR_ARCH_MISMATCH",
        "NVJITLINK_ERROR_OUTDATED_LIBRARY",
        "NVJITLINK_ERROR_MISSING_FATBIN",
        "NVJITLINK_ERROR_UNRECOGNIZED_ARCH",
        "NVJITLINK_ERROR_UNSUPPORTED_ARCH",
        "NVJITLINK_ERROR_LTO_NOT_ENABLED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or("an unknown nvJitLinkResult")
}

/// Result of this crate.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// The most bytes of one line of a compiler's log that an error keeps ([`bounded_log`]).
pub const MAX_LOG_LINE: usize = 200;

/// The most bytes of a compiler's log that an error keeps, its note of what was left out
/// included ([`bounded_log`]).
pub const MAX_LOG_BYTES: usize = 4096;

/// Room kept at the end of [`MAX_LOG_BYTES`] for the note of what was left out.
const NOTE_ROOM: usize = 128;

/// A compiler's log as an error keeps it: each line cut to [`MAX_LOG_LINE`] bytes (then
/// followed by `... (N bytes)`, its whole length), and the lines that do not fit in
/// [`MAX_LOG_BYTES`] left out with a note of how many lines and bytes that was. Invalid UTF-8
/// is replaced. NVRTC and the host compiler quote each offending source line, so a handler
/// with a megabyte-long line and a typo gives a log of up to a hundred times that; a compile
/// error of an ordinary handler is kept whole (its first errors, at least, in full).
///
/// Every compile error of this crate ([`CudaError::Compile`], [`CudaError::ModuleLoad`]) and of
/// the CUDA engine (CudaSim's `SimError::Compile`, and through them `PersistentError::Compile`)
/// keeps its log through this, once, where it is made.
///
/// ```
/// use resident_cuda::error::{bounded_log, MAX_LOG_BYTES};
/// let short = "handler.cu(3): error: identifier \"y\" is undefined\n";
/// assert_eq!(bounded_log(short.as_bytes()), short);
/// let huge = format!("a.cu(1): error: bad\n{}\n", "x".repeat(1 << 20)).repeat(100);
/// let kept = bounded_log(huge.as_bytes());
/// assert!(kept.len() <= MAX_LOG_BYTES);
/// assert!(kept.contains("... (1048576 bytes)") && kept.contains("left out"));
/// ```
pub fn bounded_log(log: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(log.len().min(MAX_LOG_BYTES));
    let (body, newline) = match log.strip_suffix(b"\n") {
        Some(body) => (body, true),
        None => (log, false),
    };
    if log.is_empty() {
        return out;
    }
    let lines = body.iter().filter(|&&b| b == b'\n').count() + 1;
    let mut taken = 0usize;
    let mut piece = String::new();
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        piece.clear();
        push_line(&mut piece, line);
        if out.len() + piece.len() + 1 > MAX_LOG_BYTES - NOTE_ROOM {
            let _ = writeln!(
                out,
                "... ({} more lines, {} bytes, of the compiler's log left out)",
                lines - i,
                log.len() - taken
            );
            return out;
        }
        out.push_str(&piece);
        if i + 1 < lines || newline {
            out.push('\n');
        }
        taken += line.len() + 1;
    }
    out
}

/// One line of a log, cut to [`MAX_LOG_LINE`] bytes (at a character boundary).
fn push_line(out: &mut String, line: &[u8]) {
    use std::fmt::Write as _;
    let mut cut = line.len().min(MAX_LOG_LINE);
    if cut < line.len() {
        // Back off over the continuation bytes (at most 3) of a character the cut would split.
        let mut back = 0;
        while back < 3 && cut > 0 && line[cut] & 0xc0 == 0x80 {
            cut -= 1;
            back += 1;
        }
    }
    let text = String::from_utf8_lossy(&line[..cut]);
    // Replacement characters are 3 bytes each: cut again, at a boundary.
    let mut end = text.len().min(MAX_LOG_LINE);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out.push_str(&text[..end]);
    if cut < line.len() || end < text.len() {
        let _ = write!(out, "... ({} bytes)", line.len());
    }
}

// Every test here builds driver or NVRTC codes.
#[cfg(all(test, feature = "driver"))]
mod tests {
    use super::*;

    fn driver(code: CUresult) -> CudaError {
        CudaError::Driver(DriverFault {
            call: "cuStreamQuery",
            code,
            message: String::new(),
        })
    }

    #[test]
    fn faults_are_sticky_other_errors_are_not() {
        assert!(driver(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS).is_sticky());
        assert!(driver(CUresult::CUDA_ERROR_LAUNCH_FAILED).is_sticky());
        assert!(driver(CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION).is_sticky());
        for code in [
            CUresult::CUDA_ERROR_UNKNOWN,
            CUresult::CUDA_ERROR_CONTAINED,
            CUresult::CUDA_ERROR_EXTERNAL_DEVICE,
            CUresult::CUDA_ERROR_NVLINK_UNCORRECTABLE,
            CUresult::CUDA_ERROR_TENSOR_MEMORY_LEAK,
            CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR,
        ] {
            assert!(driver(code).is_sticky(), "{code:?}");
        }
        assert!(!driver(CUresult::CUDA_ERROR_OUT_OF_MEMORY).is_sticky());
        assert!(!driver(CUresult::CUDA_ERROR_NOT_READY).is_sticky());
        assert!(!CudaError::NoDevice.is_sticky());
        // A lost device is sticky whatever the fault was.
        let lost = CudaError::DeviceLost {
            ordinal: 0,
            fault: DriverFault {
                call: "cuStreamQuery",
                code: CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
                message: "an illegal memory access was encountered".into(),
            },
        };
        assert!(lost.is_sticky());
        // The message names the call and the code by its CUresult name, and the fault is the
        // error's source.
        let text = driver(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS).to_string();
        assert!(
            text.contains("cuStreamQuery") && text.contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
            "{text}"
        );
        let text = lost.to_string();
        assert!(
            text.contains("CUDA_ERROR_ILLEGAL_ADDRESS") && text.contains("device 0"),
            "{text}"
        );
        assert!(std::error::Error::source(&lost).is_some());
    }

    #[test]
    fn errors_cross_threads() {
        // Engines keep CUDA errors as the `source` of runtime failures shared across threads.
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<CudaError>();
        shareable::<DriverFault>();
    }

    #[test]
    fn nvrtc_builtins_failure_says_which_library_is_missing() {
        let e = CudaError::Nvrtc {
            call: "nvrtcCompileProgram",
            code: nvrtcResult::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE,
        };
        let text = e.to_string();
        assert!(
            text.contains("NVRTC_ERROR_BUILTIN_OPERATION_FAILURE")
                && text.contains("libnvrtc-builtins"),
            "{text}"
        );
        let e = CudaError::Nvrtc {
            call: "nvrtcCompileProgram",
            code: nvrtcResult::NVRTC_ERROR_INVALID_INPUT,
        };
        assert!(!e.to_string().contains("builtins"), "{e}");
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;

    /// An NVRTC log of an ordinary handler's typo, as NVRTC writes it.
    const TYPO: &str = "handler.cu(3): error: identifier \"y\" is undefined\n      m->x = y;\n             ^\n\n1 error detected in the compilation of \"ping.cu\".\n";

    #[test]
    fn an_ordinary_log_is_kept_whole() {
        assert_eq!(bounded_log(TYPO.as_bytes()), TYPO);
        assert_eq!(bounded_log(b""), "");
        assert_eq!(bounded_log(b"no newline"), "no newline");
        assert_eq!(bounded_log(b"\n"), "\n");
        assert_eq!(bounded_log(b"a\n\nb\n"), "a\n\nb\n");
        // Ten errors of a normal handler (about 1.2 KiB) are kept whole.
        let ten = TYPO.repeat(10);
        assert!(ten.len() < MAX_LOG_BYTES - NOTE_ROOM);
        assert_eq!(bounded_log(ten.as_bytes()), ten);
    }

    #[test]
    fn long_lines_are_cut_with_their_length() {
        let line = format!("handler.cu(1): error: x\n  {}\n", "y".repeat(1 << 20));
        let kept = bounded_log(line.as_bytes());
        assert!(kept.starts_with("handler.cu(1): error: x\n  yyy"), "{kept}");
        assert!(kept.ends_with("... (1048578 bytes)\n"), "{kept}");
        assert!(kept.len() < 300, "{} bytes", kept.len());
        let first = kept.lines().nth(1).unwrap();
        assert_eq!(first.len(), MAX_LOG_LINE + "... (1048578 bytes)".len());
        // A line of exactly MAX_LOG_LINE bytes is not cut.
        let exact = "z".repeat(MAX_LOG_LINE);
        assert_eq!(bounded_log(exact.as_bytes()), exact);
    }

    #[test]
    fn a_huge_log_keeps_its_first_lines_and_says_what_was_left_out() {
        // NVRTC's log of a megabyte line with a typo: every error quotes the line.
        let one = format!(
            "handler.cu(1): error: expected a \";\"\n{}\n {}^\n\n",
            "x".repeat(1 << 20),
            " ".repeat(1 << 20)
        );
        let log = one.repeat(100);
        let kept = bounded_log(log.as_bytes());
        assert!(kept.len() <= MAX_LOG_BYTES, "{} bytes", kept.len());
        assert!(kept.starts_with("handler.cu(1): error: expected a \";\"\nxxx"));
        let note = kept.lines().last().unwrap();
        assert!(
            note.starts_with("... (") && note.ends_with("of the compiler's log left out)"),
            "{note}"
        );
        // What was kept and what was left out add up to the log.
        let left: usize = note
            .split(", ")
            .nth(1)
            .and_then(|s| s.strip_suffix(" bytes"))
            .unwrap()
            .parse()
            .unwrap();
        let kept_lines = kept.lines().count() - 1;
        let taken: usize = log.split('\n').take(kept_lines).map(|l| l.len() + 1).sum();
        assert_eq!(left, log.len() - taken);
        // Many short lines: cut by the total only.
        let many = "e\n".repeat(1 << 20);
        let kept = bounded_log(many.as_bytes());
        assert!(kept.len() <= MAX_LOG_BYTES);
        assert!(kept.ends_with(&format!(
            "... ({} more lines, {} bytes, of the compiler's log left out)\n",
            (1 << 20) - (MAX_LOG_BYTES - NOTE_ROOM) / 2,
            2 * ((1 << 20) - (MAX_LOG_BYTES - NOTE_ROOM) / 2)
        )));
    }

    #[test]
    fn cuts_fall_on_character_boundaries_and_bad_utf8_is_replaced() {
        for pad in 0..4 {
            let line = format!("{}{}", "a".repeat(pad), "é€😀".repeat(200));
            let kept = bounded_log(line.as_bytes());
            let text = kept.split("... (").next().unwrap();
            assert!(text.len() <= MAX_LOG_LINE && text.len() > MAX_LOG_LINE - 4);
            assert!(line.starts_with(text), "{pad}");
        }
        let bad = [0xffu8; 1000];
        let kept = bounded_log(&bad);
        assert!(kept.starts_with('\u{fffd}') && kept.ends_with("... (1000 bytes)"));
        assert!(kept.len() <= MAX_LOG_LINE + 20);
    }
}
