//! The CUDA C translation unit of a ring kernel: a generated prelude (wire structs, the user's
//! message types, `static_assert`s on every size, the user's handler) followed by the template
//! body `kernels/persistent_ring.cu`, which defines two kernels:
//! * `resident_persistent(PersistentParams)`: the persistent ring kernel (launched once);
//! * `resident_batch(in, n, out, out_count, state, scan)`: the launch-per-batch baseline (also
//!   the node of the CUDA-graph baseline), on a grid of `ceil(n / batch)` blocks.
//!
//! [`compile_ptx`] compiles it with NVRTC, loaded at run time.

use std::fmt::Write as _;

use resident_ring::envelope::ENVELOPE_C_DECL;
use resident_ring::spsc::RING_HEADER_C_DECL;
use resident_ring::Slot;

use super::control::CONTROL_BLOCK_C_DECL;
use super::{PersistentError, MAX_LANES};

/// The template body.
pub const TEMPLATE_BODY: &str = include_str!("../../kernels/persistent_ring.cu");

/// Name of the persistent kernel in the compiled module.
pub const PERSISTENT_KERNEL_NAME: &str = "resident_persistent";
/// Name of the launch-per-batch kernel in the compiled module.
pub const BATCH_KERNEL_NAME: &str = "resident_batch";

/// Launch parameters of the persistent kernel, passed by value. Device addresses are `u64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PersistentParams {
    /// Device address of each input lane's ring (header first); unused lanes 0.
    pub lanes: [u64; MAX_LANES],
    /// Device address of the output ring.
    pub out: u64,
    /// Device address of the control block.
    pub control: u64,
    /// Device address of the handler state.
    pub state: u64,
    /// Number of lanes, `1 ..= 8`.
    pub lane_count: u32,
    /// Slots per lane (power of two).
    pub lane_capacity: u32,
    /// Slots in the output ring (power of two, at least the batch size).
    pub out_capacity: u32,
    /// Longest idle `__nanosleep`, in nanoseconds.
    pub max_backoff_ns: u32,
    /// Longest time between control-block checks while busy, in nanoseconds of `%globaltimer`.
    pub control_poll_ns: u64,
    /// Device address of the kernel's `ResidentBuffers` table (see [`BufferDecl`]); 0 when the
    /// kernel has no bound buffers.
    pub buffers: u64,
    /// Device address of each lane's bulk device ring (`lane_capacity` plain slots; see
    /// [`super::bulk`]); unused lanes 0.
    pub bulk_slots: [u64; MAX_LANES],
    /// Device address of the bulk tails line (device memory); 0: the kernel has no bulk lanes.
    pub bulk_tails: u64,
    /// Device address of the bulk heads line (pinned host memory); 0 with `bulk_tails`.
    pub bulk_heads: u64,
}

const _: () = assert!(core::mem::size_of::<PersistentParams>() == 200);

/// The C declaration of [`PersistentParams`].
pub const PERSISTENT_PARAMS_C_DECL: &str = "typedef struct {
    unsigned long long lanes[8];
    unsigned long long out;
    unsigned long long control;
    unsigned long long state;
    unsigned int lane_count;
    unsigned int lane_capacity;
    unsigned int out_capacity;
    unsigned int max_backoff_ns;
    unsigned long long control_poll_ns;
    unsigned long long buffers;
    unsigned long long bulk_slots[8];
    unsigned long long bulk_tails;
    unsigned long long bulk_heads;
} PersistentParams;
";

/// A C type the kernel uses: its name, its declaration and the size Rust gives it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MessageDecl {
    /// The C type name (an identifier), e.g. `Ping`.
    pub name: String,
    /// The declaration, e.g. `typedef struct { unsigned int x; } Ping;`. Empty when the type
    /// is declared by another `MessageDecl` of the same kernel (same name).
    pub c_decl: String,
    /// `size_of` the Rust type; the kernel `static_assert`s it.
    pub size: usize,
}

impl MessageDecl {
    /// A declaration with an explicit size.
    pub fn new(name: impl Into<String>, c_decl: impl Into<String>, size: usize) -> Self {
        MessageDecl {
            name: name.into(),
            c_decl: c_decl.into(),
            size,
        }
    }

    /// A declaration whose size is `size_of::<T>()`.
    pub fn of<T>(name: impl Into<String>, c_decl: impl Into<String>) -> Self {
        Self::new(name, c_decl, core::mem::size_of::<T>())
    }

    /// Size of a ring slot holding this type (`Slot<T>` for `T` aligned to at most 8).
    pub fn slot_size(&self) -> usize {
        32 + self.size.div_ceil(8) * 8
    }
}

/// A buffer bound to a ring kernel, as its handler sees it: a member `T* <name>` of the
/// `ResidentBuffers` struct, with `<name>_len` (elements) and `<name>_id` (the buffer's
/// registry id, what a message carries to name it) next to it.
///
/// The table the kernel reads is [`BUFFER_ENTRY_BYTES`] per buffer, in declaration order:
/// the element pointer (a device address), the length in elements, the id, each a `u64`
/// ([`buffer_table_bytes`] writes it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BufferDecl {
    /// The member name (a C identifier).
    pub name: String,
    /// The element's C type name (`float`, `unsigned int`, `SensorStats`).
    pub c_type: String,
    /// C declarations the element type needs first, in order (emitted once per kernel, after
    /// the message and state declarations, skipping any already emitted).
    pub c_deps: Vec<String>,
    /// `size_of` the Rust element type; the kernel `static_assert`s it.
    pub elem_size: usize,
}

