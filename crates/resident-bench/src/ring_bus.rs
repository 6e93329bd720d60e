//! The ring benchmark's bus figures (`resident bench-ring --model`, and beside the times of
//! `resident bench-ring` on a GPU): the persistent ring kernel of the ring benchmark, the same
//! template and handler, run on CudaSim with its bus model (`resident_cuda::bus`). What it
//! reports per message and per batch (queue reads, writes, bytes, and the dependent read
//! chain: the bus round trips between the poll that finds a batch and its outputs becoming
//! visible) is exact: the same on every run and every machine, so CI holds it.
//!
//! Two points per payload size, both deterministic:
//! * **1 in flight**: one message sent, its output awaited, `messages` times;
//! * **a full batch**: `block` messages queued while the kernel is inactive, then activated:
//!   the first poll takes them all as one batch (repeated `batches` times, after one batch
//!   that is not counted).
//!
//! Idle polls (polls that find nothing) depend on timing; they are reported apart, never in
//! the per-message figures.

use std::time::{Duration, Instant};

use bytemuck::Pod;
use resident_cuda::bus::{BusRates, BusStats};
use resident_cuda::persistent::template::MessageDecl;
use resident_cuda::persistent::{
    DeviceState, KernelSource, QueueConfig, SimKernel, SimLaunchOptions,
};
use resident_ring::{Envelope, Slot};
use serde_json::{json, Value};

use crate::error::OutputCheck;
use crate::BenchError;

/// The ring benchmark's kernel: `words` 64-bit words in and out, the handler adds 1 to each.
pub(crate) fn bench_source(words: usize, batch: u32) -> KernelSource {
    let decl = |n: &str| format!("typedef struct {{ unsigned long long w[{words}]; }} {n};");
    KernelSource::new(
        format!("bench{}", words * 8),
        MessageDecl::new("BenchIn", decl("BenchIn"), words * 8),
        MessageDecl::new("BenchOut", decl("BenchOut"), words * 8),
        MessageDecl::new("BenchState", "typedef struct { unsigned long long unused; } BenchState;", 8),
        "__device__ bool handle(BenchState* s, const BenchIn* in, BenchOut* out, const Envelope* env) {\n\
         for (int i = 0; i < (int)(sizeof(in->w) / 8); ++i) out->w[i] = in->w[i] + 1ull;\n\
         return true;\n}\n",
        batch,
    )
}

/// The handler adds 1 to every word: input word = id - 1, output word = id.
pub(crate) fn check<const W: usize>(
    s: &Slot<[u64; W]>,
    variant: &'static str,
) -> Result<(), BenchError> {
    let want = s.env.correlation_id;
    match s.payload.iter().find(|&&w| w != want) {
        None => Ok(()),
        Some(&got) => Err(BenchError::Check {
            variant,
            check: OutputCheck::Value {
                message: want,
                got,
                want,
            },
        }),
    }
}

/// One point of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct BusRow {
    /// Payload bytes (the 32-byte envelope comes on top).
    pub payload_bytes: usize,
    /// Messages per batch: 1, or the block size.
    pub in_flight: usize,
    /// Threads per block of the kernel.
    pub block_threads: u32,
    /// The counters of the run (batches, messages, totals, chain maximum, idle polls).
    pub stats: BusStats,
}

impl BusRow {
    /// Queue traffic per message.
    pub fn per_message(&self) -> BusRates {
        self.stats.per_message()
    }
    /// Queue traffic per batch.
    pub fn per_batch(&self) -> BusRates {
        self.stats.per_batch()
    }
}

/// How many messages and batches each point runs.
#[derive(Clone, Copy, Debug)]
pub struct BusPlan {
    /// Messages of the 1-in-flight point.
    pub messages: usize,
    /// Full batches of the batch point.
    pub batches: usize,
    /// The kernel's block size (messages per full batch).
    pub block: u32,
}

impl Default for BusPlan {
    /// The GPU benchmark's block (1024 threads), 200 single messages, 2 full batches.
    fn default() -> Self {
        BusPlan {
            messages: 200,
            batches: 2,
            block: 1024,
        }
    }
}

