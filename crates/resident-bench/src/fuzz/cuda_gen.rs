//! The `cuda` target: a ring handler's CUDA C, the user text of the CUDA path, through
//! `resident_engine_cuda::persistent::template`: `KernelSource::render` (its checks and the
//! translation unit it builds) for every input, and NVRTC (`compile_ptx(.., "compute_90")`)
//! for every [`FuzzOptions::compile_every`](super::FuzzOptions::compile_every)-th input and the
//! seed corpus, when NVRTC is present (when not, the compile is counted as skipped).
//!
//! An input is the handler's text. Its first line may name another user-supplied field that
//! gets the rest of the text too (`//fuzz:<field>`, see [`FIELDS`]): the kernel's name, the
//! input type's name, the state type's declaration, the handler function's name, a bound
//! buffer's name, element type or declaration, the key field; or a layout the handler is
//! written for (`buffers`: two bound buffers and the five-argument handler; `keyed`: a keyed
//! kernel whose handler gets its key's `KeyStats`). The messages are `FuzzIn` and `FuzzOut`,
//! the state `FuzzState` (declared below).
//!
//! Judged: a render error is a typed `PersistentError` of at most
//! [`MAX_ERROR_DISPLAY`](super::MAX_ERROR_DISPLAY) bytes; a compile error
//! (`PersistentError::Compile`) carries the compiler's log, which resident-cuda keeps to
//! [`resident_cuda::MAX_LOG_BYTES`], and is judged against
//! [`MAX_COMPILE_ERROR_DISPLAY`](super::MAX_COMPILE_ERROR_DISPLAY) (that log after a header of
//! at most `MAX_ERROR_DISPLAY` bytes). A rendered translation unit holds the handler after its
//! `#line` and ends with the template; compiled PTX has both kernel entries.

use std::fmt::Write as _;

use resident_engine_cuda::persistent::template::TEMPLATE_BODY;
use resident_engine_cuda::persistent::{BufferDecl, KernelSource, MessageDecl, PersistentError};

use super::gen::{expr, Expr, Rng};
use super::sink::{Bytes, Sink};

/// The input message's C declaration (24 bytes).
const IN_DECL: &str =
    "typedef struct { unsigned int x; float y; double value; unsigned long long seq; } FuzzIn;";
/// The output message's C declaration (24 bytes).
const OUT_DECL: &str =
    "typedef struct { unsigned int x; float y; double value; unsigned long long seq; } FuzzOut;";
/// The handler state's C declaration (24 bytes).
const STATE_DECL: &str =
    "typedef struct { unsigned long long n; unsigned int hist[4]; } FuzzState;";
/// A keyed kernel's per-key state (24 bytes).
const KEY_DECL: &str = "typedef struct { double m; double v; unsigned long long n; } KeyStats;";

/// Where an input's text goes besides the handler (its first line `//fuzz:<field>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    /// The handler only (no first line naming a field).
    Handler,
    /// The handler, for a kernel with two bound buffers (`weights: float`, `hist: unsigned int`).
    Buffers,
    /// The handler, for a keyed kernel (key field `x`, key states `keys: KeyStats`).
    Keyed,
    /// The kernel's name.
    Name,
    /// The input type's name (its declaration names it too).
    TypeName,
    /// The state type's declaration (after `FuzzState`'s); the handler is then empty: a text
    /// that defines `handle` still makes a kernel.
    CDecl,
    /// The handler function's name.
    HandlerFn,
    /// A bound buffer's name.
    BufferName,
    /// A bound buffer's element type.
    BufferType,
    /// A declaration a bound buffer's element type needs.
    BufferDep,
    /// The key field of a keyed kernel.
    Key,
}

