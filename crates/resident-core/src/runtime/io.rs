//! `KernelIo`: everything a message passes through on the host, in one place, for every
//! backend. Senders enqueue into the input mailbox (priority lanes, backpressure); a backend's
//! [`RingHost`](crate::runtime::host::RingHost) takes batches out, runs the handler wherever it
//! lives, and gives the results back through its `Publisher` —
//! the one path by which outputs are stamped (one envelope convention), routed (call replies by
//! correlation id, the rest to the output mailbox) and measured (one meaning per metric).
//!
//! Accounting (no silent loss): a message whose send returned `Ok` ends as exactly one of
//! * processed (`metrics.processed`), its response (if any) published or, when nobody can take
//!   it any more, kept in `unsent` for the terminate report;
//! * dropped by the user's policy, counted (`messages_dropped`);
//! * expired: its deadline (a `call`'s timeout, a `send_with_ttl`'s TTL) had passed when the
//!   kernel took it, so no handler saw it (`metrics.expired`, `messages_expired`);
//! * returned in the `TerminateReport`: still queued, `stranded` by a failure, the message in
//!   hand when the kernel failed or was abandoned (`failed_message`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use resident_ring::call::CallSlot;
use resident_ring::handoff::InHand;
use resident_ring::wait::Signal;
use resident_ring::{Envelope, Mailbox, Message, Slot, WaitStrategy};

use crate::runtime::ids::Ids;
use crate::runtime::port::DroppedCalls;
pub use crate::runtime::port::InputPort;
use crate::runtime::registry::RuntimeCore;
use crate::runtime::report::TerminateReport;
use crate::state::{Error, Failure, KernelState, Result};
use crate::telemetry::KernelMetrics;

/// What [`RingKernel::on_publish`](crate::runtime::kernel::RingKernel::on_publish) calls after
/// the kernel's host published outputs.
pub type PublishHook = Arc<dyn Fn() + Send + Sync>;

/// What [`RingKernel::on_take`](crate::runtime::kernel::RingKernel::on_take) calls after the
/// kernel's host took inputs from its input queue.
pub type TakeHook = Arc<dyn Fn() + Send + Sync>;
/// Called when a terminate begins (`RingKernel::on_terminate`).
pub type TerminateHook = Arc<dyn Fn() + Send + Sync>;

/// A message whose deadline is nearer than this is held by a device pump until the device has
/// handled everything before it, then checked again (see [`KernelIo::deadline_near`]). A
/// farther deadline is checked only when the message is taken from the input queue: it can
/// expire unseen in a device queue only if the device falls more than this far behind.
pub(crate) const DEVICE_HOLD_WINDOW: Duration = Duration::from_secs(1);

/// Flags the kernel's host thread watches, with the signal that wakes it when they change.
pub(crate) struct Control {
    pub active: AtomicBool,
    pub terminate: AtomicBool,
    pub signal: Signal,
}

/// How long forwarded outputs wait for a target kernel that is missing or not accepting
/// before they go to the terminate report.
pub(crate) const FORWARD_PATIENCE: Duration = Duration::from_secs(2);

/// The kernel a kernel's outputs are forwarded to (`RingKernel::forward_to`): looked up by id
/// when first needed (so it may be launched after this kernel) and again after it went away.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub struct Forward<T> {
    target: String,
    core: Weak<RuntimeCore>,
    port: Mutex<Option<InputPort<T>>>,
    /// The runtime's count of registered kernels (`RuntimeCore::registered`).
    registered: Arc<AtomicU64>,
    path: ForwardPath,
}

impl<T: Message> Forward<T> {
    pub(crate) fn new(
        target: String,
        core: Weak<RuntimeCore>,
        registered: Arc<AtomicU64>,
        path: ForwardPath,
    ) -> Self {
        Forward {
            target,
            core,
            port: Mutex::new(None),
            registered,
            path,
        }
    }

    /// How many kernels the runtime has registered so far: a lookup of the target (or of its
    /// device peer slot) that came back empty is worth repeating once this has changed.
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub fn registrations(&self) -> u64 {
        // Acquire: pairs with the release bump after a registration, so a lookup made after
        // seeing the new count finds that kernel and its port's device peer slot.
        self.registered.load(Ordering::Acquire)
    }