/// A bound buffer's values at launch and the numbers its table entry carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BufferInit {
    /// The buffer's registry id (`<name>_id` in the handler).
    pub id: u64,
    /// Elements (`<name>_len`).
    pub len: usize,
    /// The device copy starts as these bytes: exactly `len * elem_size`.
    pub initial: Vec<u8>,
}

/// Bytes per buffer in the `ResidentBuffers` table: pointer, length, id.
pub const BUFFER_ENTRY_BYTES: usize = 24;

/// The `ResidentBuffers` table for buffers at device addresses `ptrs`, with lengths `lens`
/// (elements) and ids `ids` (same order as the source's [`KernelSource::buffers`]).
pub fn buffer_table_bytes(entries: &[(u64, u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len().max(1) * BUFFER_ENTRY_BYTES);
    for (ptr, len, id) in entries {
        out.extend_from_slice(&ptr.to_ne_bytes());
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&id.to_ne_bytes());
    }
    out
}

/// Everything that defines one ring kernel's source.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelSource {
    /// Kernel name, for errors and the NVRTC program name.
    pub name: String,
    /// Input message type.
    pub input: MessageDecl,
    /// Output message type.
    pub output: MessageDecl,
    /// Handler state type (lives in device memory; all threads of a batch share it, so a
    /// handler that mutates it must use atomics).
    pub state: MessageDecl,
    /// CUDA C defining `__device__ bool <handler_fn>(State*, const In*, Out*, const Envelope*)`,
    /// or with a fifth parameter `ResidentBuffers*` when [`buffers`](Self::buffers) is not
    /// empty.
    pub handler: String,
    /// Name of the handler function.
    pub handler_fn: String,
    /// Block size = most messages per batch: a multiple of 32 in `32 ..= 1024`.
    pub batch_size: u32,
    /// Buffers bound to the kernel. When there are any, the handler takes a fifth argument,
    /// `ResidentBuffers* buffers` (see [`BufferDecl`]); with none it keeps the four-argument
    /// form.
    pub buffers: Vec<BufferDecl>,
    /// A keyed kernel: the field of the input message that names its key. The per-key states
    /// are the first bound buffer, which must be named `keys`; the handler is then
    /// `__device__ bool <handler_fn>(KeyState* ks, const ResidentIn*, ResidentOut*,
    /// const Envelope*)`, `KeyState` being the buffer's element type, and messages of one key
    /// are handled in batch order (one round per message of the busiest key of the batch).
    pub key_field: Option<String>,
    /// A handler compiled outside the template (a Python function compiled by Numba) that the
    /// handler text calls: see [`ExternalFn`].
    pub external: Option<ExternalFn>,
}

/// A function compiled outside the template that the handler calls by its C name, with the C
/// signature [`EXTERNAL_FN_SIGNATURE`]: `int symbol(void* state, const void* in, void* out,
/// const void* env)`, nonzero to send `out` (the Python package's `numba=` handlers: Numba
/// compiles the user's function once per engine). The template declares it (the handler text
/// must not): on a GPU as an `extern "C" __device__` function that nvJitLink links in from
/// [`ltoir`](Self::ltoir); on CudaSim as a function pointer the launcher sets, in each loaded
/// copy of the module, to [`host_fn`](Self::host_fn).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExternalFn {
    /// The C name (an identifier).
    pub symbol: String,
    /// The function as LTO-IR for the real architecture it names (`sm_90`): what nvJitLink
    /// links with the template's own LTO-IR into the kernel's machine code. `None`: the kernel
    /// cannot run on a GPU.
    pub ltoir: Option<(String, Vec<u8>)>,
    /// CudaSim: the address of a native function of this process with the same C signature,
    /// which must stay callable for as long as any kernel of this source runs. `None`: the
    /// kernel cannot run on CudaSim.
    pub host_fn: Option<usize>,
}

/// The C signature of an [`ExternalFn`], as the template declares it (`%s` its name).
pub const EXTERNAL_FN_SIGNATURE: &str =
    "int %s(void* state, const void* in, void* out, const void* env)";

/// The CudaSim module's function pointer an [`ExternalFn`] named `symbol` is called through.
pub fn external_pointer_name(symbol: &str) -> String {
    format!("{symbol}_resident_host_fn")
}

/// The deepest a kernel's source text (handler, type declarations) may nest brackets (`(`, `[`,
/// `{` together, outside comments and literals) and statements without braces (`for`, `while`,
/// `if`, `do`, `switch`, `template` before the statement's end). NVRTC's parser recurses once
/// per level and takes 1 to 2 KiB of its thread's stack for each: 1024 nested parentheses
/// abort a process whose compiling thread has a 2 MiB stack (found by `resident fuzz --target
/// cuda`); its optimizer takes far more per nested loop (1000 nested `for` overflow even a
/// 512 MiB stack).
pub const MAX_NESTING: usize = 256;

/// The most operator characters a kernel's source text may hold in a row (outside comments and
/// literals, whitespace between them counted as nothing): each prefix operator of a chain
/// (`!!!!x`, `- - - -x`, `****p`) is another level of NVRTC's recursion, like a bracket.
pub const MAX_OPERATOR_RUN: usize = 256;

/// The most assignments, conditional operators and casts one statement may chain (outside
/// comments and literals): each is another level of NVRTC's recursion, and long chains
/// (`a = a = a = ...`, `c ? x : c ? x : ...`, `(int)(int)(int)x`) kept its parser busy for
/// minutes (`resident fuzz --target cuda`). Counted: an `=` that is not part of `==`, `<=`,
/// `>=` or `!=`; a `?`; a `)` followed by `(`, a name or a number.
pub const MAX_CHAIN: usize = 256;

