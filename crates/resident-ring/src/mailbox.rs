//! A bounded, multi-lane mailbox: the queue in front of every ring kernel and behind it.
//!
//! * **Priority lanes.** `lanes` SPSC rings (1 to 256). A message of priority `p` (0-255) goes
//!   to lane [`lane_of`]`(p, lanes) = p * lanes / 256`, so lanes split the priority range into
//!   equal bands, lane `lanes - 1` holding the highest priorities. With the default 4 lanes:
//!   0-63, 64-127, 128-191 (the default priority 128), 192-255. Receivers always drain the
//!   highest non-empty lane first; within a lane the order is FIFO. With 256 lanes every
//!   priority is its own lane (strict priority order, at 256 rings' memory).
//! * **Bound.** Each lane holds `capacity` messages (a power of two); a lane never grows.
//! * **MPSC front.** Many threads may send: each lane's producer half sits behind its own lock
//!   (uncontended it costs one atomic swap), so senders to different lanes never contend, and
//!   batches pay it once. Receivers share one lock over the consumer halves.
//! * **Or one [`Writer`].** [`Mailbox::with_writer`] hands the producer halves to a single,
//!   non-`Clone` [`Writer`] (a kernel's output side has exactly one writer, its host thread):
//!   a send then takes no lock, only a flag that `close` waits on (see [`Writer`]).
//! * **Backpressure** when a lane is full, per [`Backpressure`]; drops are counted.
//! * **Close.** After [`Mailbox::close`] sends fail with the message handed back; receivers
//!   still get what was queued, then [`RecvError::Closed`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::envelope::Slot;
use crate::spsc::{Consumer, Producer, Ring, RingError};
use crate::sync::Padded;
use crate::wait::{deadline_after, Signal, WaitStrategy};

/// What a send does when the message's lane is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backpressure {
    /// Wait up to this long for room, then fail with the message handed back.
    /// `Duration::MAX` waits forever.
    Block(Duration),
    /// Fail at once with the message handed back.
    Reject,
    /// Make room by discarding the oldest message of the lane (counted as dropped).
    DropOldest,
    /// Discard the new message (counted as dropped); the send itself reports success.
    DropNewest,
}

impl Default for Backpressure {
    /// Block for up to one second: no loss, and a stuck consumer shows up as an error.
    fn default() -> Self {
        Backpressure::Block(Duration::from_secs(1))
    }
}

/// Lane of priority `priority` among `lanes` lanes: `priority * lanes / 256`.
pub fn lane_of(priority: u8, lanes: usize) -> usize {
    (priority as usize * lanes) >> 8
}

/// Configuration of a mailbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MailboxConfig {
    /// Messages per lane; rounded up to a power of two.
    pub capacity: usize,
    /// Number of priority lanes, 1 to 256.
    pub lanes: usize,
    /// What a send does when a lane is full.
    pub backpressure: Backpressure,
    /// How blocked senders and receivers wait.
    pub wait: WaitStrategy,
}

impl Default for MailboxConfig {
    fn default() -> Self {
        MailboxConfig {
            capacity: 1024,
            lanes: 4,
            backpressure: Backpressure::default(),
            wait: WaitStrategy::default(),
        }
    }
}

/// Why a send did not enqueue the message; the message comes back inside.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError<T> {
    /// The lane was full and the policy is `Reject`.
    #[error("mailbox lane is full")]
    Full(T),
    /// The lane stayed full for the whole `Block` timeout.
    #[error("mailbox lane stayed full for the whole timeout")]
    Timeout(T),
    /// The mailbox is closed.
    #[error("mailbox is closed")]
    Closed(T),
}

impl<T> SendError<T> {
    /// The message that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            SendError::Full(t) | SendError::Timeout(t) | SendError::Closed(t) => t,
        }
    }
}

/// What a successful send did.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent<T> {
    /// The message is queued.
    Queued,
    /// The message is queued; the oldest message of its lane was dropped to make room.
    QueuedDroppedOldest(T),
    /// The lane was full and the policy dropped this message.
    DroppedNewest,
}

/// Why a receive returned nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// Nothing arrived before the timeout.
    #[error("nothing arrived before the timeout")]
    Timeout,
    /// The mailbox is closed and empty.
    #[error("mailbox is closed and empty")]
    Closed,
}

