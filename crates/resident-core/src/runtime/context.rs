//! What a handler sees: its state, the envelope of the message in hand, and routes to other
//! kernels by id. The loop form's `LoopContext` adds receive and send.

use std::any::Any;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use resident_ring::wait::deadline_after;
use resident_ring::{Envelope, Message, MessageId, DEFAULT_PRIORITY};

use crate::runtime::bind::{BindError, BufMut, BufRef, BufferId};
use crate::runtime::io::{Control, InputPort, KernelIo, Next};
use crate::runtime::publisher::Publisher;
use crate::runtime::registry::RuntimeCore;
use crate::state::{Error, Failure, KernelState, Op, Result};
use bytemuck::Pod;

/// A CPU kernel's state, shared between its host thread and `KernelHandle::snapshot_state`.
pub(crate) struct StateCell<S> {
    value: UnsafeCell<S>,
}

// SAFETY: the value is touched by the kernel's host thread (through its `Context`) and, for a
// handler-form kernel, by `KernelHandle::snapshot_state`. The host thread runs handlers only
// while it holds the kernel's batch gate, and a snapshot reads only while holding that gate,
// so the two never overlap; a loop-form kernel's state is never registered for snapshots, so
// only its host thread ever touches it. `S: Send` lets the value move to the host thread.
unsafe impl<S: Send> Sync for StateCell<S> {}

impl<S> StateCell<S> {
    fn new(value: S) -> Self {
        StateCell {
            value: UnsafeCell::new(value),
        }
    }
}

impl<S: Send + 'static> crate::runtime::io::HostState for StateCell<S> {
    fn with(&self, f: &mut dyn FnMut(&dyn Any)) {
        // SAFETY: the caller holds the kernel's batch gate (see the `Sync` impl above).
        f(unsafe { &*self.value.get() })
    }
    fn type_name(&self) -> &'static str {
        std::any::type_name::<S>()
    }
}

/// The context of a handler: state, current message, and kernel-to-kernel sends.
pub struct Context<S> {
    state: Arc<StateCell<S>>,
    kernel_id: Arc<str>,
    pub(crate) current: Envelope,
    pub(crate) control: Arc<Control>,
    core: Weak<RuntimeCore>,
    routes: HashMap<String, Box<dyn Any + Send>>,
    /// Bound buffers and the batch lock on them (`runtime::bind`).
    pub(crate) bound: crate::runtime::bind::BatchBinding,
}

impl<S> Context<S> {
    pub(crate) fn new(
        state: S,
        kernel_id: Arc<str>,
        control: Arc<Control>,
        core: Weak<RuntimeCore>,
    ) -> Self {
        Context {
            state: Arc::new(StateCell::new(state)),
            kernel_id,
            current: Envelope::default(),
            control,
            core,
            routes: HashMap::new(),
            bound: Default::default(),
        }
    }

    /// The shared cell of the state, for `KernelHandle::snapshot_state` (handler form only).
    pub(crate) fn state_cell(&self) -> Arc<StateCell<S>> {
        self.state.clone()
    }

    /// The kernel's state.
    pub fn state(&self) -> &S {
        // SAFETY: only the host thread holds this context; a snapshot reads only while the
        // host thread is outside a batch (see `StateCell`).
        unsafe { &*self.state.value.get() }
    }

    /// The kernel's state, mutably.
    pub fn state_mut(&mut self) -> &mut S {
        // SAFETY: as in `state`; `&mut self` makes this the only reference on this thread.
        unsafe { &mut *self.state.value.get() }
    }

