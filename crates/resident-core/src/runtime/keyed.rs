//! Keyed kernels: one ring kernel holding many small per-key states (a sensor, a session, a
//! graph node), every message naming its key.
//!
//! A keyed kernel is built with [`RingKernel::keyed`] (every key starts from one value) or
//! [`RingKernel::keyed_from`] (bulk initialisation from a `Vec`), and handled by
//! [`RingKernel::key_handler`], which receives the state of the message's key. Messages name
//! their key through the [`Keyed`] trait on the message type: the envelope and the device wire
//! layout stay as they are, `send`, `call`, `send_to` and `forward_to` need nothing new, and
//! device code reads the key from the message struct itself. A message naming a key the kernel
//! does not have is refused at `send` with [`Error::KeyOutOfRange`] (nothing is queued).
//!
//! # How it runs on the CPU
//!
//! The keys are sharded over worker threads (key `k` lives in shard `k % workers`, slot
//! `k / workers`; all cores by default, [`RingKernel::workers`] to choose). The kernel's thread
//! takes batches through the one take-or-wait loop every kernel uses
//! (`KernelIo::next_batch`: priority lanes, highest first, FIFO within a lane), splits each
//! batch by shard keeping the batch's order, runs shard 0 itself while the other workers run
//! theirs, and publishes the results once every shard is done. So:
//!
//! * messages of one key are handled in the order they were taken (the order sent, within a
//!   priority lane): a key is always in the same shard, a shard runs its part of a batch in
//!   order, and a batch ends before the next is taken;
//! * different keys run in parallel;
//! * lifecycle and terminate accounting are the normal kernel's: activate, deactivate, drain
//!   and terminate act on the kernel's thread, which holds the batch gate for the whole batch,
//!   so every shard is idle whenever the kernel is between batches.
//!
//! A batch is committed as a whole: once every shard finished, one claim
//! ([`InHand::finish`](resident_ring::handoff::InHand::finish) of the untouched batch) makes
//! the whole batch the kernel's (counted processed, outputs published). If `terminate` gives up
//! on a handler that never returns before that claim, the whole batch in hand is in the
//! terminate report as undelivered and none of its outputs is published (other shards may
//! have run some of those handlers already; the key states can show them). A handler that panics
//! fails the kernel as on a normal kernel: the outputs of the batch's other messages that were
//! handled are published, the panicking message is the report's failed message, and the
//! messages its shard had not reached are stranded (in the report).

use std::any::Any;
use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_utils::CachePadded;
use resident_ring::{Envelope, Message, Slot};

use bytemuck::Pod;
use resident_ring::message::CField;

use crate::memory::{BufferOptions, UnifiedBuffer};
use crate::runtime::bind::{BindError, PendingBinding};
use crate::runtime::device_handler::{CudaSource, WgslSource};
use crate::runtime::host::{panic_text, RingHost};
use crate::runtime::io::KernelIo;
use crate::runtime::kernel::RingKernel;
use crate::runtime::kernel::{DeviceKeys, KeyStatesFactory};
use crate::runtime::keys::{KeyCheck, KeyStates, KeyedError};
pub use crate::runtime::keys::{Keyed, KEYED_BATCH, KEYS_BUFFER, MAX_SNAPSHOT_KEYS};
use crate::runtime::publisher::Publisher;
use crate::state::{Error, Failure, Result};

/// The per-key states of a keyed kernel being built (the `S` of `RingKernel<In, Out, Keys<S>>`).
pub struct Keys<S> {
    states: Vec<S>,
    workers: Option<usize>,
}

/// What a keyed handler sees: its key, the key's state, and the message's envelope.
pub struct KeyContext<'a, S> {
    key: u32,
    state: &'a mut S,
    env: &'a Envelope,
}

impl<S> KeyContext<'_, S> {
    /// The key of the message being handled.
    pub fn key(&self) -> u32 {
        self.key
    }
    /// The key's state.
    pub fn state(&self) -> &S {
        self.state
    }
    /// The key's state, mutably.
    pub fn state_mut(&mut self) -> &mut S {
        self.state
    }
    /// The envelope of the message being handled (id, priority, send time).
    pub fn envelope(&self) -> &Envelope {
        self.env
    }
}

