//! `KernelHandle`: the typed, cloneable handle to a launched kernel, and the kernel's thread.
//!
//! Delivery rules (no silent loss):
//! * a send either enqueues (`Ok(id)`), is dropped by the `DropNewest`/`DropOldest` policy the
//!   user chose (counted in `messages_dropped`), or fails with the message handed back;
//! * `terminate` returns every message still queued, stranded by a failure, or produced but not
//!   received, in its [`TerminateReport`];
//! * a `call` reply goes straight to its caller; a reply that arrives after the caller timed
//!   out is counted as dropped.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, Thread, ThreadId};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use resident_ring::mailbox::{RecvError, SendError, Sent};
use resident_ring::wait::{deadline_after, Signal};
use resident_ring::{
    Backpressure, Envelope, Mailbox, Message, MessageId, Slot, WaitStrategy, DEFAULT_PRIORITY,
    FLAG_CALL,
};

use crate::runtime::context::{Context, LoopContext};
use crate::runtime::device::DeviceEngine;
use crate::runtime::kernel::{Body, TERMINATE_TIMEOUT};
use crate::runtime::state::{Error, KernelState, Result, Returned};
use crate::runtime::Ids;
use crate::telemetry::{KernelMetrics, Telemetry};

/// Flags the kernel thread watches, with the signal that wakes it when they change.
pub(crate) struct Control {
    pub active: AtomicBool,
    pub terminate: AtomicBool,
    pub signal: Signal,
}

/// The sending side of a kernel's input: what handles and other kernels send through.
pub(crate) struct InputPort<In> {
    pub id: Arc<str>,
    pub mailbox: Mailbox<In>,
    pub ids: Arc<Ids>,
    pub state: Arc<Mutex<KernelState>>,
}

impl<In> Clone for InputPort<In> {
    fn clone(&self) -> Self {
        InputPort {
            id: self.id.clone(),
            mailbox: self.mailbox.clone(),
            ids: self.ids.clone(),
            state: self.state.clone(),
        }
    }
}

impl<In: Message> InputPort<In> {
    pub fn send(&self, msg: In, priority: u8, flags: u8, op: &'static str) -> Result<MessageId> {
        let id = self.ids.next();
        let mut env = Envelope::new(id, priority, self.ids.now_ns());
        env.flags = flags;
        self.send_slot(Slot::new(env, msg), op).map(|_| id)
    }

    fn send_slot(&self, slot: Slot<In>, op: &'static str) -> Result<()> {
        match self.mailbox.send(slot) {
            Ok(Sent::Queued) => Ok(()),
            Ok(Sent::QueuedDroppedOldest(_)) => {
                crate::profile::dropped(&self.id, op, "DropOldest");
                Ok(())
            }
            Ok(Sent::DroppedNewest) => {
                crate::profile::dropped(&self.id, op, "DropNewest");
                Ok(())
            }
            Err(e) => Err(self.refused(e, op)),
        }
    }