    /// The bound buffers of the batch in hand (see `runtime::bind`).
    pub fn buffers(&self) -> crate::runtime::bind::Bindings<'_> {
        crate::runtime::bind::Bindings::new(&self.kernel_id, &self.bound)
    }

    /// The state and the bound buffers at once (a handler that updates both).
    pub fn state_and_buffers(&mut self) -> (&mut S, crate::runtime::bind::Bindings<'_>) {
        // SAFETY: as in `state_mut`.
        let state = unsafe { &mut *self.state.value.get() };
        (
            state,
            crate::runtime::bind::Bindings::new(&self.kernel_id, &self.bound),
        )
    }

    /// This kernel's id.
    pub fn kernel_id(&self) -> &str {
        &self.kernel_id
    }

    /// The envelope of the message being handled (id, priority, send time).
    pub fn envelope(&self) -> &Envelope {
        &self.current
    }

    /// Whether `terminate` has been requested.
    pub fn should_terminate(&self) -> bool {
        self.control.terminate.load(Ordering::Acquire)
    }

    /// Whether the kernel is active (not deactivated).
    pub fn is_active(&self) -> bool {
        self.control.active.load(Ordering::Acquire)
    }

    /// Sends `msg` to the kernel `id` (default priority) without a host relay, under that
    /// kernel's backpressure rules. The route is looked up once and cached.
    pub fn send_to<T: Message>(&mut self, id: &str, msg: T) -> Result<MessageId> {
        self.send_to_with_priority(id, msg, DEFAULT_PRIORITY)
    }

    /// [`Context::send_to`] with a priority.
    pub fn send_to_with_priority<T: Message>(
        &mut self,
        id: &str,
        msg: T,
        priority: u8,
    ) -> Result<MessageId> {
        let port = self.route::<T>(id)?;
        match port.send(msg, priority, 0, Op::SendTo) {
            // The target was terminated and maybe relaunched under the same id: look it up again.
            Err(e @ Error::NotAccepting { .. }) => {
                self.routes.remove(id);
                let msg = e
                    .into_message::<T>()
                    .expect("send_to hands back its own message type");
                self.route::<T>(id)?.send(msg, priority, 0, Op::SendTo)
            }
            other => other,
        }
    }

    fn route<T: Message>(&mut self, id: &str) -> Result<InputPort<T>> {
        if let Some(p) = self
            .routes
            .get(id)
            .and_then(|b| b.downcast_ref::<InputPort<T>>())
        {
            return Ok(p.clone());
        }
        let core = self
            .core
            .upgrade()
            .ok_or_else(|| Error::UnknownKernel { id: id.to_string() })?;
        let port = core.input_port::<T>(id)?;
        self.routes.insert(id.to_string(), Box::new(port.clone()));
        Ok(port)
    }
}

/// A loop-form kernel driven from outside the engine (`RingKernel::run_outside`): its
/// [`LoopContext`] (through `Deref`), held by whoever drives it, on any thread. Receive and
/// send with zero timeouts (a wait would hold the driver's thread); `finish` ends it.
/// Dropped unfinished, the kernel fails (`LoopPanicked`, "dropped") unless terminating.
pub struct OutsideLoop<In, Out, S> {
    lctx: Option<LoopContext<In, Out, S>>,
    end: Arc<dyn OutsideEnd>,
}

/// How an [`OutsideLoop`] ends its kernel (its `KernelIo`, without the message types).
pub(crate) trait OutsideEnd: Send + Sync {
    fn exited(&self) -> bool;
    fn end(&self, failure: Option<String>);
}

impl<In: Message, Out: Message> OutsideEnd for KernelIo<In, Out> {
    fn exited(&self) -> bool {
        self.has_exited()
    }

    fn end(&self, failure: Option<String>) {
        if self.has_exited() {
            return; // a terminate on the launching thread ended it already
        }
        match failure {
            Some(panic) => self.fail(Failure::LoopPanicked { panic }, None, Vec::new()),
            None if !self.terminating() => self.fail(Failure::LoopReturned, None, Vec::new()),
            None => {}
        }
        self.host_exited();
    }
}

impl<In: Message, Out: Message, S> OutsideLoop<In, Out, S> {
    pub(crate) fn new(lctx: LoopContext<In, Out, S>, io: Arc<KernelIo<In, Out>>) -> Self {
        OutsideLoop {
            lctx: Some(lctx),
            end: io,
        }
    }
}

impl<In, Out, S> OutsideLoop<In, Out, S> {
    /// Whether the kernel's loop ended (`finish` called, or a terminate on the launching
    /// thread ended it): the context is not to be used any more.
    pub fn is_finished(&self) -> bool {
        self.lctx.is_none() || self.end.exited()
    }

