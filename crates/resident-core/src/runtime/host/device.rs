//! The device ring host: a *pump* thread per kernel between `KernelIo` and a
//! `DeviceRing` — the device-side queues of a kernel that runs on a device (a persistent
//! CUDA kernel, the same kernel on CudaSim, or a wgpu batch pipeline).
//!
//! Senders still enqueue into the kernel's host mailbox, so every rule of the CPU backend
//! (priority lanes, backpressure policies, close, terminate reports) holds unchanged; the pump
//! moves batches into the device's input lanes, drains the device's output ring into the
//! kernel's `Publisher`, beats the heartbeat and polls for device faults.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use resident_ring::wait::deadline_after;
use resident_ring::{Envelope, Message, Slot};

use crate::engine::error::DeviceError;
use crate::runtime::host::RingHost;
use crate::runtime::io::KernelIo;
pub use crate::runtime::io::StateSnapshot;
pub use crate::runtime::port::DeviceLink;
use crate::runtime::publisher::Publisher;
use crate::state::Failure;

/// Counters a device kernel keeps about itself.
#[derive(Clone, Copy, Debug, Default)]
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub struct RingCounters {
    pub processed: u64,
    pub batches: u64,
    /// Outputs lost because the device had to exit with its output ring full.
    pub lost: u64,
    /// Of `processed`: inputs a producer handed over on the device (taken from its output
    /// ring or handed over in batches; never pushed by the pump).
    pub forwarded: u64,
}

/// What the pump needs from a device-side kernel. Outputs come back carrying their request's
/// envelope convention: `correlation_id` = the request's `message_id`, the request's flags,
/// priority and send time.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub trait DeviceRing<In, Out>: Send {
    /// Moves the longest prefix of `slots` that fits into the device's lanes.
    fn push(&mut self, slots: &[Slot<In>]) -> usize;
    /// Moves up to `max` outputs to `out`.
    fn pull(&mut self, out: &mut Vec<Slot<Out>>, max: usize) -> usize;
    fn set_active(&mut self, on: bool) -> Result<(), DeviceError>;
    fn heartbeat(&mut self);
    /// `Err` once the device side has faulted or exited on its own.
    fn check(&mut self) -> Result<(), DeviceError>;
    fn counters(&self) -> RingCounters;
    /// Asks the device side to exit and waits for it (bounded).
    fn terminate(&mut self, timeout: Duration) -> Result<(), DeviceError>;
    /// After `terminate` (or a fault): the inputs the device never consumed.
    fn reclaim_input(&mut self) -> Vec<Slot<In>>;
    /// Envelopes of `call` requests the handler answered with no output, so their callers get
    /// `NoReply` at once. Rings that cannot tell leave this empty; such callers time out.
    fn take_unanswered_calls(&mut self, _out: &mut Vec<Envelope>) {}
    /// Called once by the pump before anything else: the kernel's io, for rings that forward
    /// on the device (the producer side finds its target through `io.forward`, the consumer
    /// side offers itself through `io.port.device_link`).
    fn attach(&mut self, _io: &Arc<KernelIo<In, Out>>) {}
    /// Takes batches producers handed over on the device; `unpushed`: messages the pump took
    /// from the input queue and has not pushed yet. Returns how many messages.
    fn take_forwarded(&mut self, _unpushed: usize) -> usize {
        0
    }
    /// Whether producers have handed over batches not yet taken (wakes an idle pump).
    fn forwarded_waiting(&self) -> bool {
        false
    }
    /// Device-side forwarding, consumer side: the inbox this kernel offers producers of its
    /// engine, put on its input port before the kernel can be found. (A ring that offers one
    /// only while it runs sets `io.device_link()` itself, in `attach`.)
    fn device_link(&self) -> Option<Arc<dyn DeviceLink>> {
        None
    }
    /// One round of device-side forwarding, before the pump pulls. `drained`: everything
    /// accepted so far is in the device's lanes (a consumer links a requested producer only
    /// then). `Ok(false)` while another kernel owns this kernel's output ring: the pump does
    /// not pull it.
    fn forward_round(&mut self, _drained: bool) -> Result<bool, DeviceError> {
        Ok(true)
    }
    /// After `terminate`: takes this kernel's output ring back from the kernel it was forwarded to
    /// (bounded). `false` when it stays there; the ring then counts what is left in it
    /// (`KernelIo::count_late_outputs`), never losing it silently.
    fn release_output(&mut self) -> bool {
        true
    }
}

