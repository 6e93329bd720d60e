//! A bounded single-producer single-consumer ring whose memory layout can be shared with a GPU.
//!
//! # Layout (the contract with device code)
//! One allocation: a 256-byte [`RingHeader`] followed by `capacity` slots of `T`, slot `i` at
//! index `i & (capacity - 1)`. `head` (written only by the consumer) and `tail` (written only
//! by the producer) are 64-bit, monotonically increasing, each alone on a 128-byte line so the
//! two sides never share a cache line. `tail - head` is the number of filled slots, always in
//! `0 ..= capacity`. Because each index has exactly one writer, no read-modify-write atomic is
//! ever needed: plain acquire loads and release stores suffice, which also holds across PCIe.
//!
//! # Protocol
//! * Producer: write the slot, then store `tail + 1` with `Release`. The consumer's `Acquire`
//!   load of `tail` therefore sees the slot's bytes.
//! * Consumer: read the slot, then store `head + 1` with `Release`. The producer's `Acquire`
//!   load of `head` therefore orders its next write to that slot after our read.
//! * Each side caches the other side's index and re-reads it only when the ring looks full
//!   (producer) or empty (consumer), as `rtrb` does: from a GPU each re-read is a PCIe trip.
//!
//! The types enforce one writer per index: [`Producer`] and [`Consumer`] are not `Clone`, and
//! all their methods take `&mut self`.

use core::marker::PhantomData;
use core::mem::{align_of, size_of};

use crate::sync::{Arc, AtomicU64, Ordering};

/// Size of the ring header in bytes; slots start at this offset.
pub const HEADER_BYTES: usize = 256;

/// The two indices of a ring, each alone on a 128-byte line (256 bytes in all).
#[repr(C, align(128))]
pub struct RingHeader {
    /// Next slot to read. Written only by the consumer; in `tail - capacity ..= tail`.
    pub head: AtomicU64,
    _pad0: [u8; 120],
    /// Next slot to write. Written only by the producer; in `head ..= head + capacity`.
    pub tail: AtomicU64,
    _pad1: [u8; 120],
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<RingHeader>() == HEADER_BYTES);

/// The C declaration of [`RingHeader`] for device code.
pub const RING_HEADER_C_DECL: &str = "typedef struct __attribute__((aligned(128))) {\n    unsigned long long head;\n    unsigned char _pad0[120];\n    unsigned long long tail;\n    unsigned char _pad1[120];\n} RingHeader;\n";

/// Errors building a ring.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RingError {
    /// Capacity must be a power of two and at least 1.
    #[error("ring capacity {0} is not a power of two >= 1")]
    BadCapacity(usize),
    /// The memory handed in is too small or misaligned for the layout.
    #[error(
        "ring memory of {got} bytes at alignment {align} cannot hold {need} bytes aligned to 128"
    )]
    BadMemory {
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        got: usize,
        /// Alignment of the pointer given.
        align: usize,
    },
    /// The slot type is aligned to more than 128 bytes.
    #[error("slot alignment {0} exceeds 128 bytes")]
    BadAlignment(usize),
    /// The ring's memory could not be allocated (too large for this machine).
    #[error("cannot allocate {bytes} bytes for a ring")]
    OutOfMemory {
        /// Bytes asked for.
        bytes: usize,
    },
}

/// Memory a ring lives in: a header followed by slots. Implemented for heap memory here and for
/// pinned, device-mapped host memory by the CUDA backend.
///
/// # Safety
/// `as_mut_ptr` must return the same pointer for the life of the value, valid for reads and
/// writes of `len()` bytes, aligned to at least 128 bytes, and not used by anything else except
/// the device side of the protocol described in this module.
pub unsafe trait RingMemory: Send + Sync + 'static {
    /// Start of the memory.
    fn as_mut_ptr(&self) -> *mut u8;
    /// Size in bytes.
    fn len(&self) -> usize;
    /// Whether the size is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Zeroed, 128-byte aligned heap memory.
