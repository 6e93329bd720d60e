//! The compile drivers of a ring kernel's translation unit: NVRTC to PTX or to machine code
//! (with the template's options and the name and log kept short), the host C++ compiler for
//! CudaSim, nvJitLink for a kernel whose handler is an external function, and the ptxas
//! resource report.

use super::{KernelSource, PersistentError, BATCH_KERNEL_NAME, PERSISTENT_KERNEL_NAME};

/// Compiled PTX text of a ring kernel.
#[derive(Clone, Debug)]
pub struct CompiledKernel {
    /// The PTX (NUL-free text).
    pub ptx: String,
    /// The architecture it was compiled for, e.g. `compute_90`.
    pub arch: String,
}

#[cfg(feature = "cuda")]
/// Whether NVRTC can be loaded; `Err` says why not.
pub fn nvrtc_available() -> Result<(), PersistentError> {
    if resident_cuda::nvrtc_present() {
        Ok(())
    } else {
        Err(PersistentError::NvrtcUnavailable(
            resident_cuda::CudaError::NvrtcNotFound,
        ))
    }
}

#[cfg(feature = "cuda")]
/// Whether nvJitLink can be loaded; `Err` says why not.
pub fn nvjitlink_available() -> Result<(), PersistentError> {
    resident_cuda::nvjitlink::nvjitlink_available().map_err(PersistentError::JitLinkUnavailable)
}

/// A line of a ring kernel's translation unit longer than this makes NVRTC's diagnostics brief
/// (`--brief-diagnostics=true`: no quoted source lines), so that NVRTC's log stays linear in
/// the source (see `compile_ptx`).
pub const BRIEF_DIAGNOSTICS_LINE: usize = 1024;

#[cfg(feature = "cuda")]
/// NVRTC options of the template, for `arch` (`compute_NN` for PTX, `sm_NN` for machine code),
/// for the translation unit `text`.
///
/// NVRTC quotes the source line (and a caret line as long) with every diagnostic, so its log
/// grows as the number of diagnostics times the length of the lines they are on: a handler
/// line of 39 KB holding 3000 statements that each draw a warning gave a 176 MB log and a
/// 12 s compile (a 130 KB line: gigabytes), and one 1 MB line holding 100 errors a 105 MB log
/// (found by `resident fuzz --target cuda`). So:
/// * warnings are off (`-w`): a kernel that compiles never shows its log, and a compile error
///   keeps its errors (at most 100: NVRTC stops there);
/// * a translation unit with a line longer than [`BRIEF_DIAGNOSTICS_LINE`] is compiled with
///   `--brief-diagnostics=true` (no quoted lines): the error keeps at most
///   [`resident_cuda::MAX_LOG_LINE`] bytes of a log line anyway.
fn template_options(arch: &str, extra: &[&str], text: &str) -> resident_cuda::CompileOptions {
    let mut extra_opts = vec![
        "--std=c++17".to_string(),
        "-default-device".to_string(),
        "-w".to_string(),
    ];
    if text.split('\n').any(|l| l.len() > BRIEF_DIAGNOSTICS_LINE) {
        extra_opts.push(BRIEF_DIAGNOSTICS.to_string());
    }
    extra_opts.extend(extra.iter().map(|s| s.to_string()));
    resident_cuda::CompileOptions {
        arch: arch.to_string(),
        extra: extra_opts,
    }
}

#[cfg(feature = "cuda")]
const BRIEF_DIAGNOSTICS: &str = "--brief-diagnostics=true";

#[cfg(feature = "cuda")]
/// Runs `compile` (an NVRTC call) over `text` with the template's options; an NVRTC that does
/// not know `--brief-diagnostics` (older than the one this was measured with) is asked again
/// without it.
fn with_template_options<T>(
    text: &str,
    arch: &str,
    extra: &[&str],
    compile: impl Fn(&resident_cuda::CompileOptions) -> resident_cuda::Result<T>,
) -> resident_cuda::Result<T> {
    let mut opts = template_options(arch, extra, text);
    match compile(&opts) {
        Err(resident_cuda::CudaError::Nvrtc {
            code: resident_cuda::nvrtcResult::NVRTC_ERROR_INVALID_OPTION,
            ..
        }) if opts.extra.iter().any(|o| o == BRIEF_DIAGNOSTICS) => {
            opts.extra.retain(|o| o != BRIEF_DIAGNOSTICS);
            compile(&opts)
        }
        r => r,
    }
}

