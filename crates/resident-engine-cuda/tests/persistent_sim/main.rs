//! The persistent-kernel protocol end to end on CudaSim: the CUDA C template with a CUDA C
//! handler, compiled by the host C++ compiler against the shim and run as one block of OS
//! threads over the same memory layout and control block the GPU uses. Nothing here ran on a
//! GPU; what it checks is the kernel source and the host protocol.

use std::time::{Duration, Instant};

use resident_engine_cuda::persistent::{
    lane_for_priority, BulkConfig, BulkMode, DeviceState, KernelSource, MessageDecl,
    PersistentError, QueueConfig, SimKernel, SimLaunchOptions,
};
use resident_ring::{Envelope, Slot, FLAG_CALL};

mod bulk;
mod faults;
mod untrusted;

fn cfg(lanes: usize, lane_capacity: usize, out_capacity: usize) -> QueueConfig {
    QueueConfig {
        lanes,
        lane_capacity,
        out_capacity,
    }
}

const DOUBLE: &str = "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) { *out = *in * 2ull; return true; }";
const EVEN: &str = "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) { *out = *in; return (*in % 2ull) == 0; }";
const MIX: &str = "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) { *out = (*in * 0x9E3779B97F4A7C15ull) ^ e->message_id; return true; }";

fn source(name: &str, handler: &str, batch: u32) -> KernelSource {
    let u64_decl = MessageDecl::new("U64", "typedef unsigned long long U64;", 8);
    KernelSource::new(
        name,
        u64_decl.clone(),
        u64_decl,
        MessageDecl::new(
            "Count",
            "typedef struct { unsigned long long n; } Count;",
            8,
        ),
        handler,
        batch,
    )
}

fn launch_with(
    name: &str,
    handler: &str,
    batch: u32,
    queues: QueueConfig,
    heartbeat_timeout: Option<Duration>,
) -> Result<SimKernel<u64, u64>, PersistentError> {
    let opts = SimLaunchOptions {
        queues,
        heartbeat_timeout,
        ..SimLaunchOptions::default()
    };
    SimKernel::launch(&source(name, handler, batch), &[0u8; 8], &opts)
}

fn launch(name: &str, handler: &str, batch: u32, queues: QueueConfig) -> SimKernel<u64, u64> {
    launch_with(name, handler, batch, queues, None).unwrap()
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Receives exactly `n` outputs (panics after a timeout).
fn receive_n(q: &mut SimKernel<u64, u64>, n: usize) -> Vec<Slot<u64>> {
    let mut out = Vec::with_capacity(n);
    wait_until("outputs", || {
        let want = n - out.len();
        q.receive_into(&mut out, want);
        out.len() == n
    });
    out
}

fn env(id: u64, priority: u8) -> Envelope {
    Envelope::new(id, priority, id * 10)
}

const T: Duration = Duration::from_secs(30);

/// The tests of this file take turns. They share one strict CudaSim context, where a module load
/// waits for every running block (as the driver does) and fails after 10 s: a test that loads
/// its module while a neighbour's long run holds its block would fail for the neighbour's sake
/// (it did, under load: `WouldWaitForDevice { call: ModuleLoad, .. }`). One at a time, each
/// test's loads meet no other test's blocks.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn fifo_within_a_lane_and_reply_envelope() {
    let _serial = serial();
    let mut q = launch("fifo", DOUBLE, 32, cfg(1, 64, 64));
    q.activate();
    let mut e = env(1, 7);
    e.flags = FLAG_CALL;
    q.send(e, 100).unwrap();
    let first = receive_n(&mut q, 1)[0];
    assert_eq!(first.payload, 200);
    assert_eq!(first.env.correlation_id, 1);
    assert_eq!(first.env.flags, FLAG_CALL);
    assert_eq!(first.env.timestamp_ns, 10);
    // Send and receive concurrently; everything must come back in send order.
    let mut got: Vec<Slot<u64>> = Vec::new();
    let mut next = 2u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < 999 {
        assert!(Instant::now() < deadline, "timed out");
        if next <= 1000 && q.send(env(next, 7), next).is_ok() {
            next += 1;
        }
        q.receive_into(&mut got, 64);
    }
    for (k, s) in got.iter().enumerate() {
        assert_eq!(s.env.correlation_id, k as u64 + 2);
        assert_eq!(s.payload, 2 * (k as u64 + 2));
    }
    q.terminate(T).unwrap();
    assert_eq!(q.device_counters().state, Some(DeviceState::Terminated));
    assert_eq!(q.device_counters().processed, 1000);
}

