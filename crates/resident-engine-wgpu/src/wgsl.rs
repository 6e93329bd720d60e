//! WGSL compilation and reflection with naga (the compiler wgpu itself uses): a shader that
//! does not parse or validate is a [`WgslError`] with naga's message and the line, before any
//! pipeline is built.

#[cfg(feature = "wgpu")]
use naga::valid::{Capabilities, ValidationFlags, Validator};
pub use resident_core::engine::error::WgslError;

/// WGSL helpers for 64-bit values, appended to every WGSL module the runtime compiles (ring
/// kernels and one-shot kernels alike, after the user's source so line numbers stay the
/// source's own). A `u64`, `i64` or `f64` field or buffer element is a `vec2<u32>` in WGSL, low
/// word in `.x`; these convert and combine them:
///
/// - `resident_f64_to_f32(b: vec2<u32>) -> f32`: round to nearest, ties to even (as Rust's
///   `x as f32`); overflow gives an infinity, results below the normal f32 range are f32
///   subnormals (bit-exact) or signed zero, f64 subnormals give zero (which is what rounding
///   gives), infinities stay, a NaN gives a quiet NaN.
/// - `resident_f32_to_f64(x: f32) -> vec2<u32>`: exact (zero, subnormal, infinity and NaN
///   included).
/// - `resident_u32_to_f64(x: u32) -> vec2<u32>`: exact.
/// - `resident_u64(lo: u32) -> vec2<u32>`, `resident_i64(x: i32) -> vec2<u32>` (sign-extended),
///   `resident_u64_add`, `resident_u64_sub` (wrapping), `resident_u64_lt` (unsigned `<`).
///
/// Names starting with `resident_` are reserved. A device may flush f32 subnormals in later
/// arithmetic; the conversions themselves work on bits and never do.
pub const HELPERS_64: &str = include_str!("helpers.wgsl");

/// `source` with [`HELPERS_64`] appended.
pub(crate) fn with_helpers(source: &str) -> String {
    let mut s = String::with_capacity(source.len() + HELPERS_64.len() + 1);
    s.push_str(source);
    s.push('\n');
    s.push_str(HELPERS_64);
    s
}

#[cfg(feature = "wgpu")]
/// A parsed and validated WGSL module.
pub(crate) struct Compiled {
    pub module: naga::Module,
}

/// The most bytes of naga's message a [`WgslError`] keeps (with its stage and line, the error
/// prints in under 512 bytes, whatever the source).
pub const MAX_MESSAGE: usize = 420;

#[cfg(feature = "wgpu")]
/// naga's message with its source excerpt when that is short; else naga's message alone (no
/// excerpt: the line may be megabytes long), cut to [`MAX_MESSAGE`] bytes.
fn bounded(full: String, alone: impl FnOnce() -> String) -> String {
    if full.len() <= MAX_MESSAGE {
        return full;
    }
    let mut m = alone();
    if m.len() > MAX_MESSAGE {
        let total = m.len();
        let mut end = MAX_MESSAGE - 24;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
        m.push_str(&format!("... ({total} bytes)"));
    }
    m
}

/// `source` with each control character that is not whitespace replaced by a printable one of
/// the same UTF-8 length (`?` for one byte, `¿` for the two-byte C1 controls), so the byte
/// offsets of naga's spans stay exact. naga's own replacement (in `emit_to_string`) puts a
/// three-byte U+FFFD in place of each, one `replace_range` at a time: quadratic in their number
/// (a megabyte of NULs took minutes) and shifting every later span.
#[cfg(feature = "wgpu")]
pub(crate) fn printable(source: &str) -> std::borrow::Cow<'_, str> {
    let unprintable = |c: char| c.is_control() && !c.is_whitespace();
    if !source.chars().any(unprintable) {
        return std::borrow::Cow::Borrowed(source);
    }
    std::borrow::Cow::Owned(
        source
            .chars()
            .map(|c| match (unprintable(c), c.len_utf8()) {
                (false, _) => c,
                (true, 1) => '?',
                // Cc is U+0000..=U+001F and U+007F..=U+009F: at most two bytes.
                (true, _) => '\u{bf}',
            })
            .collect(),
    )
}

