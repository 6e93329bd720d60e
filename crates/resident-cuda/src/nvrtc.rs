//! NVRTC: CUDA C source to PTX, loaded at run time. [`compile_ptx`] checks that the library is
//! present before the first call, so a machine without NVRTC gets [`CudaError::NvrtcNotFound`].
//!
//! Each compile runs in a process of its own, forked from a thread with a large stack, under
//! the compile's limits ([`resident_limits::run_forked`]): sources come from users, and NVRTC can
//! run for minutes, allocate without bound or overflow its stack on inputs it parses; in a child
//! each of those ends the child ([`CudaError::CompileTimeout`], [`CudaError::CompileOutOfMemory`],
//! [`CudaError::CompileCrashed`]), never this process. The result comes back over a pipe.

use crate::error::{CudaError, Result};
use cudarc::nvrtc::result as nr;
use std::ffi::{CStr, CString};
use std::sync::OnceLock;

/// Whether `libnvrtc` can be loaded. Cached after the first call.
pub fn nvrtc_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries `dlopen` on a fixed list of names.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

fn nvrtc_err(call: &'static str) -> impl FnOnce(nr::NvrtcError) -> CudaError {
    move |e| CudaError::Nvrtc { call, code: e.0 }
}

/// NVRTC's version as (major, minor).
pub fn nvrtc_version() -> Result<(u32, u32)> {
    if !nvrtc_present() {
        return Err(CudaError::NvrtcNotFound);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; both out-pointers are valid.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(nvrtc_err("nvrtcVersion"))?;
    Ok((major as u32, minor as u32))
}

/// What to compile for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Virtual architecture, e.g. `compute_90`.
    pub arch: String,
    /// Further NVRTC options, e.g. `-I/path` or `-DN=4`.
    pub extra: Vec<String>,
}

impl CompileOptions {
    /// Options for a virtual architecture such as `compute_90`.
    pub fn for_arch(arch: impl Into<String>) -> Self {
        CompileOptions {
            arch: arch.into(),
            extra: Vec::new(),
        }
    }

    /// Options for a compute capability, e.g. `(9, 0)` gives `compute_90`.
    pub fn for_capability(major: u32, minor: u32) -> Self {
        Self::for_arch(format!("compute_{major}{minor}"))
    }