    /// How the outputs should travel (`RingKernel::forward_path`).
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub fn path(&self) -> ForwardPath {
        self.path
    }

    /// The target's input port (cached).
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub fn port(&self) -> Result<InputPort<T>> {
        let mut p = self.port.lock();
        if let Some(p) = p.as_ref() {
            return Ok(p.clone());
        }
        let core = self.core.upgrade().ok_or_else(|| Error::UnknownKernel {
            id: self.target.clone(),
        })?;
        let port = core.input_port::<T>(&self.target)?;
        *p = Some(port.clone());
        Ok(port)
    }

    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub fn forget(&self) {
        *self.port.lock() = None;
    }
}

/// Hashes message ids (unique, sequential u64s) with one multiply instead of SipHash.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ *b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A waiting `call` (its reply lands in a [`CallSlot`], model-checked with loom in
/// `resident-ring`).
type CallTable<Out> = HashMap<u64, Arc<CallSlot<Result<Out>>>, BuildHasherDefault<IdHasher>>;

/// A CPU kernel's host state, readable by `KernelHandle::snapshot_state` (handler form).
pub(crate) trait HostState: Send + Sync {
    /// Calls `f` with the state. The caller must hold the kernel's batch gate.
    fn with(&self, f: &mut dyn FnMut(&dyn std::any::Any));
    /// The state's type, for errors.
    fn type_name(&self) -> &'static str;
}

/// What [`KernelIo::next_batch`] found.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub enum Next<'a> {
    /// `n` messages were taken; the batch gate is held until this guard drops, so
    /// `deactivate` and `drain` wait for the batch to be done.
    Batch(usize, parking_lot::MutexGuard<'a, ()>),
    /// `terminate` was requested.
    Terminating,
    /// The kernel is not active.
    Inactive,
    /// Nothing arrived before the deadline.
    Empty,
}

/// Everything a kernel's host side and its handles share.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub struct KernelIo<In, Out> {
    pub id: Arc<str>,
    pub(crate) port: InputPort<In>,
    pub(crate) input: Mailbox<In>,
    pub(crate) output: Mailbox<Out>,
    pub(crate) state: Arc<Mutex<KernelState>>,
    pub(crate) control: Arc<Control>,
    /// Held by the host thread while it takes and processes a batch, so `deactivate` and
    /// `drain` can wait (bounded) for the batch in hand to finish.
    pub(crate) batch_gate: CachePadded<Mutex<()>>,
    pending: Mutex<CallTable<Out>>,
    pub(crate) metrics: KernelMetrics,
    pub(crate) ids: Arc<Ids>,
    pub(crate) wait: WaitStrategy,
    pub(crate) batch_size: usize,
    /// How long `terminate` (and `deactivate`) wait for the host thread before giving up.
    pub(crate) terminate_timeout: Duration,
    /// Who owns each message of the batch in hand (`resident_ring::handoff`).
    pub(crate) in_hand: InHand<Slot<In>>,
    /// Inputs handed to a device and not yet handled there (the device host keeps it; 0 on
    /// the CPU host), so `drain` waits for the device too.
    pub(crate) in_flight: AtomicU64,
    /// Whether [`KernelIo::take_inputs`] leaves out inputs whose deadline passed (always, but
    /// for the benchmark that measures what it saves).
    expiry_on: AtomicBool,
    /// Inputs taken from the queue but not processed because the kernel failed.
    stranded: Mutex<Vec<Slot<In>>>,
    /// The input whose handling failed (panicked, or never returned).
    failed_message: Mutex<Option<Slot<In>>>,
    /// Outputs produced that no receiver can take any more (terminate came while the output
    /// queue was full); they go to the terminate report.
    pub(crate) unsent: Mutex<Vec<Slot<Out>>>,
    /// Where outputs go instead of the output queue (`RingKernel::forward_to`), set once at
    /// launch.
    pub(crate) forward: std::sync::OnceLock<Forward<Out>>,
    /// Where the handler runs, set once at launch.
    pub(crate) placement: std::sync::OnceLock<crate::runtime::report::Placement>,
    /// Called by the publisher after outputs were queued (`RingKernel::on_publish`), set once
    /// at launch.
    pub(crate) on_publish: std::sync::OnceLock<PublishHook>,
    /// Called by the intake after inputs left the input queue (`RingKernel::on_take`), set
    /// once at launch.
    pub(crate) on_take: std::sync::OnceLock<TakeHook>,
    /// Called when a terminate begins (`RingKernel::on_terminate`), set once at launch.
    pub(crate) on_terminate: std::sync::OnceLock<TerminateHook>,
    /// The thread that launched a kernel with no host thread (`RingKernel::run_outside`).
    pub(crate) outside_thread: Mutex<Option<ThreadId>>,
    exited: AtomicBool,
    exit_signal: Signal,
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
    pub(crate) thread_id: Mutex<Option<ThreadId>>,
    /// The report, once terminated, kept for handles that ask after a runtime shutdown.
    pub(crate) report: Mutex<Option<TerminateReport<In, Out>>>,
    /// Buffers bound at launch (`runtime::bind`), set once by `launch`.
    pub(crate) bound: std::sync::OnceLock<crate::runtime::bind::SharedTable>,
    /// Set at launch when the runtime profiles.
    pub(crate) profile: std::sync::OnceLock<crate::profile::KernelProbe>,
    /// The runtime that launched the kernel: told once the kernel is terminated, so that it
    /// forgets the kernel (its id is free again; memory stays flat over any number of
    /// launches).
    pub(crate) core: Weak<RuntimeCore>,
    /// A CPU handler's state, readable on request (`KernelHandle::snapshot_state`).
    pub(crate) host_state: std::sync::OnceLock<Arc<dyn HostState>>,
    /// A keyed kernel's per-key states, readable on request (`KernelHandle::snapshot_key`).
    pub(crate) keyed: std::sync::OnceLock<Arc<dyn crate::runtime::keys::KeyStates>>,
    /// A device kernel's state, readable on request (`KernelHandle::snapshot_state`).
    pub(crate) device_state: Mutex<Option<Arc<dyn StateSnapshot>>>,
}

