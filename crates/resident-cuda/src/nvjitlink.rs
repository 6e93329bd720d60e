//! nvJitLink, loaded at run time: links LTO-IR (the template's, from NVRTC, and a function
//! compiled elsewhere, e.g. by Numba) into machine code (a CUBIN) for one real architecture.
//!
//! The library is `dlopen`ed on first use, from [`NVJITLINK_ENV`] when it is set, else the
//! first of [`NVJITLINK_NAMES`] the loader finds; a machine without it gets
//! [`CudaError::JitLinkNotFound`], which names the package that brings it. nvJitLink exports
//! its API under versioned names (`__nvJitLinkCreate_13_0`, ...; the header's inline wrappers
//! call the newest): this binds the `13_0` entry points, which every CUDA 13 nvJitLink keeps.

pub use crate::error::jitlink_result_name as result_name;
use crate::error::{bounded_log, CudaError, Result};
use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::OnceLock;

/// Environment variable naming the nvJitLink library to load (a path or a file name), tried
/// before [`NVJITLINK_NAMES`]. Read once per process, on first use.
pub const NVJITLINK_ENV: &str = "RESIDENT_NVJITLINK";

/// The names tried, in order, after [`NVJITLINK_ENV`].
pub const NVJITLINK_NAMES: [&str; 2] = ["libnvJitLink.so.13", "libnvJitLink.so"];

/// `NVJITLINK_INPUT_LTOIR` of `nvJitLinkInputType` (nvJitLink.h).
const INPUT_LTOIR: c_int = 3;

/// `nvJitLinkHandle`: an opaque pointer.
type Handle = *mut c_void;

/// The entry points this crate calls. `nvJitLinkResult` and `nvJitLinkInputType` are C enums
/// (`int`).
struct Api {
    create: unsafe extern "C" fn(*mut Handle, u32, *const *const c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Handle) -> c_int,
    add_data: unsafe extern "C" fn(Handle, c_int, *const c_void, usize, *const c_char) -> c_int,
    complete: unsafe extern "C" fn(Handle) -> c_int,
    cubin_size: unsafe extern "C" fn(Handle, *mut usize) -> c_int,
    cubin: unsafe extern "C" fn(Handle, *mut c_void) -> c_int,
    error_log_size: unsafe extern "C" fn(Handle, *mut usize) -> c_int,
    error_log: unsafe extern "C" fn(Handle, *mut c_char) -> c_int,
    info_log_size: unsafe extern "C" fn(Handle, *mut usize) -> c_int,
    info_log: unsafe extern "C" fn(Handle, *mut c_char) -> c_int,
    version: unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> c_int,
    /// Keeps the functions above mapped: the `Api` lives in a static and is never dropped.
    _lib: Library,
}

/// Why the library could not be loaded: each name tried and the loader's answer, joined
/// (kept for the process; every call's [`CudaError::JitLinkNotFound`] carries a copy).
#[derive(Clone, Debug)]
struct NotLoaded {
    searched: String,
}

/// The library, loaded once; `Err` says what was tried and why it failed.
fn api() -> std::result::Result<&'static Api, CudaError> {
    static API: OnceLock<std::result::Result<Api, NotLoaded>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| CudaError::JitLinkNotFound {
            searched: e.searched.clone(),
        })
}

fn load() -> std::result::Result<Api, NotLoaded> {
    let mut names: Vec<String> = Vec::new();
    if let Some(p) = std::env::var_os(NVJITLINK_ENV).filter(|v| !v.is_empty()) {
        names.push(p.to_string_lossy().into_owned());
    }
    names.extend(NVJITLINK_NAMES.iter().map(|s| s.to_string()));
    let mut why = Vec::new();
    for name in &names {
        // SAFETY: loading runs the library's initializers; nvJitLink's only set up its own
        // state (it is meant to be dlopened, as CUDA's Python bindings do).
        match unsafe { Library::new(name) } {
            Ok(lib) => match bind(lib) {
                Ok(api) => return Ok(api),
                Err(e) => why.push(describe(&e)),
            },
            Err(e) => why.push(describe(&e)),
        }
    }
    Err(NotLoaded {
        searched: why.join("; "),
    })
}