/// Where `text` nests deeper than [`MAX_NESTING`], runs more than [`MAX_OPERATOR_RUN`]
/// operator characters or chains more than [`MAX_CHAIN`] in a statement: its line (from 1) and
/// what it does. A C lexer's view, simplified:
/// comments, string and character literals are skipped; digit separators (`1'000`) and raw
/// strings may be misread, which can only miss a deep nesting inside them.
fn too_deep(text: &str) -> Option<(usize, &'static str)> {
    #[derive(Clone, Copy, PartialEq)]
    enum At {
        Code,
        LineComment,
        BlockComment,
        Literal(u8),
    }
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || !b.is_ascii();
    let bytes = text.as_bytes();
    let (mut at, mut line, mut i) = (At::Code, 1usize, 0usize);
    // Brackets open; statements opened without braces since the last `;`, `{` or `}`;
    // parentheses open (a `;` inside them, as in `for (;;)`, ends no statement); operator
    // characters in a row.
    let (mut depth, mut chain, mut parens, mut run) = (0usize, 0usize, 0usize, 0usize);
    // Assignments, conditionals and casts since the statement began.
    let mut links = 0usize;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\n' {
            line += 1;
        }
        match at {
            At::LineComment if b == b'\n' => at = At::Code,
            At::BlockComment if b == b'*' && bytes.get(i + 1) == Some(&b'/') => {
                at = At::Code;
                i += 1;
            }
            At::Literal(_) if b == b'\\' => i += 1,
            At::Literal(q) if b == q || b == b'\n' => at = At::Code,
            At::LineComment | At::BlockComment | At::Literal(_) => {}
            At::Code => match b {
                b'/' if bytes.get(i + 1) == Some(&b'/') => at = At::LineComment,
                b'/' if bytes.get(i + 1) == Some(&b'*') => {
                    at = At::BlockComment;
                    i += 1;
                }
                b'"' | b'\'' => {
                    at = At::Literal(b);
                    run = 0;
                }
                b if b.is_ascii_whitespace() => {}
                b if word(b) => {
                    let start = i;
                    while bytes.get(i + 1).is_some_and(|&b| word(b)) {
                        i += 1;
                    }
                    run = 0;
                    if matches!(
                        &bytes[start..=i],
                        b"for" | b"while" | b"if" | b"do" | b"switch" | b"template"
                    ) {
                        chain += 1;
                        // A statement of its own begins: its chain counts from nothing.
                        links = 0;
                    }
                }
                _ => {
                    match b {
                        b'(' => {
                            depth += 1;
                            parens += 1;
                        }
                        b')' => {
                            depth = depth.saturating_sub(1);
                            parens = parens.saturating_sub(1);
                        }
                        b'[' => depth += 1,
                        b']' => depth = depth.saturating_sub(1),
                        b'{' => {
                            depth += 1;
                            chain = 0;
                            links = 0;
                        }
                        b'}' => {
                            depth = depth.saturating_sub(1);
                            chain = 0;
                            links = 0;
                        }
                        b';' if parens == 0 => {
                            chain = 0;
                            links = 0;
                        }
                        b'=' => {
                            let prev = if i > 0 { bytes[i - 1] } else { b' ' };
                            let next = bytes.get(i + 1).copied().unwrap_or(b' ');
                            if !matches!(prev, b'=' | b'<' | b'>' | b'!') && next != b'=' {
                                links += 1;
                            }
                        }
                        b'?' => links += 1,
                        _ => {}
                    }
                    if b == b')' {
                        let next = bytes[i + 1..].iter().find(|c| !c.is_ascii_whitespace());
                        if next.is_some_and(|&c| c == b'(' || word(c)) {
                            links += 1;
                        }
                    }
                    if links > MAX_CHAIN {
                        return Some((
                            line,
                            "chains more than 256 assignments, conditional operators or casts in one statement",
                        ));
                    }
                    run += 1;
                    if run > MAX_OPERATOR_RUN && depth + chain <= MAX_NESTING {
                        return Some((line, "holds more than 256 operator characters in a row"));
                    }
                }
            },
        }
        if depth + chain > MAX_NESTING {
            return Some((line, "nests brackets or statements deeper than 256"));
        }
        i += 1;
    }
    None
}