#[cfg(feature = "cuda")]
/// Maps the NVRTC layer's errors for `source` compiled for `arch`.
fn compile_error(
    source: &KernelSource,
    arch: &str,
    e: resident_cuda::CudaError,
) -> PersistentError {
    match e {
        // The log is bounded where NVRTC's error is made (`resident_cuda::error::bounded_log`).
        resident_cuda::CudaError::Compile { log, .. } => PersistentError::Compile {
            name: resident_ring::message::quoted_name(&source.name),
            arch: resident_ring::message::quoted_name(arch),
            log,
        },
        e @ (resident_cuda::CudaError::NvrtcNotFound
        | resident_cuda::CudaError::Nvrtc {
            code: resident_cuda::nvrtcResult::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE,
            ..
        }) => PersistentError::NvrtcUnavailable(e),
        e => PersistentError::Cuda(e),
    }
}

#[cfg(feature = "cuda")]
/// The most bytes of a kernel's name that its NVRTC program name keeps.
const PROGRAM_NAME_BYTES: usize = 64;

/// The NVRTC program name of a kernel: its name with every byte but ASCII letters, digits, `_`,
/// `-` and `.` made `_`, cut to [`PROGRAM_NAME_BYTES`], and `.cu`. NVRTC names the program in
/// its log, once per diagnostic of the generated prelude (`ping.cu(12): error: ...`), so a
/// user's megabyte-long name would make every such line a megabyte long.
#[cfg(feature = "cuda")]
fn program_name(source: &KernelSource) -> String {
    let mut name: String = source
        .name
        .chars()
        .take(PROGRAM_NAME_BYTES)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        name.push_str("kernel");
    }
    name.push_str(".cu");
    name
}

#[cfg(feature = "cuda")]
/// Compiles `source` to PTX for `arch` (e.g. `compute_90`) with NVRTC.
///
/// Errors: [`PersistentError::NvrtcUnavailable`] when NVRTC (or its builtins library) cannot be
/// loaded, [`PersistentError::Compile`] with the log on a compile error (a layout
/// `static_assert` included), [`PersistentError::Config`] on invalid input.
pub fn compile_ptx(source: &KernelSource, arch: &str) -> Result<CompiledKernel, PersistentError> {
    let text = source.render()?;
    if !arch.starts_with("compute_") || !arch[8..].chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(PersistentError::config(format!(
            "architecture `{}` is not of the form compute_NN",
            resident_ring::message::quoted_name(arch)
        )));
    }
    nvrtc_available()?;
    let name = program_name(source);
    let ptx = with_template_options(&text, arch, &[], |o| {
        resident_cuda::nvrtc::compile_ptx(&text, &name, o)
    })
    .map_err(|e| compile_error(source, arch, e))?;
    Ok(CompiledKernel {
        ptx,
        arch: arch.into(),
    })
}

/// The architecture name CudaSim compile errors carry.
pub const SIM_ARCH: &str = "host C++ (CudaSim)";

/// Compiles `source` (template + handler) with the host C++ compiler for CudaSim, or takes it
/// from the disk cache. A handler that uses something the shim does not provide fails here
/// with [`PersistentError::Compile`], whose log is the compiler's diagnostics naming it.
pub fn compile_sim(source: &KernelSource) -> Result<crate::sim::SimModule, PersistentError> {
    compile_sim_with(source, &crate::sim::SimOptions::default())
}

/// [`compile_sim`] with extra compiler options.
pub fn compile_sim_with(
    source: &KernelSource,
    options: &crate::sim::SimOptions,
) -> Result<crate::sim::SimModule, PersistentError> {
    let text = source.render()?;
    // One module per text, whatever the kernel is called (see `render`).
    crate::sim::SimModule::compile(
        "resident_ring_kernel",
        &text,
        &[PERSISTENT_KERNEL_NAME, BATCH_KERNEL_NAME],
        options,
    )
    .map_err(|e| match e {
        // The log is bounded where the host compiler's error is made (`crate::sim`).
        crate::sim::SimError::Compile { log, compiler, .. } => PersistentError::Compile {
            name: resident_ring::message::quoted_name(&source.name),
            arch: format!("{SIM_ARCH}, {compiler}"),
            log,
        },
        e => PersistentError::Sim(e),
    })
}