impl<In: Message, Out: Message> DroppedCalls for KernelIo<In, Out> {
    fn call_dropped(&self, request: &Envelope) {
        if let Some(slot) = self.pending.lock().remove(&request.message_id) {
            slot.complete(Err(Error::Dropped {
                id: self.id.to_string(),
                message_id: request.message_id,
            }));
        }
    }
}

/// Builds a kernel's `KernelIo` (the input port needs a weak pointer to it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn kernel_io<In: Message, Out: Message>(
    id: Arc<str>,
    input: Mailbox<In>,
    output: Mailbox<Out>,
    ids: Arc<Ids>,
    wait: WaitStrategy,
    batch_size: usize,
    telemetry: bool,
    terminate_timeout: Duration,
    core: Weak<RuntimeCore>,
    keys: Option<crate::runtime::keys::KeyCheck<In>>,
) -> Arc<KernelIo<In, Out>> {
    Arc::new_cyclic(|me: &Weak<KernelIo<In, Out>>| {
        let state = Arc::new(Mutex::new(KernelState::Launched));
        let calls: Weak<dyn DroppedCalls> = me.clone();
        KernelIo {
            port: InputPort {
                id: id.clone(),
                mailbox: input.clone(),
                ids: ids.clone(),
                state: state.clone(),
                calls,
                keys,
                device_link: Arc::new(Mutex::new(None)),
            },
            id,
            input,
            output,
            state,
            control: Arc::new(Control {
                active: AtomicBool::new(false),
                terminate: AtomicBool::new(false),
                signal: Signal::new(),
            }),
            batch_gate: CachePadded::new(Mutex::new(())),
            pending: Mutex::new(HashMap::default()),
            metrics: KernelMetrics::new(telemetry),
            ids,
            wait,
            batch_size,
            terminate_timeout,
            in_hand: InHand::new(),
            in_flight: AtomicU64::new(0),
            expiry_on: AtomicBool::new(true),
            stranded: Mutex::new(Vec::new()),
            failed_message: Mutex::new(None),
            unsent: Mutex::new(Vec::new()),
            forward: std::sync::OnceLock::new(),
            placement: std::sync::OnceLock::new(),
            on_publish: std::sync::OnceLock::new(),
            on_take: std::sync::OnceLock::new(),
            on_terminate: std::sync::OnceLock::new(),
            outside_thread: Mutex::new(None),
            exited: AtomicBool::new(false),
            exit_signal: Signal::new(),
            thread: Mutex::new(None),
            thread_id: Mutex::new(None),
            report: Mutex::new(None),
            device_state: Mutex::new(None),
            host_state: std::sync::OnceLock::new(),
            keyed: std::sync::OnceLock::new(),
            core,
            bound: std::sync::OnceLock::new(),
            profile: std::sync::OnceLock::new(),
        }
    })
}

