//! Ring kernels with WGSL handlers on wgpu: state on the device for the kernel's life, batches
//! pipelined, outputs read back asynchronously and published in input order.
//!
//! # The handler
//!
//! ```wgsl
//! fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool
//! ```
//!
//! `ResidentIn` / `ResidentOut` are aliases of the message types' WGSL structs, generated from
//! the Rust types by `device_message!` (a type WGSL cannot hold byte for byte is refused at
//! `launch`). `env` is the request's 32-byte header (`message_id`, `correlation_id`,
//! `timestamp_ns` as `vec2<u32>` low word first; `resident_priority(env)`,
//! `resident_flags(env)`). Returning `false` sends no output.
//!
//! # Device state and how a batch mutates it
//!
//! The state is the module-scope `var<storage, read_write> state: ResidentState`, declared
//! from the Rust type given to [`WgslHandler::state`] with every `u32`/`i32` field (and array
//! of them) as `atomic<u32>`/`atomic<i32>` (same size and alignment, so the bytes still match
//! the Rust type). Each message of a batch runs in its own invocation, in parallel, like the
//! CUDA handler's threads: update shared integers with `atomicAdd`, `atomicMax`, ...; plain
//! (`f32`, nested struct) fields are racy unless one invocation per batch writes them. We chose
//! this over a sequential handler (one invocation looping over the batch), which would match a
//! CPU closure for any update but use one GPU thread per batch: with atomics the handler scales
//! with the batch and, for commutative updates (counts, sums, min/max, histograms), gives the
//! same state as a sequential CPU closure. Batches run in submission order on the one queue,
//! so batch N+1 sees all of batch N's updates.
//!
//! The state buffer lives as long as the kernel (and as long as a snapshot handle); it is
//! never copied to the host unless [`KernelHandle::snapshot_state`] asks.
//!
//! [`KernelHandle::snapshot_state`]: resident_core::runtime::handle::KernelHandle::snapshot_state
//!
//! # Bound buffers
//!
//! Each buffer bound with `RingKernel::bind(name, buffer)` (binding `i` in `bind` order)
//! becomes a device storage buffer for the kernel's life, initialized from the buffer's host
//! values at launch, and is declared for the handler as
//!
//! ```wgsl
//! @group(1) @binding(i) var<storage, read_write> <name>: array<T>;
//! const <name>_len: u32 = ...;          // elements (use it rather than arrayLength: an
//!                                       // empty buffer is padded to one element)
//! const <name>_id: vec2<u32> = ...;     // its BufferId (low word first), so a message
//!                                       // can name the buffer: all(m.buffer == <name>_id)
//! ```
//!
//! `T` is the element type's WGSL type (`f32`, `u32`, `i32`, `vec2<u32>` for `u64`/`i64`/`f64`,
//! a `device_message!` struct, arrays of these). A name that is not a WGSL identifier (or is a
//! keyword or a generated name), an element type with no byte-identical WGSL form (8- and 16-bit
//! integers) and more storage buffers than the adapter binds per stage are
//! [`DeviceError::Binding`]; a buffer past `max_storage_buffer_binding_size` is
//! [`WgslLaunchError::BoundBuffer`] with the limit named. Elements are plain unless the handler
//! declares the buffer with [`WgslHandler::atomic`] (`u32`/`i32` elements become
//! `atomic<u32>`/`atomic<i32>`): the invocations of a parallel batch must write distinct
//! plain elements, update shared ones atomically, or use [`WgslHandler::in_order`]. Host reads and writes (`KernelHandle::read_buffer` /
//! `write_buffer`) are synchronized with the batches through the device's one queue, which
//! runs submissions in order: a read is a copy submitted behind every batch already submitted
//! (so it sees the buffer between two batches, never torn), mapped with a bounded wait; a write
//! is a queue write ordered before every later batch (the next batch sees all of it).
//!
//! # Messages in order
//!
//! [`WgslHandler::in_order`] runs a batch's messages one after another in one invocation, for
//! handlers whose messages depend on each other. On Mesa's llvmpipe/lavapipe an invocation runs
//! at most 65535 loop iterations **in total, over all its loops** (checked here: further loops
//! then run one iteration), so on lavapipe keep `batch size x loop iterations per message`
//! well under that; real GPUs have no such cap (a watchdog bounds a dispatch's time instead).
//! The generated loop notices when it was cut short and the kernel fails with a
//! `DeviceError::Fault` saying so (the batch's keep flags are cleared before each dispatch, so
//! no stale output is published); a loop inside the handler that is cut short is the handler's
//! to notice (compare the loop variable with its end after the loop, as the workloads do).
//!
//! # Pipelining
//!
//! The engine owns `depth` sets of batch buffers (input, envelopes, output, keep flags, a
//! count uniform, a host-mappable staging buffer, and for a keyed kernel each message's link
//! to its key's next message: see `keyed.rs`). `push` fills a free set, records the
//! dispatch and the copies into staging, submits, and asks for the staging map
//! (`map_async`) without waiting, so the host fills batch N+1 while the device runs batch N.
//! `pull` polls the device without blocking and publishes completed batches strictly in
//! submission order. A batch that does not complete within `WAIT_TIMEOUT` (60 s) fails the
//! kernel instead of hanging it.

#[cfg(feature = "wgpu")]
#[path = "link.rs"]
pub(crate) mod link;

#[path = "keyed.rs"]
mod keyed;

