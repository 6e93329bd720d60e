//! The bulk input lane: deep queues moved by the copy engine instead of by the kernel's loads
//! of host memory.
//!
//! # Why
//! One resident block reading its LL lanes from pinned host memory keeps only a few KB of loads
//! in flight, so at depth it moves them at 1.6-2.0 GB/s (the H200 run of 2026-11-28), while the
//! copy engine of the same machine moves 53-55 GB/s. So each priority lane has a second path:
//! the host packs a run of messages contiguously into a pinned **staging ring**, the copy engine
//! moves it (`cuMemcpyHtoDAsync` on the kernel's copy stream) into a **device ring** in device
//! memory, and a stream memory operation after the copy on the same stream
//! (`cuStreamWriteValue64`) publishes the lane's **bulk tail**, also in device memory. The
//! kernel polls that tail beside its LL lanes (an L2 read, no bus round trip) and reads the
//! batch from device memory with every thread of the block. The LL lanes stay for the shallow
//! case: one message finds the kernel in one bus read.
//!
//! # Layout (the contract with the kernel template, `kernels/persistent_ring.cu`)
//! * The **tails line**: 128 bytes of device memory, `u64` tail of lane `l` at `8 * l`. Written
//!   only by the copy stream's memory operations (one writer), read by the kernel with an
//!   acquire load.
//! * The **heads line**: 128 bytes of pinned, device-mapped host memory, `u64` head of lane `l`
//!   at `8 * l`. Written only by the kernel's thread 0 (release, or covered by the batch's
//!   release fence), read here with acquire loads.
//! * A lane's **device ring** and **staging ring**: `capacity` plain `Slot<In>`s each (the
//!   lane's capacity; no LL flags, so half the bytes of an LL slot), position `p` at slot
//!   `p % capacity` in both.
//!
//! # Order: one path at a time per lane
//! FIFO within a lane holds across the switch because the host writes a lane's other path only
//! once the kernel has published a head covering everything of the path in use: the kernel
//! publishes a head only after the handlers of those messages ran, so every message of the new
//! path comes in a later batch. At any moment at most one path of a lane holds messages, so the
//! kernel needs no sequence numbers and reads each lane from whichever path is not empty.
//! Priority between lanes is unchanged (highest lane first, whatever its path). A run large
//! enough for the bulk path that finds the lane's LL path still holding messages is not
//! accepted yet (the pump keeps it and offers it again): it waits for at most the batch that
//! drains the LL path, instead of leaving a deep queue on the slow path. Small runs are never
//! held, so a lane still takes as many single messages as its LL ring holds. See [`choose`].
//!
//! # Reuse of a staging slot
//! Position `p` of the staging ring is written again (as `p + capacity`) only once the kernel's
//! head has passed `p`: the kernel read `p` from the device ring after the bulk tail covering it,
//! which the memory operation wrote after the copy of `p` finished. So one index, the head, says
//! both that the device ring's slot and the staging slot are free, and the staging ring still
//! holds every message the kernel has not taken: [`BulkLanes::reclaim`] takes them from there.

use core::marker::PhantomData;
use core::mem::size_of;
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytemuck::Pod;
use resident_ring::spsc::{check_memory, RingMemory};
use resident_ring::Slot;

use super::lane::{slot_bytes, slot_from_bytes};
use super::{PersistentError, SharedMemory, MAX_LANES};

/// Bytes of the tails line and of the heads line.
pub const BULK_LINE_BYTES: usize = 128;

/// Messages a run offered for one lane must reach before the automatic mode takes the bulk
/// path (a deep queue reaches the device as large runs: the device pump offers up to four
/// batches at once, so a run's length is the depth the host sees). Chosen from the bus model and the H200's constants
/// (`bench/gpu-constants.json`), not yet measured on a GPU: an LL message costs about
/// `2 * slot / 1.6 GB/s` of one block's loads (about 120 ns at 64 B), a bulk submit two driver
/// calls of a few microseconds, so the bulk path pays from a few tens of messages on.
pub const DEFAULT_THRESHOLD: usize = 64;

