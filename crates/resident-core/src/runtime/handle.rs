//! `KernelHandle`: the typed, cloneable handle to a launched kernel, and the
//! `TerminateReport` it returns. Everything a message passes through lives in
//! `KernelIo`; the handler runs in a backend's
//! `RingHost`.
//!
//! Delivery rules (no silent loss), checked by the conformance suite on every backend:
//! * a send either enqueues (`Ok(id)`), is dropped by the `DropNewest`/`DropOldest` policy the
//!   user chose (counted in `messages_dropped`), or fails with the message handed back;
//! * every message whose send returned `Ok` ends as exactly one of: processed, dropped by the
//!   policy (counted), expired (its deadline passed before the kernel took it; counted), or
//!   returned in the [`TerminateReport`] — also when `terminate`, `deactivate`, `drain` or
//!   dropping the `Runtime` race with any number of senders;
//! * a `call` reply goes straight to its caller; a reply that arrives after the caller timed
//!   out is counted as dropped;
//! * every wait is bounded: a handler that never returns makes `terminate` give up after the
//!   kernel's terminate timeout, mark the kernel `Failed` and report the stuck message.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use resident_ring::mailbox::RecvError;
use resident_ring::wait::deadline_after;
use resident_ring::{
    Envelope, Message, MessageId, Slot, WaitStrategy, DEFAULT_PRIORITY, FLAG_CALL,
};

use crate::runtime::bind::{BindError, BufferId, BufferReadGuard, BufferWriteGuard};
use crate::runtime::io::KernelIo;
pub use crate::runtime::report::{Placement, TerminateReport};
use crate::state::{Error, Failure, KernelState, Op, Result};
use crate::telemetry::Telemetry;

/// A `call` whose reply has not been taken yet ([`KernelHandle::call_start`]).
pub struct PendingCall<In: Message, Out: Message> {
    io: Arc<KernelIo<In, Out>>,
    id: u64,
    slot: Arc<resident_ring::call::CallSlot<Result<Out>>>,
    done: bool,
}

impl<In: Message, Out: Message> PendingCall<In, Out> {
    /// The request's message id (the reply's correlation id).
    pub fn message_id(&self) -> u64 {
        self.id
    }

    /// The reply (or the kernel's error: failed, dropped by policy, no reply) if it comes
    /// within `timeout`, else `None` and the call stays pending. `Duration::ZERO` only looks.
    /// A wait that may park must run on the thread that called `call_start` (the one the
    /// reply wakes); a zero-timeout look works from any thread. After the reply was taken,
    /// returns `None` at once.
    pub fn wait(&mut self, timeout: Duration) -> Option<Result<Out>> {
        if self.done {
            return None;
        }
        let strategy = if timeout.is_zero() {
            WaitStrategy::Spin
        } else {
            self.io.wait
        };
        let r = self.slot.wait(deadline_after(timeout), strategy);
        self.done = r.is_some();
        r
    }
}

impl<In: Message, Out: Message> Drop for PendingCall<In, Out> {
    fn drop(&mut self) {
        if !self.done && !self.io.unregister_call(self.id) {
            // The reply took the entry: it is stored (or about to be); it was never taken.
            self.io.metrics.late_replies.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What [`KernelHandle::send_tracked`]'s backpressure policy did with the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOutcome<In> {
    /// Queued.
    Queued,
    /// Queued; the oldest message of its lane (envelope, payload) was discarded for room.
    DroppedOldest(Envelope, In),
    /// The lane was full and the message itself was discarded.
    DroppedNewest,
}

/// The first half of a terminate.
pub(crate) enum Begin<In, Out> {
    /// Already terminated: the kept report.
    Done(TerminateReport<In, Out>),
    /// Started; the failure the kernel had before, if any.
    Started(Option<Failure>),
}

/// A typed, cloneable handle to a launched kernel.
pub struct KernelHandle<In, Out> {
    pub(crate) io: Arc<KernelIo<In, Out>>,
}

impl<In, Out> std::fmt::Debug for KernelHandle<In, Out> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelHandle")
            .field("id", &&*self.io.id)
            .field("state", &*self.io.state.lock())
            .finish()
    }
}

impl<In, Out> Clone for KernelHandle<In, Out> {
    fn clone(&self) -> Self {
        KernelHandle {
            io: self.io.clone(),
        }
    }
}

impl<In: Message, Out: Message> KernelHandle<In, Out> {
    /// The kernel's id.
    pub fn id(&self) -> &str {
        &self.io.id
    }