#[cfg(feature = "wgpu")]
use super::oneshot::{check_grid, check_workgroup};
#[cfg(feature = "wgpu")]
use super::wgsl::compile;
use super::wgsl::WgslError;
#[cfg(feature = "wgpu")]
use super::{padded, WgpuContext, WAIT_TIMEOUT};
use parking_lot::Mutex;
use resident_core::engine::error::DeviceError;
pub use resident_core::engine::error::WgslLaunchError;
use resident_core::engine::BackendError;
use resident_core::runtime::bind::{DeviceBinding, DeviceBuffers};
use resident_core::runtime::host::device::{DeviceRing, RingCounters};
use resident_ring::message::{LayoutError, StructLayout, WgslLayoutError};
use resident_ring::{DeviceMessage, Envelope, Message, Slot};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::marker::PhantomData;
#[cfg(feature = "wgpu")]
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A ring kernel's handler in WGSL (see the module docs for the signature and the state rules).
pub struct WgslHandler<In, Out> {
    source: String,
    function: String,
    state: Vec<u8>,
    state_decl: Result<(String, String, usize), WgslLayoutError>,
    workgroup: u32,
    in_flight: usize,
    /// One invocation runs the batch's messages in order (see [`WgslHandler::in_order`]).
    in_order: bool,
    /// Bound buffers declared with atomic elements (see [`WgslHandler::atomic`]).
    atomics: Vec<String>,
    /// A keyed kernel's key field in the input message (see [`WgslHandler::keyed`]).
    pub(crate) key_field: Option<String>,
    /// The message types' WGSL declarations (nested structs first), or why there are none.
    decls: Result<String, WgslLayoutError>,
    names: (Cow<'static, str>, Cow<'static, str>),
    _t: PhantomData<fn(In) -> Out>,
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
    fn check_atomics(&self, bindings: &[DeviceBinding]) -> Result<(), WgslLaunchError> {
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
    pub(crate) fn module_source_with(
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
        s.push_str(super::wgsl::HELPERS_64);
        Ok(s)
    }
}

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

#[cfg(feature = "wgpu")]
/// Read access to a kernel's device state, shared by the engine and the kernel's handles.
pub(crate) struct DeviceState {
    ctx: Arc<WgpuContext>,
    buffer: ::wgpu::Buffer,
    len: usize,
}

#[cfg(feature = "wgpu")]
impl DeviceState {
    /// Copies the state to the host: its value after every batch submitted before this call
    /// (bounded wait).
    pub fn read(&self) -> Result<Vec<u8>, BackendError> {
        let mut v = vec![0u8; self.len];
        self.ctx.read(&mut v, &self.buffer)?;
        Ok(v)
    }
}

#[cfg(feature = "wgpu")]
impl resident_core::runtime::host::device::StateSnapshot for DeviceState {
    fn read(&self) -> Result<Vec<u8>, DeviceError> {
        DeviceState::read(self).map_err(DeviceError::from)
    }
}

#[cfg(feature = "wgpu")]
struct BatchBuffers {
    input: ::wgpu::Buffer,
    env: ::wgpu::Buffer,
    out: ::wgpu::Buffer,
    keep: ::wgpu::Buffer,
    /// A keyed pipeline's links (binding 6).
    links: Option<::wgpu::Buffer>,
    count: ::wgpu::Buffer,
    staging: ::wgpu::Buffer,
    group: ::wgpu::BindGroup,
}

#[cfg(feature = "wgpu")]
type MapResult = Arc<Mutex<Option<Result<(), ::wgpu::BufferAsyncError>>>>;

#[cfg(feature = "wgpu")]
struct InFlight<In> {
    set: usize,
    inputs: Vec<Slot<In>>,
    /// A batch a producer handed over on the device (`set` and `inputs` unused).
    fused: Option<link::FusedBatch<In>>,
    mapped: MapResult,
    submitted: Instant,
}

#[cfg(feature = "wgpu")]
/// A launched engine, its state, and its bound buffers' device copies (when any).
pub(crate) type Launched<In, Out> = (
    WgpuEngine<In, Out>,
    Arc<DeviceState>,
    Option<Arc<BoundBuffers>>,
);

#[cfg(feature = "wgpu")]
/// The device side of a WGSL ring kernel (see the module docs).
pub(crate) struct WgpuEngine<In: Message, Out: Message> {
    ctx: Arc<WgpuContext>,
    pipeline: RingPipeline,
    sets: Vec<BatchBuffers>,
    free: Vec<usize>,
    in_flight: VecDeque<InFlight<In>>,
    /// Inputs taken from the pump but not yet submitted: a partial batch waits here while
    /// the device is busy (it is submitted as soon as it is full, or the device goes idle).
    pending: Vec<Slot<In>>,
    ready: VecDeque<Slot<Out>>,
    /// `call` requests the handler answered with `false`, for the pump to fail with NoReply.
    unanswered: Vec<Envelope>,
    geometry: BatchGeometry,
    /// Messages handled and batches run, shared with the links of a producer (the consumer's
    /// pump counts a producer's batches it ran there).
    counts: Arc<link::Counts>,
    failure: Option<WgpuFault>,
    scratch: Vec<u8>,
    /// The state buffer (a producer's fused batch sets bind it).
    state_buf: ::wgpu::Buffer,
    /// The kernel's io (`DeviceRing::attach`); `None` when driven by hand.
    io: Option<Arc<resident_core::runtime::io::KernelIo<In, Out>>>,
    /// As a consumer: what producers need to dispatch this kernel over their outputs
    /// (plain handlers only), and the inbox offered while the pump runs.
    consumer: Option<link::ConsumerSide>,
    inbox: Option<Arc<link::Inbox<In>>>,
    /// Of `processed`: messages producers handed over on the device.
    forwarded: u64,
    /// As a producer: the link to the `forward_to` target's inbox, while linked.
    link: Option<link::ProducerLink<In, Out>>,
    /// Batches a link gave back, oldest first: they run here before `pending`.
    backlog: VecDeque<Vec<Slot<In>>>,
    /// When the target was last looked for, and an inbox that could not be linked.
    last_probe: Option<Instant>,
    refused: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// `stop` began: no new link.
    stopping: bool,
    /// Inputs of linked batches the device never completed (for the terminate report).
    link_failed: Vec<Slot<In>>,
    _t: PhantomData<fn() -> Out>,
}

#[cfg(feature = "wgpu")]
fn layout_check(
    compiled: &super::wgsl::Compiled,
    ty: &str,
    rust: usize,
) -> Result<(), WgslLaunchError> {
    match compiled.type_size(ty) {
        Some(w) if w as usize == rust => Ok(()),
        Some(w) => Err(WgslLaunchError::LayoutMismatch {
            ty: ty.to_string(),
            wgsl: w,
            rust,
        }),
        None => Err(WgslLaunchError::Compile(WgslError {
            stage: "layout",
            message: format!("type `{ty}` not found in the compiled module"),
            line: None,
            column: None,
        })),
    }
}

#[cfg(feature = "wgpu")]
/// A compiled WGSL ring-kernel module: its pipeline, bind-group layouts and state size.
struct RingPipeline {
    pipeline: ::wgpu::ComputePipeline,
    layout: ::wgpu::BindGroupLayout,
    /// Group 1 (the bound buffers), when there are any.
    bound_layout: Option<::wgpu::BindGroupLayout>,
    /// Group 1's bind group (set once the buffers exist).
    bound: Option<::wgpu::BindGroup>,
    state_len: usize,
    workgroup: u32,
    in_order: bool,
    /// A keyed handler: where its batches' keys are, to link each key's messages (binding 6;
    /// see `keyed.rs`). A leader cut short marks its own keep flag.
    keyed: Option<keyed::KeyedBatches>,
}

#[cfg(feature = "wgpu")]
impl RingPipeline {
    fn build<In, Out>(
        ctx: &WgpuContext,
        id: &str,
        handler: &WgslHandler<In, Out>,
        batch: usize,
        in_size: usize,
        out_size: usize,
        bindings: &[DeviceBinding],
    ) -> Result<Self, WgslLaunchError> {
        ctx.check()?;
        handler.check_atomics(bindings)?;
        let source = handler.module_source_with(bindings)?;
        let compiled = compile(&source)?;
        layout_check(&compiled, &handler.names.0, in_size)?;
        layout_check(&compiled, &handler.names.1, out_size)?;
        let (_, _, state_len) = handler.state_decl.clone()?;
        layout_check(&compiled, "ResidentState", state_len)?;
        check_workgroup(ctx, [handler.workgroup, 1, 1])?;
        check_grid(
            ctx,
            (batch.div_ceil(handler.workgroup as usize) as u32, 1, 1),
        )?;
        let mut entries = batch_layout_entries().to_vec();
        let keyed = match &handler.key_field {
            Some(field) => {
                // The ring's five storage buffers, the links and the bound buffers (`keys`).
                let storage = 6 + bindings.len() as u64;
                let max = ctx.limits.max_storage_buffers_per_shader_stage as u64;
                if storage > max {
                    return Err(WgslLaunchError::Device(BackendError::WgpuLimit {
                        limit: "max_storage_buffers_per_shader_stage",
                        requested: storage,
                        max,
                    }));
                }
                if batch as u64 >= keyed::END as u64 {
                    return Err(WgslLaunchError::Device(BackendError::WgpuLimit {
                        limit: "messages in a keyed batch",
                        requested: batch as u64,
                        max: keyed::END as u64 - 1,
                    }));
                }
                entries.push(buffer_entry(
                    6,
                    ::wgpu::BufferBindingType::Storage { read_only: true },
                ));
                Some(keyed::KeyedBatches::new(keyed::key_offset(
                    &compiled, field,
                )?))
            }
            None => None,
        };
        let bound_entries: Vec<_> = (0..bindings.len())
            .map(|i| {
                buffer_entry(
                    i as u32,
                    ::wgpu::BufferBindingType::Storage { read_only: false },
                )
            })
            .collect();
        let (pipeline, layout, bound_layout) = ctx.scoped("create ring-kernel pipeline", || {
            let module = ctx
                .device
                .create_shader_module(::wgpu::ShaderModuleDescriptor {
                    label: Some(id),
                    source: ::wgpu::ShaderSource::Wgsl(Cow::Borrowed(&source)),
                });
            let layout = ctx
                .device
                .create_bind_group_layout(&::wgpu::BindGroupLayoutDescriptor {
                    label: Some(id),
                    entries: &entries,
                });
            let bound_layout = (!bound_entries.is_empty()).then(|| {
                ctx.device
                    .create_bind_group_layout(&::wgpu::BindGroupLayoutDescriptor {
                        label: Some(id),
                        entries: &bound_entries,
                    })
            });
            let pl = ctx
                .device
                .create_pipeline_layout(&::wgpu::PipelineLayoutDescriptor {
                    label: Some(id),
                    bind_group_layouts: &[Some(&layout), bound_layout.as_ref()],
                    immediate_size: 0,
                });
            let pipeline = ctx
                .device
                .create_compute_pipeline(&::wgpu::ComputePipelineDescriptor {
                    label: Some(id),
                    layout: Some(&pl),
                    module: &module,
                    entry_point: Some("resident_main"),
                    compilation_options: Default::default(),
                    cache: None,
                });
            (pipeline, layout, bound_layout)
        })?;
        Ok(RingPipeline {
            pipeline,
            layout,
            bound_layout,
            bound: None,
            state_len,
            workgroup: handler.workgroup,
            in_order: handler.in_order,
            keyed,
        })
    }

