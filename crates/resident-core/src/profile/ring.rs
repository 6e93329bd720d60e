//! The span ring: the last `capacity` spans, written by any number of threads without locks,
//! read by snapshot while they write. Memory is fixed at construction.
//!
//! Each slot is a small seqlock. A writer claims a global index with one `fetch_add`, then
//! claims the slot `index % capacity` by moving its stamp from an even "complete" value to the
//! odd value `2 * index + 1` with a compare-exchange; it writes the words and publishes
//! `2 * index + 2`. A writer that finds the slot held by another writer (a lap in progress)
//! does not wait: the span is counted in `dropped`. A reader accepts a slot only when the stamp
//! it read before and after the words is the complete stamp of the index it expects.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// What a span measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SpanKind {
    /// A batch of a host handler (`a` = messages, `b` = send time of the oldest message).
    Batch = 1,
    /// A copy to the device (`a` = bytes).
    ToDevice = 2,
    /// A copy to the host (`a` = bytes).
    ToHost = 3,
    /// Launch overhead of a one-shot kernel: submit to first work plus last work to return
    /// (`a` = elements).
    Launch = 4,
    /// The work of a one-shot kernel, first index started to last index finished (`a` =
    /// elements).
    Compute = 5,
    /// Ring kernel set-up in `Runtime::launch` (queues, thread, device kernel).
    Setup = 6,
    /// Inputs pushed onto a device's queues by the pump (`a` = messages, `b` = send time of
    /// the oldest).
    DevicePush = 7,
    /// Outputs pulled from a device's queues by the pump (`a` = messages).
    DevicePull = 8,
}

impl SpanKind {
    fn from_u8(v: u8) -> Option<SpanKind> {
        Some(match v {
            1 => SpanKind::Batch,
            2 => SpanKind::ToDevice,
            3 => SpanKind::ToHost,
            4 => SpanKind::Launch,
            5 => SpanKind::Compute,
            6 => SpanKind::Setup,
            7 => SpanKind::DevicePush,
            8 => SpanKind::DevicePull,
            _ => return None,
        })
    }

    /// Name in traces.
    pub fn name(self) -> &'static str {
        match self {
            SpanKind::Batch => "batch",
            SpanKind::ToDevice => "copy to device",
            SpanKind::ToHost => "copy to host",
            SpanKind::Launch => "launch",
            SpanKind::Compute => "kernel",
            SpanKind::Setup => "setup",
            SpanKind::DevicePush => "push to device",
            SpanKind::DevicePull => "pull from device",
        }
    }
}

/// One recorded span. Times are nanoseconds since the profiler started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanRecord {
    /// What it measured.
    pub kind: SpanKind,
    /// The track (kernel or device) it belongs to.
    pub track: u32,
    /// Start.
    pub start_ns: u64,
    /// Duration.
    pub dur_ns: u64,
    /// Kind-specific count (messages, bytes, elements).
    pub a: u64,
    /// Kind-specific extra (send time of the oldest message of a batch; 0 = none).
    pub b: u64,
}

impl SpanRecord {
    fn encode(&self) -> [u64; 5] {
        [
            (self.kind as u64) << 32 | self.track as u64,
            self.start_ns,
            self.dur_ns,
            self.a,
            self.b,
        ]
    }

    fn decode(w: [u64; 5]) -> Option<SpanRecord> {
        Some(SpanRecord {
            kind: SpanKind::from_u8((w[0] >> 32) as u8)?,
            track: w[0] as u32,
            start_ns: w[1],
            dur_ns: w[2],
            a: w[3],
            b: w[4],
        })
    }
}

struct RingSlot {
    /// `2 * i + 2` once the span of global index `i` is complete in this slot; odd
    /// (`2 * i + 1`) while the writer of index `i` holds it; 0 when never written. Only the
    /// writer that won the compare-exchange to the odd value stores the words and the next
    /// even value, so at most one writer touches the words at a time.
    stamp: AtomicU64,
    words: [AtomicU64; 5],
}

/// A bounded, lock-free, multi-writer ring of the last `capacity` spans.
pub(crate) struct SpanRing {
    slots: Box<[RingSlot]>,
    /// `capacity - 1`; capacity is a power of two.
    mask: u64,
    /// Global index of the next span; only grows. Exact (every writer bumps it once).
    head: CachePadded<AtomicU64>,
    /// Spans not stored because their slot was held by another writer.
    dropped: CachePadded<AtomicU64>,
}

