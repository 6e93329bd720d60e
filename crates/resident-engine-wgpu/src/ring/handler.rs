//! The handler a WGSL ring kernel's definition carries ([`WgslHandler`]), the WGSL module it
//! generates around the user's source (declarations, bound buffers, entry point), and the
//! check of the bindings a handler can see. In every build, so a kernel definition compiles
//! whichever engines are in.

#[cfg(feature = "wgpu")]
use crate::WgpuContext;
use resident_core::engine::error::DeviceError;
use resident_core::engine::error::WgslLaunchError;
use resident_core::runtime::bind::DeviceBinding;
use resident_ring::message::{LayoutError, StructLayout, WgslLayoutError};
use resident_ring::{DeviceMessage, Message};
use std::borrow::Cow;
use std::marker::PhantomData;

use super::keyed;

/// A ring kernel's handler in WGSL (see the [module docs](super) for the signature and the state rules).
pub struct WgslHandler<In, Out> {
    pub(super) source: String,
    pub(super) function: String,
    pub(super) state: Vec<u8>,
    pub(super) state_decl: Result<(String, String, usize), WgslLayoutError>,
    pub(super) workgroup: u32,
    pub(super) in_flight: usize,
    /// One invocation runs the batch's messages in order (see [`WgslHandler::in_order`]).
    pub(super) in_order: bool,
    /// Bound buffers declared with atomic elements (see [`WgslHandler::atomic`]).
    pub(super) atomics: Vec<String>,
    /// A keyed kernel's key field in the input message (see [`WgslHandler::keyed`]).
    pub(crate) key_field: Option<String>,
    /// The message types' WGSL declarations (nested structs first), or why there are none.
    pub(super) decls: Result<String, WgslLayoutError>,
    pub(super) names: (Cow<'static, str>, Cow<'static, str>),
    pub(super) _t: PhantomData<fn(In) -> Out>,
}

const NO_STATE: &str = "struct ResidentState {\n    unused: u32,\n}\n";

impl<In: DeviceMessage, Out: DeviceMessage> WgslHandler<In, Out> {
    /// A handler named `handle` defined in `source`, with no device state.
    pub fn new(source: impl Into<String>) -> Self {
        WgslHandler {
            source: source.into(),
            function: "handle".into(),
            state: vec![0; 4],
            state_decl: Ok((String::new(), NO_STATE.to_string(), 4)),
            workgroup: 64,
            in_flight: 3,
            in_order: false,
            atomics: Vec::new(),
            key_field: None,
            decls: (|| {
                let mut decls = Vec::new();
                In::wgsl_dependencies(&mut decls)?;
                Out::wgsl_dependencies(&mut decls)?;
                Ok(decls.concat())
            })(),
            names: (Cow::Borrowed(In::C_NAME), Cow::Borrowed(Out::C_NAME)),
            _t: PhantomData,
        }
    }