    /// The kernel's lifecycle state.
    pub fn state(&self) -> KernelState {
        self.io.state.lock().clone()
    }

    fn invalid(&self, op: &'static str, state: KernelState) -> Error {
        Error::InvalidState {
            id: self.io.id.to_string(),
            op,
            state,
        }
    }

    fn on_own_thread(&self) -> bool {
        *self.io.thread_id.lock() == Some(std::thread::current().id())
    }

    /// Starts (or resumes) processing: `Launched | Inactive -> Active`.
    pub fn activate(&self) -> Result<()> {
        let mut st = self.io.state.lock();
        match *st {
            KernelState::Launched | KernelState::Inactive => {
                *st = KernelState::Active;
                self.io.control.active.store(true, Ordering::Release);
                drop(st);
                crate::profile::lifecycle(&self.io.id, "activate", &KernelState::Active);
                self.io.control.signal.notify();
                Ok(())
            }
            ref other => Err(self.invalid("activate", other.clone())),
        }
    }

    /// Stops intake: `Active -> Inactive`. Returns once the batch in hand (if any) is done,
    /// waiting at most the kernel's terminate timeout (then `Error::Timeout`; the kernel is
    /// `Inactive` and its stuck batch still in hand); later messages queue up (or meet
    /// backpressure) until `activate`.
    pub fn deactivate(&self) -> Result<()> {
        {
            let mut st = self.io.state.lock();
            match *st {
                KernelState::Active => *st = KernelState::Inactive,
                ref other => return Err(self.invalid("deactivate", other.clone())),
            }
            self.io.control.active.store(false, Ordering::Release);
        }
        crate::profile::lifecycle(&self.io.id, "deactivate", &KernelState::Inactive);
        self.io.input.notify_receivers();
        // Wait for the batch in hand, unless we are that kernel's own thread.
        if !self.on_own_thread() {
            let t = self.io.terminate_timeout;
            if self.io.batch_gate.try_lock_for(t).is_none() {
                return Err(Error::Timeout {
                    id: self.io.id.to_string(),
                    op: Op::Deactivate,
                    timeout: t,
                    message: None,
                });
            }
        }
        Ok(())
    }

    /// Sends `msg` at the default priority (128). Returns its message id.
    pub fn send(&self, msg: In) -> Result<MessageId> {
        self.io.port.send(msg, DEFAULT_PRIORITY, 0, Op::Send)
    }

    /// Sends `msg` at `priority` (0-255, higher drains first).
    pub fn send_with_priority(&self, msg: In, priority: u8) -> Result<MessageId> {
        self.io.port.send(msg, priority, 0, Op::Send)
    }

    /// Sends `msg` at the default priority with a time to live: if the kernel has not taken
    /// it within `ttl` of this send, it is not handled but counted as expired
    /// (`messages_expired` in telemetry, `expired` in the report). The TTL is kept to the
    /// microsecond, rounded up, and capped at [`resident_ring::envelope::MAX_TTL`] (about 8.9
    /// years).
    ///
    /// On a device the check happens when the host hands the message over; a message with a
    /// deadline is handed over only once the device has handled everything before it, so it
    /// never waits behind a full device queue past its deadline.
    pub fn send_with_ttl(&self, msg: In, ttl: Duration) -> Result<MessageId> {
        let p = &self.io.port;
        let id = p.ids.next();
        let mut env = Envelope::new(id, DEFAULT_PRIORITY, p.ids.now_ns());
        env.set_ttl(ttl);
        p.send_slot(Slot::new(env, msg), Op::Send).map(|_| id)
    }

    /// Turns the deadline check off (`false`) or back on: inputs whose deadline passed are
    /// then handled like any other. Only for the benchmark that measures what the check saves.
    #[doc(hidden)]
    pub fn set_expire_late_inputs(&self, on: bool) {
        self.io.set_expire(on);
    }

    /// Whether every input lane has room for one more message now (fewer messages queued in
    /// all lanes together than one lane holds). A hint for a sender that must not wait while
    /// holding something the consumer needs (a binding holding an interpreter lock): when
    /// only such senders send, a `true` here means the next send does not wait.
    pub fn input_has_room(&self) -> bool {
        self.io.input.len() < self.io.input.config().capacity
    }

