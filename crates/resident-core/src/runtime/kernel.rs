//! `RingKernel`: the definition of an actor (id, queues, policy, state, handler), built with a
//! builder and handed to `Runtime::launch`.

use std::marker::PhantomData;
use std::time::Duration;

use resident_ring::{Backpressure, Message, WaitStrategy};

use crate::runtime::bind::PendingBinding;
use crate::runtime::context::{Context, LoopContext, OutsideLoop};
use crate::runtime::device_handler::{CudaSource, WgslSource};
pub use crate::runtime::io::ForwardPath;

pub(crate) type HandlerFn<In, Out, S> = Box<dyn FnMut(&mut Context<S>, In) -> Option<Out> + Send>;
pub(crate) type LoopFn<In, Out, S> = Box<dyn FnOnce(&mut LoopContext<In, Out, S>) + Send>;
pub(crate) type OutsideFn<In, Out, S> = Box<dyn FnOnce(OutsideLoop<In, Out, S>) + Send>;
/// Builds a kernel's own host from its state at launch (a keyed kernel's `KeyedHost`);
/// `Err` is the reason the configuration is invalid.
pub(crate) type HostFactory<In, Out, S> = Box<
    dyn FnOnce(
            S,
            &std::sync::Arc<crate::runtime::io::KernelIo<In, Out>>,
        ) -> Result<
            Box<dyn crate::runtime::host::RingHost<In, Out>>,
            crate::runtime::keys::KeyedError,
        > + Send,
>;

pub use crate::runtime::io::{PublishHook, TakeHook, TerminateHook};

pub(crate) enum Body<In, Out, S> {
    Handler(HandlerFn<In, Out, S>),
    Loop(LoopFn<In, Out, S>),
    Outside(OutsideFn<In, Out, S>),
}

/// The definition of a ring kernel: an actor with an input and an output queue and state that
/// stays with it. `In` and `Out` are the message types, `S` the state.
///
/// ```
/// use resident::prelude::*;
/// use std::time::Duration;
/// let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
/// let k = RingKernel::<u32, u32>::new("double")
///     .queue_size(256)
///     .state(0u64)
///     .handler(|ctx: &mut Context<u64>, x: u32| {
///         *ctx.state_mut() += 1;
///         Some(x * 2)
///     });
/// let h = rt.launch(k).unwrap();
/// h.activate().unwrap();
/// assert_eq!(h.call(21, Duration::from_secs(5)).unwrap(), 42);
/// ```
pub struct RingKernel<In, Out, S = ()> {
    pub(crate) id: String,
    pub(crate) queue_size: usize,
    pub(crate) output_queue_size: Option<usize>,
    pub(crate) lanes: usize,
    pub(crate) backpressure: Backpressure,
    pub(crate) batch_size: usize,
    pub(crate) wait: Option<WaitStrategy>,
    pub(crate) state: S,
    pub(crate) body: Option<Body<In, Out, S>>,
    /// A handler (or loop) given before `.state(..)`: it was written against `Context<()>`,
    /// so it runs with a unit context while the state is kept (order does not matter).
    pub(crate) unit_body: Option<Body<In, Out, ()>>,
    pub(crate) terminate_timeout: Option<Duration>,
    /// Its device handlers (`.cuda(..)`, `.wgsl(..)`: each engine's module adds its own),
    /// at most one per language; the runtime launches the one that runs on its engine.
    pub(crate) device: crate::runtime::device_handler::DeviceHandlers<In, Out>,
    pub(crate) bindings: Vec<PendingBinding>,
    pub(crate) forward: Option<String>,
    /// How forwarded outputs travel (`RingKernel::forward_path`).
    pub(crate) forward_path: ForwardPath,
    /// A keyed kernel's key range (`RingKernel::keyed`), checked at every send.
    pub(crate) keys: Option<crate::runtime::keys::KeyCheck<In>>,
    /// A host built from the state at launch instead of `body` (`RingKernel::key_handler`).
    pub(crate) host: Option<HostFactory<In, Out, S>>,
    /// A keyed kernel's states as a device buffer, built at launch on a device runtime
    /// (`RingKernel::key_cuda`).
    pub(crate) device_keys: Option<DeviceKeys<In, Out, S>>,
    /// Called after the host published outputs (`RingKernel::on_publish`).
    pub(crate) on_publish: Option<PublishHook>,
    /// Called after the host took inputs (`RingKernel::on_take`).
    pub(crate) on_take: Option<TakeHook>,
    /// Called when a terminate begins (`RingKernel::on_terminate`).
    pub(crate) on_terminate: Option<TerminateHook>,
    _types: PhantomData<fn(In) -> Out>,
}