/// libloading's error with the loader's own text (`dlerror`, which names the file), which
/// libloading keeps as its source; bounded ([`bounded_log`]'s line limit), as a path in the
/// environment can be long.
fn describe(e: &libloading::Error) -> String {
    let text = match std::error::Error::source(e) {
        Some(s) => s.to_string(),
        None => e.to_string(),
    };
    bounded_log(text.replace('\n', " ").as_bytes())
}

/// Looks the entry points up in `lib`; a library without them (another major version) is
/// refused here rather than failing at the first call.
fn bind(lib: Library) -> std::result::Result<Api, libloading::Error> {
    // SAFETY: each symbol is looked up under the name nvJitLink.h declares it with, and cast
    // to the signature declared there (`size_t` is `usize`, the enums are `int`); the pointers
    // are copied out of `lib`, which the returned `Api` keeps loaded for as long as it lives.
    unsafe {
        Ok(Api {
            create: *lib.get(b"__nvJitLinkCreate_13_0\0")?,
            destroy: *lib.get(b"__nvJitLinkDestroy_13_0\0")?,
            add_data: *lib.get(b"__nvJitLinkAddData_13_0\0")?,
            complete: *lib.get(b"__nvJitLinkComplete_13_0\0")?,
            cubin_size: *lib.get(b"__nvJitLinkGetLinkedCubinSize_13_0\0")?,
            cubin: *lib.get(b"__nvJitLinkGetLinkedCubin_13_0\0")?,
            error_log_size: *lib.get(b"__nvJitLinkGetErrorLogSize_13_0\0")?,
            error_log: *lib.get(b"__nvJitLinkGetErrorLog_13_0\0")?,
            info_log_size: *lib.get(b"__nvJitLinkGetInfoLogSize_13_0\0")?,
            info_log: *lib.get(b"__nvJitLinkGetInfoLog_13_0\0")?,
            version: *lib.get(b"nvJitLinkVersion\0")?,
            _lib: lib,
        })
    }
}

/// Whether nvJitLink can be loaded. The library is loaded (once) to find out.
pub fn nvjitlink_present() -> bool {
    api().is_ok()
}

/// `Ok` when nvJitLink can be loaded, else [`CudaError::JitLinkNotFound`] saying what was
/// tried.
pub fn nvjitlink_available() -> Result<()> {
    api().map(|_| ())
}

/// nvJitLink's version as (major, minor), e.g. `(13, 0)`.
pub fn nvjitlink_version() -> Result<(u32, u32)> {
    let api = api()?;
    let (mut major, mut minor): (c_uint, c_uint) = (0, 0);
    // SAFETY: a function of the loaded library; both out-pointers are valid.
    let code = unsafe { (api.version)(&mut major, &mut minor) };
    check(code, "nvJitLinkVersion", String::new)?;
    Ok((major, minor))
}

fn check(code: c_int, call: &'static str, log: impl FnOnce() -> String) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(CudaError::JitLink {
            call,
            code,
            log: log(),
        })
    }
}

/// Owns an `nvJitLinkHandle` and destroys it on drop, on every path.
struct Linker {
    api: &'static Api,
    handle: Handle,
}

impl Drop for Linker {
    fn drop(&mut self) {
        if !self.handle.is_null() {
            // SAFETY: made by `nvJitLinkCreate` and destroyed once, here (destroy sets it to
            // NULL).
            let _ = unsafe { (self.api.destroy)(&mut self.handle) };
        }
    }
}