/// Errors building a mailbox.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MailboxError {
    /// `lanes` outside 1..=256.
    #[error("lanes must be 1 to 256, got {0}")]
    BadLanes(usize),
    /// Capacity 0 or too large.
    #[error("capacity must be 1 to 2^30 messages per lane, got {0}")]
    BadCapacity(usize),
    /// The ring could not be built.
    #[error(transparent)]
    Ring(#[from] RingError),
}

/// Counters of a mailbox, all monotonic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MailboxCounters {
    /// Messages enqueued (a `DropOldest` send counts; a `DropNewest` drop does not).
    pub accepted: u64,
    /// Messages discarded by `DropOldest` / `DropNewest`.
    pub dropped: u64,
    /// Messages handed to receivers.
    pub delivered: u64,
    /// Sends refused (full, timed out or closed); the message went back to the sender.
    pub refused: u64,
}

struct Shared<T> {
    /// The lanes' producer halves behind their locks; empty when a [`Writer`] owns them.
    producers: Box<[Mutex<Producer<Slot<T>>>]>,
    /// Whether a [`Writer`] owns the producer halves (then `producers` is empty).
    has_writer: bool,
    /// Held by the [`Writer`] across each push (never across a wait); `close` waits for it to
    /// be clear after setting `closed`. Alone on its line: only the writer writes it.
    writer_busy: Padded<AtomicBool>,
    /// The lanes' rings, for lock-free length checks by waiters.
    rings: Box<[Arc<Ring<Slot<T>>>]>,
    /// Taken by receivers on every pop: alone on its line, away from what senders read.
    consumers: Padded<Mutex<Vec<Consumer<Slot<T>>>>>,
    config: MailboxConfig,
    /// Notified after every enqueue and on close.
    not_empty: Signal,
    /// Notified after every dequeue and on close.
    not_full: Signal,
    closed: AtomicBool,
    /// Written by senders.
    /// Per lane, written only under that lane's producer lock (one writer at a time, so a
    /// plain load and store, no locked instruction), summed by `counters`.
    accepted: Box<[Padded<AtomicU64>]>,
    dropped: AtomicU64,
    refused: AtomicU64,
    /// Written by receivers; on its own line so senders and receivers never share one.
    delivered: Padded<AtomicU64>,
}