    /// One set of batch buffers bound to `state`.
    fn batch_buffers(
        &self,
        ctx: &WgpuContext,
        id: &str,
        state: &::wgpu::Buffer,
        geometry: &BatchGeometry,
    ) -> Result<BatchBuffers, BackendError> {
        let b = geometry.batch as u64;
        let none = ::wgpu::BufferUsages::empty();
        let input = ctx.storage_buffer("resident batch in", b * geometry.in_size, none)?;
        let env = ctx.storage_buffer("resident batch env", b * 32, none)?;
        let out = ctx.storage_buffer("resident batch out", b * geometry.out_size, none)?;
        let keep = ctx.storage_buffer("resident batch keep", b * 4, none)?;
        let links = match self.keyed {
            Some(_) => Some(ctx.storage_buffer("resident batch links", b * 4, none)?),
            None => None,
        };
        let staging =
            ctx.readback_buffer("resident batch staging", geometry.keep_offset + b * 4)?;
        let count = ctx.scoped("create uniform", || {
            ctx.device.create_buffer(&::wgpu::BufferDescriptor {
                label: Some("resident batch count"),
                size: 16,
                usage: ::wgpu::BufferUsages::UNIFORM | ::wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        let group = ctx.scoped("create bind group", || {
            let mut bufs = vec![&input, &env, &out, &keep, state, &count];
            bufs.extend(links.as_ref());
            let entries: Vec<_> = bufs
                .iter()
                .enumerate()
                .map(|(i, b)| ::wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: b.as_entire_binding(),
                })
                .collect();
            ctx.device.create_bind_group(&::wgpu::BindGroupDescriptor {
                label: Some(id),
                layout: &self.layout,
                entries: &entries,
            })
        })?;
        Ok(BatchBuffers {
            input,
            env,
            out,
            keep,
            links,
            count,
            staging,
            group,
        })
    }

    /// Uploads a batch into `bufs`, records its dispatch and the copies of its outputs into
    /// staging on `enc`.
    fn record<In: Message>(
        &self,
        ctx: &WgpuContext,
        enc: &mut ::wgpu::CommandEncoder,
        bufs: &BatchBuffers,
        geometry: &BatchGeometry,
        chunk: &[Slot<In>],
        scratch: &mut Vec<u8>,
    ) {
        self.upload_and_dispatch(ctx, enc, bufs, chunk, scratch);
        let n = chunk.len();
        let out_bytes = n as u64 * geometry.out_size;
        if out_bytes > 0 {
            enc.copy_buffer_to_buffer(&bufs.out, 0, &bufs.staging, 0, padded(out_bytes));
        }
        enc.copy_buffer_to_buffer(
            &bufs.keep,
            0,
            &bufs.staging,
            geometry.keep_offset,
            n as u64 * 4,
        );
    }

    /// Uploads a batch into `bufs` and records its dispatch on `enc`.
    fn upload_and_dispatch<In: Message>(
        &self,
        ctx: &WgpuContext,
        enc: &mut ::wgpu::CommandEncoder,
        bufs: &BatchBuffers,
        chunk: &[Slot<In>],
        scratch: &mut Vec<u8>,
    ) {
        let n = chunk.len();
        scratch.clear();
        for s in chunk {
            scratch.extend_from_slice(bytemuck::bytes_of(&s.payload));
        }
        ctx.write(&bufs.input, scratch);
        if let (Some(k), Some(links)) = (&self.keyed, &bufs.links) {
            // Grouped by key here, in one pass, so the device's leaders walk their own keys.
            k.with_links(scratch, std::mem::size_of::<In>(), |l| {
                ctx.write(links, bytemuck::cast_slice(l))
            });
        }
        scratch.clear();
        for s in chunk {
            scratch.extend_from_slice(bytemuck::bytes_of(&s.env));
        }
        ctx.write(&bufs.env, scratch);
        ctx.write(&bufs.count, bytemuck::bytes_of(&[n as u32, 0, 0, 0]));
        if self.in_order || self.keyed.is_some() {
            // Messages an in-order (or keyed) loop never reached must not show last batch's
            // flags.
            enc.clear_buffer(&bufs.keep, 0, Some(n as u64 * 4));
        }
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &bufs.group, &[]);
            if let Some(g) = &self.bound {
                pass.set_bind_group(1, g, &[]);
            }
            let groups = if self.in_order {
                1
            } else {
                (n as u32).div_ceil(self.workgroup)
            };
            pass.dispatch_workgroups(groups, 1, 1);
        }
    }
}

/// The keep flag an in-order entry point leaves on its batch's last message when the device
/// cut its loop short.
const CUT_SHORT: u32 = 0xffff_ffff;

#[cfg(feature = "wgpu")]
impl RingPipeline {
    /// One invocation per message (neither in order nor keyed): what device forwarding links.
    fn plain(&self) -> bool {
        !self.in_order && self.keyed.is_none()
    }

