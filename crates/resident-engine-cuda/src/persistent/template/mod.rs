//! The CUDA C translation unit of a ring kernel: a generated prelude (wire structs, the user's
//! message types, `static_assert`s on every size, the user's handler) followed by the template
//! body `kernels/persistent_ring.cu`, which defines two kernels:
//! * `resident_persistent(PersistentParams)`: the persistent ring kernel (launched once);
//! * `resident_batch(in, n, out, out_count, state, scan)`: the launch-per-batch baseline (also
//!   the node of the CUDA-graph baseline), on a grid of `ceil(n / batch)` blocks.
//!
//! [`compile_ptx`] compiles it with NVRTC, loaded at run time.
//!
//! Three files: this one, the source model (the declarations, the handler, the buffers, the
//! rendered translation unit); `depth.rs`, the C lexer that refuses a source NVRTC's parser
//! would recurse too deep on; `compile.rs`, the compile drivers (NVRTC to PTX or machine code,
//! g++ for CudaSim, nvJitLink for an external function, the ptxas resource report).

mod compile;
mod depth;

#[cfg(feature = "cuda")]
pub use compile::{
    compile_cubin, compile_ptx, compile_sass_report, link_cubin, nvjitlink_available,
    nvrtc_available, LTO_OPTIONS,
};
pub use compile::{
    compile_sim, compile_sim_with, parse_ptxas_report, CompiledKernel, SassReport,
    BRIEF_DIAGNOSTICS_LINE, SIM_ARCH,
};
use depth::too_deep;
pub use depth::{MAX_CHAIN, MAX_NESTING, MAX_OPERATOR_RUN};

use std::fmt::Write as _;

use resident_ring::envelope::ENVELOPE_C_DECL;
use resident_ring::spsc::RING_HEADER_C_DECL;
use resident_ring::Slot;

use super::control::CONTROL_BLOCK_C_DECL;
use super::{PersistentError, MAX_LANES};

/// The template body.
pub const TEMPLATE_BODY: &str = include_str!("../../../kernels/persistent_ring.cu");

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
        // `resident_cuda::hazards`).
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
