//! Queue memory taken without a driver call: pinned, device-mapped host memory reserved in
//! chunks and handed out in 128-byte-aligned pieces.
//!
//! Allocating pinned memory (`cuMemHostAlloc`) and freeing it (`cuMemFreeHost`) wait for every
//! kernel of the context ([`crate::hazards`]), so they never return while a ring kernel is
//! resident. A launch takes its queues from the arena instead: only when no chunk has room does
//! it grow, a synchronizing call the launcher makes with the resident kernels parked. Pieces go
//! back to their chunk when the last holder drops them; chunks stay reserved for the context's
//! life (freed with it), so ending a kernel makes no driver call either. The same arena serves
//! the GPU launcher (chunks of pinned memory) and CudaSim (heap chunks,
//! the growth checked by its driver model).

use std::sync::{Arc, Mutex};

use resident_ring::spsc::RingMemory;

/// Alignment of every piece (the queues' requirement).
pub const ALIGN: usize = 128;

/// The least bytes one chunk reserves.
pub const CHUNK_BYTES: usize = 16 << 20;

fn round(n: usize) -> usize {
    n.max(1).div_ceil(ALIGN) * ALIGN
}

struct Chunk {
    mem: Arc<dyn RingMemory>,
    /// Where the device sees the chunk's first byte.
    device_base: u64,
    /// Free ranges (offset, length), sorted by offset, never adjacent.
    free: Mutex<Vec<(usize, usize)>>,
}

impl Chunk {
    fn take(&self, len: usize) -> Option<usize> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let i = free.iter().position(|&(_, l)| l >= len)?;
        let (off, l) = free[i];
        if l == len {
            free.remove(i);
        } else {
            free[i] = (off + len, l - len);
        }
        Some(off)
    }

    fn give(&self, off: usize, len: usize) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let i = free.partition_point(|&(o, _)| o < off);
        free.insert(i, (off, len));
        // Merge with the next range, then with the previous one.
        if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
            free[i].1 += free[i + 1].1;
            free.remove(i + 1);
        }
        if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
            free[i - 1].1 += free[i].1;
            free.remove(i);
        }
    }

    fn free_bytes(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.iter().map(|r| r.1).sum()
    }
}

/// A piece of an arena chunk: ring memory, returned to its chunk on drop.
pub struct Lease {
    chunk: Arc<Chunk>,
    offset: usize,
    len: usize,
}

impl Lease {
    /// Where the device sees this piece.
    pub fn device_ptr(&self) -> u64 {
        self.chunk.device_base + self.offset as u64
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.chunk.give(self.offset, self.len);
    }
}