    /// Whether the device stopped a loop of this batch before its end: the in-order loop
    /// marks the last keep flag, a keyed leader its own message's.
    fn cut_short(&self, view: &[u8], geometry: &BatchGeometry, n: usize) -> bool {
        if self.keyed.is_some() {
            let at = geometry.keep_offset as usize;
            return view[at..at + 4 * n]
                .chunks_exact(4)
                .any(|f| f == CUT_SHORT.to_le_bytes());
        }
        self.in_order && cut_short(view, geometry, n)
    }
}

#[cfg(feature = "wgpu")]
/// Whether the in-order batch of `n` messages whose staging buffer is `view` was cut short.
fn cut_short(view: &[u8], geometry: &BatchGeometry, n: usize) -> bool {
    let at = geometry.keep_offset as usize + 4 * n.saturating_sub(1);
    n > 0 && view[at..at + 4] == CUT_SHORT.to_le_bytes()
}

#[cfg(feature = "wgpu")]
/// Why a WGSL ring kernel failed after launch (the source of [`DeviceError::Fault`]). `Clone` (sources are
/// shared): the engine keeps its first failure and answers it to every later check.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WgpuFault {
    /// The device stopped an in-order batch (or a key's messages of a keyed batch) before its
    /// end (see the module docs).
    #[error("the device stopped an in-order batch (or a key's messages in a keyed batch) of {messages} messages before its end (llvmpipe ends an invocation's loops after 65535 iterations in all): use smaller batches or less work per message")]
    CutShort {
        /// Messages in the batch.
        messages: usize,
    },
    /// A submitted batch was not read back within the engine's bound.
    #[error("a batch did not complete within {0:?}")]
    BatchTimeout(Duration),
    /// Stopping: the batches in flight did not complete within the terminate timeout.
    #[error("batches in flight did not complete within {0:?}")]
    StopTimeout(Duration),
    /// Mapping a batch's staging buffer for reading failed.
    #[error("reading a batch back failed: {0}")]
    ReadBack(#[source] ::wgpu::BufferAsyncError),
    /// The mapped staging buffer could not be viewed.
    #[error("mapping a batch failed: {0}")]
    MapRange(#[source] ::wgpu::MapRangeError),
    /// Polling the device failed.
    #[error("device poll failed: {0}")]
    Poll(#[source] Arc<::wgpu::PollError>),
    /// The device layer failed (device lost, a validation error, a refused submission).
    #[error(transparent)]
    Device(Arc<BackendError>),
}

#[cfg(feature = "wgpu")]
/// Sizes of one batch set.
struct BatchGeometry {
    batch: usize,
    in_size: u64,
    out_size: u64,
    /// Where the keep flags start in the staging buffer (after the outputs).
    keep_offset: u64,
}

#[cfg(feature = "wgpu")]
impl BatchGeometry {
    fn new(batch: usize, in_size: usize, out_size: usize) -> Self {
        let batch = batch.max(1);
        BatchGeometry {
            batch,
            in_size: in_size as u64,
            out_size: out_size as u64,
            keep_offset: padded(batch as u64 * out_size as u64),
        }
    }
}

#[cfg(feature = "wgpu")]
/// Reads the outputs of a completed batch from its mapped staging buffer, in input order:
/// each kept output carries the request's envelope with `correlation_id` = its `message_id`.
/// Requests that were `call`s and got no output go to `unanswered`.
fn decode<In, Out: Message>(
    view: &[u8],
    geometry: &BatchGeometry,
    inputs: &[Slot<In>],
    out: &mut impl Extend<Slot<Out>>,
    unanswered: &mut Vec<Envelope>,
) {
    let osz = std::mem::size_of::<Out>();
    let keep_at = geometry.keep_offset as usize;
    out.extend(inputs.iter().enumerate().filter_map(|(i, s)| {
        let k = &view[keep_at + 4 * i..keep_at + 4 * i + 4];
        if k == [0, 0, 0, 0] {
            if s.env.is_call() {
                unanswered.push(s.env);
            }
            return None;
        }
        let payload: Out = bytemuck::pod_read_unaligned(&view[i * osz..(i + 1) * osz]);
        let env = Envelope {
            correlation_id: s.env.message_id,
            ..s.env
        };
        Some(Slot::new(env, payload))
    }));
}

#[cfg(feature = "wgpu")]
impl<In: Message, Out: Message> WgpuEngine<In, Out> {
    /// Compiles `handler`, allocates the state and the handler's in-flight batch sets of
    /// `batch` messages.
    /// `bindings` must have passed [`check_bindings`]; their device copies are created here,
    /// initialized from `DeviceBinding::initial`, and served to the host by the returned
    /// [`BoundBuffers`] (`None` without bindings).
    pub fn launch(
        ctx: Arc<WgpuContext>,
        id: &str,
        handler: &WgslHandler<In, Out>,
        batch: usize,
        bindings: &[DeviceBinding],
    ) -> Result<Launched<In, Out>, WgslLaunchError> {
        let geometry =
            BatchGeometry::new(batch, std::mem::size_of::<In>(), std::mem::size_of::<Out>());
        let mut p = RingPipeline::build(
            &ctx,
            id,
            handler,
            geometry.batch,
            std::mem::size_of::<In>(),
            std::mem::size_of::<Out>(),
            bindings,
        )?;
        let bound = match &p.bound_layout {
            Some(layout) => {
                let b = BoundBuffers::create(&ctx, id, layout, bindings)?;
                p.bound = Some(b.group.clone());
                Some(Arc::new(b))
            }
            None => None,
        };
        let state_buf = ctx.storage_buffer(
            "resident state",
            p.state_len as u64,
            ::wgpu::BufferUsages::empty(),
        )?;
        ctx.write(&state_buf, &handler.state);
        let consumer = if p.plain() {
            let source = handler.module_source_with(bindings)?
                + &link::linked_entry(handler.workgroup, &handler.function);
            Some(link::ConsumerSide {
                source,
                state: state_buf.clone(),
                bound_layout: p.bound_layout.clone(),
                bound: p.bound.clone(),
                workgroup: handler.workgroup,
                bound_count: bindings.len(),
                out_size: std::mem::size_of::<Out>() as u64,
            })
        } else {
            None
        };
        let mut sets = Vec::with_capacity(handler.in_flight);
        for _ in 0..handler.in_flight {
            sets.push(p.batch_buffers(&ctx, id, &state_buf, &geometry)?);
        }
        let state = Arc::new(DeviceState {
            ctx: ctx.clone(),
            buffer: state_buf.clone(),
            len: p.state_len,
        });
        let free = (0..sets.len()).rev().collect();
        Ok((
            WgpuEngine {
                ctx,
                pipeline: p,
                sets,
                free,
                in_flight: VecDeque::new(),
                pending: Vec::new(),
                ready: VecDeque::new(),
                unanswered: Vec::new(),
                geometry,
                counts: Arc::default(),
                failure: None,
                scratch: Vec::new(),
                state_buf,
                io: None,
                consumer,
                inbox: None,
                forwarded: 0,
                link: None,
                backlog: VecDeque::new(),
                last_probe: None,
                refused: None,
                stopping: false,
                link_failed: Vec::new(),
                _t: PhantomData,
            },
            state,
            bound,
        ))
    }
}

#[cfg(feature = "wgpu")]
/// The device copies of a ring kernel's bound buffers: one storage buffer each, alive as long
/// as the kernel (and as long as a handle reading them), bound as group 1.
///
/// # How host access is synchronized with the kernel
/// Every batch of the kernel is one submission on the device's single queue, and the queue
/// runs submissions in order. A host [`read`](DeviceBuffers::read) submits a copy of the
/// buffer into a staging buffer on that queue: it runs after every batch submitted before it
/// and before every batch submitted after it, so the copy is the buffer **between two
/// batches** (never torn by one in flight), then maps it with a bounded wait. A host
/// [`write`](DeviceBuffers::write) is a `queue.write_buffer`, which wgpu orders before every
/// later submission: the next batch sees the whole write, the batches already submitted do
/// not see any of it.
pub(crate) struct BoundBuffers {
    ctx: Arc<WgpuContext>,
    /// Name, device buffer and byte length (the buffer may be padded past it).
    buffers: Vec<(String, ::wgpu::Buffer, usize)>,
    group: ::wgpu::BindGroup,
}

#[cfg(feature = "wgpu")]
impl BoundBuffers {
    fn create(
        ctx: &Arc<WgpuContext>,
        id: &str,
        layout: &::wgpu::BindGroupLayout,
        bindings: &[DeviceBinding],
    ) -> Result<Self, WgslLaunchError> {
        let mut buffers = Vec::with_capacity(bindings.len());
        for b in bindings {
            let err = |source| WgslLaunchError::BoundBuffer {
                name: b.name.clone(),
                source,
            };
            let bytes = b.len as u64 * b.elem.size as u64;
            // A runtime-sized array binds at least one element: an empty buffer is padded
            // (the handler uses `<name>_len`, which stays 0).
            let buf = ctx
                .storage_buffer(
                    &b.name,
                    bytes.max(b.elem.size as u64),
                    ::wgpu::BufferUsages::empty(),
                )
                .map_err(err)?;
            ctx.write(&buf, &b.initial);
            buffers.push((b.name.clone(), buf, bytes as usize));
        }
        let group = ctx.scoped("create bound-buffer bind group", || {
            let entries: Vec<_> = buffers
                .iter()
                .enumerate()
                .map(|(i, (_, b, _))| ::wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: b.as_entire_binding(),
                })
                .collect();
            ctx.device.create_bind_group(&::wgpu::BindGroupDescriptor {
                label: Some(id),
                layout,
                entries: &entries,
            })
        })?;
        Ok(BoundBuffers {
            ctx: ctx.clone(),
            buffers,
            group,
        })
    }

    fn get(&self, index: usize, len: usize) -> Result<&::wgpu::Buffer, DeviceError> {
        let Some((name, buf, bytes)) = self.buffers.get(index) else {
            return Err(DeviceError::Binding {
                name: format!("#{index}"),
                reason: format!("the kernel has {} bound buffers", self.buffers.len()),
            });
        };
        if len != *bytes {
            return Err(DeviceError::Binding {
                name: name.clone(),
                reason: format!("{len} bytes given, the buffer holds {bytes}"),
            });
        }
        Ok(buf)
    }
}

#[cfg(feature = "wgpu")]
impl DeviceBuffers for BoundBuffers {
    fn read(&self, index: usize, out: &mut [u8]) -> Result<(), DeviceError> {
        let buf = self.get(index, out.len())?;
        // Submitted behind every batch already submitted (see the type's docs); bounded wait.
        self.ctx.read(out, buf).map_err(DeviceError::from)
    }

    fn write(&self, index: usize, data: &[u8]) -> Result<(), DeviceError> {
        let buf = self.get(index, data.len())?;
        // Ordered before every later submission, so before the kernel's next batch; the empty
        // submission sends it now rather than with that batch.
        self.ctx.write(buf, data);
        self.ctx.queue.submit([]);
        self.ctx.check().map_err(DeviceError::from)
    }
}

#[cfg(feature = "wgpu")]
impl<In: Message, Out: Message> WgpuEngine<In, Out> {
    fn submit(
        &mut self,
        set: usize,
        chunk: Vec<Slot<In>>,
    ) -> Result<(), (BackendError, Vec<Slot<In>>)> {
        let bufs = &self.sets[set];
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        self.pipeline.record(
            &self.ctx,
            &mut enc,
            bufs,
            &self.geometry,
            &chunk,
            &mut self.scratch,
        );
        self.ctx.queue.submit([enc.finish()]);
        let mapped: MapResult = Arc::new(Mutex::new(None));
        let m = mapped.clone();
        bufs.staging
            .map_async(::wgpu::MapMode::Read, .., move |r| *m.lock() = Some(r));
        if let Err(e) = self.ctx.check() {
            return Err((e, chunk));
        }
        self.in_flight.push_back(InFlight {
            set,
            inputs: chunk,
            fused: None,
            mapped,
            submitted: Instant::now(),
        });
        Ok(())
    }

    /// Publishes every completed batch at the front, in order. `Err` on a failed map or a
    /// batch past its deadline.
    fn collect(&mut self) -> Result<(), WgpuFault> {
        while let Some(front) = self.in_flight.front() {
            let r = front.mapped.lock().take();
            match r {
                None => {
                    if front.submitted.elapsed() > WAIT_TIMEOUT {
                        return Err(WgpuFault::BatchTimeout(WAIT_TIMEOUT));
                    }
                    return Ok(());
                }
                Some(Err(e)) => return Err(WgpuFault::ReadBack(e)),
                Some(Ok(())) => {}
            }
            let mut f = self.in_flight.pop_front().expect("front exists");
            if let Some(mut b) = f.fused.take() {
                // A producer's batch and this kernel's dispatch over its outputs.
                match b.staging.get_mapped_range(..) {
                    Ok(view) => {
                        let handled = link::decode_fused(&view, b.layout, &b.envs, &mut self.ready);
                        b.done.ran(&view, b.layout);
                        // Counted before the outputs become visible (the pump stores
                        // counters first).
                        self.counts.add(handled);
                        self.forwarded += handled;
                    }
                    Err(e) => {
                        f.fused = Some(b);
                        self.in_flight.push_front(f);
                        return Err(WgpuFault::MapRange(e));
                    }
                }
                b.staging.unmap();
                b.done.finish();
                continue;
            }
            let bufs = &self.sets[f.set];
            match bufs.staging.get_mapped_range(..) {
                Ok(view)
                    if self
                        .pipeline
                        .cut_short(&view, &self.geometry, f.inputs.len()) =>
                {
                    let n = f.inputs.len();
                    drop(view);
                    // The batch goes back whole through `reclaim` (its first messages did run).
                    self.in_flight.push_front(f);
                    return Err(WgpuFault::CutShort { messages: n });
                }
                Ok(view) => {
                    // Counted before the outputs become visible (the pump stores counters
                    // first).
                    self.counts.add(f.inputs.len() as u64);
                    decode(
                        &view,
                        &self.geometry,
                        &f.inputs,
                        &mut self.ready,
                        &mut self.unanswered,
                    );
                }
                Err(e) => {
                    // Keep the batch so `reclaim` hands its inputs back.
                    self.in_flight.push_front(f);
                    return Err(WgpuFault::MapRange(e));
                }
            }
            bufs.staging.unmap();
            self.free.push(f.set);
        }
        Ok(())
    }

    /// Batches of this kernel handed to a consumer and not yet run or given back.
    fn link_outstanding(&self) -> usize {
        self.link.as_ref().map_or(0, |l| l.outstanding())
    }

    /// Nothing of this kernel on the device: a partial batch may go.
    fn idle(&self) -> bool {
        self.in_flight.is_empty() && self.link_outstanding() == 0
    }

    /// Submits the pending inputs (after any batches a link gave back): handed to the linked
    /// consumer, or on this kernel's own batch sets. `false` when they cannot go now (no
    /// free set, or the other route still has batches of this kernel on the device: the two
    /// never run batches of one kernel at once, so its state sees them in order), or the
    /// submission failed (then the inputs stay for `reclaim`).
    fn flush(&mut self) -> bool {
        self.absorb_link();
        if self.failure.is_some() {
            return self.pending.is_empty() && self.backlog.is_empty();
        }
        while !self.backlog.is_empty() {
            if self.link_outstanding() > 0 {
                return false;
            }
            let Some(set) = self.free.pop() else {
                return false;
            };
            let chunk = self.backlog.pop_front().expect("not empty");
            if !self.submit_own(set, chunk, true) {
                return false;
            }
        }
        if self.pending.is_empty() {
            return true;
        }
        if self.link.is_none() && self.in_flight.is_empty() && self.ready.is_empty() {
            self.probe_link();
        }
        if let Some(l) = self.link.as_mut() {
            if l.closing {
                // Unlinked once its batches are back or done (`absorb_link`).
                return false;
            }
            if !self.in_flight.is_empty() {
                return false;
            }
            let chunk =
                std::mem::replace(&mut self.pending, Vec::with_capacity(self.geometry.batch));
            return match l.hand_over(
                &self.ctx,
                &self.pipeline,
                &self.geometry,
                chunk,
                &mut self.scratch,
            ) {
                Ok(()) => true,
                Err(chunk) => {
                    // No free fused set (the consumer is behind), or the inbox closed (then
                    // the chunk is in the link's returned batches, empty here).
                    if !chunk.is_empty() {
                        self.pending = chunk;
                    }
                    false
                }
            };
        }
        let Some(set) = self.free.pop() else {
            return false;
        };
        let chunk = std::mem::replace(&mut self.pending, Vec::with_capacity(self.geometry.batch));
        self.submit_own(set, chunk, false)
    }

    /// Submits `chunk` on batch set `set`; on failure the chunk goes back where it came from.
    fn submit_own(&mut self, set: usize, chunk: Vec<Slot<In>>, from_backlog: bool) -> bool {
        match self.submit(set, chunk) {
            Ok(()) => true,
            Err((e, chunk)) => {
                self.free.push(set);
                if from_backlog {
                    self.backlog.push_front(chunk);
                } else {
                    self.pending = chunk;
                }
                self.fail(WgpuFault::Device(Arc::new(e)));
                false
            }
        }
    }

    /// Links to the `forward_to` target's inbox when there is one this kernel can hand its
    /// batches to (see `link`'s docs); looked for at most every `PROBE_EVERY`.
    fn probe_link(&mut self) {
        if self.stopping || self.link.is_some() || self.failure.is_some() || !self.pipeline.plain()
        {
            return;
        }
        let Some(io) = &self.io else {
            return;
        };
        let Some(f) = io.forward_target() else {
            return;
        };
        if f.path() == resident_core::runtime::kernel::ForwardPath::HostRelay {
            return;
        }
        if self.last_probe.is_some_and(|t| t.elapsed() < PROBE_EVERY) {
            return;
        }
        self.last_probe = Some(Instant::now());
        let Ok(port) = f.port() else {
            return;
        };
        let Some(any) = port.device_link.lock().clone() else {
            return;
        };
        if self.refused.as_ref().is_some_and(|r| Arc::ptr_eq(r, &any)) {
            return;
        }
        let Ok(inbox) = any.clone().downcast::<link::Inbox<Out>>() else {
            return;
        };
        if inbox.is_closed() {
            // The target is terminating; a relaunched one is looked up anew.
            f.forget();
            return;
        }
        if !Arc::ptr_eq(&inbox.ctx, &self.ctx) {
            return;
        }
        // Outputs relayed before now are in the target's queue: they go first (barrier).
        let barrier = port.mailbox.counters().accepted;
        match link::ProducerLink::new(
            &self.ctx,
            &self.pipeline,
            &self.state_buf,
            &self.geometry,
            inbox,
            io.clone(),
            self.counts.clone(),
            self.sets.len(),
            barrier,
        ) {
            Ok(l) => self.link = Some(l),
            Err(_) => self.refused = Some(any),
        }
    }

    /// Takes back what the link returned (batches the consumer gave back, into `backlog`;
    /// inputs of batches the device never completed, with the fault), and unlinks once the
    /// inbox closed and no batch of this kernel is out.
    fn absorb_link(&mut self) {
        let Some(l) = self.link.as_mut() else {
            return;
        };
        if !l.closing && l.inbox_closed() {
            l.closing = true;
        }
        self.backlog.extend(l.take_returned());
        let (mut failed, fault) = l.take_failed();
        self.link_failed.append(&mut failed);
        if l.closing && l.outstanding() == 0 {
            // Late returns (a batch given back while we looked) are taken before unlinking.
            self.backlog.extend(l.take_returned());
            let (mut failed, _) = l.take_failed();
            self.link_failed.append(&mut failed);
            self.link = None;
            if let Some(f) = self.io.as_ref().and_then(|io| io.forward_target()) {
                f.forget();
            }
        }
        if let Some(fault) = fault {
            self.fail(fault);
        }
    }

    fn fail(&mut self, reason: WgpuFault) {
        if self.failure.is_none() {
            self.failure = Some(reason);
        }
    }
}

#[cfg(feature = "wgpu")]
/// How often a producer whose target has no inbox (yet) looks again.
const PROBE_EVERY: Duration = Duration::from_millis(20);

#[cfg(feature = "wgpu")]
/// How long a consumer's pump waits for the producer's batch at the front of its in-flight
/// list before it goes on with its loop (new inputs, lifecycle flags).
const FUSED_WAIT: Duration = Duration::from_micros(500);

#[cfg(feature = "wgpu")]
/// Fused batches a consumer keeps in flight besides its own batch sets.
const FUSED_IN_FLIGHT: usize = 4;

#[cfg(feature = "wgpu")]
impl<In: Message, Out: Message> DeviceRing<In, Out> for WgpuEngine<In, Out> {
    fn push(&mut self, slots: &[Slot<In>]) -> usize {
        // Full batches go out while a batch set is free; a partial batch waits while the
        // device is busy (it fills up meanwhile, which is what throughput needs) and goes at
        // once when the device is idle (which is what latency needs).
        let mut taken = 0;
        while self.failure.is_none() {
            if self.pending.len() >= self.geometry.batch {
                if !self.flush() {
                    break;
                }
                continue;
            }
            if taken == slots.len() {
                break;
            }
            let n = (self.geometry.batch - self.pending.len()).min(slots.len() - taken);
            self.pending.extend_from_slice(&slots[taken..taken + n]);
            taken += n;
        }
        if self.idle() {
            self.flush();
        }
        taken
    }

    fn pull(&mut self, out: &mut Vec<Slot<Out>>, max: usize) -> usize {
        if self.ready.is_empty() && !self.in_flight.is_empty() && self.failure.is_none() {
            // Runs the map callbacks of whatever has completed. A producer's batch at the
            // front is waited for briefly (bounded by `FUSED_WAIT`): nothing but this pump
            // polls for it, and its producer waits for the batch set it frees, so sleeping
            // blind (the pump's idle backoff) would add that sleep to every forwarded batch.
            //
            // Polled, not `PollType::Wait` with a timeout: wgpu-core 30 asserts (panics) when
            // a wait that timed out meets another thread's submission half published (seen
            // here with several pumps submitting at once).
            let fused_front = self.in_flight.front().is_some_and(|f| f.fused.is_some());
            let wait = fused_front
                && self
                    .io
                    .as_ref()
                    .is_none_or(|io| io.input_queue().is_empty());
            let until = Instant::now() + FUSED_WAIT;
            loop {
                if let Err(e) = self.ctx.device.poll(::wgpu::PollType::Poll) {
                    self.fail(WgpuFault::Poll(Arc::new(e)));
                    break;
                }
                let done = self
                    .in_flight
                    .front()
                    .is_none_or(|f| f.mapped.lock().is_some());
                if !wait || done || Instant::now() >= until {
                    break;
                }
                std::thread::sleep(Duration::from_micros(20));
            }
            if let Err(e) = self.collect() {
                self.fail(e);
            }
        }
        // A partial batch goes only when nothing of this kernel is on the device (linked or
        // not), as in `push`; batches a link gave back go as soon as they can.
        self.absorb_link();
        if !self.backlog.is_empty() || self.idle() {
            self.flush();
        }
        if let Some(l) = &self.link {
            // A whole batch waits for a fused set the consumer has not freed yet: wait for
            // it (bounded) instead of spinning on the full input queue.
            if self.pending.len() >= self.geometry.batch && self.ready.is_empty() {
                l.wait_free(FUSED_WAIT);
            }
        }
        let n = self.ready.len().min(max);
        out.extend(self.ready.drain(..n));
        n
    }

    fn set_active(&mut self, _on: bool) -> Result<(), DeviceError> {
        // Nothing runs on the device between batches: the pump stops feeding when inactive.
        Ok(())
    }

    fn heartbeat(&mut self) {}

    fn check(&mut self) -> Result<(), DeviceError> {
        if let Err(e) = self.ctx.check() {
            self.fail(WgpuFault::Device(Arc::new(e)));
        }
        self.absorb_link();
        match &self.failure {
            Some(f) => Err(DeviceError::Fault(Arc::new(f.clone()))),
            None => Ok(()),
        }
    }

    fn counters(&self) -> RingCounters {
        RingCounters {
            // Batches first: see `store_counters`.
            batches: self.counts.batches.load(Ordering::Relaxed),
            processed: self.counts.processed.load(Ordering::Acquire),
            lost: 0,
            forwarded: self.forwarded,
        }
    }

    fn stop(&mut self, timeout: Duration) -> Result<(), DeviceError> {
        // Finish the batches in flight so their outputs are published (bounded).
        let deadline = Instant::now() + timeout.min(WAIT_TIMEOUT);
        self.stopping = true;
        // As a consumer: no more batches from producers; those not taken go back to them.
        if let Some(inbox) = self.inbox.take() {
            if let Some(io) = &self.io {
                let mut slot = io.device_link().lock();
                let ours = link::erase(inbox.clone());
                if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, &ours)) {
                    *slot = None;
                }
            }
            inbox.close();
            self.inbox = Some(inbox);
        }
        // As a producer: batches the consumer has not taken come back and run here.
        if let Some(l) = self.link.as_mut() {
            l.withdraw();
        }
        // The pending partial batch is "in hand": it runs too.
        self.flush();
        while (!self.in_flight.is_empty()
            || !self.pending.is_empty()
            || !self.backlog.is_empty()
            || self.link.is_some())
            && self.failure.is_none()
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.fail(WgpuFault::StopTimeout(timeout));
                break;
            }
            if self.in_flight.is_empty() {
                // Only the consumer's pump completes this kernel's linked batches.
                std::thread::sleep(Duration::from_micros(200));
            } else {
                let r = self.ctx.device.poll(::wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: Some(left.min(Duration::from_millis(100))),
                });
                if let Err(e) = r {
                    if !matches!(e, ::wgpu::PollError::Timeout) {
                        self.fail(WgpuFault::Poll(Arc::new(e)));
                    }
                }
            }
            if let Err(e) = self.ctx.check() {
                self.fail(WgpuFault::Device(Arc::new(e)));
            }
            if let Err(e) = self.collect() {
                self.fail(e);
            }
            self.flush();
        }
        match &self.failure {
            Some(f) => Err(DeviceError::Fault(Arc::new(f.clone()))),
            None => Ok(()),
        }
    }

    fn take_unanswered_calls(&mut self, out: &mut Vec<Envelope>) {
        out.append(&mut self.unanswered);
    }

    fn reclaim(&mut self) -> Vec<Slot<In>> {
        // Batches that never completed (device lost or timed out) and inputs never submitted:
        // they come back, in the order they were taken. A producer's batch this kernel
        // submitted goes back to that producer's report (and fails it with this fault).
        self.absorb_link();
        let fault = self
            .failure
            .clone()
            .unwrap_or(WgpuFault::StopTimeout(Duration::ZERO));
        let mut v: Vec<Slot<In>> = std::mem::take(&mut self.link_failed);
        for mut f in self.in_flight.drain(..) {
            match f.fused.take() {
                Some(b) => b.done.failed(fault.clone()),
                None => v.append(&mut f.inputs),
            }
        }
        v.extend(self.backlog.drain(..).flatten());
        v.append(&mut self.pending);
        v
    }

    fn attach(&mut self, io: &Arc<resident_core::runtime::io::KernelIo<In, Out>>) {
        self.io = Some(io.clone());
        // A kernel whose own outputs are forwarded takes no batches on the device: its
        // outputs would otherwise leave by two routes (see `link`).
        if io.forward_target().is_none() {
            if let Some(side) = self.consumer.take() {
                let inbox = Arc::new(link::Inbox::new(
                    self.ctx.clone(),
                    side,
                    io.input_queue().clone(),
                ));
                *io.device_link().lock() = Some(link::erase(inbox.clone()));
                self.inbox = Some(inbox);
            }
        }
    }

    fn take_forwarded(&mut self, unpushed: usize) -> usize {
        let Some(inbox) = self.inbox.clone() else {
            return 0;
        };
        if self.failure.is_some() || self.stopping {
            return 0;
        }
        // This kernel's pending inputs first (the barrier counts them as submitted).
        if !self.pending.is_empty() && (!self.flush() || !self.pending.is_empty()) {
            return 0;
        }
        // Messages taken from the queue and submitted (or dropped by its policy): a batch's
        // barrier is passed once everything accepted before it was linked is among them.
        let taken = self.io.as_ref().map_or(u64::MAX, |io| {
            let c = io.input_queue().counters();
            (c.delivered + c.dropped).saturating_sub(unpushed as u64)
        });
        let mut n = 0;
        while self.in_flight.len() < self.sets.len() + FUSED_IN_FLIGHT {
            let Some(mut b) = inbox.next(taken) else {
                break;
            };
            let commands = b.commands.take().expect("a fused batch is submitted once");
            self.ctx.queue.submit([commands]);
            let mapped: MapResult = Arc::new(Mutex::new(None));
            let m = mapped.clone();
            b.staging
                .map_async(::wgpu::MapMode::Read, .., move |r| *m.lock() = Some(r));
            n += b.envs.len();
            self.in_flight.push_back(InFlight {
                set: usize::MAX,
                inputs: Vec::new(),
                fused: Some(b),
                mapped,
                submitted: Instant::now(),
            });
            if let Err(e) = self.ctx.check() {
                self.fail(WgpuFault::Device(Arc::new(e)));
                break;
            }
        }
        n
    }

    fn forwarded_waiting(&self) -> bool {
        self.inbox.as_ref().is_some_and(|i| i.waiting())
    }
}

