//! Device-side forwarding between two persistent kernels of one engine: the *consumer* kernel
//! takes a *producer* kernel's output ring as one more input (its control block's peer-input
//! slot), so forwarded messages never pass through the host.
//!
//! Ownership of the producer's output ring's head (its consumer index, one writer at a time)
//! moves in steps, every step decided under [`PeerInput`]'s lock:
//!
//! 1. **Free**: the producer's host pump pops the ring (host relay).
//! 2. [`PeerInput::request`] by the producer's pump: it stops popping (nobody pops).
//! 3. [`PeerInput::service`] by the consumer's pump, when every message accepted into the
//!    consumer's host mailbox before the link is in its device lanes: it writes the slot (ring,
//!    capacity, a new `peer_seq`, release). The kernel adopts it between two batches, re-reads
//!    its lane tails and from then on pops the ring (**Linked**). It gathers its own lanes first,
//!    so the messages relayed by the host before the link are handled before the forwarded ones.
//!    A request the consumer cannot serve within [`LINK_PATIENCE`] is cancelled: back to Free.
//! 4. [`PeerInput::unlink`] (the producer terminates, or the kernel stopped at a `call` reply,
//!    or the producer's target went away): a new `peer_seq` with no ring; the kernel
//!    acknowledges it (`peer_ack`, release, after its last release of the head) between two
//!    batches; the host that acquires the ack owns the head again (Free). A kernel that has
//!    exited for good ([`PeerInput::close`]) needs no acknowledgement. An acknowledgement that
//!    does not come in time leaves the ring with the kernel for good (**Broken**): the host never
//!    pops it again, and the producer counts what is left in it as lost.
//!
//! The producer's memory stays alive while linked: [`PeerRing`] holds the ring's memory.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::control::ControlBlock;
use super::SharedMemory;

/// How long a link request waits for the consumer's host side to have moved every earlier
/// message into the device lanes before it is cancelled (the producer relays meanwhile).
pub const LINK_PATIENCE: Duration = Duration::from_millis(50);

/// A producer kernel's output ring, as the consumer kernel addresses it.
#[derive(Clone)]
pub struct PeerRing {
    /// The ring's memory (header + slots): kept alive while any kernel may read it.
    pub mem: SharedMemory,
    /// Its address as the consumer's kernel sees it.
    pub device_addr: u64,
    /// Slots (a power of two).
    pub capacity: u32,
    /// Bytes per slot: must equal the consumer's input slot.
    pub slot_bytes: usize,
    /// Which engine instance the ring belongs to: only kernels of the same one can link.
    pub engine: u64,
}

impl PeerRing {
    fn header(&self) -> &resident_ring::spsc::RingHeader {
        // SAFETY: the memory is a ring (header first, 128-aligned, checked when it was made)
        // and lives as long as `self.mem`; the header is atomics only.
        unsafe { &*(resident_ring::spsc::RingMemory::as_mut_ptr(&self.mem) as *const _) }
    }

    /// The ring's consumer index as last published (by whichever side owns it).
    pub fn head(&self) -> u64 {
        // Acquire: pairs with the owner's release store of head.
        self.header().head.load(Ordering::Acquire)
    }

    /// Messages in the ring now.
    pub fn len(&self) -> u64 {
        let h = self.head();
        // Acquire: pairs with the producer's release store of tail.
        self.header().tail.load(Ordering::Acquire).saturating_sub(h)
    }

    /// Whether the ring is empty now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a producer's link stands, as its pump polls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerPhase {
    /// The producer owns its ring (no link, or a request was cancelled).
    Free,
    /// Requested; the consumer has not taken the ring yet (nobody pops it).
    Requested,
    /// The consumer kernel pops the ring.
    Linked,
    /// An unlink was not acknowledged in time: the ring stays with the consumer kernel.
    Broken,
}

const P_FREE: u8 = 0;
const P_REQUESTED: u8 = 1;
const P_LINKED: u8 = 2;
const P_BROKEN: u8 = 3;