    /// How many more messages the input queue takes now before a send waits (under `Block`)
    /// or is refused or dropped by the policy: one lane's capacity minus the messages queued
    /// in all lanes together (the room [`KernelHandle::input_has_room`] tests for one). Reads
    /// two counters, unlike [`KernelHandle::telemetry`].
    pub fn input_room(&self) -> usize {
        self.io
            .input
            .config()
            .capacity
            .saturating_sub(self.io.input.len())
    }

    /// Sends `msg` at `priority` and says what the backpressure policy did with it:
    /// [`SendOutcome::Queued`], [`SendOutcome::DroppedOldest`] with the message it discarded to
    /// make room (counted as dropped), or [`SendOutcome::DroppedNewest`] (`msg` itself was
    /// discarded, counted). For callers that own a resource per queued message (a language
    /// binding queuing handles) and must release what a drop policy discarded.
    pub fn send_tracked(&self, msg: In, priority: u8) -> Result<(MessageId, SendOutcome<In>)> {
        let p = &self.io.port;
        let id = p.ids.next();
        let env = Envelope::new(id, priority, p.ids.now_ns());
        let outcome = match p.send_slot_outcome(Slot::new(env, msg), Op::Send)? {
            resident_ring::mailbox::Sent::Queued => SendOutcome::Queued,
            resident_ring::mailbox::Sent::QueuedDroppedOldest(old) => {
                SendOutcome::DroppedOldest(old.env, old.payload)
            }
            resident_ring::mailbox::Sent::DroppedNewest => SendOutcome::DroppedNewest,
        };
        Ok((id, outcome))
    }

    /// Sends many messages at the default priority with one queue operation per lane run.
    /// Returns how many were taken (queued, or dropped by a drop policy); when that is fewer
    /// than `msgs.len()`, `msgs[n..]` were not sent (full under `Reject`, `Block` timed out)
    /// and are still the caller's. Fails only when nothing was taken, with the first message
    /// handed back in the error.
    ///
    /// A thread that both sends and receives should keep at most the output queue's size of
    /// messages unanswered: otherwise, with both queues full, the kernel waits for room for
    /// its answers while the send waits for room for its messages, until the send's `Block`
    /// timeout gives up (each such turn costs the whole timeout).
    pub fn send_batch(&self, msgs: &[In]) -> Result<usize> {
        let p = &self.io.port;
        // A keyed kernel refuses the whole batch if one message names a key it does not have.
        for m in msgs {
            p.check_key(m, Op::SendBatch)?;
        }
        let first = p.ids.next_n(msgs.len() as u64);
        let now = p.ids.now_ns();
        let slots: Vec<Slot<In>> = msgs
            .iter()
            .enumerate()
            .map(|(i, m)| Slot::new(Envelope::new(first + i as u64, DEFAULT_PRIORITY, now), *m))
            .collect();
        match self.io.input.send_batch(&slots) {
            (0, Some(e)) => Err(p.refused(e, Op::SendBatch)),
            (n, _) => Ok(n),
        }
    }

    /// Sends `msg` and waits up to `timeout` for the reply matched by correlation id. Safe with
    /// many concurrent callers. A reply that comes after the timeout is counted as dropped; a
    /// request dropped by a drop policy fails at once with `Error::Dropped`.
    ///
    /// The request carries its deadline (`timeout`, as a send's TTL: see
    /// [`KernelHandle::send_with_ttl`]): a request the kernel has not taken by then is never
    /// handled, only counted as expired, so calls that timed out do not keep the kernel busy.
    pub fn call(&self, msg: In, timeout: Duration) -> Result<Out> {
        let io = &self.io;
        // One clock read for the caller's deadline and the request's send time. The caller's
        // deadline is `now + timeout` on the `Instant` clock; the request's is `now + timeout`
        // rounded up to the microsecond on the runtime's clock (the same reading): never
        // earlier than the caller's.
        let now = io.ids.now_ns();
        let deadline = io.ids.instant_at(now).checked_add(timeout);
        let id = io.ids.next();
        let slot = io.register_call(id);
        let mut env = Envelope::new(id, DEFAULT_PRIORITY, now);
        env.flags = FLAG_CALL;
        if timeout < resident_ring::envelope::MAX_TTL {
            env.set_ttl(timeout);
        }
        if let Err(e) = io.port.send_slot(Slot::new(env, msg), Op::Call) {
            io.unregister_call(id);
            return Err(e);
        }
        match slot.wait(deadline, io.wait) {
            Some(r) => r,
            None => {
                if !io.unregister_call(id) {
                    // Completed between our last check and the removal.
                    if let Some(r) = slot.wait(None, WaitStrategy::Park) {
                        return r;
                    }
                }
                Err(Error::Timeout {
                    id: io.id.to_string(),
                    op: Op::Call,
                    timeout,
                    message: None,
                })
            }
        }
    }

