//! The persistent ring kernel against launch-per-batch and a CUDA graph (`resident bench-ring`):
//! round trips at one message in flight and throughput with many, for 16 / 64 / 256-byte
//! payloads, every variant built from the same kernel template (the persistent kernel through
//! [`PersistentKernel`], the baselines through the template's one-shot kernel,
//! [`load_batch_kernel`]). Every output is checked, not just counted.
//!
//! Needs a GPU, the driver and NVRTC; their absence is a typed error
//! ([`PersistentError::DriverUnavailable`] / [`PersistentError::NvrtcUnavailable`] inside
//! [`BenchError::Persistent`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytemuck::Pod;
use resident_cuda::{
    CudaError, Device, DeviceBuffer, Function, Graph, KernelParams, LaunchConfig, PinnedMemory,
    Stream,
};
use resident_engine_cuda::persistent::template::nvrtc_available;
use resident_engine_cuda::persistent::{
    batch_scan_bytes, load_batch_kernel, open_device, BulkConfig, BulkMode, KernelSource,
    LaunchOptions, PersistentError, PersistentKernel, QueueConfig,
};
use resident_ring::{Envelope, Slot};
use serde_json::{json, Value};

use crate::error::OutputCheck;
use crate::ring_bus::{bench_source, check};
use crate::stats::quantile;
use crate::BenchError;

/// One benchmark measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRow {
    /// `persistent`, `persistent_streaming`, `launch_per_batch` or `graph`.
    pub variant: &'static str,
    /// What p50/p99/p99.9 measure, identical for every variant of the same `in_flight`:
    /// [`MEASURES_MESSAGE`] (in_flight 1), [`MEASURES_BATCH`] (a closed-loop batch of
    /// `in_flight` messages), or [`MEASURES_STREAMING`] (the `persistent_streaming` row only).
    pub measures: &'static str,
    /// Payload size in bytes (the envelope's 32 bytes come on top).
    pub payload_bytes: usize,
    /// Messages in flight (1 = latency run).
    pub in_flight: usize,
    /// Round-trip median, ns (latency runs; throughput runs report the per-batch round trip).
    pub p50_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// 99.9th percentile, ns.
    pub p999_ns: u64,
    /// Messages per second.
    pub msgs_per_s: f64,
    /// Threads per block of the kernel measured (the most messages one batch handles).
    pub block_threads: u32,
    /// The persistent rows only: the host's time inside `send`/`send_batch` per message sent
    /// (writing the lane slots and publishing the tail), ns. The baselines' host work (copies,
    /// launches) is inside their round trip and not split out.
    pub host_send_ns_per_msg: Option<f64>,
}

/// Latency rows: one message's round trip, from send to its output received.
pub const MEASURES_MESSAGE: &str = "round trip of one message: send to its output received";
/// Batch rows: a batch of `in_flight` messages, from the first send to the last output
/// received (the launch-per-batch variants' `run()`, the persistent kernel fed the same batch).
pub const MEASURES_BATCH: &str =
    "round trip of a batch of in_flight messages: first send to last output received";
/// The streaming row: each message's send-to-receive time while `in_flight` stay outstanding.
pub const MEASURES_STREAMING: &str =
    "per message, send to output received, with in_flight messages kept outstanding (queueing included)";

/// The launch-per-batch baseline (and, with `graph`, its CUDA-graph variant): inputs staged in
/// pinned memory, copied to device memory, one launch of the template's batch kernel, outputs
/// copied back, stream synchronized.
struct BatchRunner<In, Out> {
    f: Function,
    stream: Stream,
    d_in: DeviceBuffer,
    d_out: DeviceBuffer,
    d_count: DeviceBuffer,
    d_state: DeviceBuffer,
    /// The grid's block ticket and chained-scan cells (zeroed before every launch).
    d_scan: DeviceBuffer,
    h_in: PinnedMemory,
    h_out: PinnedMemory,
    h_count: PinnedMemory,
    max_n: usize,
    block: u32,
    graphs: Vec<(usize, Graph)>,
    _t: core::marker::PhantomData<fn(In) -> Out>,
}

