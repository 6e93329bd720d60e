//! `Publisher`: the one writer of a kernel's output side, owned by its host thread.
//!
//! Every output of every backend leaves through here, so the envelope convention is applied
//! once: a handled request's output gets a fresh message id from the publisher's own block,
//! `correlation_id` = the request's id, the request's priority and flags, and the publish
//! time; a `call`'s reply goes straight to its caller by correlation id. Latency (send to
//! response available) is recorded here too, one meaning on every backend.
//!
//! The publisher owns the output mailbox's [`Writer`] (the mailbox's producer halves), so an
//! output costs no lock: one flag store that `close` waits on (see `resident_ring::Writer`).
//! It is not `Clone` and is moved into the host thread at launch: "one writer per ring" is a
//! fact of the types, and its id block needs no atomics.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use resident_ring::mailbox::{SendError, Sent};
use resident_ring::{Envelope, Message, Slot, Writer};

use crate::runtime::ids::Ids;
use crate::runtime::io::{Forward, KernelIo, FORWARD_PATIENCE};

/// The one writer of a kernel's outputs (see the module docs).
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub struct Publisher<In, Out> {
    io: Arc<KernelIo<In, Out>>,
    out: Writer<Out>,
    /// Output ids: the current block `[next_id, end_id)`, taken from the runtime's counter in
    /// blocks of [`Ids::BLOCK`] so senders and this thread do not share a hot line.
    next_id: u64,
    end_id: u64,
    /// Outputs were queued since the last call of the kernel's `on_publish` hook.
    unannounced: bool,
}

impl<In: Message, Out: Message> Publisher<In, Out> {
    pub fn new(io: Arc<KernelIo<In, Out>>, out: Writer<Out>) -> Self {
        Publisher {
            io,
            out,
            next_id: 0,
            end_id: 0,
            unannounced: false,
        }
    }

    /// The kernel this publisher writes for.
    pub fn io(&self) -> &Arc<KernelIo<In, Out>> {
        &self.io
    }

    /// The first of `n` consecutive output ids, from the publisher's own block.
    #[inline]
    fn output_ids(&mut self, n: u64) -> u64 {
        if self.end_id - self.next_id < n {
            let take = n.max(Ids::BLOCK);
            self.next_id = self.io.ids.next_n(take);
            self.end_id = self.next_id + take;
        }
        let first = self.next_id;
        self.next_id += n;
        first
    }

    /// Publishes the results of handled requests, in order. Each `Slot` carries the
    /// *request's* envelope (its id, flags, priority and send time) and the output. Call
    /// replies go to their callers by correlation id; other outputs are stamped and queued.
    pub fn publish(&mut self, results: &mut Vec<Slot<Out>>) {
        if results.is_empty() {
            return;
        }
        let io = &*self.io;
        let now = io.ids.now_ns();
        let record = io.metrics.enabled;
        let mut plain = 0;
        for i in 0..results.len() {
            let r = results[i];
            if record {
                io.metrics
                    .latency
                    .record(now.saturating_sub(r.env.timestamp_ns));
            }
            if r.env.is_call() {
                io.reply(r.env, Some(r.payload));
            } else {
                results[plain] = r;
                plain += 1;
            }
        }
        results.truncate(plain);
        if results.is_empty() {
            return;
        }
        let first = self.output_ids(results.len() as u64);
        for (i, o) in results.iter_mut().enumerate() {
            o.env = stamp(&o.env, first + i as u64, now);
        }
        self.push_outputs(results, true);
        results.clear();
        self.announce();
    }

    /// Publishes the result of one handled request as soon as its handler returned (the
    /// CPU host's path: an output is visible to `receive` at once, not when the batch ends).
    /// `out = None` answers a `call` with `NoReply` and publishes nothing otherwise.
    ///
    /// `batch_now` is the clock read when the batch started: it stamps the output, so that
    /// without telemetry no clock is read per message; with telemetry the clock is read here
    /// for an exact latency.
    #[inline]
    pub fn publish_one(&mut self, request: Envelope, out: Option<Out>, batch_now: u64) {
        let Some(out) = out else {
            self.no_reply(request);
            return;
        };
        let io = &*self.io;
        let now = if io.metrics.enabled {
            let now = io.ids.now_ns();
            io.metrics
                .latency
                .record(now.saturating_sub(request.timestamp_ns));
            now
        } else {
            batch_now
        };
        if request.is_call() {
            io.reply(request, Some(out));
            return;
        }
        let env = stamp(&request, self.output_ids(1), now);
        // The output is in the queue now (spinning receivers and `try_receive` see it); the
        // fenced wake-up for a receiver that was just parking comes with `flush_wakeups` at
        // the end of the batch (or of this handler, for the loop form).
        self.push_outputs(&[Slot::new(env, out)], false);
    }

    /// The fenced wake-up owed after [`Publisher::publish_one`]s (and the kernel's
    /// `on_publish` hook, if they queued anything).
    #[inline]
    pub fn flush_wakeups(&mut self) {
        self.out.notify_receivers();
        self.announce();
    }