/// Hosts a kernel whose handler runs on a device.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub struct DeviceHost<In, Out> {
    ring: Box<dyn DeviceRing<In, Out>>,
}

impl<In, Out> DeviceHost<In, Out> {
    pub fn new(ring: Box<dyn DeviceRing<In, Out>>) -> Self {
        DeviceHost { ring }
    }
}

impl<In: Message, Out: Message> RingHost<In, Out> for DeviceHost<In, Out> {
    fn run(self: Box<Self>, io: &Arc<KernelIo<In, Out>>, out: Publisher<In, Out>) {
        pump(io, out, self.ring)
    }

    /// The kernel's device inbox goes on its input port before the kernel can be found: a
    /// producer that finds it can link at once.
    fn publish(&self, io: &Arc<KernelIo<In, Out>>) {
        if let Some(l) = self.ring.device_link() {
            *io.port.device_link.lock() = Some(l);
        }
    }
}

fn store_counters<In: Message, Out: Message>(
    io: &KernelIo<In, Out>,
    ring: &dyn DeviceRing<In, Out>,
) {
    let c = ring.counters();
    // Batches first: a reader that sees a message processed sees its batch counted. Raised,
    // never lowered: a consumer's pump that ran a producer's batch on the device counts it
    // in the producer's metrics at once (`wgpu::ring::link`), possibly past what this pump
    // read a moment ago.
    io.metrics.batches.fetch_max(c.batches, Ordering::Relaxed);
    io.metrics
        .processed
        .fetch_max(c.processed, Ordering::Release);
    io.metrics
        .device_undelivered
        .store(c.lost, Ordering::Relaxed);
    io.metrics
        .peer_received
        .store(c.forwarded, Ordering::Relaxed);
}

/// Inputs the pump pushed that the device has not handled yet. Inputs the device took from a
/// producer on the device (`RingCounters::forwarded`) are processed without having been pushed.
fn in_device<In, Out>(pushed: u64, ring: &dyn DeviceRing<In, Out>) -> u64 {
    let c = ring.counters();
    (pushed + c.forwarded).saturating_sub(c.processed)
}

/// Device outputs carry the request's id as `correlation_id`: turn them back into
/// (request envelope, output) pairs for the one publish path.
fn deliver<In: Message, Out: Message>(out: &mut Publisher<In, Out>, outs: &mut Vec<Slot<Out>>) {
    for o in outs.iter_mut() {
        o.env = Envelope {
            message_id: o.env.correlation_id,
            correlation_id: 0,
            ..o.env
        };
    }
    out.publish(outs);
}

