//! The bulk lanes (`persistent::bulk`): deep queues by the copy engine, FIFO per lane across
//! path switches, through terminate and quiesce, and counted apart by the bus model.

use super::*;

// ---- the bulk lanes (persistent::bulk): deep queues by the copy engine ----

fn launch_bulk(
    name: &str,
    handler: &str,
    batch: u32,
    queues: QueueConfig,
    mode: BulkMode,
    threshold: usize,
) -> SimKernel<u64, u64> {
    let opts = SimLaunchOptions {
        queues,
        heartbeat_timeout: None,
        bulk: BulkConfig { mode, threshold },
        ..SimLaunchOptions::default()
    };
    SimKernel::launch(&source(name, handler, batch), &[0u8; 8], &opts).unwrap()
}

/// Runs of random length (1 to 3 thresholds) on random lanes, sent while the kernel runs, so
/// lanes switch between their LL and bulk paths again and again (and wait for a drain before
/// a switch): every message comes back exactly once, FIFO within its lane, with its value.
#[test]
fn bulk_lane_keeps_fifo_per_lane_across_path_switches() {
    let _serial = serial();
    const N: u64 = 60_000;
    const THRESHOLD: usize = 24;
    for mode in [BulkMode::Auto, BulkMode::On] {
        let mut q = launch_bulk("bulk_switch", MIX, 64, cfg(4, 256, 256), mode, THRESHOLD);
        q.activate();
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut step = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut next, mut received, mut sum) = (1u64, 0u64, 0u64);
        let mut last_in_lane = [0u64; 4];
        let mut pending: Vec<Slot<u64>> = Vec::new();
        let mut buf = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(300);
        while received < N {
            assert!(
                Instant::now() < deadline,
                "{mode:?}: timed out at {received}"
            );
            if pending.is_empty() && next <= N {
                let r = step();
                let prio = (r >> 8) as u8;
                let len = 1 + (r >> 20) as usize % (3 * THRESHOLD);
                for id in next..(next + len as u64).min(N + 1) {
                    pending.push(Slot::new(env(id, prio), id));
                }
                next += pending.len() as u64;
            }
            let n = q.send_batch(&pending);
            pending.drain(..n);
            buf.clear();
            q.receive_into(&mut buf, 256);
            for s in &buf {
                let id = s.env.correlation_id;
                assert_eq!(s.payload, id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id);
                let lane = lane_for_priority(s.env.priority, 4);
                assert!(
                    id > last_in_lane[lane],
                    "{mode:?}: lane {lane} out of order at {id}"
                );
                last_in_lane[lane] = id;
                sum = sum.wrapping_add(id);
                received += 1;
            }
        }
        assert_eq!(sum, N * (N + 1) / 2, "{mode:?}");
        let bus = q.bus_stats().expect("bus model");
        // Every message of mode On, and some of Auto's, crossed by the copy engine.
        let slot = core::mem::size_of::<Slot<u64>>() as u64;
        if mode == BulkMode::On {
            assert_eq!(bus.copy_engine_bytes, N * slot, "{bus:?}");
        } else {
            assert!(
                bus.copy_engine_bytes > 0 && bus.copy_engine_bytes < N * slot,
                "{bus:?}"
            );
        }
        q.terminate(T).unwrap();
        assert_eq!(q.device_counters().processed, N, "{mode:?}");
    }
}

/// Messages on the bulk path that the kernel never took come back from the staging ring at
/// terminate, highest lane first and FIFO within a lane, after the LL ones of their lane's
/// history were handled.
#[test]
fn bulk_lane_messages_come_back_at_terminate() {
    let _serial = serial();
    let mut q = launch_bulk("bulk_left", DOUBLE, 32, cfg(2, 64, 64), BulkMode::Auto, 8);
    // Never activated: a short run on lane 1 (LL), a long run on lane 0 (bulk).
    for i in 1..=3u64 {
        q.send(env(i, 200), i).unwrap();
    }
    let run: Vec<_> = (4..=20u64).map(|i| Slot::new(env(i, 10), i)).collect();
    assert_eq!(q.send_batch(&run), run.len());
    // Lane 1 now holds LL messages: a long run there waits for them to drain.
    let held: Vec<_> = (21..=40u64).map(|i| Slot::new(env(i, 200), i)).collect();
    assert_eq!(
        q.send_batch(&held),
        0,
        "a deep run must not pass the LL messages"
    );
    assert_eq!(q.queues().pending_input(), 20);
    q.terminate(T).unwrap();
    let back = q.reclaim_input().unwrap();
    assert_eq!(
        back.iter().map(|s| s.payload).collect::<Vec<_>>(),
        (1..=20).collect::<Vec<_>>()
    );
    assert_eq!(q.queues().pending_input(), 0);
    assert_eq!(q.device_counters().processed, 0);
}