    /// Calls the kernel's `on_publish` hook once for the outputs queued since its last call
    /// (after they are in the queue, so whoever it wakes finds them).
    #[inline]
    fn announce(&mut self) {
        if std::mem::take(&mut self.unannounced) {
            if let Some(hook) = self.io.on_publish.get() {
                hook();
            }
        }
    }

    /// A handled `call` that produced no output: its caller gets `NoReply`.
    pub fn no_reply(&self, request: Envelope) {
        if request.is_call() {
            let io = &*self.io;
            if io.metrics.enabled {
                let now = io.ids.now_ns();
                io.metrics
                    .latency
                    .record(now.saturating_sub(request.timestamp_ns));
            }
            io.reply(request, None);
        }
    }

    /// Queues outputs in order. A full output queue makes the host thread wait (or drop,
    /// under a drop policy); outputs that cannot be queued because the kernel is terminating
    /// go to the terminate report.
    fn push_outputs(&mut self, outputs: &[Slot<Out>], fenced: bool) {
        let io = self.io.clone();
        if let Some(f) = io.forward.get() {
            forward_outputs(&io, f, outputs);
            return;
        }
        // Outputs that do not fit make this thread wait for a receiver: the outputs queued
        // already are announced first, or a receiver that only the hook wakes would not come
        // to make room.
        if self.unannounced
            && io.on_publish.get().is_some()
            && io.output.len() + outputs.len() > io.output.config().capacity
        {
            self.announce();
        }
        let mut done = 0;
        while done < outputs.len() {
            let (n, err) = self.out.send_batch(&outputs[done..], fenced);
            done += n;
            self.unannounced |= n > 0;
            if err.is_some() && (io.terminating() || self.out.is_closed()) {
                keep_unsent(&io, &outputs[done..]);
                return;
            }
        }
    }
}

/// The envelope of the output answering `request`.
#[inline]
fn stamp(request: &Envelope, message_id: u64, now: u64) -> Envelope {
    Envelope {
        message_id,
        correlation_id: request.message_id,
        timestamp_ns: now,
        priority: request.priority,
        flags: request.flags,
        ..Default::default()
    }
}

/// Outputs that can no longer be queued: into the terminate report, or, once the report is
/// built (the host thread was abandoned), counted. Never lost silently.
fn keep_unsent<In: Message, Out: Message>(io: &KernelIo<In, Out>, outputs: &[Slot<Out>]) {
    if outputs.is_empty() {
        return;
    }
    if io.in_hand.is_abandoned() {
        io.metrics
            .late_outputs
            .fetch_add(outputs.len() as u64, Ordering::Relaxed);
    } else {
        io.unsent.lock().extend_from_slice(outputs);
    }
}

/// Sends outputs, in order, into the input queue of the kernel they are forwarded to, under
/// that kernel's backpressure. A full target makes this kernel wait (the chain slows down to
/// its slowest kernel) until it terminates; a target that is not there or no longer accepts
/// (terminated, failed) for [`FORWARD_PATIENCE`] gets nothing: the outputs go to this
/// kernel's terminate report as unreceived, never lost silently.
fn forward_outputs<In: Message, Out: Message>(
    io: &KernelIo<In, Out>,
    f: &Forward<Out>,
    outputs: &[Slot<Out>],
) {
    let mut missing_since: Option<std::time::Instant> = None;
    let mut done = 0;
    while done < outputs.len() {
        let terminating = || io.terminating() || io.in_hand.is_abandoned();
        let gone = match f.port() {
            // A keyed target refuses an output naming a key it does not have: reported.
            Ok(port)
                if port
                    .check_key(&outputs[done].payload, crate::state::Op::Forward)
                    .is_err() =>
            {
                keep_unsent(io, &outputs[done..done + 1]);
                done += 1;
                continue;
            }
            Ok(port) => match port.mailbox.send(outputs[done]) {
                Ok(Sent::Queued) => {
                    done += 1;
                    io.metrics.forwarded_host.fetch_add(1, Ordering::Relaxed);
                    missing_since = None;
                    continue;
                }
                Ok(Sent::QueuedDroppedOldest(old)) => {
                    crate::profile::dropped(&port.id, "forward", "DropOldest");
                    port.dropped(&old.env);
                    done += 1;
                    io.metrics.forwarded_host.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Ok(Sent::DroppedNewest) => {
                    crate::profile::dropped(&port.id, "forward", "DropNewest");
                    done += 1;
                    continue;
                }
                Err(SendError::Full(_)) | Err(SendError::Timeout(_)) => false,
                Err(SendError::Closed(_)) => {
                    f.forget();
                    true
                }
            },
            Err(_) => true,
        };
        if terminating() {
            break;
        }
        if gone {
            let since = *missing_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= FORWARD_PATIENCE {
                break;
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    keep_unsent(io, &outputs[done..]);
}