#[cfg(feature = "wgpu")]
/// The stateless baseline the benchmark measures a ring kernel against: the same compiled
/// handler, one batch at a time, with the state uploaded before and downloaded after every
/// batch (what a kernel without device residency must do). Not a ring kernel: no queues, no
/// pipelining, no runtime.
pub struct StatelessBatches<In, Out> {
    ctx: Arc<WgpuContext>,
    pipeline: RingPipeline,
    bufs: BatchBuffers,
    state_buf: ::wgpu::Buffer,
    state_staging: ::wgpu::Buffer,
    geometry: BatchGeometry,
    host_state: Vec<u8>,
    scratch: Vec<u8>,
    _t: PhantomData<fn(In) -> Out>,
}

#[cfg(feature = "wgpu")]
impl<In: Message, Out: Message> StatelessBatches<In, Out> {
    /// Compiles `handler` for batches of up to `batch` messages on the shared wgpu device.
    pub fn new(handler: &WgslHandler<In, Out>, batch: usize) -> Result<Self, WgslLaunchError> {
        let ctx = WgpuContext::shared(false)?;
        let (is, os) = (std::mem::size_of::<In>(), std::mem::size_of::<Out>());
        let geometry = BatchGeometry::new(batch, is, os);
        let pipeline =
            RingPipeline::build(&ctx, "stateless", handler, geometry.batch, is, os, &[])?;
        let state_buf = ctx.storage_buffer(
            "stateless state",
            pipeline.state_len as u64,
            ::wgpu::BufferUsages::empty(),
        )?;
        let state_staging =
            ctx.readback_buffer("stateless state staging", pipeline.state_len as u64)?;
        let bufs = pipeline.batch_buffers(&ctx, "stateless", &state_buf, &geometry)?;
        Ok(StatelessBatches {
            ctx,
            pipeline,
            bufs,
            state_buf,
            state_staging,
            geometry,
            host_state: handler.state.clone(),
            scratch: Vec::new(),
            _t: PhantomData,
        })
    }