/// Which input path a kernel's lanes use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum BulkMode {
    /// The bulk path for deep queues and large batches, the LL path otherwise ([`choose`]).
    #[default]
    Auto,
    /// Every message by the bulk path.
    On,
    /// Every message by the LL path; no bulk memory is made.
    Off,
}

impl BulkMode {
    /// The name `RESIDENT_BULK_LANE` takes and the benchmark rows print.
    pub fn name(self) -> &'static str {
        match self {
            BulkMode::Auto => "auto",
            BulkMode::On => "on",
            BulkMode::Off => "off",
        }
    }
}

/// How a kernel's input lanes choose their path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BulkConfig {
    /// The mode.
    pub mode: BulkMode,
    /// [`BulkMode::Auto`]'s threshold in messages (at least 1).
    pub threshold: usize,
}

impl Default for BulkConfig {
    fn default() -> Self {
        BulkConfig {
            mode: BulkMode::Auto,
            threshold: DEFAULT_THRESHOLD,
        }
    }
}

impl BulkConfig {
    /// The configuration `RESIDENT_BULK_LANE` (`on`, `off` or `auto`; unset: `auto`) and
    /// `RESIDENT_BULK_THRESHOLD` (messages, at least 1; unset: [`DEFAULT_THRESHOLD`]) give.
    /// Anything else is a typed [`PersistentError::Config`].
    pub fn from_env() -> Result<Self, PersistentError> {
        Self::parse(
            std::env::var("RESIDENT_BULK_LANE").ok().as_deref(),
            std::env::var("RESIDENT_BULK_THRESHOLD").ok().as_deref(),
        )
    }

    /// [`from_env`](Self::from_env) over given values (`None`: unset).
    ///
    /// ```
    /// use resident_engine_cuda::persistent::{BulkConfig, BulkMode};
    /// assert_eq!(BulkConfig::parse(Some("on"), None).unwrap().mode, BulkMode::On);
    /// assert_eq!(BulkConfig::parse(None, Some("128")).unwrap().threshold, 128);
    /// assert!(BulkConfig::parse(Some("yes"), None).is_err());
    /// assert!(BulkConfig::parse(None, Some("0")).is_err());
    /// ```
    pub fn parse(mode: Option<&str>, threshold: Option<&str>) -> Result<Self, PersistentError> {
        let mode = match mode.map(str::trim) {
            None | Some("") | Some("auto") => BulkMode::Auto,
            Some("on") => BulkMode::On,
            Some("off") => BulkMode::Off,
            Some(other) => {
                return Err(PersistentError::config(format!(
                    "RESIDENT_BULK_LANE = {:?} is not one of on, off, auto",
                    short(other)
                )))
            }
        };
        let threshold = match threshold.map(str::trim) {
            None | Some("") => DEFAULT_THRESHOLD,
            Some(t) => match t.parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(PersistentError::config(format!(
                        "RESIDENT_BULK_THRESHOLD = {:?} is not a whole number of messages >= 1",
                        short(t)
                    )))
                }
            },
        };
        Ok(BulkConfig { mode, threshold })
    }

    /// Whether the kernel gets bulk lanes at all.
    pub fn enabled(&self) -> bool {
        self.mode != BulkMode::Off
    }
}

/// At most 64 bytes of a user's value, for an error message.
fn short(s: &str) -> String {
    s.chars().take(64).collect()
}

/// A lane's input path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The LL lane in pinned host memory.
    Ll,
    /// The bulk lane: staging, copy engine, device ring.
    Bulk,
}