impl<T> Shared<T> {
    /// Counts `n` accepted messages of `lane`. Call only under that lane's producer lock: the
    /// lock makes this the counter's only writer, and `close` (which takes every lane lock)
    /// orders it before any report built after the close.
    #[inline]
    fn count_accepted(&self, lane: usize, n: u64) {
        let a = &self.accepted[lane];
        a.store(a.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
}

/// What one send attempt decided, made while holding the lane's write exclusion (its lock,
/// or the [`Writer`]'s flag).
enum Step<T> {
    /// Finished; `true` when receivers must be woken (a message was queued).
    Done(Result<Sent<Slot<T>>, SendError<Slot<T>>>, bool),
    /// The lane is full under `Block`: wait for room (exclusion released), then try again.
    Full,
}

impl<T: Copy + Send> Shared<T> {
    /// One attempt to send `slot` into `lane` through `producer`, the caller holding the
    /// lane's write exclusion and having read `closed` under it. The policy logic of every
    /// sender (locked lanes and the one `Writer`) lives here once.
    fn attempt(
        &self,
        producer: &mut Producer<Slot<T>>,
        lane: usize,
        slot: Slot<T>,
        policy: Backpressure,
        closed: bool,
    ) -> Step<T> {
        if closed {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Step::Done(Err(SendError::Closed(slot)), false);
        }
        if producer.push(slot).is_ok() {
            // Counted under the exclusion, so `close` (which waits for it) sees the count of
            // every message it lets through.
            self.count_accepted(lane, 1);
            return Step::Done(Ok(Sent::Queued), true);
        }
        match policy {
            Backpressure::Reject => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Step::Done(Err(SendError::Full(slot)), false)
            }
            Backpressure::DropNewest => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Step::Done(Ok(Sent::DroppedNewest), false)
            }
            Backpressure::DropOldest => {
                // Lock order: producer exclusion, then consumers (receivers take only the
                // latter), so this cannot deadlock. Holding both, the pop frees a slot that
                // no one else can take before our push.
                let old = self.consumers.lock()[lane].pop();
                if producer.push(slot).is_err() {
                    unreachable!("a slot was just freed under the producer exclusion");
                }
                // Counted under the exclusion: once `close` has passed it, a report built
                // from the counters sees this drop.
                self.count_accepted(lane, 1);
                if old.is_some() {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
                Step::Done(
                    Ok(match old {
                        Some(old) => Sent::QueuedDroppedOldest(old),
                        // A receiver emptied the slot between our push and the pop.
                        None => Sent::Queued,
                    }),
                    true,
                )
            }
            Backpressure::Block(_) => Step::Full,
        }
    }

    /// After an attempt, with the exclusion released: wakes receivers for a queued message,
    /// or under `Block` waits for room (bounded). `None`: try again.
    fn settle(
        &self,
        step: Step<T>,
        lane: usize,
        slot: Slot<T>,
        policy: Backpressure,
        deadline: &mut Option<Option<Instant>>,
    ) -> Option<Result<Sent<Slot<T>>, SendError<Slot<T>>>> {
        if let Step::Done(r, wake) = step {
            if wake {
                self.not_empty.notify();
            }
            return Some(r);
        }
        let timeout = match policy {
            Backpressure::Block(t) => t,
            _ => Duration::ZERO,
        };
        let deadline = *deadline.get_or_insert_with(|| deadline_after(timeout));
        // Receivers wake `not_full` without a fence (a fence on every pop would tax the fast
        // path), so a wake-up can be missed: wait in slices of at most 200 us and re-check.
        // Only an already-blocked sender pays for it.
        let slice =
            deadline_after(Duration::from_micros(200)).map(|sl| deadline.map_or(sl, |d| d.min(sl)));
        let ok = self.not_full.wait_until(self.config.wait, slice, || {
            self.closed.load(Ordering::Acquire) || self.rings[lane].len() < self.config.capacity
        });
        if !ok && deadline.is_some_and(|d| Instant::now() >= d) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Some(Err(SendError::Timeout(slot)));
        }
        None
    }
}

/// The one writer of a mailbox built by [`Mailbox::with_writer`]. It owns the lanes' producer
/// halves, so a send takes no lock; not `Clone`, so "one writer" is a fact of the type.
///
/// Close protocol (a Dekker pair): around each push the writer stores `writer_busy = true`
/// and then loads `closed`; [`Mailbox::close`] stores `closed = true` and then waits until it
/// loads `writer_busy == false`, all four accesses `SeqCst`. So either the writer sees the
/// close and refuses the message (handing it back), or `close` waits for the push to finish
/// and a `drain` after it sees the message: nothing accepted is ever stranded in a closed
/// mailbox. The flag is never held across a wait (a `Block` wait for room releases it), so
/// `close` waits a few instructions at most. One locked instruction per push, where a lane
/// lock costs two.
pub struct Writer<T> {
    producers: Box<[Producer<Slot<T>>]>,
    shared: Arc<Shared<T>>,
}

impl<T: Copy + Send> Writer<T> {
    /// Takes the write exclusion; `false` (exclusion not held) once the mailbox is closed.
    #[inline]
    fn enter(&self) -> bool {
        let s = &*self.shared;
        // SeqCst store, then SeqCst load: the writer's half of the Dekker pair (see above).
        s.writer_busy.store(true, Ordering::SeqCst);
        if s.closed.load(Ordering::SeqCst) {
            s.writer_busy.store(false, Ordering::Release);
            return false;
        }
        true
    }

    /// Releases the write exclusion. Release: the push and the counters before it are
    /// visible to a `close` that sees the flag clear.
    #[inline]
    fn leave(&self) {
        self.shared.writer_busy.store(false, Ordering::Release);
    }