/// The most source bytes (the whole lines its labels cover) naga's rendered message may quote;
/// beyond it the error keeps naga's message alone.
#[cfg(feature = "wgpu")]
const MAX_EXCERPT: usize = 2048;

/// Whether the whole lines of `source` that `spans` cover hold at most [`MAX_EXCERPT`] bytes.
/// naga renders every line a label covers, with a gutter each: a label over 380,000 lines
/// held 146 MB while its message was rendered only to be cut to [`MAX_MESSAGE`].
#[cfg(feature = "wgpu")]
fn excerpt_is_short(source: &str, spans: impl Iterator<Item = naga::Span>) -> bool {
    let bytes = source.as_bytes();
    let mut total = 0usize;
    for span in spans {
        let Some(r) = span.to_range() else { continue };
        let (a, b) = (r.start.min(bytes.len()), r.end.min(bytes.len()));
        if b.saturating_sub(a) > MAX_EXCERPT {
            return false;
        }
        let start = bytes[..a]
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |i| i + 1);
        // The line's end, looked for no further than the budget left.
        let limit = (b + MAX_EXCERPT + 1).min(bytes.len());
        let end = bytes[b..limit]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(limit, |i| b + i);
        total += end - start;
        if total > MAX_EXCERPT || (start + MAX_EXCERPT < a) {
            return false;
        }
    }
    true
}

#[cfg(feature = "wgpu")]
/// The stack naga parses and validates on. Its parser and validator recurse once per link of
/// an expression chain, about 600 bytes each (measured, naga 30: a sum of 4096 terms overflows
/// a 2 MiB thread stack, which aborts the process); reserved, not used, as NVRTC's is
/// (`resident_cuda::nvrtc::COMPILE_STACK_BYTES`).
pub const NAGA_STACK_BYTES: usize = 512 << 20;

#[cfg(feature = "wgpu")]
/// The most bytes of a checking process's report taken back (a message is bounded far below).
const REPORT_BYTES: usize = 1 << 20;

#[cfg(feature = "wgpu")]
/// Why a WGSL source did not become a module: naga refused it, or the compile's limits
/// stopped naga (or it crashed) in its own process.
#[derive(Debug)]
pub(crate) enum CompileFailed {
    /// naga's error.
    Source(WgslError),
    /// The limits' end.
    Stopped(resident_limits::CompileStopped),
}

#[cfg(feature = "wgpu")]
impl From<CompileFailed> for resident_core::engine::error::WgslLaunchError {
    fn from(e: CompileFailed) -> Self {
        match e {
            CompileFailed::Source(e) => Self::Compile(e),
            CompileFailed::Stopped(e) => Self::Stopped(e),
        }
    }
}

#[cfg(feature = "wgpu")]
/// Runs `f` on a thread with a [`NAGA_STACK_BYTES`] stack (on this one when such a thread
/// cannot be started).
pub(crate) fn on_naga_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let mut f = Some(f);
    let r = std::thread::scope(|scope| {
        let f = &mut f;
        match std::thread::Builder::new()
            .name("naga".into())
            .stack_size(NAGA_STACK_BYTES)
            .spawn_scoped(scope, move || f.take().map(|f| f()))
        {
            Ok(t) => t.join().ok().flatten(),
            Err(_) => None,
        }
    });
    match r {
        Some(r) => r,
        // No thread (or it panicked before taking `f`): here.
        None => match f.take() {
            Some(f) => f(),
            None => std::panic::resume_unwind(Box::new("naga's thread panicked")),
        },
    }
}