    fn refused(&self, e: SendError<Slot<In>>, op: &'static str) -> Error {
        crate::profile::refused(&self.id, op, &e);
        let id = self.id.to_string();
        match e {
            SendError::Full(s) => Error::QueueFull {
                id,
                op,
                message: Returned::new(s.payload),
            },
            SendError::Timeout(s) => {
                let timeout = match self.mailbox.config().backpressure {
                    Backpressure::Block(t) => t,
                    _ => Duration::ZERO,
                };
                Error::Timeout {
                    id,
                    op,
                    timeout,
                    message: Some(Returned::new(s.payload)),
                }
            }
            SendError::Closed(s) => Error::NotAccepting {
                id,
                op,
                state: self.state.lock().clone(),
                message: Returned::new(s.payload),
            },
        }
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

/// A waiting `call`: the reply lands here; the caller spins on `done`, and is unparked only if
/// it announced in `parked` that it sleeps (unparking writes the caller thread's own state, a
/// cache-line transfer that a spinning caller does not need).
struct CallSlot<Out> {
    done: AtomicBool,
    parked: AtomicBool,
    value: Mutex<Option<Result<Out>>>,
    caller: Thread,
}

impl<Out> CallSlot<Out> {
    fn new() -> Self {
        CallSlot {
            done: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            value: Mutex::new(None),
            caller: std::thread::current(),
        }
    }

    fn complete(&self, v: Result<Out>) {
        *self.value.lock() = Some(v);
        // SeqCst store then SeqCst load, against the caller's SeqCst store of `parked` then
        // load of `done` (store-buffering pattern): at least one side sees the other, so a
        // caller that parks is always unparked. The value is written before `done`.
        self.done.store(true, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            self.caller.unpark();
        }
    }

    fn wait(&self, deadline: Option<Instant>, strategy: WaitStrategy) -> Option<Result<Out>> {
        let spin_until = match strategy {
            WaitStrategy::Spin => deadline,
            WaitStrategy::SpinThenPark(d) => Instant::now().checked_add(d),
            WaitStrategy::Park => None,
        };
        let mut i = 0u32;
        while let Some(until) = spin_until {
            // Acquire: pairs with the SeqCst store in `complete`; the value is visible.
            if self.done.load(Ordering::Acquire) {
                return self.value.lock().take();
            }
            std::hint::spin_loop();
            i = i.wrapping_add(1);
            if i % 64 == 0 {
                if Instant::now() >= until {
                    break;
                }
                if i >= 256 {
                    std::thread::yield_now();
                }
            }
        }
        loop {
            self.parked.store(true, Ordering::SeqCst);
            if self.done.load(Ordering::SeqCst) {
                return self.value.lock().take();
            }
            match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    std::thread::park_timeout(d - now);
                }
                None => std::thread::park(),
            }
        }
    }
}

/// Everything a kernel's thread and its handles share.
pub(crate) struct KernelShared<In, Out> {
    pub id: Arc<str>,
    pub port: InputPort<In>,
    pub input: Mailbox<In>,
    pub output: Mailbox<Out>,
    pub state: Arc<Mutex<KernelState>>,
    pub control: Arc<Control>,
    /// Held by the kernel thread while it takes and processes a batch, so `deactivate` can
    /// wait for the batch in hand to finish.
    pub batch_gate: CachePadded<Mutex<()>>,
    pending: Mutex<HashMap<u64, Arc<CallSlot<Out>>, BuildHasherDefault<IdHasher>>>,
    pub metrics: KernelMetrics,
    pub ids: Arc<Ids>,
    /// Output ids: the kernel thread's current block `[next, end)`, taken from `ids` in blocks.
    out_ids: CachePadded<Mutex<(u64, u64)>>,
    pub wait: WaitStrategy,
    pub batch_size: usize,
    /// Inputs taken from the queue but not processed because the handler failed.
    stranded: Mutex<Vec<Slot<In>>>,
    /// The input whose handling panicked.
    failed_message: Mutex<Option<Slot<In>>>,
    /// Outputs that could not be queued because terminate came while the output was full.
    unsent: Mutex<Vec<Slot<Out>>>,
    exited: AtomicBool,
    exit_signal: Signal,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: Mutex<Option<ThreadId>>,
    /// Set at launch when the runtime profiles.
    pub profile: std::sync::OnceLock<crate::profile::KernelProbe>,
}