pub struct HeapMemory {
    ptr: core::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl HeapMemory {
    /// Allocates `len` zeroed bytes aligned to 128, or [`RingError::OutOfMemory`] when the
    /// allocator refuses (never aborts the process).
    pub fn new(len: usize) -> Result<Self, RingError> {
        let layout = std::alloc::Layout::from_size_align(len.max(HEADER_BYTES), 128)
            .map_err(|_| RingError::OutOfMemory { bytes: len })?;
        // SAFETY: the layout has non-zero size (at least HEADER_BYTES).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = core::ptr::NonNull::new(raw).ok_or(RingError::OutOfMemory { bytes: len })?;
        Ok(HeapMemory { ptr, layout })
    }
}

impl Drop for HeapMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: HeapMemory owns its allocation; the ring protocol synchronizes all access to it.
unsafe impl Send for HeapMemory {}
// SAFETY: as above; shared access goes through the atomics of the header.
unsafe impl Sync for HeapMemory {}

// SAFETY: the pointer is fixed for the value's life, 128-aligned, `len` bytes, owned by us.
unsafe impl RingMemory for HeapMemory {
    fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

/// Bytes a ring of `capacity` slots of `T` needs (header included).
pub const fn ring_bytes<T>(capacity: usize) -> usize {
    HEADER_BYTES.saturating_add(capacity.saturating_mul(size_of::<T>()))
}

/// Where the header and slots live. Normally a raw allocation; under loom, model-checked
/// atomics and cells (loom cannot see through raw memory).
#[cfg(not(loom))]
struct Storage<T> {
    mem: Box<dyn RingMemory>,
    /// `mem`'s header, cached so the hot path makes no dynamic call.
    header: *const RingHeader,
    /// First slot, cached likewise.
    slots: *mut T,
    _t: PhantomData<T>,
}

#[cfg(not(loom))]
impl<T: Copy> Storage<T> {
    fn new(mem: Box<dyn RingMemory>) -> Self {
        let base = mem.as_mut_ptr();
        // SAFETY: `with_memory` checked that the memory holds the header and the slots;
        // HEADER_BYTES is a multiple of T's alignment (at most 128).
        let slots = unsafe { base.add(HEADER_BYTES) as *mut T };
        Storage {
            mem,
            header: base as *const RingHeader,
            slots,
            _t: PhantomData,
        }
    }
    #[inline]
    fn header(&self) -> &RingHeader {
        // SAFETY: the memory is at least HEADER_BYTES, 128-aligned (checked in `with_memory`),
        // lives as long as `self`, and RingHeader is two atomics plus padding, valid for any
        // bit pattern.
        unsafe { &*self.header }
    }
}

#[cfg(loom)]
struct Storage<T> {
    header: RingHeader,
    slots: Box<[loom::cell::UnsafeCell<Option<T>>]>,
}

#[cfg(loom)]
impl<T: Copy> Storage<T> {
    #[inline]
    fn header(&self) -> &RingHeader {
        &self.header
    }
    #[inline]
    unsafe fn write(&self, index: usize, value: T) {
        self.slots[index].with_mut(|p| *p = Some(value))
    }
    #[inline]
    unsafe fn read(&self, index: usize) -> T {
        self.slots[index].with(|p| (*p).expect("read of an unwritten slot"))
    }
}

/// The shared part of a ring; both halves hold an `Arc` of it.
pub struct Ring<T> {
    storage: Storage<T>,
    capacity: usize,
    mask: u64,
}

// SAFETY: slots are handed from one thread to the other through the release/acquire protocol
// on head and tail; T: Send is required to move values across threads.
unsafe impl<T: Copy + Send> Send for Ring<T> {}
// SAFETY: as above; concurrent access is limited to one producer and one consumer.
unsafe impl<T: Copy + Send> Sync for Ring<T> {}

impl<T: Copy + Send> Ring<T> {
    /// A ring of `capacity` (a power of two) slots on the heap, split into its two halves.
    ///
    /// ```
    /// use resident_ring::spsc::Ring;
    /// let (mut tx, mut rx) = Ring::<u32>::new(4).unwrap();
    /// assert!(tx.push(7).is_ok());
    /// assert_eq!(rx.pop(), Some(7));
    /// assert_eq!(rx.pop(), None);
    /// ```
    #[allow(clippy::new_ret_no_self)] // a ring is used through its two halves
    pub fn new(capacity: usize) -> Result<(Producer<T>, Consumer<T>), RingError> {
        #[cfg(not(loom))]
        {
            check_capacity::<T>(capacity)?;
            let bytes = ring_bytes::<T>(capacity);
            // SAFETY: fresh memory that nothing else can reach: this ring is its only user.
            unsafe { Self::with_memory(capacity, Box::new(HeapMemory::new(bytes)?)) }
        }
        #[cfg(loom)]
        {
            check_capacity::<T>(capacity)?;
            let storage = Storage {
                header: RingHeader {
                    head: AtomicU64::new(0),
                    _pad0: [0; 120],
                    tail: AtomicU64::new(0),
                    _pad1: [0; 120],
                },
                slots: (0..capacity)
                    .map(|_| loom::cell::UnsafeCell::new(None))
                    .collect(),
            };
            Ok(Self::split(Ring {
                storage,
                capacity,
                mask: capacity as u64 - 1,
            }))
        }
    }