    /// Sends with the mailbox's backpressure policy (as [`Mailbox::send`]).
    pub fn send(&mut self, slot: Slot<T>) -> Result<Sent<Slot<T>>, SendError<Slot<T>>> {
        let policy = self.shared.config.backpressure;
        let lane = lane_of(slot.env.priority, self.shared.config.lanes);
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            let entered = self.enter();
            let step = self
                .shared
                .attempt(&mut self.producers[lane], lane, slot, policy, !entered);
            if entered {
                self.leave();
            }
            if let Some(r) = self.shared.settle(step, lane, slot, policy, &mut deadline) {
                return r;
            }
        }
    }

    /// Sends a batch, one index publication per lane run (as [`Mailbox::send_batch`]); with
    /// `fenced = false` the wake-up of parked receivers is unfenced and the caller must call
    /// [`Writer::notify_receivers`] soon after (as [`Mailbox::send_batch_quiet`]).
    pub fn send_batch(
        &mut self,
        slots: &[Slot<T>],
        fenced: bool,
    ) -> (usize, Option<SendError<Slot<T>>>) {
        let lanes = self.shared.config.lanes;
        let mut done = 0;
        while done < slots.len() {
            let lane = lane_of(slots[done].env.priority, lanes);
            let run = slots[done..]
                .iter()
                .take_while(|m| lane_of(m.env.priority, lanes) == lane)
                .count();
            if !self.enter() {
                self.shared.refused.fetch_add(1, Ordering::Relaxed);
                return (done, Some(SendError::Closed(slots[done])));
            }
            let pushed = self.producers[lane].push_slice(&slots[done..done + run]);
            self.shared.count_accepted(lane, pushed as u64);
            self.leave();
            if pushed > 0 {
                if fenced {
                    self.shared.not_empty.notify();
                } else {
                    self.shared.not_empty.notify_unfenced();
                }
                done += pushed;
            }
            if pushed < run {
                // Lane full: apply the policy to the next message alone, then go on.
                match self.send(slots[done]) {
                    Ok(_) => done += 1,
                    Err(e) => return (done, Some(e)),
                }
            }
        }
        (done, None)
    }

    /// Wakes every waiting receiver (fenced): owed after unfenced sends.
    pub fn notify_receivers(&self) {
        self.shared.not_empty.notify();
    }

    /// Whether the receiving side closed the mailbox.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }
}

/// A bounded multi-producer mailbox of `Slot<T>` with priority lanes. Cloning shares it.
pub struct Mailbox<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for Mailbox<T> {
    fn clone(&self) -> Self {
        Mailbox {
            shared: self.shared.clone(),
        }
    }
}

impl<T: Copy + Send> Mailbox<T> {
    /// Builds a mailbox.
    ///
    /// ```
    /// use resident_ring::mailbox::{Mailbox, MailboxConfig, Backpressure};
    /// use resident_ring::{Envelope, Slot};
    /// let mb = Mailbox::<u32>::new(MailboxConfig { capacity: 2, backpressure: Backpressure::Reject, ..Default::default() }).unwrap();
    /// mb.send(Slot::new(Envelope::new(1, 10, 0), 1)).unwrap();
    /// mb.send(Slot::new(Envelope::new(2, 250, 0), 2)).unwrap();
    /// assert_eq!(mb.try_recv().unwrap().payload, 2); // higher priority first
    /// ```
    pub fn new(config: MailboxConfig) -> Result<Self, MailboxError> {
        let (mut shared, producers) = Self::parts(config, false)?;
        shared.producers = producers.into_iter().map(Mutex::new).collect();
        Ok(Mailbox {
            shared: Arc::new(shared),
        })
    }

    /// Builds a mailbox whose one writer is the returned [`Writer`] (sends take no lock);
    /// the `Mailbox` is the receiving side: [`Mailbox::send`] on it is refused as closed.
    ///
    /// ```
    /// use resident_ring::mailbox::{Mailbox, MailboxConfig};
    /// use resident_ring::{Envelope, Slot};
    /// let (mut w, mb) = Mailbox::<u32>::with_writer(MailboxConfig::default()).unwrap();
    /// w.send(Slot::new(Envelope::new(1, 128, 0), 7)).unwrap();
    /// assert_eq!(mb.try_recv().unwrap().payload, 7);
    /// mb.close();
    /// assert!(w.send(Slot::new(Envelope::new(2, 128, 0), 8)).is_err());
    /// ```
    pub fn with_writer(config: MailboxConfig) -> Result<(Writer<T>, Self), MailboxError> {
        let (shared, producers) = Self::parts(config, true)?;
        let shared = Arc::new(shared);
        Ok((
            Writer {
                producers: producers.into_boxed_slice(),
                shared: shared.clone(),
            },
            Mailbox { shared },
        ))
    }

