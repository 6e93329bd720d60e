//! The CPU-backend benchmarks of `resident bench`, each against its baseline in the same run.
//!
//! 1. queue push+pop, single thread, 8 B and 64 B: resident's SPSC ring vs `rtrb` vs
//!    `crossbeam_queue::ArrayQueue` (ns per push+pop pair, best of several rounds);
//! 2. round trip through a kernel with 1 message in flight (send -> handler -> receive, and
//!    `call`) vs a raw `rtrb` ping-pong between two threads (p50/p99/p99.9);
//! 3. throughput through one kernel, pipelined, 64 B messages, vs raw `rtrb` one-way transfer
//!    in chunks.
//!
//! Results go to JSON with the command, machine and date; ratios are resident / baseline
//! (for times, lower is better; for throughput, higher is better).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use resident::prelude::*;
use resident::ring::spsc::Ring;
use serde_json::{json, Value};

use crate::error::BenchError;
use crate::provenance::{machine, today};
use crate::stats::latency_ns;

/// Options of the CPU benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Fewer messages and rounds (about 10 s instead of a minute).
    pub quick: bool,
}

/// Best (lowest) ns per push+pop pair over `rounds` rounds of `n` pairs.
fn best_ns(rounds: usize, n: usize, mut f: impl FnMut(usize)) -> f64 {
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f(n);
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn queue_ops<T: Copy + Send + Default + 'static>(n: usize, rounds: usize) -> Value {
    let (mut tx, mut rx) = Ring::<T>::new(1024).expect("1024 is a valid ring capacity");
    let ours = best_ns(rounds, n, |n| {
        for _ in 0..n {
            let _ = tx.push(black_box(T::default()));
            black_box(rx.pop());
        }
    });
    let (mut ptx, mut prx) = rtrb::RingBuffer::<T>::new(1024);
    let rtrb_ns = best_ns(rounds, n, |n| {
        for _ in 0..n {
            let _ = ptx.push(black_box(T::default()));
            black_box(prx.pop().ok());
        }
    });
    let q = crossbeam_queue::ArrayQueue::<T>::new(1024);
    let cb = best_ns(rounds, n, |n| {
        for _ in 0..n {
            let _ = q.push(black_box(T::default()));
            black_box(q.pop());
        }
    });
    json!({
        "payload_bytes": std::mem::size_of::<T>(),
        "resident_ns_per_push_pop": ours,
        "rtrb_ns_per_push_pop": rtrb_ns,
        "crossbeam_ns_per_push_pop": cb,
        "ratio_vs_rtrb": ours / rtrb_ns,
        "ratio_vs_crossbeam": ours / cb,
    })
}

fn rtrb_ping_pong(n: usize) -> Vec<u64> {
    let (mut atx, mut arx) = rtrb::RingBuffer::<u64>::new(16);
    let (mut btx, mut brx) = rtrb::RingBuffer::<u64>::new(16);
    let echo = std::thread::spawn(move || {
        let mut left = n;
        while left > 0 {
            if let Ok(v) = arx.pop() {
                while btx.push(v).is_err() {}
                left -= 1;
            } else {
                std::hint::spin_loop();
            }
        }
    });
    let mut lat = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        while atx.push(i).is_err() {}
        loop {
            if let Ok(v) = brx.pop() {
                assert_eq!(v, i);
                break;
            }
            std::hint::spin_loop();
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    // The echo thread only pops and pushes: it cannot panic.
    let _ = echo.join();
    lat
}

fn kernel_round_trip(n: usize) -> Result<(Vec<u64>, Vec<u64>), BenchError> {
    let rt = Runtime::builder().backend(Backend::Cpu).build()?;
    let h = rt.launch(
        RingKernel::<u64, u64>::new("echo").handler(|_: &mut Context<()>, x: u64| Some(x)),
    )?;
    h.activate()?;
    let timeout = Duration::from_secs(5);
    for i in 0..1000 {
        h.send(i)?;
        h.receive(timeout)?;
    }
    let mut send_recv = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        h.send(i)?;
        let v = h.receive(timeout)?;
        send_recv.push(t.elapsed().as_nanos() as u64);
        debug_assert_eq!(v, i);
    }
    let mut call = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        let v = h.call(i, timeout)?;
        call.push(t.elapsed().as_nanos() as u64);
        debug_assert_eq!(v, i);
    }
    Ok((send_recv, call))
}