/// The first lines that name a field.
const FIELDS: &[(&str, Field)] = &[
    ("//fuzz:buffers\n", Field::Buffers),
    ("//fuzz:keyed\n", Field::Keyed),
    ("//fuzz:name\n", Field::Name),
    ("//fuzz:type\n", Field::TypeName),
    ("//fuzz:c_decl\n", Field::CDecl),
    ("//fuzz:handler_fn\n", Field::HandlerFn),
    ("//fuzz:buffer\n", Field::BufferName),
    ("//fuzz:buffer_type\n", Field::BufferType),
    ("//fuzz:buffer_dep\n", Field::BufferDep),
    ("//fuzz:key_field\n", Field::Key),
];

fn buffer(name: &str, c_type: &str, deps: &[&str], elem_size: usize) -> BufferDecl {
    BufferDecl {
        name: name.into(),
        c_type: c_type.into(),
        c_deps: deps.iter().map(|d| d.to_string()).collect(),
        elem_size,
    }
}

/// The kernel an input describes.
fn source_of(input: &[u8]) -> (Field, KernelSource) {
    // A handler's source is a Rust `String` (from Python, a `str`): mutated bytes are read as
    // UTF-8 with replacement characters.
    let text = String::from_utf8_lossy(input);
    let (field, rest) = FIELDS
        .iter()
        .find_map(|(head, f)| text.strip_prefix(head).map(|rest| (*f, rest)))
        .unwrap_or((Field::Handler, text.as_ref()));
    let handler = if field == Field::CDecl { "" } else { rest };
    let mut s = KernelSource::new(
        "fuzz",
        MessageDecl::new("FuzzIn", IN_DECL, 24),
        MessageDecl::new("FuzzOut", OUT_DECL, 24),
        MessageDecl::new("FuzzState", STATE_DECL, 24),
        handler,
        128,
    );
    let two_buffers = || {
        vec![
            buffer("weights", "float", &[], 4),
            buffer("hist", "unsigned int", &[], 4),
        ]
    };
    let keyed = |s: KernelSource, field: &str| {
        s.with_buffers(vec![buffer("keys", "KeyStats", &[KEY_DECL], 24)])
            .with_key_field(field)
    };
    let s = match field {
        Field::Handler => s,
        Field::Buffers => s.with_buffers(two_buffers()),
        Field::Keyed => keyed(s, "x"),
        Field::Name => {
            s.name = rest.to_string();
            s
        }
        Field::TypeName => {
            s.input = MessageDecl::new(
                rest,
                format!("typedef struct {{ unsigned int x; float y; double value; unsigned long long seq; }} {rest};"),
                24,
            );
            s
        }
        Field::CDecl => {
            s.state.c_decl = format!("{STATE_DECL}\n{rest}");
            s
        }
        Field::HandlerFn => {
            s.handler_fn = rest.to_string();
            s
        }
        Field::BufferName => s.with_buffers(vec![buffer(rest, "float", &[], 4)]),
        Field::BufferType => s.with_buffers(vec![buffer("w", rest, &[], 4)]),
        Field::BufferDep => s.with_buffers(vec![buffer("w", "KeyStats", &[KEY_DECL, rest], 24)]),
        Field::Key => keyed(s, rest),
    };
    (field, s)
}

/// The variant of a persistent-kernel error (every one is typed: the match is exhaustive).
fn kind(e: &PersistentError) -> &'static str {
    match e {
        PersistentError::Config { .. } => "Config",
        PersistentError::BoundBuffer { .. } => "BoundBuffer",
        PersistentError::Spawn { .. } => "Spawn",
        PersistentError::Ring(_) => "Ring",
        PersistentError::Memory { .. } => "Memory",
        PersistentError::NvrtcUnavailable(_) => "NvrtcUnavailable",
        PersistentError::DriverUnavailable(_) => "DriverUnavailable",
        PersistentError::Compile { .. } => "Compile",
        PersistentError::JitLinkUnavailable(_) => "JitLinkUnavailable",
        PersistentError::Link { .. } => "Link",
        PersistentError::Cuda(_) => "Cuda",
        PersistentError::DeviceFault { .. } => "DeviceFault",
        PersistentError::Exited { .. } => "Exited",
        PersistentError::InvalidState { .. } => "InvalidState",
        PersistentError::Sim(_) => "Sim",
        PersistentError::Timeout { .. } => "Timeout",
        PersistentError::CopyEngine { .. } => "CopyEngine",
        PersistentError::Include { .. } => "Include",
    }
}

