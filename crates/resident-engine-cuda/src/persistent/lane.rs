//! An input lane in the LL format: the host's writer and the reader that takes unconsumed
//! slots back.
//!
//! # Layout (the contract with the kernel template, `kernels/persistent_ring.cu`)
//! A lane is a [`RingHeader`] (256 bytes: `head`, written by the kernel; `tail`, written here)
//! followed by `capacity` slots. A slot holds one `Slot<In>` of `S` bytes (a multiple of 8) as
//! `S / 8` chunks of 16 bytes: chunk `g` carries the slot's 8-byte word `g` in two 8-byte
//! halves, each `data32 | flag << 32`, the low 32 bits of the word in the first half. The flag
//! is the slot's position + 1, modulo 2^32: zeroed memory holds no message, and a slot's flag
//! differs from the one its previous lap left (a lane holds fewer than 2^32 slots).
//!
//! # Why
//! Only an aligned 8-byte access is single-copy atomic across PCIe. With a flag in every 8
//! bytes (NCCL's LL protocol does the same), a reader that sees the flag it expects in a half
//! sees that half's data from the same store, however the bus splits or orders its reads. So
//! the kernel polls the next slot itself, and one bus read both finds the message and delivers
//! it; a tail read first and the slot after it would be two round trips.
//!
//! # Protocol
//! * Writer: room from an acquire load of `head` (the kernel's reads of a slot happen before
//!   its release store of the head that frees it); each half stored with a relaxed 8-byte
//!   atomic store (order among them does not matter: each half validates itself); then `tail`
//!   with a release store, which the kernel reads in the same round trip as the head slot to
//!   learn whether more slots follow, and which orders those slots before its fence.
//! * The kernel may take a slot by its flags before the tail covering it is stored, so the
//!   published head may run ahead of the published tail for a moment; every reader of the two
//!   (`len`, the kernel's cached tail) saturates at zero.

use core::marker::PhantomData;
use core::mem::size_of;
use core::sync::atomic::{AtomicU64, Ordering};

use bytemuck::Pod;
use resident_ring::spsc::{check_memory, RingError, RingHeader, RingMemory, HEADER_BYTES};
use resident_ring::{Envelope, Slot};

use super::SharedMemory;

/// Bytes one lane slot of `Slot<In>` takes: twice the slot (a flag in every 8 bytes).
pub const fn lane_slot_bytes<In>() -> usize {
    2 * size_of::<Slot<In>>()
}

/// Bytes a lane of `capacity` slots of `Slot<In>` needs, header included.
pub const fn lane_bytes<In>(capacity: usize) -> usize {
    HEADER_BYTES.saturating_add(capacity.saturating_mul(lane_slot_bytes::<In>()))
}

/// The flag of the slot at position `pos`.
#[inline]
fn flag(pos: u64) -> u64 {
    (pos.wrapping_add(1) as u32 as u64) << 32
}

/// One lane's memory and geometry, shared by the writer and the reclaiming reader.
struct LaneMemory<In> {
    mem: SharedMemory,
    /// Slots (a power of two).
    cap: u64,
    _t: PhantomData<fn(In)>,
}

impl<In: Pod> LaneMemory<In> {
    fn header(&self) -> &RingHeader {
        // SAFETY: the memory is at least `lane_bytes(cap)` bytes and 128-aligned (checked by
        // `LaneWriter::new`), lives as long as `self.mem`, and RingHeader is two atomics and
        // padding, valid for any bit pattern.
        unsafe { &*(self.mem.as_mut_ptr() as *const RingHeader) }
    }

    /// The 8-byte half `i` of slot `pos`'s chunks (`i` in `0..S/4`).
    #[inline]
    fn half(&self, pos: u64, i: usize) -> &AtomicU64 {
        let slot = (pos & (self.cap - 1)) as usize;
        let off = HEADER_BYTES + slot * lane_slot_bytes::<In>() + 8 * i;
        // SAFETY: `off + 8 <= lane_bytes(cap)` (slot < cap, i < S/4 = lane_slot_bytes/8), the
        // base is 128-aligned and every offset a multiple of 8, so this is an aligned u64 in
        // memory the lane owns; the kernel and this lane's host side access it only atomically
        // (8-byte system-scope loads and stores), so treating it as an AtomicU64 is sound.
        unsafe { AtomicU64::from_ptr(self.mem.as_mut_ptr().add(off) as *mut u64) }
    }

