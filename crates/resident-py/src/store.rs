//! The object store: the Python objects queued in a kernel, by handle.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use pyo3::prelude::*;

/// Python objects queued in a kernel, by handle.
#[derive(Default)]
pub(crate) struct Store {
    next: AtomicU64,
    pub(crate) objects: Mutex<HashMap<u64, Py<PyAny>>>,
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
