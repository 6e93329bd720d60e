//! Device-side forwarding between two persistent kernels of one CUDA-family engine
//! (`RingKernel::forward_to` without a host hop; the protocol is
//! `crate::persistent::peer`). The consumer offers its peer-input slot on its input
//! port ([`CudaInbox`], the core's `DeviceLink`); the producer's [`Forwarder`], driven by its
//! pump once a round, asks the target's slot to take its output ring and gives the ring back to
//! its host when the link ends.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::persistent::{PeerInput, PeerPhase, PeerRing};
use resident_core::engine::error::DeviceError;
use resident_core::engine::BackendKind;
use resident_core::runtime::host::device::DeviceLink;
use resident_core::runtime::io::{ForwardPath, KernelIo};
use resident_ring::Message;

/// What forwarding needs of a persistent kernel on either launcher: its output ring as a peer
/// ring, and taking the ring's consumer index back.
pub(crate) trait ForwardRing {
    fn output_peer_ring(&self) -> Option<PeerRing>;
    /// # Safety
    /// Only once the link's phase is `Free` (the host is the output ring's only consumer).
    unsafe fn resync_output(&mut self) -> Result<(), DeviceError>;
}

/// Pause between two link attempts of a producer (after a refusal, a cancelled request or a
/// `call` reply that took the ring back). A target that is not there yet is no refusal: it is
/// looked up again as soon as a kernel is registered (`Forwarder::looked_at`): waiting this
/// pause for it instead would relay a whole first chain through the host, which a GPU runs in
/// a few milliseconds, before the first offer after the target appeared.
const RELINK_PAUSE: Duration = Duration::from_millis(20);

/// A CUDA-family kernel's peer-input slot as its input port offers it to producers.
pub(crate) struct CudaInbox {
    /// CUDA or CudaSim: only producers of the same engine look further (the slot itself also
    /// refuses rings of another engine instance).
    pub backend: BackendKind,
    pub peer: Arc<PeerInput>,
}

impl DeviceLink for CudaInbox {
    fn backend(&self) -> BackendKind {
        self.backend
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// A producer's link to its forward target.
struct Link {
    peer: Arc<PeerInput>,
    ring: PeerRing,
    /// The ring's consumer index when the request was made: what the linked kernel took
    /// since is `ring.head() - head0`.
    head0: u64,
}

/// The producer side of device forwarding, driven by the kernel's pump.
pub(crate) struct Forwarder<In, Out> {
    io: Arc<KernelIo<In, Out>>,
    backend: BackendKind,
    owner: u64,
    enabled: bool,
    cur: Option<Link>,
    next_try: Instant,
    /// Messages the linked kernels took in links that ended.
    base: u64,
    /// An unlink was not acknowledged: the ring stays with the other kernel for good.
    broken: bool,
    /// `RELINK_PAUSE`, stretched by the kernel's `host_dilation` (CudaSim's speed model).
    relink_pause: Duration,
    /// How long an unlink waits for the consumer's acknowledgement.
    unlink_timeout: Duration,
    /// The runtime's registration count (`Forward::registrations`) read before the last
    /// attempt that found no target, or a target with no peer slot: a new count means a
    /// kernel was launched since, so the next round tries again at once, pause or not.
    /// `None` after any other outcome.
    looked_at: Option<u64>,
}

impl<In: Message, Out: Message> Forwarder<In, Out> {
    pub fn new(io: &Arc<KernelIo<In, Out>>, backend: BackendKind, host_dilation: u32) -> Self {
        let enabled = io
            .forward_target()
            .is_some_and(|f| f.path() == ForwardPath::Device);
        Forwarder {
            io: io.clone(),
            backend,
            owner: Arc::as_ptr(io) as *const () as u64,
            enabled,
            cur: None,
            next_try: Instant::now(),
            base: 0,
            broken: false,
            relink_pause: RELINK_PAUSE * host_dilation.max(1),
            unlink_timeout: io.terminate_timeout().mul_f64(0.15),
            looked_at: None,
        }
    }

    /// What `KernelHandle::forwarding` reads: the links that ended and the current one.
    fn publish_count(&self) {
        let live = self.cur.as_ref().map(|l| {
            let (ring, head0) = (l.ring.clone(), l.head0);
            Box::new(move || ring.head().saturating_sub(head0)) as Box<dyn Fn() -> u64 + Send>
        });
        self.io.set_forwarded_on_device(self.base, live);
    }

    /// The link ended (phase Free): the host pops the ring again.
    fn finish(&mut self, kernel: &mut impl ForwardRing) -> Result<(), DeviceError> {
        if let Some(l) = self.cur.take() {
            self.base += l.ring.head().saturating_sub(l.head0);
            self.publish_count();
            self.next_try = Instant::now() + self.relink_pause;
            // SAFETY: the link's phase is Free: the consumer kernel acknowledged the unlink
            // (or ended for good), so the host is the ring's only consumer again.
            unsafe { kernel.resync_output() }?;
        }
        Ok(())
    }

    /// One round: `Ok(true)` when the host owns the output ring (pulls it), `Ok(false)` while
    /// another kernel does (or is about to).
    pub fn step(&mut self, kernel: &mut impl ForwardRing) -> Result<bool, DeviceError> {
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
                    return self.unlink(kernel);
                }
                PeerPhase::Broken => {
                    self.broken = true;
                    return Ok(false);
                }
                PeerPhase::Free => {
                    self.finish(kernel)?;
                    return Ok(true);
                }
            }
        }
        if !self.enabled {
            return Ok(true);
        }
        let io = self.io.clone();
        let Some(f) = io.forward_target() else {
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
            // Not launched yet: its registration (which publishes its inbox first, see
            // `RingHost::publish`) is seen in the round after it.
            self.looked_at = Some(registered);
            return Ok(true);
        };
        // A keyed target checks each message's key on the host: it stays host-relayed.
        if port.is_keyed() {
            return Ok(true);
        }
        let inbox = port.device_link.lock().clone();
        let peer = inbox
            .filter(|l| l.backend() == self.backend)
            .and_then(|l| l.into_any().downcast::<CudaInbox>().ok())
            .map(|i| i.peer.clone());
        let (Some(peer), Some(r)) = (peer, kernel.output_peer_ring()) else {
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
        self.publish_count();
        Ok(false)
    }

    /// Takes the ring back (bounded); `Ok(true)` when the host owns it again.
    fn unlink(&mut self, kernel: &mut impl ForwardRing) -> Result<bool, DeviceError> {
        let Some(l) = &self.cur else {
            return Ok(!self.broken);
        };
        if l.peer.unlink(self.owner, self.unlink_timeout).is_err() {
            self.publish_count();
            self.broken = true;
            return Ok(false);
        }
        self.finish(kernel)?;
        Ok(true)
    }

    /// After the kernel stopped: takes the ring back from the kernel it was forwarded to
    /// (bounded); `true` when the host owns it again. A ring that stays with a kernel that did
    /// not let go has what is left in it counted (reported dropped), never silently lost.
    /// (An `Err` of the unlink is a view of the ring that could not be rebuilt: not popped,
    /// as if the link had not let go.)
    pub fn release(&mut self, kernel: &mut impl ForwardRing) -> bool {
        let owns = self.unlink(kernel).unwrap_or_default();
        if !owns {
            if let Some(l) = &self.cur {
                self.io.count_late_outputs(l.ring.len());
            }
        }
        self.publish_count();
        owns
    }
}