    /// A ring in caller-provided memory (for example pinned, device-mapped host memory that a
    /// GPU kernel consumes). The memory's current header values are taken as the starting
    /// indices, so zeroed memory gives an empty ring.
    ///
    /// # Safety
    /// One writer per index: for as long as the returned halves live, no other ring half and
    /// no other host-side view may read or write this memory's header or slots (the device
    /// side of the protocol excepted). Building two rings over one memory would give two
    /// producers of one ring, which loses messages.
    #[cfg(not(loom))]
    pub unsafe fn with_memory(
        capacity: usize,
        mem: Box<dyn RingMemory>,
    ) -> Result<(Producer<T>, Consumer<T>), RingError> {
        check_capacity::<T>(capacity)?;
        check_memory(ring_bytes::<T>(capacity), &*mem)?;
        let storage = Storage::new(mem);
        Ok(Self::split(Ring {
            storage,
            capacity,
            mask: capacity as u64 - 1,
        }))
    }

    fn split(ring: Ring<T>) -> (Producer<T>, Consumer<T>) {
        let ring = Arc::new(ring);
        let head = ring.storage.header().head.load(Ordering::Acquire);
        let tail = ring.storage.header().tail.load(Ordering::Acquire);
        (
            Producer {
                at: Access::of(&ring),
                ring: ring.clone(),
                tail,
                cached_head: head,
            },
            Consumer {
                at: Access::of(&ring),
                ring,
                head,
                cached_tail: tail,
            },
        )
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Filled slots as seen now (a snapshot; either side may move right after).
    pub fn len(&self) -> usize {
        let h = self.storage.header();
        // Load head first: tail only grows, so `tail >= head` for the values we read.
        let head = h.head.load(Ordering::Acquire);
        let tail = h.tail.load(Ordering::Acquire);
        tail.saturating_sub(head) as usize
    }

    /// Whether the ring looks empty now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Address of the memory (header first) when it is a raw allocation; for handing to a device.
    #[cfg(not(loom))]
    pub fn memory(&self) -> &dyn RingMemory {
        &*self.storage.mem
    }
}

/// Checks that `mem` holds `need` bytes aligned to 128, as every layout over shared memory
/// needs (this ring's, and the CUDA engine's input lanes).
#[cfg(not(loom))]
pub fn check_memory(need: usize, mem: &dyn RingMemory) -> Result<(), RingError> {
    let align = 1usize << (mem.as_mut_ptr() as usize).trailing_zeros().min(12);
    if mem.len() < need || align < 128 {
        return Err(RingError::BadMemory {
            need,
            got: mem.len(),
            align,
        });
    }
    Ok(())
}

fn check_capacity<T>(capacity: usize) -> Result<(), RingError> {
    if capacity == 0 || !capacity.is_power_of_two() {
        return Err(RingError::BadCapacity(capacity));
    }
    if align_of::<T>() > 128 {
        return Err(RingError::BadAlignment(align_of::<T>()));
    }
    Ok(())
}

/// Where a half reads and writes: the ring's header and slots, mask and capacity.
struct Access<T> {
    #[cfg(not(loom))]
    header: *const RingHeader,
    #[cfg(not(loom))]
    slots: *mut T,
    mask: u64,
    cap: u64,
    _t: PhantomData<T>,
}

impl<T: Copy> Access<T> {
    fn of(ring: &Ring<T>) -> Self {
        Access {
            #[cfg(not(loom))]
            header: ring.storage.header,
            #[cfg(not(loom))]
            slots: ring.storage.slots,
            mask: ring.mask,
            cap: ring.capacity as u64,
            _t: PhantomData,
        }
    }
}

// SAFETY: the pointers point into the ring's memory, which the half's `Arc<Ring>` keeps alive;
// the protocol (one writer per index, release/acquire) makes moving a half across threads sound.
unsafe impl<T: Copy + Send> Send for Producer<T> {}
// SAFETY: as above.
unsafe impl<T: Copy + Send> Send for Consumer<T> {}

macro_rules! access_methods {
    () => {
        #[inline]
        fn hdr(&self) -> &RingHeader {
            #[cfg(not(loom))]
            // SAFETY: the header lives as long as `self.ring` (see `Storage::header`).
            return unsafe { &*self.at.header };
            #[cfg(loom)]
            return self.ring.storage.header();
        }
        /// # Safety
        /// Slot `pos` must be owned by the caller's side (see the protocol above).
        #[inline]
        #[allow(dead_code)] // each half uses one of `put` / `get`
        unsafe fn put(&self, pos: u64, v: T) {
            #[cfg(not(loom))]
            self.at.slots.add((pos & self.at.mask) as usize).write(v);
            #[cfg(loom)]
            self.ring.storage.write((pos & self.at.mask) as usize, v);
        }
        /// # Safety
        /// Slot `pos` must be owned by the caller's side and initialized.
        #[inline]
        #[allow(dead_code)] // each half uses one of `put` / `get`
        unsafe fn get(&self, pos: u64) -> T {
            #[cfg(not(loom))]
            return self.at.slots.add((pos & self.at.mask) as usize).read();
            #[cfg(loom)]
            return self.ring.storage.read((pos & self.at.mask) as usize);
        }
    };
}

/// The writing half of a ring. Exactly one exists per ring.
pub struct Producer<T> {
    ring: Arc<Ring<T>>,
    /// Copies of the ring's geometry and pointers, so the hot path makes one hop (as rtrb).
    at: Access<T>,
    /// Our own `tail` (we are its only writer, so this copy is always exact).
    tail: u64,
    /// Last `head` we read; may be stale (too small), which only makes the ring look fuller.
    cached_head: u64,
}

impl<T: Copy + Send> Producer<T> {
    access_methods!();

