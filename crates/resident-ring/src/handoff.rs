//! The in-hand handoff: who owns each message of the batch a kernel's thread is working
//! through, when `terminate` gives up waiting for it (a handler that never returns).
//!
//! The host thread takes a batch ([`InHand::take`]), claims each message before handling it
//! ([`InHand::start`]) and ends the batch ([`InHand::finish`]); the abandoning side
//! ([`InHand::abandon`]) takes back what the host thread had not finished. Exactly one side
//! decides each message's fate:
//!
//! * messages the host thread claimed past (it started the next one, or finished the batch)
//!   are the host's: handled, their outputs published by the host;
//! * the message being handled when `abandon` came is the abandoner's, reported as stuck;
//! * messages not started are the abandoner's, reported as undelivered.
//!
//! `progress` holds the decision. The host writes it with one compare-exchange per message,
//! the abandoner with one `fetch_or`, so each transition is decided by whichever comes first
//! in the atomic's modification order:
//! * `IN_BATCH | k` (k >= 1): messages `0..k-1` of the batch are finished, message `k-1` is
//!   being handled; `IN_BATCH | 0`: a batch was taken, nothing started.
//! * `0`: no batch in hand.
//! * `ABANDONED` set: the abandoner took messages `k-1..` (or `0..` for k = 0); the host thread
//!   must publish nothing more and stop when (if ever) it gets control back.
//!
//! Orderings: each successful claim is a Release of everything the handler did for the
//! messages before it, and the abandoner's `fetch_or` is an Acquire of it, so what the
//! finished messages did is visible to whoever builds the report. `tests/loom_handoff.rs`
//! checks the ownership partition and this visibility in every interleaving, and fails when
//! either ordering is weakened to `Relaxed`.

use crate::sync::{AtomicU64, Mutex, Ordering, Padded};

const IN_BATCH: u64 = 1 << 62;
const ABANDONED: u64 = 1 << 63;
const INDEX: u64 = (1 << 32) - 1;

/// Returned when the abandoning side has taken over: the host thread must stop now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Abandoned;

/// The batch in hand and who owns which of its messages (see the module docs).
pub struct InHand<T> {
    /// The decision word, alone on its line: the host thread writes it once per message.
    progress: Padded<AtomicU64>,
    /// A copy of the batch in hand, written under this lock when a batch is taken.
    batch: Mutex<Vec<T>>,
}

impl<T: Copy> Default for InHand<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy> InHand<T> {
    /// No batch in hand.
    pub fn new() -> Self {
        InHand {
            progress: Padded(AtomicU64::new(0)),
            batch: Mutex::new(Vec::new()),
        }
    }

    /// Takes a batch: `fill` moves messages into `local` (cleared first) and returns how
    /// many; the batch is recorded as in hand. Taking and recording happen under one lock
    /// that `abandon` also takes, so a batch is either seen by `abandon` or never taken.
    pub fn take(
        &self,
        local: &mut Vec<T>,
        fill: impl FnOnce(&mut Vec<T>) -> usize,
    ) -> Result<usize, Abandoned> {
        let mut copy = self.batch.lock();
        if self.progress.load(Ordering::Acquire) & ABANDONED != 0 {
            return Err(Abandoned);
        }
        local.clear();
        let n = fill(local);
        if n > 0 {
            copy.clear();
            copy.extend_from_slice(&local[..n]);
            // Relaxed is enough: `abandon` reads `progress` under the same lock.
            self.progress.store(IN_BATCH, Ordering::Relaxed);
        }
        Ok(n)
    }

    /// Before handling message `i` of the batch (and so after message `i - 1` finished):
    /// claims it. `Err` when the abandoner took over: message `i - 1`'s result must not be
    /// published, and nothing more handled.
    #[inline]
    pub fn start(&self, i: usize) -> Result<(), Abandoned> {
        // Release (success): what the handler did for messages `..i` happens before the
        // claim, for an abandoner that reads it with Acquire. Acquire (failure): we see the
        // abandoner's mark.
        self.progress
            .compare_exchange(
                IN_BATCH | i as u64,
                IN_BATCH | (i as u64 + 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(|_| ())
            .map_err(|_| Abandoned)
    }

    /// After the last message of a batch of `n` finished: the batch is done (all `n` are the
    /// host's).
    #[inline]
    pub fn finish(&self, n: usize) -> Result<(), Abandoned> {
        // Release as in `start`.
        self.progress
            .compare_exchange(IN_BATCH | n as u64, 0, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(|_| Abandoned)
    }

    /// Gives up on the host thread: returns (the message in the handler, if any; the messages
    /// of the batch not started). From here on the host thread publishes nothing.
    pub fn abandon(&self) -> (Option<T>, Vec<T>) {
        let copy = self.batch.lock();
        // Acquire: pairs with the host's last successful claim (see the module docs).
        let p = self.progress.fetch_or(ABANDONED, Ordering::AcqRel);
        if p & IN_BATCH == 0 || p & ABANDONED != 0 {
            return (None, Vec::new());
        }
        let k = (p & INDEX) as usize;
        if k == 0 {
            return (None, copy.clone());
        }
        (copy.get(k - 1).copied(), copy[k.min(copy.len())..].to_vec())
    }

    /// Whether the abandoner took over.
    pub fn is_abandoned(&self) -> bool {
        self.progress.load(Ordering::Acquire) & ABANDONED != 0
    }

    /// Lets go of the batch copy's memory (after the kernel ended).
    pub fn release(&self) {
        *self.batch.lock() = Vec::new();
    }
}
