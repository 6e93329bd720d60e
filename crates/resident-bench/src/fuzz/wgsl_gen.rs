//! The `wgsl` target: user WGSL through naga, the checks the wgpu engine runs before it builds
//! a pipeline (`resident::backend::wgpu::wgsl::check`): the text as given (a one-shot kernel's
//! module) and the module `WgslHandler::module_source` assembles around a ring handler (the
//! source, the generated declarations and entry point, the 64-bit helpers).

use std::fmt::Write as _;

use resident::backend::wgpu::wgsl::{check, WgslError};
use resident::prelude::*;

use super::gen::{expr, Expr, Rng};
use super::sink::{Bytes, Sink};

device_message! {
    /// The fuzzed handlers' input and output.
    struct FuzzMsg { x: u32, y: f32 }
}

/// Tokens of WGSL, for the mutator.
pub(crate) const DICT: &[&str] = &[
    "fn ",
    "var ",
    "let ",
    "const ",
    "struct ",
    "return ",
    "if (",
    ") {",
    "}",
    "{",
    "(",
    ")",
    ";",
    "<",
    ">",
    "u32",
    "f32",
    "i32",
    "vec2<u32>",
    "array<u32, 4>",
    "ptr<function, u32>",
    "&",
    "*",
    "@compute",
    "@workgroup_size(64)",
    "@group(0) @binding(0)",
    "var<storage, read_write>",
    "loop { break; }",
    "for (",
    "switch ",
    "case 0u: ",
    "default: ",
    "atomicAdd(&",
    "resident_f64_to_f32(",
    "resident_u64(",
    "input.x",
    "(*out).y",
    "state",
    "env",
    "ResidentIn",
    "ResidentOut",
    "Envelope",
    "1u",
    "-1i",
    "1e38",
    "0x7fffffff",
    "1.0",
    "/*",
    "*/",
    "//",
    "\n",
    "@",
    "enable f16;",
    "alias T = u32;",
    "requires ",
    "diagnostic(off, x)",
    "((((((((",
    "))))))))",
];

/// The variant of a WGSL error: its stage (`WgslError` is one struct with a stage name).
fn wgsl_kind(e: &WgslError) -> Option<&'static str> {
    match e.stage {
        "parse" => Some("WgslError/parse"),
        "validation" => Some("WgslError/validation"),
        "bindings" => Some("WgslError/bindings"),
        _ => None,
    }
}

fn naga(decoder: &'static str, source: &str, sink: &mut dyn Sink) {
    match check(source) {
        Ok(()) => sink.accepted(decoder),
        Err(e) => {
            match wgsl_kind(&e) {
                Some(kind) => sink.rejected(decoder, kind, &e),
                None => sink.violation(decoder, format_args!("an error of stage {:?}", e.stage)),
            }
            let lines = source.lines().count() as u32 + 1;
            if e.line.is_some_and(|l| l == 0 || l > lines) {
                sink.violation(decoder, format_args!("line {:?} of {lines}", e.line));
            }
        }
    }
}

pub(crate) fn run(input: &[u8], sink: &mut dyn Sink) {
    // A handler's source is a Rust `String` (from Python, a `str`): mutated bytes are read
    // as UTF-8 with replacement characters.
    let source = String::from_utf8_lossy(input);
    naga("naga(source)", &source, sink);
    const M: &str = "WgslHandler::module_source";
    match WgslHandler::<FuzzMsg, FuzzMsg>::new(source.as_ref()).module_source() {
        Ok(module) => {
            sink.accepted(M);
            if !module.starts_with(source.as_ref()) {
                sink.violation(M, format_args!("the module does not start with the source"));
            }
            naga("naga(handler module)", &module, sink);
        }
        Err(e) => sink.rejected(M, "WgslLayoutError", &e),
    }
}

const STMTS: &[&str] = &[
    "m.x = m.x + 1u;",
    "m.y = m.y * 0.5;",
    "m.x ^= m.x >> 3u;",
    "let w = resident_f32_to_f64(m.y); m.y = resident_f64_to_f32(w);",
    "if (m.x > 3u) { return false; }",
    "for (var i = 0u; i < 4u; i++) { m.x += i; }",
    "loop { if (m.x == 0u) { break; } m.x = m.x / 2u; }",
    "switch m.x { case 0u, 1u: { m.y = 1.0; } default: {} }",
    "m.x = u32(resident_priority(env));",
    "let id = resident_u64_add(env.message_id, resident_u64(m.x)); m.x = id.x;",
    "state.unused = state.unused + 1u;",
    "atomicAdd(&state.unused, 1u);",
    "m.z = 1u;",
    "let bad: f32 = m.x;",
    "m.x = m.y;",
    "return;",
    "var a: array<u32, 4>; a[m.x % 4u] = 1u; m.x = a[0];",
    "m.x = m.x / 0u;",
    "let v = vec2<u32>(m.x, 2u); m.x = v.y;",
    "_ = m;",
    "const k = 1u << 31u; m.x |= k;",
];

/// WGSL expressions for [`expr`].
const EXPR: Expr = Expr {
    leaves: &[
        "m.x",
        "1u",
        "0u",
        "4294967295u",
        "7u",
        "u32(m.y)",
        "input.x",
        "2147483648u",
    ],
    select: ["select(", ", ", ", m.x > 2u)"],
    ops: &[" + ", " * ", " ^ ", " & ", " << ", " % ", " - ", " == "],
};

/// A ring handler built of statements that mostly type-check, with expressions of random
/// depth, sometimes a helper function, a stray binding or an entry point of its own.
pub(crate) fn generate(rng: &mut Rng, out: &mut Vec<u8>) {
    let mut b = Bytes(out);
    if rng.one_in(4) {
        let _ = writeln!(b, "fn helper(a: u32) -> u32 {{ return a * 3u + 1u; }}");
    }
    if rng.one_in(8) {
        let _ = writeln!(
            b,
            "@group(0) @binding(7) var<storage, read> extra: array<u32>;"
        );
    }
    if rng.one_in(8) {
        let _ = writeln!(b, "struct Pair {{ a: u32, b: f32, }}");
    }
    let name = if rng.one_in(10) { "handler" } else { "handle" };
    let _ = writeln!(
        b,
        "fn {name}(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {{\n    var m = input;"
    );
    for _ in 0..rng.small_len(16) {
        if rng.one_in(3) {
            b.0.extend_from_slice(b"    m.x = ");
            let depth = rng.small_len(12);
            expr(rng, b.0, depth, &EXPR);
            b.0.extend_from_slice(b";\n");
        } else {
            let _ = writeln!(b, "    {}", STMTS[rng.below(STMTS.len())]);
        }
    }
    let ret = ["true", "false", "m.x > 1u", "1u", "m.x"];
    let _ = writeln!(
        b,
        "    *out = m;\n    return {};\n}}",
        ret[rng.below(ret.len())]
    );
    if rng.one_in(10) {
        let _ = writeln!(b, "@compute @workgroup_size(64) fn main() {{}}");
    }
}