impl<In: Message, Out: Message> RingKernel<In, Out, ()> {
    /// A kernel definition with id `id`, no state, and defaults: 1024 messages per lane,
    /// 4 priority lanes, `Backpressure::Block(1 s)`, batches of up to 64.
    pub fn new(id: impl Into<String>) -> Self {
        RingKernel {
            id: id.into(),
            queue_size: 1024,
            output_queue_size: None,
            lanes: 4,
            backpressure: Backpressure::default(),
            batch_size: 64,
            wait: None,
            state: (),
            body: None,
            unit_body: None,
            terminate_timeout: None,
            device: Default::default(),
            bindings: Vec::new(),
            forward: None,
            forward_path: ForwardPath::Device,
            keys: None,
            host: None,
            device_keys: None,
            on_publish: None,
            on_take: None,
            on_terminate: None,
            _types: PhantomData,
        }
    }

    /// Per-kernel state, owned by the kernel's thread for its whole life. May come before or
    /// after `.handler(..)`/`.run(..)`: a handler given first was written against
    /// `Context<()>` (it cannot see this state) and is kept, not discarded.
    pub fn state<S2: Send + 'static>(self, state: S2) -> RingKernel<In, Out, S2> {
        RingKernel {
            id: self.id,
            queue_size: self.queue_size,
            output_queue_size: self.output_queue_size,
            lanes: self.lanes,
            backpressure: self.backpressure,
            batch_size: self.batch_size,
            wait: self.wait,
            state,
            body: None,
            unit_body: self.body.or(self.unit_body),
            terminate_timeout: self.terminate_timeout,
            device: self.device,
            bindings: self.bindings,
            forward: self.forward,
            forward_path: self.forward_path,
            keys: self.keys,
            host: None,
            device_keys: None,
            on_publish: self.on_publish,
            on_take: self.on_take,
            on_terminate: self.on_terminate,
            _types: PhantomData,
        }
    }
}