    /// Every 8-byte half of slot `pos`'s chunks, in order (`S / 4` of them): one bounds
    /// computation per slot instead of one per half.
    #[inline]
    fn halves(&self, pos: u64) -> &[AtomicU64] {
        let slot = (pos & (self.cap - 1)) as usize;
        let off = HEADER_BYTES + slot * lane_slot_bytes::<In>();
        // SAFETY: as `half`: the slot's `lane_slot_bytes` bytes lie inside the lane's
        // `lane_bytes(cap)` (slot < cap), start 8-aligned (128-aligned base, every offset a
        // multiple of 8), and are accessed only atomically by the kernel and this lane's host
        // side, so they are `lane_slot_bytes / 8` AtomicU64s for the memory's life.
        unsafe {
            core::slice::from_raw_parts(
                self.mem.as_mut_ptr().add(off) as *const AtomicU64,
                lane_slot_bytes::<In>() / 8,
            )
        }
    }
}

/// A `Slot<In>` as its 8-byte words into `words` (`size_of::<Slot<In>>() / 8` long), the
/// tail padding zero: copied field by field, so no padding byte is ever read. Word `g` holds
/// bytes `8g..8g + 8` in little-endian order, whatever the host's order (the kernel's).
fn slot_words<In: Pod>(slot: &Slot<In>, words: &mut [u64]) {
    slot_bytes(slot, bytemuck::cast_slice_mut(words));
    for w in words.iter_mut() {
        *w = u64::from_le(*w);
    }
}

/// A `Slot<In>`'s bytes into `buf` (`size_of::<Slot<In>>()` long), the tail padding zero:
/// copied field by field, so no padding byte is ever read.
pub(super) fn slot_bytes<In: Pod>(slot: &Slot<In>, buf: &mut [u8]) {
    let env = bytemuck::bytes_of(&slot.env);
    let payload = bytemuck::bytes_of(&slot.payload);
    let (head, rest) = buf.split_at_mut(env.len());
    head.copy_from_slice(env);
    let (body, pad) = rest.split_at_mut(payload.len());
    body.copy_from_slice(payload);
    pad.fill(0);
}

/// The `Slot<In>` made of `words` (the inverse of [`slot_bytes`], word by word).
fn slot_of<In: Pod>(words: &[u64]) -> Slot<In> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    slot_from_bytes(&bytes)
}

/// The `Slot<In>` whose bytes are `bytes` (the inverse of [`slot_bytes`]; at least
/// `size_of::<Slot<In>>()` long).
pub(super) fn slot_from_bytes<In: Pod>(bytes: &[u8]) -> Slot<In> {
    let env_len = size_of::<Envelope>();
    Slot {
        env: bytemuck::pod_read_unaligned(&bytes[..env_len]),
        payload: bytemuck::pod_read_unaligned(&bytes[env_len..env_len + size_of::<In>()]),
    }
}

/// The host's writer of one input lane. Exactly one exists per lane (not `Clone`; every method
/// that writes takes `&mut self`), so `tail` has one writer.
pub struct LaneWriter<In> {
    lane: LaneMemory<In>,
    /// Our own tail (exact: we are its only writer).
    tail: u64,
    /// The kernel's head as last read (maybe stale = smaller: the lane only looks fuller).
    cached_head: u64,
    /// A slot's words, reused.
    words: Vec<u64>,
}