type Payload64 = [u8; 64];

fn kernel_throughput(total: usize) -> Result<f64, BenchError> {
    let rt = Runtime::builder().backend(Backend::Cpu).build()?;
    let h = rt.launch(
        RingKernel::<Payload64, Payload64>::new("pipe")
            .queue_size(8192)
            .priority_lanes(1)
            .batch_size(512)
            .backpressure(Backpressure::Block(Duration::from_secs(10)))
            .handler(|_: &mut Context<()>, mut m: Payload64| {
                m[0] = m[0].wrapping_add(1);
                Some(m)
            }),
    )?;
    h.activate()?;
    let start = Instant::now();
    let tx = h.clone();
    let producer = std::thread::spawn(move || -> Result<()> {
        let batch = vec![[7u8; 64]; 512];
        let mut sent = 0;
        while sent < total {
            let n = (total - sent).min(batch.len());
            sent += tx.send_batch(&batch[..n])?;
        }
        Ok(())
    });
    let mut got = 0;
    let mut out = Vec::with_capacity(8192);
    while got < total {
        out.clear();
        let n = h.receive_batch(&mut out, 8192)?;
        if n == 0 {
            // Three busy threads share two cores here: let the kernel and the producer run.
            std::thread::yield_now();
        }
        got += n;
    }
    let secs = start.elapsed().as_secs_f64();
    producer
        .join()
        .map_err(|_| BenchError::ThreadPanicked("producer"))??;
    Ok(total as f64 / secs)
}

/// Three threads, one message at a time: a sender calling `send` per message, the kernel,
/// and a receiver calling `receive` per message (no batching on either side). Every output is
/// checked: the receiver sees each sent value plus one, in order.
fn kernel_throughput_per_message(total: usize) -> Result<f64, BenchError> {
    let rt = Runtime::builder().backend(Backend::Cpu).build()?;
    let h = rt.launch(
        RingKernel::<u64, u64>::new("one-by-one")
            .queue_size(8192)
            .priority_lanes(1)
            .batch_size(512)
            .backpressure(Backpressure::Block(Duration::from_secs(10)))
            .handler(|_: &mut Context<()>, x: u64| Some(x + 1)),
    )?;
    h.activate()?;
    let start = Instant::now();
    let tx = h.clone();
    let producer = std::thread::spawn(move || -> Result<()> {
        for i in 0..total as u64 {
            tx.send(i)?;
        }
        Ok(())
    });
    for i in 0..total as u64 {
        let got = h.receive(Duration::from_secs(10))?;
        if got != i + 1 {
            return Err(BenchError::WrongOutput {
                index: i,
                got,
                want: i + 1,
            });
        }
    }
    let secs = start.elapsed().as_secs_f64();
    producer
        .join()
        .map_err(|_| BenchError::ThreadPanicked("producer"))??;
    Ok(total as f64 / secs)
}

fn rtrb_throughput(total: usize) -> f64 {
    let (mut tx, mut rx) = rtrb::RingBuffer::<Payload64>::new(8192);
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let d2 = done.clone();
    let producer = std::thread::spawn(move || {
        let mut sent = 0;
        while sent < total {
            let want = (total - sent).min(512).min(tx.slots());
            if want == 0 {
                std::hint::spin_loop();
                continue;
            }
            // `want` is at most the free slots just read: the chunk is there.
            let Ok(chunk) = tx.write_chunk_uninit(want) else {
                continue;
            };
            sent += chunk.fill_from_iter(std::iter::repeat([7u8; 64]));
        }
        d2.store(true, Ordering::Release);
    });
    let mut got = 0;
    let mut sum = 0u64;
    while got < total {
        let n = rx.slots().min(8192);
        if n == 0 {
            std::hint::spin_loop();
            continue;
        }
        // `n` is at most the filled slots just read: the chunk is there.
        let Ok(chunk) = rx.read_chunk(n) else {
            continue;
        };
        for m in chunk {
            sum += m[0] as u64;
        }
        got += n;
    }
    black_box(sum);
    let secs = start.elapsed().as_secs_f64();
    // The producer only pushes into the ring: it cannot panic.
    let _ = producer.join();
    total as f64 / secs
}