/// Whether `s` is a C identifier (letters, digits, `_`; not starting with a digit).
pub fn is_c_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl KernelSource {
    /// A kernel source for a handler named `handle`.
    pub fn new(
        name: impl Into<String>,
        input: MessageDecl,
        output: MessageDecl,
        state: MessageDecl,
        handler: impl Into<String>,
        batch_size: u32,
    ) -> Self {
        KernelSource {
            name: name.into(),
            input,
            output,
            state,
            handler: handler.into(),
            handler_fn: "handle".into(),
            batch_size,
            buffers: Vec::new(),
            key_field: None,
            external: None,
        }
    }

    /// The same source calling `f` (see [`ExternalFn`]); the handler text calls it by name.
    pub fn with_external(mut self, f: ExternalFn) -> Self {
        self.external = Some(f);
        self
    }

    /// The same source with `buffers` bound (the handler takes `ResidentBuffers*`).
    pub fn with_buffers(mut self, buffers: Vec<BufferDecl>) -> Self {
        self.buffers = buffers;
        self
    }

    /// The same source as a keyed kernel whose messages name their key in field `field` (see
    /// [`KernelSource::key_field`]).
    pub fn with_key_field(mut self, field: impl Into<String>) -> Self {
        self.key_field = Some(field.into());
        self
    }

    /// Checks the inputs the generated code relies on.
    pub fn validate(&self) -> Result<(), PersistentError> {
        // Names come from users: errors quote at most 64 bytes of each.
        use resident_ring::message::quoted_name as q;
        let bad = |m: String| {
            Err(PersistentError::config(format!(
                "kernel `{}`: {m}",
                q(&self.name)
            )))
        };
        if !self.batch_size.is_multiple_of(32) || !(32..=1024).contains(&self.batch_size) {
            return bad(format!(
                "batch size {} is not a multiple of 32 in 32..=1024",
                self.batch_size
            ));
        }
        for d in [&self.input, &self.output, &self.state] {
            if !is_c_identifier(&d.name) {
                return bad(format!("`{}` is not a C identifier", q(&d.name)));
            }
            if d.size == 0 {
                return bad(format!("type `{}` has size 0", q(&d.name)));
            }
        }
        if !is_c_identifier(&self.handler_fn) {
            return bad(format!("`{}` is not a C identifier", q(&self.handler_fn)));
        }
        for (i, b) in self.buffers.iter().enumerate() {
            if !is_c_identifier(&b.name) {
                return bad(format!("bound buffer `{}`: not a C identifier", q(&b.name)));
            }
            if self.buffers[..i].iter().any(|o| o.name == b.name) {
                return bad(format!("bound buffer `{}` is declared twice", q(&b.name)));
            }
            let type_ok = !b.c_type.is_empty()
                && b.c_type
                    .split(' ')
                    .all(|w| !w.is_empty() && is_c_identifier(w));
            if !type_ok {
                return bad(format!(
                    "bound buffer `{}`: element type `{}` is not a C type name (arrays must be wrapped in a struct)",
                    q(&b.name),
                    q(&b.c_type)
                ));
            }
            if b.elem_size == 0 {
                return bad(format!("bound buffer `{}`: element size 0", q(&b.name)));
            }
            if b.c_deps.iter().any(|d| d.contains('\0')) {
                return bad("source text contains a NUL byte".into());
            }
        }
        if let Some(f) = &self.key_field {
            if !is_c_identifier(f) {
                return bad(format!("key field `{}` is not a C identifier", q(f)));
            }
            if self.buffers.first().map(|b| b.name.as_str()) != Some("keys") {
                return bad(
                    "a keyed kernel's first bound buffer must be its key states, `keys`".into(),
                );
            }
        }
        if let Some(f) = &self.external {
            if !is_c_identifier(&f.symbol) {
                return bad(format!(
                    "external function `{}` is not a C identifier",
                    q(&f.symbol)
                ));
            }
            if !self.buffers.is_empty() && self.key_field.is_none() {
                return bad(
                    "an external function takes no bound buffers (state, in, out, env only)".into(),
                );
            }
        }
        let texts = [
            &self.name,
            &self.handler,
            &self.input.c_decl,
            &self.output.c_decl,
            &self.state.c_decl,
        ];
        if texts.iter().any(|t| t.contains('\0')) {
            return bad("source text contains a NUL byte".into());
        }
        // NVRTC's parser recurses per nesting level: a deep enough text overflows its stack.
        let named = [
            ("the handler", &self.handler),
            ("the input type's declaration", &self.input.c_decl),
            ("the output type's declaration", &self.output.c_decl),
            ("the state type's declaration", &self.state.c_decl),
        ];
        let deps = self
            .buffers
            .iter()
            .flat_map(|b| &b.c_deps)
            .map(|d| ("a bound buffer's type declaration", d));
        for (what, text) in named.into_iter().chain(deps) {
            // Users' text reads nothing from the host's disk (see `untrusted`).
            if let Some(f) = super::untrusted::forbidden_file(text) {
                return Err(PersistentError::Include {
                    name: self.name.clone(),
                    what,
                    line: f.line,
                    directive: f.directive,
                    file: f.name,
                });
            }
            if let Some((line, why)) = too_deep(text) {
                return bad(format!(
                    "{what} {why} (line {line}); the CUDA compiler's parser would overflow its stack"
                ));
            }
        }
        Ok(())
    }

    /// The whole translation unit.
    pub fn render(&self) -> Result<String, PersistentError> {
        self.validate()?;
        let mut s = String::with_capacity(TEMPLATE_BODY.len() + 4096);
        // The kernel's name is not part of the text: kernels of one handler share one module
        // (compiled, cached and loaded once: a module load waits for the device, see
        // `crate::hazards`).
        s.push_str("// Generated by resident-cuda for a ring kernel.\n");
        let _ = writeln!(s, "#define RESIDENT_BATCH {}", self.batch_size);
        let _ = writeln!(s, "#define RESIDENT_HANDLER {}", self.handler_fn);
        s.push_str(&tuning_defines(std::env::var(TUNING_ENV).ok().as_deref())?);
        s.push_str(&super::control::c_state_defines());
        s.push_str(ENVELOPE_C_DECL);
        s.push_str(RING_HEADER_C_DECL);
        s.push_str(CONTROL_BLOCK_C_DECL);
        s.push_str(PERSISTENT_PARAMS_C_DECL);
        s.push_str("static_assert(sizeof(Envelope) == 32, \"Envelope layout\");\n");
        s.push_str("static_assert(sizeof(RingHeader) == 256, \"RingHeader layout\");\n");
        s.push_str("static_assert(sizeof(ControlBlock) == 256, \"ControlBlock layout\");\n");
        s.push_str(
            "static_assert(sizeof(PersistentParams) == 200, \"PersistentParams layout\");\n",
        );
        let mut declared: Vec<&str> = Vec::new();
        for d in [&self.input, &self.output, &self.state] {
            if !declared.contains(&d.name.as_str()) {
                declared.push(&d.name);
                s.push_str(&d.c_decl);
                s.push('\n');
            }
            let _ = writeln!(
                s,
                "static_assert(sizeof({n}) == {z}, \"C type `{n}` is not the {z} bytes of its Rust type\");",
                n = d.name,
                z = d.size
            );
        }
        for b in &self.buffers {
            for d in &b.c_deps {
                // The element's declarations once, after the message and state types (which
                // may already declare the same struct with the same text).
                if !s.contains(d.as_str()) {
                    s.push_str(d);
                    s.push('\n');
                }
            }
            let _ = writeln!(
                s,
                "static_assert(sizeof({t}) == {z}, \"element type `{t}` of bound buffer `{n}` is not the {z} bytes of its Rust type\");",
                t = b.c_type,
                z = b.elem_size,
                n = b.name
            );
        }
        if self.buffers.is_empty() {
            s.push_str("typedef struct { unsigned long long unused; } ResidentBuffers;\n");
            s.push_str("#define RESIDENT_CALL(st, in, out, env, bufs) RESIDENT_HANDLER(st, in, out, env)\n");
        } else {
            s.push_str("typedef struct {\n");
            for b in &self.buffers {
                let _ = writeln!(
                    s,
                    "    {t}* {n};\n    unsigned long long {n}_len;\n    unsigned long long {n}_id;",
                    t = b.c_type,
                    n = b.name
                );
            }
            s.push_str("} ResidentBuffers;\n");
            let _ = writeln!(
                s,
                "static_assert(sizeof(ResidentBuffers) == {}, \"ResidentBuffers layout\");",
                self.buffers.len() * BUFFER_ENTRY_BYTES
            );
            s.push_str("#define RESIDENT_HAS_BUFFERS 1\n");
            match &self.key_field {
                // A keyed kernel's handler gets its key's state (checked by `validate`: the
                // first buffer is `keys`); the template runs one key's messages in order.
                Some(f) => {
                    let _ = writeln!(s, "typedef {} KeyState;", self.buffers[0].c_type);
                    s.push_str("#define RESIDENT_KEYED 1\n");
                    let _ = writeln!(
                        s,
                        "#define RESIDENT_KEY_OF(in) ((unsigned int)((in)->{f}))"
                    );
                    s.push_str("#define RESIDENT_CALL(st, in, out, env, bufs) RESIDENT_HANDLER(&(bufs)->keys[RESIDENT_KEY_OF(in)], in, out, env)\n");
                }
                None => s.push_str("#define RESIDENT_CALL(st, in, out, env, bufs) RESIDENT_HANDLER(st, in, out, env, bufs)\n"),
            }
        }
        let _ = writeln!(s, "typedef {} ResidentIn;", self.input.name);
        let _ = writeln!(s, "typedef {} ResidentOut;", self.output.name);
        let _ = writeln!(s, "typedef {} ResidentState;", self.state.name);
        s.push_str("typedef struct { Envelope env; ResidentIn payload; } InSlot;\n");
        s.push_str("typedef struct { Envelope env; ResidentOut payload; } OutSlot;\n");
        let _ = writeln!(
            s,
            "static_assert(sizeof(InSlot) == {}, \"input slot size differs from Rust's Slot<In>\");",
            self.input.slot_size()
        );
        let _ = writeln!(
            s,
            "static_assert(sizeof(OutSlot) == {}, \"output slot size differs from Rust's Slot<Out>\");",
            self.output.slot_size()
        );
        // `#line` so compiler diagnostics (NVRTC's and the host compiler's) name the handler's
        // own lines and the template's.
        if let Some(f) = &self.external {
            // On CudaSim a pointer the launcher sets per loaded copy (`external_pointer_name`),
            // called through a function of the same name; on a GPU a function nvJitLink links in.
            let sig = |name: &str| EXTERNAL_FN_SIGNATURE.replace("%s", name);
            let ptr = external_pointer_name(&f.symbol);
            let _ = writeln!(
                s,
                "#ifdef RESIDENT_SIM\nextern \"C\" {{ __attribute__((visibility(\"default\"))) int (*{ptr})(void*, const void*, void*, const void*) = 0; }}\nstatic __device__ {} {{ return {ptr}(state, in, out, env); }}\n#else\nextern \"C\" __device__ {};\n#endif",
                sig(&f.symbol),
                sig(&f.symbol)
            );
        }
        s.push_str("// ---- user handler ----\n#line 1 \"handler.cu\"\n");
        s.push_str(&self.handler);
        s.push_str("\n// ---- template body ----\n#line 1 \"persistent_ring.cu\"\n");
        s.push_str(TEMPLATE_BODY);
        Ok(s)
    }
}

