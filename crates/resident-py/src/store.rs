//! The object store: the Python objects queued in a kernel, by handle.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use pyo3::prelude::*;

/// Hashes a store key: the key itself in the low bits (keys are handed out in sequence and
/// mostly taken in order: consecutive keys land in consecutive buckets, no collisions within
/// the window the queue holds, and the table is walked in order), and the top 7 bits, which
/// the table keeps as each entry's tag, mixed from the whole key so that tags differ. SipHash,
/// the default, costs more than the rest of a put or take.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used for u64 keys (`write_u64`); any bytes still hash.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(MIX);
        }
    }

    fn write_u64(&mut self, k: u64) {
        self.0 = k ^ (k.wrapping_mul(MIX) & TAG_BITS);
    }
}

const MIX: u64 = 0x9E37_79B9_7F4A_7C15;
const TAG_BITS: u64 = 0xFE00_0000_0000_0000;

/// A map by store key.
pub(crate) type Keyed<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// Hashes a kernel id (a short string looked up on every send and receive) a word at a
/// time, multiply-and-rotate: a few nanoseconds where SipHash takes tens. The ids are the
/// program's own, a handful per runtime: no flooding to resist.
#[derive(Default)]
pub(crate) struct NameHasher(u64);

impl Hasher for NameHasher {
    fn finish(&self) -> u64 {
        // The table takes its tags from the top bits: mix the last word into them.
        (self.0 ^ (self.0 >> 29)).wrapping_mul(MIX)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(MIX);
        }
        let mut tail = 0u64;
        for (i, &b) in chunks.remainder().iter().enumerate() {
            tail |= u64::from(b) << (8 * i);
        }
        self.0 = (self.0.rotate_left(5) ^ tail).wrapping_mul(MIX);
    }
}

/// A map by kernel id.
pub(crate) type Named<V> = HashMap<String, V, BuildHasherDefault<NameHasher>>;

/// Python objects queued in a kernel, by handle.
#[derive(Default)]
pub(crate) struct Store {
    next: AtomicU64,
    pub(crate) objects: Mutex<Keyed<Py<PyAny>>>,
    /// The message the handler raised on (handed back by its ctx), for the report.
    pub(crate) failed: Mutex<Option<Py<PyAny>>>,
    /// Message ids of calls given up while the kernel had their request (newest last, at
    /// most `ABANDONED_MAX`): their replies are released when published.
    gave_up: Mutex<VecDeque<u64>>,
}

/// Calls given up with their request in the kernel's hands that a store remembers.
const ABANDONED_MAX: usize = 4096;

impl Store {
    pub(crate) fn put(&self, obj: Py<PyAny>) -> u64 {
        let key = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.objects.lock().insert(key, obj);
        key
    }

    pub(crate) fn take(&self, key: u64) -> Option<Py<PyAny>> {
        self.objects.lock().remove(&key)
    }

    /// The objects of `keys` (those still held), in order, under one lock.
    pub(crate) fn take_all(&self, keys: impl IntoIterator<Item = u64>) -> Vec<Py<PyAny>> {
        let mut g = self.objects.lock();
        keys.into_iter().filter_map(|k| g.remove(&k)).collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.objects.lock().len()
    }

    /// Whether any of `keys` is held now.
    pub(crate) fn holds_any(&self, mut keys: impl Iterator<Item = u64>) -> bool {
        let g = self.objects.lock();
        keys.any(|k| g.contains_key(&k))
    }

    /// Remembers that the caller of call `id` gave up while the kernel had its request.
    pub(crate) fn abandon(&self, id: u64) {
        let mut g = self.gave_up.lock();
        g.push_back(id);
        while g.len() > ABANDONED_MAX {
            g.pop_front();
        }
    }

    /// Whether call `id` was given up (forgets it).
    pub(crate) fn abandoned(&self, id: u64) -> bool {
        let mut g = self.gave_up.lock();
        match g.iter().rposition(|&x| x == id) {
            Some(i) => {
                g.remove(i);
                true
            }
            None => false,
        }
    }

    /// Releases every object left (the kernel is terminated: nothing can reach them).
    pub(crate) fn clear(&self) -> usize {
        let all: Vec<_> = self.objects.lock().drain().collect();
        all.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn store_keys_keep_their_low_bits_and_get_distinct_tags() {
        let b = BuildHasherDefault::<KeyHasher>::default();
        let mut tags = std::collections::HashSet::new();
        for k in 1..=4096u64 {
            let h = b.hash_one(k);
            assert_eq!(h & !TAG_BITS, k);
            tags.insert(h >> 57);
        }
        assert_eq!(tags.len(), 128, "every tag value is used");
        let mut m: Keyed<u64> = Keyed::default();
        for k in 1..=10_000u64 {
            m.insert(k, k * 2);
        }
        for k in 1..=10_000u64 {
            assert_eq!(m.remove(&k), Some(k * 2));
        }
        assert!(m.is_empty());
    }

    #[test]
    fn kernel_ids_hash_apart_and_are_found_by_str() {
        let mut m: Named<usize> = Named::default();
        let ids: Vec<String> = (0..2000)
            .map(|i| format!("kernel_{i}"))
            .chain([
                "".into(),
                "a".into(),
                "ab".into(),
                "abcdefgh".into(),
                "abcdefghi".into(),
            ])
            .collect();
        for (i, id) in ids.iter().enumerate() {
            m.insert(id.clone(), i);
        }
        assert_eq!(m.len(), ids.len());
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(m.get(id.as_str()), Some(&i));
        }
        let b = BuildHasherDefault::<NameHasher>::default();
        let hashes: std::collections::HashSet<u64> = ids.iter().map(|s| b.hash_one(s)).collect();
        assert_eq!(hashes.len(), ids.len());
    }
}