const WAIT: Duration = Duration::from_secs(60);

fn wait<T>(what: &'static str, mut f: impl FnMut() -> Option<T>) -> Result<T, BenchError> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > WAIT {
            return Err(BenchError::Timeout { what, limit: WAIT });
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn stats<In: Pod + Send, Out: Pod + Send>(k: &SimKernel<In, Out>) -> Result<BusStats, BenchError> {
    k.bus_stats().ok_or(BenchError::NoBusModel)
}

fn payload_rows<const W: usize>(plan: &BusPlan, rows: &mut Vec<BusRow>) -> Result<(), BenchError>
where
    [u64; W]: Pod,
{
    let block = plan.block;
    let cap = (block as usize).next_power_of_two().max(1024);
    let opts = SimLaunchOptions {
        queues: QueueConfig {
            lanes: 1,
            lane_capacity: cap,
            out_capacity: cap,
        },
        heartbeat_timeout: None,
        ..SimLaunchOptions::default()
    };
    let source = bench_source(W, block);
    let mut k = SimKernel::<[u64; W], [u64; W]>::launch(&source, &[0u8; 8], &opts)?;
    let mut out: Vec<Slot<[u64; W]>> = Vec::new();
    let mut next = 0u64;

    // ---- 1 in flight ----
    k.activate();
    let before = stats(&k)?;
    for _ in 0..plan.messages {
        k.send(Envelope::new(next + 1, 128, 0), [next; W])
            .map_err(|_| BenchError::Check {
                variant: "persistent",
                check: OutputCheck::LaneFull,
            })?;
        out.clear();
        wait("an output on CudaSim", || {
            (k.receive_into(&mut out, 1) == 1).then_some(())
        })?;
        check(&out[0], "persistent")?;
        next += 1;
    }
    let want = before.batches + plan.messages as u64;
    // The model closes a batch just after the store that shows its outputs.
    let s = wait("the model's count", || {
        stats(&k).ok().filter(|s| s.batches >= want)
    })?;
    rows.push(BusRow {
        payload_bytes: W * 8,
        in_flight: 1,
        block_threads: block,
        stats: s.since(&before),
    });

    // ---- full batches, queued while inactive ----
    // One batch first, not counted: the kernel predicts the output room a batch needs from the
    // last one, so the first full batch after single messages pays one more read (steady state
    // is what the row reports).
    let mut before = stats(&k)?;
    let mut chain_max = 0;
    for b in 0..=plan.batches {
        if b == 1 {
            before = stats(&k)?;
            chain_max = 0;
        }
        k.deactivate();
        wait("the kernel to park", || {
            (k.device_counters().state == Some(DeviceState::Idle)).then_some(())
        })?;
        let at = stats(&k)?;
        let slots: Vec<Slot<[u64; W]>> = (0..block as u64)
            .map(|j| Slot::new(Envelope::new(next + j + 1, 128, 0), [next + j; W]))
            .collect();
        if k.send_batch(&slots) != slots.len() {
            return Err(BenchError::Check {
                variant: "persistent",
                check: OutputCheck::LaneFull,
            });
        }
        k.activate();
        let mut got = 0;
        wait("a batch's outputs on CudaSim", || {
            out.clear();
            got += k.receive_into(&mut out, block as usize);
            for s in &out {
                if let Err(e) = check(s, "persistent") {
                    return Some(Err(e));
                }
            }
            (got == block as usize).then_some(Ok(()))
        })??;
        let s = wait("the model's count", || {
            stats(&k).ok().filter(|s| s.batches > at.batches)
        })?;
        chain_max = chain_max.max(s.since(&at).chain_sum);
        next += block as u64;
        // Two idle polls after the outputs were taken: the kernel has seen the output ring
        // empty again, so no batch finds a stale view of it (whether one did would depend on
        // timing, and the figures must not).
        let idle = s.idle_polls;
        wait("two idle polls", || {
            stats(&k).ok().filter(|s| s.idle_polls >= idle + 2)
        })?;
    }
    let mut s = stats(&k)?.since(&before);
    s.chain_max = chain_max;
    rows.push(BusRow {
        payload_bytes: W * 8,
        in_flight: block as usize,
        block_threads: block,
        stats: s,
    });
    k.terminate(Duration::from_secs(30))?;
    Ok(())
}

/// The model's rows for 16 / 64 / 256-byte payloads (the ring benchmark's sizes).
pub fn bus_model(plan: &BusPlan) -> Result<Vec<BusRow>, BenchError> {
    if plan.messages == 0 || plan.batches == 0 {
        return Err(BenchError::Parameter {
            name: "bus model messages/batches",
            value: 0,
            must: "at least 1",
        });
    }
    if !plan.block.is_multiple_of(32) || !(32..=1024).contains(&plan.block) {
        return Err(BenchError::Parameter {
            name: "bus model block",
            value: plan.block as u64,
            must: "a multiple of 32 in 32..=1024",
        });
    }
    let mut rows = Vec::new();
    payload_rows::<2>(plan, &mut rows)?;
    payload_rows::<8>(plan, &mut rows)?;
    payload_rows::<32>(plan, &mut rows)?;
    Ok(rows)
}

fn rates(r: &BusRates) -> Value {
    json!({"reads": r.reads, "writes": r.writes, "read_bytes": r.read_bytes,
           "write_bytes": r.write_bytes, "dependent_reads": r.chain, "fences": r.fences})
}

/// The rows as JSON: `[{payload_bytes, in_flight, block_threads, messages, batches,
/// per_message: {reads, writes, read_bytes, write_bytes, dependent_reads, fences}, per_batch: {...},
/// dependent_reads_max, idle_polls, idle_reads_per_poll, control_reads, control_writes}]`.
pub fn rows_json(rows: &[BusRow]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                let s = &r.stats;
                json!({"payload_bytes": r.payload_bytes, "in_flight": r.in_flight,
                       "block_threads": r.block_threads, "messages": s.messages, "batches": s.batches,
                       "per_message": rates(&r.per_message()), "per_batch": rates(&r.per_batch()),
                       "dependent_reads_max": s.chain_max,
                       "idle_polls": s.idle_polls,
                       "idle_reads_per_poll": if s.idle_polls == 0 { 0.0 } else { s.idle_reads as f64 / s.idle_polls as f64 },
                       "control_reads": s.control_reads, "control_writes": s.control_writes})
            })
            .collect(),
    )
}

