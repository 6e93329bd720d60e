//! CudaSim's bus model: what a ring kernel costs on the PCIe bus, counted exactly.
//!
//! On a GPU the queues live in pinned host memory, so every system-scope load or store the
//! kernel template makes on them is a bus transaction, and a load is a round trip the thread
//! may have to wait for. CudaSim runs the very template, and its shim counts those accesses
//! (see `kernels/sim_shim.h`, "the bus model") together with the **dependent read chain**: the
//! number of loads on the longest path of loads that wait for each other, from the poll that
//! finds a batch to the store that makes its outputs visible. The chain is what a message's
//! latency is made of near the bus (one PCIe read round trip is about 1 us), and unlike a time
//! it is the same on every run, so CI can hold it.
//!
//! What the model assumes, from the PTX memory model: a relaxed load does not make the thread
//! wait until its value is used, so independent loads overlap; an acquire load makes later
//! loads wait; an acquire fence and a release store wait for every load before them; a
//! barrier or warp collective shares what every thread has waited for. Control-block
//! accesses are counted apart; idle polls (a poll that finds nothing) are counted apart too,
//! since how many happen depends on timing.
//!
//! ```
//! use resident_engine_cuda::sim::bus::BusStats;
//! let s = BusStats::from_fields(&[9, 10, 72, 80, 0, 0, 1, 1, 9, 10, 72, 80, 2, 2, 0, 0, 0]);
//! assert_eq!(s.per_message().reads, 9.0);
//! assert_eq!(s.chain_max, 2);
//! ```

/// The counters of one kernel (since its launch; a relaunch over the same module continues
/// them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BusStats {
    /// Queue loads (a 16-byte vector load is one).
    pub reads: u64,
    /// Queue stores.
    pub writes: u64,
    /// Bytes loaded from queue memory.
    pub read_bytes: u64,
    /// Bytes stored to queue memory.
    pub write_bytes: u64,
    /// Control-block loads (heartbeat, run state, peer slot).
    pub control_reads: u64,
    /// Control-block stores (counters, device state).
    pub control_writes: u64,
    /// Batches handled.
    pub batches: u64,
    /// Messages those batches handled.
    pub messages: u64,
    /// Queue loads inside batches: from the poll that found the batch to its outputs.
    pub batch_reads: u64,
    /// Queue stores inside batches.
    pub batch_writes: u64,
    /// Bytes of `batch_reads`.
    pub batch_read_bytes: u64,
    /// Bytes of `batch_writes`.
    pub batch_write_bytes: u64,
    /// Dependent read chains of all batches, summed.
    pub chain_sum: u64,
    /// The longest dependent read chain of any batch.
    pub chain_max: u64,
    /// Polls that found nothing.
    pub idle_polls: u64,
    /// Their queue loads.
    pub idle_reads: u64,
    /// 16-byte loads split in two with the writer let run between (tear mode).
    pub torn_reads: u64,
    /// Fences and release stores inside batches: on a GPU each waits for the thread's earlier
    /// writes to reach host memory (a PCIe write flush) as well as for its pending loads.
    pub batch_fences: u64,
    /// Loads of device memory by the kernel (the bulk lanes' device rings and tails line: L2
    /// reads on a GPU, no bus round trip; never in the dependent chain).
    pub dev_reads: u64,
    /// Bytes of `dev_reads`.
    pub dev_read_bytes: u64,
    /// Device-memory loads inside batches.
    pub batch_dev_reads: u64,
    /// Bytes of `batch_dev_reads`.
    pub batch_dev_read_bytes: u64,
    /// Bytes the copy engine moved into the bulk lanes' device rings (counted by the host's
    /// submits, [`crate::persistent::BulkStats`]; not the shim's).
    pub copy_engine_bytes: u64,
    /// Driver calls of those submits (a copy per contiguous range, a stream memory operation
    /// per submit).
    pub driver_calls: u64,
}

/// How many counters the shim exports, in [`BusStats::from_fields`] order.
pub const BUS_FIELDS: usize = 22;