#[cfg(feature = "cuda")]
/// Compiles `source` to machine code (a CUBIN) for `sm` (e.g. `sm_90`) with NVRTC: what a
/// device of exactly that architecture loads without a JIT step.
pub fn compile_cubin(source: &KernelSource, sm: &str) -> Result<Vec<u8>, PersistentError> {
    let text = source.render()?;
    nvrtc_available()?;
    let name = program_name(source);
    with_template_options(&text, sm, &[], |o| {
        resident_cuda::nvrtc::compile_cubin(&text, &name, o)
    })
    .map(|(image, _)| image)
    .map_err(|e| compile_error(source, sm, e))
}

#[cfg(feature = "cuda")]
/// The NVRTC options that make the template LTO-IR, relocatable, for nvJitLink.
pub const LTO_OPTIONS: [&str; 2] = ["-dlto", "-rdc=true"];

#[cfg(feature = "cuda")]
/// The external function's LTO-IR, checked to be for `sm`; a typed config error otherwise.
fn external_ltoir<'a>(source: &'a KernelSource, sm: &str) -> Result<&'a [u8], PersistentError> {
    use resident_ring::message::quoted_name as q;
    let Some(f) = &source.external else {
        return Err(PersistentError::config(format!(
            "kernel `{}` has no external function to link",
            q(&source.name)
        )));
    };
    match &f.ltoir {
        None => Err(PersistentError::config(format!(
            "kernel `{}`: external function `{}` has no LTO-IR, so the kernel cannot run on a GPU",
            q(&source.name),
            q(&f.symbol)
        ))),
        Some((arch, _)) if arch != sm => Err(PersistentError::config(format!(
            "kernel `{}`: external function `{}` is LTO-IR for {}, not for {} (compile it for the device's own architecture)",
            q(&source.name),
            q(&f.symbol),
            q(arch),
            q(sm)
        ))),
        Some((_, bytes)) if bytes.is_empty() => Err(PersistentError::config(format!(
            "kernel `{}`: external function `{}` has empty LTO-IR",
            q(&source.name),
            q(&f.symbol)
        ))),
        Some((_, bytes)) => Ok(bytes),
    }
}

#[cfg(feature = "cuda")]
/// Whether `sm` is of the form `sm_NN` (digits, an optional letter suffix).
fn is_sm(sm: &str) -> bool {
    sm.strip_prefix("sm_").is_some_and(|n| {
        let digits = n.trim_end_matches(|c: char| c.is_ascii_lowercase());
        !digits.is_empty()
            && digits.len() <= 4
            && n.len() - digits.len() <= 1
            && digits.chars().all(|c| c.is_ascii_digit())
    })
}

#[cfg(feature = "cuda")]
/// Compiles `source`'s template to LTO-IR for `sm` (e.g. `sm_90`) with NVRTC and links it with
/// nvJitLink to the LTO-IR of its external function ([`KernelSource::external`]) into machine
/// code (a CUBIN) for exactly `sm`: the link-time optimizer inlines the function into the
/// handler that calls it. What a kernel with an external function loads on a GPU.
///
/// Errors: [`PersistentError::Config`] when `sm` is not `sm_NN`, the source has no external
/// function, or its LTO-IR is missing or for another architecture than `sm`;
/// [`PersistentError::NvrtcUnavailable`] / [`PersistentError::JitLinkUnavailable`] when a
/// library cannot be loaded; [`PersistentError::Compile`] with NVRTC's log on a compile error;
/// [`PersistentError::Link`] with nvJitLink's log when the link fails (bytes that are not
/// LTO-IR, an undefined symbol, a symbol that is not a function). The external function must
/// have [`EXTERNAL_FN_SIGNATURE`](super::EXTERNAL_FN_SIGNATURE): one of another signature
/// links (C names carry no types) and calling it is undefined behaviour.
pub fn link_cubin(source: &KernelSource, sm: &str) -> Result<Vec<u8>, PersistentError> {
    let text = source.render()?;
    if !is_sm(sm) {
        return Err(PersistentError::config(format!(
            "architecture `{}` is not of the form sm_NN (an external function's LTO-IR links into machine code for one real architecture)",
            resident_ring::message::quoted_name(sm)
        )));
    }
    let external = external_ltoir(source, sm)?;
    nvrtc_available()?;
    nvjitlink_available()?;
    let name = program_name(source);
    let template = with_template_options(&text, sm, &LTO_OPTIONS, |o| {
        resident_cuda::nvrtc::compile_ltoir(&text, &name, o)
    })
    .map_err(|e| compile_error(source, sm, e))?;
    let symbol = source
        .external
        .as_ref()
        .map(|f| f.symbol.as_str())
        .unwrap_or_default();
    let external_name = format!("{symbol}.ltoir");
    resident_cuda::nvjitlink::link_cubin(sm, &[(&name, &template), (&external_name, external)])
        .map_err(|e| link_error(source, sm, e))
}