    /// Sends `msg` at `priority` as a `call` and returns at once: the reply is waited for with
    /// [`PendingCall::wait`], in as many bounded slices as the caller likes (a language
    /// binding that must go back to an event loop or check for interrupts between slices).
    /// Dropping the [`PendingCall`] gives up: a reply that comes later is counted as dropped.
    pub fn call_start(&self, msg: In, priority: u8) -> Result<PendingCall<In, Out>> {
        self.call_start_inner(msg, priority, None)
    }

    /// [`call_start`](Self::call_start) for a caller that gives up after `timeout`: the request
    /// carries that deadline (as [`call`](Self::call)'s does, and a send's TTL: see
    /// [`KernelHandle::send_with_ttl`]), so a request the kernel has not taken by then is never
    /// handled, only counted as expired (`messages_expired`), and calls that timed out do not
    /// keep the kernel busy. Stamped when the request is sent, so it never outlives a caller
    /// whose own wait starts after this returns.
    pub fn call_start_with_timeout(
        &self,
        msg: In,
        priority: u8,
        timeout: Duration,
    ) -> Result<PendingCall<In, Out>> {
        self.call_start_inner(msg, priority, Some(timeout))
    }

    fn call_start_inner(
        &self,
        msg: In,
        priority: u8,
        timeout: Option<Duration>,
    ) -> Result<PendingCall<In, Out>> {
        let io = &self.io;
        let id = io.ids.next();
        let slot = io.register_call(id);
        let mut env = Envelope::new(id, priority, io.ids.now_ns());
        env.flags = FLAG_CALL;
        if let Some(t) = timeout.filter(|&t| t < resident_ring::envelope::MAX_TTL) {
            env.set_ttl(t);
        }
        if let Err(e) = io.port.send_slot(Slot::new(env, msg), Op::Call) {
            io.unregister_call(id);
            return Err(e);
        }
        Ok(PendingCall {
            io: io.clone(),
            id,
            slot,
            done: false,
        })
    }

    /// The next output, waiting up to `timeout`.
    pub fn receive(&self, timeout: Duration) -> Result<Out> {
        self.receive_envelope(timeout).map(|(_, m)| m)
    }

    /// The next output with its envelope (`correlation_id` = the request's message id).
    pub fn receive_envelope(&self, timeout: Duration) -> Result<(Envelope, Out)> {
        match self.io.output.recv_timeout(timeout) {
            Ok(s) => Ok((s.env, s.payload)),
            Err(RecvError::Timeout) => Err(Error::Timeout {
                id: self.io.id.to_string(),
                op: Op::Receive,
                timeout,
                message: None,
            }),
            Err(RecvError::Closed) => Err(self.closed_error("receive")),
        }
    }

    /// Up to `max` outputs that are ready now, appended to `out`; returns how many.
    pub fn receive_batch(&self, out: &mut Vec<Out>, max: usize) -> Result<usize> {
        let n = self.io.output.recv_each(max, |s| out.push(s.payload));
        if n == 0 && self.io.output.is_closed() {
            return Err(self.closed_error("receive"));
        }
        Ok(n)
    }

    /// The next output if one is ready; an error once the kernel failed or terminated and no
    /// output is left.
    pub fn try_receive(&self) -> Result<Option<Out>> {
        match self.io.output.try_recv() {
            Some(s) => Ok(Some(s.payload)),
            None if self.io.output.is_closed() => Err(self.closed_error("receive")),
            None => Ok(None),
        }
    }

    fn closed_error(&self, op: &'static str) -> Error {
        match self.state() {
            KernelState::Failed(reason) => Error::KernelFailed {
                id: self.io.id.to_string(),
                reason,
            },
            state => self.invalid(op, state),
        }
    }

