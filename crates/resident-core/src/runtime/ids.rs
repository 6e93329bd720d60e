//! Message ids and the clock of a runtime: one counter every sender and publisher draws from,
//! and one epoch every timestamp is measured against.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

/// Message ids and the clock of a runtime.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub struct Ids {
    pub(crate) epoch: Instant,
    /// Bumped by every send: on its own line so readers of `epoch` (every clock read) do not
    /// pull the line away from senders.
    pub(crate) next: CachePadded<AtomicU64>,
}

impl Ids {
    #[inline]
    pub fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
    /// Size of the id blocks a kernel reserves for its outputs, so its thread and the senders
    /// do not bounce the shared counter's cache line on every message.
    pub const BLOCK: u64 = 4096;
    /// The first of `n` consecutive ids.
    #[inline]
    pub fn next_n(&self, n: u64) -> u64 {
        self.next.fetch_add(n.max(1), Ordering::Relaxed)
    }
    /// Nanoseconds since the runtime started (monotonic).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
    /// The `Instant` of a reading of [`Ids::now_ns`] (never later than the moment it was
    /// read: `now_ns` truncates), so a caller needs one clock read for both clocks.
    pub fn instant_at(&self, ns: u64) -> Instant {
        self.epoch + Duration::from_nanos(ns)
    }
}