impl Linker {
    /// One of the handle's logs (error or info), bounded ([`bounded_log`]); empty when there
    /// is none.
    fn log(
        &self,
        size: unsafe extern "C" fn(Handle, *mut usize) -> c_int,
        get: unsafe extern "C" fn(Handle, *mut c_char) -> c_int,
    ) -> Vec<u8> {
        let mut n = 0usize;
        // SAFETY: the handle is live; `n` is a valid out-pointer.
        if unsafe { size(self.handle, &mut n) } != 0 || n == 0 {
            return Vec::new();
        }
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the `n` bytes (the NUL included) nvJitLink reported.
        if unsafe { get(self.handle, buf.as_mut_ptr().cast()) } != 0 {
            return Vec::new();
        }
        if let Some(nul) = buf.iter().position(|&b| b == 0) {
            buf.truncate(nul);
        }
        buf
    }

    /// What nvJitLink said about the failed step: its error log, and its info log after it
    /// (the error log alone is often one line), bounded.
    fn logs(&self) -> String {
        let mut log = self.log(self.api.error_log_size, self.api.error_log);
        let info = self.log(self.api.info_log_size, self.api.info_log);
        if !info.is_empty() {
            if !log.is_empty() && !log.ends_with(b"\n") {
                log.push(b'\n');
            }
            log.extend_from_slice(&info);
        }
        bounded_log(&log)
    }
}

/// Whether `arch` is a real architecture nvJitLink can be asked for: `sm_` and digits, with an
/// optional letter suffix (`sm_90`, `sm_90a`, `sm_100f`).
fn is_real_arch(arch: &str) -> bool {
    let Some(rest) = arch.strip_prefix("sm_") else {
        return false;
    };
    let digits = rest.trim_end_matches(|c: char| c.is_ascii_lowercase());
    !digits.is_empty()
        && digits.len() <= 4
        && digits.chars().all(|c| c.is_ascii_digit())
        && rest.len() - digits.len() <= 1
}

/// Links `inputs` (each a name, for nvJitLink's log, and LTO-IR bytes) into one CUBIN for
/// `arch` (`sm_NN`), with `-arch=sm_NN -lto`: the link-time optimizer inlines across the
/// inputs, so a call into another input costs what a call inside one does. The link runs in a
/// process of its own under the compile's limits ([`resident_limits::run_forked`], forked from
/// a thread with NVRTC's stack): LTO runs the whole optimizer over inputs that come from users.
///
/// Errors: [`CudaError::JitLinkNotFound`] without the library; [`CudaError::InvalidArgument`]
/// for an `arch` that is not `sm_NN`, no inputs, an empty input or a name with NUL;
/// [`CudaError::JitLink`] with nvJitLink's (bounded) log when it refuses an input (not LTO-IR,
/// LTO-IR for a newer architecture) or the link (an undefined symbol, a symbol that is not a
/// function); [`CudaError::JitLinkStopped`] when the limits stopped it or it crashed. Symbols
/// are C names, which carry no types: a function defined with another signature than its
/// callers declare links, and calling it is undefined behaviour.
pub fn link_cubin(arch: &str, inputs: &[(&str, &[u8])]) -> Result<Vec<u8>> {
    // Loaded and the arguments checked here: the child loads nothing and fails only in the link.
    api()?;
    validate(arch, inputs)?;
    let limits = resident_limits::CompileLimits::from_env()
        .map_err(|e| CudaError::invalid("nvJitLinkCreate", e.to_string()))?;
    let name = resident_ring::message::quoted_name(inputs[0].0);
    // SAFETY: the body makes nvJitLink calls (the library loaded by `api` above), allocates,
    // and writes its report with write(2); it loads nothing, spawns nothing, prints nothing.
    let ended = unsafe {
        resident_limits::run_forked_on_stack(
            &limits,
            1 << 30,
            crate::nvrtc::COMPILE_STACK_BYTES,
            |out| out.write_all(&encode(&link_in_this_process(arch, inputs))),
        )
    };
    use resident_limits::CompileStopped;
    let stopped = |source| CudaError::JitLinkStopped {
        name: name.clone(),
        source,
    };
    let stdout = CompileStopped::check("nvJitLink", &limits, ended).map_err(stopped)?;
    decode(&stdout).unwrap_or_else(|| {
        Err(stopped(CompileStopped::crashed(
            "nvJitLink",
            "its process sent a cut or malformed result",
        )))
    })
}