impl<In: Pod, Out: Pod> BatchRunner<In, Out> {
    fn new(
        device: &Arc<Device>,
        source: &KernelSource,
        state: &[u8],
        max_n: usize,
    ) -> Result<Self, BenchError> {
        let f = load_batch_kernel::<In, Out>(device, source)?;
        let in_bytes = max_n * core::mem::size_of::<Slot<In>>();
        let out_bytes = max_n * core::mem::size_of::<Slot<Out>>();
        let mut d_state = DeviceBuffer::alloc(device, state.len())?;
        d_state.copy_from_host(state)?;
        Ok(BatchRunner {
            f,
            stream: Stream::new(device)?,
            d_in: DeviceBuffer::alloc(device, in_bytes)?,
            d_out: DeviceBuffer::alloc(device, out_bytes)?,
            d_count: DeviceBuffer::alloc(device, 4)?,
            d_state,
            d_scan: DeviceBuffer::alloc(device, batch_scan_bytes(max_n, source.batch_size))?,
            h_in: PinnedMemory::new(device, in_bytes)?,
            h_out: PinnedMemory::new(device, out_bytes)?,
            h_count: PinnedMemory::new(device, 4)?,
            max_n,
            block: source.batch_size,
            graphs: Vec::new(),
            _t: core::marker::PhantomData,
        })
    }

    /// Enqueues copy-in, launch and copy-out of `n` staged inputs on `stream`.
    fn enqueue(
        f: &Function,
        bufs: (
            &mut DeviceBuffer,
            &mut DeviceBuffer,
            &mut DeviceBuffer,
            &DeviceBuffer,
            &mut DeviceBuffer,
        ),
        host: (&PinnedMemory, &PinnedMemory, &PinnedMemory),
        n: usize,
        block: u32,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        let (d_in, d_out, d_count, d_state, d_scan) = bufs;
        let (h_in, h_out, h_count) = host;
        let in_bytes = n * core::mem::size_of::<Slot<In>>();
        let out_bytes = n * core::mem::size_of::<Slot<Out>>();
        // SAFETY: the staging memory is pinned and lives as long as the runner; the caller
        // synchronizes the stream before touching it again; in_bytes <= its length.
        let src = unsafe { core::slice::from_raw_parts(h_in.as_ptr(), in_bytes) };
        // SAFETY: as above.
        unsafe { d_in.copy_prefix_from_host_async(src, stream)? };
        let blocks = n.div_ceil(block as usize) as u32;
        d_scan.memset_zero_async(stream)?;
        let mut args = KernelParams::new();
        args.push_ptr(d_in.device_ptr())
            .push(n as u32)?
            .push_ptr(d_out.device_ptr())
            .push_ptr(d_count.device_ptr())
            .push_ptr(d_state.device_ptr())
            .push_ptr(d_scan.device_ptr());
        // SAFETY: matches `resident_batch(const InSlot*, unsigned, OutSlot*, unsigned*,
        // State*, unsigned*)`; the buffers hold max_n >= n slots, the scan cells
        // batch_scan_bytes(max_n) >= what `blocks` use, and all live as long as the runner.
        // A grid that covers the batch: ceil(n / block) blocks.
        unsafe { f.launch(LaunchConfig::new(blocks, block), stream, &mut args)? };
        // SAFETY: pinned destinations that nothing reads before the stream is synchronized.
        let count = unsafe { core::slice::from_raw_parts_mut(h_count.as_ptr(), 4) };
        // SAFETY: as above.
        unsafe { d_count.copy_prefix_to_host_async(count, stream)? };
        // SAFETY: as above; out_bytes <= h_out's length.
        let out = unsafe { core::slice::from_raw_parts_mut(h_out.as_ptr(), out_bytes) };
        // SAFETY: as above.
        unsafe { d_out.copy_prefix_to_host_async(out, stream) }
    }