#[cfg(feature = "cuda")]
/// Maps the nvJitLink layer's errors for `source` linked for `sm`.
fn link_error(source: &KernelSource, sm: &str, e: resident_cuda::CudaError) -> PersistentError {
    match e {
        resident_cuda::CudaError::JitLink { call, code, log } => PersistentError::Link {
            name: source.name.clone(),
            arch: resident_ring::message::quoted_name(sm),
            call,
            code,
            log,
        },
        e @ resident_cuda::CudaError::JitLinkNotFound { .. } => {
            PersistentError::JitLinkUnavailable(e)
        }
        e => PersistentError::Cuda(e),
    }
}

/// What `ptxas` reported for one kernel entry compiled to machine code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SassReport {
    /// The `extern "C"` entry, e.g. `resident_persistent`.
    pub entry: String,
    /// Registers per thread.
    pub registers: u32,
    /// Stack frame bytes per thread.
    pub stack_bytes: u32,
    /// Bytes spilled to local memory (stores).
    pub spill_store_bytes: u32,
    /// Bytes reloaded from spills.
    pub spill_load_bytes: u32,
}

/// Parses `ptxas -v` output into one report per compiled entry.
pub fn parse_ptxas_report(log: &str) -> Vec<SassReport> {
    fn number_before(line: &str, unit: &str) -> Option<u32> {
        let end = line.find(unit)?;
        line[..end].split_whitespace().last()?.parse().ok()
    }
    let mut out: Vec<SassReport> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let entry = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(SassReport {
                entry,
                ..Default::default()
            });
        } else if let Some(r) = out.last_mut() {
            if line.contains("bytes stack frame") {
                r.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                r.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
                r.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used") && line.contains("registers") {
                r.registers = number_before(line, "registers").unwrap_or(0);
            }
        }
    }
    out
}

#[cfg(feature = "cuda")]
/// Compiles `source` through `ptxas` to machine code for `sm` (e.g. `sm_90`) with NVRTC, no GPU
/// needed, and returns `ptxas`'s resource report for each entry. This checks what compiling to
/// PTX cannot: the inline PTX of the queue protocol assembles, and the block fits its launch
/// bounds.
pub fn compile_sass_report(
    source: &KernelSource,
    sm: &str,
) -> Result<Vec<SassReport>, PersistentError> {
    let text = source.render()?;
    let name = program_name(source);
    with_template_options(&text, sm, &["--ptxas-options=-v"], |o| {
        resident_cuda::nvrtc::compile_cubin(&text, &name, o)
    })
    .map(|(_, log)| parse_ptxas_report(&log))
    .map_err(|e| compile_error(source, sm, e))
}

#[cfg(test)]
mod sass_tests {
    use super::*;

    #[test]
    fn parses_ptxas_verbose_output() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'resident_batch' for 'sm_90'\n\
ptxas info    : Function properties for resident_batch\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 32 registers, used 1 barriers, 392 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'resident_persistent' for 'sm_90'\n\
ptxas info    : Function properties for resident_persistent\n\
    144 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 40 registers, used 1 barriers, 496 bytes cmem[0]\n";
        let r = parse_ptxas_report(log);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].entry, "resident_batch");
        assert_eq!(r[0].registers, 32);
        assert_eq!(r[1].entry, "resident_persistent");
        assert_eq!(
            (
                r[1].registers,
                r[1].stack_bytes,
                r[1].spill_store_bytes,
                r[1].spill_load_bytes
            ),
            (40, 144, 8, 12)
        );
    }
}