fn phase_of(v: u8) -> PeerPhase {
    match v {
        P_REQUESTED => PeerPhase::Requested,
        P_LINKED => PeerPhase::Linked,
        P_BROKEN => PeerPhase::Broken,
        _ => PeerPhase::Free,
    }
}

/// Why a link request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkRefused {
    /// The consumer kernel has exited or is exiting.
    #[error("the consumer kernel has ended")]
    Closed,
    /// Another producer is linked (one peer ring per consumer).
    #[error("the consumer already takes another kernel's outputs")]
    Busy,
    /// The rings are of different engines or slot sizes.
    #[error("the rings are not compatible ({0})")]
    Incompatible(&'static str),
}

/// Why an unlink did not hand the ring back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the consumer kernel did not release the forwarded ring within {0:?}")]
pub struct UnlinkTimeout(pub Duration);

struct Inner {
    /// Last `peer_seq` written.
    seq: u32,
    /// The requested or linked ring and its owner token.
    link: Option<(PeerRing, u64)>,
    requested_at: Option<Instant>,
    /// The slot names a ring (written) and its owner.
    written: bool,
    /// Rings a kernel kept after an unlink that was not acknowledged: their memory must
    /// outlive any read the kernel may still make.
    kept: Vec<PeerRing>,
}

/// A consumer kernel's peer-input slot, on the host (one per kernel; shared by the producer's
/// and the consumer's pumps).
pub struct PeerInput {
    control: SharedMemory,
    slot_bytes: usize,
    engine: u64,
    inner: Mutex<Inner>,
    /// Mirror of the phase of the current link, for the producer's cheap poll.
    phase: AtomicU8,
    /// The consumer kernel has exited for good (set by its host after the block ended).
    closed: AtomicBool,
}

impl PeerInput {
    /// The slot of the kernel whose control block is `control`, taking input slots of
    /// `slot_bytes` bytes, on engine instance `engine`.
    pub fn new(control: SharedMemory, slot_bytes: usize, engine: u64) -> Self {
        PeerInput {
            control,
            slot_bytes,
            engine,
            inner: Mutex::new(Inner {
                seq: 0,
                link: None,
                requested_at: None,
                written: false,
                kept: Vec::new(),
            }),
            phase: AtomicU8::new(P_FREE),
            closed: AtomicBool::new(false),
        }
    }