    /// Ends the kernel's loop: with `failure` (the loop's error text) the kernel fails
    /// (`Failure::LoopPanicked`); without, it fails with `LoopReturned` unless it is
    /// terminating, as a `run` loop that returns. Only the first call counts.
    pub fn finish(&mut self, failure: Option<String>) {
        if let Some(lctx) = self.lctx.take() {
            drop(lctx);
            self.end.end(failure);
        }
    }
}

impl<In, Out, S> Drop for OutsideLoop<In, Out, S> {
    fn drop(&mut self) {
        self.finish(Some("its loop was dropped without finishing".into()));
    }
}

impl<In, Out, S> std::ops::Deref for OutsideLoop<In, Out, S> {
    type Target = LoopContext<In, Out, S>;
    fn deref(&self) -> &LoopContext<In, Out, S> {
        self.lctx.as_ref().expect("OutsideLoop used after finish")
    }
}

impl<In, Out, S> std::ops::DerefMut for OutsideLoop<In, Out, S> {
    fn deref_mut(&mut self) -> &mut LoopContext<In, Out, S> {
        self.lctx.as_mut().expect("OutsideLoop used after finish")
    }
}

/// The context of a loop-form kernel: a [`Context`] plus receive and send.
pub struct LoopContext<In, Out, S> {
    ctx: Context<S>,
    io: Arc<KernelIo<In, Out>>,
    out: Publisher<In, Out>,
}

impl<In, Out, S> std::ops::Deref for LoopContext<In, Out, S> {
    type Target = Context<S>;
    fn deref(&self) -> &Context<S> {
        &self.ctx
    }
}

impl<In, Out, S> std::ops::DerefMut for LoopContext<In, Out, S> {
    fn deref_mut(&mut self) -> &mut Context<S> {
        &mut self.ctx
    }
}

impl<In: Message, Out: Message, S> LoopContext<In, Out, S> {
    pub(crate) fn new(ctx: Context<S>, out: Publisher<In, Out>) -> Self {
        LoopContext {
            ctx,
            io: out.io().clone(),
            out,
        }
    }

    pub(crate) fn into_parts(self) -> Context<S> {
        self.ctx
    }

    /// Blocks until the kernel is active or terminating; returns `is_active()`.
    pub fn wait_active(&self) -> bool {
        let c = &self.ctx.control;
        c.signal
            .wait_until(resident_ring::WaitStrategy::Park, None, || {
                c.active.load(Ordering::Acquire) || c.terminate.load(Ordering::Acquire)
            });
        self.is_active()
    }

    /// The next message, waiting up to `timeout`; `None` on timeout, while inactive, or once
    /// terminating. Remembers its envelope so that `send` answers it.
    pub fn receive(&mut self, timeout: Duration) -> Option<In> {
        self.receive_envelope(timeout).map(|(_, m)| m)
    }

    /// Like [`LoopContext::receive`], with the envelope.
    pub fn receive_envelope(&mut self, timeout: Duration) -> Option<(Envelope, In)> {
        let mut one = Vec::with_capacity(1);
        if self.receive_into(&mut one, 1, timeout) == 0 {
            return None;
        }
        let s = one[0];
        self.ctx.current = s.env;
        Some((s.env, s.payload))
    }

    /// Up to `max` messages, waiting up to `timeout` for the first; empty on timeout, while
    /// inactive, or once terminating. `send` answers the last of them.
    pub fn receive_batch(&mut self, max: usize, timeout: Duration) -> Vec<In> {
        let mut got = Vec::with_capacity(max.min(1024));
        self.receive_into(&mut got, max, timeout);
        if let Some(last) = got.last() {
            self.ctx.current = last.env;
        }
        got.into_iter().map(|s| s.payload).collect()
    }

    /// Like [`LoopContext::receive_batch`], each message with its envelope (for a binding
    /// that answers each message of a batch with [`LoopContext::send_replies`]).
    pub fn receive_batch_envelopes(
        &mut self,
        max: usize,
        timeout: Duration,
    ) -> Vec<(Envelope, In)> {
        let mut got = Vec::with_capacity(max.min(1024));
        self.receive_into(&mut got, max, timeout);
        if let Some(last) = got.last() {
            self.ctx.current = last.env;
        }
        got.into_iter().map(|s| (s.env, s.payload)).collect()
    }