/// What `resident fuzz --target cuda` found: compile errors as long as the user's text.
#[cfg(test)]
mod fuzz_regressions {
    use super::super::MessageDecl;
    use super::*;

    /// The longest message a compile error may have: its log (bounded) after a short header.
    const MAX_COMPILE_ERROR: usize = resident_cuda::MAX_LOG_BYTES + 512;

    fn ping(name: &str, handler: &str) -> KernelSource {
        KernelSource::new(
            name,
            MessageDecl::new("Ping", "typedef struct { unsigned int x; } Ping;", 4),
            MessageDecl::new("Ping", "", 4),
            MessageDecl::new("St", "typedef struct { unsigned int n; } St;", 4),
            handler,
            64,
        )
    }

    /// A handler with a megabyte-long line (a comment) holding 20 typos: NVRTC quotes the
    /// line, and a caret line as long, with each of its errors (a 21 MB log and a second's
    /// compile, before diagnostics were made brief for long lines).
    fn long_line_handler() -> String {
        let typos: String = (0..20).map(|i| format!("undefined_{i} + ")).collect();
        format!(
            "__device__ bool handle(St* s, const Ping* in, Ping* out, const Envelope* env) {{\n    out->x = {typos}in->x; /*{}*/\n    return true;\n}}\n",
            "c".repeat(1 << 20)
        )
    }

    #[cfg(feature = "cuda")]
    fn compiled(source: &KernelSource) -> Option<Result<CompiledKernel, PersistentError>> {
        match compile_ptx(source, "compute_90") {
            Err(PersistentError::NvrtcUnavailable(e)) => {
                eprintln!("SKIP: NVRTC not available: {e}");
                None
            }
            r => Some(r),
        }
    }

    /// Found by `resident fuzz --target cuda`: NVRTC's log quotes each offending source line,
    /// and the error kept the whole log, so a handler with a 1 MB line and a typo failed with
    /// an error of megabytes.
    #[cfg(feature = "cuda")]
    #[test]
    fn regression_fuzz_compile_error_of_a_long_line_is_short() {
        let handler = long_line_handler();
        assert!(handler.len() > 1 << 20);
        let Some(r) = compiled(&ping("ping", &handler)) else {
            return;
        };
        match r {
            Err(e @ PersistentError::Compile { .. }) => {
                let text = e.to_string();
                assert!(text.len() <= MAX_COMPILE_ERROR, "{} bytes", text.len());
                assert!(text.contains("handler.cu(2): error"), "{text}");
                assert!(text.contains("undefined_0"), "{text}");
            }
            other => panic!("expected a compile error, got {:?}", other.map(|k| k.arch)),
        }
        // Brief diagnostics only for long lines: an ordinary error still quotes its line.
        let typo = "__device__ bool handle(St* s, const Ping* in, Ping* out, const Envelope* env) {\n    out->x = in->x + y;\n    return true;\n}\n";
        match compiled(&ping("ping", typo)).unwrap() {
            Err(e @ PersistentError::Compile { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains("handler.cu(2): error: identifier \"y\" is undefined\n"),
                    "{text}"
                );
                assert!(text.contains("  out->x = in->x + y;\n"), "{text}");
                // Warnings are off: the template's own no longer pad the log.
                assert!(!text.contains("warning"), "{text}");
            }
            other => panic!("expected a compile error, got {:?}", other.map(|k| k.arch)),
        }
    }