/// The nvJitLink calls a link makes, by the index its process reports them with.
const CALLS: [&str; 5] = [
    "nvJitLinkCreate",
    "nvJitLinkAddData",
    "nvJitLinkComplete",
    "nvJitLinkGetLinkedCubinSize",
    "nvJitLinkGetLinkedCubin",
];

/// A link's report on its process's standard output ([`resident_limits::ReportWriter`]): 0 and
/// the CUBIN, or 1, the failed call's index (u8), its code (i32) and the log.
fn encode(r: &Result<Vec<u8>>) -> Vec<u8> {
    let mut w = resident_limits::ReportWriter::default();
    match r {
        Ok(cubin) => w.u8(0).bytes(cubin),
        Err(CudaError::JitLink { call, code, log }) => w
            .u8(1)
            .u8(CALLS.iter().position(|c| c == call).unwrap_or(2) as u8)
            .i32(*code)
            .bytes(log.as_bytes()),
        // The arguments were checked before the fork: nothing else fails in the child. Said
        // as an internal error of the link.
        Err(other) => w.u8(1).u8(2).i32(6).bytes(other.to_string().as_bytes()),
    };
    w.finish()
}

/// Reads [`encode`]'s report; `None` when cut short or malformed.
fn decode(b: &[u8]) -> Option<Result<Vec<u8>>> {
    let mut r = resident_limits::ReportReader::new(b);
    let out = match r.u8()? {
        0 => Ok(r.bytes()?.to_vec()),
        1 => {
            let call = *CALLS.get(usize::from(r.u8()?))?;
            let code = r.i32()?;
            let log = String::from_utf8(r.bytes()?.to_vec()).ok()?;
            Err(CudaError::JitLink { call, code, log })
        }
        _ => return None,
    };
    r.end().map(|()| out)
}

/// The argument checks of [`link_cubin`].
fn validate(arch: &str, inputs: &[(&str, &[u8])]) -> Result<()> {
    if !is_real_arch(arch) {
        return Err(CudaError::invalid(
            "nvJitLinkCreate",
            format!(
                "`{}` is not a real architecture (sm_NN)",
                resident_ring::message::quoted_name(arch)
            ),
        ));
    }
    if inputs.is_empty() {
        return Err(CudaError::invalid("nvJitLinkAddData", "nothing to link"));
    }
    for (name, data) in inputs {
        if data.is_empty() {
            return Err(CudaError::invalid(
                "nvJitLinkAddData",
                format!(
                    "input `{}` is empty",
                    resident_ring::message::quoted_name(name)
                ),
            ));
        }
        if name.contains('\0') {
            return Err(CudaError::invalid(
                "nvJitLinkAddData",
                "an input's name contains NUL",
            ));
        }
    }
    Ok(())
}