impl<In: Message, Out: Message> KernelIo<In, Out> {
    // ---- calls -------------------------------------------------------------------------

    /// Registers a waiting `call` for request id `id`.
    pub fn register_call(&self, id: u64) -> Arc<CallSlot<Result<Out>>> {
        let slot = Arc::new(CallSlot::new());
        self.pending.lock().insert(id, slot.clone());
        slot
    }

    /// Removes a call's entry; `false` when the reply already took it.
    pub fn unregister_call(&self, id: u64) -> bool {
        self.pending.lock().remove(&id).is_some()
    }

    fn fail_pending(&self, err: impl Fn(String) -> Error) {
        let pending: Vec<_> = self.pending.lock().drain().collect();
        for (_, slot) in pending {
            slot.complete(Err(err(self.id.to_string())));
        }
    }

    // ---- call replies --------------------------------------------------------------------

    /// Hands a `call`'s result to its waiting caller.
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub fn reply(&self, req: Envelope, out: Option<Out>) {
        match self.pending.lock().remove(&req.message_id) {
            Some(slot) => slot.complete(out.ok_or(Error::NoReply {
                id: self.id.to_string(),
                message_id: req.message_id,
            })),
            // The caller gave up (timeout) before the reply came: counted as dropped.
            None => {
                self.metrics.late_replies.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    // ---- failures and exit -------------------------------------------------------------

    /// Marks the kernel failed: intake stops, waiting callers and receivers learn at once.
    /// `message` is the input whose handling failed; `stranded` the inputs taken but not
    /// handled, in order.
    pub fn fail(&self, reason: Failure, message: Option<Slot<In>>, stranded: Vec<Slot<In>>) {
        if let Some(m) = message {
            *self.failed_message.lock() = Some(m);
        }
        self.stranded.lock().extend(stranded);
        self.metrics.errors.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = self.state.lock();
            if matches!(*st, KernelState::Terminated) {
                return;
            }
            *st = KernelState::Failed(reason.clone());
        }
        crate::profile::fault(&self.id, &reason.to_string());
        self.input.close();
        self.output.close();
        self.fail_pending(|id| Error::KernelFailed {
            id,
            reason: reason.clone(),
        });
        self.control.signal.notify();
    }

    /// Inputs taken but never handled: back to the report.
    pub fn strand(&self, inputs: impl IntoIterator<Item = Slot<In>>) {
        self.stranded.lock().extend(inputs);
    }

    /// Called by the host thread as its very last act.
    pub fn host_exited(&self) {
        self.exited.store(true, Ordering::Release);
        self.exit_signal.notify();
    }

    pub fn has_exited(&self) -> bool {
        self.exited.load(Ordering::Acquire)
    }

    /// Waits (bounded) for the host thread to exit.
    pub fn wait_exit(&self, deadline: Option<Instant>) -> bool {
        self.exit_signal
            .wait_until(WaitStrategy::Park, deadline, || self.has_exited())
    }

    /// A host thread's take (the CPU host's and the keyed host's): waits for a batch of up to
    /// `batch_size` inputs, waiting out an inactive kernel, and returns it with the batch gate
    /// held; `None` once the kernel is terminating (or a terminate gave up on this host).
    /// `taken_at` is the batch's clock reading, if the deadline check made one.
    pub(crate) fn take_host_batch(
        &self,
        batch: &mut Vec<Slot<In>>,
        taken_at: &mut Option<u64>,
    ) -> Option<(usize, parking_lot::MutexGuard<'_, ()>)> {
        loop {
            let next = self.next_batch(None, || {
                self.in_hand
                    .take(batch, |b| self.take_inputs(b, self.batch_size, taken_at))
            });
            match next {
                Ok(Next::Batch(n, gate)) => {
                    self.metrics.batch_taken();
                    return Some((n, gate));
                }
                Ok(Next::Inactive) => self.wait_for_control(),
                // Terminating, or abandoned by a terminate that gave up on us.
                Ok(Next::Terminating) | Ok(Next::Empty) | Err(_) => return None,
            }
        }
    }

    /// The one take-or-wait loop of the host side: while active, takes a batch with `take`
    /// under the batch gate; when the input is empty, waits (until `deadline`, `None` =
    /// forever) for input, a state change or terminate. Used by the CPU host's handler loop
    /// and by the loop form's `receive`.
    pub fn next_batch<E>(
        &self,
        deadline: Option<Instant>,
        mut take: impl FnMut() -> std::result::Result<usize, E>,
    ) -> std::result::Result<Next<'_>, E> {
        loop {
            if self.terminating() {
                return Ok(Next::Terminating);
            }
            if !self.is_active() {
                return Ok(Next::Inactive);
            }
            let gate = self.batch_gate.lock();
            // Re-check under the gate: `deactivate` flips the flag, then takes the gate.
            if self.terminating() || !self.is_active() {
                continue;
            }
            let n = take()?;
            if n > 0 {
                return Ok(Next::Batch(n, gate));
            }
            drop(gate);
            let c = &self.control;
            let woke = self.input.wait_nonempty(deadline, || {
                c.terminate.load(Ordering::Acquire) || !c.active.load(Ordering::Acquire)
            });
            if !woke {
                return Ok(Next::Empty);
            }
        }
    }

    /// The one intake of every host (the CPU handler loop, the loop form's `receive`, the
    /// device pump): appends up to `max` inputs to `out`, highest lane first, FIFO within a
    /// lane, leaving out every input whose deadline has passed ([`KernelIo::expire`]). Returns
    /// how many it appended; 0 only when the input is empty.
    ///
    /// `now` is the batch's clock: it is cleared first, and holds the reading the deadline
    /// check made if it made one, so a host that needs the time for the batch (publish stamps)
    /// reuses it instead of reading the clock again (at most one read per batch; none here for
    /// a batch without deadlines).
    pub fn take_inputs(&self, out: &mut Vec<Slot<In>>, max: usize, now: &mut Option<u64>) -> usize {
        *now = None;
        loop {
            let start = out.len();
            if self.input.recv_batch(out, max) == 0 {
                return 0;
            }
            // The inputs left the queue: a sender waiting for room finds it now.
            if let Some(hook) = self.on_take.get() {
                hook();
            }
            let kept = self.expire(out, start, now);
            if kept > 0 {
                return kept;
            }
            // Everything taken had expired: take again rather than wait on a queue that may
            // still hold live messages (the same clock reading serves: this is the same take).
        }
    }

    /// Removes from `batch[from..]` every input whose deadline has passed, keeping the order
    /// of the rest, and returns how many remain there. Each one removed is counted as expired
    /// (`messages_expired`); a `call` whose caller still waits gets `Error::Timeout` at once.
    ///
    /// The deadline bits of the envelopes are looked at first; the clock is read only when a
    /// message in the range carries a deadline, and only if `now` holds no reading yet (the
    /// reading is left there for the caller): a batch without deadlines costs one pass over
    /// its envelopes and no clock read.
    pub fn expire(&self, batch: &mut Vec<Slot<In>>, from: usize, now: &mut Option<u64>) -> usize {
        let live = batch.len() - from;
        if !batch[from..].iter().any(|s| s.env.has_deadline())
            || !self.expiry_on.load(Ordering::Relaxed)
        {
            return live;
        }
        let now = *now.get_or_insert_with(|| self.ids.now_ns());
        let mut expired = 0u64;
        let mut keep = from;
        for i in from..batch.len() {
            let s = batch[i];
            if s.env.expired_at(now) {
                expired += 1;
                if s.env.is_call() {
                    self.call_expired(&s.env);
                }
            } else {
                batch[keep] = s;
                keep += 1;
            }
        }
        batch.truncate(keep);
        if expired > 0 {
            self.metrics.expired.fetch_add(expired, Ordering::Relaxed);
        }
        keep - from
    }

    /// A `call` whose deadline passed before the kernel took it: its caller, if it still
    /// waits (its clock read came a moment before ours), learns now.
    fn call_expired(&self, request: &Envelope) {
        if let Some(slot) = self.pending.lock().remove(&request.message_id) {
            slot.complete(Err(Error::Timeout {
                id: self.id.to_string(),
                op: crate::state::Op::Call,
                timeout: request.ttl().unwrap_or_default(),
                message: None,
            }));
        }
    }

    /// Turns [`KernelIo::expire`] off or on (the deadline benchmark's baseline).
    pub fn set_expire(&self, on: bool) {
        self.expiry_on.store(on, Ordering::Relaxed);
    }

    /// Whether a message of `batch` has a deadline within [`DEVICE_HOLD_WINDOW`] of now, so
    /// the device pump must hold the batch until the device has caught up (its queues cannot
    /// check a deadline). Farther deadlines go to the device at once: holding every `call`
    /// with a long timeout would serialize the device's batches for nothing. The clock is read
    /// only when a message carries a deadline and `now` holds no reading of this batch yet
    /// (see [`KernelIo::take_inputs`]).
    pub fn deadline_near(&self, batch: &[Slot<In>], now: &mut Option<u64>) -> bool {
        if !self.expires() || !batch.iter().any(|s| s.env.has_deadline()) {
            return false;
        }
        let horizon = now
            .get_or_insert_with(|| self.ids.now_ns())
            .saturating_add(DEVICE_HOLD_WINDOW.as_nanos() as u64);
        batch
            .iter()
            .any(|s| s.env.deadline_ns().is_some_and(|d| d < horizon))
    }

    /// Whether inputs with a deadline are checked at all (see [`KernelIo::expire`]).
    pub fn expires(&self) -> bool {
        self.expiry_on.load(Ordering::Relaxed)
    }

    /// Waits until the kernel should run (activated) or stop.
    pub fn wait_for_control(&self) {
        let c = &self.control;
        c.signal.wait_until(WaitStrategy::Park, None, || {
            c.active.load(Ordering::Acquire) || c.terminate.load(Ordering::Acquire)
        });
    }

    pub fn terminating(&self) -> bool {
        self.control.terminate.load(Ordering::Acquire)
    }

    pub fn is_active(&self) -> bool {
        self.control.active.load(Ordering::Acquire)
    }

    /// Collects the terminate report once the host thread is gone (or abandoned): everything
    /// queued, stranded, in hand, produced and not received. Closes both queues and fails
    /// the calls still waiting.
    pub fn collect_report(
        &self,
        failure: Option<Failure>,
        abandoned: (Option<Slot<In>>, Vec<Slot<In>>),
    ) -> TerminateReport<In, Out> {
        let (stuck, not_started) = abandoned;
        if let Some(s) = stuck {
            *self.failed_message.lock() = Some(s);
        }
        let mut undelivered: Vec<(Envelope, In)> = self
            .stranded
            .lock()
            .drain(..)
            .map(|s| (s.env, s.payload))
            .collect();
        undelivered.extend(not_started.into_iter().map(|s| (s.env, s.payload)));
        // `close` waits out any send in progress, so the drain sees every accepted message.
        self.input.close();
        undelivered.extend(self.input.drain().into_iter().map(|s| (s.env, s.payload)));
        self.output.close();
        let mut unreceived: Vec<(Envelope, Out)> = self
            .output
            .drain()
            .into_iter()
            .map(|s| (s.env, s.payload))
            .collect();
        unreceived.extend(self.unsent.lock().drain(..).map(|s| (s.env, s.payload)));
        // A call whose request is in the report gets its answer now instead of a timeout.
        self.fail_pending(|id| Error::InvalidState {
            id,
            op: "call",
            state: KernelState::Terminated,
        });
        let failed_message = self
            .failed_message
            .lock()
            .take()
            .map(|s| (s.env, s.payload));
        let failure = failure.map(|r| (r, failed_message));
        TerminateReport {
            kernel_id: self.id.to_string(),
            processed: self.metrics.processed.load(Ordering::Relaxed),
            dropped: self.dropped(),
            expired: self.metrics.expired.load(Ordering::Relaxed),
            undelivered,
            unreceived,
            failure,
        }
    }

    /// After terminate (report collected): lets go of what the kernel still points at, so
    /// that a handle kept by the user holds only the kernel's own queues (empty, closed) and
    /// its report: the forward target's port (which keeps the target's queues alive), the call
    /// table's and the hand-back lists' capacity.
    pub fn release(&self) {
        if let Some(f) = self.forward.get() {
            f.forget();
        }
        *self.pending.lock() = CallTable::default();
        *self.stranded.lock() = Vec::new();
        *self.unsent.lock() = Vec::new();
        self.in_hand.release();
    }

    /// Every message counted as dropped, by any cause.
    pub fn dropped(&self) -> u64 {
        let m = &self.metrics;
        self.input.counters().dropped
            + self.output.counters().dropped
            + m.late_replies.load(Ordering::Relaxed)
            + m.late_outputs.load(Ordering::Relaxed)
            + m.lost_in_device.load(Ordering::Relaxed)
            + m.device_undelivered.load(Ordering::Relaxed)
    }
}

/// What an engine's device host may do with a kernel's io beyond the `DeviceRing` it drives:
/// the one clock and id source, the metrics of work done on the device, and the device-side
/// forwarding endpoints. Everything else of `KernelIo` is the runtime's own.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
impl<In: Message, Out: Message> KernelIo<In, Out> {
    /// Nanoseconds since the runtime started (the clock of every envelope).
    pub fn now_ns(&self) -> u64 {
        self.ids.now_ns()
    }
    /// The first of `n` fresh message ids.
    pub fn next_ids(&self, n: u64) -> u64 {
        self.ids.next_n(n)
    }
    /// Records a message's latency (sent at `sent_ns`, done at `now_ns`) when telemetry is on.
    pub fn record_latency(&self, sent_ns: u64, now_ns: u64) {
        if self.metrics.enabled {
            self.metrics.latency.record(now_ns.saturating_sub(sent_ns));
        }
    }
    /// Counts `n` outputs a consumer took on the device (`KernelHandle::forwarding`).
    pub fn count_forwarded_on_device(&self, n: u64) {
        self.metrics.forwarded_device.lock().0 += n;
    }
    /// Device-side forwarding by a link the engine keeps: what links that ended moved, and
    /// the current link's live count (`KernelHandle::forwarding`).
    pub fn set_forwarded_on_device(
        &self,
        ended: u64,
        current: Option<crate::telemetry::LiveCount>,
    ) {
        *self.metrics.forwarded_device.lock() = (ended, current);
    }
    /// Counts `n` outputs left in a device ring that another kernel kept (reported dropped).
    pub fn count_late_outputs(&self, n: u64) {
        self.metrics.late_outputs.fetch_add(n, Ordering::Relaxed);
    }
    /// How long `terminate` waits for this kernel's host thread.
    pub fn terminate_timeout(&self) -> Duration {
        self.terminate_timeout
    }
    /// Raises the batch and processed counters to what the device has done (they only grow;
    /// `processed` with Release, so a reader that sees an output sees its input counted).
    pub fn raise_done(&self, batches: u64, processed: u64) {
        self.metrics.batches.fetch_max(batches, Ordering::Relaxed);
        self.metrics
            .processed
            .fetch_max(processed, Ordering::Release);
    }
    /// The kernel this kernel forwards to, if any (`RingKernel::forward_to`).
    pub fn forward_target(&self) -> Option<&Forward<Out>> {
        self.forward.get()
    }
    /// The kernel's input queue (a device host takes producers' hand-overs beside it).
    pub fn input_queue(&self) -> &Mailbox<In> {
        &self.input
    }
    /// Where this kernel offers producers on its device to hand it their outputs.
    pub fn device_link(&self) -> &crate::runtime::port::DeviceLinkSlot {
        &self.port.device_link
    }
}

/// How a kernel's forwarded outputs (`RingKernel::forward_to`) travel to their target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ForwardPath {
    /// On the device when producer and target are ring kernels of one CUDA-family engine
    /// (CudaSim with CudaSim, CUDA with CUDA on one device) and the target is not keyed: the target's persistent kernel
    /// consumes the producer's output ring directly. Otherwise (CPU, wgpu, mixed engines, a
    /// keyed target, or while a `call` reply must go back to its caller) the producer's host
    /// thread relays them. `KernelHandle::forwarding` says which path each message took.
    #[default]
    Device,
    /// Always relayed by the producer's host thread (from its output ring into the target's
    /// input queue).
    HostRelay,
}

/// Read access to a device kernel's state (`KernelHandle::snapshot_state`).
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub trait StateSnapshot: Send + Sync {
    /// The state's bytes as of every batch submitted before the call (bounded wait).
    fn read(&self) -> Result<Vec<u8>, crate::engine::error::DeviceError>;
}