    /// Found by `resident fuzz --target cuda`: NVRTC quotes the line of each warning, so a
    /// handler line of 39 KB holding 3000 statements that each draw a warning took 12 s and a
    /// 176 MB log to compile (quadratic: a 130 KB line, minutes and gigabytes). Warnings are
    /// off now; this 130 KB line compiles in about half a second here.
    #[cfg(feature = "cuda")]
    #[test]
    fn regression_fuzz_a_line_of_warnings_compiles_in_linear_time() {
        let handler = format!(
            "__device__ bool handle(St* s, const Ping* in, Ping* out, const Envelope* env) {{\n    {}\n    out->x = in->x;\n    return true;\n}}\n",
            "in->x == 1u; ".repeat(10_000)
        );
        let start = std::time::Instant::now();
        let Some(r) = compiled(&ping("ping", &handler)) else {
            return;
        };
        let took = start.elapsed();
        assert!(r.is_ok(), "{:?}", r.err().map(|e| e.to_string()));
        assert!(took.as_secs() < 60, "{took:?}");
    }

    /// Found by `resident fuzz --target cuda`: the error and NVRTC's program name held the
    /// kernel's name whole, and NVRTC names the program on each diagnostic of the prelude (a
    /// layout `static_assert` here), so a 1 MB name made every line of the log 1 MB long.
    #[cfg(feature = "cuda")]
    #[test]
    fn regression_fuzz_compile_error_of_a_long_kernel_name_is_short() {
        let name = "k/\"\u{e9}".repeat(1 << 18);
        let mut source = ping(&name, "");
        source.input.size = 8; // the static_assert fails
        assert!(program_name(&source).len() <= PROGRAM_NAME_BYTES + 3);
        assert!(program_name(&source).starts_with("k___k___"));
        assert_eq!(program_name(&ping("", "")), "kernel.cu");
        assert_eq!(program_name(&ping("ping-2.x", "")), "ping-2.x.cu");
        let Some(r) = compiled(&source) else {
            return;
        };
        match r {
            Err(e @ PersistentError::Compile { .. }) => {
                let text = e.to_string();
                assert!(text.len() <= 2048, "{} bytes", text.len());
                assert!(text.contains("is not the 8 bytes"), "{text}");
                assert!(text.contains(&format!("({} bytes)", name.len())), "{text}");
            }
            other => panic!("expected a compile error, got {:?}", other.map(|k| k.arch)),
        }
        // A name that is not of the form compute_NN is quoted short.
        let arch = format!("sm_{}", "9".repeat(1 << 20));
        match compile_ptx(&ping("ping", ""), &arch) {
            Err(e @ PersistentError::Config { .. }) => assert!(e.to_string().len() < 300),
            other => panic!("expected a config error, got {:?}", other.map(|k| k.arch)),
        }
    }