/// Figures divided by a count (per message or per batch).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BusRates {
    /// Queue loads.
    pub reads: f64,
    /// Queue stores.
    pub writes: f64,
    /// Bytes loaded.
    pub read_bytes: f64,
    /// Bytes stored.
    pub write_bytes: f64,
    /// Dependent read chain (mean over batches; per message it is the batch's).
    pub chain: f64,
    /// Fences and release stores (see [`BusStats::batch_fences`]).
    pub fences: f64,
    /// Bytes loaded from device memory (bulk lanes).
    pub dev_read_bytes: f64,
    /// Bytes the copy engine moved.
    pub copy_engine_bytes: f64,
    /// Driver calls the host made for the copies.
    pub driver_calls: f64,
}

impl BusStats {
    /// From the shim's counters in its `BusField` order (missing ones are 0).
    pub fn from_fields(v: &[u64]) -> BusStats {
        let f = |i: usize| v.get(i).copied().unwrap_or(0);
        BusStats {
            reads: f(0),
            writes: f(1),
            read_bytes: f(2),
            write_bytes: f(3),
            control_reads: f(4),
            control_writes: f(5),
            batches: f(6),
            messages: f(7),
            batch_reads: f(8),
            batch_writes: f(9),
            batch_read_bytes: f(10),
            batch_write_bytes: f(11),
            chain_sum: f(12),
            chain_max: f(13),
            idle_polls: f(14),
            idle_reads: f(15),
            torn_reads: f(16),
            batch_fences: f(17),
            dev_reads: f(18),
            dev_read_bytes: f(19),
            batch_dev_reads: f(20),
            batch_dev_read_bytes: f(21),
            copy_engine_bytes: 0,
            driver_calls: 0,
        }
    }

    /// The counters accumulated since `earlier` (a snapshot of the same kernel); `chain_max`
    /// stays this snapshot's (a maximum cannot be subtracted).
    pub fn since(&self, earlier: &BusStats) -> BusStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        BusStats {
            reads: d(self.reads, earlier.reads),
            writes: d(self.writes, earlier.writes),
            read_bytes: d(self.read_bytes, earlier.read_bytes),
            write_bytes: d(self.write_bytes, earlier.write_bytes),
            control_reads: d(self.control_reads, earlier.control_reads),
            control_writes: d(self.control_writes, earlier.control_writes),
            batches: d(self.batches, earlier.batches),
            messages: d(self.messages, earlier.messages),
            batch_reads: d(self.batch_reads, earlier.batch_reads),
            batch_writes: d(self.batch_writes, earlier.batch_writes),
            batch_read_bytes: d(self.batch_read_bytes, earlier.batch_read_bytes),
            batch_write_bytes: d(self.batch_write_bytes, earlier.batch_write_bytes),
            chain_sum: d(self.chain_sum, earlier.chain_sum),
            chain_max: self.chain_max,
            idle_polls: d(self.idle_polls, earlier.idle_polls),
            idle_reads: d(self.idle_reads, earlier.idle_reads),
            torn_reads: d(self.torn_reads, earlier.torn_reads),
            batch_fences: d(self.batch_fences, earlier.batch_fences),
            dev_reads: d(self.dev_reads, earlier.dev_reads),
            dev_read_bytes: d(self.dev_read_bytes, earlier.dev_read_bytes),
            batch_dev_reads: d(self.batch_dev_reads, earlier.batch_dev_reads),
            batch_dev_read_bytes: d(self.batch_dev_read_bytes, earlier.batch_dev_read_bytes),
            copy_engine_bytes: d(self.copy_engine_bytes, earlier.copy_engine_bytes),
            driver_calls: d(self.driver_calls, earlier.driver_calls),
        }
    }

    fn rates(&self, by: u64) -> BusRates {
        let per = |x: u64| if by == 0 { 0.0 } else { x as f64 / by as f64 };
        BusRates {
            reads: per(self.batch_reads),
            writes: per(self.batch_writes),
            read_bytes: per(self.batch_read_bytes),
            write_bytes: per(self.batch_write_bytes),
            fences: per(self.batch_fences),
            dev_read_bytes: per(self.batch_dev_read_bytes),
            copy_engine_bytes: per(self.copy_engine_bytes),
            driver_calls: per(self.driver_calls),
            chain: if self.batches == 0 {
                0.0
            } else {
                self.chain_sum as f64 / self.batches as f64
            },
        }
    }

    /// Batch traffic per message handled (idle polls and control accesses left out).
    pub fn per_message(&self) -> BusRates {
        self.rates(self.messages)
    }

    /// Batch traffic per batch.
    pub fn per_batch(&self) -> BusRates {
        self.rates(self.batches)
    }
}