    /// The shared part (with no producer halves in it yet) and the lanes' producer halves.
    fn parts(
        config: MailboxConfig,
        has_writer: bool,
    ) -> Result<(Shared<T>, Vec<Producer<Slot<T>>>), MailboxError> {
        if config.lanes == 0 || config.lanes > 256 {
            return Err(MailboxError::BadLanes(config.lanes));
        }
        if config.capacity == 0 || config.capacity > 1 << 30 {
            return Err(MailboxError::BadCapacity(config.capacity));
        }
        let capacity = config.capacity.next_power_of_two();
        let mut producers = Vec::with_capacity(config.lanes);
        let mut rings = Vec::with_capacity(config.lanes);
        let mut consumers = Vec::with_capacity(config.lanes);
        for _ in 0..config.lanes {
            let (p, c) = Ring::new(capacity)?;
            rings.push(p.ring_arc());
            producers.push(p);
            consumers.push(c);
        }
        let shared = Shared {
            producers: Box::new([]),
            has_writer,
            writer_busy: Padded(AtomicBool::new(false)),
            rings: rings.into_boxed_slice(),
            consumers: Padded(Mutex::new(consumers)),
            config: MailboxConfig { capacity, ..config },
            not_empty: Signal::new(),
            not_full: Signal::new(),
            closed: AtomicBool::new(false),
            accepted: (0..config.lanes)
                .map(|_| Padded(AtomicU64::new(0)))
                .collect(),
            dropped: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            delivered: Padded(AtomicU64::new(0)),
        };
        Ok((shared, producers))
    }

    /// The configuration in force (capacity rounded up).
    pub fn config(&self) -> MailboxConfig {
        self.shared.config
    }

    /// Sends with the mailbox's backpressure policy.
    pub fn send(&self, slot: Slot<T>) -> Result<Sent<Slot<T>>, SendError<Slot<T>>> {
        self.send_with(slot, self.shared.config.backpressure)
    }