/// The environment variable that overrides the template's tuning constants, for measuring
/// them on a device without a rebuild: space-separated `NAME=VALUE` pairs, each NAME one of
/// [`TUNABLES`] and each VALUE a decimal number up to 64, e.g.
/// `RESIDENT_CUDA_DEFINES="RESIDENT_FAST_POLL=0 RESIDENT_LL_PREFETCH=4"`. They become
/// `#define`s of the rendered text, so the kernel cache keys on them too.
pub const TUNING_ENV: &str = "RESIDENT_CUDA_DEFINES";

/// The template's tuning constants (each `#ifndef`-guarded in `kernels/persistent_ring.cu`):
/// * `RESIDENT_FAST_POLL`: 1 (the default) polls each empty lane's head slot by its LL flags
///   (one bus read finds a message); 0 polls the tails alone (two dependent reads).
/// * `RESIDENT_LL_PREFETCH`: LL copy rounds a warp issues before it stages the first (12).
/// * `RESIDENT_PREFETCH`: the same for the peer ring's plain slots (8).
pub const TUNABLES: [&str; 3] = [
    "RESIDENT_FAST_POLL",
    "RESIDENT_LL_PREFETCH",
    "RESIDENT_PREFETCH",
];

/// The `#define` lines of a [`TUNING_ENV`] value (none for `None` or blank); anything but
/// [`TUNABLES`] with values 0..=64 is refused with a typed error naming the first bad pair.
fn tuning_defines(value: Option<&str>) -> Result<String, PersistentError> {
    let mut s = String::new();
    let mut seen: Vec<&str> = Vec::new();
    for pair in value.unwrap_or("").split_whitespace() {
        let parsed = pair.split_once('=').and_then(|(name, v)| {
            let n = v.parse::<u32>().ok().filter(|n| *n <= 64 && v.len() <= 2)?;
            (TUNABLES.contains(&name) && !seen.contains(&name)).then_some((name, n))
        });
        let Some((name, n)) = parsed else {
            return Err(PersistentError::config(format!(
                "{TUNING_ENV}: `{}` is not NAME=VALUE with NAME one of {} (each once) and VALUE 0..=64",
                resident_ring::message::quoted_name(pair),
                TUNABLES.join(", ")
            )));
        };
        seen.push(name);
        let _ = writeln!(s, "#define {name} {n}u");
    }
    Ok(s)
}