    /// Runs one batch; appends the outputs to `out`.
    fn run(
        &mut self,
        inputs: &[Slot<In>],
        out: &mut Vec<Slot<Out>>,
        graph: bool,
    ) -> Result<(), BenchError> {
        let n = inputs.len();
        if n == 0 || n > self.max_n {
            return Err(BenchError::Parameter {
                name: "launch-per-batch batch size",
                value: n as u64,
                must: "in 1..=in_flight",
            });
        }
        // SAFETY: h_in holds max_n >= n slots and no copy is in flight (the stream was synced).
        unsafe {
            core::ptr::copy_nonoverlapping(inputs.as_ptr(), self.h_in.as_ptr() as *mut Slot<In>, n)
        };
        let bufs = (
            &mut self.d_in,
            &mut self.d_out,
            &mut self.d_count,
            &self.d_state,
            &mut self.d_scan,
        );
        let host = (&self.h_in, &self.h_out, &self.h_count);
        if graph {
            let at = match self.graphs.iter().position(|(k, _)| *k == n) {
                Some(at) => at,
                None => {
                    let (f, block) = (&self.f, self.block);
                    let g = self
                        .stream
                        .capture(|s| Self::enqueue(f, bufs, host, n, block, s))?;
                    self.graphs.push((n, g));
                    self.graphs.len() - 1
                }
            };
            self.graphs[at].1.launch(&self.stream)?;
        } else {
            Self::enqueue(&self.f, bufs, host, n, self.block, &self.stream)?;
        }
        self.stream.synchronize()?;
        // SAFETY: the stream is synchronized: the copies into h_count and h_out are complete.
        let count = unsafe { (self.h_count.as_ptr() as *const u32).read() } as usize;
        let count = count.min(n);
        let base = self.h_out.as_ptr() as *const Slot<Out>;
        for i in 0..count {
            // SAFETY: `count <= n` slots were copied back into page-aligned pinned memory.
            out.push(unsafe { base.add(i).read() });
        }
        Ok(())
    }
}