    /// Waits until everything queued so far has been handled (input empty, batch done), at
    /// most `timeout` (then `Error::Timeout`, also when a handler never returns). Only valid
    /// while active.
    pub fn drain(&self, timeout: Duration) -> Result<()> {
        let deadline = deadline_after(timeout);
        let timed_out = || Error::Timeout {
            id: self.io.id.to_string(),
            op: Op::Drain,
            timeout,
            message: None,
        };
        loop {
            match self.state() {
                KernelState::Active => {}
                state => return Err(self.invalid("drain", state)),
            }
            let idle =
                || self.io.input.is_empty() && self.io.in_flight.load(Ordering::Acquire) == 0;
            if idle() {
                let gate = match deadline {
                    Some(d) => self.io.batch_gate.try_lock_until(d),
                    None => Some(self.io.batch_gate.lock()),
                };
                match gate {
                    Some(_g) if idle() => return Ok(()),
                    Some(_) => {}
                    None => return Err(timed_out()),
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timed_out());
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Stops the kernel: intake stops at once, the batch in hand finishes, the host thread
    /// exits, and the report returns every message that was not delivered. Waits at most the
    /// kernel's terminate timeout (`RingKernel::terminate_timeout`, else the runtime's): a
    /// handler still running then is abandoned, the kernel becomes `Failed`, and the report
    /// holds the stuck message and everything after it. Valid from `Launched`, `Active`,
    /// `Inactive`, `Failed`, and again from `Terminating`. Once terminated (also by dropping
    /// or shutting down the runtime), returns a copy of the kept report.
    pub fn terminate(&self) -> Result<TerminateReport<In, Out>> {
        self.terminate_within(self.io.terminate_timeout)
    }

    /// [`KernelHandle::terminate`] with an explicit bound on the wait.
    pub fn terminate_within(&self, timeout: Duration) -> Result<TerminateReport<In, Out>> {
        match self.terminate_begin()? {
            Begin::Done(report) => Ok(report),
            Begin::Started(failure) => {
                Ok(self.terminate_finish(failure, deadline_after(timeout), timeout))
            }
        }
    }

    /// First half of terminate: the state change, intake closed, the host thread told.
    pub(crate) fn terminate_begin(&self) -> Result<Begin<In, Out>> {
        let io = &self.io;
        let failure = {
            let mut st = io.state.lock();
            match &*st {
                KernelState::Launched
                | KernelState::Active
                | KernelState::Inactive
                | KernelState::Terminating => {
                    *st = KernelState::Terminating;
                    None
                }
                KernelState::Failed(reason) => {
                    if let Some(r) = io.report.lock().clone() {
                        return Ok(Begin::Done(r));
                    }
                    Some(reason.clone())
                }
                KernelState::Terminated => {
                    drop(st);
                    return io
                        .report
                        .lock()
                        .clone()
                        .map(Begin::Done)
                        .ok_or_else(|| self.invalid("terminate", KernelState::Terminated));
                }
                other => return Err(self.invalid("terminate", other.clone())),
            }
        };
        if self.on_own_thread() {
            return Err(self.invalid("terminate from its own handler", io.state.lock().clone()));
        }
        tracing::debug!(kernel = %io.id, "terminating");
        // Stop intake first (waits out sends in progress), then tell the host thread.
        io.input.close();
        io.control.terminate.store(true, Ordering::Release);
        io.control.signal.notify();
        io.input.notify_receivers();
        if let Some(hook) = io.on_terminate.get() {
            hook();
        }
        Ok(Begin::Started(failure))
    }

    /// Second half of terminate: waits for the host thread until `deadline`, abandons it if
    /// it is stuck, collects and keeps the report.
    pub(crate) fn terminate_finish(
        &self,
        mut failure: Option<Failure>,
        deadline: Option<Instant>,
        timeout: Duration,
    ) -> TerminateReport<In, Out> {
        let io = &self.io;
        let mut abandoned = (None, Vec::new());
        let failed_before = failure.is_some();
        // A kernel driven from outside the engine by the thread terminating it cannot run its
        // loop while this waits: it ends here (what it had not taken goes to the report).
        if *io.outside_thread.lock() == Some(std::thread::current().id()) {
            io.host_exited();
        }
        let gave_up = !io.wait_exit(deadline);
        if gave_up {
            // The handler never returned: take its batch back and give up on the thread.
            abandoned = io.in_hand.abandon();
            let reason = Failure::Abandoned {
                timeout,
                message_id: abandoned.0.as_ref().map(|m| m.env.message_id),
            };
            tracing::error!(kernel = %io.id, %reason, "terminate gave up waiting");
            io.metrics.errors.fetch_add(1, Ordering::Relaxed);
            failure = Some(reason);
        } else if let Some(t) = io.thread.lock().take() {
            let _ = t.join();
        }
        // A failure that happened while we waited (a panic in the last batch) counts too.
        if failure.is_none() {
            if let KernelState::Failed(r) = &*io.state.lock() {
                failure = Some(r.clone());
            }
        }
        let report = io.collect_report(failure.clone(), abandoned);
        // A failure that arose during this terminate (a handler abandoned, a device that
        // would not stop) leaves the kernel `Failed`; one from before ends as `Terminated`.
        *io.state.lock() = match &failure {
            Some(r) if gave_up || !failed_before => KernelState::Failed(r.clone()),
            _ => KernelState::Terminated,
        };
        let end = io.state.lock().clone();
        crate::profile::lifecycle(&io.id, "terminate", &end);
        *io.report.lock() = Some(report.clone());
        io.release();
        if let Some(core) = io.core.upgrade() {
            core.retire(&io.id, Arc::as_ptr(io) as *const () as usize, end);
        }
        report
    }

    /// A copy of the kernel's state: a WGSL handler's `state` on wgpu (its value after every
    /// batch submitted before this call; the state stays on the device otherwise, this is the
    /// only read-back), a CUDA handler's state on a GPU or CudaSim (read with the kernel parked
    /// between two batches, never mid-batch, waiting at most
    /// [`BUFFER_SYNC_TIMEOUT`](crate::engine::BUFFER_SYNC_TIMEOUT) for it to park;
    /// each read costs a park and a relaunch, so it is for occasional reads), or a CPU
    /// handler's state on a host thread (read between two batches, waiting at most the
    /// kernel's terminate timeout for the batch in hand). To see a
    /// message's effect, wait for its output (`call`, `receive`) or `drain` first. Also works
    /// after `terminate` (the final state). `S` must be the state's type
    /// (`WgslHandler::state`, `CudaHandler::state`, or `RingKernel::state`).
    ///
    /// ```
    /// use resident::prelude::*;
    /// use std::time::Duration;
    /// let rt = Runtime::builder().backend(Backend::Cpu).build()?;
    /// let k = rt.launch(RingKernel::<u32, u32>::new("sum").state(0u64).handler(
    ///     |ctx: &mut Context<u64>, x: u32| {
    ///         *ctx.state_mut() += x as u64;
    ///         Some(x)
    ///     },
    /// ))?;
    /// k.activate()?;
    /// k.call(40, Duration::from_secs(5))?;
    /// k.call(2, Duration::from_secs(5))?;
    /// assert_eq!(k.snapshot_state::<u64>()?, 42);
    /// # Ok::<(), resident::Error>(())
    /// ```
    pub fn snapshot_state<S: bytemuck::Pod>(&self) -> Result<S> {
        let id = self.io.id.to_string();
        if let Some(host) = self.io.host_state.get() {
            return self.snapshot_host_state(host.as_ref());
        }
        let st = self.io.device_state.lock().clone();
        let Some(st) = st else {
            return Err(Error::InvalidConfig {
                id,
                reason: "it keeps no state snapshot_state can read (a loop-form kernel's state \
                         is its loop's)"
                    .into(),
            });
        };
        let bytes = st.read().map_err(|e| Error::Device {
            id: id.clone(),
            op: "snapshot_state",
            source: Box::new(e),
        })?;
        if bytes.len() != std::mem::size_of::<S>() {
            return Err(Error::InvalidConfig {
                id,
                reason: format!(
                    "snapshot_state as a {}-byte type, but the device state has {} bytes",
                    std::mem::size_of::<S>(),
                    bytes.len()
                ),
            });
        }
        Ok(bytemuck::pod_read_unaligned(&bytes))
    }

    fn snapshot_host_state<S: bytemuck::Pod>(
        &self,
        host: &dyn crate::runtime::io::HostState,
    ) -> Result<S> {
        let t = self.io.terminate_timeout;
        let Some(_gate) = self.io.batch_gate.try_lock_for(t) else {
            return Err(Error::Timeout {
                id: self.io.id.to_string(),
                op: Op::SnapshotState,
                timeout: t,
                message: None,
            });
        };
        let mut got = None;
        host.with(&mut |any| got = any.downcast_ref::<S>().copied());
        got.ok_or_else(|| Error::InvalidConfig {
            id: self.io.id.to_string(),
            reason: format!(
                "snapshot_state::<{}>, but the kernel's state is {}",
                std::any::type_name::<S>(),
                host.type_name()
            ),
        })
    }

    /// The state of key `key` of a keyed kernel (`RingKernel::keyed`), read between batches
    /// (waits at most the terminate timeout for the batch in hand). Works after terminate too
    /// (the last state). [`Error::KeyOutOfRange`] for a key the kernel does not have.
    ///
    /// ```
    /// use resident::prelude::*;
    /// # #[repr(C)] #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    /// # struct Add { key: u32, v: u32 }
    /// # impl Keyed for Add { fn key(&self) -> u32 { self.key } }
    /// let rt = Runtime::builder().backend(Backend::Cpu).build()?;
    /// let k = rt.launch(RingKernel::<Add, u32>::new("sums").keyed(10, 0u64).key_handler(
    ///     |ks: &mut KeyContext<u64>, m: Add| {
    ///         *ks.state_mut() += m.v as u64;
    ///         None
    ///     },
    /// ))?;
    /// k.activate()?;
    /// k.send(Add { key: 3, v: 5 })?;
    /// k.drain(std::time::Duration::from_secs(5))?;
    /// assert_eq!(k.snapshot_key::<u64>(3)?, 5);
    /// assert!(matches!(k.snapshot_key::<u64>(10), Err(Error::KeyOutOfRange { .. })));
    /// # Ok::<(), resident::Error>(())
    /// ```
    pub fn snapshot_key<S: Clone + 'static>(&self, key: u32) -> Result<S> {
        let mut v = snapshot::<In, Out, S>(&self.io, key as u64, key as u64 + 1, Op::SnapshotKey)?;
        v.pop().ok_or_else(|| Error::KeyOutOfRange {
            id: self.io.id.to_string(),
            op: "snapshot_key",
            key: key as u64,
            keys: 0,
            message: None,
        })
    }

    /// The states of keys `range` of a keyed kernel, in key order, read between batches in
    /// one go (at most [`MAX_SNAPSHOT_KEYS`](crate::runtime::keyed::MAX_SNAPSHOT_KEYS) keys,
    /// else [`Error::KeyRangeTooLarge`]; a range outside the keys is
    /// [`Error::KeyOutOfRange`]).
    pub fn snapshot_keys<S: Clone + 'static>(&self, range: std::ops::Range<u32>) -> Result<Vec<S>> {
        snapshot::<In, Out, S>(
            &self.io,
            range.start as u64,
            range.end as u64,
            Op::SnapshotKeys,
        )
    }

    /// The report kept when the kernel was terminated (by `terminate`, a runtime shutdown or
    /// drop), if it was.
    pub fn report(&self) -> Option<TerminateReport<In, Out>> {
        self.io.report.lock().clone()
    }

    /// Where this kernel's handler runs: on the runtime's device (its CUDA or WGSL handler) or
    /// on a host thread (its CPU closure: the CPU backend, or a device runtime for a kernel
    /// that has no handler for that device).
    pub fn placement(&self) -> Placement {
        self.io.placement.get().copied().unwrap_or(Placement::Host)
    }

    /// How this kernel's forwarded outputs (`RingKernel::forward_to`) travelled so far: taken
    /// by the target's kernel straight from this kernel's device output ring
    /// (`on_device`), or relayed by this kernel's host thread into the target's input queue
    /// (`via_host`). Both 0 for a kernel that does not forward.
    pub fn forwarding(&self) -> ForwardingStats {
        let m = &self.io.metrics;
        ForwardingStats {
            on_device: {
                let g = m.forwarded_device.lock();
                g.0 + g.1.as_ref().map_or(0, |live| live())
            },
            via_host: m.forwarded_host.load(Ordering::Relaxed),
        }
    }

    /// A snapshot of the kernel's telemetry. `latency` is send to response available (output
    /// queued or reply handed to the caller), for every backend alike; inputs that produce no
    /// response are not in it.
    pub fn telemetry(&self) -> Telemetry {
        let io = &self.io;
        let m = &io.metrics;
        let input = io.input.counters();
        Telemetry {
            kernel_id: io.id.to_string(),
            state: self.state(),
            // Plus what the device took straight from a producer's output ring (device-side
            // forwarding), which never entered the input queue.
            messages_received: input.accepted + m.peer_received.load(Ordering::Relaxed),
            // Acquire, and before `batches`: see `KernelMetrics::messages_done`.
            messages_processed: m.processed.load(Ordering::Acquire),
            messages_dropped: io.dropped(),
            messages_refused: input.refused,
            messages_expired: m.expired.load(Ordering::Relaxed),
            forwarded_on_device: m.peer_received.load(Ordering::Relaxed),
            errors: m.errors.load(Ordering::Relaxed),
            queue_depth: io.input.len(),
            output_depth: io.output.len(),
            batches: m.batches.load(Ordering::Relaxed),
            throughput: m.throughput(),
            latency: if m.enabled {
                m.latency.summary()
            } else {
                Default::default()
            },
            uptime: m.started.elapsed(),
        }
    }
}

/// How a kernel's forwarded outputs travelled (`KernelHandle::forwarding`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardingStats {
    /// Outputs the target's kernel took straight from this kernel's device output ring (device
    /// forwarding: CudaSim with CudaSim, CUDA with CUDA), with no host hop.
    pub on_device: u64,
    /// Outputs this kernel's host thread relayed into the target's input queue.
    pub via_host: u64,
}