    fn receive_into(
        &mut self,
        out: &mut Vec<resident_ring::Slot<In>>,
        max: usize,
        timeout: Duration,
    ) -> usize {
        let io = &self.io;
        let next = io.next_batch(deadline_after(timeout), || {
            Ok::<_, std::convert::Infallible>(io.take_inputs(out, max, &mut None))
        });
        match next {
            Ok(Next::Batch(n, _gate)) => {
                io.metrics.batch_taken();
                io.metrics.messages_done(n as u64);
                io.metrics.batch_done(std::time::Instant::now());
                n
            }
            _ => 0,
        }
    }

    /// Whether the output queue has room for one more output now, so that the next `send`
    /// does not wait (this kernel is the queue's only producer).
    pub fn output_has_room(&self) -> bool {
        self.io.output.len() < self.io.output.config().capacity
    }

    /// How many outputs the output queue takes now before a `send` waits (this kernel is the
    /// queue's only producer, so at least this many sends in a row do not wait).
    pub fn output_room(&self) -> usize {
        self.io
            .output
            .config()
            .capacity
            .saturating_sub(self.io.output.len())
    }

    /// Sends `out` on the output queue as the response to the last message received.
    pub fn send(&mut self, out: Out) {
        let now = self.io.ids.now_ns();
        self.out.publish_one(self.ctx.current, Some(out), now);
        self.out.flush_wakeups();
    }

    /// Sends every output of `outs` as responses to the last message received (as `send`
    /// does for one), waking a waiting receiver once at the end instead of once per output.
    pub fn send_all(&mut self, outs: impl IntoIterator<Item = Out>) {
        let now = self.io.ids.now_ns();
        for out in outs {
            self.out.publish_one(self.ctx.current, Some(out), now);
        }
        self.out.flush_wakeups();
    }

    /// Sends each output of `outs` as the response to its request's envelope (`None`: the
    /// last message received), in order, waking a waiting receiver once at the end instead of
    /// once per output (as `send_all` does for outputs that all answer the last message).
    pub fn send_replies(&mut self, outs: impl IntoIterator<Item = (Option<Envelope>, Out)>) {
        let now = self.io.ids.now_ns();
        for (request, out) in outs {
            let request = request.unwrap_or(self.ctx.current);
            self.out.publish_one(request, Some(out), now);
        }
        self.out.flush_wakeups();
    }

    /// Sends `out` as the response to the message with envelope `request`.
    pub fn send_reply(&mut self, request: &Envelope, out: Out) {
        let now = self.io.ids.now_ns();
        self.out.publish_one(*request, Some(out), now);
        self.out.flush_wakeups();
    }

    /// The kernel's state as the runtime sees it.
    pub fn kernel_state(&self) -> KernelState {
        self.io.state.lock().clone()
    }
}

impl<S> Context<S> {
    /// The bound buffer `name` as `&[T]` (a device read). Several buffers, or several shared
    /// borrows of one, may be held at once.
    pub fn buffer<T: Pod>(&self, name: &str) -> Result<BufRef<'_, T>, BindError> {
        self.buffers().buffer(name)
    }

    /// The bound buffer `name` as `&mut [T]` (a device write: the buffer becomes
    /// `DeviceDirty`). Takes `&self` so a handler can hold several buffers at once; a second
    /// borrow of the same buffer is [`BindError::AlreadyBorrowed`].
    pub fn buffer_mut<T: Pod>(&self, name: &str) -> Result<BufMut<'_, T>, BindError> {
        self.buffers().buffer_mut(name)
    }

    /// [`Context::buffer`] by registry id (as carried in a message).
    pub fn buffer_by_id<T: Pod>(&self, id: BufferId) -> Result<BufRef<'_, T>, BindError> {
        self.buffers().buffer_by_id(id)
    }

    /// [`Context::buffer_mut`] by registry id (as carried in a message).
    pub fn buffer_mut_by_id<T: Pod>(&self, id: BufferId) -> Result<BufMut<'_, T>, BindError> {
        self.buffers().buffer_mut_by_id(id)
    }
}