const RENDER: &str = "KernelSource::render";
const COMPILE: &str = "compile_ptx(compute_90)";

/// Runs `input` through `render`, and through NVRTC when `compile`.
pub(crate) fn run(input: &[u8], sink: &mut dyn Sink, compile: bool) {
    let (field, source) = source_of(input);
    match source.render() {
        Ok(text) => {
            sink.accepted(RENDER);
            // `... #line 1 "handler.cu"\n<handler>\n// ---- template body ----\n#line 1
            // "persistent_ring.cu"\n<template>`, whatever the other fields hold.
            let placed = text
                .strip_suffix(TEMPLATE_BODY)
                .and_then(|t| {
                    t.strip_suffix("\n// ---- template body ----\n#line 1 \"persistent_ring.cu\"\n")
                })
                .and_then(|t| t.strip_suffix(source.handler.as_str()))
                .is_some_and(|t| t.ends_with("#line 1 \"handler.cu\"\n"));
            if !placed {
                sink.violation(
                    RENDER,
                    format_args!("the handler and the template are not at the end ({field:?})"),
                );
            }
            drop(text);
            if compile {
                nvrtc(&source, sink);
            }
        }
        Err(e @ PersistentError::Config { .. }) => sink.rejected(RENDER, kind(&e), &e),
        Err(e) => sink.violation(RENDER, format_args!("a {} error", kind(&e))),
    }
}

#[cfg(feature = "cuda")]
fn nvrtc(source: &KernelSource, sink: &mut dyn Sink) {
    use resident_engine_cuda::persistent::template::{compile_ptx, nvrtc_available};
    if nvrtc_available().is_err() {
        sink.skipped(COMPILE, "NVRTC not available");
        return;
    }
    match compile_ptx(source, "compute_90") {
        Ok(k) => {
            sink.accepted(COMPILE);
            for entry in [".entry resident_persistent", ".entry resident_batch"] {
                if !k.ptx.contains(entry) {
                    sink.violation(COMPILE, format_args!("the PTX lacks `{entry}`"));
                }
            }
        }
        Err(e @ PersistentError::Compile { .. }) => sink.rejected_with_log(COMPILE, kind(&e), &e),
        Err(PersistentError::NvrtcUnavailable(_)) => {
            sink.skipped(COMPILE, "NVRTC cannot compile (builtins library missing)")
        }
        // NVRTC refusing a program or an option: typed, short.
        Err(e @ PersistentError::Cuda(_)) => sink.rejected(COMPILE, kind(&e), &e),
        Err(e) => sink.violation(COMPILE, format_args!("a {} error", kind(&e))),
    }
}

#[cfg(not(feature = "cuda"))]
fn nvrtc(_: &KernelSource, sink: &mut dyn Sink) {
    sink.skipped(COMPILE, "built without the cuda feature");
}