fn row(
    (variant, block_threads): (&'static str, u32),
    payload_bytes: usize,
    in_flight: usize,
    mut rtts: Vec<u64>,
    msgs: u64,
    elapsed: Duration,
) -> BenchRow {
    rtts.sort_unstable();
    // Every row has samples (iters > 0, and every loop records at least one); 0 would only
    // stand for none.
    let q = |q| quantile(&rtts, q).unwrap_or(0);
    BenchRow {
        variant,
        measures: if variant.ends_with("_streaming") {
            MEASURES_STREAMING
        } else if in_flight == 1 {
            MEASURES_MESSAGE
        } else {
            MEASURES_BATCH
        },
        payload_bytes,
        in_flight,
        p50_ns: q(0.5),
        p99_ns: q(0.99),
        p999_ns: q(0.999),
        msgs_per_s: msgs as f64 / elapsed.as_secs_f64().max(1e-9),
        block_threads,
        host_send_ns_per_msg: None,
    }
}

/// Nanoseconds per message of `ns` spent sending `msgs` messages.
fn per_msg(ns: u64, msgs: u64) -> Option<f64> {
    (msgs > 0).then(|| ns as f64 / msgs as f64)
}

/// The persistent kernel's variants: its input lanes' path choice (`RESIDENT_BULK_LANE`'s
/// three values), the name of its round-trip and batch rows, and of its streaming rows.
const PERSISTENT_VARIANTS: [(BulkMode, &str, &str); 3] = [
    (BulkMode::Auto, "persistent", "persistent_streaming"),
    (BulkMode::Off, "persistent_ll", "persistent_ll_streaming"),
    (BulkMode::On, "persistent_bulk", "persistent_bulk_streaming"),
];

fn bench_payload<const W: usize>(
    device: usize,
    iters: usize,
    in_flights: &[usize],
    rows: &mut Vec<BenchRow>,
) -> Result<(), BenchError>
where
    [u64; W]: Pod,
{
    let deepest = in_flights.iter().copied().max().unwrap_or(1);
    let bytes = W * 8;
    // Each variant at the block size that suits it: the persistent kernel drains up to 1024
    // messages per poll; the baseline kernel is built at 256 threads, where it never spills
    // (at 1024 its 64-register cap spills 256-byte payloads; see the sm_90 report test).
    let (persistent_block, baseline_block) = (1024u32, 256u32);
    let source = bench_source(W, persistent_block);
    let base_source = bench_source(W, baseline_block);
    let epoch = Instant::now();
    let now_ns = || epoch.elapsed().as_nanos() as u64;
    let timeout = Duration::from_secs(5);

    // ---- persistent: automatic path choice, LL lanes only, bulk lanes only ----
    for (mode, variant, streaming) in PERSISTENT_VARIANTS {
        let opts = LaunchOptions {
            device,
            queues: QueueConfig {
                lanes: 1,
                lane_capacity: deepest.next_power_of_two().max(1024),
                out_capacity: deepest.next_power_of_two().max(1024),
            },
            bulk: BulkConfig {
                mode,
                ..BulkConfig::default()
            },
            ..Default::default()
        };
        let mut k = PersistentKernel::<[u64; W], [u64; W]>::launch(&source, &[0u8; 8], &opts)?;
        k.activate()?;
        let mut rtts = Vec::with_capacity(iters);
        let mut send_ns = 0u64;
        let start = Instant::now();
        for i in 0..iters + iters / 10 {
            let t0 = now_ns();
            let sent = k.send(Envelope::new(i as u64 + 1, 128, t0), [i as u64; W]);
            send_ns += now_ns() - t0;
            if sent.is_err() {
                return Err(BenchError::Check {
                    variant,
                    check: OutputCheck::LaneFull,
                });
            }
            let r = k.receive(timeout)?;
            check(&r, variant)?;
            if i >= iters / 10 {
                rtts.push(now_ns() - r.env.timestamp_ns);
            }
        }
        let el = start.elapsed();
        rows.push(BenchRow {
            host_send_ns_per_msg: per_msg(send_ns, (iters + iters / 10) as u64),
            ..row(
                (variant, persistent_block),
                bytes,
                1,
                rtts,
                (iters + iters / 10) as u64,
                el,
            )
        });
        let mut next_id = (iters + iters / 10) as u64;
        for &in_flight in in_flights.iter().filter(|&&n| n > 1) {
            // Throughput: keep `in_flight` messages outstanding.
            let total = ((iters * 16) as u64).max(4 * in_flight as u64);
            let base = next_id;
            let (mut sent, mut got) = (0u64, 0u64);
            let mut buf = Vec::with_capacity(4096);
            let mut stage: Vec<Slot<[u64; W]>> = Vec::with_capacity(1024);
            let mut rtts = Vec::new();
            let mut send_ns = 0u64;
            let start = Instant::now();
            let mut spins = 0u32;
            while got < total {
                // Refill in chunks (one release of the lane's tail per chunk), as a streaming
                // producer would.
                let room = (in_flight as u64 - (sent - got))
                    .min(total - sent)
                    .min(1024);
                if room > 0 {
                    stage.clear();
                    let t = now_ns();
                    stage
                        .extend((sent..sent + room).map(|i| {
                            Slot::new(Envelope::new(base + i + 1, 128, t), [base + i; W])
                        }));
                    let t0 = now_ns();
                    sent += k.send_batch(&stage) as u64;
                    send_ns += now_ns() - t0;
                }
                buf.clear();
                let n = k.receive_into(&mut buf, 4096);
                let t = now_ns();
                for (j, s) in buf.iter().enumerate() {
                    if s.env.correlation_id != base + got + j as u64 + 1 {
                        return Err(BenchError::Check {
                            variant: streaming,
                            check: OutputCheck::Order {
                                want: base + got + j as u64 + 1,
                                got: s.env.correlation_id,
                            },
                        });
                    }
                    check(s, streaming)?;
                    if rtts.len() < 1_000_000 {
                        rtts.push(t - s.env.timestamp_ns);
                    }
                }
                got += n as u64;
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1024) {
                    k.check()?;
                    if start.elapsed() > timeout * 10 {
                        return Err(PersistentError::Timeout {
                            name: k.name().into(),
                            what: "throughput run",
                        }
                        .into());
                    }
                }
            }
            rows.push(BenchRow {
                host_send_ns_per_msg: per_msg(send_ns, sent),
                ..row(
                    (streaming, persistent_block),
                    bytes,
                    in_flight,
                    rtts,
                    total,
                    start.elapsed(),
                )
            });

            // The baselines' quantity: a closed-loop batch of `in_flight` messages, first send to
            // last output received.
            let reps = (iters * 16 / in_flight).max(10);
            let mut rtts = Vec::with_capacity(reps);
            let (mut send_ns, mut sent_all) = (0u64, 0u64);
            let mut next = base + got;
            let start = Instant::now();
            for r in 0..reps + reps / 10 {
                let t0 = Instant::now();
                let first = next;
                let (mut sent_b, mut got_b) = (0u64, 0u64);
                while got_b < in_flight as u64 {
                    if sent_b < in_flight as u64 {
                        let room = (in_flight as u64 - sent_b).min(1024);
                        stage.clear();
                        let t = now_ns();
                        stage.extend((0..room).map(|j| {
                            let i = first + sent_b + j;
                            Slot::new(Envelope::new(i + 1, 128, t), [i; W])
                        }));
                        let t0 = now_ns();
                        let n = k.send_batch(&stage) as u64;
                        send_ns += now_ns() - t0;
                        sent_b += n;
                        sent_all += n;
                    }
                    buf.clear();
                    got_b += k.receive_into(&mut buf, 4096) as u64;
                    for s in &buf {
                        check(s, variant)?;
                    }
                    if t0.elapsed() > timeout {
                        return Err(PersistentError::Timeout {
                            name: k.name().into(),
                            what: "batch round trip",
                        }
                        .into());
                    }
                }
                next += in_flight as u64;
                if r >= reps / 10 {
                    rtts.push(t0.elapsed().as_nanos() as u64);
                }
            }
            rows.push(BenchRow {
                host_send_ns_per_msg: per_msg(send_ns, sent_all),
                ..row(
                    (variant, persistent_block),
                    bytes,
                    in_flight,
                    rtts,
                    ((reps + reps / 10) * in_flight) as u64,
                    start.elapsed(),
                )
            });
            next_id = next;
        }
        k.terminate(timeout)?;
    }

    // ---- launch per batch and graph ----
    let dev = open_device(device)?;
    let mut runner =
        BatchRunner::<[u64; W], [u64; W]>::new(&dev, &base_source, &[0u8; 8], deepest.max(1))?;
    let mut depths = vec![1usize];
    depths.extend(in_flights.iter().copied().filter(|&n| n > 1));
    for (variant, graph) in [("launch_per_batch", false), ("graph", true)] {
        for &n in &depths {
            let inputs: Vec<Slot<[u64; W]>> = (0..n)
                .map(|i| Slot::new(Envelope::new(i as u64 + 1, 128, 0), [i as u64; W]))
                .collect();
            let mut out = Vec::with_capacity(n);
            let reps = if n == 1 {
                iters
            } else {
                (iters * 16 / n).max(10)
            };
            let mut rtts = Vec::with_capacity(reps);
            let start = Instant::now();
            for r in 0..reps + reps / 10 {
                out.clear();
                let t0 = Instant::now();
                runner.run(&inputs, &mut out, graph)?;
                if r >= reps / 10 {
                    rtts.push(t0.elapsed().as_nanos() as u64);
                }
                if out.len() != n {
                    return Err(BenchError::Check {
                        variant,
                        check: OutputCheck::Count {
                            got: out.len() as u64,
                            want: n as u64,
                        },
                    });
                }
                if r == 0 {
                    for s in &out {
                        check(s, variant)?;
                    }
                }
            }
            rows.push(row(
                (variant, baseline_block),
                bytes,
                n,
                rtts,
                ((reps + reps / 10) * n) as u64,
                start.elapsed(),
            ));
        }
    }
    Ok(())
}

