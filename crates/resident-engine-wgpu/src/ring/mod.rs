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
//!
//! # The files
//!
//! `handler.rs` is the handler a kernel definition carries and the WGSL module it generates
//! (in every build); `pipeline.rs` the compiled module, its batch buffers and how a batch is
//! recorded and read back; `engine.rs` the device side of a launched kernel (the
//! `DeviceRing` the pump drives, its state and bound buffers); `link.rs` device-side
//! forwarding; `keyed.rs` keyed batches; `baseline.rs` the benchmark's baselines.
//!
//! [`DeviceError::Binding`]: resident_core::engine::error::DeviceError::Binding

#[cfg(feature = "wgpu")]
mod baseline;
#[cfg(feature = "wgpu")]
mod engine;
#[cfg(feature = "wgpu")]
mod fault;
mod handler;
mod keyed;
#[cfg(feature = "wgpu")]
pub(crate) mod link;
#[cfg(feature = "wgpu")]
mod pipeline;

#[cfg(feature = "wgpu")]
pub use baseline::{ResidentBatches, StatelessBatches};
#[cfg(feature = "wgpu")]
pub(crate) use engine::WgpuEngine;
#[cfg(feature = "wgpu")]
pub use fault::WgpuFault;
#[cfg(feature = "wgpu")]
pub(crate) use handler::check_bindings;
pub use handler::WgslHandler;
pub use resident_core::engine::error::WgslLaunchError;