    /// All options as NVRTC receives them.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![format!("--gpu-architecture={}", self.arch)];
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// Owns an `nvrtcProgram` and destroys it on drop.
struct Program(cudarc::nvrtc::sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program`, destroyed once, here.
        let _ = unsafe { nr::destroy_program(self.0) };
    }
}

fn c_chars_to_string(v: Vec<std::ffi::c_char>) -> String {
    let bytes: Vec<u8> = v
        .into_iter()
        .map(|c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The stack of the thread NVRTC compiles on. NVRTC's parser recurses once per nesting level
/// of the source and takes 1 to 2 KiB of stack for each (measured with NVRTC 13: 1024 nested
/// parentheses overflow a 2 MiB thread stack, 4096 an 8 MiB one). A stack this size is
/// reserved, not used: only the pages a compile touches are ever backed by memory. It takes
/// over 100 000 levels (a 256 MiB stack took 65 536 nested parentheses and 32 768 chained
/// assignments, not twice that); `persistent::template` refuses ring-kernel sources whose
/// brackets nest deeper than 256 or that hold more than 256 operator characters in a row
/// before they get here. Deeper still, the overflow ends the compile's process
/// ([`CudaError::CompileCrashed`]), not this one.
pub const COMPILE_STACK_BYTES: usize = 512 << 20;

/// The most bytes of a compile's result (PTX, CUBIN or LTO-IR, and the log) taken from its
/// process.
const RESULT_BYTES: usize = 1 << 30;

/// What a compile is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Ptx,
    Cubin,
    Ltoir,
}

/// What a compile gave: the image (PTX text with its NUL, a CUBIN, or LTO-IR) and the log.
struct Output {
    image: Vec<u8>,
    log: Vec<u8>,
}

/// The NVRTC calls a compile makes, by the index the compile's process reports them with.
const CALLS: [&str; 8] = [
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetPTX",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetLTOIRSize",
    "nvrtcGetLTOIR",
    "nvrtcGetProgramLog",
];

/// How a compile in this process ended short of its output.
enum Failed {
    /// `CALLS[call]` returned `code`.
    Call { call: u8, code: u32 },
    /// The source did not compile: NVRTC's log.
    Compilation { log: Vec<u8> },
}

/// NVRTC's result code as the enum (the codes every CUDA version's NVRTC has; any other is an
/// internal error).
fn result_of(code: u32) -> nr::NvrtcError {
    use cudarc::nvrtc::sys::nvrtcResult as R;
    nr::NvrtcError(match code {
        1 => R::NVRTC_ERROR_OUT_OF_MEMORY,
        2 => R::NVRTC_ERROR_PROGRAM_CREATION_FAILURE,
        3 => R::NVRTC_ERROR_INVALID_INPUT,
        4 => R::NVRTC_ERROR_INVALID_PROGRAM,
        5 => R::NVRTC_ERROR_INVALID_OPTION,
        6 => R::NVRTC_ERROR_COMPILATION,
        7 => R::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE,
        8 => R::NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION,
        9 => R::NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION,
        10 => R::NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID,
        _ => R::NVRTC_ERROR_INTERNAL_ERROR,
    })
}

/// The whole compile, in the calling process: create, compile, take the output and the log.
/// Runs in the compile's own process ([`compile`]) and, once, over a fixed source in this one
/// ([`warm`]).
fn compile_here(
    src: &CStr,
    name: &CStr,
    args: &[String],
    want: Want,
) -> std::result::Result<Output, Failed> {
    let fail = |call: u8| {
        move |e: nr::NvrtcError| Failed::Call {
            call,
            code: e.0 as u32,
        }
    };
    let prog = Program(nr::create_program(src, Some(name)).map_err(fail(0))?);
    // SAFETY: `prog` is live until the end of this function; `args` hold no NUL (checked by
    // `compile`, cudarc would panic otherwise).
    unsafe {
        if let Err(e) = nr::compile_program(prog.0, args) {
            if e.0 == cudarc::nvrtc::sys::nvrtcResult::NVRTC_ERROR_COMPILATION {
                return Err(Failed::Compilation {
                    log: program_log_bytes(&prog),
                });
            }
            return Err(fail(1)(e));
        }
        let image = match want {
            Want::Ptx => {
                let ptx = nr::get_ptx(prog.0).map_err(fail(2))?;
                ptx.into_iter().map(|c| c as u8).collect()
            }
            Want::Cubin | Want::Ltoir => {
                let (size_call, get_call) = if want == Want::Cubin { (3, 4) } else { (5, 6) };
                let mut size = 0usize;
                let r = if want == Want::Cubin {
                    cudarc::nvrtc::sys::nvrtcGetCUBINSize(prog.0, &mut size)
                } else {
                    cudarc::nvrtc::sys::nvrtcGetLTOIRSize(prog.0, &mut size)
                };
                r.result().map_err(fail(size_call))?;
                let mut image = vec![0u8; size];
                // SAFETY: `image` holds the `size` bytes NVRTC reported.
                let r = if want == Want::Cubin {
                    cudarc::nvrtc::sys::nvrtcGetCUBIN(prog.0, image.as_mut_ptr().cast())
                } else {
                    cudarc::nvrtc::sys::nvrtcGetLTOIR(prog.0, image.as_mut_ptr().cast())
                };
                r.result().map_err(fail(get_call))?;
                image
            }
        };
        Ok(Output {
            image,
            log: program_log_bytes(&prog),
        })
    }
}

/// The compile's process's report on its standard output ([`resident_limits::ReportWriter`]):
/// a tag (0 done, 1 the source did not compile, 2 a call failed), then for 0 the image and the
/// log, for 1 the log, for 2 the call's index and its code (u8, u32).
fn encode(r: &std::result::Result<Output, Failed>) -> Vec<u8> {
    let mut w = resident_limits::ReportWriter::default();
    match r {
        Ok(o) => w.u8(0).bytes(&o.image).bytes(&o.log),
        Err(Failed::Compilation { log }) => w.u8(1).bytes(log),
        Err(Failed::Call { call, code }) => w.u8(2).u8(*call).u32(*code),
    };
    w.finish()
}

/// Reads [`encode`]'s report; `None` when it is cut short or malformed.
fn decode(b: &[u8]) -> Option<std::result::Result<Output, Failed>> {
    let mut r = resident_limits::ReportReader::new(b);
    let out = match r.u8()? {
        0 => Ok(Output {
            image: r.bytes()?.to_vec(),
            log: r.bytes()?.to_vec(),
        }),
        1 => Err(Failed::Compilation {
            log: r.bytes()?.to_vec(),
        }),
        2 => {
            let call = r.u8()?;
            let code = r.u32()?;
            if usize::from(call) >= CALLS.len() {
                return None;
            }
            Err(Failed::Call { call, code })
        }
        _ => return None,
    };
    r.end().map(|()| out)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Loads NVRTC and runs one compile of a fixed, trivial source in this process, once: the
/// library and what it loads on its first compile (`libnvrtc-builtins`) are then mapped before
/// any compile's process is forked, so that process loads nothing (loading a library in a
/// forked child of a threaded process can wait forever on a lock another thread held).
fn warm() {
    static WARM: OnceLock<()> = OnceLock::new();
    WARM.get_or_init(|| {
        let args = ["--gpu-architecture=compute_75".to_string()];
        let _ = compile_here(
            c"extern \"C\" __global__ void resident_warm(int* p) { p[0] = 1; }",
            c"resident_warm.cu",
            &args,
            Want::Ptx,
        );
    });
}

/// Runs NVRTC over `source` with `options` in a process of its own, forked from a thread with a
/// [`COMPILE_STACK_BYTES`] stack, under the compile's limits ([`resident_limits`]): past the
/// wall-time limit it is killed ([`CudaError::CompileTimeout`]); past the address-space limit its
/// allocations fail ([`CudaError::CompileOutOfMemory`]); a crash (its parser's stack overflowing,
/// say) ends it alone ([`CudaError::CompileCrashed`]). Nothing of the compile stays in this
/// process. A compile error returns [`CudaError::Compile`] with NVRTC's log.
fn compile(source: &str, name: &str, options: &CompileOptions, want: Want) -> Result<Output> {
    if !nvrtc_present() {
        return Err(CudaError::NvrtcNotFound);
    }
    let src = CString::new(source)
        .map_err(|_| CudaError::invalid("nvrtcCreateProgram", "source contains NUL"))?;
    let cname = CString::new(name)
        .map_err(|_| CudaError::invalid("nvrtcCreateProgram", "program name contains NUL"))?;
    let args = options.to_args();
    if args.iter().any(|a| a.contains('\0')) {
        return Err(CudaError::invalid(
            "nvrtcCompileProgram",
            "an option contains NUL",
        ));
    }
    let limits = resident_limits::CompileLimits::from_env()
        .map_err(|e| CudaError::invalid("nvrtcCompileProgram", e.to_string()))?;
    warm();
    // SAFETY: the body makes NVRTC calls (loaded, with its builtins, by `warm`), allocates,
    // and writes its report with write(2); it loads nothing, spawns nothing and prints nothing.
    let ended = unsafe {
        resident_limits::run_forked_on_stack(&limits, RESULT_BYTES, COMPILE_STACK_BYTES, |out| {
            out.write_all(&encode(&compile_here(&src, &cname, &args, want)));
        })
    };
    let quoted = || resident_ring::message::quoted_name(name);
    use resident_limits::CompileStopped;
    let stopped = |e: CompileStopped| match e {
        CompileStopped::CompileTimeout { limit, .. } => CudaError::CompileTimeout {
            name: quoted(),
            limit,
        },
        CompileStopped::CompileOutOfMemory { limit_mb, .. } => CudaError::CompileOutOfMemory {
            name: quoted(),
            limit_mb,
        },
        CompileStopped::CompileCrashed { reason, .. } => CudaError::CompileCrashed {
            name: quoted(),
            reason,
        },
    };
    let stdout = CompileStopped::check("NVRTC", &limits, ended).map_err(stopped)?;
    match decode(&stdout) {
        None => Err(stopped(CompileStopped::crashed(
            "NVRTC",
            "its process sent a cut or malformed result",
        ))),
        Some(Ok(out)) => Ok(out),
        // The log quotes each offending source line: kept bounded, and the name quoted short
        // (NVRTC's own log names the program too, see `persistent::template`).
        // NVRTC's front end reports a failed allocation as a diagnostic of the source.
        Some(Err(Failed::Compilation { log }))
            if contains(&log, b"catastrophic error: out of memory") =>
        {
            Err(CudaError::CompileOutOfMemory {
                name: quoted(),
                limit_mb: limits.memory_bytes >> 20,
            })
        }
        Some(Err(Failed::Compilation { log })) => Err(CudaError::Compile {
            name: quoted(),
            arch: resident_ring::message::quoted_name(&options.arch),
            log: crate::error::bounded_log(&log),
        }),
        Some(Err(Failed::Call { code: 1, .. })) => Err(CudaError::CompileOutOfMemory {
            name: quoted(),
            limit_mb: limits.memory_bytes >> 20,
        }),
        Some(Err(Failed::Call { call, code })) => {
            Err(nvrtc_err(CALLS[usize::from(call)])(result_of(code)))
        }
    }
}

/// The program's log as bytes, up to its NUL (one copy of it is held: a log can be a hundred
/// times the source).
fn program_log_bytes(prog: &Program) -> Vec<u8> {
    // SAFETY: `prog` is live.
    match unsafe { nr::get_program_log(prog.0) } {
        Ok(log) => {
            // Reuses the allocation (`c_char` and `u8` have one size and alignment).
            let mut bytes: Vec<u8> = log.into_iter().map(|c| c as u8).collect();
            if let Some(nul) = bytes.iter().position(|&b| b == 0) {
                bytes.truncate(nul);
            }
            bytes
        }
        Err(_) => b"<no log>".to_vec(),
    }
}

/// Compiles CUDA C `source` to PTX. `name` names the program in the log. A compile error
/// returns [`CudaError::Compile`] with NVRTC's log; the compile runs in a process of its own
/// under the compile's limits (see [`resident_limits`]).
pub fn compile_ptx(source: &str, name: &str, options: &CompileOptions) -> Result<String> {
    let out = compile(source, name, options, Want::Ptx)?;
    let ptx = out
        .image
        .into_iter()
        .map(|b| b as std::ffi::c_char)
        .collect();
    Ok(c_chars_to_string(ptx))
}

/// [`compile_ptx`] in this process, with no limit: the baseline the compile's process is
/// measured against (`examples/nvrtc_child_cost.rs`). Not for sources from users.
#[doc(hidden)]
pub fn compile_ptx_in_this_process(
    source: &str,
    name: &str,
    options: &CompileOptions,
) -> Result<String> {
    let src = CString::new(source)
        .map_err(|_| CudaError::invalid("nvrtcCreateProgram", "source contains NUL"))?;
    let cname = CString::new(name)
        .map_err(|_| CudaError::invalid("nvrtcCreateProgram", "program name contains NUL"))?;
    match compile_here(&src, &cname, &options.to_args(), Want::Ptx) {
        Ok(out) => Ok(c_chars_to_string(
            out.image
                .into_iter()
                .map(|b| b as std::ffi::c_char)
                .collect(),
        )),
        Err(Failed::Compilation { log }) => Err(CudaError::Compile {
            name: resident_ring::message::quoted_name(name),
            arch: resident_ring::message::quoted_name(&options.arch),
            log: crate::error::bounded_log(&log),
        }),
        Err(Failed::Call { call, code }) => {
            Err(nvrtc_err(CALLS[usize::from(call)])(result_of(code)))
        }
    }
}

/// Compiles CUDA C `source` all the way to machine code (a CUBIN) for a real architecture
/// such as `sm_90`, without a GPU: NVRTC runs `ptxas`, so inline PTX, register allocation and
/// launch bounds are checked here rather than at load time on a device. Returns the image and
/// NVRTC's log (with `-Xptxas -v` among `options.extra`, `ptxas`'s resource report).
pub fn compile_cubin(
    source: &str,
    name: &str,
    options: &CompileOptions,
) -> Result<(Vec<u8>, String)> {
    if !options.arch.starts_with("sm_") {
        return Err(CudaError::invalid(
            "nvrtcGetCUBIN",
            format!("`{}` is not a real architecture (sm_NN)", options.arch),
        ));
    }
    let out = compile(source, name, options, Want::Cubin)?;
    let mut log = out.log;
    if let Some(nul) = log.iter().position(|&b| b == 0) {
        log.truncate(nul);
    }
    Ok((out.image, String::from_utf8_lossy(&log).into_owned()))
}

/// Compiles CUDA C `source` to LTO-IR (NVVM's intermediate form, for link-time optimization)
/// for `options.arch`: a real architecture (`sm_90`) or a virtual one (`compute_90`), as NVRTC
/// accepts either with `-dlto`. `-dlto` and `-rdc=true` are added to `options.extra` (once):
/// the result is relocatable, its `extern` functions resolved when nvJitLink links it with
/// other LTO-IR ([`crate::nvjitlink::link_cubin`]). A compile error returns
/// [`CudaError::Compile`] with NVRTC's log.
pub fn compile_ltoir(source: &str, name: &str, options: &CompileOptions) -> Result<Vec<u8>> {
    let arch_ok = ["sm_", "compute_"].iter().any(|p| {
        options
            .arch
            .strip_prefix(p)
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric()))
    });
    if !arch_ok {
        return Err(CudaError::invalid(
            "nvrtcGetLTOIR",
            format!(
                "`{}` is not an architecture (sm_NN or compute_NN)",
                resident_ring::message::quoted_name(&options.arch)
            ),
        ));
    }
    let mut options = options.clone();
    for flag in ["-dlto", "-rdc=true"] {
        if !options.extra.iter().any(|o| o == flag) {
            options.extra.push(flag.to_string());
        }
    }
    Ok(compile(source, name, &options, Want::Ltoir)?.image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_back_as_written_and_a_cut_one_is_refused() {
        let cases = [
            Ok(Output {
                image: b"ptx\0".to_vec(),
                log: b"warning".to_vec(),
            }),
            Err(Failed::Compilation {
                log: b"error: x".to_vec(),
            }),
            Err(Failed::Call { call: 4, code: 7 }),
        ];
        for r in &cases {
            let b = encode(r);
            let back = decode(&b).expect("reads back");
            assert_eq!(encode(&back), b);
            for cut in 0..b.len() {
                assert!(decode(&b[..cut]).is_none(), "cut at {cut}");
            }
            let mut longer = b.clone();
            longer.push(0);
            assert!(decode(&longer).is_none());
        }
        assert!(decode(&[2, CALLS.len() as u8, 0, 0, 0, 0]).is_none());
        assert!(decode(&[9]).is_none());
        // A length past the end is refused, not allocated.
        let mut huge = vec![1u8];
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge).is_none());
    }

    #[test]
    fn result_codes_map_to_nvrtcs() {
        use cudarc::nvrtc::sys::nvrtcResult as R;
        assert_eq!(result_of(6).0, R::NVRTC_ERROR_COMPILATION);
        assert_eq!(result_of(7).0, R::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE);
        assert_eq!(result_of(0).0, R::NVRTC_ERROR_INTERNAL_ERROR);
        assert_eq!(result_of(12345).0, R::NVRTC_ERROR_INTERNAL_ERROR);
    }
}
