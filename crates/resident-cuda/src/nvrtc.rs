//! NVRTC: CUDA C source to PTX, loaded at run time. [`compile_ptx`] checks that the library is
//! present before the first call, so a machine without NVRTC gets [`CudaError::NvrtcNotFound`].

use crate::error::{CudaError, Result};
use cudarc::nvrtc::result as nr;
use std::ffi::CString;
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
/// parentheses overflow a 2 MiB thread stack, 4096 an 8 MiB one, and the overflow aborts the
/// process). A stack this size is reserved, not used: only the pages a compile touches are
/// ever backed by memory. It takes over 100 000 levels (a 256 MiB stack took 65 536 nested
/// parentheses and 32 768 chained assignments, not twice that); `persistent::template` refuses
/// ring-kernel sources whose brackets nest deeper than 256 or that hold more than 256 operator
/// characters in a row before they get here.
pub const COMPILE_STACK_BYTES: usize = 512 << 20;

/// An `nvrtcProgram` handed to the compiling thread.
#[derive(Clone, Copy)]
struct ProgramHandle(cudarc::nvrtc::sys::nvrtcProgram);

// SAFETY: NVRTC's API is thread-safe and a program may be used from any thread; this handle is
// used by one thread at a time (its owner waits for the compiling thread to finish).
unsafe impl Send for ProgramHandle {}

/// How a compile on the NVRTC thread ended.
enum Compiled {
    /// NVRTC returned.
    Done(std::result::Result<(), nr::NvrtcError>),
    /// It ran past the wall-time limit; the program is left to the thread, which frees nothing
    /// it still uses (see [`compile_program`]).
    TimedOut,
}