/// Measures, for 16 / 64 / 256-byte payloads, round-trip latency at 1 in flight (p50 / p99 /
/// p99.9) and, for each of `in_flights` above 1, throughput with that many messages outstanding
/// and the round trip of a closed-loop batch of that many, for the persistent kernel with its
/// lanes' path chosen automatically (`persistent`), by the LL lanes only (`persistent_ll`) and
/// by the bulk lanes only (`persistent_bulk`), and for the `launch_per_batch` and `graph`
/// baselines of the same kernel template, all in one run. `iters` latency samples per
/// configuration (throughput runs move `16 * iters` messages, at least four times the depth).
///
/// Needs a GPU, the driver and NVRTC; returns their absence as a typed error.
pub fn bench_ring(
    device: usize,
    iters: usize,
    in_flights: &[usize],
) -> Result<Vec<BenchRow>, BenchError> {
    if iters == 0 {
        return Err(BenchError::Parameter {
            name: "iters",
            value: 0,
            must: "above 0",
        });
    }
    if in_flights.is_empty() {
        return Err(BenchError::Parameter {
            name: "in_flight",
            value: 0,
            must: "at least one depth",
        });
    }
    if let Some(&bad) = in_flights.iter().find(|&&n| n == 0 || n > 1 << 20) {
        return Err(BenchError::Parameter {
            name: "in_flight",
            value: bad as u64,
            must: "in 1..=2^20",
        });
    }
    open_device(device)?;
    nvrtc_available()?;
    let mut rows = Vec::new();
    bench_payload::<2>(device, iters, in_flights, &mut rows)?;
    bench_payload::<8>(device, iters, in_flights, &mut rows)?;
    bench_payload::<32>(device, iters, in_flights, &mut rows)?;
    Ok(rows)
}