impl<In: Message, Out: Message, S: Send + 'static> RingKernel<In, Out, S> {
    /// Messages each input priority lane holds (rounded up to a power of two). Also the
    /// output queue's size unless [`RingKernel::output_queue_size`] sets it.
    pub fn queue_size(mut self, n: usize) -> Self {
        self.queue_size = n;
        self
    }

    /// Size of the output queue.
    pub fn output_queue_size(mut self, n: usize) -> Self {
        self.output_queue_size = Some(n);
        self
    }

    /// Number of priority lanes, 1 to 256 (see `resident_ring::mailbox` for the mapping).
    pub fn priority_lanes(mut self, lanes: usize) -> Self {
        self.lanes = lanes;
        self
    }

    /// What `send` does when the input is full. Outputs never fail a handler: when the output
    /// queue is full the kernel waits for room (`Block`, `Reject`) or drops by the same policy
    /// (`DropOldest`, `DropNewest`), counted.
    pub fn backpressure(mut self, policy: Backpressure) -> Self {
        self.backpressure = policy;
        self
    }

    /// Most messages drained per batch (at least 1).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// How long `terminate` and `deactivate` wait for this kernel's host thread (default: the
    /// runtime's `terminate_timeout`, 10 s). A handler still running then is abandoned: the
    /// kernel becomes `Failed` and its report holds the stuck message.
    pub fn terminate_timeout(mut self, t: Duration) -> Self {
        self.terminate_timeout = Some(t);
        self
    }

    /// How this kernel's thread and its receivers wait (default: the runtime's).
    pub fn wait_strategy(mut self, wait: WaitStrategy) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The per-message handler; the runtime drains the queue in batches and calls it for each
    /// message, in priority order. Returning `Some(out)` sends `out` as the response
    /// (correlated with the request); `None` sends nothing.
    pub fn handler<F>(mut self, f: F) -> Self
    where
        F: FnMut(&mut Context<S>, In) -> Option<Out> + Send + 'static,
    {
        self.body = Some(Body::Handler(Box::new(f)));
        self
    }

    /// The loop form: the kernel's thread runs `f` once; `f` receives and sends itself and
    /// must return when `LoopContext::should_terminate` becomes true.
    pub fn run<F>(mut self, f: F) -> Self
    where
        F: FnOnce(&mut LoopContext<In, Out, S>) + Send + 'static,
    {
        self.body = Some(Body::Loop(Box::new(f)));
        self
    }

    /// The loop form without a thread: `launch` calls `f` once, on the launching thread,
    /// with the kernel's [`OutsideLoop`] (its `LoopContext`), and starts no thread. Whoever
    /// holds it drives the kernel (an event loop's task: receive and send with zero
    /// timeouts, waiting elsewhere) and calls [`OutsideLoop::finish`] when the loop ends;
    /// queues, policies, deadlines, telemetry and the terminate report are the engine's as
    /// for `run`. `f` runs while the runtime's kernel table is locked: it must only store
    /// the loop. A terminate made on the thread that launched the kernel does not wait for
    /// the loop (that thread cannot drive it meanwhile): it ends the kernel at once.
    pub fn run_outside<F>(mut self, f: F) -> Self
    where
        F: FnOnce(OutsideLoop<In, Out, S>) + Send + 'static,
    {
        self.body = Some(Body::Outside(Box::new(f)));
        self
    }

    /// Calls `f` when a terminate of this kernel begins (intake closed, the terminate flag
    /// set), on the terminating thread: for a loop driven from outside the engine
    /// ([`RingKernel::run_outside`]) to learn of it without polling. `f` must not block.
    pub fn on_terminate(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_terminate = Some(std::sync::Arc::new(f));
        self
    }

    /// Runs the kernel's handler on the GPU: on a CUDA runtime, `launch` compiles `handler`
    /// (a `CudaHandler`) into a persistent kernel, launched once, fed through pinned
    /// device-mapped queues, and the same [`KernelHandle`](crate::runtime::handle::KernelHandle)
    /// API drives it. On `Backend::CudaSim` the same source runs on host threads (compiled by
    /// the host C++ compiler). On the CPU backend the kernel uses its CPU `handler`/`run`.
    pub fn cuda(mut self, handler: impl CudaSource<In, Out>) -> Self {
        self.device.set(Box::new(handler));
        self
    }

    /// Runs the kernel's handler on a wgpu device: on a `Backend::Wgpu` runtime, `launch`
    /// compiles `handler` (a `WgslHandler`), keeps its state in a device buffer for the
    /// kernel's life and feeds it pipelined batches behind the same
    /// [`KernelHandle`](crate::runtime::handle::KernelHandle). On other backends the kernel
    /// uses its CPU `handler`/`run` (or its CUDA handler on CUDA).
    pub fn wgsl(mut self, handler: impl WgslSource<In, Out>) -> Self {
        self.device.set(Box::new(handler));
        self
    }

    /// Whether the kernel has a device handler that runs on `engine`.
    pub fn has_device_handler_for(&self, engine: crate::engine::BackendKind) -> bool {
        self.device.runs_on(engine)
    }

    /// Forwards every output (except `call` replies, which go to their callers) into the
    /// input queue of the kernel `id` instead of this kernel's output queue: kernel to kernel,
    /// on every backend, with the same handler code (a device handler just returns its
    /// output). The target's backpressure applies (a full target makes this kernel wait); the
    /// target is looked up by id when the first output is ready, so it may be launched after
    /// this kernel, and its input type must be `Out`. Outputs that cannot be delivered because
    /// the target is gone end in this kernel's terminate report.
    ///
    /// Between two ring kernels of one device engine the outputs move on the device, with no
    /// host hop: on CUDA and CudaSim the target's persistent kernel consumes this kernel's
    /// output ring; on wgpu each batch of this kernel and the target's dispatch over its
    /// outputs go to the device in one command submission (see [`ForwardPath`] and the guide's
    /// chapters on forwarding for which handlers qualify); elsewhere the producer's host thread
    /// relays them. Backpressure, order and terminate accounting are the same either way.
    pub fn forward_to(mut self, id: impl Into<String>) -> Self {
        self.forward = Some(id.into());
        self
    }

    /// How this kernel's forwarded outputs travel (default [`ForwardPath::Device`]: on the
    /// device where the engine can, else relayed by the host). [`ForwardPath::HostRelay`]
    /// forces the host relay, e.g. to measure what device forwarding saves.
    pub fn forward_path(mut self, path: ForwardPath) -> Self {
        self.forward_path = path;
        self
    }

    /// Calls `f` on the kernel's host thread each time it has published outputs into its
    /// output queue: once per batch (or per send of a loop-form kernel) that queued at least
    /// one, after they are visible to `receive`; never for a batch that published nothing,
    /// nor for `call` replies or forwarded outputs. For waking waiters the engine does not
    /// know about (an event loop) without polling; `f` should be quick and must not block.
    pub fn on_publish(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_publish = Some(std::sync::Arc::new(f));
        self
    }

    /// Calls `f` on the kernel's host thread each time it has taken inputs from its input
    /// queue: once per batch taken (by the CPU handler loop, the loop form's `receive`, or the
    /// pump that moves inputs to a device), after they left the queue, so a sender waiting
    /// for room finds it. For waking senders the engine does not know about (an event loop
    /// awaiting room under `Backpressure::Block`) without polling; `f` should be quick and
    /// must not block.
    pub fn on_take(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_take = Some(std::sync::Arc::new(f));
        self
    }

    /// Binds `buffer` to the kernel under `name` for the kernel's whole life: the handler
    /// borrows it with `ctx.buffer::<T>(name)` / `ctx.buffer_mut::<T>(name)`, the host reads it
    /// with `KernelHandle::read_buffer` (see `runtime::bind`). A repeated name fails `launch`.
    pub fn bind<T: bytemuck::Pod + Send + resident_ring::message::CField>(
        mut self,
        name: impl Into<String>,
        buffer: crate::memory::UnifiedBuffer<T>,
    ) -> Self {
        self.bindings.push(PendingBinding::new(name.into(), buffer));
        self
    }

    /// The kernel's id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// How long `terminate` waits for a kernel's thread to stop, unless configured.
pub(crate) const TERMINATE_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds, at launch on a device runtime, the `keys` binding from a keyed kernel's states and
/// the snapshot access to it.
pub(crate) type DeviceKeys<In, Out, S> = Box<
    dyn FnOnce(
            &S,
            &crate::engine::DeviceHandle,
        ) -> std::result::Result<
            (
                crate::runtime::bind::PendingBinding,
                KeyStatesFactory<In, Out>,
            ),
            crate::runtime::keys::KeyedError,
        > + Send,
>;
/// Registers a device keyed kernel's states for snapshots once its `KernelIo` exists.
pub(crate) type KeyStatesFactory<In, Out> = Box<
    dyn FnOnce(
            &std::sync::Arc<crate::runtime::io::KernelIo<In, Out>>,
        ) -> std::sync::Arc<dyn crate::runtime::keys::KeyStates>
        + Send,
>;
