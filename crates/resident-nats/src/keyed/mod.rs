//! Keyed kernels over JetStream whose per-key state survives its worker.
//!
//! The input stream is the log; a keyed kernel's key states are a fold over it. Keys are split
//! into `partitions` (key `k` is in partition `k % partitions`, published on
//! `<subject>.p.<partition>`). A worker serves a partition while it holds the partition's
//! *lease* (a key in a JetStream KV bucket, renewed by compare-and-set), and:
//!
//! 1. restores the partition's latest *checkpoint* from the same bucket: the states of the
//!    partition's keys together with the stream sequence of the last input they include
//!    (one KV value, so the two never disagree), or the initial states and sequence 0;
//! 2. launches the keyed kernel with those states and reads the partition's inputs in stream
//!    order from the sequence after the checkpoint (an ephemeral consumer with no acks; a gap in
//!    its delivery sequence, a server restart or any error recreates it from the last input
//!    applied, and an input at or below that sequence is skipped);
//! 3. per group of inputs: calls the kernel, publishes every output with the input's id as
//!    `Nats-Msg-Id` (the input's own `Nats-Msg-Id`, else `<stream>:<sequence>`) and waits until
//!    the output stream has stored each one (retrying while the server is away, never applying
//!    the inputs again); only then does the group count as applied;
//! 4. every `checkpoint_every` inputs or `checkpoint_interval` (and on shutdown) writes a new
//!    checkpoint, by compare-and-set and only over an older one.
//!
//! A new owner (the worker died, was paused past its lease, lost the server) restores the
//! checkpoint and replays the inputs after it; their outputs carry the same ids, so the output
//! stream's duplicate window drops the second copies, and a reader de-duplicates by id past it.
//!
//! # What is guaranteed
//!
//! * **Exactly-once state effect**: a checkpoint's states are the fold of exactly the
//!   partition's inputs up to its sequence, in stream order, each once. The handler must be
//!   deterministic (its output and the new state a function of the key's state and the input).
//! * **At-least-once outputs, de-duplicated by id**: every input applied has its output stored
//!   (a checkpoint is written only after the outputs of every input it includes are stored);
//!   a replayed input's output has the same id and the same value.
//! * The lease only avoids wasted work; correctness does not rest on it: two workers that both
//!   believe they own a partition (clock skew, a paused worker waking up) compute the same
//!   outputs under the same ids and write only consistent checkpoints.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy};
use async_nats::jetstream::kv::{self, Store};
use async_nats::jetstream::message::Message as JsMessage;
use async_nats::jetstream::stream::{Config as StreamConfig, StorageType};
use async_nats::jetstream::Context;
use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use resident::prelude::{KernelHandle, Keyed, Message};
use serde::{Deserialize, Serialize};

use crate::codec::Codec;
use crate::error::{ErrorKind, ErrorReply, ServeError, ERROR_HEADER};
use crate::jetstream::INPUT_SEQ_HEADER;
use crate::service::call_batch_off_executor;

mod store;

pub use store::{ensure_keyed, read_checkpoint, Checkpoint};
use store::{now_ms, Lease, LeaseValue};

/// Options of [`serve_keyed_jetstream`].
#[derive(Clone, Debug)]
pub struct KeyedOptions {
    /// Input stream (created with the subjects `<subject>.p.*` if missing, file storage).
    pub stream: String,
    /// Subject prefix: partition `p`'s inputs are published on `<subject>.p.<p>`.
    pub subject: String,
    /// Outputs go here (default `<subject>.out`).
    pub output_subject: String,
    /// Undecodable or misrouted inputs go here with `Resident-Error` (default `<subject>.dead`).
    pub dead_letter_subject: String,
    /// Stream created for the output and dead-letter subjects (default `<stream>_OUT`).
    pub output_stream: String,
    /// KV bucket of checkpoints and leases (default `<stream>_STATE`, file storage).
    pub bucket: String,
    /// Name of this service (KV keys `<name>.checkpoint.<p>`, `<name>.lease.<p>`; kernel ids).
    pub name: String,
    /// Keys of the kernel (`0..keys`).
    pub keys: u32,
    /// Partitions (at least 1); key `k` is in partition `k % partitions`.
    pub partitions: u32,
    /// Partitions this worker takes as soon as they are free; `None`: all of them. Others it
    /// takes only once their lease has been expired for `standby_delay` (a standby).
    pub preferred: Option<Vec<u32>>,
    /// Most partitions this worker serves at once.
    pub max_partitions: usize,
    /// How long a lease lasts unless renewed (renewed every third of it).
    pub lease: Duration,
    /// See `preferred`.
    pub standby_delay: Duration,
    /// Checkpoint after this many inputs applied ...
    pub checkpoint_every: u64,
    /// ... or this long after the last checkpoint, whichever comes first.
    pub checkpoint_interval: Duration,
    /// Most inputs called as one batch.
    pub max_batch: usize,
    /// How long one batch of calls may take (a failure restores the last checkpoint).
    pub call_timeout: Duration,
    /// Duplicate window of the streams created here.
    pub duplicate_window: Duration,
    /// This worker's name in leases (default `<host pid>-<time>`).
    pub owner: String,
}