#[test]
fn highest_lane_drains_first() {
    let _serial = serial();
    let mut q = launch("lanes", DOUBLE, 256, cfg(4, 64, 256));
    // Queue everything before activation so the first batch sees all lanes full.
    let prios = [0u8, 64, 128, 255, 10, 70, 200, 130];
    let mut id = 0;
    for round in 0..10 {
        for &p in &prios {
            id += 1;
            q.send(env(id, p), round).unwrap();
        }
    }
    let per_lane = q.queues().sent_per_lane();
    assert_eq!(&per_lane[..4], &[20, 20, 20, 20]);
    q.activate();
    let out = receive_n(&mut q, 80);
    let lanes: Vec<usize> = out
        .iter()
        .map(|s| lane_for_priority(s.env.priority, 4))
        .collect();
    let mut sorted = lanes.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(lanes, sorted, "outputs must come highest lane first");
    // FIFO within each lane: ids increase.
    for l in 0..4 {
        let ids: Vec<u64> = out
            .iter()
            .filter(|s| lane_for_priority(s.env.priority, 4) == l)
            .map(|s| s.env.correlation_id)
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "lane {l}: {ids:?}");
    }
    q.terminate(T).unwrap();
    assert_eq!(q.device_counters().batches, 1);
}

#[test]
fn batches_are_at_most_the_batch_size() {
    let _serial = serial();
    let mut q = launch("batches", DOUBLE, 64, cfg(2, 1024, 64));
    for i in 0..1000u64 {
        q.send(env(i + 1, (i % 256) as u8), i).unwrap();
    }
    q.activate();
    let out = receive_n(&mut q, 1000);
    assert_eq!(out.len(), 1000);
    wait_until("idle counters", || q.device_counters().processed == 1000);
    let c = q.device_counters();
    assert_eq!(c.batches, 1000u64.div_ceil(64));
    assert_eq!(c.undelivered, 0);
    q.terminate(T).unwrap();
}

#[test]
fn handler_without_output_is_compacted() {
    let _serial = serial();
    let mut q = launch("compact", EVEN, 64, cfg(1, 256, 256));
    for i in 1..=200u64 {
        q.send(env(i, 1), i).unwrap();
    }
    q.activate();
    let out = receive_n(&mut q, 100);
    let ids: Vec<u64> = out.iter().map(|s| s.payload).collect();
    assert_eq!(ids, (1..=100).map(|k| 2 * k).collect::<Vec<_>>());
    wait_until("all processed", || q.device_counters().processed == 200);
    assert!(q.queues().try_receive().is_none());
    q.terminate(T).unwrap();
}

#[test]
fn deactivate_parks_and_activate_resumes() {
    let _serial = serial();
    let mut q = launch("park", DOUBLE, 32, cfg(1, 64, 64));
    wait_until("idle before activation", || {
        q.device_counters().state == Some(DeviceState::Idle)
    });
    q.activate();
    wait_until("running", || {
        q.device_counters().state == Some(DeviceState::Running)
    });
    q.send(env(1, 0), 1).unwrap();
    receive_n(&mut q, 1);
    q.deactivate();
    wait_until("idle", || {
        q.device_counters().state == Some(DeviceState::Idle)
    });
    for i in 2..12u64 {
        q.send(env(i, 0), i).unwrap();
    }
    std::thread::sleep(Duration::from_millis(30));
    assert!(
        q.queues().try_receive().is_none(),
        "an inactive device must not process"
    );
    assert_eq!(q.queues().pending_input(), 10);
    // A parked kernel writes nothing per poll: the device line stays byte-for-byte the same.
    let before = q.device_counters();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(q.device_counters(), before);
    q.activate();
    let out = receive_n(&mut q, 10);
    assert_eq!(out[0].env.correlation_id, 2);
    assert_eq!(q.queues().pending_input(), 0);
    q.terminate(T).unwrap();
    assert_eq!(q.device_counters().state, Some(DeviceState::Terminated));
}

