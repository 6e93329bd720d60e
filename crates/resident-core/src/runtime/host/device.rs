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

use resident_cuda::persistent::{PeerInput, PeerPhase, PeerRing};

use crate::engine::error::DeviceError;
use crate::runtime::host::RingHost;
use crate::runtime::io::KernelIo;
pub use crate::runtime::io::StateSnapshot;
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
    /// Of `processed`: inputs a producer handed over on the device (never pushed by the pump).
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
    fn stop(&mut self, timeout: Duration) -> Result<(), DeviceError>;
    /// After `stop` (or a fault): the inputs the device never consumed.
    fn reclaim(&mut self) -> Vec<Slot<In>>;
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
    /// Device-side forwarding, producer side: this kernel's output ring as another kernel of
    /// the same engine would consume it (`None`: this engine cannot forward on the device).
    fn output_peer(&self) -> Option<PeerRing> {
        None
    }
    /// Device-side forwarding, consumer side: this kernel's peer-input slot.
    fn peer_input(&self) -> Option<Arc<PeerInput>> {
        None
    }
    /// The host pops the output ring again after a link ended (its consumer index as the
    /// linked kernel left it). Called only once the link's phase is `Free`.
    fn resync_output(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Inputs taken straight from another kernel's output ring (device-side forwarding); they
    /// are in `counters().processed` too once handled.
    fn peer_taken(&self) -> u64 {
        0
    }
    /// How many times the host's pauses that race the kernel's progress are stretched (at least
    /// 1): a stand-in much slower than its device (CudaSim's speed model,
    /// `resident_cuda::sim_driver`) stretches them so that such races end as on the device.
    fn host_dilation(&self) -> u32 {
        1
    }
}

/// Pause between two link attempts of a producer (after a refusal, a cancelled request or a
/// `call` reply that took the ring back). A target that is not there yet is no refusal: it is
/// looked up again as soon as a kernel is registered (`DeviceForward::looked_at`): waiting this
/// pause for it instead would relay a whole first chain through the host, which a GPU runs in
/// a few milliseconds, before the first offer after the target appeared.
const RELINK_PAUSE: Duration = Duration::from_millis(20);

/// A producer's device-side link to its forward target (`RingKernel::forward_to` between two
/// kernels of one CUDA-family engine; see `resident_cuda::persistent::peer`).
struct Link {
    peer: Arc<PeerInput>,
    ring: PeerRing,
    /// The ring's consumer index when the request was made: what the linked kernel took
    /// since is `ring.head() - head0`.
    head0: u64,
}

/// The producer side of device forwarding, driven by the pump.
struct DeviceForward {
    owner: u64,
    enabled: bool,
    cur: Option<Link>,
    next_try: Instant,
    /// Messages the linked kernels took in links that ended.
    base: u64,
    /// An unlink was not acknowledged: the ring stays with the other kernel for good.
    broken: bool,
    /// `RELINK_PAUSE`, stretched by the ring's `host_dilation` (CudaSim's speed model).
    relink_pause: Duration,
    /// The runtime's registration count (`Forward::registrations`) read before the last
    /// attempt that found no target, or a target with no device peer slot: a new count means a
    /// kernel was launched since, so the next round tries again at once, pause or not.
    /// `None` after any other outcome.
    looked_at: Option<u64>,
}

impl DeviceForward {
    fn new<In: Message, Out: Message>(
        io: &Arc<KernelIo<In, Out>>,
        ring: &dyn DeviceRing<In, Out>,
    ) -> Self {
        let enabled = io
            .forward
            .get()
            .is_some_and(|f| f.path() == crate::runtime::io::ForwardPath::Device);
        DeviceForward {
            owner: Arc::as_ptr(io) as *const () as u64,
            enabled,
            cur: None,
            next_try: Instant::now(),
            base: 0,
            broken: false,
            relink_pause: RELINK_PAUSE * ring.host_dilation().max(1),
            looked_at: None,
        }
    }

    /// What `KernelHandle::forwarding` reads: the links that ended and the current one.
    fn publish_count<In: Message, Out: Message>(&self, io: &KernelIo<In, Out>) {
        *io.metrics.forwarded_device.lock() = (
            self.base,
            self.cur.as_ref().map(|l| (l.ring.clone(), l.head0)),
        );
    }

    /// The link ended (phase Free): the host pops the ring again.
    fn finish<In: Message, Out: Message>(
        &mut self,
        io: &KernelIo<In, Out>,
        ring: &mut dyn DeviceRing<In, Out>,
    ) -> Result<(), DeviceError> {
        if let Some(l) = self.cur.take() {
            self.base += l.ring.head().saturating_sub(l.head0);
            self.publish_count(io);
            self.next_try = Instant::now() + self.relink_pause;
            ring.resync_output()?;
        }
        Ok(())
    }