type KeyFn<In, Out, S> = Arc<dyn Fn(&mut KeyContext<'_, S>, In) -> Option<Out> + Send + Sync>;

impl<In: Message + Keyed, Out: Message> RingKernel<In, Out, ()> {
    /// Makes this a keyed kernel of `keys` keys, each starting as a copy of `init` (see the
    /// [module docs](crate::runtime::keyed)). The batch size becomes
    /// [`KEYED_BATCH`] (a later `.batch_size(n)` changes it).
    pub fn keyed<S: Clone + Send + 'static>(
        self,
        keys: u32,
        init: S,
    ) -> RingKernel<In, Out, Keys<S>> {
        self.keyed_from(vec![init; keys as usize])
    }

    /// Makes this a keyed kernel whose key `k` starts as `states[k]` (bulk initialisation; the
    /// kernel has `states.len()` keys, at most `u32::MAX`, checked at launch).
    pub fn keyed_from<S: Send + 'static>(
        self,
        states: impl Into<Vec<S>>,
    ) -> RingKernel<In, Out, Keys<S>> {
        let states: Vec<S> = states.into();
        let keys = u32::try_from(states.len()).unwrap_or(u32::MAX);
        let mut k = self.batch_size(KEYED_BATCH).state(Keys {
            states,
            workers: None,
        });
        k.keys = Some(KeyCheck {
            keys,
            key_of: <In as Keyed>::key,
        });
        k
    }
}

impl<In: Message + Keyed, Out: Message, S: Clone + Send + 'static> RingKernel<In, Out, Keys<S>> {
    /// Worker threads the keys are sharded over on the CPU (default: every core the process
    /// may use; never more than the keys). `1` runs every key on the kernel's own thread.
    pub fn workers(mut self, n: usize) -> Self {
        self.state.workers = Some(n);
        self
    }

    /// The per-message handler of a keyed kernel: called with the state of the message's key
    /// (in [`KeyContext`]) and the message. Handlers of different keys run in parallel, so it
    /// is `Fn + Sync` (the key's state is the mutable part). Returning `Some(out)` sends `out`
    /// as the response, as for [`RingKernel::handler`].
    pub fn key_handler<F>(mut self, f: F) -> Self
    where
        F: Fn(&mut KeyContext<'_, S>, In) -> Option<Out> + Send + Sync + 'static,
    {
        let f: KeyFn<In, Out, S> = Arc::new(f);
        self.host = Some(Box::new(
            move |keys: Keys<S>, io: &Arc<KernelIo<In, Out>>| KeyedHost::build(keys, f, io),
        ));
        self
    }
}

/// One shard's states, on its own cache lines.
struct Shard<S> {
    states: UnsafeCell<Vec<S>>,
}

/// The states of a keyed kernel, sharded: key `k` is `shards[k % w].states[k / w]`.
pub(crate) struct Shards<S> {
    shards: Box<[CachePadded<Shard<S>>]>,
    keys: u32,
}

// SAFETY: shard `s`'s states are touched only (a) during a batch, by the one thread the
// kernel's thread handed shard `s` to for that batch (the kernel's thread itself, or worker
// `s`, who gets it through a channel send and gives it back through a channel send: the
// channel orders the worker's writes before the kernel's thread continues), and (b) by
// `KeyStates::read`, whose callers hold the kernel's batch gate, which the kernel's thread
// holds from taking a batch until every shard of it has been given back. So no two threads
// touch one shard at once. `S: Send` lets states be written on worker threads.
unsafe impl<S: Send> Sync for Shards<S> {}

impl<S> Shards<S> {
    fn new(states: Vec<S>, w: usize) -> Self {
        let keys = states.len() as u32;
        let mut shards: Vec<Vec<S>> = (0..w)
            .map(|s| Vec::with_capacity(states.len() / w + usize::from(s < states.len() % w)))
            .collect();
        for (k, st) in states.into_iter().enumerate() {
            shards[k % w].push(st);
        }
        Shards {
            shards: shards
                .into_iter()
                .map(|v| {
                    CachePadded::new(Shard {
                        states: UnsafeCell::new(v),
                    })
                })
                .collect(),
            keys,
        }
    }

    fn workers(&self) -> usize {
        self.shards.len()
    }