#[test]
fn terminate_reports_what_was_left() {
    let _serial = serial();
    let mut q = launch("left", DOUBLE, 32, cfg(2, 64, 64));
    for i in 1..=5u64 {
        q.send(env(i, 200), i).unwrap();
    }
    // Never activated: the five stay queued and come back.
    q.terminate(T).unwrap();
    let back = q.reclaim_input().unwrap();
    assert_eq!(
        back.iter().map(|s| s.payload).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    let c = q.device_counters();
    assert_eq!(c.state, Some(DeviceState::Terminated));
    assert_eq!(c.processed, 0);
}

#[test]
fn heartbeat_keeps_alive_and_its_absence_stops_the_device() {
    let _serial = serial();
    // A timeout far above the beat period: on a loaded 2-core machine the beating thread can
    // be descheduled for tens of milliseconds.
    let mut q = launch_with(
        "heartbeat",
        DOUBLE,
        32,
        cfg(1, 8, 32),
        Some(Duration::from_millis(300)),
    )
    .unwrap();
    q.activate();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(900) {
        q.heartbeat();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!q.has_exited(), "a beating host must keep the device alive");
    assert!(q.device_counters().last_heartbeat_seen > 0);
    // The host "crashes": no more beats.
    wait_until("heartbeat exit", || q.has_exited());
    assert!(matches!(
        q.check(),
        Err(PersistentError::Exited {
            state: Some(DeviceState::HeartbeatTimeout),
            ..
        })
    ));
    assert_eq!(
        q.device_counters().state,
        Some(DeviceState::HeartbeatTimeout)
    );
}

#[test]
fn full_lane_hands_the_message_back_and_output_backpressure_never_drops() {
    let _serial = serial();
    let mut q = launch("backpressure", DOUBLE, 32, cfg(1, 16, 32));
    q.activate();
    // The host does not receive: the device fills the output ring (32), then the lane (16)
    // fills behind it, and `send` must hand the message back.
    // A full lane is only final once the output ring is full too (the device may simply not
    // have drained the lane yet: a CudaSim batch takes a while).
    let mut sent = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    let full = loop {
        match q.send(env(sent + 1, 0), sent + 1) {
            Ok(()) => sent += 1,
            Err(full) if sent >= 48 => break full,
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
        assert!(sent <= 10_000, "the lane never filled");
        assert!(Instant::now() < deadline, "timed out filling, sent {sent}");
    };
    assert_eq!(full.lane, 0);
    assert_eq!(full.slot.payload, sent + 1);
    assert_eq!(full.slot.env.message_id, sent + 1);
    assert!(
        sent >= 48,
        "output (32) + lane (16) must both fill, sent {sent}"
    );
    // Now drain everything: each message arrives exactly once, in order.
    let out = receive_n(&mut q, sent as usize);
    for (k, s) in out.iter().enumerate() {
        assert_eq!(s.env.correlation_id, k as u64 + 1);
    }
    // The batched sender stops at the first message that does not fit.
    let batch: Vec<Slot<u64>> = (0..40u64).map(|i| Slot::new(env(1000 + i, 0), i)).collect();
    q.deactivate();
    wait_until("idle", || {
        q.device_counters().state == Some(DeviceState::Idle)
    });
    assert_eq!(q.send_batch(&batch), 16);
    q.terminate(T).unwrap();
    assert_eq!(q.device_counters().undelivered, 0);
}

#[test]
fn terminate_with_full_output_counts_undelivered() {
    let _serial = serial();
    let mut q = launch("undelivered", DOUBLE, 32, cfg(1, 64, 32));
    for i in 1..=64u64 {
        q.send(env(i, 0), i).unwrap();
    }
    q.activate();
    // First batch (32) fills the output; the second (32) waits for room.
    wait_until("second batch blocked", || {
        q.queues().pending_input() == 0 && q.device_counters().processed == 32
    });
    q.terminate(T).unwrap();
    assert_eq!(q.device_counters().state, Some(DeviceState::Terminated));
    let c = q.device_counters();
    assert_eq!(c.undelivered, 32);
    assert_eq!(c.processed, 64);
    assert_eq!(receive_n(&mut q, 32).len(), 32);
}

#[test]
fn stress_exactly_once_across_lanes() {
    let _serial = serial();
    // Fewer messages than the CPU stress test: every batch is ~6 block-wide barriers of real
    // OS threads on a 2-core machine.
    const N: u64 = 200_000;
    let mut q = launch("stress", MIX, 256, cfg(4, 1024, 1024));
    q.activate();
    let mut next = 1u64;
    let mut received = 0u64;
    let mut sum_ids = 0u64;
    let mut sum_payload = 0u64;
    let mut last_in_lane = [0u64; 4];
    let mut buf = Vec::with_capacity(1024);
    let mut batch = Vec::with_capacity(64);
    let deadline = Instant::now() + Duration::from_secs(300);
    while received < N {
        assert!(Instant::now() < deadline, "stress timed out at {received}");
        if next <= N {
            batch.clear();
            for id in next..(next + 64).min(N + 1) {
                let prio = (id.wrapping_mul(2_654_435_761) >> 8) as u8;
                batch.push(Slot::new(env(id, prio), id));
            }
            next += q.send_batch(&batch) as u64;
        }
        buf.clear();
        q.receive_into(&mut buf, 1024);
        for s in &buf {
            let id = s.env.correlation_id;
            assert_eq!(s.payload, id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id);
            let lane = lane_for_priority(s.env.priority, 4);
            assert!(id > last_in_lane[lane], "lane {lane} out of order");
            last_in_lane[lane] = id;
            sum_ids = sum_ids.wrapping_add(id);
            sum_payload = sum_payload.wrapping_add(s.payload);
            received += 1;
        }
    }
    assert_eq!(sum_ids, N * (N + 1) / 2);
    let expect_payload = (1..=N).fold(0u64, |a, id| {
        a.wrapping_add(id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id)
    });
    assert_eq!(sum_payload, expect_payload);
    assert!(q.queues().try_receive().is_none());
    q.terminate(T).unwrap();
    let c = q.device_counters();
    assert_eq!(c.processed, N);
    assert!(c.batches >= N / 256);
}

#[test]
fn invalid_configurations_are_typed_errors() {
    let _serial = serial();
    for bad in [cfg(0, 8, 8), cfg(9, 8, 8), cfg(1, 3, 8), cfg(1, 8, 0)] {
        assert!(matches!(
            resident_engine_cuda::persistent::PersistentQueues::<u64, u64>::on_heap(bad),
            Err(PersistentError::Config { .. })
        ));
    }
    // The output ring must hold a whole batch.
    assert!(matches!(
        launch_with("small-out", DOUBLE, 32, cfg(1, 8, 16), None),
        Err(PersistentError::Config { .. })
    ));
    // Batch sizes are multiples of 32 in 32..=1024 (the block size).
    assert!(matches!(
        launch_with("odd-batch", DOUBLE, 48, cfg(1, 64, 64), None),
        Err(PersistentError::Config { .. })
    ));
}

#[test]
fn priority_mapping_covers_every_lane_in_order() {
    let _serial = serial();
    for n in 1..=8 {
        let lanes: Vec<usize> = (0..=255u8).map(|p| lane_for_priority(p, n)).collect();
        assert_eq!(lanes[0], 0);
        assert_eq!(lanes[255], n - 1);
        assert!(lanes.windows(2).all(|w| w[0] <= w[1] && w[1] - w[0] <= 1));
        for l in 0..n {
            let count = lanes.iter().filter(|&&x| x == l).count();
            assert!(
                count == 256 / n || count == 256 / n + 1,
                "n={n} lane {l}: {count}"
            );
        }
    }
}

/// Counts handled messages in device state (atomically: the threads of a batch share it) and
/// traps on 13.
const COUNT_OR_TRAP: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) {
    if (*in == 13ull) __trap();
    *out = atomicAdd(&s->n, 1ull) + 1ull;
    return true;
}
"#;

#[test]
fn device_state_persists_across_batches() {
    let _serial = serial();
    let mut q = launch("state", COUNT_OR_TRAP, 32, cfg(1, 256, 256));
    q.activate();
    let mut seen = Vec::new();
    for round in 0..5u64 {
        for i in 0..50u64 {
            q.send(env(round * 100 + i + 1, 0), 1000 + i).unwrap();
        }
        seen.extend(receive_n(&mut q, 50).into_iter().map(|s| s.payload));
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        (1..=250u64).collect::<Vec<_>>(),
        "each count handed out once"
    );
    assert!(q.device_counters().batches >= 5);
    q.terminate(T).unwrap();
    let state = q.state_bytes().unwrap();
    assert_eq!(u64::from_le_bytes(state.try_into().unwrap()), 250);
}

/// The launch-per-batch baseline kernel on a grid that covers the batch (ceil(n / block)
/// blocks), compacting outputs in input order across blocks through its chained scan.
#[test]
fn launch_per_batch_kernel_covers_the_batch_with_a_grid_and_keeps_order() {
    let _serial = serial();
    use resident_engine_cuda::persistent::{batch_scan_bytes, compile_sim};
    let src = source("batch-grid", EVEN, 64);
    let inst = compile_sim(&src).unwrap().instantiate().unwrap();
    let n = 1000usize;
    let mut input: Vec<Slot<u64>> = (0..n as u64).map(|i| Slot::new(env(i + 1, 0), i)).collect();
    let mut output: Vec<Slot<u64>> = vec![Slot::new(Envelope::default(), 0); n];
    let mut count = 0u32;
    let mut state = 0u64;
    let mut scan = vec![0u32; batch_scan_bytes(n, 64) / 4];
    let blocks = n.div_ceil(64) as u32;
    let mut a_in = input.as_mut_ptr() as u64;
    let mut a_n = n as u32;
    let mut a_out = output.as_mut_ptr() as u64;
    let mut a_count = &mut count as *mut u32 as u64;
    let mut a_state = &mut state as *mut u64 as u64;
    let mut a_scan = scan.as_mut_ptr() as u64;
    let args: [*mut core::ffi::c_void; 6] = [
        (&mut a_in as *mut u64).cast(),
        (&mut a_n as *mut u32).cast(),
        (&mut a_out as *mut u64).cast(),
        (&mut a_count as *mut u64).cast(),
        (&mut a_state as *mut u64).cast(),
        (&mut a_scan as *mut u64).cast(),
    ];
    // SAFETY: the arguments match `resident_batch`'s parameters (checked by size), and every
    // buffer they point at is live, large enough and untouched until the launch returns.
    unsafe {
        inst.launch(
            "resident_batch",
            (blocks, 1, 1),
            (64, 1, 1),
            &args,
            &[8, 4, 8, 8, 8, 8],
        )
    }
    .unwrap();
    assert_eq!(count, 500, "even payloads produce");
    let got: Vec<u64> = output[..500].iter().map(|s| s.payload).collect();
    assert_eq!(got, (0..1000u64).filter(|x| x % 2 == 0).collect::<Vec<_>>());
    assert!(output[..500]
        .iter()
        .all(|s| s.env.correlation_id == s.payload + 1));
    assert_eq!(scan[0], blocks, "every block took a ticket");
}

/// Each message bumps `a`, sleeps, then bumps `b`: between two batches `a == b`, mid-batch
/// (some handler between its two adds) `a > b`.
const TWO_STEPS: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) {
    atomicAdd(&s->a, 1ull);
    __nanosleep(1000000);
    atomicAdd(&s->b, 1ull);
    *out = *in;
    return true;
}
"#;