    /// Free slots, re-reading the consumer's index only if the cached one shows none free.
    #[inline]
    fn free_slots(&mut self, want: usize) -> usize {
        let cap = self.at.cap;
        let mut free = cap - (self.tail - self.cached_head);
        if free < want as u64 {
            // Acquire: pairs with the consumer's Release store of head, so its reads of the
            // slots we are about to overwrite happened before our writes.
            self.cached_head = self.hdr().head.load(Ordering::Acquire);
            free = cap - (self.tail - self.cached_head);
        }
        free as usize
    }

    /// Appends one value; hands it back when the ring is full.
    #[inline]
    pub fn push(&mut self, value: T) -> Result<(), T> {
        if self.free_slots(1) == 0 {
            return Err(value);
        }
        // SAFETY: tail - head < capacity, so slot `tail` is not visible to the consumer.
        unsafe { self.put(self.tail, value) };
        self.tail += 1;
        // Release: publishes the slot's bytes to the consumer's Acquire load of tail.
        self.hdr().tail.store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Appends as many leading values of `values` as fit, with one index publication for the
    /// whole batch. Returns how many were written.
    #[inline]
    pub fn push_slice(&mut self, values: &[T]) -> usize {
        let n = self.free_slots(values.len()).min(values.len());
        if n == 0 {
            return 0;
        }
        for (i, v) in values[..n].iter().enumerate() {
            // SAFETY: the n slots after tail are free (checked above) and unseen by the consumer.
            unsafe { self.put(self.tail + i as u64, *v) };
        }
        self.tail += n as u64;
        // Release: publishes all n slots at once.
        self.hdr().tail.store(self.tail, Ordering::Release);
        n
    }

    /// Free slots as seen now (re-reads the consumer's index).
    pub fn slots(&mut self) -> usize {
        self.free_slots(usize::MAX)
    }

    /// A shared reference to the ring, for observers that only read its length.
    #[cfg(not(loom))]
    pub fn ring_arc(&self) -> Arc<Ring<T>> {
        self.ring.clone()
    }

    /// The shared ring.
    pub fn ring(&self) -> &Ring<T> {
        &self.ring
    }
}

/// The reading half of a ring. Exactly one exists per ring.
pub struct Consumer<T> {
    ring: Arc<Ring<T>>,
    /// Copies of the ring's geometry and pointers, so the hot path makes one hop (as rtrb).
    at: Access<T>,
    /// Our own `head` (exact: we are its only writer).
    head: u64,
    /// Last `tail` we read; may be stale (too small), which only makes the ring look emptier.
    cached_tail: u64,
}

impl<T: Copy + Send> Consumer<T> {
    access_methods!();

    /// Filled slots, re-reading the producer's index only if the cached one shows fewer than `want`.
    #[inline]
    fn filled(&mut self, want: usize) -> usize {
        let mut filled = self.cached_tail - self.head;
        if filled < want as u64 {
            // Acquire: pairs with the producer's Release store of tail, so the slots' bytes
            // are visible before we read them.
            self.cached_tail = self.hdr().tail.load(Ordering::Acquire);
            filled = self.cached_tail - self.head;
        }
        filled as usize
    }

    /// Removes the oldest value, if any.
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        if self.filled(1) == 0 {
            return None;
        }
        // SAFETY: head < tail, so slot `head` was published by the producer and is ours.
        let v = unsafe { self.get(self.head) };
        self.head += 1;
        // Release: our read of the slot happens before the producer may overwrite it.
        self.hdr().head.store(self.head, Ordering::Release);
        Some(v)
    }

