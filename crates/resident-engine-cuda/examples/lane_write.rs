//! The host's cost of writing an input lane in the LL format (`LaneWriter::push_slice`), no
//! GPU needed: batches of 1024 slots into a 4096-slot lane in ordinary memory, the kernel's
//! head moved by hand after each. Prints `payload_bytes min_ns median_ns` per message over
//! 1800 batches (200 more warm up first), for 16, 64 and 256-byte payloads.
//!
//!     cargo run --release -p resident-engine-cuda --features cuda --example lane_write
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use resident_engine_cuda::persistent::lane::{lane_bytes, LaneWriter};
use resident_engine_cuda::persistent::SharedMemory;
use resident_ring::spsc::{HeapMemory, RingHeader};
use resident_ring::{Envelope, Slot};

fn run<const W: usize>() {
    let cap = 4096usize;
    let heap = HeapMemory::new(lane_bytes::<[u64; W]>(cap)).expect("lane memory");
    let mem = SharedMemory(Arc::new(heap));
    // SAFETY: fresh memory and the only writer; nothing else reads the lane but this loop's
    // stores of the head below, which play the kernel.
    let mut w = unsafe { LaneWriter::<[u64; W]>::new(mem.clone(), cap) }.expect("lane");
    // SAFETY: the lane memory starts with its 128-aligned RingHeader (two atomics and padding)
    // and lives as long as `mem`.
    let header = unsafe { &*(mem.0.as_mut_ptr() as *const RingHeader) };
    let stage: Vec<Slot<[u64; W]>> = (0..1024u64)
        .map(|i| Slot::new(Envelope::new(i + 1, 128, 7), [i; W]))
        .collect();
    let mut per_msg = Vec::new();
    let mut total = 0u64;
    for rep in 0..2000 {
        let t0 = Instant::now();
        let n = w.push_slice(&stage);
        let ns = t0.elapsed().as_nanos() as f64 / n as f64;
        if rep >= 200 {
            per_msg.push(ns);
        }
        total += n as u64;
        // The kernel's part: everything written is taken.
        header.head.store(total, Ordering::Release);
    }
    per_msg.sort_by(f64::total_cmp);
    println!(
        "{} {:.1} {:.1}",
        W * 8,
        per_msg[0],
        per_msg[per_msg.len() / 2]
    );
}

fn main() {
    run::<2>();
    run::<8>();
    run::<32>();
}