/// `SimKernel::state` reads the state with the block parked between two batches: read over and
/// over while batches run, it never shows a batch half done (`a == b` in every read), it only
/// grows, and after terminate it is the final state. An unsynchronized read of the same memory
/// would catch handlers between their two adds (each sleeps 1 ms between them).
#[test]
fn state_reads_while_running_see_only_batch_boundaries() {
    let _serial = serial();
    let u64_decl = MessageDecl::new("U64", "typedef unsigned long long U64;", 8);
    let src = KernelSource::new(
        "state_reads",
        u64_decl.clone(),
        u64_decl,
        MessageDecl::new(
            "Pair",
            "typedef struct { unsigned long long a; unsigned long long b; } Pair;",
            16,
        ),
        TWO_STEPS,
        32,
    );
    let opts = SimLaunchOptions {
        queues: cfg(1, 1024, 1024),
        heartbeat_timeout: None,
        ..SimLaunchOptions::default()
    };
    let mut q = SimKernel::<u64, u64>::launch(&src, &[0u8; 16], &opts).unwrap();
    let state = q.state();
    assert_eq!(state.len(), 16);
    let pair = |b: Vec<u8>| {
        (
            u64::from_le_bytes(b[..8].try_into().unwrap()),
            u64::from_le_bytes(b[8..].try_into().unwrap()),
        )
    };
    assert_eq!(pair(state.read(T).unwrap()), (0, 0), "the initial state");
    q.activate();
    let n = 600u64;
    let reader = {
        let state = state.clone();
        std::thread::spawn(move || {
            let mut reads = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let (a, b) = pair(state.read(T).unwrap());
                reads.push((a, b));
                if a == n || Instant::now() > deadline {
                    return reads;
                }
            }
        })
    };
    for i in 0..n {
        q.send(env(i + 1, 0), i).unwrap();
    }
    receive_n(&mut q, n as usize);
    let reads = reader.join().unwrap();
    assert!(
        reads.len() > 2,
        "reads happened while batches ran: {reads:?}"
    );
    for w in reads.windows(2) {
        assert!(w[0].0 <= w[1].0, "the state only grows: {w:?}");
    }
    for &(a, b) in &reads {
        assert_eq!(a, b, "a read saw a batch half done ({} reads)", reads.len());
    }
    assert_eq!(*reads.last().unwrap(), (n, n));
    q.terminate(T).unwrap();
    assert_eq!(pair(state.read(T).unwrap()), (n, n), "the final state");
    drop(q);
    assert_eq!(
        pair(state.read(T).unwrap()),
        (n, n),
        "the handle keeps the state after the kernel is gone"
    );
}