impl SpanRing {
    /// A ring of `capacity` slots (rounded up to a power of two, at least 2).
    pub fn new(capacity: usize) -> SpanRing {
        let cap = capacity.max(2).next_power_of_two();
        let slots = (0..cap)
            .map(|_| RingSlot {
                stamp: AtomicU64::new(0),
                words: Default::default(),
            })
            .collect();
        SpanRing {
            slots,
            mask: cap as u64 - 1,
            head: CachePadded::new(AtomicU64::new(0)),
            dropped: CachePadded::new(AtomicU64::new(0)),
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Stores `rec`, overwriting the oldest span when full. Never waits.
    pub fn push(&self, rec: &SpanRecord) {
        // Relaxed: the index only has to be unique; the slot's stamp carries the ordering.
        let i = self.head.fetch_add(1, Ordering::Relaxed);
        let slot = &self.slots[(i & self.mask) as usize];
        let mine = 2 * i + 1;
        // Relaxed: a stale value only makes the compare-exchange below fail (a drop).
        let cur = slot.stamp.load(Ordering::Relaxed);
        if cur & 1 == 1 || cur > mine {
            // Another writer holds the slot, or a later lap already completed it.
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if slot
            .stamp
            .compare_exchange(cur, mine, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Release fence: orders the odd stamp before the word stores. A reader that sees any
        // of the words below and then runs its acquire fence also sees the odd stamp (or a
        // later one) on its second stamp load, so it rejects a half-written slot.
        fence(Ordering::Release);
        for (w, v) in slot.words.iter().zip(rec.encode()) {
            w.store(v, Ordering::Relaxed);
        }
        // Release: pairs with the reader's first (Acquire) stamp load; the words are visible
        // to a reader that sees the complete stamp.
        slot.stamp.store(mine + 1, Ordering::Release);
    }

    /// Spans not stored because of writer contention on one slot.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Spans ever offered (stored, overwritten since, or dropped).
    pub fn offered(&self) -> u64 {
        self.head.load(Ordering::Relaxed)
    }

    /// The complete spans among the last `capacity` indices, oldest first. Slots being
    /// written or overwritten while we read are skipped.
    pub fn snapshot(&self) -> Vec<SpanRecord> {
        // Acquire is not needed for correctness (each slot's stamp is checked), but makes the
        // spans completed before this call (by threads we synchronized with) all visible.
        let head = self.head.load(Ordering::Acquire);
        let from = head.saturating_sub(self.slots.len() as u64);
        let mut out = Vec::with_capacity((head - from) as usize);
        for i in from..head {
            let slot = &self.slots[(i & self.mask) as usize];
            let want = 2 * i + 2;
            // Acquire: pairs with the writer's Release stamp store; the words are visible.
            if slot.stamp.load(Ordering::Acquire) != want {
                continue;
            }
            let mut w = [0u64; 5];
            for (v, a) in w.iter_mut().zip(&slot.words) {
                *v = a.load(Ordering::Relaxed);
            }
            // Acquire fence: pairs with the Release fence of any writer whose word we read,
            // so the stamp load below sees that writer's odd stamp (or later) and rejects.
            fence(Ordering::Acquire);
            if slot.stamp.load(Ordering::Relaxed) != want {
                continue;
            }
            if let Some(r) = SpanRecord::decode(w) {
                out.push(r);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn rec(track: u32, n: u64) -> SpanRecord {
        // `b` is a checksum of the other words: a torn read breaks it.
        let start = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let dur = n ^ 0xABCD;
        SpanRecord {
            kind: SpanKind::Batch,
            track,
            start_ns: start,
            dur_ns: dur,
            a: n,
            b: start ^ dur ^ n ^ track as u64,
        }
    }

    fn valid(r: &SpanRecord) -> bool {
        r.b == r.start_ns ^ r.dur_ns ^ r.a ^ r.track as u64
            && r.start_ns == r.a.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            && r.dur_ns == r.a ^ 0xABCD
    }

    #[test]
    fn keeps_the_last_capacity_spans_in_order() {
        let r = SpanRing::new(8);
        for n in 0..20 {
            r.push(&rec(1, n));
        }
        let s = r.snapshot();
        assert_eq!(
            s.iter().map(|x| x.a).collect::<Vec<_>>(),
            (12..20).collect::<Vec<_>>()
        );
        assert_eq!(r.dropped(), 0);
        assert_eq!(r.offered(), 20);
    }

    /// Writers race each other (laps on a small ring) and a reader snapshots all the while:
    /// every span read must be whole (checksum), every offered span is stored or counted as
    /// dropped, and a quiet ring holds exactly its last spans.
    #[test]
    fn stress_concurrent_writers_and_reader() {
        const WRITERS: u32 = 4;
        const PER: u64 = 200_000;
        let ring = Arc::new(SpanRing::new(64));
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (ring, stop) = (ring.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = 0u64;
                while !stop.load(Ordering::Acquire) {
                    for r in ring.snapshot() {
                        assert!(valid(&r), "torn span read: {r:?}");
                        seen += 1;
                    }
                }
                seen
            })
        };
        let writers: Vec<_> = (0..WRITERS)
            .map(|t| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for n in 0..PER {
                        ring.push(&rec(t, n + t as u64 * PER));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Release);
        let seen = reader.join().unwrap();
        assert!(seen > 0, "the reader saw no complete span");
        assert_eq!(ring.offered(), WRITERS as u64 * PER);
        let last = ring.snapshot();
        assert!(last.iter().all(valid));
        // Quiet now: every slot of the last lap is either complete or its writer was dropped.
        assert!(last.len() as u64 <= 64);
        assert!(last.len() as u64 + ring.dropped().min(64) >= 64);
        // Every span in the final snapshot is distinct (no slot reported twice).
        let mut ids: Vec<u64> = last.iter().map(|r| r.a).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), last.len());
    }
}