    /// Runs `work` (messages of shard `work.shard` only, in order) against that shard's states.
    ///
    /// # Safety
    /// The caller owns shard `work.shard` for this batch (see the `Sync` impl).
    unsafe fn run<In: Message + Keyed, Out>(
        &self,
        work: &mut Work<In, Out>,
        handler: &KeyFn<In, Out, S>,
    ) {
        let w = self.shards.len() as u32;
        // SAFETY: by this function's contract no other thread touches this shard now.
        let states = unsafe { &mut *self.shards[work.shard].states.get() };
        for (i, slot) in work.items.iter().enumerate() {
            let key = slot.payload.key();
            let r = catch_unwind(AssertUnwindSafe(|| {
                // In range: every send checked the key (`KeyCheck`); indexing stays checked.
                let mut ctx = KeyContext {
                    key,
                    state: &mut states[(key / w) as usize],
                    env: &slot.env,
                };
                handler(&mut ctx, slot.payload)
            }));
            match r {
                Ok(out) => work.outs.push((slot.env, out)),
                Err(p) => {
                    work.panic = Some((i, panic_text(&p)));
                    return;
                }
            }
        }
    }
}

impl<S: Clone + Send + 'static> KeyStates for Shards<S> {
    fn keys(&self) -> u32 {
        self.keys
    }
    fn type_name(&self) -> &'static str {
        std::any::type_name::<S>()
    }
    fn needs_gate(&self) -> bool {
        true
    }
    unsafe fn read(
        &self,
        range: Range<u32>,
        out: &mut dyn Any,
        _timeout: std::time::Duration,
    ) -> Result<bool> {
        let Some(out) = out.downcast_mut::<Vec<S>>() else {
            return Ok(false);
        };
        let w = self.shards.len() as u32;
        out.reserve(range.len());
        for k in range {
            // SAFETY: the caller holds the batch gate, so no batch is running (see the `Sync`
            // impl); shared reads only.
            let shard = unsafe { &*self.shards[(k % w) as usize].states.get() };
            out.push(shard[(k / w) as usize].clone());
        }
        Ok(true)
    }
}

/// A device keyed kernel's states: the bound buffer `keys`, read through the engine's
/// synchronized copy (the kernel parks between two batches for it).
struct DeviceKeyStates<In, Out, S> {
    io: std::sync::Weak<KernelIo<In, Out>>,
    keys: u32,
    _s: std::marker::PhantomData<fn() -> S>,
}

impl<In: Message, Out: Message, S: Pod + 'static> KeyStates for DeviceKeyStates<In, Out, S> {
    fn keys(&self) -> u32 {
        self.keys
    }
    fn type_name(&self) -> &'static str {
        std::any::type_name::<S>()
    }
    fn needs_gate(&self) -> bool {
        false
    }
    unsafe fn read(
        &self,
        range: Range<u32>,
        out: &mut dyn Any,
        timeout: std::time::Duration,
    ) -> Result<bool> {
        let Some(out) = out.downcast_mut::<Vec<S>>() else {
            return Ok(false);
        };
        let Some(io) = self.io.upgrade() else {
            return Ok(true);
        };
        let id = io.id.to_string();
        let h = crate::runtime::handle::KernelHandle { io };
        let guard = h
            .read_buffer::<S>(KEYS_BUFFER, timeout)
            .map_err(|e| match e {
                BindError::Device { source, .. } => Error::Device {
                    id,
                    op: "snapshot_keys",
                    source,
                },
                BindError::Busy { waited, .. } => Error::Timeout {
                    id,
                    op: crate::state::Op::SnapshotKeys,
                    timeout: waited,
                    message: None,
                },
                other => Error::InvalidConfig {
                    id,
                    reason: other.to_string(),
                },
            })?;
        out.extend_from_slice(&guard[range.start as usize..range.end as usize]);
        Ok(true)
    }
}

fn device_keys<In: Message, Out: Message, S: Pod + CField + Send + 'static>(
) -> DeviceKeys<In, Out, Keys<S>> {
    Box::new(|keys: &Keys<S>, dev: &crate::engine::DeviceHandle| {
        let n = keys.states.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(KeyedError::KeyCount(n));
        }
        let buf = UnifiedBuffer::from_slice(dev, &keys.states, BufferOptions::default())
            .map_err(|source| KeyedError::KeyStates { keys: n, source })?;
        let snap: KeyStatesFactory<In, Out> = Box::new(move |io: &Arc<KernelIo<In, Out>>| {
            Arc::new(DeviceKeyStates::<In, Out, S> {
                io: Arc::downgrade(io),
                keys: n as u32,
                _s: std::marker::PhantomData,
            }) as Arc<dyn KeyStates>
        });
        Ok((PendingBinding::new(KEYS_BUFFER.into(), buf), snap))
    })
}

