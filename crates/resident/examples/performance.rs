//! Batching against one call per message, measured on the backend named on the command line
//! (`resident::guide::performance`). A rough illustration, not a benchmark: `resident bench`
//! measures properly, with repeats and spread.

mod common;

use resident::prelude::*;
use std::time::{Duration, Instant};

const N: u64 = 20_000;

fn kernel(id: &str) -> RingKernel<u64, u64> {
    RingKernel::<u64, u64>::new(id)
        .queue_size(4096)
        .output_queue_size(4096)
        .batch_size(256)
        .handler(|_: &mut Context<()>, x: u64| Some(x + 1))
}

fn main() -> Result<(), resident::Error> {
    let rt = common::runtime();
    let t = Duration::from_secs(10);

    let one = rt.launch(kernel("one-at-a-time"))?;
    one.activate()?;
    let start = Instant::now();
    for i in 0..N {
        one.call(i, t)?;
    }
    let calls = start.elapsed();

    let batched = rt.launch(kernel("batched"))?;
    batched.activate()?;
    let input: Vec<u64> = (0..N).collect();
    let (mut out, mut sent) = (Vec::with_capacity(input.len()), 0);
    let start = Instant::now();
    while out.len() < input.len() {
        let room = (4096 - (sent - out.len())).min(input.len() - sent);
        if room > 0 {
            sent += batched.send_batch(&input[sent..sent + room])?;
        }
        if batched.receive_batch(&mut out, 4096)? == 0 {
            out.push(batched.receive(t)?);
        }
    }
    let batch = start.elapsed();
    assert_eq!(out.last(), Some(&N));
    println!(
        "{N} messages: one call each {:.1?} ({:.0} ns/msg), send_batch/receive_batch {:.1?} ({:.0} ns/msg), x{:.1}",
        calls,
        calls.as_nanos() as f64 / N as f64,
        batch,
        batch.as_nanos() as f64 / N as f64,
        calls.as_secs_f64() / batch.as_secs_f64()
    );
    Ok(())
}