    /// Also declares `T`'s WGSL struct (and the structs it nests), for a source that names
    /// message types besides the kernel's own input and output: for example one file holding
    /// the handlers of two kernels, each compiled with the other's types declared. A type
    /// already declared is not declared twice.
    pub fn declare<T: DeviceMessage>(mut self) -> Self {
        let mut more = Vec::new();
        let r = T::wgsl_dependencies(&mut more);
        self.decls = match (self.decls, r) {
            (Ok(mut d), Ok(())) => {
                for m in more {
                    if !d.contains(&m) {
                        d.push_str(&m);
                    }
                }
                Ok(d)
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        self
    }

    /// Device state, initialized to `init`, kept in a storage buffer for the kernel's life;
    /// the handler sees it as `state: ResidentState` (integer fields atomic).
    pub fn state<D: DeviceMessage>(mut self, init: D) -> Self {
        self.state = bytemuck::bytes_of(&init).to_vec();
        self.state_decl = (|| {
            let mut deps = Vec::new();
            // Nested structs the state uses, declared once under their own names.
            D::wgsl_dependencies(&mut deps)?;
            let own = D::wgsl_struct(D::C_NAME, false)?;
            deps.retain(|d| d != &own);
            let decl = D::wgsl_struct("ResidentState", true)?;
            Ok((deps.concat(), decl, std::mem::size_of::<D>()))
        })();
        self
    }
}

impl<In: Message, Out: Message> WgslHandler<In, Out> {
    /// The name of the handler function in the source (default `handle`).
    pub fn function(mut self, name: impl Into<String>) -> Self {
        self.function = name.into();
        self
    }

    /// A handler named `handle` defined in `source` whose message layouts are known only at
    /// run time (the Python package's numpy dtypes), declared from their [`StructLayout`]s
    /// exactly as `device_message!` declares a Rust type; each must have the size of `In` /
    /// `Out` (the bytes the ring carries). A layout WGSL cannot hold byte for byte (8- and
    /// 16-bit integers) is refused here. No device state until
    /// [`state_layout`](Self::state_layout).
    pub fn with_layouts(
        source: impl Into<String>,
        input: &StructLayout,
        output: &StructLayout,
    ) -> Result<Self, LayoutError> {
        input.expect_size(std::mem::size_of::<In>())?;
        output.expect_size(std::mem::size_of::<Out>())?;
        let wgsl = |l: &StructLayout| {
            l.wgsl_struct(l.name(), false).map_err(|e| LayoutError {
                layout: l.name().to_string(),
                field: None,
                reason: e.to_string(),
            })
        };
        let mut decls = wgsl(input)?;
        if output.name() != input.name() {
            decls.push_str(&wgsl(output)?);
        } else if output != input {
            return Err(LayoutError {
                layout: output.name().to_string(),
                field: None,
                reason: "the input and output layouts differ but have the same name".into(),
            });
        }
        Ok(WgslHandler {
            source: source.into(),
            function: "handle".into(),
            state: vec![0; 4],
            state_decl: Ok((String::new(), NO_STATE.to_string(), 4)),
            workgroup: 64,
            in_flight: 3,
            in_order: false,
            atomics: Vec::new(),
            decls: Ok(decls),
            key_field: None,
            names: (
                Cow::Owned(input.name().to_string()),
                Cow::Owned(output.name().to_string()),
            ),
            _t: PhantomData,
        })
    }

    /// Device state laid out as `layout` (declared `ResidentState`, 32-bit integer fields
    /// atomic), initialized to `init` (exactly `layout.size()` bytes).
    pub fn state_layout(
        mut self,
        layout: &StructLayout,
        init: Vec<u8>,
    ) -> Result<Self, LayoutError> {
        let refuse = |reason: String| LayoutError {
            layout: layout.name().to_string(),
            field: None,
            reason,
        };
        if init.len() != layout.size() {
            return Err(refuse(format!(
                "the initial state has {} bytes, the layout {}",
                init.len(),
                layout.size()
            )));
        }
        let decl = layout
            .wgsl_struct("ResidentState", true)
            .map_err(|e| refuse(e.to_string()))?;
        self.state = init;
        self.state_decl = Ok((String::new(), decl, layout.size()));
        Ok(self)
    }
}

impl<In, Out> WgslHandler<In, Out> {
    /// Invocations per workgroup (default 64).
    pub fn workgroup_size(mut self, n: u32) -> Self {
        self.workgroup = n;
        self
    }

    /// Batches in flight at once (default 3, at least 1): the host fills one while the device
    /// runs the others.
    pub fn batches_in_flight(mut self, n: usize) -> Self {
        self.in_flight = n.max(1);
        self
    }

    /// Runs each batch's messages **one after another, in message order, in a single
    /// invocation** (the generated entry point loops over the batch) instead of one invocation
    /// per message. For handlers whose messages depend on each other (a message reads what an
    /// earlier one of the same batch wrote to the state or to a bound buffer, as the anomaly
    /// detector's readings of one sensor do): a parallel handler would have to spin-wait for
    /// its turn, and WGSL guarantees no forward progress to an invocation that waits on
    /// another. The state's integer fields stay `atomic<..>` (use `atomicLoad`/`atomicStore`
    /// or `atomicAdd`); the batch then runs on one GPU thread, so keep batches short where a
    /// watchdog bounds a dispatch. The workgroup size is ignored.
    pub fn in_order(mut self) -> Self {
        self.in_order = true;
        self
    }

    /// The handler of a keyed kernel (`RingKernel::keyed`, launched with
    /// `RingKernel::key_wgsl`) whose input messages name their key in the field `key_field`
    /// (the field the message's `Keyed::key` returns). The handler is
    ///
    /// ```wgsl
    /// fn handle(ks: ptr<function, KeyState>, input: ResidentIn,
    ///           out: ptr<function, ResidentOut>, env: Envelope) -> bool
    /// ```
    ///
    /// with `KeyState` the WGSL struct of the kernel's per-key state and `ks` the state of the
    /// message's key. The states live in a storage buffer for the kernel's life (bound as
    /// `keys`); the leader of a key (below) loads its state once, runs the key's messages of
    /// the batch against it and stores it back (a `ptr<storage, ..>` argument is what WGSL
    /// implementations without the unrestricted-pointer-parameters extension refuse, naga's
    /// validator among them, hence a function-space pointer). Messages of
    /// one key run one after another in the order sent (within a priority lane), with no
    /// host-side ticket: one invocation per message, and the first message of each key in the
    /// batch leads its key, handling that key's messages of the batch in order; different keys
    /// run in parallel. So a handler updates its key's state with plain loads and stores.
    /// The host groups each batch by key as it uploads it (one pass: the key field's bytes
    /// are read on the host, and each message gets the index of its key's next message and
    /// whether it leads), so a leader runs only its own key's messages and a batch's work is
    /// linear in its size; no invocation waits for another.
    pub fn keyed(mut self, key_field: impl Into<String>) -> Self {
        self.key_field = Some(key_field.into());
        self
    }

    /// Declares the bound buffer `name` with atomic elements, `array<atomic<u32>>` (or
    /// `atomic<i32>`), for handlers whose parallel invocations update the same elements
    /// (counters, flags, histograms, or floats kept as their bits and updated with an
    /// `atomicCompareExchangeWeak` loop). The bytes are the same as the plain declaration's,
    /// so host reads and writes see the values as usual. A name that is not bound, or whose
    /// elements are not `u32`/`i32`, fails the launch with [`WgslLaunchError::Atomic`].
    pub fn atomic(mut self, name: impl Into<String>) -> Self {
        self.atomics.push(name.into());
        self
    }

    /// Refuses atomic declarations of buffers that are not bound or not 32-bit integers.
    pub(super) fn check_atomics(&self, bindings: &[DeviceBinding]) -> Result<(), WgslLaunchError> {
        for name in &self.atomics {
            let refuse = |reason: String| WgslLaunchError::Atomic {
                name: name.clone(),
                reason,
            };
            let Some(b) = bindings.iter().find(|b| &b.name == name) else {
                return Err(refuse("no buffer of that name is bound".into()));
            };
            match b.elem.wgsl_type.as_deref() {
                Ok("u32") | Ok("i32") => {}
                Ok(other) => {
                    return Err(refuse(format!(
                        "its elements are `{other}`; WGSL has atomics of u32 and i32 only"
                    )))
                }
                Err(e) => return Err(refuse(e.to_string())),
            }
        }
        Ok(())
    }

    /// The complete WGSL module the runtime compiles: the handler source first (so compiler
    /// line numbers are the source's own), then the generated declarations and entry point
    /// and the 64-bit helpers. The declarations of bound buffers are added at launch, where
    /// the bindings are known.
    pub fn module_source(&self) -> Result<String, WgslLayoutError> {
        self.module_source_with(&[])
    }

    /// [`WgslHandler::module_source`] with the declarations of `bindings` (checked first with
    /// [`check_bindings`]).
    pub(super) fn module_source_with(
        &self,
        bindings: &[DeviceBinding],
    ) -> Result<String, WgslLayoutError> {
        let decls = self.decls.clone()?;
        let (state_deps, state_decl, _) = self.state_decl.clone()?;
        let mut s = String::with_capacity(self.source.len() + 2048);
        s.push_str(&self.source);
        s.push_str("\n// ---- generated by resident ----\n");
        s.push_str(&decls);
        if !state_deps.is_empty() && !s.contains(&state_deps) {
            s.push_str(&state_deps);
        }
        s.push_str(&state_decl);
        s.push_str(&format!(
            "alias ResidentIn = {};\nalias ResidentOut = {};\n",
            self.names.0, self.names.1
        ));
        for b in bindings {
            for dep in b.elem.wgsl_deps.clone()? {
                if !s.contains(&dep) {
                    s.push_str(&dep);
                }
            }
        }
        for (i, b) in bindings.iter().enumerate() {
            let mut ty = b.elem.wgsl_type.clone()?;
            if self.atomics.contains(&b.name) {
                ty = format!("atomic<{ty}>");
            }
            s.push_str(&format!(
                "// Bound buffer {i}: {len} elements of {size} bytes.\n\
                 @group(1) @binding({i}) var<storage, read_write> {name}: array<{ty}>;\n\
                 const {name}_len: u32 = {len}u;\n\
                 const {name}_id: vec2<u32> = vec2<u32>({lo}u, {hi}u);\n",
                name = b.name,
                len = b.len,
                size = b.elem.size,
                lo = b.id.0 as u32,
                hi = (b.id.0 >> 32) as u32,
            ));
        }
        let keyed = match &self.key_field {
            Some(field) => {
                let ty = bindings
                    .iter()
                    .find(|b| b.name == resident_core::runtime::keyed::KEYS_BUFFER)
                    .map(|b| b.elem.wgsl_type.clone());
                match ty {
                    Some(t) => s.push_str(&format!("alias KeyState = {};\n", t?)),
                    None => s.push_str(
                        "// A keyed handler: `keys` and `KeyState` are declared at launch.\n",
                    ),
                }
                Some(field.clone())
            }
            None => None,
        };
        let main = if let Some(field) = keyed {
            keyed::entry_point(self.workgroup, &field, &self.function, CUT_SHORT)
        } else if self.in_order {
            format!(
                r#"@compute @workgroup_size(1)
fn resident_main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    if (gid.x != 0u) {{ return; }}
    var i = 0u;
    for (; i < resident_count.x; i += 1u) {{
        var out: ResidentOut;
        let keep = {f}(resident_in[i], &out, resident_env[i]);
        resident_out[i] = out;
        resident_keep[i] = select(0u, 1u, keep);
    }}
    // A device that cut this loop short (llvmpipe ends an invocation's loops after 65535
    // iterations in all) leaves a mark in the last keep flag: the host fails the kernel.
    if (i < resident_count.x) {{ resident_keep[resident_count.x - 1u] = {cut}u; }}
}}
"#,
                f = self.function,
                cut = CUT_SHORT,
            )
        } else {
            format!(
                r#"@compute @workgroup_size({wg})
fn resident_main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let i = gid.x;
    if (i >= resident_count.x) {{ return; }}
    var out: ResidentOut;
    let keep = {f}(resident_in[i], &out, resident_env[i]);
    resident_out[i] = out;
    resident_keep[i] = select(0u, 1u, keep);
}}
"#,
                wg = self.workgroup,
                f = self.function,
            )
        };
        s.push_str(
            r#"// The 32-byte wire header, byte for byte (resident_ring::Envelope).
struct Envelope {
    message_id: vec2<u32>,
    correlation_id: vec2<u32>,
    timestamp_ns: vec2<u32>,
    priority_flags: u32,
    reserved1: u32,
}
fn resident_priority(env: Envelope) -> u32 { return env.priority_flags & 0xffu; }
fn resident_flags(env: Envelope) -> u32 { return (env.priority_flags >> 8u) & 0xffu; }
@group(0) @binding(0) var<storage, read> resident_in: array<ResidentIn>;
@group(0) @binding(1) var<storage, read> resident_env: array<Envelope>;
@group(0) @binding(2) var<storage, read_write> resident_out: array<ResidentOut>;
@group(0) @binding(3) var<storage, read_write> resident_keep: array<u32>;
@group(0) @binding(4) var<storage, read_write> state: ResidentState;
@group(0) @binding(5) var<uniform> resident_count: vec4<u32>;
"#,
        );
        s.push_str(&main);
        s.push_str(crate::wgsl::HELPERS_64);
        Ok(s)
    }
}