/// Tokens of CUDA C, for the mutator. None repeats (the mutator's huge runs) into a chain that
/// NVRTC recurses on and the template's checks (brackets, statements without braces, operator
/// runs) do not bound: `x = x = ...` and `a ? b : a ? b : ...` overflow a 512 MiB stack past
/// some 100 000 levels, a known limit of compiling in-process.
pub(crate) const DICT: &[&str] = &[
    "__device__ ",
    "__forceinline__ ",
    "__shared__ ",
    "__constant__ ",
    "__global__ ",
    "extern \"C\" ",
    "template <typename T> ",
    "static_assert(",
    "bool ",
    "unsigned int ",
    "unsigned long long ",
    "float ",
    "double ",
    "const ",
    "volatile ",
    "struct ",
    "typedef ",
    "return ",
    "true",
    "false",
    "if (",
    "else ",
    "for (int i = 0; i < 4; ++i) ",
    "while (",
    "switch (",
    "case 0: ",
    "default: ",
    "break;",
    "goto ",
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    ";",
    ",",
    "->",
    "*",
    "&",
    "<<",
    ">>",
    "::",
    "in->x",
    "in->value",
    "out->y",
    "s->n",
    "s->hist[3]",
    "env->message_id",
    "env->priority",
    "ks->m",
    "b->weights[0]",
    "b->hist_len",
    "FuzzIn",
    "FuzzOut",
    "FuzzState",
    "KeyStats",
    "Envelope",
    "ResidentIn",
    "ResidentOut",
    "ResidentState",
    "ResidentBuffers",
    "KeyState",
    "RESIDENT_BATCH",
    "RESIDENT_HANDLER",
    "atomicAdd(&",
    "atomicCAS(",
    "__syncthreads();",
    "__trap();",
    "__nanosleep(100);",
    "__popc(",
    "__shfl_sync(0xffffffffu, ",
    "threadIdx.x",
    "blockIdx.x",
    "printf(\"%u\\n\", ",
    "sqrt(",
    "fabs(",
    "1u",
    "0xffffffffu",
    "1ull",
    "-1",
    "1e308",
    "0.5f",
    "'\\0'",
    "\"",
    "'",
    "\\",
    "/*",
    "*/",
    "//",
    "\n",
    "#define X ",
    "#undef X\n",
    "#if 0\n",
    "#endif\n",
    "#pragma unroll\n",
    "#line 1\n",
    "#error boom\n",
    "#warning hm\n",
    "__attribute__((aligned(8))) ",
    "((((((((",
    "))))))))",
    "!!!!!!!!",
    "handle",
    "handler",
    "x",
    "keys",
    "weights",
    "\u{e9}",
    "\u{feff}",
];

const STMTS: &[&str] = &[
    "out->x = in->x + 1u;",
    "out->y = in->y * 0.5f;",
    "out->value = sqrt(fabs(in->value));",
    "out->seq = env->message_id;",
    "atomicAdd(&s->n, 1ull);",
    "atomicAdd(&s->hist[in->x & 3u], 1u);",
    "if (in->x > 3u) return false;",
    "for (int i = 0; i < 4; ++i) out->x += (unsigned int)i;",
    "switch (in->x) { case 0: out->y = 1.0f; break; default: break; }",
    "unsigned int t = in->x; t ^= t >> 3; out->x = t;",
    "out->x = __popc(in->x) + __clz(in->x);",
    "out->y = __int_as_float(in->x & 0x3f7fffffu);",
    "out->x = env->priority;",
    "out->x = max(in->x, 7u) - min(in->x, 3u);",
    "double w = (double)in->y; out->value = w * w;",
    "out->seq = in->seq + (unsigned long long)in->x;",
    "const unsigned int k = 1u << 31; out->x |= k;",
    "unsigned int a[4] = {0u, 1u, 2u, 3u}; out->x = a[in->x % 4u];",
    "#pragma unroll\nfor (int i = 0; i < 8; ++i) out->y += (float)i;",
    "static_assert(sizeof(FuzzIn) == 24, \"FuzzIn\");",
    "out->x = RESIDENT_BATCH;",
    "(void)s; (void)env;",
    // Errors a user makes.
    "out->z = 1u;",
    "float bad = in;",
    "return;",
    "out->x = undefined_name;",
    "out->x = in->x / 0u;",
    "in->x = 1u;",
    "static_assert(sizeof(FuzzIn) == 8, \"not 8 bytes\");",
    "out->x = \"text\";",
    "int unused_variable;",
];

const BUFFER_STMTS: &[&str] = &[
    "out->y = b->weights[in->x % b->weights_len];",
    "atomicAdd(&b->hist[in->x % b->hist_len], 1u);",
    "out->seq = b->weights_id ^ b->hist_id;",
    "b->weights[0] += in->y;",
];