    /// Found by `resident fuzz --target cuda`: NVRTC's parser recurses per nesting level (1 to
    /// 2 KiB of stack each), so a handler of 1024 nested parentheses aborted the process when
    /// compiled on a 2 MiB thread (4096 on an 8 MiB main thread). Sources nesting deeper than
    /// 256 are refused, and NVRTC compiles on a thread with a 512 MiB stack.
    #[test]
    fn regression_fuzz_deep_nesting_is_refused_before_it_reaches_the_compiler() {
        let base = "__device__ bool handle(St* s, const Ping* in, Ping* out, const Envelope* env) {\n    out->x = ";
        let nested = |open: &str, n: usize, close: &str| {
            format!(
                "{base}{}in->x{};\n    return true;\n}}\n",
                open.repeat(n),
                close.repeat(n)
            )
        };
        for (handler, why) in [
            (
                nested("(", 1 << 20, ")"),
                "nests brackets or statements deeper than 256 (line 2)",
            ),
            (
                nested("{", 300, "}"),
                "nests brackets or statements deeper than 256 (line 2)",
            ),
            (
                nested("!", 1 << 20, ""),
                "256 operator characters in a row (line 2)",
            ),
            (
                nested("- ", 257, ""),
                "256 operator characters in a row (line 2)",
            ),
            (
                nested("*", 1000, ""),
                "256 operator characters in a row (line 2)",
            ),
        ] {
            match ping("ping", &handler).render() {
                Err(e @ PersistentError::Config { .. }) => {
                    let text = e.to_string();
                    assert!(text.contains(why) && text.len() < 300, "{text}");
                }
                other => panic!("expected a config error, got {:?}", other.map(|t| t.len())),
            }
        }
        // Up to the limits, and in comments and literals, anything goes.
        let mut deep = nested("(", 250, ")");
        deep.push_str(&format!(
            "// {}\n/* {} */\nconst char* s = \"{}\";\nconst char c = ')';\n",
            "(".repeat(1000),
            "{".repeat(1000),
            "[\\\"".repeat(1000)
        ));
        ping("ping", &deep).render().unwrap();
        ping("ping", &nested("!", 250, "")).render().unwrap();
        // Statements nested without braces (500 nested loops took NVRTC 222 s, 1000 overflowed
        // a 512 MiB stack), and `template` chains.
        for (chain, n) in [
            ("for (int i = 0; i < 4; ++i) ", 300),
            ("if (in->x) ", 1 << 16),
            ("template <typename T> ", 1000),
        ] {
            let text = format!(
                "{base}1u;\n    {}out->x = 2u;\n    return true;\n}}\n",
                chain.repeat(n)
            );
            let e = ping("ping", &text).render().unwrap_err().to_string();
            assert!(e.contains("statements deeper than 256 (line 3)"), "{e}");
        }
        // Long chains in one statement: assignments, conditionals, casts (NVRTC's parser spent
        // minutes on them); 256 of each still pass.
        for (link, n) in [
            ("in->x = ", 300),
            ("in->x ? 1u : ", 300),
            ("(unsigned int)", 300),
        ] {
            let text = format!("{base}{}0u;\n    return true;\n}}\n", link.repeat(n));
            let e = ping("ping", &text).render().unwrap_err().to_string();
            assert!(
                e.contains("chains more than 256") && e.contains("(line 2)"),
                "{e}"
            );
            let ok = format!("{base}{}0u;\n    return true;\n}}\n", link.repeat(250));
            ping("ping", &ok).render().unwrap();
        }
        let loops = format!(
            "{base}1u;\n{}\n    return true;\n}}\n",
            "for (int i = 0; i < 4; ++i) { if (in->x) { out->x += 1u; } }\n".repeat(1000)
        );
        ping("ping", &loops).render().unwrap();
        let mut decl = ping("ping", "");
        decl.state.c_decl = format!(
            "typedef struct {{ unsigned int n; }} St; {}",
            "(".repeat(300)
        );
        assert!(decl
            .render()
            .unwrap_err()
            .to_string()
            .contains("the state type's declaration"));
    }

    /// NVRTC compiles on a thread of its own with a large stack: 8192 nested parentheses (which
    /// abort a process compiling them on an 8 MiB stack) compile on the test's 2 MiB thread.
    #[cfg(feature = "cuda")]
    #[test]
    fn regression_fuzz_nvrtc_compiles_on_a_large_stack() {
        if resident_cuda::nvrtc::nvrtc_present() {
            let n = 8192;
            let src = format!(
                "extern \"C\" __global__ void k(int* p) {{ p[0] = {}1{}; }}",
                "(".repeat(n),
                ")".repeat(n)
            );
            let opts = resident_cuda::CompileOptions::for_arch("compute_90");
            match resident_cuda::nvrtc::compile_ptx(&src, "deep", &opts) {
                Ok(ptx) => assert!(ptx.contains(".entry k"), "{ptx}"),
                Err(e @ resident_cuda::CudaError::Nvrtc { .. }) => eprintln!("SKIP: {e}"),
                Err(e) => panic!("{e}"),
            }
        } else {
            eprintln!("SKIP: NVRTC not available");
        }
    }

    /// The host compiler's diagnostics (CudaSim) go through the same bound.
    #[test]
    fn regression_fuzz_cudasim_compile_error_of_a_long_line_is_short() {
        if !crate::sim::available() {
            eprintln!("SKIP: no host C++ compiler");
            return;
        }
        let name = "n".repeat(1 << 20);
        match compile_sim(&ping(&name, &long_line_handler())) {
            Err(e @ PersistentError::Compile { .. }) => {
                let text = e.to_string();
                assert!(text.len() <= MAX_COMPILE_ERROR, "{} bytes", text.len());
                assert!(text.contains("undefined_0"), "{text}");
                assert!(text.contains(&format!("({} bytes)", name.len())), "{text}");
            }
            other => panic!(
                "expected a compile error, got {:?}",
                other.map(|m| m.path().to_path_buf())
            ),
        }
    }
}