/// One point of [`latency_sweep`]: the persistent kernel's round trip at one message in flight
/// (64-byte payloads) for one block size and idle backoff.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepRow {
    /// Threads per block (the most messages one batch handles).
    pub block_threads: u32,
    /// `LaunchOptions::max_backoff_ns`: the longest idle sleep between two polls.
    pub max_backoff_ns: u32,
    /// Round-trip quantiles, ns.
    pub p50_ns: u64,
    /// 99th percentile, ns.
    pub p99_ns: u64,
    /// Fastest round trip, ns.
    pub min_ns: u64,
}

/// The block sizes and idle backoffs [`latency_sweep`] measures.
pub const SWEEP_BLOCKS: [u32; 3] = [32, 256, 1024];
/// See [`SWEEP_BLOCKS`] (32 ns is the template's shortest sleep).
pub const SWEEP_BACKOFFS_NS: [u32; 3] = [32, 256, 2048];

/// `resident bench-ring --sweep`: where one message's round trip goes, by the knobs a user
/// has: the persistent kernel at one message in flight (64-byte payloads, `iters` round trips
/// after a tenth as many warm-up ones) for every block size of [`SWEEP_BLOCKS`] and idle
/// backoff of [`SWEEP_BACKOFFS_NS`], one kernel each, every output checked.
pub fn latency_sweep(device: usize, iters: usize) -> Result<Vec<SweepRow>, BenchError> {
    if iters == 0 {
        return Err(BenchError::Parameter {
            name: "iters",
            value: 0,
            must: "above 0",
        });
    }
    open_device(device)?;
    nvrtc_available()?;
    let epoch = Instant::now();
    let now_ns = || epoch.elapsed().as_nanos() as u64;
    let mut rows = Vec::new();
    for &block in &SWEEP_BLOCKS {
        let source = bench_source(8, block);
        for &backoff in &SWEEP_BACKOFFS_NS {
            let opts = LaunchOptions {
                device,
                queues: QueueConfig {
                    lanes: 1,
                    lane_capacity: 1024,
                    out_capacity: 1024,
                },
                max_backoff_ns: backoff,
                ..Default::default()
            };
            let mut k = PersistentKernel::<[u64; 8], [u64; 8]>::launch(&source, &[0u8; 8], &opts)?;
            k.activate()?;
            let mut rtts = Vec::with_capacity(iters);
            for i in 0..iters + iters / 10 {
                let t0 = now_ns();
                if k.send(Envelope::new(i as u64 + 1, 128, t0), [i as u64; 8])
                    .is_err()
                {
                    return Err(BenchError::Check {
                        variant: "persistent",
                        check: OutputCheck::LaneFull,
                    });
                }
                let r = k.receive(Duration::from_secs(5))?;
                check(&r, "persistent")?;
                if i >= iters / 10 {
                    rtts.push(now_ns() - r.env.timestamp_ns);
                }
            }
            k.terminate(Duration::from_secs(5))?;
            rtts.sort_unstable();
            rows.push(SweepRow {
                block_threads: block,
                max_backoff_ns: backoff,
                p50_ns: quantile(&rtts, 0.5).unwrap_or(0),
                p99_ns: quantile(&rtts, 0.99).unwrap_or(0),
                min_ns: rtts.first().copied().unwrap_or(0),
            });
        }
    }
    Ok(rows)
}

/// [`latency_sweep`]'s rows as JSON.
pub fn sweep_json(device: &str, date: &str, command: &str, rows: &[SweepRow]) -> Value {
    json!({
        "device": device,
        "date": date,
        "command": command,
        "measures": MEASURES_MESSAGE,
        "payload_bytes": 64,
        "results": rows.iter().map(|r| json!({
            "block_threads": r.block_threads,
            "max_backoff_ns": r.max_backoff_ns,
            "p50_ns": r.p50_ns,
            "p99_ns": r.p99_ns,
            "min_ns": r.min_ns,
        })).collect::<Vec<_>>(),
    })
}