#[cfg(feature = "wgpu")]
/// Parses and validates `source` as a launch does: first in a process of its own under the
/// compile's limits ([`resident_limits::run_forked`]), since naga's time and memory grow faster
/// than the source (100 000 short statements took it 20 s, a sum of 262 144 terms 38 s and a
/// 256 MiB stack), then, once that process has answered, here on a [`NAGA_STACK_BYTES`] stack
/// to keep the module (naga is deterministic: what finished there finishes here the same).
pub(crate) fn compile(source: &str) -> Result<Compiled, CompileFailed> {
    let limits = resident_limits::CompileLimits::from_env().map_err(|e| {
        CompileFailed::Source(WgslError {
            stage: "limits",
            message: e.to_string(),
            line: None,
            column: None,
        })
    })?;
    checked_apart(source, &limits)?;
    on_naga_stack(|| parse_and_validate(source)).map_err(CompileFailed::Source)
}

#[cfg(feature = "wgpu")]
/// [`parse_and_validate`] in a forked child under `limits`; its answer, or how it ended.
fn checked_apart(
    source: &str,
    limits: &resident_limits::CompileLimits,
) -> Result<(), CompileFailed> {
    use resident_limits::CompileStopped;
    // SAFETY: the body parses and validates (naga is pure Rust: it allocates and loads nothing)
    // and writes its report with write(2).
    let ended = unsafe {
        resident_limits::run_forked_on_stack(limits, REPORT_BYTES, NAGA_STACK_BYTES, |out| {
            out.write_all(&encode_report(&parse_and_validate(source).map(|_| ())));
        })
    };
    let stdout = CompileStopped::check("naga", limits, ended).map_err(CompileFailed::Stopped)?;
    match decode_report(&stdout) {
        Some(Ok(())) => Ok(()),
        Some(Err(e)) => Err(CompileFailed::Source(e)),
        None => Err(CompileFailed::Stopped(CompileStopped::crashed(
            "naga",
            "its process sent a cut or malformed report",
        ))),
    }
}

#[cfg(feature = "wgpu")]
/// The stages [`parse_and_validate`] reports, by their index in a checking process's report.
const STAGES: [&str; 2] = ["parse", "validation"];

#[cfg(feature = "wgpu")]
/// A checking process's report ([`resident_limits::ReportWriter`]): 0, or 1 with the stage's
/// index (u8), the line and the column (each a presence byte and a u32) and the message.
fn encode_report(r: &Result<(), WgslError>) -> Vec<u8> {
    let mut w = resident_limits::ReportWriter::default();
    match r {
        Ok(()) => w.u8(0),
        Err(e) => {
            w.u8(1)
                .u8(STAGES.iter().position(|s| *s == e.stage).unwrap_or(0) as u8);
            for x in [e.line, e.column] {
                w.u8(u8::from(x.is_some())).u32(x.unwrap_or(0));
            }
            w.bytes(e.message.as_bytes())
        }
    };
    w.finish()
}

#[cfg(feature = "wgpu")]
/// Reads [`encode_report`]'s bytes; `None` when cut short or malformed.
fn decode_report(b: &[u8]) -> Option<Result<(), WgslError>> {
    let mut r = resident_limits::ReportReader::new(b);
    match r.u8()? {
        0 => return r.end().map(|()| Ok(())),
        1 => {}
        _ => return None,
    }
    let stage = *STAGES.get(usize::from(r.u8()?))?;
    let mut opt = || -> Option<Option<u32>> {
        let present = r.u8()?;
        let v = r.u32()?;
        match present {
            0 => Some(None),
            1 => Some(Some(v)),
            _ => None,
        }
    };
    let (line, column) = (opt()?, opt()?);
    let message = String::from_utf8(r.bytes()?.to_vec()).ok()?;
    r.end().map(|()| {
        Err(WgslError {
            stage,
            message,
            line,
            column,
        })
    })
}