/// The path a run of `n` messages for one lane takes, or `None` when it must wait for the
/// lane's LL path to drain first (a run of at least the threshold, while the LL path still
/// holds `ll_pending` messages). `bulk_pending`: messages on the lane's bulk path not yet
/// taken. At most one of the two is non-zero (the module's invariant), and the answer keeps it
/// so: a run goes behind the lane's bulk messages whatever its size.
///
/// ```
/// use resident_engine_cuda::persistent::{choose, BulkConfig, BulkMode, Path};
/// let auto = BulkConfig { mode: BulkMode::Auto, threshold: 64 };
/// assert_eq!(choose(&auto, 0, 0, 1), Some(Path::Ll));
/// assert_eq!(choose(&auto, 100, 0, 1), Some(Path::Ll)); // a single message is never held
/// assert_eq!(choose(&auto, 0, 0, 64), Some(Path::Bulk));
/// assert_eq!(choose(&auto, 0, 3, 1), Some(Path::Bulk)); // behind the lane's bulk messages
/// assert_eq!(choose(&auto, 60, 0, 64), None); // a deep run waits for the LL path to drain
/// ```
pub fn choose(cfg: &BulkConfig, ll_pending: usize, bulk_pending: usize, n: usize) -> Option<Path> {
    let want = match cfg.mode {
        BulkMode::Off => return Some(Path::Ll),
        BulkMode::On => Path::Bulk,
        BulkMode::Auto if bulk_pending > 0 => Path::Bulk,
        BulkMode::Auto if n >= cfg.threshold => Path::Bulk,
        BulkMode::Auto => Path::Ll,
    };
    match want {
        Path::Bulk if ll_pending > 0 => None,
        p => Some(p),
    }
}

/// One contiguous host-to-device copy of a bulk submit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyRange {
    /// Host address of the first byte (pinned staging memory).
    pub src: u64,
    /// Device address of the first byte (the device ring).
    pub dst: u64,
    /// Bytes.
    pub len: usize,
}

/// What moves a bulk submit: the copies, then the store of `value` to the device address
/// `tail`, ordered after them (on a GPU: `cuMemcpyHtoDAsync` per range and
/// `cuStreamWriteValue64` on one copy stream; on CudaSim a host thread standing in for the
/// copy engine, see [`SimCopyEngine`]).
pub trait CopyEngine: Send {
    /// Enqueues the copies and the tail store; returns once they are enqueued (not done).
    fn copy_then_publish(
        &mut self,
        copies: &[CopyRange],
        tail: u64,
        value: u64,
    ) -> Result<(), PersistentError>;

    /// Waits up to `timeout` until every submit so far has landed (its tail stored); `false`
    /// when they had not by then. For benchmarks and tests that need a batch whole on the
    /// device before the kernel looks; the data path never waits for the copy engine.
    fn wait_idle(&mut self, timeout: std::time::Duration) -> bool;
}

/// Counts of a kernel's bulk submits (host side: the same for every engine).
#[derive(Debug, Default)]
pub struct BulkStats {
    /// Bytes moved by the copy engine.
    pub copy_engine_bytes: AtomicU64,
    /// Driver calls made for them (one per copy range, one per tail store).
    pub driver_calls: AtomicU64,
    /// Submits.
    pub submits: AtomicU64,
    /// Messages submitted.
    pub messages: AtomicU64,
}

/// One lane's bulk path on the host: the writer of its staging ring and the submitter of its
/// copies. Exactly one exists per lane (its methods that write take `&mut self`).
pub struct BulkLane<In> {
    lane: usize,
    staging: SharedMemory,
    /// Device address of the device ring's slot 0.
    device_slots: u64,
    /// Device address of this lane's bulk tail (in the tails line).
    tail_addr: u64,
    /// The heads line (pinned).
    heads: SharedMemory,
    cap: u64,
    /// Our tail (exact: the host is the only submitter).
    tail: u64,
    /// The kernel's head as last read (maybe stale = smaller).
    cached_head: u64,
    _t: PhantomData<fn(In)>,
}