    /// Sends with an explicit backpressure policy.
    pub fn send_with(
        &self,
        slot: Slot<T>,
        policy: Backpressure,
    ) -> Result<Sent<Slot<T>>, SendError<Slot<T>>> {
        let s = &*self.shared;
        if s.has_writer {
            // Its one writer is the `Writer`; nobody else may write (documented on
            // `with_writer`).
            s.refused.fetch_add(1, Ordering::Relaxed);
            return Err(SendError::Closed(slot));
        }
        let lane = lane_of(slot.env.priority, s.config.lanes);
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            let mut producer = s.producers[lane].lock();
            // Checked under the lane lock: `close` takes every lane lock after setting `closed`,
            // so a push that started before the close is complete (and visible to `drain`)
            // when `close` returns, and none starts after it.
            let closed = s.closed.load(Ordering::Acquire);
            let step = s.attempt(&mut producer, lane, slot, policy, closed);
            drop(producer);
            if let Some(r) = s.settle(step, lane, slot, policy, &mut deadline) {
                return r;
            }
        }
    }

    /// Sends a batch of messages that share one priority lane's lock per lane run.
    /// Stops at the first message that the policy refuses; returns how many were taken
    /// (queued or dropped by policy) and the error for the first one refused.
    pub fn send_batch(&self, slots: &[Slot<T>]) -> (usize, Option<SendError<Slot<T>>>) {
        self.send_batch_with(slots, true)
    }

    /// [`Mailbox::send_batch`] whose wake-up of parked receivers is unfenced: cheaper per
    /// call (no fence), but a receiver that is just going to sleep may miss it. The caller
    /// must call [`Mailbox::notify_receivers`] (fenced) soon after, e.g. at the end of a batch
    /// of such sends: a receiver that missed a wake-up is woken then. Spinning receivers and
    /// `try_recv` see the messages at once either way.
    pub fn send_batch_quiet(&self, slots: &[Slot<T>]) -> (usize, Option<SendError<Slot<T>>>) {
        self.send_batch_with(slots, false)
    }

    fn send_batch_with(
        &self,
        slots: &[Slot<T>],
        fenced: bool,
    ) -> (usize, Option<SendError<Slot<T>>>) {
        let s = &*self.shared;
        if s.has_writer && !slots.is_empty() {
            s.refused.fetch_add(1, Ordering::Relaxed);
            return (0, Some(SendError::Closed(slots[0])));
        }
        let mut done = 0;
        while done < slots.len() {
            // The run of consecutive messages for the same lane goes in under one lock.
            let lane = lane_of(slots[done].env.priority, s.config.lanes);
            let run = slots[done..]
                .iter()
                .take_while(|m| lane_of(m.env.priority, s.config.lanes) == lane)
                .count();
            let pushed = {
                let mut producer = s.producers[lane].lock();
                // Under the lane lock, as in `send_with`.
                if s.closed.load(Ordering::Acquire) {
                    drop(producer);
                    s.refused.fetch_add(1, Ordering::Relaxed);
                    return (done, Some(SendError::Closed(slots[done])));
                }
                let pushed = producer.push_slice(&slots[done..done + run]);
                s.count_accepted(lane, pushed as u64);
                pushed
            };
            if pushed > 0 {
                if fenced {
                    s.not_empty.notify();
                } else {
                    s.not_empty.notify_unfenced();
                }
                done += pushed;
            }
            if pushed < run {
                // Lane full: apply the policy to the next message alone, then go on.
                match self.send(slots[done]) {
                    Ok(_) => done += 1,
                    Err(e) => return (done, Some(e)),
                }
            }
        }
        (done, None)
    }

    /// Takes the highest-priority message, if any.
    pub fn try_recv(&self) -> Option<Slot<T>> {
        let s = &*self.shared;
        let got = {
            let mut consumers = s.consumers.lock();
            let got = consumers.iter_mut().rev().find_map(|c| c.pop());
            if got.is_some() {
                // Written only under the receivers' lock: a plain add, no locked instruction.
                s.delivered
                    .store(s.delivered.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            }
            got
        };
        if got.is_some() {
            s.not_full.notify_unfenced();
        }
        got
    }

    /// Moves up to `max` messages to `out`, highest lane first, FIFO within a lane. Returns
    /// how many were moved.
    pub fn recv_batch(&self, out: &mut Vec<Slot<T>>, max: usize) -> usize {
        self.recv_each(max, |s| out.push(s))
    }

    /// Hands up to `max` messages to `f`, highest lane first, FIFO within a lane, without an
    /// intermediate buffer. `f` runs under the receivers' lock: keep it short. Returns how
    /// many were handed over.
    pub fn recv_each(&self, max: usize, mut f: impl FnMut(Slot<T>)) -> usize {
        let s = &*self.shared;
        let mut n = 0;
        {
            let mut consumers = s.consumers.lock();
            for c in consumers.iter_mut().rev() {
                if n == max {
                    break;
                }
                n += c.pop_each(max - n, &mut f);
            }
            if n > 0 {
                // Written only under the receivers' lock: a plain add, no locked instruction.
                s.delivered.store(
                    s.delivered.load(Ordering::Relaxed) + n as u64,
                    Ordering::Relaxed,
                );
            }
        }
        if n > 0 {
            s.not_full.notify_unfenced();
        }
        n
    }

    /// Waits up to `timeout` for a message.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Slot<T>, RecvError> {
        self.recv_until(deadline_after(timeout))
    }

    /// Waits until `deadline` (`None` = forever) for a message.
    pub fn recv_until(&self, deadline: Option<Instant>) -> Result<Slot<T>, RecvError> {
        loop {
            if let Some(slot) = self.try_recv() {
                return Ok(slot);
            }
            if self.is_closed() {
                // A send may have landed between the pop and the close check.
                return self.try_recv().ok_or(RecvError::Closed);
            }
            if !self.wait_nonempty(deadline, || false) {
                return self.try_recv().ok_or(RecvError::Timeout);
            }
        }
    }

    /// Waits until the mailbox looks non-empty, is closed, or `wake()` holds; `false` on
    /// timeout. `wake` must only read state whose writers call [`Mailbox::notify_receivers`].
    pub fn wait_nonempty(&self, deadline: Option<Instant>, mut wake: impl FnMut() -> bool) -> bool {
        let s = &*self.shared;
        s.not_empty.wait_until(s.config.wait, deadline, || {
            !self.is_empty() || s.closed.load(Ordering::Acquire) || wake()
        })
    }

    /// Wakes every waiting receiver (after changing state their `wake` condition reads).
    pub fn notify_receivers(&self) {
        self.shared.not_empty.notify();
    }

    /// Messages queued now, all lanes (a snapshot).
    pub fn len(&self) -> usize {
        self.shared.rings.iter().map(|r| r.len()).sum()
    }

    /// Whether no message is queued now.
    pub fn is_empty(&self) -> bool {
        self.shared.rings.iter().all(|r| r.is_empty())
    }

    /// Refuses every later send; wakes all waiters. Queued messages stay receivable.
    ///
    /// When `close` returns, every send that returned (or will return) `Ok` has its message in
    /// a lane, so a [`Mailbox::drain`] after `close` sees all of them: senders check `closed`
    /// under their lane's lock, and `close` takes each lane's lock once after setting it, which
    /// waits out any push in progress.
    ///
    /// With a [`Writer`], `close` waits for the push it may be in the middle of (a few
    /// instructions: the writer never holds its flag across a wait).
    pub fn close(&self) {
        let s = &*self.shared;
        // SeqCst: one half of the Dekker pair with `Writer::enter` (store `closed`, then load
        // `writer_busy`; the writer stores `writer_busy`, then loads `closed`): at least one
        // side sees the other's store, so either the writer refuses, or we wait for its push.
        s.closed.store(true, Ordering::SeqCst);
        for p in s.producers.iter() {
            drop(p.lock());
        }
        if s.has_writer {
            let mut spins = 0u32;
            // SeqCst pairs as above; it also acquires the writer's Release clear, so its push
            // and counters are visible to a `drain` after this.
            while s.writer_busy.load(Ordering::SeqCst) {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        self.shared.not_empty.notify();
        self.shared.not_full.notify();
    }

    /// Whether [`Mailbox::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Removes and returns everything queued, highest lane first.
    pub fn drain(&self) -> Vec<Slot<T>> {
        let mut out = Vec::new();
        self.recv_batch(&mut out, usize::MAX);
        out
    }

    /// The counters.
    pub fn counters(&self) -> MailboxCounters {
        let s = &*self.shared;
        MailboxCounters {
            accepted: s.accepted.iter().map(|a| a.load(Ordering::Relaxed)).sum(),
            dropped: s.dropped.load(Ordering::Relaxed),
            delivered: s.delivered.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::Envelope;

    fn slot(id: u64, prio: u8) -> Slot<u64> {
        Slot::new(Envelope::new(id, prio, 0), id)
    }

    fn mb(capacity: usize, lanes: usize, backpressure: Backpressure) -> Mailbox<u64> {
        Mailbox::new(MailboxConfig {
            capacity,
            lanes,
            backpressure,
            wait: WaitStrategy::default(),
        })
        .unwrap()
    }

    #[test]
    fn lane_mapping_is_documented_bands() {
        assert_eq!(lane_of(0, 4), 0);
        assert_eq!(lane_of(63, 4), 0);
        assert_eq!(lane_of(64, 4), 1);
        assert_eq!(lane_of(127, 4), 1);
        assert_eq!(lane_of(128, 4), 2);
        assert_eq!(lane_of(191, 4), 2);
        assert_eq!(lane_of(192, 4), 3);
        assert_eq!(lane_of(255, 4), 3);
        for p in 0..=255u8 {
            assert_eq!(lane_of(p, 1), 0);
            assert_eq!(lane_of(p, 256), p as usize);
        }
    }

    #[test]
    fn bad_config_is_an_error() {
        let c = MailboxConfig {
            lanes: 0,
            ..Default::default()
        };
        assert_eq!(Mailbox::<u8>::new(c).err(), Some(MailboxError::BadLanes(0)));
        let c = MailboxConfig {
            capacity: 0,
            ..Default::default()
        };
        assert_eq!(
            Mailbox::<u8>::new(c).err(),
            Some(MailboxError::BadCapacity(0))
        );
    }

    #[test]
    fn higher_priority_first_fifo_within_lane() {
        let m = mb(16, 4, Backpressure::Reject);
        for (id, p) in [(1, 10), (2, 200), (3, 130), (4, 201), (5, 11), (6, 255)] {
            m.send(slot(id, p)).unwrap();
        }
        let order: Vec<u64> = std::iter::from_fn(|| m.try_recv())
            .map(|s| s.payload)
            .collect();
        assert_eq!(order, vec![2, 4, 6, 3, 1, 5]);
    }

    #[test]
    fn strict_priority_with_256_lanes() {
        let m = mb(4, 256, Backpressure::Reject);
        for (id, p) in [(1, 200u8), (2, 201), (3, 199), (4, 201)] {
            m.send(slot(id, p)).unwrap();
        }
        let mut out = Vec::new();
        m.recv_batch(&mut out, 10);
        let order: Vec<u64> = out.iter().map(|s| s.payload).collect();
        assert_eq!(order, vec![2, 4, 1, 3]);
    }

    #[test]
    fn reject_hands_back_and_bounds_each_lane() {
        let m = mb(2, 4, Backpressure::Reject);
        m.send(slot(1, 0)).unwrap();
        m.send(slot(2, 0)).unwrap();
        assert_eq!(m.send(slot(3, 0)), Err(SendError::Full(slot(3, 0))));
        // Another lane still has room.
        m.send(slot(4, 255)).unwrap();
        assert_eq!(m.len(), 3);
        let c = m.counters();
        assert_eq!((c.accepted, c.refused, c.dropped), (3, 1, 0));
    }

    #[test]
    fn drop_oldest_keeps_newest_and_counts() {
        let m = mb(2, 1, Backpressure::DropOldest);
        for id in 1..=5 {
            m.send(slot(id, 128)).unwrap();
        }
        let left: Vec<u64> = m.drain().iter().map(|s| s.payload).collect();
        assert_eq!(left, vec![4, 5]);
        assert_eq!(m.counters().dropped, 3);
    }

    #[test]
    fn drop_newest_keeps_oldest_and_counts() {
        let m = mb(2, 1, Backpressure::DropNewest);
        for id in 1..=5 {
            m.send(slot(id, 128)).unwrap();
        }
        let left: Vec<u64> = m.drain().iter().map(|s| s.payload).collect();
        assert_eq!(left, vec![1, 2]);
        assert_eq!(m.counters().dropped, 3);
        assert_eq!(m.counters().accepted, 2);
    }

    #[test]
    fn block_times_out_then_succeeds_when_room_appears() {
        let m = mb(1, 1, Backpressure::Block(Duration::from_millis(20)));
        m.send(slot(1, 128)).unwrap();
        let start = Instant::now();
        assert_eq!(m.send(slot(2, 128)), Err(SendError::Timeout(slot(2, 128))));
        assert!(start.elapsed() >= Duration::from_millis(20));
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            m2.try_recv().unwrap()
        });
        m.send_with(slot(3, 128), Backpressure::Block(Duration::from_secs(10)))
            .unwrap();
        assert_eq!(t.join().unwrap().payload, 1);
        assert_eq!(m.try_recv().unwrap().payload, 3);
    }

    #[test]
    fn close_refuses_sends_and_drains_then_reports_closed() {
        let m = mb(4, 1, Backpressure::Reject);
        m.send(slot(1, 128)).unwrap();
        m.close();
        assert_eq!(m.send(slot(2, 128)), Err(SendError::Closed(slot(2, 128))));
        assert_eq!(m.recv_timeout(Duration::from_secs(1)).unwrap().payload, 1);
        assert_eq!(
            m.recv_timeout(Duration::from_secs(1)),
            Err(RecvError::Closed)
        );
    }

    #[test]
    fn close_wakes_a_blocked_sender() {
        let m = mb(1, 1, Backpressure::Block(Duration::MAX));
        m.send(slot(1, 128)).unwrap();
        let m2 = m.clone();
        let t = std::thread::spawn(move || m2.send(slot(2, 128)));
        std::thread::sleep(Duration::from_millis(20));
        m.close();
        assert_eq!(t.join().unwrap(), Err(SendError::Closed(slot(2, 128))));
    }

    #[test]
    fn batch_send_spans_lanes_and_stops_at_refusal() {
        let m = mb(2, 2, Backpressure::Reject);
        let batch = [
            slot(1, 0),
            slot(2, 0),
            slot(3, 255),
            slot(4, 0),
            slot(5, 255),
        ];
        let (n, err) = m.send_batch(&batch);
        assert_eq!(n, 3);
        assert_eq!(err, Some(SendError::Full(slot(4, 0))));
        let order: Vec<u64> = m.drain().iter().map(|s| s.payload).collect();
        assert_eq!(order, vec![3, 1, 2]);
    }
}