/// `KernelHandle::snapshot_key(s)`: clones of the states of keys `start..end` (u64, so that
/// `u32::MAX + 1` is an end), read under the batch gate.
fn snapshot<In: Message, Out: Message, S: Clone + 'static>(
    io: &KernelIo<In, Out>,
    start: u64,
    end: u64,
    op: Op,
) -> Result<Vec<S>> {
    let id = || io.id.to_string();
    let Some(states) = io.keyed.get() else {
        return Err(Error::InvalidConfig {
            id: id(),
            reason: format!("{op}: not a keyed kernel (built with RingKernel::keyed)"),
        });
    };
    let keys = states.keys();
    if start >= keys as u64 || end > keys as u64 || start > end {
        let key = if start >= keys as u64 { start } else { end - 1 };
        return Err(Error::KeyOutOfRange {
            id: id(),
            op: op.as_str(),
            key,
            keys,
            message: None,
        });
    }
    if end - start > crate::runtime::keys::MAX_SNAPSHOT_KEYS as u64 {
        return Err(Error::KeyRangeTooLarge {
            id: id(),
            len: end - start,
            max: crate::runtime::keys::MAX_SNAPSHOT_KEYS,
        });
    }
    let t = io.terminate_timeout;
    let _gate = if states.needs_gate() {
        let Some(g) = io.batch_gate.try_lock_for(t) else {
            return Err(Error::Timeout {
                id: id(),
                op,
                timeout: t,
                message: None,
            });
        };
        Some(g)
    } else {
        None
    };
    let mut out: Vec<S> = Vec::new();
    // SAFETY: the range was checked against `keys` above; the gate is held if needed.
    if unsafe { states.read(start as u32..end as u32, &mut out, t)? } {
        Ok(out)
    } else {
        Err(Error::InvalidConfig {
            id: id(),
            reason: format!(
                "{op}::<{}>, but the kernel's key state is {}",
                std::any::type_name::<S>(),
                states.type_name()
            ),
        })
    }
}