impl KeyedOptions {
    /// Options with the defaults above: every partition preferred, no limit on partitions,
    /// lease 5 s, standby delay 5 s, checkpoints every 1000 inputs or 1 s, batches of 256,
    /// call timeout 5 s, duplicate window 2 min.
    pub fn new(
        stream: impl Into<String>,
        subject: impl Into<String>,
        name: impl Into<String>,
        keys: u32,
        partitions: u32,
    ) -> Self {
        let (stream, subject) = (stream.into(), subject.into());
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        KeyedOptions {
            output_subject: format!("{subject}.out"),
            dead_letter_subject: format!("{subject}.dead"),
            output_stream: format!("{stream}_OUT"),
            bucket: format!("{stream}_STATE"),
            stream,
            subject,
            name: name.into(),
            keys,
            partitions,
            preferred: None,
            max_partitions: usize::MAX,
            lease: Duration::from_secs(5),
            standby_delay: Duration::from_secs(5),
            checkpoint_every: 1000,
            checkpoint_interval: Duration::from_secs(1),
            max_batch: 256,
            call_timeout: Duration::from_secs(5),
            duplicate_window: Duration::from_secs(120),
            owner: format!("{}-{nanos}", std::process::id()),
        }
    }

    /// The partition of `key`.
    pub fn partition_of(&self, key: u32) -> u32 {
        key % self.partitions.max(1)
    }

    /// The subject a producer publishes an input for `key` on.
    pub fn subject_for_key(&self, key: u32) -> String {
        self.partition_subject(self.partition_of(key))
    }

    /// Partition `p`'s input subject, `<subject>.p.<p>`.
    pub fn partition_subject(&self, p: u32) -> String {
        format!("{}.p.{p}", self.subject)
    }

    /// The KV key of partition `p`'s checkpoint.
    pub fn checkpoint_key(&self, p: u32) -> String {
        format!("{}.checkpoint.{p}", self.name)
    }

    /// The KV key of partition `p`'s lease.
    pub fn lease_key(&self, p: u32) -> String {
        format!("{}.lease.{p}", self.name)
    }

    /// The keys of partition `p`, in the order a checkpoint stores their states.
    pub fn partition_keys(&self, p: u32) -> impl Iterator<Item = u32> {
        let step = self.partitions.max(1) as usize;
        (p..self.keys).step_by(step)
    }
}

/// Counters of a keyed worker (all partitions it served).
#[derive(Debug, Default, Serialize)]
pub struct KeyedStats {
    /// Set once the streams and the bucket exist.
    pub ready: AtomicBool,
    /// Partitions served now.
    pub partitions: AtomicUsize,
    /// Leases taken.
    pub acquired: AtomicU64,
    /// Leases lost (not renewed in time, or taken by another worker).
    pub lost: AtomicU64,
    /// Checkpoints restored (one per lease taken, and one per reset).
    pub restores: AtomicU64,
    /// Inputs received from the stream (including ones skipped).
    pub received: AtomicU64,
    /// Inputs applied to state (a replay after a restore counts again).
    pub applied: AtomicU64,
    /// Inputs skipped because the state already included them.
    pub skipped: AtomicU64,
    /// Outputs stored.
    pub outputs: AtomicU64,
    /// Of those, ones the output stream reported as duplicates (a replayed input's output).
    pub duplicates: AtomicU64,
    /// Inputs dead-lettered (undecodable, key out of range or in another partition).
    pub dead_letters: AtomicU64,
    /// Checkpoints written.
    pub checkpoints: AtomicU64,
    /// Kernel failures that restored the last checkpoint.
    pub resets: AtomicU64,
    /// Failed reads, publishes, lease or checkpoint writes (retried).
    pub errors: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub use crate::error::CheckpointError;

const MAGIC: &[u8; 4] = b"RKC1";
/// A partition that received nothing this long reads again from a fresh consumer.
const IDLE_REREAD: Duration = Duration::from_secs(3);
/// How long the stream's acknowledgements of a group's outputs are awaited before the ones
/// missing are published again (same ids: a second copy is dropped as a duplicate).
const ACK_WAIT: Duration = Duration::from_secs(2);
/// Bound on a JetStream API call (consumer, checkpoint, lease).
const API_WAIT: Duration = Duration::from_secs(2);
const HEADER: usize = 4 + 8 + 4 + 4;

/// Launches the keyed kernel of one partition: given the kernel id and the states of every
/// key (`0..keys`; keys of other partitions hold the initial state and get no input), returns
/// the active kernel.
pub trait KeyedLaunch<In: Message, Out: Message, S>: Send + Sync + 'static {
    /// Launches and activates the kernel.
    fn launch(&self, id: &str, states: Vec<S>) -> resident::Result<KernelHandle<In, Out>>;
}