/// Size of `Slot<T>` as Rust lays it out (what [`MessageDecl::slot_size`] must agree with).
pub const fn rust_slot_size<T>() -> usize {
    core::mem::size_of::<Slot<T>>()
}

/// Compiled PTX text of a ring kernel.
#[derive(Clone, Debug)]
pub struct CompiledKernel {
    /// The PTX (NUL-free text).
    pub ptx: String,
    /// The architecture it was compiled for, e.g. `compute_90`.
    pub arch: String,
}

#[cfg(feature = "driver")]
/// Whether NVRTC can be loaded; `Err` says why not.
pub fn nvrtc_available() -> Result<(), PersistentError> {
    if crate::nvrtc_present() {
        Ok(())
    } else {
        Err(PersistentError::NvrtcUnavailable(
            crate::CudaError::NvrtcNotFound,
        ))
    }
}

#[cfg(feature = "driver")]
/// Whether nvJitLink can be loaded; `Err` says why not.
pub fn nvjitlink_available() -> Result<(), PersistentError> {
    crate::nvjitlink::nvjitlink_available().map_err(PersistentError::JitLinkUnavailable)
}

/// A line of a ring kernel's translation unit longer than this makes NVRTC's diagnostics brief
/// (`--brief-diagnostics=true`: no quoted source lines), so that NVRTC's log stays linear in
/// the source (see `compile_ptx`).
pub const BRIEF_DIAGNOSTICS_LINE: usize = 1024;

#[cfg(feature = "driver")]
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
///   [`crate::MAX_LOG_LINE`] bytes of a log line anyway.
fn template_options(arch: &str, extra: &[&str], text: &str) -> crate::CompileOptions {
    let mut extra_opts = vec![
        "--std=c++17".to_string(),
        "-default-device".to_string(),
        "-w".to_string(),
    ];
    if text.split('\n').any(|l| l.len() > BRIEF_DIAGNOSTICS_LINE) {
        extra_opts.push(BRIEF_DIAGNOSTICS.to_string());
    }
    extra_opts.extend(extra.iter().map(|s| s.to_string()));
    crate::CompileOptions {
        arch: arch.to_string(),
        extra: extra_opts,
    }
}

#[cfg(feature = "driver")]
const BRIEF_DIAGNOSTICS: &str = "--brief-diagnostics=true";

#[cfg(feature = "driver")]
/// Runs `compile` (an NVRTC call) over `text` with the template's options; an NVRTC that does
/// not know `--brief-diagnostics` (older than the one this was measured with) is asked again
/// without it.
fn with_template_options<T>(
    text: &str,
    arch: &str,
    extra: &[&str],
    compile: impl Fn(&crate::CompileOptions) -> crate::Result<T>,
) -> crate::Result<T> {
    let mut opts = template_options(arch, extra, text);
    match compile(&opts) {
        Err(crate::CudaError::Nvrtc {
            code: crate::nvrtcResult::NVRTC_ERROR_INVALID_OPTION,
            ..
        }) if opts.extra.iter().any(|o| o == BRIEF_DIAGNOSTICS) => {
            opts.extra.retain(|o| o != BRIEF_DIAGNOSTICS);
            compile(&opts)
        }
        r => r,
    }
}

#[cfg(feature = "driver")]
/// Maps the NVRTC layer's errors for `source` compiled for `arch`.
fn compile_error(source: &KernelSource, arch: &str, e: crate::CudaError) -> PersistentError {
    match e {
        // The log is bounded where NVRTC's error is made (`crate::error::bounded_log`).
        crate::CudaError::Compile { log, .. } => PersistentError::Compile {
            name: resident_ring::message::quoted_name(&source.name),
            arch: resident_ring::message::quoted_name(arch),
            log,
        },
        e @ (crate::CudaError::NvrtcNotFound
        | crate::CudaError::Nvrtc {
            code: crate::nvrtcResult::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE,
            ..
        }) => PersistentError::NvrtcUnavailable(e),
        e => PersistentError::Cuda(e),
    }
}