impl<In: Pod> BulkLane<In> {
    fn head_cell(&self) -> &AtomicU64 {
        // SAFETY: the heads line is BULK_LINE_BYTES, 128-aligned (checked in `BulkLanes::new`),
        // `lane < MAX_LANES` so `8 * lane + 8 <= 64`; the kernel writes the cell only with
        // 8-byte system-scope stores, so it is an AtomicU64 for the memory's life.
        unsafe { AtomicU64::from_ptr((self.heads.as_mut_ptr() as *mut u64).add(self.lane)) }
    }

    fn head(&self) -> u64 {
        // Acquire: pairs with the kernel's release of the head (or its release fence before
        // the covered store), so its reads of the slots below happened before.
        self.head_cell().load(Ordering::Acquire).min(self.tail)
    }

    /// Messages submitted and not yet taken by the kernel.
    pub fn len(&self) -> usize {
        (self.tail - self.head()) as usize
    }

    /// Whether the kernel has taken every message submitted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn free(&mut self, want: usize) -> usize {
        let mut used = self.tail - self.cached_head;
        if self.cap - used < want as u64 {
            self.cached_head = self.head();
            used = self.tail - self.cached_head;
        }
        (self.cap - used) as usize
    }

    fn staging_slot(&self, pos: u64) -> *mut u8 {
        let i = (pos & (self.cap - 1)) as usize;
        // SAFETY: i < cap and the staging memory holds cap slots (checked in `BulkLanes::new`).
        unsafe { self.staging.as_mut_ptr().add(i * size_of::<Slot<In>>()) }
    }

    /// Packs as many leading `slots` as fit into the staging ring and submits them; returns how
    /// many. On a copy engine error nothing is accepted (the tail does not move).
    fn push_slice(
        &mut self,
        slots: &[Slot<In>],
        engine: &mut dyn CopyEngine,
        stats: &BulkStats,
    ) -> Result<usize, PersistentError> {
        let n = self.free(slots.len()).min(slots.len());
        if n == 0 {
            return Ok(0);
        }
        let sb = size_of::<Slot<In>>();
        for (i, s) in slots[..n].iter().enumerate() {
            // SAFETY: the staging slot of position tail + i is free: the kernel's head has
            // passed its previous lap (`free` above), so neither the kernel nor a copy still
            // reads it (module docs, "Reuse"); nothing else on the host writes it.
            let dst = unsafe {
                core::slice::from_raw_parts_mut(self.staging_slot(self.tail + i as u64), sb)
            };
            slot_bytes(s, dst);
        }
        let first = (self.tail & (self.cap - 1)) as usize;
        let until_wrap = (self.cap as usize - first).min(n);
        let mut copies = [CopyRange {
            src: self.staging_slot(self.tail) as u64,
            dst: self.device_slots + (first * sb) as u64,
            len: until_wrap * sb,
        }; 2];
        let mut k = 1;
        if until_wrap < n {
            copies[1] = CopyRange {
                src: self.staging.as_mut_ptr() as u64,
                dst: self.device_slots,
                len: (n - until_wrap) * sb,
            };
            k = 2;
        }
        engine.copy_then_publish(&copies[..k], self.tail_addr, self.tail + n as u64)?;
        self.tail += n as u64;
        stats
            .copy_engine_bytes
            .fetch_add((n * sb) as u64, Ordering::Relaxed);
        stats
            .driver_calls
            .fetch_add(k as u64 + 1, Ordering::Relaxed);
        stats.submits.fetch_add(1, Ordering::Relaxed);
        stats.messages.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Takes back, in order, every message submitted and not taken, and marks them taken.
    ///
    /// # Safety
    /// The kernel must have stopped reading the lane for good: the host then plays its part.
    unsafe fn reclaim(&mut self) -> Vec<Slot<In>> {
        let head = self.head();
        let sb = size_of::<Slot<In>>();
        let mut out = Vec::with_capacity((self.tail - head) as usize);
        for pos in head..self.tail {
            // SAFETY: the staging slot of `pos` holds what was submitted at `pos` (not reused:
            // the head has not passed it), `sb` bytes inside the staging memory.
            let bytes = unsafe { core::slice::from_raw_parts(self.staging_slot(pos), sb) };
            out.push(slot_from_bytes(bytes));
        }
        // Release: as the kernel's head would be.
        self.head_cell().store(self.tail, Ordering::Release);
        self.cached_head = self.tail;
        out
    }
}