impl<In: Message, Out: Message, S, F> KeyedLaunch<In, Out, S> for F
where
    F: Fn(&str, Vec<S>) -> resident::Result<KernelHandle<In, Out>> + Send + Sync + 'static,
{
    fn launch(&self, id: &str, states: Vec<S>) -> resident::Result<KernelHandle<In, Out>> {
        self(id, states)
    }
}

struct Shared<In, Out, S, L, C> {
    js: Context,
    store: Store,
    launch: Arc<L>,
    codec: Arc<C>,
    opts: KeyedOptions,
    init: S,
    stats: Arc<KeyedStats>,
    held: AtomicUsize,
    stop: tokio::sync::watch::Receiver<bool>,
    _types: std::marker::PhantomData<fn(In) -> Out>,
}

/// Serves a keyed kernel from the partitions of `opts` (see the [module docs](self)) until
/// `shutdown` completes; then every partition served writes a final checkpoint, releases its
/// lease and terminates its kernel (bounded: at most `call_timeout` plus a few seconds).
///
/// `init` is every key's state before any input. `launch` makes a partition's kernel from the
/// states of a checkpoint. Errors are only set-up errors (streams, bucket, options); everything
/// after is retried until `shutdown`.
pub async fn serve_keyed_jetstream<In, Out, S, L, C, F>(
    client: async_nats::Client,
    launch: Arc<L>,
    codec: Arc<C>,
    init: S,
    opts: KeyedOptions,
    stats: Arc<KeyedStats>,
    shutdown: F,
) -> Result<(), ServeError>
where
    In: Message + Keyed,
    Out: Message,
    S: bytemuck::Pod + Send + Sync,
    L: KeyedLaunch<In, Out, S>,
    C: Codec<In, Out>,
    F: std::future::Future<Output = ()>,
{
    if opts.partitions == 0 || opts.keys == 0 {
        return Err(ServeError::Options(
            "keys and partitions must be at least 1",
        ));
    }
    if opts.max_batch == 0 || opts.max_partitions == 0 {
        return Err(ServeError::Options(
            "max_batch and max_partitions must be at least 1",
        ));
    }
    if opts.lease < Duration::from_millis(300) {
        return Err(ServeError::Options("the lease must be at least 300 ms"));
    }
    let biggest = opts.keys.div_ceil(opts.partitions) as usize;
    // (0 while the first connect is still under way: not known yet.)
    let max_payload = client.server_info().max_payload;
    if max_payload > 0 && HEADER + biggest * std::mem::size_of::<S>() > max_payload {
        return Err(ServeError::Options(
            "a partition's checkpoint would exceed the server's max_payload: use more partitions",
        ));
    }
    let js = async_nats::jetstream::new(client.clone());
    let store = ensure_keyed(&js, &opts).await?;
    stats.ready.store(true, Ordering::Release);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shared = Arc::new(Shared {
        js,
        store,
        launch,
        codec,
        opts,
        init,
        stats,
        held: AtomicUsize::new(0),
        stop: stop_rx,
        _types: std::marker::PhantomData,
    });
    let tasks: Vec<_> = (0..shared.opts.partitions)
        .map(|p| {
            let s = shared.clone();
            tokio::spawn(async move { s.partition_loop(p).await })
        })
        .collect();
    shutdown.await;
    let _ = stop_tx.send(true);
    let bound = shared.opts.call_timeout + Duration::from_secs(10);
    let _ = tokio::time::timeout(bound, futures_util::future::join_all(tasks)).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), client.flush()).await;
    Ok(())
}

/// One input of a group, after decoding.
enum Item<In> {
    Call(In),
    /// Dead-lettered (it has no state effect).
    Dead(ErrorKind, String),
}

/// Why serving a partition stopped.
enum Stop {
    Shutdown,
    LeaseLost,
    /// Restore the checkpoint and go on (kernel failure).
    Reset,
}