#[cfg(feature = "driver")]
/// The most bytes of a kernel's name that its NVRTC program name keeps.
const PROGRAM_NAME_BYTES: usize = 64;

/// The NVRTC program name of a kernel: its name with every byte but ASCII letters, digits, `_`,
/// `-` and `.` made `_`, cut to [`PROGRAM_NAME_BYTES`], and `.cu`. NVRTC names the program in
/// its log, once per diagnostic of the generated prelude (`ping.cu(12): error: ...`), so a
/// user's megabyte-long name would make every such line a megabyte long.
#[cfg(feature = "driver")]
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

#[cfg(feature = "driver")]
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
        crate::nvrtc::compile_ptx(&text, &name, o)
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

#[cfg(feature = "driver")]
/// Compiles `source` to machine code (a CUBIN) for `sm` (e.g. `sm_90`) with NVRTC: what a
/// device of exactly that architecture loads without a JIT step.
pub fn compile_cubin(source: &KernelSource, sm: &str) -> Result<Vec<u8>, PersistentError> {
    let text = source.render()?;
    nvrtc_available()?;
    let name = program_name(source);
    with_template_options(&text, sm, &[], |o| {
        crate::nvrtc::compile_cubin(&text, &name, o)
    })
    .map(|(image, _)| image)
    .map_err(|e| compile_error(source, sm, e))
}

#[cfg(feature = "driver")]
/// The NVRTC options that make the template LTO-IR, relocatable, for nvJitLink.
pub const LTO_OPTIONS: [&str; 2] = ["-dlto", "-rdc=true"];

#[cfg(feature = "driver")]
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

#[cfg(feature = "driver")]
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

#[cfg(feature = "driver")]
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
/// have [`EXTERNAL_FN_SIGNATURE`]: one of another signature links (C names carry no types)
/// and calling it is undefined behaviour.
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
        crate::nvrtc::compile_ltoir(&text, &name, o)
    })
    .map_err(|e| compile_error(source, sm, e))?;
    let symbol = source
        .external
        .as_ref()
        .map(|f| f.symbol.as_str())
        .unwrap_or_default();
    let external_name = format!("{symbol}.ltoir");
    crate::nvjitlink::link_cubin(sm, &[(&name, &template), (&external_name, external)])
        .map_err(|e| link_error(source, sm, e))
}