    fn control(&self) -> &ControlBlock {
        // SAFETY: the control block memory (CONTROL_BLOCK_BYTES, 128-aligned, checked when the
        // queues were made) lives as long as `self.control`; atomics only.
        unsafe {
            &*(resident_ring::spsc::RingMemory::as_mut_ptr(&self.control) as *const ControlBlock)
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The producer `owner` asks to have its ring consumed by this kernel. From `Ok` on, the
    /// producer must not pop its ring until [`phase`](Self::phase) says `Free` again.
    pub fn request(&self, ring: PeerRing, owner: u64) -> Result<(), LinkRefused> {
        if ring.engine != self.engine {
            return Err(LinkRefused::Incompatible("different engines"));
        }
        if ring.slot_bytes != self.slot_bytes {
            return Err(LinkRefused::Incompatible("different slot sizes"));
        }
        if !ring.capacity.is_power_of_two() {
            return Err(LinkRefused::Incompatible("capacity not a power of two"));
        }
        let mut g = self.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(LinkRefused::Closed);
        }
        if g.link.is_some() || self.phase.load(Ordering::Relaxed) == P_BROKEN {
            return Err(LinkRefused::Busy);
        }
        g.link = Some((ring, owner));
        g.requested_at = Some(Instant::now());
        g.written = false;
        self.phase.store(P_REQUESTED, Ordering::Release);
        Ok(())
    }

    /// The consumer's pump, every round: links a requested ring once `host_idle` (every input
    /// accepted so far is in the device lanes), or cancels the request after
    /// [`LINK_PATIENCE`].
    pub fn service(&self, host_idle: bool) {
        if self.phase.load(Ordering::Acquire) != P_REQUESTED {
            return;
        }
        let mut g = self.lock();
        if g.written || g.link.is_none() {
            return;
        }
        if host_idle && !self.closed.load(Ordering::Acquire) {
            let (ring, _) = g.link.as_ref().expect("checked");
            let (addr, cap) = (ring.device_addr, ring.capacity);
            g.seq = g.seq.wrapping_add(1).max(1);
            // The lane pushes of this (the consumer's pump) thread happen before this release,
            // so the kernel that adopts the slot sees them when it re-reads its lane tails.
            self.control().set_peer(addr, cap, g.seq);
            g.written = true;
            self.phase.store(P_LINKED, Ordering::Release);
        } else if g.requested_at.is_some_and(|t| t.elapsed() >= LINK_PATIENCE)
            || self.closed.load(Ordering::Acquire)
        {
            g.link = None;
            g.requested_at = None;
            // Release: the producer that sees Free owns its ring again (nobody popped it).
            self.phase.store(P_FREE, Ordering::Release);
        }
    }

    /// The phase of `owner`'s link (`Free` when `owner` has none).
    pub fn phase(&self, owner: u64) -> PeerPhase {
        let p = phase_of(self.phase.load(Ordering::Acquire));
        if p == PeerPhase::Free {
            return p;
        }
        let g = self.lock();
        match &g.link {
            Some((_, o)) if *o == owner => phase_of(self.phase.load(Ordering::Acquire)),
            _ if p == PeerPhase::Broken => PeerPhase::Broken,
            _ => PeerPhase::Free,
        }
    }

    /// Whether the kernel stopped taking from the linked ring at a `call` reply.
    pub fn stopped_at_call(&self) -> bool {
        if self.phase.load(Ordering::Acquire) != P_LINKED {
            return false;
        }
        let seq = self.lock().seq;
        self.control().peer_call_seen() == seq
    }

    /// Takes `owner`'s ring back, waiting at most `timeout` for the kernel's acknowledgement
    /// (or its end). `Ok` once the producer owns its ring again (also when it had no link).
    pub fn unlink(&self, owner: u64, timeout: Duration) -> Result<(), UnlinkTimeout> {
        let mut g = self.lock();
        match &g.link {
            Some((_, o)) if *o == owner => {}
            _ => return Ok(()),
        }
        if !g.written {
            g.link = None;
            g.requested_at = None;
            self.phase.store(P_FREE, Ordering::Release);
            return Ok(());
        }
        g.seq = g.seq.wrapping_add(1).max(1);
        let seq = g.seq;
        self.control().set_peer(0, 0, seq);
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(20);
        loop {
            // Acquire (`peer_ack`): pairs with the kernel's release after its last head store.
            // `closed` (acquire): set after the block ended, so its last store is visible.
            if self.control().peer_ack() == seq || self.closed.load(Ordering::Acquire) {
                g.link = None;
                g.written = false;
                self.phase.store(P_FREE, Ordering::Release);
                return Ok(());
            }
            if Instant::now() >= deadline {
                if let Some((ring, _)) = g.link.take() {
                    g.kept.push(ring);
                }
                self.phase.store(P_BROKEN, Ordering::Release);
                return Err(UnlinkTimeout(timeout));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// The consumer kernel has exited for good (its block ended): whoever is linked owns its
    /// ring again without an acknowledgement; no new link is accepted.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let mut g = self.lock();
        if g.link.is_some() && self.phase.load(Ordering::Relaxed) != P_BROKEN {
            g.link = None;
            g.written = false;
            self.phase.store(P_FREE, Ordering::Release);
        }
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Messages the kernel has taken from peer rings so far (device counter).
    pub fn taken(&self) -> u64 {
        self.control().device_counters().peer_taken
    }
}

pub use resident_cuda::park_order::upstream_first;