/// The memory a kernel's bulk lanes need, made by its launcher.
pub struct BulkMemory {
    /// Per lane: its staging ring (pinned host memory of `capacity` slots).
    pub staging: Vec<SharedMemory>,
    /// Per lane: the device address of its device ring (`capacity` slots of device memory).
    pub device_slots: Vec<u64>,
    /// The heads line (pinned, device-mapped host memory, [`BULK_LINE_BYTES`]).
    pub heads: SharedMemory,
    /// Where the device sees the heads line.
    pub heads_device: u64,
    /// The device address of the tails line ([`BULK_LINE_BYTES`] of device memory, zeroed).
    pub tails_device: u64,
}

/// A kernel's bulk lanes on the host, with its copy engine.
pub struct BulkLanes<In> {
    lanes: Vec<BulkLane<In>>,
    engine: Box<dyn CopyEngine>,
    config: BulkConfig,
    stats: Arc<BulkStats>,
    heads_device: u64,
    tails_device: u64,
    /// The first copy engine error (a later submit is refused with nothing accepted).
    error: Option<String>,
}

impl<In: Pod> BulkLanes<In> {
    /// Bulk lanes of `capacity` slots over `mem`, submitting through `engine`.
    ///
    /// # Safety
    /// One host side per lane: nothing else on the host writes the staging memory or the
    /// heads line while this value lives (the kernel writes the heads line, the copy engine
    /// reads staging).
    pub unsafe fn new(
        mem: BulkMemory,
        capacity: usize,
        config: BulkConfig,
        engine: Box<dyn CopyEngine>,
    ) -> Result<Self, PersistentError> {
        let lanes_n = mem.staging.len();
        if lanes_n == 0 || lanes_n > MAX_LANES || mem.device_slots.len() != lanes_n {
            return Err(PersistentError::config(format!(
                "bulk lanes: {} staging rings and {} device rings for 1..={MAX_LANES} lanes",
                lanes_n,
                mem.device_slots.len()
            )));
        }
        if capacity == 0 || !capacity.is_power_of_two() {
            return Err(PersistentError::config(format!(
                "bulk lane capacity {capacity} is not a power of two"
            )));
        }
        check_memory(BULK_LINE_BYTES, &mem.heads)?;
        let need = capacity.saturating_mul(size_of::<Slot<In>>());
        let mut lanes = Vec::with_capacity(lanes_n);
        for (l, staging) in mem.staging.into_iter().enumerate() {
            check_memory(need, &staging)?;
            lanes.push(BulkLane {
                lane: l,
                staging,
                device_slots: mem.device_slots[l],
                tail_addr: mem.tails_device + 8 * l as u64,
                heads: mem.heads.clone(),
                cap: capacity as u64,
                tail: 0,
                cached_head: 0,
                _t: PhantomData,
            });
        }
        // A relaunch over memory in use is not supported: the lanes start empty (fresh
        // memory; the launcher zeroed both lines).
        Ok(BulkLanes {
            lanes,
            engine,
            config,
            stats: Arc::new(BulkStats::default()),
            heads_device: mem.heads_device,
            tails_device: mem.tails_device,
            error: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> BulkConfig {
        self.config
    }

    /// The counters of the submits so far.
    pub fn stats(&self) -> Arc<BulkStats> {
        self.stats.clone()
    }

    /// The device addresses the kernel's parameters carry: (heads line, tails line).
    pub fn device_lines(&self) -> (u64, u64) {
        (self.heads_device, self.tails_device)
    }

    /// The first copy engine error, if a submit failed.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Messages on lane `l`'s bulk path not yet taken.
    pub fn pending(&self, l: usize) -> usize {
        self.lanes[l].len()
    }

    /// Submits as many leading `slots` as fit on lane `l`'s bulk path; returns how many (0 after
    /// a copy engine error, which [`error`](Self::error) then names).
    pub fn push(&mut self, l: usize, slots: &[Slot<In>]) -> usize {
        if self.error.is_some() {
            return 0;
        }
        match self.lanes[l].push_slice(slots, &mut *self.engine, &self.stats) {
            Ok(n) => n,
            Err(e) => {
                self.error = Some(e.to_string());
                0
            }
        }
    }

    /// Waits up to `timeout` for every submit so far to land on the device
    /// ([`CopyEngine::wait_idle`]).
    pub fn wait_copies(&mut self, timeout: std::time::Duration) -> bool {
        self.engine.wait_idle(timeout)
    }

    /// Takes back lane `l`'s untaken messages, in order.
    ///
    /// # Safety
    /// The kernel must have stopped reading the lanes for good (it exited, or its thread or
    /// launch is gone): the host then plays its part.
    pub unsafe fn reclaim(&mut self, l: usize) -> Vec<Slot<In>> {
        // SAFETY: this function's contract.
        unsafe { self.lanes[l].reclaim() }
    }
}

/// CudaSim's copy engine: a host thread that performs each submit's copies in order and then
/// stores its tail with a release store, as the copy stream runs a copy and then the memory
/// operation after it. The driver calls a GPU would make are reported to CudaSim's driver model
/// on the submitting thread (where a GPU's host thread makes them), so strict mode checks them.
pub struct SimCopyEngine {
    tx: Option<std::sync::mpsc::Sender<SimJob>>,
    /// Jobs sent, and jobs done (the thread's count).
    sent: u64,
    done: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Keeps the memory the jobs address alive until the thread has finished them.
    _keep: Vec<SharedMemory>,
}

struct SimJob {
    copies: [CopyRange; 2],
    n: usize,
    tail: u64,
    value: u64,
}

impl SimCopyEngine {
    /// A copy engine over memory that `keep` holds alive (staging, device rings, tails line).
    pub fn new(name: &str, keep: Vec<SharedMemory>) -> Result<Self, PersistentError> {
        let (tx, rx) = std::sync::mpsc::channel::<SimJob>();
        let keep_thread = keep.clone();
        let done = Arc::new(AtomicU64::new(0));
        let done_thread = done.clone();
        let thread = std::thread::Builder::new()
            .name(format!("resident-sim-copy-{}", short(name)))
            .spawn(move || {
                let _keep = keep_thread;
                // The channel orders each job after the host's staging writes (its send
                // happens before this receive).
                while let Ok(job) = rx.recv() {
                    for c in &job.copies[..job.n] {
                        // SAFETY: both ranges lie inside memory `_keep` holds (the staging and
                        // device rings of the submitting lane); the source range holds free
                        // positions the host just wrote and does not write again before the
                        // kernel's head passes them, the destination range positions the
                        // kernel reads only after the tail store below covers them.
                        unsafe {
                            core::ptr::copy_nonoverlapping(
                                c.src as *const u8,
                                c.dst as *mut u8,
                                c.len,
                            )
                        };
                    }
                    // SAFETY: `tail` is an 8-aligned u64 of the tails line (kept alive), written
                    // only by this thread and read by the kernel with acquire loads.
                    let cell = unsafe { AtomicU64::from_ptr(job.tail as *mut u64) };
                    // Release: the copies above are visible to the kernel's acquire of the tail.
                    cell.store(job.value, Ordering::Release);
                    // Release: a waiter that sees the count sees the tail stored.
                    done_thread.fetch_add(1, Ordering::Release);
                }
            })
            .map_err(|source| PersistentError::Spawn {
                what: "the CudaSim copy engine",
                source,
            })?;
        Ok(SimCopyEngine {
            tx: Some(tx),
            sent: 0,
            done,
            thread: Some(thread),
            _keep: keep,
        })
    }
}

impl CopyEngine for SimCopyEngine {
    fn copy_then_publish(
        &mut self,
        copies: &[CopyRange],
        tail: u64,
        value: u64,
    ) -> Result<(), PersistentError> {
        let ctx = crate::sim::driver::SimContext::get();
        for _ in copies {
            ctx.call(resident_cuda::hazards::DriverCall::MemcpyHtoDAsyncPinned)?;
        }
        ctx.call(resident_cuda::hazards::DriverCall::StreamWriteValue)?;
        let mut job = SimJob {
            copies: [CopyRange {
                src: 0,
                dst: 0,
                len: 0,
            }; 2],
            n: copies.len().min(2),
            tail,
            value,
        };
        job.copies[..job.n].copy_from_slice(&copies[..job.n]);
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(job).ok())
            .ok_or(PersistentError::Spawn {
                what: "the CudaSim copy engine (its thread has ended)",
                source: std::io::Error::other("copy engine thread gone"),
            })?;
        self.sent += 1;
        Ok(())
    }

    fn wait_idle(&mut self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        // Acquire: pairs with the thread's count after each tail store.
        while self.done.load(Ordering::Acquire) < self.sent {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        true
    }
}

impl Drop for SimCopyEngine {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has done every job (copies only: no
        // wait on the kernel), so the memory it addresses outlives them.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use resident_ring::spsc::HeapMemory;
    use resident_ring::Envelope;

    fn heap(n: usize) -> SharedMemory {
        SharedMemory(Arc::new(HeapMemory::new(n).unwrap()))
    }

    /// A copy engine that runs the copies at once on the caller's thread.
    struct Inline(Vec<(Vec<CopyRange>, u64, u64)>);
    impl CopyEngine for Inline {
        fn copy_then_publish(
            &mut self,
            copies: &[CopyRange],
            tail: u64,
            value: u64,
        ) -> Result<(), PersistentError> {
            for c in copies {
                // SAFETY: test memory, both ranges inside it (the lane computed them).
                unsafe {
                    core::ptr::copy_nonoverlapping(c.src as *const u8, c.dst as *mut u8, c.len)
                };
            }
            // SAFETY: the tails line of the test, 8-aligned.
            unsafe { AtomicU64::from_ptr(tail as *mut u64) }.store(value, Ordering::Release);
            self.0.push((copies.to_vec(), tail, value));
            Ok(())
        }
        fn wait_idle(&mut self, _: std::time::Duration) -> bool {
            true
        }
    }

    #[test]
    fn choose_keeps_one_path_per_lane() {
        let auto = BulkConfig::default();
        let on = BulkConfig {
            mode: BulkMode::On,
            ..auto
        };
        let off = BulkConfig {
            mode: BulkMode::Off,
            ..auto
        };
        for (ll, bulk, n) in [
            (0, 0, 1),
            (0, 0, 1000),
            (5, 0, 1),
            (0, 5, 1),
            (100, 0, 100),
            (100, 0, 1),
        ] {
            assert_eq!(choose(&off, ll, bulk, n), Some(Path::Ll));
            // A path is never chosen while the other holds messages (Off never has bulk ones,
            // On never LL ones).
            for cfg in [auto, on, off] {
                if (cfg.mode == BulkMode::Off && bulk > 0) || (cfg.mode == BulkMode::On && ll > 0) {
                    continue;
                }
                match choose(&cfg, ll, bulk, n) {
                    Some(Path::Bulk) => assert_eq!(ll, 0, "{cfg:?} {ll} {bulk} {n}"),
                    Some(Path::Ll) => assert_eq!(bulk, 0, "{cfg:?} {ll} {bulk} {n}"),
                    None => assert!(ll > 0),
                }
            }
        }
        assert_eq!(choose(&on, 0, 0, 1), Some(Path::Bulk));
        assert_eq!(choose(&auto, 0, 0, DEFAULT_THRESHOLD - 1), Some(Path::Ll));
        assert_eq!(choose(&auto, 0, 0, DEFAULT_THRESHOLD), Some(Path::Bulk));
    }

    #[test]
    fn bad_settings_are_typed_errors_quoted_short() {
        let long = "x".repeat(1 << 16);
        for (m, t) in [
            (Some("ON"), None),
            (Some(long.as_str()), None),
            (None, Some("-1")),
            (None, Some("many")),
            (None, Some(long.as_str())),
        ] {
            let e = BulkConfig::parse(m, t).unwrap_err();
            assert!(matches!(e, PersistentError::Config { .. }), "{e}");
            assert!(e.to_string().len() < 200, "{e}");
        }
        assert_eq!(
            BulkConfig::parse(Some(" off "), Some("7")).unwrap(),
            BulkConfig {
                mode: BulkMode::Off,
                threshold: 7
            }
        );
    }

    #[test]
    fn submits_wrap_the_ring_and_reclaim_returns_what_was_not_taken() {
        let cap = 8;
        let sb = size_of::<Slot<u64>>();
        let staging = heap(cap * sb);
        let device = heap(cap * sb);
        let heads = heap(BULK_LINE_BYTES);
        let tails = heap(BULK_LINE_BYTES);
        let mem = BulkMemory {
            staging: vec![staging],
            device_slots: vec![device.as_mut_ptr() as u64],
            heads: heads.clone(),
            heads_device: heads.as_mut_ptr() as u64,
            tails_device: tails.as_mut_ptr() as u64,
        };
        let s = |i: u64| Slot::new(Envelope::new(i + 1, 128, i), i * 10);
        // SAFETY: fresh memory; this test plays the kernel through `device` and `heads`.
        let mut b = unsafe {
            BulkLanes::<u64>::new(
                mem,
                cap,
                BulkConfig::default(),
                Box::new(Inline(Vec::new())),
            )
        }
        .unwrap();
        let all: Vec<_> = (0..12).map(s).collect();
        assert_eq!(b.push(0, &all[..6]), 6);
        let tail = |t: &SharedMemory| {
            unsafe { AtomicU64::from_ptr(t.as_mut_ptr() as *mut u64) }.load(Ordering::Acquire)
        };
        assert_eq!(tail(&tails), 6);
        // Full after 2 more until the "kernel" takes some: it takes 4 (head 4), so 6 fit, and
        // their copy wraps the ring (slots 6, 7, then 0..4).
        // SAFETY: the heads line of this test.
        unsafe { AtomicU64::from_ptr(heads.as_mut_ptr() as *mut u64) }.store(4, Ordering::Release);
        assert_eq!(b.push(0, &all[6..]), 6);
        assert_eq!(tail(&tails), 12);
        assert_eq!(b.pending(0), 8);
        assert_eq!(b.push(0, &[s(12)]), 0, "the ring is full");
        // The device ring holds positions 4..12 at slot p % 8, as the kernel reads them.
        for pos in 4..12u64 {
            let i = (pos % cap as u64) as usize;
            // SAFETY: inside the device ring.
            let bytes = unsafe { core::slice::from_raw_parts(device.as_mut_ptr().add(i * sb), sb) };
            assert_eq!(slot_from_bytes::<u64>(bytes), s(pos));
        }
        let st = b.stats();
        assert_eq!(st.messages.load(Ordering::Relaxed), 12);
        assert_eq!(st.copy_engine_bytes.load(Ordering::Relaxed), 12 * sb as u64);
        // 2 submits, the second wrapped: 3 copies and 2 tail stores.
        assert_eq!(st.driver_calls.load(Ordering::Relaxed), 5);
        // SAFETY: no kernel reads this lane.
        let back = unsafe { b.reclaim(0) };
        assert_eq!(back, all[4..].to_vec());
        assert_eq!(b.pending(0), 0);
    }
}