#[cfg(feature = "driver")]
/// Maps the nvJitLink layer's errors for `source` linked for `sm`.
fn link_error(source: &KernelSource, sm: &str, e: crate::CudaError) -> PersistentError {
    match e {
        crate::CudaError::JitLink { call, code, log } => PersistentError::Link {
            name: source.name.clone(),
            arch: resident_ring::message::quoted_name(sm),
            call,
            code,
            log,
        },
        e @ crate::CudaError::JitLinkNotFound { .. } => PersistentError::JitLinkUnavailable(e),
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

#[cfg(feature = "driver")]
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
        crate::nvrtc::compile_cubin(&text, &name, o)
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

#[cfg(test)]
mod tuning_tests {
    use super::{tuning_defines, PersistentError, TUNABLES};

    #[test]
    fn tuning_pairs_become_defines_and_anything_else_is_refused() {
        assert_eq!(tuning_defines(None).unwrap(), "");
        assert_eq!(tuning_defines(Some("  ")).unwrap(), "");
        assert_eq!(
            tuning_defines(Some("RESIDENT_FAST_POLL=0  RESIDENT_LL_PREFETCH=4")).unwrap(),
            "#define RESIDENT_FAST_POLL 0u\n#define RESIDENT_LL_PREFETCH 4u\n"
        );
        for bad in [
            "RESIDENT_BATCH=32",
            "RESIDENT_FAST_POLL",
            "RESIDENT_FAST_POLL=",
            "RESIDENT_FAST_POLL=65",
            "RESIDENT_FAST_POLL=007",
            "RESIDENT_FAST_POLL=-1",
            "RESIDENT_FAST_POLL=1;evil",
            "RESIDENT_FAST_POLL=1 RESIDENT_FAST_POLL=0",
        ] {
            let e = tuning_defines(Some(bad)).unwrap_err();
            assert!(matches!(e, PersistentError::Config { .. }), "{bad}: {e:?}");
            assert!(e.to_string().contains(TUNABLES[0]), "{e}");
        }
        // A long value is quoted short.
        let e = tuning_defines(Some(&"x".repeat(1 << 20))).unwrap_err();
        assert!(e.to_string().len() < 400, "{}", e.to_string().len());
    }
}

#[cfg(test)]
mod buffer_tests {
    use super::*;

    const STATS: &str = "typedef struct { double m; } Stats;";

    fn source(buffers: Vec<BufferDecl>) -> KernelSource {
        KernelSource::new(
            "k",
            MessageDecl::new("Stats", STATS, 8),
            MessageDecl::new("Out", "typedef struct { unsigned int x; } Out;", 4),
            MessageDecl::new("St", "typedef struct { unsigned int n; } St;", 4),
            "",
            64,
        )
        .with_buffers(buffers)
    }

    fn decl(name: &str, c_type: &str, deps: &[&str], size: usize) -> BufferDecl {
        BufferDecl {
            name: name.into(),
            c_type: c_type.into(),
            c_deps: deps.iter().map(|d| d.to_string()).collect(),
            elem_size: size,
        }
    }

    #[test]
    fn a_keyed_source_calls_the_handler_with_its_keys_state() {
        let text = source(vec![decl("keys", "Stats", &[STATS], 8)])
            .with_key_field("x")
            .render()
            .unwrap();
        assert!(text.contains("#define RESIDENT_KEYED 1"));
        assert!(text.contains("typedef Stats KeyState;"));
        assert!(text.contains("#define RESIDENT_KEY_OF(in) ((unsigned int)((in)->x))"));
        assert!(text.contains("RESIDENT_HANDLER(&(bufs)->keys[RESIDENT_KEY_OF(in)], in, out, env)"));
        // The key states must be the first buffer, named `keys`; the field a C identifier.
        for bad in [
            source(vec![decl("w", "float", &[], 4)]).with_key_field("x"),
            source(Vec::new()).with_key_field("x"),
            source(vec![decl("keys", "Stats", &[STATS], 8)]).with_key_field("x->y"),
        ] {
            assert!(matches!(bad.render(), Err(PersistentError::Config { .. })));
        }
        // Not keyed: no keyed section.
        let plain = source(vec![decl("keys", "Stats", &[STATS], 8)])
            .render()
            .unwrap();
        assert!(!plain.contains("RESIDENT_KEYED 1"));
    }

    /// Names come from users: a megabyte-long one is quoted 64 bytes long (found while fuzzing
    /// the other user-text paths: their errors quoted names and lines whole).
    #[test]
    fn errors_quote_long_names_short() {
        let long = "x-".repeat(500_000);
        for bad in [
            source(vec![decl(&long, "float", &[], 4)]),
            source(vec![decl("w", &long, &[], 4)]),
            source(vec![decl("keys", "Stats", &[STATS], 8)]).with_key_field(long.clone()),
        ] {
            match bad.render() {
                Err(e @ PersistentError::Config { .. }) => {
                    let text = e.to_string();
                    assert!(text.len() < 400, "{} bytes: {}", text.len(), &text[..200]);
                    assert!(text.contains("(1000000 bytes)"), "{text}");
                }
                other => panic!("expected a config error, got {:?}", other.map(|t| t.len())),
            }
        }
    }

    #[test]
    fn buffers_make_the_table_and_the_five_argument_call() {
        let text = source(vec![
            decl("stats", "Stats", &[STATS], 8),
            decl("w", "float", &[], 4),
        ])
        .render()
        .unwrap();
        // The element's declaration equals the input's: emitted once.
        assert_eq!(text.matches(STATS).count(), 1);
        assert!(text.contains("    Stats* stats;\n    unsigned long long stats_len;\n    unsigned long long stats_id;"));
        assert!(text.contains("    float* w;"));
        assert!(text.contains("static_assert(sizeof(ResidentBuffers) == 48"));
        assert!(text.contains("static_assert(sizeof(float) == 4"));
        assert!(text.contains("RESIDENT_HANDLER(st, in, out, env, bufs)"));
        let plain = source(vec![]).render().unwrap();
        assert!(plain.contains("RESIDENT_HANDLER(st, in, out, env)\n"));
        assert!(!plain.contains("RESIDENT_HAS_BUFFERS"));
    }

    #[test]
    fn bad_buffer_declarations_are_config_errors() {
        for bad in [
            vec![decl("not-an-identifier", "float", &[], 4)],
            vec![decl("a", "float", &[], 4), decl("a", "float", &[], 4)],
            vec![decl("a", "float [4]", &[], 16)],
            vec![decl("a", "", &[], 4)],
            vec![decl("a", "float", &[], 0)],
        ] {
            assert!(
                matches!(
                    source(bad.clone()).render(),
                    Err(PersistentError::Config { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_table_is_pointer_length_id_per_buffer() {
        let b = buffer_table_bytes(&[(0x1000, 3, 7), (0x2000, 0, 9)]);
        assert_eq!(b.len(), 2 * BUFFER_ENTRY_BYTES);
        let word = |i: usize| u64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(
            (0..6).map(word).collect::<Vec<_>>(),
            vec![0x1000, 3, 7, 0x2000, 0, 9]
        );
    }
}

/// What `resident fuzz --target cuda` found: compile errors as long as the user's text.
#[cfg(test)]
mod fuzz_regressions {
    use super::*;

    /// The longest message a compile error may have: its log (bounded) after a short header.
    const MAX_COMPILE_ERROR: usize = crate::MAX_LOG_BYTES + 512;

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

    #[cfg(feature = "driver")]
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
    #[cfg(feature = "driver")]
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
    #[cfg(feature = "driver")]
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
    #[cfg(feature = "driver")]
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
    #[cfg(feature = "driver")]
    #[test]
    fn regression_fuzz_nvrtc_compiles_on_a_large_stack() {
        if crate::nvrtc::nvrtc_present() {
            let n = 8192;
            let src = format!(
                "extern \"C\" __global__ void k(int* p) {{ p[0] = {}1{}; }}",
                "(".repeat(n),
                ")".repeat(n)
            );
            let opts = crate::CompileOptions::for_arch("compute_90");
            match crate::nvrtc::compile_ptx(&src, "deep", &opts) {
                Ok(ptx) => assert!(ptx.contains(".entry k"), "{ptx}"),
                Err(e @ crate::CudaError::Nvrtc { .. }) => eprintln!("SKIP: {e}"),
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