impl<In: Message + Keyed, Out: Message, S: Pod + CField + Clone + Send + 'static>
    RingKernel<In, Out, Keys<S>>
{
    /// The CUDA handler of a keyed kernel, made with `CudaHandler::keyed`: on a CUDA or
    /// CudaSim runtime the per-key states live in device memory for the kernel's life (bound
    /// as the buffer `keys`, `size_of::<S>()` bytes per key) and the handler gets its key's
    /// state; `snapshot_key(s)` read them back (the kernel parks between two batches for it).
    /// Other runtimes run the [`key_handler`](RingKernel::key_handler).
    pub fn key_cuda(mut self, handler: impl CudaSource<In, Out>) -> Self {
        self.device.set(Box::new(handler));
        self.device_keys = Some(device_keys::<In, Out, S>());
        self
    }

    /// The WGSL handler of a keyed kernel, made with `WgslHandler::keyed`: on a wgpu
    /// runtime the per-key states live in a storage buffer for the kernel's life (bound as
    /// `keys`, `size_of::<S>()` bytes per key) and the handler gets its key's state as
    /// `ptr<function, KeyState>`; `snapshot_key(s)` read them back (a copy behind
    /// the batches already submitted). Other runtimes run the
    /// [`key_handler`](RingKernel::key_handler) (or the CUDA handler on CUDA and CudaSim).
    pub fn key_wgsl(mut self, handler: impl WgslSource<In, Out>) -> Self {
        self.device.set(Box::new(handler));
        self.device_keys = Some(device_keys::<In, Out, S>());
        self
    }
}

/// Part of a batch for one shard, moved to the thread that runs it and back.
struct Work<In, Out> {
    shard: usize,
    items: Vec<Slot<In>>,
    /// The request's envelope and the handler's result, in order.
    outs: Vec<(Envelope, Option<Out>)>,
    /// `items[i]`'s handler panicked (the items after it were not handled).
    panic: Option<(usize, String)>,
}

impl<In, Out> Work<In, Out> {
    fn new(shard: usize) -> Self {
        Work {
            shard,
            items: Vec::new(),
            outs: Vec::new(),
            panic: None,
        }
    }
}

/// Hosts a keyed kernel on the CPU: the kernel's thread plus `workers - 1` helper threads.
pub(crate) struct KeyedHost<In, Out, S> {
    shards: Arc<Shards<S>>,
    handler: KeyFn<In, Out, S>,
}

impl<In: Message + Keyed, Out: Message, S: Clone + Send + 'static> KeyedHost<In, Out, S> {
    /// Checks the key count, shards the states and registers them for snapshots.
    fn build(
        keys: Keys<S>,
        handler: KeyFn<In, Out, S>,
        io: &Arc<KernelIo<In, Out>>,
    ) -> std::result::Result<Box<dyn RingHost<In, Out>>, KeyedError> {
        let n = keys.states.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(KeyedError::KeyCount(n));
        }
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let w = match keys.workers {
            Some(0) => return Err(KeyedError::ZeroWorkers),
            Some(w) => w,
            None => cores,
        }
        .min(n);
        let shards = Arc::new(Shards::new(keys.states, w));
        let _ = io.keyed.set(shards.clone() as Arc<dyn KeyStates>);
        Ok(Box::new(KeyedHost { shards, handler }))
    }
}

impl<In: Message + Keyed, Out: Message, S: Clone + Send + 'static> RingHost<In, Out>
    for KeyedHost<In, Out, S>
{
    fn run(self: Box<Self>, io: &Arc<KernelIo<In, Out>>, mut out: Publisher<In, Out>) {
        let w = self.shards.workers();
        let shards = &*self.shards;
        let handler = &self.handler;
        std::thread::scope(|scope| {
            let (done_tx, done_rx) = mpsc::channel::<Work<In, Out>>();
            // `helpers[s]` feeds worker `s` (shard 0 is the kernel's thread's own). A worker
            // that cannot be started leaves `None`: its shard runs on the kernel's thread.
            let mut helpers: Vec<Option<mpsc::Sender<Work<In, Out>>>> = vec![None];
            for s in 1..w {
                let (tx, rx) = mpsc::channel::<Work<In, Out>>();
                let done = done_tx.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("resident:{}#{s}", io.id))
                    .spawn_scoped(scope, move || {
                        while let Ok(mut work) = rx.recv() {
                            // SAFETY: the kernel's thread handed shard `work.shard` to this
                            // worker alone for this batch (see `Shards`).
                            unsafe { shards.run(&mut work, handler) };
                            if done.send(work).is_err() {
                                return;
                            }
                        }
                    });
                helpers.push(spawned.ok().map(|_| tx));
            }
            drop(done_tx);
            run_batches(io, &mut out, shards, handler, &helpers, &done_rx);
            // Dropping the senders ends the workers; the scope joins them.
            drop(helpers);
        });
    }
}