    /// Uploads the state and `inputs`, runs the handler, downloads the outputs (appended to
    /// `out` in input order) and the state, and waits (bounded).
    pub fn run(
        &mut self,
        inputs: &[Slot<In>],
        out: &mut Vec<Slot<Out>>,
    ) -> Result<(), BackendError> {
        if inputs.len() > self.geometry.batch {
            return Err(BackendError::BadArgument {
                index: 0,
                reason: format!(
                    "{} inputs, batch size is {}",
                    inputs.len(),
                    self.geometry.batch
                ),
            });
        }
        if inputs.is_empty() {
            return Ok(());
        }
        let ctx = &self.ctx;
        ctx.write(&self.state_buf, &self.host_state);
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        self.pipeline.record(
            ctx,
            &mut enc,
            &self.bufs,
            &self.geometry,
            inputs,
            &mut self.scratch,
        );
        enc.copy_buffer_to_buffer(
            &self.state_buf,
            0,
            &self.state_staging,
            0,
            padded(self.host_state.len() as u64),
        );
        let index = ctx.queue.submit([enc.finish()]);
        let done: [MapResult; 2] = [Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None))];
        for (buf, d) in [&self.bufs.staging, &self.state_staging]
            .into_iter()
            .zip(&done)
        {
            let d = d.clone();
            buf.map_async(::wgpu::MapMode::Read, .., move |r| *d.lock() = Some(r));
        }
        ctx.wait_for(Some(index), "stateless batch")?;
        let deadline = Instant::now() + WAIT_TIMEOUT;
        while done.iter().any(|d| d.lock().is_none()) {
            if Instant::now() > deadline {
                return Err(BackendError::WgpuTimeout {
                    operation: "stateless batch map",
                    waited: WAIT_TIMEOUT,
                });
            }
            ctx.wait_idle("stateless batch map")?;
        }
        for d in &done {
            if let Some(Err(e)) = d.lock().take() {
                return Err(BackendError::WgpuDevice {
                    operation: "stateless batch map",
                    reason: e.to_string(),
                });
            }
        }
        let map_err = |e: ::wgpu::MapRangeError| BackendError::WgpuDevice {
            operation: "stateless batch map",
            reason: e.to_string(),
        };
        {
            let view = self.bufs.staging.get_mapped_range(..).map_err(map_err)?;
            if self.pipeline.cut_short(&view, &self.geometry, inputs.len()) {
                drop(view);
                self.bufs.staging.unmap();
                self.state_staging.unmap();
                return Err(BackendError::WgpuDevice {
                    operation: "stateless batch",
                    reason: WgpuFault::CutShort {
                        messages: inputs.len(),
                    }
                    .to_string(),
                });
            }
            decode(&view, &self.geometry, inputs, out, &mut Vec::new());
            let sv = self.state_staging.get_mapped_range(..).map_err(map_err)?;
            let n = self.host_state.len();
            self.host_state.copy_from_slice(&sv[..n]);
        }
        self.bufs.staging.unmap();
        self.state_staging.unmap();
        Ok(())
    }

    /// The state as of the last batch (host copy).
    pub fn state(&self) -> &[u8] {
        &self.host_state
    }
}