/// A 64-byte payload: with its 32-byte envelope a 96-byte slot, 16-byte aligned in the ring.
const WIDE: &str = "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) { for (int i = 0; i < 8; ++i) out->w[i] = in->w[i] + 1ull; return true; }";

fn wide_kernel(name: &str, batch: u32, queues: QueueConfig) -> SimKernel<[u64; 8], [u64; 8]> {
    let decl = |n: &str| {
        MessageDecl::new(
            n,
            format!("typedef struct {{ unsigned long long w[8]; }} {n};"),
            64,
        )
    };
    let src = KernelSource::new(
        name,
        decl("Wide"),
        decl("WideOut"),
        MessageDecl::new(
            "Count",
            "typedef struct { unsigned long long n; } Count;",
            8,
        ),
        WIDE,
        batch,
    );
    let opts = SimLaunchOptions {
        queues,
        heartbeat_timeout: None,
        ..SimLaunchOptions::default()
    };
    SimKernel::launch(&src, &[0u8; 8], &opts).unwrap()
}

/// The bus model's exact figures for the LL lanes: one message in flight costs the tail read
/// and the slot's twelve 16-byte reads (LL: a flag in every 8 bytes), all in the poll's one
/// round, and its output is visible after a chain of one dependent read and one fence; a batch
/// of 256 queued together costs the poll, then its slots behind the tail and one acquire fence:
/// a chain of two and two fences. Idle polls are counted apart. These are the figures CI holds;
/// a protocol change that moves them must change this test on purpose.
#[test]
fn bus_model_counts_reads_writes_and_the_dependent_chain() {
    let _serial = serial();
    const N: usize = 40;
    let mut k = wide_kernel("bus_one", 256, cfg(1, 1024, 1024));
    k.activate();
    let mut out = Vec::new();
    for i in 0..N as u64 {
        k.send(env(i + 1, 128), [i; 8]).unwrap();
        wait_until("one output", || {
            k.receive_into(&mut out, 1);
            out.len() == i as usize + 1
        });
        assert_eq!(out[i as usize].payload, [i + 1; 8]);
    }
    // The model closes a batch just after the store that shows its outputs: wait for it.
    wait_until("the last batch counted", || {
        k.bus_stats()
            .expect("CudaSim builds count bus traffic")
            .batches
            == N as u64
    });
    let s = k.bus_stats().unwrap();
    assert_eq!((s.batches, s.messages), (N as u64, N as u64), "{s:?}");
    // Reads, all in the poll's one round trip: the tail (8 B) and the 96 B slot in the LL
    // format (a flag in every 8 bytes: 192 B), twelve 16-byte loads.
    assert_eq!(s.batch_reads, 13 * N as u64, "{s:?}");
    assert_eq!(s.batch_read_bytes, 200 * N as u64, "{s:?}");
    // Writes: the lane head, 96 B of output slot in six 16-byte stores, the output tail.
    assert_eq!(s.batch_writes, 8 * N as u64, "{s:?}");
    assert_eq!(s.batch_write_bytes, 112 * N as u64, "{s:?}");
    // One dependent bus read per message: the poll that read the slot found and delivered it.
    assert_eq!(s.chain_max, 1, "{s:?}");
    assert_eq!(s.chain_sum, N as u64, "{s:?}");
    // Fences: one release fence for the output tail and the lane head (a release store each
    // was two); no acquire fence, since the slot's flags, not the tail, showed the message.
    assert_eq!(s.batch_fences, N as u64, "{s:?}");
    // Tear mode (RESIDENT_CUDASIM_TEAR=1, which CI also runs this file under) splits every
    // 16-byte read and lets the writer run between the halves; the outputs above were still
    // exact. Off by default.
    if std::env::var("RESIDENT_CUDASIM_TEAR").as_deref() == Ok("1") {
        assert!(s.torn_reads > 0, "tear mode split no read: {s:?}");
    } else {
        assert_eq!(s.torn_reads, 0, "tear mode is off by default: {s:?}");
    }
    k.terminate(T).unwrap();

    // 256 queued while inactive: the first poll after activation takes them as one batch.
    let mut k = wide_kernel("bus_batch", 256, cfg(1, 1024, 1024));
    for i in 0..256u64 {
        k.send(env(i + 1, 128), [i; 8]).unwrap();
    }
    let before = k.bus_stats().unwrap();
    k.activate();
    let mut out = Vec::new();
    wait_until("256 outputs", || {
        k.receive_into(&mut out, 256);
        out.len() == 256
    });
    wait_until("the batch counted", || {
        k.bus_stats().unwrap().since(&before).batches == 1
    });
    let s = k.bus_stats().unwrap().since(&before);
    assert_eq!((s.batches, s.messages), (1, 256), "{s:?}");
    // The poll: the tail and the head slot (12 chunks); the tail shows 255 more, which the
    // copy reads behind one acquire fence (12 chunks each, the head slot again among them).
    assert_eq!(s.batch_reads, 1 + 12 + 256 * 12, "{s:?}");
    assert_eq!(s.batch_writes, 1 + 256 * 6 + 1, "{s:?}");
    assert_eq!(s.chain_max, 2, "{s:?}");
    assert_eq!(s.batch_fences, 2, "{s:?}");
    k.terminate(T).unwrap();
}