#[cfg(feature = "wgpu")]
/// Parses and validates `source`, here.
fn parse_and_validate(source: &str) -> Result<Compiled, WgslError> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| {
        let loc = e.location(source);
        let message = if excerpt_is_short(source, e.labels().map(|(s, _)| s)) {
            bounded(e.emit_to_string(&printable(source)), || e.to_string())
        } else {
            bounded(e.to_string(), || e.to_string())
        };
        WgslError {
            stage: "parse",
            message,
            line: loc.map(|l| l.line_number),
            column: loc.map(|l| l.line_position),
        }
    })?;
    Validator::new(ValidationFlags::all(), Capabilities::default())
        .validate(&module)
        .map_err(|e| {
            let loc = e.location(source);
            let message = if excerpt_is_short(source, e.spans().map(|(s, _)| *s)) {
                bounded(e.emit_to_string(&printable(source)), || e.to_string())
            } else {
                bounded(e.to_string(), || e.to_string())
            };
            WgslError {
                stage: "validation",
                message,
                line: loc.map(|l| l.line_number),
                column: loc.map(|l| l.line_position),
            }
        })?;
    Ok(Compiled { module })
}

#[cfg(feature = "wgpu")]
/// Parses and validates `source` as the runtime does before it builds a pipeline (no device
/// needed): `Ok`, or the [`WgslError`] a launch would give. In this process, on a
/// [`NAGA_STACK_BYTES`] stack, with no time or memory limit (a launch also checks in a process of
/// its own under the compile's limits, [`resident_limits`]): for sources this process trusts,
/// or for a fuzzer's.
pub fn check(source: &str) -> Result<(), WgslError> {
    on_naga_stack(|| parse_and_validate(source)).map(|_| ())
}

#[cfg(feature = "wgpu")]
/// How a shader binds one resource of group 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindingKind {
    /// `var<storage, read>`.
    StorageRead,
    /// `var<storage, read_write>`.
    StorageReadWrite,
    /// `var<uniform>`.
    Uniform,
    /// Anything else (textures, samplers ...): not a kernel argument.
    Other,
}

#[cfg(feature = "wgpu")]
impl std::fmt::Display for BindingKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BindingKind::StorageRead => "var<storage, read>",
            BindingKind::StorageReadWrite => "var<storage, read_write>",
            BindingKind::Uniform => "var<uniform>",
            BindingKind::Other => "a non-buffer resource",
        })
    }
}

#[cfg(feature = "wgpu")]
/// One binding of group 0: its number, kind, name and the byte size of its type (the
/// element size for a runtime-sized array).
#[derive(Clone, Debug)]
pub(crate) struct Binding {
    pub binding: u32,
    pub kind: BindingKind,
    pub name: String,
    pub size: u32,
}

#[cfg(feature = "wgpu")]
impl Compiled {
    /// The compute entry point `entry`: its index and workgroup size.
    pub fn entry(&self, entry: &str) -> Option<(usize, [u32; 3])> {
        self.module
            .entry_points
            .iter()
            .enumerate()
            .find(|(_, e)| e.name == entry && e.stage == naga::ShaderStage::Compute)
            .map(|(i, e)| (i, e.workgroup_size))
    }