#[cfg(feature = "wgpu")]
/// The device side of a WGSL ring kernel without the runtime around it (no host mailboxes,
/// no pump thread, no call routing): the engine a `RingKernel` on wgpu runs, driven by hand.
/// It exists so the benchmark can separate what device residency and pipelining buy from
/// what the runtime's host queues cost; applications use `RingKernel::wgsl`.
pub struct ResidentBatches<In: Message, Out: Message> {
    engine: WgpuEngine<In, Out>,
    state: Arc<DeviceState>,
}

#[cfg(feature = "wgpu")]
impl<In: Message, Out: Message> ResidentBatches<In, Out> {
    /// Compiles `handler` for batches of up to `batch` messages on the shared wgpu device.
    pub fn new(handler: &WgslHandler<In, Out>, batch: usize) -> Result<Self, WgslLaunchError> {
        let ctx = WgpuContext::shared(false)?;
        let (engine, state, _) = WgpuEngine::launch(ctx, "resident-batches", handler, batch, &[])?;
        Ok(ResidentBatches { engine, state })
    }

    /// Takes the longest prefix of `inputs` that fits (full batches are submitted while a
    /// batch set is free; see the module docs); returns how many were taken.
    pub fn push(&mut self, inputs: &[Slot<In>]) -> usize {
        self.engine.push(inputs)
    }