impl<In, Out, S, L, C> Shared<In, Out, S, L, C>
where
    In: Message + Keyed,
    Out: Message,
    S: bytemuck::Pod + Send + Sync,
    L: KeyedLaunch<In, Out, S>,
    C: Codec<In, Out>,
{
    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Sleeps `d` or until shutdown; false on shutdown.
    async fn nap(&self, d: Duration) -> bool {
        let mut stop = self.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(d) => !self.stopping(),
            _ = stop.wait_for(|s| *s).map(|_| ()) => false,
        }
    }

    async fn partition_loop(self: Arc<Self>, p: u32) {
        let preferred = self.opts.preferred.as_ref().is_none_or(|v| v.contains(&p));
        let poll = (self.opts.lease / 5).max(Duration::from_millis(50));
        loop {
            if self.stopping() {
                return;
            }
            let Some(lease) = self.acquire(p, preferred).await else {
                if !self.nap(poll).await {
                    return;
                }
                continue;
            };
            self.stats.partitions.fetch_add(1, Ordering::Relaxed);
            let why = loop {
                match self.serve_partition(p, &lease).await {
                    Stop::Reset => {
                        bump(&self.stats.resets);
                        if !self.nap(Duration::from_millis(100)).await {
                            break Stop::Shutdown;
                        }
                    }
                    other => break other,
                }
            };
            let still_ours = lease.valid();
            lease.renewer.abort();
            let _ = lease.renewer.await;
            let rev = Some(lease.rev.load(Ordering::Acquire));
            self.stats.partitions.fetch_sub(1, Ordering::Relaxed);
            self.held.fetch_sub(1, Ordering::AcqRel);
            match why {
                Stop::Shutdown => {
                    // Release: the next owner need not wait for the lease to run out.
                    if let Some(rev) = rev.filter(|_| still_ours) {
                        let v = serde_json::to_vec(&LeaseValue {
                            owner: self.opts.owner.clone(),
                            until_ms: 0,
                        })
                        .unwrap_or_default();
                        let _ = tokio::time::timeout(
                            Duration::from_secs(2),
                            self.store.update(self.opts.lease_key(p), v.into(), rev),
                        )
                        .await;
                    }
                    return;
                }
                _ => {
                    bump(&self.stats.lost);
                    if !self.nap(poll).await {
                        return;
                    }
                }
            }
        }
    }

    /// Takes partition `p`'s lease if it is free (or ours, or expired), and starts renewing it.
    async fn acquire(&self, p: u32, preferred: bool) -> Option<Lease> {
        if self.held.fetch_add(1, Ordering::AcqRel) >= self.opts.max_partitions {
            self.held.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let taken = self.try_take(p, preferred).await;
        let Some(rev) = taken else {
            self.held.fetch_sub(1, Ordering::AcqRel);
            return None;
        };
        bump(&self.stats.acquired);
        let epoch = Instant::now();
        let lease_ms = self.opts.lease.as_millis() as u64;
        let valid_until = Arc::new(AtomicU64::new(lease_ms.saturating_sub(lease_ms / 10)));
        let lost = Arc::new(AtomicBool::new(false));
        let rev = Arc::new(AtomicU64::new(rev));
        let renewer = {
            let (store, key, owner) = (
                self.store.clone(),
                self.opts.lease_key(p),
                self.opts.owner.clone(),
            );
            let (valid_until, lost, stats, rev) = (
                valid_until.clone(),
                lost.clone(),
                self.stats.clone(),
                rev.clone(),
            );
            let every = self.opts.lease / 3;
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let sent = epoch.elapsed().as_millis() as u64;
                    let v = serde_json::to_vec(&LeaseValue {
                        owner: owner.clone(),
                        until_ms: now_ms() + lease_ms,
                    })
                    .unwrap_or_default();
                    let last = rev.load(Ordering::Acquire);
                    match tokio::time::timeout(every, store.update(&key, v.into(), last)).await {
                        Ok(Ok(r)) => {
                            rev.store(r, Ordering::Release);
                            // Counted from when the renewal was sent, less a tenth for skew.
                            valid_until.store(
                                sent + lease_ms.saturating_sub(lease_ms / 10),
                                Ordering::Release,
                            );
                        }
                        Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                            lost.store(true, Ordering::Release);
                            return;
                        }
                        _ => bump(&stats.errors),
                    }
                }
            })
        };
        Some(Lease {
            valid_until,
            lost,
            rev,
            epoch,
            renewer,
        })
    }

    /// One attempt at taking the lease: its new revision, or `None`.
    async fn try_take(&self, p: u32, preferred: bool) -> Option<u64> {
        let key = self.opts.lease_key(p);
        let t = Duration::from_secs(2);
        let entry = match tokio::time::timeout(t, self.store.entry(key.clone())).await {
            Ok(Ok(e)) => e,
            _ => {
                bump(&self.stats.errors);
                return None;
            }
        };
        let now = now_ms();
        let grace = if preferred {
            0
        } else {
            self.opts.standby_delay.as_millis() as u64
        };
        let value = serde_json::to_vec(&LeaseValue {
            owner: self.opts.owner.clone(),
            until_ms: now + self.opts.lease.as_millis() as u64,
        })
        .unwrap_or_default();
        let put = match entry {
            None => {
                if !preferred && !self.nap(self.opts.standby_delay).await {
                    return None;
                }
                tokio::time::timeout(t, self.store.create(&key, value.into()))
                    .await
                    .ok()?
                    .ok()
            }
            Some(e) => {
                let old: Option<LeaseValue> = serde_json::from_slice(&e.value).ok();
                let free = match &old {
                    None => true,
                    Some(l) if l.owner == self.opts.owner => true,
                    // Released (until 0) or expired for longer than the grace.
                    Some(l) => l.until_ms == 0 && preferred || l.until_ms + grace < now,
                };
                if !free {
                    return None;
                }
                tokio::time::timeout(t, self.store.update(&key, value.into(), e.revision))
                    .await
                    .ok()?
                    .ok()
            }
        };
        put
    }

    /// Restores partition `p`'s checkpoint, launches its kernel and serves it while the lease
    /// holds.
    async fn serve_partition(&self, p: u32, lease: &Lease) -> Stop {
        let opts = &self.opts;
        bump(&self.stats.restores);
        let restored = match tokio::time::timeout(
            Duration::from_secs(5),
            read_checkpoint::<S>(&self.store, opts, p),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::warn!(partition = p, error = %e, "checkpoint unreadable; retrying");
                bump(&self.stats.errors);
                return self.wait_reset(lease).await;
            }
            Err(_) => {
                bump(&self.stats.errors);
                return self.wait_reset(lease).await;
            }
        };
        let (mut cp, mut cp_rev) = match restored {
            Some((cp, rev)) => (cp, Some(rev)),
            None => (
                Checkpoint {
                    seq: 0,
                    states: vec![self.init; opts.partition_keys(p).count()],
                },
                None,
            ),
        };
        let mut all = vec![self.init; opts.keys as usize];
        for (k, s) in opts.partition_keys(p).zip(&cp.states) {
            all[k as usize] = *s;
        }
        static GENERATION: AtomicU64 = AtomicU64::new(0);
        let id = format!(
            "{}-p{p}-{}",
            opts.name,
            GENERATION.fetch_add(1, Ordering::Relaxed)
        );
        let launch = self.launch.clone();
        let kernel = match tokio::task::spawn_blocking(move || launch.launch(&id, all)).await {
            Ok(Ok(k)) => Arc::new(k),
            Ok(Err(e)) => {
                tracing::warn!(partition = p, error = %e, "kernel launch failed; retrying");
                bump(&self.stats.errors);
                return self.wait_reset(lease).await;
            }
            Err(_) => return self.wait_reset(lease).await,
        };
        let why = self
            .serve_kernel(p, lease, &kernel, &mut cp, &mut cp_rev)
            .await;
        let k = kernel.clone();
        let _ =
            tokio::task::spawn_blocking(move || k.terminate_within(Duration::from_secs(2))).await;
        why
    }

    async fn wait_reset(&self, lease: &Lease) -> Stop {
        if !self.nap(Duration::from_millis(500)).await {
            return Stop::Shutdown;
        }
        if lease.valid() {
            Stop::Reset
        } else {
            Stop::LeaseLost
        }
    }

    /// A consumer reading partition `p` in order from `start`.
    async fn consumer(
        &self,
        p: u32,
        start: u64,
    ) -> Result<async_nats::jetstream::consumer::pull::Stream, async_nats::Error> {
        let stream = self.js.get_stream(self.opts.stream.clone()).await?;
        let consumer = stream
            .create_consumer(PullConfig {
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: start.max(1),
                },
                ack_policy: AckPolicy::None,
                filter_subject: self.opts.partition_subject(p),
                inactive_threshold: Duration::from_secs(30),
                ..Default::default()
            })
            .await?;
        Ok(consumer
            .stream()
            .max_messages_per_batch(self.opts.max_batch)
            .heartbeat(Duration::from_secs(1))
            .expires(Duration::from_secs(5))
            .messages()
            .await?)
    }

    async fn serve_kernel(
        &self,
        p: u32,
        lease: &Lease,
        kernel: &Arc<KernelHandle<In, Out>>,
        cp: &mut Checkpoint<S>,
        cp_rev: &mut Option<u64>,
    ) -> Stop {
        let opts = &self.opts;
        let mut applied = cp.seq;
        let mut last_cp = Instant::now();
        let mut stop = self.stop.clone();
        'consumer: loop {
            if !lease.valid() {
                return Stop::LeaseLost;
            }
            let made = tokio::time::timeout(API_WAIT, self.consumer(p, applied + 1));
            let mut messages = match made.await {
                Ok(Ok(m)) => m,
                _ => {
                    bump(&self.stats.errors);
                    if !self.nap(Duration::from_millis(250)).await {
                        return self.finish(p, kernel, applied, cp, cp_rev).await;
                    }
                    continue 'consumer;
                }
            };
            let mut delivered: Option<u64> = None;
            let mut last_input = Instant::now();
            loop {
                // Take one input (or time out to check the lease and checkpoint), then every
                // input already here.
                let first = tokio::select! {
                    _ = stop.wait_for(|s| *s).map(|_| ()) => {
                        return self.finish(p, kernel, applied, cp, cp_rev).await;
                    }
                    n = tokio::time::timeout(Duration::from_millis(200), messages.next()) => n,
                };
                let mut group: Vec<JsMessage> = Vec::new();
                let mut broken = false;
                match first {
                    // Nothing for a while: read again from a fresh consumer. A consumer the
                    // server lost (a restart just after it was made) need not fail the client's
                    // reads; this bounds how long such a partition can stall.
                    Err(_) if last_input.elapsed() >= IDLE_REREAD => {
                        last_input = Instant::now();
                        continue 'consumer;
                    }
                    Err(_) => {}
                    Ok(None) => broken = true,
                    Ok(Some(Err(e))) => {
                        tracing::debug!(partition = p, error = %e, "read failed; reading again");
                        broken = true;
                    }
                    Ok(Some(Ok(m))) => {
                        last_input = Instant::now();
                        group.push(m);
                        while group.len() < opts.max_batch {
                            match messages.next().now_or_never() {
                                Some(Some(Ok(m))) => group.push(m),
                                Some(_) => {
                                    broken = true;
                                    break;
                                }
                                None => break,
                            }
                        }
                    }
                }
                // Order: the delivery sequence must have no gap; else read again from
                // the last input applied.
                let mut take = Vec::with_capacity(group.len());
                for m in group {
                    let Ok(info) = m.info() else {
                        broken = true;
                        break;
                    };
                    let (cseq, sseq) = (info.consumer_sequence, info.stream_sequence);
                    if delivered.is_some_and(|d| cseq != d + 1) {
                        broken = true;
                        break;
                    }
                    delivered = Some(cseq);
                    bump(&self.stats.received);
                    if sseq <= applied || take.last().is_some_and(|(s, _)| sseq <= *s) {
                        bump(&self.stats.skipped);
                        continue;
                    }
                    take.push((sseq, m));
                }
                if !take.is_empty() {
                    if !lease.valid() {
                        return Stop::LeaseLost;
                    }
                    match self.apply(p, lease, kernel, take).await {
                        Ok(last) => applied = last,
                        Err(stop) => return stop,
                    }
                }
                let due = applied > cp.seq
                    && (applied - cp.seq >= opts.checkpoint_every
                        || last_cp.elapsed() >= opts.checkpoint_interval);
                if due && lease.valid() && self.checkpoint(p, kernel, applied, cp, cp_rev).await {
                    last_cp = Instant::now();
                }
                if !lease.valid() {
                    return Stop::LeaseLost;
                }
                if broken {
                    bump(&self.stats.errors);
                    if !self.nap(Duration::from_millis(100)).await {
                        return self.finish(p, kernel, applied, cp, cp_rev).await;
                    }
                    continue 'consumer;
                }
            }
        }
    }

    /// Calls the kernel on a group and stores its outputs; the stream sequence of the last
    /// input applied.
    async fn apply(
        &self,
        p: u32,
        lease: &Lease,
        kernel: &Arc<KernelHandle<In, Out>>,
        take: Vec<(u64, JsMessage)>,
    ) -> Result<u64, Stop> {
        let opts = &self.opts;
        let last = take.last().map(|(s, _)| *s).unwrap_or(0);
        let items: Vec<Item<In>> = take
            .iter()
            .map(|(_, m)| match self.codec.decode(&m.payload) {
                Err(e) => Item::Dead(ErrorKind::BadInput, e.to_string()),
                Ok(i) => {
                    let k = i.key();
                    if k >= opts.keys || opts.partition_of(k) != p {
                        Item::Dead(
                            ErrorKind::BadInput,
                            format!("key {k} is not in partition {p} of {} keys", opts.keys),
                        )
                    } else {
                        Item::Call(i)
                    }
                }
            })
            .collect();
        let calls: Vec<In> = items
            .iter()
            .filter_map(|it| match it {
                Item::Call(i) => Some(*i),
                Item::Dead(..) => None,
            })
            .collect();
        let mut outs = call_batch_off_executor(kernel, calls, opts.call_timeout, &opts.name)
            .await
            .into_iter();
        // One output (or none) per input, in order; any failure but "no output" resets.
        let mut publish: Vec<(String, HeaderMap, Vec<u8>)> = Vec::with_capacity(take.len());
        for ((seq, m), item) in take.iter().zip(items) {
            let id = self.input_id(m, *seq);
            let mut headers = HeaderMap::new();
            headers.insert(INPUT_SEQ_HEADER, seq.to_string().as_str());
            let (kind, message) = match item {
                Item::Dead(kind, message) => (kind, message),
                Item::Call(_) => match outs.next() {
                    Some(Ok(out)) => match self.codec.encode(&out) {
                        Ok(bytes) => {
                            headers.insert("Nats-Msg-Id", id.as_str());
                            publish.push((opts.output_subject.clone(), headers, bytes));
                            continue;
                        }
                        Err(e) => (ErrorKind::Internal, e.to_string()),
                    },
                    Some(Err(resident::Error::NoReply { .. })) => continue,
                    Some(Err(e)) => {
                        tracing::warn!(partition = p, error = %e, "kernel call failed; restoring the checkpoint");
                        return Err(Stop::Reset);
                    }
                    None => return Err(Stop::Reset),
                },
            };
            headers.insert("Nats-Msg-Id", format!("dead:{id}").as_str());
            headers.insert(ERROR_HEADER, kind.as_str());
            let reason = serde_json::to_string(&ErrorReply {
                error: kind,
                message,
            })
            .unwrap_or_default();
            headers.insert(
                "Resident-Error-Message",
                reason.replace(['\r', '\n'], " ").as_str(),
            );
            publish.push((
                opts.dead_letter_subject.clone(),
                headers,
                m.payload.to_vec(),
            ));
        }
        self.bump_applied(take.len());
        // Store every output; retry what failed until stored (never apply again).
        let mut pending = publish;
        let mut wait = Duration::from_millis(100);
        while !pending.is_empty() {
            if !lease.valid() {
                return Err(Stop::LeaseLost);
            }
            // Sent in order, then every acknowledgement awaited together under one deadline
            // (not one timeout after another: a server restart loses a whole group's acks).
            let deadline = tokio::time::Instant::now() + ACK_WAIT;
            let mut acks = Vec::with_capacity(pending.len());
            for (subject, headers, payload) in &pending {
                let sent = tokio::time::timeout_at(
                    deadline,
                    self.js.publish_with_headers(
                        subject.clone(),
                        headers.clone(),
                        payload.clone().into(),
                    ),
                )
                .await;
                acks.push(async move {
                    match sent {
                        Ok(Ok(f)) => match tokio::time::timeout_at(deadline, f).await {
                            Ok(Ok(a)) => Some(a.duplicate),
                            _ => None,
                        },
                        _ => None,
                    }
                });
            }
            let acks = futures_util::future::join_all(acks).await;
            let mut left = Vec::new();
            for (item, stored) in pending.into_iter().zip(acks) {
                match stored {
                    Some(dup) => {
                        if item.0 == opts.dead_letter_subject {
                            bump(&self.stats.dead_letters);
                        } else {
                            bump(&self.stats.outputs);
                            if dup {
                                bump(&self.stats.duplicates);
                            }
                        }
                    }
                    None => left.push(item),
                }
            }
            pending = left;
            if !pending.is_empty() {
                bump(&self.stats.errors);
                if !self.nap(wait).await {
                    // Outputs not stored: this group must not be in a checkpoint.
                    return Err(Stop::Shutdown);
                }
                wait = (wait * 2).min(Duration::from_secs(1));
            }
        }
        Ok(last)
    }

    fn bump_applied(&self, n: usize) {
        self.stats.applied.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn input_id(&self, msg: &JsMessage, seq: u64) -> String {
        msg.headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.as_str().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("{}:{seq}", self.opts.stream))
    }

    /// Writes a checkpoint of the states including `applied`, over an older one only. True
    /// when written (or one at least as new is there).
    async fn checkpoint(
        &self,
        p: u32,
        kernel: &Arc<KernelHandle<In, Out>>,
        applied: u64,
        cp: &mut Checkpoint<S>,
        cp_rev: &mut Option<u64>,
    ) -> bool {
        let opts = &self.opts;
        // No call is in flight: the states include exactly the inputs up to `applied`.
        let all = match kernel.snapshot_keys::<S>(0..opts.keys) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "snapshot failed");
                bump(&self.stats.errors);
                return false;
            }
        };
        let next = Checkpoint {
            seq: applied,
            states: opts.partition_keys(p).map(|k| all[k as usize]).collect(),
        };
        let bytes: Bytes = next.encode().into();
        let key = opts.checkpoint_key(p);
        let t = API_WAIT;
        for _ in 0..3 {
            let put = match *cp_rev {
                None => tokio::time::timeout(t, self.store.create(&key, bytes.clone()))
                    .await
                    .map(|r| r.map_err(|e| e.to_string())),
                Some(rev) => tokio::time::timeout(t, self.store.update(&key, bytes.clone(), rev))
                    .await
                    .map(|r| r.map_err(|e| e.to_string())),
            };
            match put {
                Ok(Ok(rev)) => {
                    *cp_rev = Some(rev);
                    *cp = next;
                    bump(&self.stats.checkpoints);
                    return true;
                }
                Ok(Err(_)) => {
                    // Someone else wrote one: keep ours only if it is newer.
                    match tokio::time::timeout(t, read_checkpoint::<S>(&self.store, opts, p)).await
                    {
                        Ok(Ok(Some((theirs, rev)))) => {
                            if theirs.seq >= applied {
                                return true;
                            }
                            *cp_rev = Some(rev);
                        }
                        Ok(Ok(None)) => *cp_rev = None,
                        _ => {
                            bump(&self.stats.errors);
                            return false;
                        }
                    }
                }
                Err(_) => {
                    bump(&self.stats.errors);
                    return false;
                }
            }
        }
        false
    }

    /// Shutdown: a last checkpoint (bounded), then stop.
    async fn finish(
        &self,
        p: u32,
        kernel: &Arc<KernelHandle<In, Out>>,
        applied: u64,
        cp: &mut Checkpoint<S>,
        cp_rev: &mut Option<u64>,
    ) -> Stop {
        if applied > cp.seq {
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                self.checkpoint(p, kernel, applied, cp, cp_rev),
            )
            .await;
        }
        Stop::Shutdown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_round_trip_and_bad_ones_are_typed_errors() {
        let cp = Checkpoint {
            seq: 77,
            states: vec![[1u64, 2], [3, 4], [5, 6]],
        };
        let bytes = cp.encode();
        assert_eq!(bytes.len(), HEADER + 3 * 16);
        assert_eq!(Checkpoint::<[u64; 2]>::decode(&bytes, 3).unwrap(), cp);
        // Unaligned input decodes the same.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        assert_eq!(
            Checkpoint::<[u64; 2]>::decode(&shifted[1..], 3).unwrap(),
            cp
        );
        assert!(matches!(
            Checkpoint::<[u64; 2]>::decode(b"nope", 3),
            Err(CheckpointError::Format)
        ));
        assert!(matches!(
            Checkpoint::<[u64; 2]>::decode(&bytes, 4),
            Err(CheckpointError::Shape { keys: 3, .. })
        ));
        assert!(matches!(
            Checkpoint::<u64>::decode(&bytes, 3),
            Err(CheckpointError::Shape { size: 16, .. })
        ));
        assert!(matches!(
            Checkpoint::<[u64; 2]>::decode(&bytes[..bytes.len() - 1], 3),
            Err(CheckpointError::Length { .. })
        ));
        // A header claiming a huge count is refused by shape before any allocation.
        let mut huge = bytes.clone();
        huge[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Checkpoint::<[u64; 2]>::decode(&huge, 3).is_err());
    }

    #[test]
    fn partitions_split_the_keys() {
        let o = KeyedOptions::new("S", "s", "n", 10, 4);
        assert_eq!(o.partition_keys(1).collect::<Vec<_>>(), [1, 5, 9]);
        assert_eq!(o.partition_keys(3).collect::<Vec<_>>(), [3, 7]);
        assert_eq!(o.subject_for_key(6), "s.p.2");
        let total: usize = (0..4).map(|p| o.partition_keys(p).count()).sum();
        assert_eq!(total, 10);
    }
}