/// [`link_cubin`]'s link, in this process: run in the link's own process.
fn link_in_this_process(arch: &str, inputs: &[(&str, &[u8])]) -> Result<Vec<u8>> {
    let api = api()?;
    validate(arch, inputs)?;
    let names = inputs
        .iter()
        .map(|(name, _)| {
            CString::new(*name)
                .map_err(|_| CudaError::invalid("nvJitLinkAddData", "an input's name contains NUL"))
        })
        .collect::<Result<Vec<_>>>()?;
    let options = [format!("-arch={arch}"), "-lto".to_string()]
        .map(|o| CString::new(o).expect("checked: no NUL in a real architecture's name"));
    let option_ptrs = options.each_ref().map(|o| o.as_ptr());
    let mut linker = Linker {
        api,
        handle: std::ptr::null_mut(),
    };
    // SAFETY: `linker.handle` is a valid out-pointer; the options are `option_ptrs.len()`
    // NUL-terminated strings that outlive the call. A handle made even on failure is destroyed
    // by the guard.
    let code = unsafe {
        (api.create)(
            &mut linker.handle,
            option_ptrs.len() as u32,
            option_ptrs.as_ptr(),
        )
    };
    check(code, "nvJitLinkCreate", || {
        if linker.handle.is_null() {
            String::new()
        } else {
            linker.logs()
        }
    })?;
    if linker.handle.is_null() {
        return Err(CudaError::JitLink {
            call: "nvJitLinkCreate",
            code: 6, // NVJITLINK_ERROR_INTERNAL: success without a handle
            log: String::new(),
        });
    }
    for ((_, data), name) in inputs.iter().zip(&names) {
        // SAFETY: the handle is live; `data` is `data.len()` readable bytes (nvJitLink copies
        // or parses them during the call) and `name` a NUL-terminated string, both outliving
        // the call.
        let code = unsafe {
            (api.add_data)(
                linker.handle,
                INPUT_LTOIR,
                data.as_ptr().cast(),
                data.len(),
                name.as_ptr(),
            )
        };
        check(code, "nvJitLinkAddData", || linker.logs())?;
    }
    // SAFETY: the handle is live and holds every input.
    let code = unsafe { (api.complete)(linker.handle) };
    check(code, "nvJitLinkComplete", || linker.logs())?;
    let mut size = 0usize;
    // SAFETY: the handle is live and linked; `size` is a valid out-pointer.
    let code = unsafe { (api.cubin_size)(linker.handle, &mut size) };
    check(code, "nvJitLinkGetLinkedCubinSize", || linker.logs())?;
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds the `size` bytes nvJitLink reported.
    let code = unsafe { (api.cubin)(linker.handle, image.as_mut_ptr().cast()) };
    check(code, "nvJitLinkGetLinkedCubin", || linker.logs())?;
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_back_as_written_and_a_cut_one_is_refused() {
        let cases = [
            Ok(b"\x7fELF cubin".to_vec()),
            Err(CudaError::JitLink {
                call: "nvJitLinkComplete",
                code: 4,
                log: "error: undefined reference to `f`".into(),
            }),
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
        assert!(
            decode(&[1, CALLS.len() as u8, 0, 0, 0, 0]).is_none(),
            "no such call"
        );
    }

    #[test]
    fn real_architectures_only() {
        for ok in ["sm_90", "sm_80", "sm_90a", "sm_100f", "sm_120"] {
            assert!(is_real_arch(ok), "{ok}");
        }
        for bad in [
            "compute_90",
            "sm_",
            "sm_9x0",
            "sm_90ab",
            "sm_90 -lto",
            "90",
            "",
        ] {
            assert!(!is_real_arch(bad), "{bad}");
        }
    }

    #[test]
    fn result_codes_have_their_header_names() {
        assert_eq!(result_name(0), "NVJITLINK_SUCCESS");
        assert_eq!(result_name(3), "NVJITLINK_ERROR_INVALID_INPUT");
        assert_eq!(result_name(13), "NVJITLINK_ERROR_ARCH_MISMATCH");
        assert_eq!(result_name(18), "NVJITLINK_ERROR_LTO_NOT_ENABLED");
        assert_eq!(result_name(19), "an unknown nvJitLinkResult");
        assert_eq!(result_name(-1), "an unknown nvJitLinkResult");
    }

    #[test]
    fn the_missing_library_names_its_package() {
        let e = CudaError::JitLinkNotFound {
            searched: "libnvJitLink.so.13: cannot open shared object file".into(),
        };
        let text = e.to_string();
        assert!(
            text.contains("pip install nvidia-nvjitlink") && text.contains("resident[numba]"),
            "{text}"
        );
    }
}