/// The keep flag an in-order entry point leaves on its batch's last message when the device
/// cut its loop short.
pub(super) const CUT_SHORT: u32 = 0xffff_ffff;

#[cfg(feature = "wgpu")]
/// WGSL words a bound buffer may not be named (keywords, and names the generated code uses).
#[rustfmt::skip]
const RESERVED: &[&str] = &[
    "alias", "break", "case", "const", "const_assert", "continue", "continuing", "default",
    "diagnostic", "discard", "else", "enable", "false", "fn", "for", "if", "let", "loop",
    "override", "requires", "return", "struct", "switch", "true", "var", "while", "state",
    "array", "atomic", "bool", "f16", "f32", "i32", "u32", "vec2", "vec3", "vec4", "ptr",
    "Envelope", "ResidentIn", "ResidentOut", "ResidentState",
];

#[cfg(feature = "wgpu")]
/// Refuses bindings a WGSL handler cannot see: a name that is not a WGSL identifier (or is a
/// keyword, or starts with the reserved `resident_`/`__`), an element type with no
/// byte-identical WGSL type (8- and 16-bit integers), or more storage buffers than the adapter
/// binds per shader stage.
pub(crate) fn check_bindings(
    ctx: &WgpuContext,
    bindings: &[DeviceBinding],
) -> Result<(), DeviceError> {
    for b in bindings {
        let refuse = |reason: String| DeviceError::Binding {
            name: b.name.clone(),
            reason,
        };
        let mut chars = b.name.chars();
        let ident = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && b.name != "_";
        if !ident || b.name.starts_with("__") {
            return Err(refuse(
                "a WGSL handler names it as a variable: use an identifier ([A-Za-z_][A-Za-z0-9_]*)"
                    .into(),
            ));
        }
        if b.name.starts_with("resident_") || RESERVED.contains(&b.name.as_str()) {
            return Err(refuse(format!(
                "`{}` is a WGSL keyword or a name the generated code uses",
                b.name
            )));
        }
        if let Err(e) = &b.elem.wgsl_type {
            return Err(refuse(format!(
                "its elements have no WGSL type with the same layout: {e}"
            )));
        }
        if let Err(e) = &b.elem.wgsl_deps {
            return Err(refuse(format!(
                "its elements have no WGSL type with the same layout: {e}"
            )));
        }
    }
    // Five storage buffers of group 0 (input, envelopes, output, keep flags, state).
    let storage = 5 + bindings.len() as u64;
    let max = ctx.limits.max_storage_buffers_per_shader_stage as u64;
    if storage > max {
        return Err(DeviceError::Binding {
            name: bindings.last().map(|b| b.name.clone()).unwrap_or_default(),
            reason: format!(
                "{} bound buffers and the ring's 5 need {storage} storage buffers, the adapter binds at most {max} per shader stage (max_storage_buffers_per_shader_stage)",
                bindings.len()
            ),
        });
    }
    Ok(())
}