impl<In: Pod> LaneWriter<In> {
    /// The writer of a lane of `capacity` slots in `mem`, starting at the indices in its header
    /// (zeroed memory: an empty lane).
    ///
    /// # Safety
    /// One writer per lane: while this writer lives, nothing else on the host writes this
    /// memory's header or slots (the kernel plays the reader).
    pub unsafe fn new(mem: SharedMemory, capacity: usize) -> Result<Self, RingError> {
        if capacity == 0 || !capacity.is_power_of_two() {
            return Err(RingError::BadCapacity(capacity));
        }
        check_memory(lane_bytes::<In>(capacity), &mem)?;
        let lane = LaneMemory {
            mem,
            cap: capacity as u64,
            _t: PhantomData,
        };
        let tail = lane.header().tail.load(Ordering::Acquire);
        let cached_head = lane.header().head.load(Ordering::Acquire).min(tail);
        Ok(LaneWriter {
            lane,
            tail,
            cached_head,
            words: vec![0; size_of::<Slot<In>>() / 8],
        })
    }

    /// Free slots, re-reading the kernel's head only when the cached one shows fewer than
    /// `want`.
    fn free(&mut self, want: usize) -> usize {
        let cap = self.lane.cap;
        let mut used = self.tail - self.cached_head;
        if cap - used < want as u64 {
            // Acquire: pairs with the kernel's release store of head, so its reads of the
            // slots we are about to overwrite happened before our stores. The head never
            // passes our own tail (the kernel takes only slots we wrote).
            self.cached_head = self
                .lane
                .header()
                .head
                .load(Ordering::Acquire)
                .min(self.tail);
            used = self.tail - self.cached_head;
        }
        (cap - used) as usize
    }

    /// Appends as many leading slots of `slots` as fit, then publishes the tail once. Returns
    /// how many were written.
    pub fn push_slice(&mut self, slots: &[Slot<In>]) -> usize {
        let n = self.free(slots.len()).min(slots.len());
        if n == 0 {
            return 0;
        }
        let mut words = core::mem::take(&mut self.words);
        for (i, s) in slots[..n].iter().enumerate() {
            let pos = self.tail + i as u64;
            let f = flag(pos);
            slot_words(s, &mut words);
            for (half, &w) in self.lane.halves(pos).chunks_exact(2).zip(words.iter()) {
                // Relaxed: each half carries its own flag; the kernel accepts a half only with
                // the flag of this position, so no order among them is needed. The slot is
                // free (checked above): the kernel does not read it before these stores.
                half[0].store((w & 0xffff_ffff) | f, Ordering::Relaxed);
                half[1].store((w >> 32) | f, Ordering::Relaxed);
            }
        }
        self.words = words;
        self.tail += n as u64;
        // Release: the slots' stores are visible to whoever acquires this tail.
        self.lane.header().tail.store(self.tail, Ordering::Release);
        n
    }

    /// Appends one slot; false when the lane is full.
    pub fn push(&mut self, slot: Slot<In>) -> bool {
        self.push_slice(core::slice::from_ref(&slot)) == 1
    }

    /// Slots written and not yet taken by the kernel, as published now.
    pub fn len(&self) -> usize {
        let h = self.lane.header();
        let head = h.head.load(Ordering::Acquire);
        self.tail.saturating_sub(head) as usize
    }