/// A quiesce (park and relaunch over the same memory) in the middle of a bulk stream: the
/// relaunched kernel resumes from the heads and tails where they stand; nothing lost, none
/// twice, order kept.
#[test]
fn bulk_lane_survives_quiesce_and_resume() {
    let _serial = serial();
    let mut q = launch_bulk("bulk_park", DOUBLE, 32, cfg(1, 256, 256), BulkMode::On, 1);
    q.activate();
    let mut got: Vec<Slot<u64>> = Vec::new();
    let mut next = 1u64;
    for round in 0..6 {
        let run: Vec<_> = (next..next + 50)
            .map(|i| Slot::new(env(i, 128), i))
            .collect();
        let mut sent = 0;
        while sent < run.len() {
            sent += q.send_batch(&run[sent..]);
            q.receive_into(&mut got, 256);
        }
        next += 50;
        if round % 2 == 1 {
            assert!(q.quiesce(T), "park");
            q.resume();
        }
    }
    wait_until("every output", || {
        q.receive_into(&mut got, 256);
        got.len() == 300
    });
    for (k, s) in got.iter().enumerate() {
        assert_eq!(
            (s.env.correlation_id, s.payload),
            (k as u64 + 1, 2 * (k as u64 + 1))
        );
    }
    q.terminate(T).unwrap();
}

/// The bus model's view of the two paths: at one message in flight the automatic mode uses the
/// LL lane (one dependent bus read, no copy-engine bytes); a full batch goes by the copy engine
/// and the kernel reads at most 8 bytes of it per message over the bus (control words only),
/// the rest from device memory.
#[test]
fn bus_model_counts_the_bulk_path_apart() {
    let _serial = serial();
    let mut q = launch_bulk(
        "bulk_bus",
        DOUBLE,
        256,
        cfg(1, 1024, 1024),
        BulkMode::Auto,
        64,
    );
    q.activate();
    let before = q.bus_stats().expect("bus model");
    for i in 1..=20u64 {
        q.send(env(i, 128), i).unwrap();
        assert_eq!(receive_n(&mut q, 1)[0].payload, 2 * i);
    }
    wait_until("the model's count", || {
        q.bus_stats().unwrap().batches >= before.batches + 20
    });
    let one = q.bus_stats().unwrap().since(&before);
    assert_eq!(one.copy_engine_bytes, 0, "{one:?}");
    assert_eq!(one.chain_max, 1, "{one:?}");
    // A full batch, queued while parked so one poll takes it whole.
    q.deactivate();
    wait_until("the park", || {
        q.device_counters().state == Some(DeviceState::Idle)
    });
    let at = q.bus_stats().unwrap();
    let run: Vec<_> = (21..=276u64).map(|i| Slot::new(env(i, 128), i)).collect();
    assert_eq!(q.send_batch(&run), 256);
    // Let the copy engine finish before the kernel looks, so one batch takes all 256.
    assert!(q.queues().wait_bulk_copies(T), "the copies landed");
    q.activate();
    let out = receive_n(&mut q, 256);
    assert!(out.iter().zip(21u64..).all(|(s, i)| s.payload == 2 * i));
    wait_until("the model's count", || {
        q.bus_stats().unwrap().batches > at.batches
    });
    let b = q.bus_stats().unwrap().since(&at);
    let m = b.per_message();
    let slot = core::mem::size_of::<Slot<u64>>() as f64;
    assert_eq!(m.copy_engine_bytes, slot, "{b:?}");
    assert!(
        m.read_bytes <= 8.0,
        "SM bytes over the bus per message: {} ({b:?})",
        m.read_bytes
    );
    assert!(m.dev_read_bytes >= slot, "{b:?}");
    assert_eq!(b.driver_calls, 2, "one copy and one tail store: {b:?}");
    q.terminate(T).unwrap();
}