    /// One round: `Ok(true)` when the host owns the output ring (pulls it), `Ok(false)` while
    /// another kernel does (or is about to).
    fn step<In: Message, Out: Message>(
        &mut self,
        io: &KernelIo<In, Out>,
        ring: &mut dyn DeviceRing<In, Out>,
        unlink_timeout: Duration,
    ) -> Result<bool, DeviceError> {
        if self.broken {
            return Ok(false);
        }
        if let Some(l) = &self.cur {
            match l.peer.phase(self.owner) {
                PeerPhase::Requested => return Ok(false),
                PeerPhase::Linked => {
                    // A call's reply reached the head of the ring: the linked kernel stopped
                    // there; take the ring back so the host routes the reply to its caller.
                    if !l.peer.stopped_at_call() {
                        return Ok(false);
                    }
                    return self.unlink(io, ring, unlink_timeout);
                }
                PeerPhase::Broken => {
                    self.broken = true;
                    return Ok(false);
                }
                PeerPhase::Free => {
                    self.finish(io, ring)?;
                    return Ok(true);
                }
            }
        }
        if !self.enabled {
            return Ok(true);
        }
        let Some(f) = io.forward.get() else {
            return Ok(true);
        };
        // Read before the lookup: a kernel registered after this read changes the count, so
        // a lookup that misses it is repeated in the next round.
        let registered = f.registrations();
        let launched_since = self.looked_at.is_some_and(|n| n != registered);
        if !launched_since && Instant::now() < self.next_try {
            return Ok(true);
        }
        self.next_try = Instant::now() + self.relink_pause;
        self.looked_at = None;
        let Ok(port) = f.port() else {
            // Not launched yet: its registration (which publishes its peer slot first, see
            // `RingHost::publish`) is seen in the round after it.
            self.looked_at = Some(registered);
            return Ok(true);
        };
        // A keyed target checks each message's key on the host: it stays host-relayed.
        if port.keys.is_some() {
            return Ok(true);
        }
        let (Some(peer), Some(r)) = (port.device_peer.get().cloned(), ring.output_peer()) else {
            // A target with no peer slot (hosted on the CPU, or of another engine) gets none
            // later; a target of the same id launched again does, and is registered anew.
            self.looked_at = Some(registered);
            return Ok(true);
        };
        // Every output this pump pulled so far has been delivered (deliver runs in the round
        // that pulled it): from here on nobody pops until the consumer takes the ring or the
        // request is cancelled.
        let head0 = r.head();
        if peer.request(r.clone(), self.owner).is_err() {
            return Ok(true);
        }
        self.cur = Some(Link {
            peer,
            ring: r,
            head0,
        });
        self.publish_count(io);
        Ok(false)
    }

    /// Takes the ring back (bounded); `Ok(true)` when the host owns it again.
    fn unlink<In: Message, Out: Message>(
        &mut self,
        io: &KernelIo<In, Out>,
        ring: &mut dyn DeviceRing<In, Out>,
        timeout: Duration,
    ) -> Result<bool, DeviceError> {
        let Some(l) = &self.cur else {
            return Ok(!self.broken);
        };
        if l.peer.unlink(self.owner, timeout).is_err() {
            self.publish_count(io);
            self.broken = true;
            return Ok(false);
        }
        self.finish(io, ring)?;
        Ok(true)
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

    /// The kernel's peer-input slot goes on its input port before the kernel can be found: a
    /// producer that finds it can link at once (the pump sets the same slot again, a no-op).
    fn publish(&self, io: &Arc<KernelIo<In, Out>>) {
        if let Some(p) = self.ring.peer_input() {
            let _ = io.port.device_peer.set(p);
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
        .store(ring.peer_taken() + c.forwarded, Ordering::Relaxed);
}

/// Inputs the pump pushed that the device has not handled yet. Inputs the device took from a
/// producer on the device (CUDA's peer ring: `peer_taken`; wgpu's handed-over batches:
/// `forwarded`) are processed without having been pushed.
fn in_device<In, Out>(pushed: u64, ring: &dyn DeviceRing<In, Out>) -> u64 {
    let c = ring.counters();
    (pushed + ring.peer_taken() + c.forwarded).saturating_sub(c.processed)
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
    // Device-side forwarding: this kernel as a consumer (its peer-input slot, published on its
    // input port for producers to find) and as a producer (its link to its forward target).
    let my_peer = ring.peer_input();
    if let Some(p) = &my_peer {
        let _ = io.port.device_peer.set(p.clone());
    }
    let mut fwd = DeviceForward::new(io, &*ring);
    let unlink_timeout = io.terminate_timeout.mul_f64(0.15);
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
        // Link a requested peer ring once everything accepted before is in the device lanes.
        if let Some(p) = &my_peer {
            p.service(carry.is_empty() && io.input.is_empty());
        }
        let owns_output = match fwd.step(io, &mut *ring, unlink_timeout) {
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
    let stop = ring.stop(io.terminate_timeout.mul_f64(0.75));
    // As a consumer: once the block has ended for good, a linked producer owns its ring again.
    if let Some(p) = &my_peer {
        if stop.is_ok() {
            p.close();
        }
    }
    // As a producer: take the output ring back from the kernel it was forwarded to (bounded);
    // what is left in it is relayed by the host (or reported) like any output.
    // (An `Err` here is a view of the ring that could not be rebuilt: not popped, as if the
    // link had not let go.)
    let owns_output = fwd
        .unlink(io, &mut *ring, unlink_timeout)
        .unwrap_or_default();
    if owns_output {
        loop {
            outs.clear();
            if ring.pull(&mut outs, 4096) == 0 {
                break;
            }
            deliver(&mut out, &mut outs);
        }
    } else if let Some(l) = &fwd.cur {
        // The ring stays with a kernel that did not let go: what is left in it is counted,
        // never silently lost.
        io.metrics
            .late_outputs
            .fetch_add(l.ring.len(), Ordering::Relaxed);
    }
    fwd.publish_count(io);
    answer_none(&mut ring, &out);
    store_counters(io, &*ring);
    // Inputs the device never consumed were sent before those still in `carry`.
    let mut stranded = ring.reclaim();
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