// SAFETY: the piece is `len` bytes at `offset` inside the chunk's memory, which the lease keeps
// alive (its `Arc`); offsets and lengths are multiples of ALIGN from a chunk that is
// ALIGN-aligned, and no two live leases overlap (the free list hands each range out once).
unsafe impl RingMemory for Lease {
    fn as_mut_ptr(&self) -> *mut u8 {
        // SAFETY: offset + len <= the chunk's length (taken from its free list).
        unsafe { self.chunk.mem.as_mut_ptr().add(self.offset) }
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Pinned queue memory for the ring kernels of one context.
#[derive(Default)]
pub struct Arena {
    chunks: Mutex<Vec<Arc<Chunk>>>,
}

impl Arena {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether pieces of `sizes` bytes can all be taken now, with no growth.
    pub fn fits(&self, sizes: &[usize]) -> bool {
        // A dry run on copies of the free lists.
        let chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        let mut lists: Vec<Vec<(usize, usize)>> = chunks
            .iter()
            .map(|c| c.free.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .collect();
        sizes.iter().all(|&s| {
            let need = round(s);
            lists.iter_mut().any(|free| {
                let Some(i) = free.iter().position(|&(_, l)| l >= need) else {
                    return false;
                };
                free[i].0 += need;
                free[i].1 -= need;
                true
            })
        })
    }

    /// Takes one piece of at least `len` bytes (ALIGN-aligned, contents unspecified), or
    /// `None` when no chunk has room. Makes no driver call.
    pub fn take(&self, len: usize) -> Option<Lease> {
        let need = round(len);
        let chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        chunks.iter().find_map(|c| {
            c.take(need).map(|offset| Lease {
                chunk: c.clone(),
                offset,
                len: need,
            })
        })
    }

    /// Adds a chunk large enough for pieces of `sizes` bytes (at least [`CHUNK_BYTES`]) from
    /// `alloc`, the backing allocation and where the device sees it (a driver call that waits
    /// for the device: the caller parks the resident kernels first). The memory must be
    /// ALIGN-aligned.
    pub fn grow<E>(
        &self,
        sizes: &[usize],
        alloc: impl FnOnce(usize) -> Result<(Arc<dyn RingMemory>, u64), E>,
    ) -> Result<(), E> {
        let bytes = sizes
            .iter()
            .map(|&s| round(s))
            .sum::<usize>()
            .max(CHUNK_BYTES);
        let (mem, device_base) = alloc(bytes)?;
        let usable = mem.len() / ALIGN * ALIGN;
        let aligned = (mem.as_mut_ptr() as usize).is_multiple_of(ALIGN);
        if aligned && usable > 0 {
            self.chunks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Arc::new(Chunk {
                    mem,
                    device_base,
                    free: Mutex::new(vec![(0, usable)]),
                }));
        }
        Ok(())
    }

    /// Bytes reserved, and bytes free, over every chunk.
    pub fn usage(&self) -> (usize, usize) {
        let chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        chunks
            .iter()
            .fold((0, 0), |(r, f), c| (r + c.mem.len(), f + c.free_bytes()))
    }

    /// Drops every chunk (the context they belong to was reset); pieces still held keep
    /// their own chunk alive until they drop.
    pub fn clear(&self) {
        self.chunks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use resident_ring::spsc::HeapMemory;

    fn heap(n: usize) -> Result<(Arc<dyn RingMemory>, u64), ()> {
        let m = Arc::new(HeapMemory::new(n).unwrap()) as Arc<dyn RingMemory>;
        let base = m.as_mut_ptr() as u64;
        Ok((m, base))
    }

    #[test]
    fn pieces_are_aligned_disjoint_and_come_back_merged() {
        let a = Arena::new();
        assert!(a.take(1).is_none(), "an empty arena has no room");
        assert!(!a.fits(&[1]));
        a.grow(&[100, 200], heap).unwrap();
        let (reserved, free) = a.usage();
        assert_eq!(reserved, free);
        assert!(reserved >= CHUNK_BYTES);
        assert!(a.fits(&[100, 200, 300]));
        let p: Vec<Lease> = [100, 200, 300, 1]
            .iter()
            .map(|&n| a.take(n).unwrap())
            .collect();
        for (i, l) in p.iter().enumerate() {
            assert_eq!(l.as_mut_ptr() as usize % ALIGN, 0);
            assert_eq!(
                l.device_ptr(),
                l.as_mut_ptr() as u64,
                "the device sees the same piece"
            );
            for m in &p[i + 1..] {
                let (a0, a1) = (l.as_mut_ptr() as usize, l.as_mut_ptr() as usize + l.len());
                let b0 = m.as_mut_ptr() as usize;
                assert!(b0 >= a1 || b0 + m.len() <= a0, "pieces overlap");
            }
        }
        drop(p);
        assert_eq!(a.usage().1, a.usage().0, "every piece came back");
        // Merged: the whole chunk can be taken as one piece again.
        let whole = a.take(a.usage().0).expect("free ranges were merged");
        assert!(a.take(1).is_none());
        drop(whole);
        assert!(!a.fits(&[a.usage().0 + 1]));
    }

    #[test]
    fn many_threads_taking_and_giving_never_share_a_byte() {
        let a = Arc::new(Arena::new());
        a.grow(&[], heap).unwrap();
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let a = a.clone();
                std::thread::spawn(move || {
                    for i in 0..2000usize {
                        let n = 128 * (1 + (i * 7 + t as usize) % 40);
                        let l = a.take(n).expect("room");
                        // SAFETY: the lease is ours alone for its life, `len` bytes.
                        let s = unsafe { std::slice::from_raw_parts_mut(l.as_mut_ptr(), l.len()) };
                        s.fill(t);
                        std::thread::yield_now();
                        assert!(s.iter().all(|&b| b == t), "another thread wrote our piece");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(a.usage().1, a.usage().0);
    }
}