impl<In: Message, Out: Message> KernelHandle<In, Out> {
    fn bound(&self) -> crate::runtime::bind::HostAccess<'_> {
        crate::runtime::bind::HostAccess {
            table: self.io.bound.get(),
            kernel: self.id(),
        }
    }

    /// The registry id of the bound buffer `name` (to put in messages).
    pub fn buffer_id(&self, name: &str) -> std::result::Result<BufferId, BindError> {
        self.bound().buffer_id(name)
    }

    /// Reads the bound buffer `name` on the host. **Synchronized, not refused:** on the CPU
    /// backend it waits up to `timeout` for the kernel's batch in hand, then copies back if the
    /// device copy is newer, and while the guard lives the kernel does not start another batch.
    /// On a device backend the device copy is fetched as it stands between two batches (the
    /// engine synchronizes with the kernel, see `runtime::bind`) and the guard holds that copy.
    pub fn read_buffer<T: bytemuck::Pod>(
        &self,
        name: &str,
        timeout: Duration,
    ) -> std::result::Result<BufferReadGuard<'_, T>, BindError> {
        self.bound().read_buffer(name, timeout)
    }

    /// Writes the bound buffer `name` on the host (same waiting rules as
    /// [`KernelHandle::read_buffer`]); the kernel sees the values from its next batch on. On a
    /// device backend the guard starts as the device's values and is stored back to the device
    /// by [`BufferWriteGuard::commit`] (or, with errors only traced, when it is dropped).
    pub fn write_buffer<T: bytemuck::Pod>(
        &self,
        name: &str,
        timeout: Duration,
    ) -> std::result::Result<BufferWriteGuard<'_, T>, BindError> {
        self.bound().write_buffer(name, timeout)
    }
}