/// Runs the CPU benchmarks and returns their report (JSON with the command, date, machine
/// and every figure with its baseline). `say` gets one line per result as it is measured.
pub fn run(opts: &Options, say: &mut dyn FnMut(String)) -> Result<Value, BenchError> {
    let (pairs, rounds, rt_n, tp_n) = if opts.quick {
        (2_000_000, 5, 20_000, 5_000_000)
    } else {
        (10_000_000, 9, 100_000, 30_000_000)
    };
    say(format!(
        "== bench: CPU backend, {} ==",
        if opts.quick { "quick" } else { "full" }
    ));
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);

    let q8 = queue_ops::<u64>(pairs, rounds);
    let q64 = queue_ops::<[u64; 8]>(pairs, rounds);
    for q in [&q8, &q64] {
        say(format!(
            "queue push+pop {:>2} B: resident {:.2} ns, rtrb {:.2} ns, crossbeam {:.2} ns  (x{:.2} vs rtrb, x{:.2} vs crossbeam)",
            q["payload_bytes"], f(q, "resident_ns_per_push_pop"), f(q, "rtrb_ns_per_push_pop"),
            f(q, "crossbeam_ns_per_push_pop"), f(q, "ratio_vs_rtrb"), f(q, "ratio_vs_crossbeam")
        ));
    }

    let base = latency_ns(rtrb_ping_pong(rt_n));
    let (sr, call) = kernel_round_trip(rt_n)?;
    let (sr, call) = (latency_ns(sr), latency_ns(call));
    let ratio = |a: &Value, k: &str| f(a, k) / f(&base, k).max(1.0);
    let rt_json = json!({
        "in_flight": 1,
        "payload_bytes": 8,
        "baseline_rtrb_ping_pong": base,
        "kernel_send_receive": sr,
        "kernel_call": call,
        "ratio_p50_send_receive": ratio(&sr, "p50_ns"),
        "ratio_p50_call": ratio(&call, "p50_ns"),
        "ratio_p99_send_receive": ratio(&sr, "p99_ns"),
    });
    for (name, v) in [
        ("rtrb ping-pong", &base),
        ("kernel send+receive", &sr),
        ("kernel call", &call),
    ] {
        say(format!(
            "round trip {name:<20} p50 {:>6} ns  p99 {:>7} ns  p99.9 {:>8} ns",
            v["p50_ns"], v["p99_ns"], v["p999_ns"]
        ));
    }
    say(format!(
        "round trip p50 ratio vs ping-pong: send+receive x{:.2}, call x{:.2}",
        f(&rt_json, "ratio_p50_send_receive"),
        f(&rt_json, "ratio_p50_call")
    ));

    let base_tp = rtrb_throughput(tp_n);
    let ours_tp = kernel_throughput(tp_n)?;
    let tp_json = json!({"payload_bytes": 64, "messages": tp_n, "baseline_rtrb_one_way_msgs_per_s": base_tp, "kernel_msgs_per_s": ours_tp, "ratio": ours_tp / base_tp});
    say(format!(
        "throughput 64 B: kernel {:.2} M msg/s, rtrb one-way {:.2} M msg/s (x{:.2})",
        ours_tp / 1e6,
        base_tp / 1e6,
        ours_tp / base_tp
    ));
    let one_n = tp_n / 2;
    let one = kernel_throughput_per_message(one_n)?;
    let one_json = json!({"payload_bytes": 8, "messages": one_n, "threads": "one sender (send per message), the kernel, one receiver (receive per message)", "kernel_msgs_per_s": one, "ratio_vs_rtrb_one_way": one / base_tp});
    say(format!(
        "throughput 8 B, send and receive per message (3 threads): {:.2} M msg/s",
        one / 1e6
    ));

    Ok(json!({
        "benchmark": "cpu-backend",
        "command": crate::provenance::command(),
        "date": today(),
        "machine": machine(),
        "queue_push_pop": [q8, q64],
        "round_trip": rt_json,
        "throughput": tp_json,
        "throughput_per_message": one_json,
    }))
}