fn pump<In: Message, Out: Message>(
    io: &Arc<KernelIo<In, Out>>,
    mut out: Publisher<In, Out>,
    mut ring: Box<dyn DeviceRing<In, Out>>,
) {
    ring.attach(io);
    let c = io.control.clone();
    let prof = io.profile.get();
    let mut carry: Vec<Slot<In>> = Vec::with_capacity(io.batch_size * 4);
    // Whether `carry` holds a message whose deadline is near (`KernelIo::deadline_near`), and
    // whether it was held back (its deadlines are then checked again before it goes).
    let mut carry_deadline = false;
    let mut held = false;
    let mut outs: Vec<Slot<Out>> = Vec::with_capacity(4096);
    let mut device_active = false;
    let mut last_beat = Instant::now();
    let mut idle: u32 = 0;
    let mut pushed: u64 = 0;
    let mut unanswered: Vec<Envelope> = Vec::new();
    let mut answer_none = |ring: &mut Box<dyn DeviceRing<In, Out>>, out: &Publisher<In, Out>| {
        unanswered.clear();
        ring.take_unanswered_calls(&mut unanswered);
        for req in &unanswered {
            out.no_reply(*req);
        }
    };
    let failure = loop {
        if c.terminate.load(Ordering::Acquire) {
            break None;
        }
        let want = c.active.load(Ordering::Acquire);
        if want != device_active {
            if let Err(e) = ring.set_active(want) {
                break Some(e);
            }
            device_active = want;
        }
        let mut moved = 0;
        if want {
            let _gate = io.batch_gate.lock();
            // Re-check under the gate: `deactivate` flips the flag, then takes the gate.
            if c.active.load(Ordering::Acquire) {
                if carry.is_empty() {
                    // One clock read for both checks, and none without a deadline.
                    let mut now = None;
                    io.take_inputs(&mut carry, io.batch_size * 4, &mut now);
                    carry_deadline = io.deadline_near(&carry, &mut now);
                }
                // The device's queues cannot check a deadline: a message whose deadline is near
                // waits here until the device has handled everything before it, and its
                // deadline is checked again when it goes (so it does not expire unseen in a
                // device queue). Far deadlines (long `call` timeouts) go at once.
                if carry_deadline && io.expires() && in_device(pushed, &*ring) > 0 {
                    held = true;
                } else {
                    if held {
                        held = false;
                        // Time has passed while held: a fresh reading, once for both checks.
                        let mut now = None;
                        io.expire(&mut carry, 0, &mut now);
                        carry_deadline = io.deadline_near(&carry, &mut now);
                    }
                    let t = crate::profile::now(prof);
                    let n = ring.push(&carry);
                    crate::profile::device_push(prof, t, &carry[..n]);
                    carry.drain(..n);
                    moved += n;
                    pushed += n as u64;
                }
                moved += ring.take_forwarded(carry.len());
            }
        }
        // Device-side forwarding: a requested link is made once everything accepted before
        // is in the device lanes.
        let owns_output = match ring.forward_round(carry.is_empty() && io.input.is_empty()) {
            Ok(v) => v,
            Err(e) => break Some(e),
        };
        outs.clear();
        let t = crate::profile::now(prof);
        let n = if owns_output {
            ring.pull(&mut outs, 4096)
        } else {
            0
        };
        crate::profile::device_pull(prof, t, &outs);
        // Counters first: whoever sees an output also sees it counted.
        store_counters(io, &*ring);
        let in_device = in_device(pushed, &*ring) + carry.len() as u64;
        io.in_flight.store(in_device, Ordering::Release);
        if n > 0 {
            deliver(&mut out, &mut outs);
            moved += n;
        }
        answer_none(&mut ring, &out);
        if last_beat.elapsed() >= Duration::from_millis(50) {
            last_beat = Instant::now();
            ring.heartbeat();
            if let Err(e) = ring.check() {
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
            io.input.wait_nonempty(deadline_after(backoff), || {
                c.terminate.load(Ordering::Acquire)
                    || c.active.load(Ordering::Acquire) != device_active
                    || (device_active && ring.forwarded_waiting())
            });
        }
    };
    // Leave `terminate` (which waits `terminate_timeout` for this thread) time to collect
    // what the pump hands back.
    let stop = ring.terminate(io.terminate_timeout.mul_f64(0.75));
    // Take the output ring back from the kernel it was forwarded to (bounded); what is left in
    // it is relayed by the host (or reported) like any output. A ring that stays with a kernel
    // that did not let go is counted by the ring, never silently lost.
    if ring.release_output() {
        loop {
            outs.clear();
            if ring.pull(&mut outs, 4096) == 0 {
                break;
            }
            deliver(&mut out, &mut outs);
        }
    }
    answer_none(&mut ring, &out);
    store_counters(io, &*ring);
    // Inputs the device never consumed were sent before those still in `carry`.
    let mut stranded = ring.reclaim_input();
    if stop.is_err() {
        // A device that did not stop keeps what it took: neither handled nor returnable.
        // Count it (as dropped), never lose it silently.
        let lost = in_device(pushed, &*ring).saturating_sub(stranded.len() as u64);
        io.metrics.lost_in_device.store(lost, Ordering::Relaxed);
    }
    stranded.append(&mut carry);
    // Free the device side before anyone can see the failure: after a device fault the
    // context is reset on the next launch only once nothing from before the fault is alive.
    drop(ring);
    // A device that did not stop when asked may still hold inputs it never reports: that is a
    // failure even during terminate, never a silent success.
    let reason = failure.or_else(|| stop.err());
    match reason {
        Some(e) => io.fail(Failure::Device(Arc::new(e)), None, stranded),
        None => io.strand(stranded),
    }
}