    /// Bindings of group 0, by binding number; bindings in other groups are reported as `Err`
    /// (a [`WgslError`] of stage `bindings`).
    pub fn group0(&self) -> Result<Vec<Binding>, WgslError> {
        let refuse = |message: String| WgslError {
            stage: "bindings",
            message,
            line: None,
            column: None,
        };
        let mut layouter = naga::proc::Layouter::default();
        layouter
            .update(self.module.to_ctx())
            .map_err(|e| refuse(format!("layout: {e}")))?;
        let mut out = Vec::new();
        for (_, g) in self.module.global_variables.iter() {
            let Some(rb) = &g.binding else { continue };
            if rb.group != 0 {
                return Err(refuse(format!(
                    "`{}` is in @group({}); kernel arguments are @group(0) only",
                    g.name.as_deref().unwrap_or("?"),
                    rb.group
                )));
            }
            let kind = match g.space {
                naga::AddressSpace::Storage { access } => {
                    if access.contains(naga::StorageAccess::STORE) {
                        BindingKind::StorageReadWrite
                    } else {
                        BindingKind::StorageRead
                    }
                }
                naga::AddressSpace::Uniform => BindingKind::Uniform,
                _ => BindingKind::Other,
            };
            let size = match &self.module.types[g.ty].inner {
                naga::TypeInner::Array {
                    size: naga::ArraySize::Dynamic,
                    stride,
                    ..
                } => *stride,
                _ => layouter[g.ty].size,
            };
            out.push(Binding {
                binding: rb.binding,
                kind,
                name: g.name.clone().unwrap_or_default(),
                size,
            });
        }
        out.sort_by_key(|b| b.binding);
        Ok(out)
    }

    /// Size in bytes of the named struct type, as WGSL lays it out.
    pub fn type_size(&self, name: &str) -> Option<u32> {
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(self.module.to_ctx()).ok()?;
        self.module
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some(name))
            .map(|(h, _)| layouter[h].size)
    }
}

#[cfg(feature = "wgpu")]
#[cfg(test)]
mod tests {
    use super::*;

    /// naga's error for `src`, through a launch's compile (its own process, then here).
    fn refused(src: &str) -> WgslError {
        match compile(src) {
            Err(CompileFailed::Source(e)) => e,
            Err(CompileFailed::Stopped(e)) => panic!("stopped: {e}"),
            Ok(_) => panic!("compiled"),
        }
    }

    #[test]
    fn a_report_reads_back_as_written_and_a_cut_one_is_refused() {
        let cases = [
            Ok(()),
            Err(WgslError {
                stage: "validation",
                message: "naga's message \u{2502} with an excerpt".into(),
                line: Some(3),
                column: None,
            }),
        ];
        for r in &cases {
            let b = encode_report(r);
            assert_eq!(decode_report(&b).as_ref(), Some(r));
            for cut in 0..b.len() {
                assert_eq!(decode_report(&b[..cut]), None, "cut at {cut}");
            }
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(decode_report(&longer), None);
        }
        assert_eq!(decode_report(&[1, 7]), None, "no such stage");
        assert_eq!(decode_report(&[9]), None, "no such tag");
        let mut huge = vec![1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(decode_report(&huge), None, "a length past the end");
    }

    #[test]
    fn parse_error_carries_message_and_line() {
        let e = refused("fn f() -> u32 {\n  return 1u\n}\n");
        assert_eq!(e.stage, "parse");
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.to_string().contains("line 3"), "{e}");
    }

    #[test]
    fn validation_error_carries_message_and_line() {
        let e = refused("fn f() -> u32 {\n  let x: f32 = 1.0;\n  return x;\n}\n");
        assert_eq!(e.stage, "validation", "{e}");
        assert!(e.line.is_some(), "{e}");
    }

    /// Found by `resident fuzz --target wgsl`: naga's message quotes the source lines it points
    /// at, so a long line made an error of megabytes.
    #[test]
    fn regression_fuzz_error_of_a_long_line_is_short() {
        let long = format!("fn f() -> u32 {{ return {}; }}\n", "(".repeat(100_000));
        let e = check(&long).unwrap_err();
        assert!(e.to_string().len() <= 512, "{} bytes", e.to_string().len());
        let name = "x".repeat(100_000);
        let e = check(&format!(
            "fn {name}() -> u32 {{\n  let x: f32 = 1.0;\n  return x;\n}}\n"
        ))
        .unwrap_err();
        assert_eq!(e.stage, "validation");
        assert!(e.to_string().len() <= 512, "{} bytes", e.to_string().len());
    }