impl<In: Message, Out: Message> KernelShared<In, Out> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: Arc<str>,
        input: Mailbox<In>,
        output: Mailbox<Out>,
        ids: Arc<Ids>,
        wait: WaitStrategy,
        batch_size: usize,
        telemetry: bool,
    ) -> Self {
        let state = Arc::new(Mutex::new(KernelState::Launched));
        KernelShared {
            port: InputPort {
                id: id.clone(),
                mailbox: input.clone(),
                ids: ids.clone(),
                state: state.clone(),
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
            out_ids: CachePadded::new(Mutex::new((0, 0))),
            wait,
            batch_size,
            stranded: Mutex::new(Vec::new()),
            failed_message: Mutex::new(None),
            unsent: Mutex::new(Vec::new()),
            exited: AtomicBool::new(false),
            exit_signal: Signal::new(),
            thread: Mutex::new(None),
            thread_id: Mutex::new(None),
            profile: std::sync::OnceLock::new(),
        }
    }

    /// Routes the result of handling the message with envelope `req`: to its waiting caller
    /// for a `call`, else to the output queue. Records latency.
    pub fn deliver(&self, req: Envelope, out: Option<Out>) {
        let now = self.ids.now_ns();
        if self.metrics.enabled {
            self.metrics
                .latency
                .record(now.saturating_sub(req.timestamp_ns));
        }
        if req.is_call() {
            self.reply(req, out);
        } else if let Some(out) = out {
            let env = self.response_envelope(&req, self.output_ids(1), now);
            self.push_outputs(&[Slot::new(env, out)]);
        }
    }

    /// The first of `n` consecutive ids for outputs, from the kernel's own block.
    fn output_ids(&self, n: u64) -> u64 {
        let mut b = self.out_ids.lock();
        if b.1 - b.0 < n {
            let take = n.max(Ids::BLOCK);
            let first = self.ids.next_n(take);
            *b = (first, first + take);
        }
        let first = b.0;
        b.0 += n;
        first
    }

    fn response_envelope(&self, req: &Envelope, message_id: u64, now: u64) -> Envelope {
        Envelope {
            message_id,
            correlation_id: req.message_id,
            timestamp_ns: now,
            priority: req.priority,
            flags: req.flags,
            ..Default::default()
        }
    }

    /// Hands a `call`'s result to its waiting caller.
    fn reply(&self, req: Envelope, out: Option<Out>) {
        match self.pending.lock().remove(&req.message_id) {
            Some(slot) => slot.complete(out.ok_or(Error::NoReply {
                id: self.id.to_string(),
                message_id: req.message_id,
            })),
            // The caller gave up (timeout) before the reply came.
            None => {
                self.metrics.late_replies.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Queues outputs in order, one lock and one wake-up per run. A full output queue makes
    /// the kernel wait (or drop, under a drop policy); outputs that cannot be queued because
    /// the kernel is terminating go to the terminate report.
    fn push_outputs(&self, outputs: &[Slot<Out>]) {
        let mut done = 0;
        while done < outputs.len() {
            let (n, err) = self.output.send_batch(&outputs[done..]);
            done += n;
            if err.is_some()
                && (self.control.terminate.load(Ordering::Acquire) || self.output.is_closed())
            {
                self.unsent.lock().extend_from_slice(&outputs[done..]);
                return;
            }
        }
    }

    fn set_failed(&self, reason: String) {
        crate::profile::fault(&self.id, &reason);
        self.metrics.errors.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = self.state.lock();
            *st = KernelState::Failed(reason.clone());
        }
        self.input.close();
        self.output.close();
        self.fail_pending(|id| Error::KernelFailed {
            id,
            reason: reason.clone(),
        });
        self.control.signal.notify();
    }

    fn fail_pending(&self, err: impl Fn(String) -> Error) {
        let pending: Vec<_> = self.pending.lock().drain().collect();
        for (_, slot) in pending {
            slot.complete(Err(err(self.id.to_string())));
        }
    }

    fn wait_for_control(&self) {
        let c = &self.control;
        c.signal.wait_until(WaitStrategy::Park, None, || {
            c.active.load(Ordering::Acquire) || c.terminate.load(Ordering::Acquire)
        });
    }

    /// The handler form's loop: drain a batch, handle each message, repeat.
    fn run_handler<S>(
        &self,
        mut ctx: Context<S>,
        mut handler: crate::runtime::kernel::HandlerFn<In, Out, S>,
    ) {
        let mut batch: Vec<Slot<In>> = Vec::with_capacity(self.batch_size);
        let mut outputs: Vec<Slot<Out>> = Vec::with_capacity(self.batch_size);
        let c = self.control.clone();
        let prof = self.profile.get();
        loop {
            if c.terminate.load(Ordering::Acquire) {
                return;
            }
            if !c.active.load(Ordering::Acquire) {
                self.wait_for_control();
                continue;
            }
            let gate = self.batch_gate.lock();
            // Re-check under the gate: `deactivate` flips the flag, then takes the gate.
            if !c.active.load(Ordering::Acquire) || c.terminate.load(Ordering::Acquire) {
                continue;
            }
            batch.clear();
            let n = self.input.recv_batch(&mut batch, self.batch_size);
            if n == 0 {
                drop(gate);
                self.input.wait_nonempty(None, || {
                    c.terminate.load(Ordering::Acquire) || !c.active.load(Ordering::Acquire)
                });
                continue;
            }
            outputs.clear();
            let scope = crate::profile::batch_start(prof, &self.id, n);
            for (i, slot) in batch.iter().enumerate() {
                ctx.current = slot.env;
                let payload = slot.payload;
                let result = catch_unwind(AssertUnwindSafe(|| handler(&mut ctx, payload)));
                if result.is_ok() {
                    self.metrics.messages_done(1);
                }
                match result {
                    // Call replies go to their callers at once; other outputs leave as one batch.
                    Ok(out) if slot.env.is_call() => self.reply(slot.env, out),
                    Ok(Some(out)) => outputs.push(Slot::new(slot.env, out)),
                    Ok(None) => {}
                    Err(panic) => {
                        self.finish_batch(&batch[..i], &mut outputs);
                        self.metrics.batch_done(Instant::now());
                        *self.failed_message.lock() = Some(*slot);
                        self.stranded.lock().extend_from_slice(&batch[i + 1..]);
                        self.set_failed(format!(
                            "handler panicked on message {}: {}",
                            slot.env.message_id,
                            panic_text(&panic)
                        ));
                        return;
                    }
                }
            }
            self.finish_batch(&batch, &mut outputs);
            crate::profile::batch_end(prof, scope, &batch);
            self.metrics.batch_done(Instant::now());
            drop(gate);
        }
    }

    /// Records the batch's latencies with one clock read, stamps the outputs (which carry
    /// their request's envelope until here) with ids and correlation, and queues them.
    fn finish_batch(&self, handled: &[Slot<In>], outputs: &mut [Slot<Out>]) {
        let now = self.ids.now_ns();
        if self.metrics.enabled {
            for s in handled {
                self.metrics
                    .latency
                    .record(now.saturating_sub(s.env.timestamp_ns));
            }
        }
        if outputs.is_empty() {
            return;
        }
        let first = self.output_ids(outputs.len() as u64);
        for (i, o) in outputs.iter_mut().enumerate() {
            o.env = self.response_envelope(&o.env, first + i as u64, now);
        }
        self.push_outputs(outputs);
    }

    /// The pump of a device-hosted kernel: mailbox -> device lanes, device output ring ->
    /// callers and the output queue; heartbeat, fault polling, device counters.
    fn run_device(&self, mut eng: Box<dyn DeviceEngine<In, Out>>) {
        let c = self.control.clone();
        let mut carry: Vec<Slot<In>> = Vec::with_capacity(self.batch_size * 4);
        let mut outs: Vec<Slot<Out>> = Vec::with_capacity(4096);
        let mut device_active = false;
        let mut last_beat = Instant::now();
        let mut idle: u32 = 0;
        let prof = self.profile.get();
        let failure = loop {
            if c.terminate.load(Ordering::Acquire) {
                break None;
            }
            let want = c.active.load(Ordering::Acquire);
            if want != device_active {
                if let Err(e) = eng.set_active(want) {
                    break Some(e);
                }
                device_active = want;
            }
            let mut moved = 0;
            if want {
                let _gate = self.batch_gate.lock();
                // Re-check under the gate: `deactivate` flips the flag, then takes the gate.
                if c.active.load(Ordering::Acquire) {
                    if carry.is_empty() {
                        self.input.recv_batch(&mut carry, self.batch_size * 4);
                    }
                    let t = crate::profile::now(prof);
                    let n = eng.push(&carry);
                    crate::profile::device_push(prof, t, &carry[..n]);
                    carry.drain(..n);
                    moved += n;
                }
            }
            outs.clear();
            let t = crate::profile::now(prof);
            let n = eng.pull(&mut outs, 4096);
            crate::profile::device_pull(prof, t, &outs);
            // Counters first: whoever sees an output also sees it counted.
            self.store_device_counters(&*eng);
            if n > 0 {
                self.deliver_device_outputs(&outs);
                moved += n;
            }
            if last_beat.elapsed() >= Duration::from_millis(50) {
                last_beat = Instant::now();
                eng.heartbeat();
                if let Err(e) = eng.check() {
                    break Some(e);
                }
            }
            if moved > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle < 256 {
                std::hint::spin_loop();
            } else {
                // Outputs from the device come without a wake-up: poll with a bounded backoff
                // (up to 1 ms), waking at once for new input or a state change.
                let backoff = Duration::from_micros(1 << (idle - 256).min(10));
                self.input.wait_nonempty(deadline_after(backoff), || {
                    c.terminate.load(Ordering::Acquire)
                        || c.active.load(Ordering::Acquire) != device_active
                });
            }
        };
        let stop = eng.stop(TERMINATE_TIMEOUT);
        loop {
            outs.clear();
            if eng.pull(&mut outs, 4096) == 0 {
                break;
            }
            self.deliver_device_outputs(&outs);
        }
        self.store_device_counters(&*eng);
        // Inputs the device never consumed were sent before those still in `carry`.
        let mut stranded = eng.reclaim();
        stranded.append(&mut carry);
        self.stranded.lock().extend(stranded);
        // Free the device side before anyone can see the failure: after a device fault the
        // context is reset on the next launch only once nothing from before the fault is alive.
        drop(eng);
        let reason =
            failure.or_else(|| stop.err().filter(|_| !c.terminate.load(Ordering::Acquire)));
        if let Some(reason) = reason {
            self.set_failed(format!("device kernel failed: {reason}"));
        }
    }

    fn store_device_counters(&self, eng: &dyn DeviceEngine<In, Out>) {
        let (processed, batches, lost) = eng.counters();
        self.metrics.processed.store(processed, Ordering::Relaxed);
        self.metrics.batches.store(batches, Ordering::Relaxed);
        self.metrics
            .device_undelivered
            .store(lost, Ordering::Relaxed);
    }

    /// Device outputs carry the request's id as `correlation_id`, its flags and its send
    /// time: route call replies to their callers, re-stamp the rest and queue them in order.
    fn deliver_device_outputs(&self, outs: &[Slot<Out>]) {
        let now = self.ids.now_ns();
        let mut batch: Vec<Slot<Out>> = Vec::with_capacity(outs.len());
        for o in outs {
            if self.metrics.enabled {
                self.metrics
                    .latency
                    .record(now.saturating_sub(o.env.timestamp_ns));
            }
            let request = Envelope {
                message_id: o.env.correlation_id,
                ..o.env
            };
            if request.is_call() {
                self.reply(request, Some(o.payload));
            } else {
                batch.push(Slot::new(request, o.payload));
            }
        }
        if batch.is_empty() {
            return;
        }
        let first = self.output_ids(batch.len() as u64);
        for (i, o) in batch.iter_mut().enumerate() {
            o.env = self.response_envelope(&o.env, first + i as u64, now);
        }
        self.push_outputs(&batch);
    }

    fn finish_thread(&self) {
        self.exited.store(true, Ordering::Release);
        self.exit_signal.notify();
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Starts the kernel's thread (waiting for `activate` before it handles anything).
pub(crate) fn spawn_kernel<In: Message, Out: Message, S: Send + 'static>(
    shared: Arc<KernelShared<In, Out>>,
    ctx: Context<S>,
    body: Body<In, Out, S>,
) -> Result<()> {
    let s = shared.clone();
    let handle = std::thread::Builder::new()
        .name(format!("resident:{}", shared.id))
        .spawn(move || {
            *s.thread_id.lock() = Some(std::thread::current().id());
            match body {
                Body::Handler(h) => s.run_handler(ctx, h),
                Body::Device(engine) => {
                    drop(ctx);
                    s.run_device(engine)
                }
                Body::Loop(f) => {
                    let mut lctx = LoopContext::new(ctx, s.clone());
                    let r = catch_unwind(AssertUnwindSafe(|| {
                        // Nothing is handed to the loop before activation.
                        s.wait_for_control();
                        f(&mut lctx)
                    }));
                    drop(lctx.into_parts());
                    match r {
                        Err(p) => s.set_failed(format!("run loop panicked: {}", panic_text(&p))),
                        Ok(()) if !s.control.terminate.load(Ordering::Acquire) => {
                            s.set_failed("run loop returned before terminate was requested".into())
                        }
                        Ok(()) => {}
                    }
                }
            }
            s.finish_thread();
        })
        .map_err(|source| Error::Spawn {
            id: shared.id.to_string(),
            source,
        })?;
    *shared.thread.lock() = Some(handle);
    Ok(())
}

/// What `terminate` found: counts, and every message that was not delivered, so nothing is
/// lost silently.
#[derive(Debug)]
pub struct TerminateReport<In, Out> {
    /// Kernel id.
    pub kernel_id: String,
    /// Messages the handler finished.
    pub processed: u64,
    /// Messages discarded by a drop policy or late replies (counted, as in telemetry).
    pub dropped: u64,
    /// Inputs accepted but never handled (still queued, or stranded by a failure), with their
    /// envelopes, highest priority first.
    pub undelivered: Vec<(Envelope, In)>,
    /// Outputs produced but never received.
    pub unreceived: Vec<(Envelope, Out)>,
    /// The failure, if the kernel had failed, and the message whose handling failed.
    pub failure: Option<(String, Option<(Envelope, In)>)>,
}

/// A typed, cloneable handle to a launched kernel.
pub struct KernelHandle<In, Out> {
    pub(crate) shared: Arc<KernelShared<In, Out>>,
}

impl<In, Out> std::fmt::Debug for KernelHandle<In, Out> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelHandle")
            .field("id", &&*self.shared.id)
            .field("state", &*self.shared.state.lock())
            .finish()
    }
}

impl<In, Out> Clone for KernelHandle<In, Out> {
    fn clone(&self) -> Self {
        KernelHandle {
            shared: self.shared.clone(),
        }
    }
}

impl<In: Message, Out: Message> KernelHandle<In, Out> {
    /// The kernel's id.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The kernel's lifecycle state.
    pub fn state(&self) -> KernelState {
        self.shared.state.lock().clone()
    }

    fn invalid(&self, op: &'static str, state: KernelState) -> Error {
        Error::InvalidState {
            id: self.shared.id.to_string(),
            op,
            state,
        }
    }

    /// Starts (or resumes) processing: `Launched | Inactive -> Active`.
    pub fn activate(&self) -> Result<()> {
        let mut st = self.shared.state.lock();
        match *st {
            KernelState::Launched | KernelState::Inactive => {
                *st = KernelState::Active;
                self.shared.control.active.store(true, Ordering::Release);
                drop(st);
                crate::profile::lifecycle(&self.shared.id, "activate", &KernelState::Active);
                self.shared.control.signal.notify();
                Ok(())
            }
            ref other => Err(self.invalid("activate", other.clone())),
        }
    }

    /// Stops intake: `Active -> Inactive`. Returns once the batch in hand (if any) is done;
    /// later messages queue up (or meet backpressure) until `activate`.
    pub fn deactivate(&self) -> Result<()> {
        {
            let mut st = self.shared.state.lock();
            match *st {
                KernelState::Active => *st = KernelState::Inactive,
                ref other => return Err(self.invalid("deactivate", other.clone())),
            }
            self.shared.control.active.store(false, Ordering::Release);
        }
        crate::profile::lifecycle(&self.shared.id, "deactivate", &KernelState::Inactive);
        self.shared.input.notify_receivers();
        // Wait for the batch in hand, unless we are that kernel's own thread.
        if *self.shared.thread_id.lock() != Some(std::thread::current().id()) {
            drop(self.shared.batch_gate.lock());
        }
        Ok(())
    }

    /// Sends `msg` at the default priority (128). Returns its message id.
    pub fn send(&self, msg: In) -> Result<MessageId> {
        self.shared.port.send(msg, DEFAULT_PRIORITY, 0, "send")
    }

    /// Sends `msg` at `priority` (0-255, higher drains first).
    pub fn send_with_priority(&self, msg: In, priority: u8) -> Result<MessageId> {
        self.shared.port.send(msg, priority, 0, "send")
    }

    /// Sends many messages at the default priority with one queue operation per lane run.
    /// Returns how many were taken (queued, or dropped by a drop policy); when that is fewer
    /// than `msgs.len()`, `msgs[n..]` were not sent (full under `Reject`, `Block` timed out)
    /// and are still the caller's. Fails only when nothing was taken, with the first message
    /// handed back in the error.
    pub fn send_batch(&self, msgs: &[In]) -> Result<usize> {
        let p = &self.shared.port;
        let first = p.ids.next_n(msgs.len() as u64);
        let now = p.ids.now_ns();
        let slots: Vec<Slot<In>> = msgs
            .iter()
            .enumerate()
            .map(|(i, m)| Slot::new(Envelope::new(first + i as u64, DEFAULT_PRIORITY, now), *m))
            .collect();
        match self.shared.input.send_batch(&slots) {
            (0, Some(e)) => Err(p.refused(e, "send_batch")),
            (n, _) => Ok(n),
        }
    }

    /// Sends `msg` and waits up to `timeout` for the reply matched by correlation id. Safe with
    /// many concurrent callers. A reply that comes after the timeout is counted as dropped.
    pub fn call(&self, msg: In, timeout: Duration) -> Result<Out> {
        let sh = &self.shared;
        let deadline = deadline_after(timeout);
        let id = sh.ids.next();
        let slot = Arc::new(CallSlot::new());
        sh.pending.lock().insert(id, slot.clone());
        let mut env = Envelope::new(id, DEFAULT_PRIORITY, sh.ids.now_ns());
        env.flags = FLAG_CALL;
        if let Err(e) = sh.port.send_slot(Slot::new(env, msg), "call") {
            sh.pending.lock().remove(&id);
            return Err(e);
        }
        match slot.wait(deadline, sh.wait) {
            Some(r) => r,
            None => {
                if sh.pending.lock().remove(&id).is_none() {
                    // Completed between our last check and the removal.
                    if let Some(r) = slot.wait(None, WaitStrategy::Park) {
                        return r;
                    }
                }
                Err(Error::Timeout {
                    id: sh.id.to_string(),
                    op: "call",
                    timeout,
                    message: None,
                })
            }
        }
    }

    /// The next output, waiting up to `timeout`.
    pub fn receive(&self, timeout: Duration) -> Result<Out> {
        self.receive_envelope(timeout).map(|(_, m)| m)
    }

    /// The next output with its envelope (`correlation_id` = the request's message id).
    pub fn receive_envelope(&self, timeout: Duration) -> Result<(Envelope, Out)> {
        match self.shared.output.recv_timeout(timeout) {
            Ok(s) => Ok((s.env, s.payload)),
            Err(RecvError::Timeout) => Err(Error::Timeout {
                id: self.shared.id.to_string(),
                op: "receive",
                timeout,
                message: None,
            }),
            Err(RecvError::Closed) => Err(self.closed_error("receive")),
        }
    }

    /// Up to `max` outputs that are ready now, appended to `out`; returns how many.
    pub fn receive_batch(&self, out: &mut Vec<Out>, max: usize) -> Result<usize> {
        let n = self.shared.output.recv_each(max, |s| out.push(s.payload));
        if n == 0 && self.shared.output.is_closed() {
            return Err(self.closed_error("receive"));
        }
        Ok(n)
    }

    /// The next output if one is ready; an error once the kernel failed or terminated and no
    /// output is left.
    pub fn try_receive(&self) -> Result<Option<Out>> {
        match self.shared.output.try_recv() {
            Some(s) => Ok(Some(s.payload)),
            None if self.shared.output.is_closed() => Err(self.closed_error("receive")),
            None => Ok(None),
        }
    }

    fn closed_error(&self, op: &'static str) -> Error {
        match self.state() {
            KernelState::Failed(reason) => Error::KernelFailed {
                id: self.shared.id.to_string(),
                reason,
            },
            state => self.invalid(op, state),
        }
    }

    /// Waits until everything queued so far has been handled (input empty, batch done).
    /// Only valid while active.
    pub fn drain(&self, timeout: Duration) -> Result<()> {
        let deadline = deadline_after(timeout);
        loop {
            match self.state() {
                KernelState::Active => {}
                state => return Err(self.invalid("drain", state)),
            }
            if self.shared.input.is_empty() {
                let _gate = self.shared.batch_gate.lock();
                if self.shared.input.is_empty() {
                    return Ok(());
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Timeout {
                    id: self.shared.id.to_string(),
                    op: "drain",
                    timeout,
                    message: None,
                });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Stops the kernel: intake stops at once, the batch in hand finishes, the thread exits,
    /// and the report returns every message that was not delivered. Valid from `Launched`,
    /// `Active`, `Inactive`, `Failed`, and again from `Terminating` after a timeout.
    pub fn terminate(&self) -> Result<TerminateReport<In, Out>> {
        let sh = &self.shared;
        let failure = {
            let mut st = sh.state.lock();
            match &*st {
                KernelState::Launched
                | KernelState::Active
                | KernelState::Inactive
                | KernelState::Terminating => {
                    *st = KernelState::Terminating;
                    None
                }
                KernelState::Failed(reason) => Some(reason.clone()),
                other => return Err(self.invalid("terminate", other.clone())),
            }
        };
        sh.input.close();
        sh.control.terminate.store(true, Ordering::Release);
        sh.control.signal.notify();
        sh.input.notify_receivers();
        if *sh.thread_id.lock() == Some(std::thread::current().id()) {
            return Err(self.invalid("terminate from its own handler", sh.state.lock().clone()));
        }
        let exited = sh.exit_signal.wait_until(
            WaitStrategy::Park,
            deadline_after(TERMINATE_TIMEOUT),
            || sh.exited.load(Ordering::Acquire),
        );
        if !exited {
            return Err(Error::Timeout {
                id: sh.id.to_string(),
                op: "terminate",
                timeout: TERMINATE_TIMEOUT,
                message: None,
            });
        }
        if let Some(t) = sh.thread.lock().take() {
            let _ = t.join();
        }
        let mut undelivered: Vec<(Envelope, In)> = sh
            .stranded
            .lock()
            .drain(..)
            .map(|s| (s.env, s.payload))
            .collect();
        undelivered.extend(sh.input.drain().into_iter().map(|s| (s.env, s.payload)));
        let mut unreceived: Vec<(Envelope, Out)> = sh
            .output
            .drain()
            .into_iter()
            .map(|s| (s.env, s.payload))
            .collect();
        unreceived.extend(sh.unsent.lock().drain(..).map(|s| (s.env, s.payload)));
        sh.output.close();
        sh.fail_pending(|id| Error::InvalidState {
            id,
            op: "call",
            state: KernelState::Terminated,
        });
        let failed_message = sh.failed_message.lock().take().map(|s| (s.env, s.payload));
        *sh.state.lock() = KernelState::Terminated;
        crate::profile::lifecycle(&sh.id, "terminate", &KernelState::Terminated);
        let t = self.telemetry();
        Ok(TerminateReport {
            kernel_id: sh.id.to_string(),
            processed: t.messages_processed,
            dropped: t.messages_dropped,
            undelivered,
            unreceived,
            failure: failure.map(|r| (r, failed_message)),
        })
    }

    /// A snapshot of the kernel's telemetry.
    pub fn telemetry(&self) -> Telemetry {
        let sh = &self.shared;
        let m = &sh.metrics;
        let input = sh.input.counters();
        let output = sh.output.counters();
        Telemetry {
            kernel_id: sh.id.to_string(),
            state: self.state(),
            messages_received: input.accepted,
            messages_processed: m.processed.load(Ordering::Relaxed),
            messages_dropped: input.dropped
                + output.dropped
                + m.late_replies.load(Ordering::Relaxed)
                + m.device_undelivered.load(Ordering::Relaxed),
            messages_refused: input.refused,
            errors: m.errors.load(Ordering::Relaxed),
            queue_depth: sh.input.len(),
            output_depth: sh.output.len(),
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