/// `nvrtcCompileProgram` on a thread with a [`COMPILE_STACK_BYTES`] stack (in the calling
/// thread when such a thread cannot be started), waited for at most `wall`
/// ([`crate::limits::CompileLimits`]). NVRTC runs in this process and cannot be stopped: past
/// the limit the caller gets [`Compiled::TimedOut`] at once, the thread finishes on its own,
/// and the program is never destroyed (a leak, not a use after free). Memory cannot be
/// limited in process; the source checks of `persistent::template` keep out the inputs known
/// to make NVRTC run long or deep.
fn compile_program(prog: &Program, args: &[String], wall: std::time::Duration) -> Compiled {
    let handle = ProgramHandle(prog.0);
    let owned: Vec<String> = args.to_vec();
    let run = move || {
        let h = handle;
        // SAFETY: the program is live: its owner waits for this call or, past the limit,
        // forgets the program so it is never destroyed; `owned` holds no NUL (checked by
        // `compile`, cudarc would panic otherwise).
        let r = unsafe { nr::compile_program(h.0, &owned) };
        (r, owned)
    };
    // What this thread allocates it also frees (the arguments come back with the result, and
    // the shared slot is freed here after the compiling thread has ended; a condition variable,
    // unlike a channel's timed receive, makes no per-thread allocation): a caller that counts its
    // thread's memory (the fuzz harness) sees the same figures on every run.
    type Slot = std::sync::Mutex<Option<(std::result::Result<(), nr::NvrtcError>, Vec<String>)>>;
    let done: std::sync::Arc<(Slot, std::sync::Condvar)> = Default::default();
    let theirs = done.clone();
    match std::thread::Builder::new()
        .name("nvrtc".into())
        .stack_size(COMPILE_STACK_BYTES)
        .spawn(move || {
            let r = run();
            let (slot, cv) = &*theirs;
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            cv.notify_all();
        }) {
        Ok(thread) => {
            let (slot, cv) = &*done;
            let deadline = std::time::Instant::now() + wall;
            let mut got = slot.lock().unwrap_or_else(|p| p.into_inner());
            while got.is_none() && !thread.is_finished() {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Compiled::TimedOut;
                }
                got = cv
                    .wait_timeout(got, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            let taken = got.take();
            drop(got);
            let _ = thread.join();
            match taken {
                Some((r, owned)) => {
                    drop(owned);
                    Compiled::Done(r)
                }
                // The thread ended without a result: it panicked inside cudarc.
                None => Compiled::Done(Err(nr::NvrtcError(
                    cudarc::nvrtc::sys::nvrtcResult::NVRTC_ERROR_INTERNAL_ERROR,
                ))),
            }
        }
        Err(_) => {
            // SAFETY: as above; here the caller's thread runs it and so outlives it.
            let r = unsafe { nr::compile_program(prog.0, args) };
            Compiled::Done(r)
        }
    }
}

/// Runs NVRTC over `source` with `options`; a compile error returns [`CudaError::Compile`]
/// with NVRTC's log.
fn compile(source: &str, name: &str, options: &CompileOptions) -> Result<Program> {
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
    let prog =
        Program(nr::create_program(&src, Some(&cname)).map_err(nvrtc_err("nvrtcCreateProgram"))?);
    let limits = crate::limits::CompileLimits::from_env()
        .map_err(|e| CudaError::invalid("nvrtcCompileProgram", e.to_string()))?;
    let compiled = match compile_program(&prog, &args, limits.wall) {
        Compiled::Done(r) => r,
        Compiled::TimedOut => {
            // The NVRTC thread still uses the program: never destroyed (see compile_program).
            std::mem::forget(prog);
            return Err(CudaError::CompileTimeout {
                name: resident_ring::message::quoted_name(name),
                limit: limits.wall,
            });
        }
    };
    if let Err(e) = compiled {
        if e.0 == cudarc::nvrtc::sys::nvrtcResult::NVRTC_ERROR_COMPILATION {
            // The log quotes each offending source line: kept bounded, and the name quoted
            // short (NVRTC's own log names the program too, see `persistent::template`).
            return Err(CudaError::Compile {
                name: resident_ring::message::quoted_name(name),
                arch: resident_ring::message::quoted_name(&options.arch),
                log: crate::error::bounded_log(&program_log_bytes(&prog)),
            });
        }
        return Err(nvrtc_err("nvrtcCompileProgram")(e));
    }
    Ok(prog)
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

fn program_log(prog: &Program) -> String {
    // SAFETY: `prog` is live.
    unsafe { nr::get_program_log(prog.0) }
        .map(c_chars_to_string)
        .unwrap_or_else(|_| "<no log>".into())
}

/// Compiles CUDA C `source` to PTX. `name` names the program in the log. A compile error
/// returns [`CudaError::Compile`] with NVRTC's log.
pub fn compile_ptx(source: &str, name: &str, options: &CompileOptions) -> Result<String> {
    let prog = compile(source, name, options)?;
    // SAFETY: `prog` is live and compiled.
    let ptx = unsafe { nr::get_ptx(prog.0) }.map_err(nvrtc_err("nvrtcGetPTX"))?;
    Ok(c_chars_to_string(ptx))
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
    let prog = compile(source, name, options)?;
    let mut size = 0usize;
    // SAFETY: `prog` is live and compiled; `size` is a valid out-pointer.
    unsafe { cudarc::nvrtc::sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(nvrtc_err("nvrtcGetCUBINSize"))?;
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds the `size` bytes NVRTC reported.
    unsafe { cudarc::nvrtc::sys::nvrtcGetCUBIN(prog.0, image.as_mut_ptr().cast()) }
        .result()
        .map_err(nvrtc_err("nvrtcGetCUBIN"))?;
    Ok((image, program_log(&prog)))
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
    let prog = compile(source, name, &options)?;
    let mut size = 0usize;
    // SAFETY: `prog` is live and compiled; `size` is a valid out-pointer.
    unsafe { cudarc::nvrtc::sys::nvrtcGetLTOIRSize(prog.0, &mut size) }
        .result()
        .map_err(nvrtc_err("nvrtcGetLTOIRSize"))?;
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds the `size` bytes NVRTC reported.
    unsafe { cudarc::nvrtc::sys::nvrtcGetLTOIR(prog.0, image.as_mut_ptr().cast()) }
        .result()
        .map_err(nvrtc_err("nvrtcGetLTOIR"))?;
    Ok(image)
}