fn run_batches<In: Message + Keyed, Out: Message, S: Send>(
    io: &Arc<KernelIo<In, Out>>,
    out: &mut Publisher<In, Out>,
    shards: &Shards<S>,
    handler: &KeyFn<In, Out, S>,
    helpers: &[Option<mpsc::Sender<Work<In, Out>>>],
    done: &mpsc::Receiver<Work<In, Out>>,
) {
    let w = shards.workers();
    let mut batch: Vec<Slot<In>> = Vec::with_capacity(io.batch_size);
    let mut works: Vec<Option<Work<In, Out>>> = (0..w).map(|s| Some(Work::new(s))).collect();
    let prof = io.profile.get();
    // The batch's clock reading, if the deadline check made one (`KernelIo::take_inputs`).
    let mut taken_at: Option<u64> = None;
    loop {
        let Some((n, gate)) = io.take_host_batch(&mut batch, &mut taken_at) else {
            return;
        };
        let scope = crate::profile::batch_start(prof, &io.id, n);
        let batch_now = taken_at.unwrap_or_else(|| io.ids.now_ns());
        // Split by shard, keeping the batch's order within each shard (so within each key).
        for wk in works.iter_mut().flatten() {
            wk.items.clear();
            wk.outs.clear();
            wk.panic = None;
        }
        for slot in &batch[..n] {
            let s = (slot.payload.key() % w as u32) as usize;
            if let Some(wk) = works[s].as_mut() {
                wk.items.push(*slot);
            }
        }
        // Hand the other shards out, run the rest here, take them back.
        let mut away = 0;
        for (s, helper) in helpers.iter().enumerate().skip(1) {
            let (Some(tx), Some(wk)) = (helper, works[s].as_ref()) else {
                continue;
            };
            if wk.items.is_empty() {
                continue;
            }
            let wk = works[s].take().expect("checked above");
            match tx.send(wk) {
                Ok(()) => away += 1,
                Err(mpsc::SendError(wk)) => works[s] = Some(wk),
            }
        }
        for wk in works.iter_mut().flatten() {
            if !wk.items.is_empty() {
                // SAFETY: this shard was not handed out for this batch: it is this thread's.
                unsafe { shards.run(wk, handler) };
            }
        }
        for _ in 0..away {
            // A worker always gives its shard back (handler panics are caught); the wait is
            // as long as the handlers run, like a normal kernel waiting on its handler.
            match done.recv() {
                Ok(wk) => {
                    let s = wk.shard;
                    works[s] = Some(wk);
                }
                // Every worker is gone: cannot happen while `helpers` holds their senders.
                Err(_) => return,
            }
        }
        // Claim the whole batch at once; a terminate that abandoned us meanwhile took it all
        // into its report, and nothing of it is published.
        if io.in_hand.finish(0).is_err() {
            return;
        }
        let handled: usize = works.iter().flatten().map(|wk| wk.outs.len()).sum();
        io.metrics.messages_done(handled as u64);
        for wk in works.iter_mut().flatten() {
            for (env, result) in wk.outs.drain(..) {
                out.publish_one(env, result, batch_now);
            }
        }
        out.flush_wakeups();
        let mut failed: Option<(Slot<In>, String)> = None;
        let mut stranded = Vec::new();
        for wk in works.iter().flatten() {
            if let Some((i, text)) = &wk.panic {
                if failed.is_none() {
                    failed = Some((wk.items[*i], text.clone()));
                } else {
                    stranded.push(wk.items[*i]);
                }
                stranded.extend_from_slice(&wk.items[i + 1..]);
            }
        }
        io.metrics.batch_done(Instant::now());
        if let Some((slot, panic)) = failed {
            io.fail(
                Failure::HandlerPanicked {
                    message_id: slot.env.message_id,
                    panic,
                },
                Some(slot),
                stranded,
            );
            return;
        }
        crate::profile::batch_end(prof, scope, &batch[..n]);
        drop(gate);
    }
}