const KEY_STMTS: &[&str] = &[
    "ks->n += 1ull;",
    "ks->m = ks->m + 0.01 * (in->value - ks->m);",
    "out->value = ks->v;",
    "if (ks->n == 0ull) return false;",
];

/// C expressions for [`expr`].
const EXPR: Expr = Expr {
    leaves: &[
        "in->x",
        "1u",
        "0u",
        "4294967295u",
        "7u",
        "(unsigned int)in->y",
        "(unsigned int)env->flags",
        "2147483648u",
        "out->x",
    ],
    select: ["(in->x > 2u ? ", " : ", ")"],
    ops: &[
        " + ", " * ", " ^ ", " & ", " << ", " % ", " - ", " == ", " / ",
    ],
};

/// A text for a name field: an identifier (sometimes long), or not one.
fn name(rng: &mut Rng, out: &mut Vec<u8>) {
    match rng.below(6) {
        0 => out.extend_from_slice(
            rng.pick(&["", "1x", "a b", "a-b", "x\u{e9}", "_"])
                .as_bytes(),
        ),
        1 => {
            out.push(b'n');
            let n = 60 + rng.below(8192);
            out.extend(std::iter::repeat_n(b'x', n));
        }
        _ => out.extend_from_slice(
            rng.pick(&[
                "fuzz", "Ping", "handle", "keys", "x", "value", "FuzzIn", "w",
            ])
            .as_bytes(),
        ),
    }
}

/// A ring handler built of statements that mostly compile, with expressions of random depth,
/// sometimes a helper, a macro or a stray kernel; one in four names another field first.
pub(crate) fn generate(rng: &mut Rng, out: &mut Vec<u8>) {
    let field = if rng.one_in(4) {
        let (head, f) = FIELDS[rng.below(FIELDS.len())];
        out.extend_from_slice(head.as_bytes());
        f
    } else {
        Field::Handler
    };
    // A name field gets a name most of the time (the handler text is then that name too).
    if matches!(
        field,
        Field::Name
            | Field::TypeName
            | Field::HandlerFn
            | Field::BufferName
            | Field::BufferType
            | Field::Key
    ) && !rng.one_in(4)
    {
        name(rng, out);
        return;
    }
    let mut b = Bytes(out);
    if rng.one_in(4) {
        let _ = writeln!(
            b,
            "__device__ __forceinline__ unsigned int helper(unsigned int a) {{ return a * 3u + 1u; }}"
        );
    }
    if rng.one_in(6) {
        let _ = writeln!(b, "#define TWICE(v) ((v) + (v))");
    }
    if rng.one_in(10) {
        let _ = writeln!(
            b,
            "extern \"C\" __global__ void stray(unsigned int* p) {{ p[threadIdx.x] = 0u; }}"
        );
    }
    let (state, extra, stmts): (&str, &str, &[&str]) = match field {
        Field::Buffers => ("FuzzState* s", ", ResidentBuffers* b", BUFFER_STMTS),
        Field::Keyed => ("KeyStats* ks", "", KEY_STMTS),
        _ => ("FuzzState* s", "", &[]),
    };
    let name = if rng.one_in(10) { "handler" } else { "handle" };
    let _ = writeln!(
        b,
        "__device__ bool {name}({state}, const FuzzIn* in, FuzzOut* out, const Envelope* env{extra}) {{"
    );
    for _ in 0..rng.small_len(16) {
        if rng.one_in(3) {
            b.0.extend_from_slice(b"    out->x = ");
            let depth = rng.small_len(12);
            expr(rng, b.0, depth, &EXPR);
            b.0.extend_from_slice(b";\n");
        } else if !stmts.is_empty() && rng.one_in(2) {
            let _ = writeln!(b, "    {}", stmts[rng.below(stmts.len())]);
        } else {
            let _ = writeln!(b, "    {}", STMTS[rng.below(STMTS.len())]);
        }
    }
    let ret = ["true", "false", "out->x > 1u", "in->x", "1u"];
    let _ = writeln!(b, "    return {};\n}}", ret[rng.below(ret.len())]);
}