    /// Moves up to `max` outputs of completed batches to `out`, in input order, without
    /// blocking; `Err` once the device failed.
    pub fn pull(&mut self, out: &mut Vec<Slot<Out>>, max: usize) -> Result<usize, DeviceError> {
        let n = self.engine.pull(out, max);
        self.engine.check()?;
        Ok(n)
    }

    /// Waits (bounded) until every input taken so far has run and its outputs are ready.
    pub fn finish(&mut self, timeout: Duration) -> Result<(), DeviceError> {
        self.engine.stop(timeout)
    }

    /// A copy of the device state (see `KernelHandle::snapshot_state`).
    pub fn snapshot_state(&self) -> Result<Vec<u8>, BackendError> {
        self.state.read()
    }
}

/// One compute-visible buffer binding of a batch pipeline's layout.
#[cfg(feature = "wgpu")]
pub(super) fn buffer_entry(
    binding: u32,
    ty: ::wgpu::BufferBindingType,
) -> ::wgpu::BindGroupLayoutEntry {
    ::wgpu::BindGroupLayoutEntry {
        binding,
        visibility: ::wgpu::ShaderStages::COMPUTE,
        ty: ::wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

/// The fixed bindings 0-5 of a ring kernel's batch pipeline (inputs and envelopes read;
/// outputs, keep flags and state written; the batch parameters as a uniform), shared by the
/// plain pipeline and the linked one (`link.rs`, which adds the producer's outputs as 6).
#[cfg(feature = "wgpu")]
pub(super) fn batch_layout_entries() -> [::wgpu::BindGroupLayoutEntry; 6] {
    let read = ::wgpu::BufferBindingType::Storage { read_only: true };
    let write = ::wgpu::BufferBindingType::Storage { read_only: false };
    [
        buffer_entry(0, read),
        buffer_entry(1, read),
        buffer_entry(2, write),
        buffer_entry(3, write),
        buffer_entry(4, write),
        buffer_entry(5, ::wgpu::BufferBindingType::Uniform),
    ]
}