    /// Whether the kernel has taken every slot written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes back, in order, every slot written and not taken, and marks them taken.
    ///
    /// # Safety
    /// The kernel must have stopped reading the lane for good (it exited, or its thread or
    /// launch is gone): the host then plays the reader on memory nobody else reads.
    pub unsafe fn reclaim(&mut self) -> Vec<Slot<In>> {
        let h = self.lane.header();
        let head = h.head.load(Ordering::Acquire).min(self.tail);
        let w = size_of::<Slot<In>>() / 8;
        let mut words = vec![0u64; w];
        let mut out = Vec::with_capacity((self.tail - head) as usize);
        for pos in head..self.tail {
            for (g, word) in words.iter_mut().enumerate() {
                let lo = self.lane.half(pos, 2 * g).load(Ordering::Relaxed);
                let hi = self.lane.half(pos, 2 * g + 1).load(Ordering::Relaxed);
                *word = (lo & 0xffff_ffff) | (hi << 32);
            }
            out.push(slot_of(&words));
        }
        // Release: as the kernel's head; the slots are ours to reuse now.
        h.head.store(self.tail, Ordering::Release);
        self.cached_head = self.tail;
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use resident_ring::spsc::HeapMemory;

    use super::*;

    fn lane<In: Pod>(cap: usize) -> (LaneWriter<In>, SharedMemory) {
        let mem = SharedMemory(Arc::new(HeapMemory::new(lane_bytes::<In>(cap)).unwrap()));
        // SAFETY: fresh memory; this test plays the kernel only through `raw` reads below.
        (unsafe { LaneWriter::new(mem.clone(), cap).unwrap() }, mem)
    }

    /// Reads slot `pos` as the kernel does: `None` while any half's flag is not pos + 1.
    fn kernel_read<In: Pod>(mem: &SharedMemory, cap: usize, pos: u64) -> Option<Slot<In>> {
        let l = LaneMemory::<In> {
            mem: mem.clone(),
            cap: cap as u64,
            _t: PhantomData,
        };
        let w = size_of::<Slot<In>>() / 8;
        let mut words = vec![0u64; w];
        for (g, word) in words.iter_mut().enumerate() {
            let a = l.half(pos, 2 * g).load(Ordering::Relaxed);
            let b = l.half(pos, 2 * g + 1).load(Ordering::Relaxed);
            if a >> 32 != (pos + 1) as u32 as u64 || b >> 32 != (pos + 1) as u32 as u64 {
                return None;
            }
            *word = (a & 0xffff_ffff) | (b << 32);
        }
        Some(slot_of(&words))
    }

    #[test]
    fn slots_round_trip_with_flags_and_padding() {
        // A 4-byte payload: Slot<u32> is 40 bytes with 4 bytes of tail padding.
        let (mut w, mem) = lane::<u32>(4);
        assert_eq!(lane_slot_bytes::<u32>(), 80);
        let s = |i: u64| Slot::new(Envelope::new(i, 200, i * 3), 0xdead_0000 + i as u32);
        assert_eq!(w.push_slice(&[s(1), s(2), s(3)]), 3);
        assert!(
            kernel_read::<u32>(&mem, 4, 3).is_none(),
            "slot 3 was not written"
        );
        for i in 0..3 {
            assert_eq!(kernel_read::<u32>(&mem, 4, i), Some(s(i + 1)));
        }
        assert_eq!(w.len(), 3);
        // The fourth fits, a fifth does not until the kernel moves its head.
        assert!(w.push(s(4)));
        assert!(!w.push(s(5)));
        w.lane.header().head.store(2, Ordering::Release);
        assert!(w.push(s(5)));
        // Slot 0's memory now holds position 4: position 0's flag no longer matches.
        assert!(kernel_read::<u32>(&mem, 4, 0).is_none());
        assert_eq!(kernel_read::<u32>(&mem, 4, 4), Some(s(5)));
        // SAFETY: no kernel reads this lane.
        let back = unsafe { w.reclaim() };
        assert_eq!(back, vec![s(3), s(4), s(5)]);
        assert!(w.is_empty());
    }

    #[test]
    fn head_ahead_of_tail_is_not_negative() {
        // The kernel may take a slot by its flags and publish its head before our tail store
        // of a later push is seen; a head beyond our tail is clamped, never underflows.
        let (mut w, _mem) = lane::<u64>(8);
        w.lane.header().head.store(5, Ordering::Release);
        assert_eq!(w.len(), 0);
        assert_eq!(w.free(9), 8);
    }

    #[test]
    fn bad_geometry_is_a_typed_error() {
        let mem = SharedMemory(Arc::new(HeapMemory::new(300).unwrap()));
        // SAFETY: fresh memory, refused before any use.
        let e = unsafe { LaneWriter::<u64>::new(mem.clone(), 3) }.err();
        assert_eq!(e, Some(RingError::BadCapacity(3)));
        // SAFETY: as above.
        let e = unsafe { LaneWriter::<u64>::new(mem, 4) }.err();
        assert!(matches!(e, Some(RingError::BadMemory { .. })), "{e:?}");
    }
}