    /// Looks at the oldest value without removing it.
    pub fn peek(&mut self) -> Option<T> {
        if self.filled(1) == 0 {
            return None;
        }
        // SAFETY: as in `pop`; the slot stays ours until we advance head.
        Some(unsafe { self.get(self.head) })
    }

    /// Moves up to `max` values to the end of `out`, with one index publication for the batch.
    /// Returns how many were moved.
    #[inline]
    pub fn pop_into(&mut self, out: &mut Vec<T>, max: usize) -> usize {
        let n = self.filled(max).min(max);
        if n == 0 {
            return 0;
        }
        out.reserve(n);
        for i in 0..n as u64 {
            // SAFETY: the n slots after head were published by the producer.
            out.push(unsafe { self.get(self.head + i) });
        }
        self.head += n as u64;
        // Release: all n reads happen before the producer may reuse those slots.
        self.hdr().head.store(self.head, Ordering::Release);
        n
    }

    /// Hands up to `max` values to `f` in order, with one index publication for the batch.
    /// Returns how many were handed over.
    #[inline]
    pub fn pop_each(&mut self, max: usize, mut f: impl FnMut(T)) -> usize {
        let n = self.filled(max).min(max);
        if n == 0 {
            return 0;
        }
        for i in 0..n as u64 {
            // SAFETY: the n slots after head were published by the producer and stay ours
            // until the store of head below.
            f(unsafe { self.get(self.head + i) });
        }
        self.head += n as u64;
        // Release: all n reads happen before the producer may reuse those slots.
        self.hdr().head.store(self.head, Ordering::Release);
        n
    }

    /// Filled slots as seen now (re-reads the producer's index).
    pub fn slots(&mut self) -> usize {
        self.filled(usize::MAX)
    }

    /// The shared ring.
    pub fn ring(&self) -> &Ring<T> {
        &self.ring
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_capacity() {
        assert_eq!(Ring::<u8>::new(0).err(), Some(RingError::BadCapacity(0)));
        assert_eq!(Ring::<u8>::new(3).err(), Some(RingError::BadCapacity(3)));
    }

    #[test]
    fn rejects_small_memory() {
        // SAFETY: fresh memory, used by this ring only.
        let err = unsafe {
            Ring::<u64>::with_memory(8, Box::new(HeapMemory::new(HEADER_BYTES + 8).unwrap()))
        }
        .err();
        assert!(
            matches!(err, Some(RingError::BadMemory { need: 320, .. })),
            "{err:?}"
        );
    }

    #[test]
    fn fifo_full_and_empty() {
        let (mut tx, mut rx) = Ring::<u32>::new(4).unwrap();
        for i in 0..4 {
            tx.push(i).unwrap();
        }
        assert_eq!(tx.push(99), Err(99));
        assert_eq!(rx.peek(), Some(0));
        for i in 0..4 {
            assert_eq!(rx.pop(), Some(i));
        }
        assert_eq!(rx.pop(), None);
    }

    #[test]
    fn batches_wrap_around() {
        let (mut tx, mut rx) = Ring::<u64>::new(8).unwrap();
        let mut out = Vec::new();
        let mut next = 0u64;
        let mut expect = 0u64;
        for round in 0..100 {
            let batch: Vec<u64> = (next..next + (round % 7) + 1).collect();
            let n = tx.push_slice(&batch);
            next += n as u64;
            out.clear();
            rx.pop_into(&mut out, 5);
            for v in &out {
                assert_eq!(*v, expect);
                expect += 1;
            }
        }
        out.clear();
        rx.pop_into(&mut out, usize::MAX);
        for v in &out {
            assert_eq!(*v, expect);
            expect += 1;
        }
        assert_eq!(expect, next);
    }

    #[test]
    fn header_offsets_match_c() {
        assert_eq!(core::mem::offset_of!(RingHeader, head), 0);
        assert_eq!(core::mem::offset_of!(RingHeader, tail), 128);
    }

    #[test]
    fn cross_thread_checksum() {
        const N: u64 = 200_000;
        let (mut tx, mut rx) = Ring::<u64>::new(64).unwrap();
        let t = std::thread::spawn(move || {
            let mut i = 0;
            while i < N {
                if tx.push(i).is_ok() {
                    i += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut expect = 0;
        let mut out = Vec::with_capacity(64);
        while expect < N {
            out.clear();
            rx.pop_into(&mut out, 64);
            for v in &out {
                assert_eq!(*v, expect);
                expect += 1;
            }
        }
        t.join().unwrap();
    }
}