    /// Found by `resident fuzz --target wgsl` (97% of its time in one memmove): naga's message
    /// replaced each control character of the whole source one at a time, so a source of many
    /// NULs took minutes to refuse.
    #[test]
    fn regression_fuzz_error_of_many_control_characters_is_linear() {
        let nuls = format!("fn f() -> u32 {{ return 1u; }}\n{}\n", "\0".repeat(1 << 20));
        let e = check(&nuls).unwrap_err();
        assert_eq!(e.stage, "parse", "{e}");
        assert!(e.to_string().len() <= 512, "{} bytes", e.to_string().len());
        let c1 = format!(
            "fn f() -> u32 {{ return 1u; }}\n{}\n",
            "\u{80}\u{9f}".repeat(1 << 18)
        );
        assert_eq!(check(&c1).unwrap_err().stage, "parse");
    }

    /// Found by `resident fuzz --target wgsl` (10^7 inputs): naga renders every line an error's
    /// label covers, so a label over 380,000 lines held 146 MB to make a message that was then
    /// cut to 420 bytes. Such an error keeps naga's message alone (its line is still given).
    #[test]
    fn regression_fuzz_error_spanning_many_lines_is_not_rendered() {
        let src = format!("fn f() -> u32 {{ return 1u; }}\n/*{}", "\n".repeat(400_000));
        let e = check(&src).unwrap_err();
        assert_eq!(e.stage, "parse", "{e}");
        assert!(e.line.is_some(), "{e}");
        assert!(!e.message.contains('|') && !e.message.contains('│'), "{e}");
        assert!(e.to_string().len() <= 512, "{} bytes", e.to_string().len());
        // A short excerpt is still rendered.
        let e = check("fn f() -> u32 {\n  return 1u\n}\n").unwrap_err();
        assert!(e.message.contains('│'), "{e}");
    }

    #[test]
    fn excerpt_length_counts_whole_lines() {
        let span = |a: u32, b: u32| naga::Span::new(a, b);
        let src = "ab\ncd\nef\n";
        assert!(excerpt_is_short(src, [span(3, 4)].into_iter()));
        let long_line = format!("x{}\n", "y".repeat(5000));
        assert!(!excerpt_is_short(&long_line, [span(0, 1)].into_iter()));
        let many = "a\n".repeat(5000);
        assert!(!excerpt_is_short(&many, [span(0, 9000)].into_iter()));
        assert!(excerpt_is_short(
            &many,
            [span(10, 12), span(100, 101)].into_iter()
        ));
        assert!(excerpt_is_short("", [span(0, 0)].into_iter()));
    }

    #[test]
    fn printable_keeps_every_byte_offset() {
        let s = "a\0b\u{7f}c\u{80}d\te\n\u{9f}é";
        let p = printable(s);
        assert_eq!(p.len(), s.len());
        assert_eq!(p, "a?b?c\u{bf}d\te\n\u{bf}é");
        for (i, _) in s.char_indices() {
            assert!(p.is_char_boundary(i), "{i}");
        }
        assert!(matches!(
            printable("fn f() {}\n"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn reflection_reads_workgroup_size_and_bindings() {
        let c = compile(
            "@group(0) @binding(0) var<uniform> a: f32;\n\
             @group(0) @binding(1) var<storage, read> x: array<f32>;\n\
             @group(0) @binding(2) var<storage, read_write> y: array<f32>;\n\
             @compute @workgroup_size(64, 2) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n\
               y[g.x] = a * x[g.x];\n}\n",
        )
        .unwrap();
        assert_eq!(c.entry("main"), Some((0, [64, 2, 1])));
        assert!(c.entry("nope").is_none());
        let b = c.group0().unwrap();
        let kinds: Vec<_> = b.iter().map(|b| b.kind).collect();
        assert_eq!(
            kinds,
            [
                BindingKind::Uniform,
                BindingKind::StorageRead,
                BindingKind::StorageReadWrite
            ]
        );
        assert_eq!(b[1].size, 4);
    }
}