/// What the model's figures mean, for the result files.
pub const MODEL_MEANS: &str = "CudaSim's bus model of the persistent ring kernel (the GPU template, run on host threads): \
queue loads and stores (pinned memory, PCIe on a GPU; a 16-byte access is one) and the dependent read chain \
(bus round trips from the poll that finds a batch to the store that makes its outputs visible); \
fences: fences and release stores in a batch, each of which waits on a GPU for the earlier writes to reach host memory; \
exact, idle polls and control-block accesses apart";

/// One line per row, for the terminal.
pub fn row_line(r: &BusRow) -> String {
    let m = r.per_message();
    let b = r.per_batch();
    format!(
        "model {:>4} B in_flight {:>5}: per message {:>6.2} reads {:>6.2} writes {:>7.1} B read {:>7.1} B written; per batch {:>7.1} reads, dependent reads {:.2} (max {}), fences {:.2}",
        r.payload_bytes, r.in_flight, m.reads, m.writes, m.read_bytes, m.write_bytes, b.reads, b.chain, r.stats.chain_max, b.fences
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_plans_are_typed_errors() {
        for plan in [
            BusPlan {
                messages: 0,
                ..BusPlan::default()
            },
            BusPlan {
                batches: 0,
                ..BusPlan::default()
            },
            BusPlan {
                block: 48,
                ..BusPlan::default()
            },
            BusPlan {
                block: 2048,
                ..BusPlan::default()
            },
        ] {
            assert!(
                matches!(bus_model(&plan), Err(BenchError::Parameter { .. })),
                "{plan:?}"
            );
        }
    }
}