/// The result file: `{device, date, command, measures: {latency, batch,
/// persistent_streaming}, results: [{variant, payload_bytes, in_flight, p50_ns, p99_ns,
/// p999_ns, msgs_per_s, block_threads, measures, host_send_ns_per_msg}]}` (the last null for
/// the baselines). Rows of the same `in_flight` measure the
/// same quantity for every variant (`measures`); launch_per_batch and graph launch
/// `ceil(n / block_threads)` blocks.
pub fn to_json(device: &str, date: &str, command: &str, rows: &[BenchRow]) -> Value {
    let results: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({"variant": r.variant, "payload_bytes": r.payload_bytes, "in_flight": r.in_flight,
                   "p50_ns": r.p50_ns, "p99_ns": r.p99_ns, "p999_ns": r.p999_ns, "msgs_per_s": r.msgs_per_s,
                   "block_threads": r.block_threads, "measures": r.measures,
                   "host_send_ns_per_msg": r.host_send_ns_per_msg})
        })
        .collect();
    json!({"device": device, "date": date, "command": command,
           "measures": {"latency": MEASURES_MESSAGE,
                        "batch": MEASURES_BATCH,
                        "persistent_streaming": MEASURES_STREAMING},
           "results": results})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_say_what_they_measure_and_take_nearest_rank_quantiles() {
        let r = row(
            ("persistent", 1024),
            16,
            1,
            (1..=1000).rev().collect(),
            1000,
            Duration::from_millis(500),
        );
        assert_eq!(r.measures, MEASURES_MESSAGE);
        assert_eq!((r.p50_ns, r.p99_ns, r.p999_ns), (500, 990, 999));
        assert!((r.msgs_per_s - 2000.0).abs() < 1e-6);
        let s = row(
            ("persistent_streaming", 1024),
            16,
            64,
            vec![5],
            1,
            Duration::ZERO,
        );
        assert_eq!(s.measures, MEASURES_STREAMING);
        assert_eq!(s.p999_ns, 5);
        let b = row(("graph", 256), 64, 64, vec![7], 64, Duration::from_secs(1));
        assert_eq!(b.measures, MEASURES_BATCH);
    }

    #[test]
    fn a_wrong_word_is_a_typed_check_failure() {
        // An output's correlation id is its request's id; every word must equal it.
        let mut env = Envelope::new(17, 128, 0);
        env.correlation_id = 3;
        let ok = Slot::new(env, [3u64; 2]);
        assert!(check(&ok, "persistent").is_ok());
        let bad = Slot::new(env, [3u64, 9]);
        assert!(matches!(
            check(&bad, "graph"),
            Err(BenchError::Check {
                variant: "graph",
                check: OutputCheck::Value {
                    got: 9,
                    want: 3,
                    ..
                }
            })
        ));
    }

    #[test]
    fn json_shape() {
        let rows = vec![row(
            ("launch_per_batch", 256),
            16,
            1,
            vec![10, 20],
            2,
            Duration::from_secs(1),
        )];
        let j = to_json("GPU", "2026-11-26", "resident bench-ring", &rows);
        assert_eq!(j["measures"]["latency"], MEASURES_MESSAGE);
        assert_eq!(
            j["results"][0],
            json!({"variant": "launch_per_batch", "payload_bytes": 16, "in_flight": 1,
                   "p50_ns": 10, "p99_ns": 20, "p999_ns": 20, "msgs_per_s": 2.0,
                   "block_threads": 256, "measures": MEASURES_MESSAGE,
                   "host_send_ns_per_msg": null})
        );
        // A persistent row carries the host's send time per message.
        let p = BenchRow {
            host_send_ns_per_msg: per_msg(300, 4),
            ..row(
                ("persistent", 1024),
                64,
                4,
                vec![9],
                4,
                Duration::from_secs(1),
            )
        };
        let j = to_json("GPU", "2026-11-28", "resident bench-ring", &[p]);
        assert_eq!(j["results"][0]["host_send_ns_per_msg"], 75.0);
        assert_eq!(per_msg(5, 0), None);
    }
}
