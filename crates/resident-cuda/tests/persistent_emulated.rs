//! The persistent-kernel protocol end to end, with the emulated device playing the GPU's part
//! over the same memory layout the CUDA kernel uses.

use std::time::{Duration, Instant};

use resident_cuda::persistent::{
    lane_for_priority, DeviceState, EmulatedDevice, EmulatorOptions, PersistentError,
    PersistentQueues, QueueConfig,
};
use resident_ring::{Envelope, Slot, FLAG_CALL};

fn cfg(lanes: usize, lane_capacity: usize, out_capacity: usize) -> QueueConfig {
    QueueConfig {
        lanes,
        lane_capacity,
        out_capacity,
    }
}

fn opts(batch_size: usize) -> EmulatorOptions {
    EmulatorOptions {
        batch_size,
        ..Default::default()
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Receives exactly `n` outputs (panics after a timeout).
fn receive_n(q: &mut PersistentQueues<u64, u64>, n: usize) -> Vec<Slot<u64>> {
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

/// Doubles the payload; always produces.
fn double(x: &u64, out: &mut u64, _e: &Envelope) -> bool {
    *out = x * 2;
    true
}

#[test]
fn fifo_within_a_lane_and_reply_envelope() {
    let mut q = PersistentQueues::<u64, u64>::on_heap(cfg(1, 64, 64)).unwrap();
    let dev = EmulatedDevice::spawn(q.device_view(), opts(32), double).unwrap();
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
    assert_eq!(q.terminate(), 0);
    assert_eq!(dev.join().unwrap().state, DeviceState::Terminated);
    assert_eq!(q.device_counters().processed, 1000);
}

#[test]
fn highest_lane_drains_first() {
    let mut q = PersistentQueues::<u64, u64>::on_heap(cfg(4, 64, 256)).unwrap();
    // Queue everything before activation so the first batch sees all lanes full.
    let prios = [0u8, 64, 128, 255, 10, 70, 200, 130];
    let mut id = 0;
    for round in 0..10 {
        for &p in &prios {
            id += 1;
            q.send(env(id, p), round).unwrap();
        }
    }
    let per_lane = q.sent_per_lane();
    assert_eq!(&per_lane[..4], &[20, 20, 20, 20]);
    let dev = EmulatedDevice::spawn(q.device_view(), opts(256), double).unwrap();
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
    q.terminate();
    dev.join().unwrap();
    assert_eq!(q.device_counters().batches, 1);
}

#[test]
fn batches_are_at_most_the_batch_size() {
    let mut q = PersistentQueues::<u64, u64>::on_heap(cfg(2, 1024, 64)).unwrap();
    for i in 0..1000u64 {
        q.send(env(i + 1, (i % 256) as u8), i).unwrap();
    }
    let dev = EmulatedDevice::spawn(q.device_view(), opts(64), double).unwrap();
    q.activate();
    let out = receive_n(&mut q, 1000);
    assert_eq!(out.len(), 1000);
    wait_until("idle counters", || q.device_counters().processed == 1000);
    let c = q.device_counters();
    assert_eq!(c.batches, 1000u64.div_ceil(64));
    assert_eq!(c.undelivered, 0);
    q.terminate();
    dev.join().unwrap();
}

#[test]
fn handler_without_output_is_compacted() {
    let mut q = PersistentQueues::<u64, u64>::on_heap(cfg(1, 256, 256)).unwrap();
    for i in 1..=200u64 {
        q.send(env(i, 1), i).unwrap();
    }
    let dev = EmulatedDevice::spawn(
        q.device_view(),
        opts(64),
        |x: &u64, out: &mut u64, _e: &Envelope| {
            *out = *x;
            x.is_multiple_of(2)
        },
    )
    .unwrap();
    q.activate();
    let out = receive_n(&mut q, 100);
    let ids: Vec<u64> = out.iter().map(|s| s.payload).collect();
    assert_eq!(ids, (1..=100).map(|k| 2 * k).collect::<Vec<_>>());
    wait_until("all processed", || q.device_counters().processed == 200);
    assert!(q.try_receive().is_none());
    q.terminate();
    dev.join().unwrap();
}

#[test]
fn deactivate_parks_and_activate_resumes() {
    let mut q = PersistentQueues::<u64, u64>::on_heap(cfg(1, 64, 64)).unwrap();
    let dev = EmulatedDevice::spawn(q.device_view(), opts(32), double).unwrap();
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
        q.try_receive().is_none(),
        "an inactive device must not process"
    );
    assert_eq!(q.pending_input(), 10);
    q.activate();
    let out = receive_n(&mut q, 10);
    assert_eq!(out[0].env.correlation_id, 2);
    assert_eq!(q.pending_input(), 0);
    q.terminate();
    assert_eq!(dev.join().unwrap().state, DeviceState::Terminated);
}

#[test]
fn terminate_reports_what_was_left() {
    let mut q = PersistentQueues::<u64, u64>::on_heap(cfg(2, 64, 64)).unwrap();
    let dev = EmulatedDevice::spawn(q.device_view(), opts(32), double).unwrap();
    for i in 1..=5u64 {
        q.send(env(i, 200), i).unwrap();
    }
    // Never activated: the five stay queued and are reported.
    assert_eq!(q.terminate(), 5);
    let exit = dev.join().unwrap();
    assert_eq!(exit.state, DeviceState::Terminated);
    let c = q.device_counters();
    assert_eq!(c.state, Some(DeviceState::Terminated));
    assert_eq!(c.processed, 0);
}

#[test]
fn heartbeat_keeps_alive_and_its_absence_stops_the_device() {
    let q = PersistentQueues::<u64, u64>::on_heap(cfg(1, 8, 8)).unwrap();
    // A timeout far above the beat period: on a loaded 2-core machine the beating thread can
    // be descheduled for tens of milliseconds.
    q.set_heartbeat_timeout(Some(Duration::from_millis(300)));
    let dev = EmulatedDevice::spawn(q.device_view(), opts(8), double).unwrap();
    q.activate();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(900) {
        q.heartbeat();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        !dev.is_finished(),
        "a beating host must keep the device alive"
    );
    assert!(q.device_counters().last_heartbeat_seen > 0);
    // The host "crashes": no more beats.
    wait_until("heartbeat exit", || dev.is_finished());
    assert_eq!(dev.join().unwrap().state, DeviceState::HeartbeatTimeout);
    assert_eq!(
        q.device_counters().state,
        Some(DeviceState::HeartbeatTimeout)
    );
}

#[test]
fn full_lane_hands_the_message_back_and_output_backpressure_never_drops() {
    let mut q = PersistentQueues::<u64, u64>::on_heap(cfg(1, 16, 32)).unwrap();
    let dev = EmulatedDevice::spawn(q.device_view(), opts(32), double).unwrap();
    q.activate();
    // The host does not receive: the device fills the output ring (32), then the lane (16)
    // fills behind it, and `send` must hand the message back.
    let mut sent = 0u64;
    let full = loop {
        match q.send(env(sent + 1, 0), sent + 1) {
            Ok(()) => sent += 1,
            Err(full) => break full,
        }
        if sent > 10_000 {
            panic!("the lane never filled");
        }
        std::thread::sleep(Duration::from_micros(50));
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
    q.terminate();
    dev.join().unwrap();
    assert_eq!(q.device_counters().undelivered, 0);
}

#[test]
fn terminate_with_full_output_counts_undelivered() {
    let mut q = PersistentQueues::<u64, u64>::on_heap(cfg(1, 64, 32)).unwrap();
    for i in 1..=64u64 {
        q.send(env(i, 0), i).unwrap();
    }
    let dev = EmulatedDevice::spawn(q.device_view(), opts(32), double).unwrap();
    q.activate();
    // First batch (32) fills the output; the second (32) waits for room.
    wait_until("second batch blocked", || {
        q.pending_input() == 0 && q.device_counters().processed == 32
    });
    q.terminate();
    assert_eq!(dev.join().unwrap().state, DeviceState::Terminated);
    let c = q.device_counters();
    assert_eq!(c.undelivered, 32);
    assert_eq!(c.processed, 64);
    assert_eq!(receive_n(&mut q, 32).len(), 32);
}

#[test]
fn stress_exactly_once_across_lanes() {
    const N: u64 = 2_000_000;
    let mut q = PersistentQueues::<u64, u64>::on_heap(cfg(4, 1024, 1024)).unwrap();
    let dev = EmulatedDevice::spawn(
        q.device_view(),
        opts(256),
        |x: &u64, out: &mut u64, e: &Envelope| {
            *out = x.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ e.message_id;
            true
        },
    )
    .unwrap();
    q.activate();
    let mut next = 1u64;
    let mut received = 0u64;
    let mut sum_ids = 0u64;
    let mut sum_payload = 0u64;
    let mut last_in_lane = [0u64; 4];
    let mut buf = Vec::with_capacity(1024);
    let mut batch = Vec::with_capacity(64);
    let deadline = Instant::now() + Duration::from_secs(120);
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
    assert!(q.try_receive().is_none());
    q.terminate();
    dev.join().unwrap();
    let c = q.device_counters();
    assert_eq!(c.processed, N);
    assert!(c.batches >= N / 256);
}

#[test]
fn invalid_configurations_are_typed_errors() {
    for bad in [cfg(0, 8, 8), cfg(9, 8, 8), cfg(1, 3, 8), cfg(1, 8, 0)] {
        assert!(matches!(
            PersistentQueues::<u64, u64>::on_heap(bad),
            Err(PersistentError::Config(_))
        ));
    }
    let q = PersistentQueues::<u64, u64>::on_heap(cfg(1, 8, 16)).unwrap();
    assert!(matches!(
        EmulatedDevice::spawn(q.device_view(), opts(32), double),
        Err(PersistentError::Config(_))
    ));
}

#[test]
fn priority_mapping_covers_every_lane_in_order() {
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
