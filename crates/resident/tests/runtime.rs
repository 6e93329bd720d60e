//! The public behaviour of ring kernels on the CPU backend: lifecycle, backpressure, priority,
//! request/response, kernel-to-kernel, panic isolation, terminate accounting, telemetry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use resident::prelude::*;
use resident::Op;

const T: Duration = Duration::from_secs(10);

fn rt() -> Runtime {
    Runtime::builder()
        .backend(Backend::Cpu)
        .enable_telemetry(true)
        .build()
        .unwrap()
}

fn doubler(id: &str) -> RingKernel<u64, u64> {
    RingKernel::<u64, u64>::new(id).handler(|_ctx: &mut Context<()>, x: u64| Some(x * 2))
}

#[test]
fn launch_activate_send_receive() {
    let rt = rt();
    let h = rt.launch(doubler("d")).unwrap();
    assert_eq!(h.state(), KernelState::Launched);
    h.activate().unwrap();
    assert_eq!(h.state(), KernelState::Active);
    let id = h.send(21).unwrap();
    let (env, out) = h.receive_envelope(T).unwrap();
    assert_eq!(out, 42);
    assert_eq!(env.correlation_id, id, "response carries the request id");
    assert_eq!(h.try_receive().unwrap(), None);
}

#[test]
fn messages_sent_before_activate_queue_up() {
    let rt = rt();
    let h = rt.launch(doubler("d")).unwrap();
    for i in 0..10 {
        h.send(i).unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(h.telemetry().messages_processed, 0);
    assert_eq!(h.telemetry().queue_depth, 10);
    h.activate().unwrap();
    let got: Vec<u64> = (0..10).map(|_| h.receive(T).unwrap()).collect();
    assert_eq!(got, (0..10).map(|i| i * 2).collect::<Vec<_>>());
}

#[test]
fn deactivate_really_stops_intake_and_activate_resumes() {
    let rt = rt();
    let h = rt.launch(doubler("d")).unwrap();
    h.activate().unwrap();
    h.send(1).unwrap();
    assert_eq!(h.receive(T).unwrap(), 2);
    h.deactivate().unwrap();
    assert_eq!(h.state(), KernelState::Inactive);
    for i in 0..5 {
        h.send(i).unwrap();
    }
    std::thread::sleep(Duration::from_millis(30));
    let t = h.telemetry();
    assert_eq!(t.messages_processed, 1, "nothing handled while inactive");
    assert_eq!(t.queue_depth, 5);
    assert!(h.try_receive().unwrap().is_none());
    h.activate().unwrap();
    for i in 0..5 {
        assert_eq!(h.receive(T).unwrap(), i * 2);
    }
}

#[test]
fn invalid_transitions_are_typed_errors_naming_kernel_state_and_op() {
    let rt = rt();
    let h = rt.launch(doubler("k1")).unwrap();
    let e = h.deactivate().unwrap_err();
    assert!(
        matches!(&e, Error::InvalidState { id, op: "deactivate", state: KernelState::Launched } if id == "k1"),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "kernel 'k1': cannot deactivate while launched"
    );
    h.activate().unwrap();
    assert!(matches!(
        h.activate().unwrap_err(),
        Error::InvalidState {
            op: "activate",
            state: KernelState::Active,
            ..
        }
    ));
    let first = h.terminate().unwrap();
    assert_eq!(h.state(), KernelState::Terminated);
    assert!(matches!(
        h.activate().unwrap_err(),
        Error::InvalidState {
            state: KernelState::Terminated,
            ..
        }
    ));
    // Terminate is idempotent: a second call (or one after a runtime shutdown) hands back the
    // kept report instead of losing it.
    let again = h.terminate().unwrap();
    assert_eq!(again.processed, first.processed);
    assert_eq!(again.undelivered.len(), first.undelivered.len());
    assert!(h.report().is_some());
    let e = h.send(5).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::NotAccepting {
                state: KernelState::Terminated,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.into_message::<u64>(),
        Some(5),
        "refused message handed back"
    );
    assert!(matches!(
        h.receive(Duration::from_millis(10)).unwrap_err(),
        Error::InvalidState { op: "receive", .. }
    ));
}

#[test]
fn unknown_ids_and_type_mismatch() {
    let rt = rt();
    rt.launch(doubler("a")).unwrap();
    rt.launch(
        RingKernel::<u32, f32>::new("b").handler(|_: &mut Context<()>, x: u32| Some(x as f32)),
    )
    .unwrap();
    assert_eq!(rt.kernel_ids(), vec!["a".to_string(), "b".to_string()]);
    assert!(rt.kernel::<u64, u64>("a").is_ok());
    assert!(
        matches!(rt.kernel::<u64, u64>("zz").unwrap_err(), Error::UnknownKernel { id } if id == "zz")
    );
    let e = rt.kernel::<u64, u64>("b").unwrap_err();
    assert!(matches!(e, Error::TypeMismatch { .. }), "{e}");
    assert!(e.to_string().contains("u32, f32"), "{e}");
    assert!(matches!(
        rt.launch(doubler("a")).unwrap_err(),
        Error::DuplicateKernel { .. }
    ));
    let no_handler = rt.launch(RingKernel::<u64, u64>::new("c")).unwrap_err();
    assert!(
        matches!(no_handler, Error::InvalidConfig { .. }),
        "{no_handler}"
    );
    let bad_lanes = rt.launch(doubler("c").priority_lanes(0)).unwrap_err();
    assert!(matches!(bad_lanes, Error::InvalidConfig { .. }));
}

#[test]
fn relaunch_after_terminate() {
    let rt = rt();
    rt.launch(doubler("a")).unwrap().terminate().unwrap();
    let h = rt.launch(doubler("a")).unwrap();
    h.activate().unwrap();
    assert_eq!(h.call(4, T).unwrap(), 8);
}

#[test]
fn send_batch_reports_how_many_were_taken() {
    let rt = rt();
    let h = rt
        .launch(
            doubler("sb")
                .queue_size(4)
                .priority_lanes(1)
                .backpressure(Backpressure::Reject),
        )
        .unwrap();
    assert_eq!(
        h.send_batch(&[1, 2, 3, 4, 5, 6]).unwrap(),
        4,
        "the rest is still the caller's"
    );
    let e = h.send_batch(&[7, 8]).unwrap_err();
    assert!(matches!(e, Error::QueueFull { .. }));
    assert_eq!(e.into_message::<u64>(), Some(7));
    h.activate().unwrap();
    let got: Vec<u64> = (0..4).map(|_| h.receive(T).unwrap()).collect();
    assert_eq!(got, vec![2, 4, 6, 8]);
}

#[test]
fn reject_hands_the_message_back() {
    let rt = rt();
    let h = rt
        .launch(
            doubler("r")
                .queue_size(2)
                .priority_lanes(1)
                .backpressure(Backpressure::Reject),
        )
        .unwrap();
    h.send(1).unwrap();
    h.send(2).unwrap();
    let e = h.send(3).unwrap_err();
    assert!(matches!(e, Error::QueueFull { .. }));
    assert_eq!(e.into_message::<u64>(), Some(3));
    assert_eq!(h.telemetry().messages_refused, 1);
}

#[test]
fn block_times_out_with_message_back_then_proceeds() {
    let rt = rt();
    let h = rt
        .launch(
            doubler("b")
                .queue_size(1)
                .priority_lanes(1)
                .backpressure(Backpressure::Block(Duration::from_millis(20))),
        )
        .unwrap();
    h.send(1).unwrap();
    let e = h.send(2).unwrap_err();
    assert!(matches!(e, Error::Timeout { op: Op::Send, .. }), "{e}");
    assert_eq!(e.into_message::<u64>(), Some(2));
    h.activate().unwrap();
    assert_eq!(h.receive(T).unwrap(), 2);
}

#[test]
fn drop_policies_count_drops() {
    let rt = rt();
    for (id, policy, expect) in [
        ("o", Backpressure::DropOldest, vec![6, 8]),
        ("n", Backpressure::DropNewest, vec![2, 4]),
    ] {
        let h = rt
            .launch(
                doubler(id)
                    .queue_size(2)
                    .priority_lanes(1)
                    .backpressure(policy),
            )
            .unwrap();
        for i in 1..=4 {
            h.send(i).unwrap();
        }
        assert_eq!(h.telemetry().messages_dropped, 2, "{policy:?}");
        h.activate().unwrap();
        let got = vec![h.receive(T).unwrap(), h.receive(T).unwrap()];
        assert_eq!(got, expect, "{policy:?}");
    }
}

#[test]
fn priority_higher_first_fifo_within_lane() {
    let rt = rt();
    let h = rt.launch(doubler("p").batch_size(1)).unwrap();
    // Queued before activation so the order is decided by the lanes alone.
    for (v, p) in [(1, 10u8), (2, 250), (3, 128), (4, 251), (5, 11), (6, 129)] {
        h.send_with_priority(v, p).unwrap();
    }
    h.activate().unwrap();
    let got: Vec<u64> = (0..6).map(|_| h.receive(T).unwrap() / 2).collect();
    assert_eq!(got, vec![2, 4, 3, 6, 1, 5]);
}

#[test]
fn call_correlates_under_many_concurrent_callers() {
    let rt = rt();
    let h = rt.launch(doubler("c")).unwrap();
    h.activate().unwrap();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let h = h.clone();
            std::thread::spawn(move || {
                for i in 0..2_000u64 {
                    let x = t * 1_000_000 + i;
                    assert_eq!(h.call(x, T).unwrap(), x * 2);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Replies went to their callers, not to the output queue.
    assert_eq!(h.try_receive().unwrap(), None);
    assert_eq!(h.telemetry().messages_processed, 16_000);
}

#[test]
fn call_with_no_output_and_call_timeout() {
    let rt = rt();
    let h = rt
        .launch(
            RingKernel::<u64, u64>::new("n").handler(|_: &mut Context<()>, x: u64| {
                if x == 0 {
                    std::thread::sleep(Duration::from_millis(100));
                }
                x.is_multiple_of(2).then_some(x)
            }),
        )
        .unwrap();
    h.activate().unwrap();
    assert!(matches!(h.call(3, T).unwrap_err(), Error::NoReply { .. }));
    let e = h.call(0, Duration::from_millis(10)).unwrap_err();
    assert!(matches!(e, Error::Timeout { op: Op::Call, .. }), "{e}");
    // The late reply is counted as dropped, never delivered to the output queue.
    assert_eq!(h.call(2, T).unwrap(), 2);
    assert_eq!(h.telemetry().messages_dropped, 1);
    assert_eq!(h.try_receive().unwrap(), None);
}

#[test]
fn handler_panic_fails_only_that_kernel_and_loses_nothing() {
    let rt = rt();
    let bad = rt
        .launch(RingKernel::<u64, u64>::new("bad").batch_size(16).handler(
            |_: &mut Context<()>, x: u64| {
                if x == 3 {
                    panic!("boom on {x}");
                }
                Some(x)
            },
        ))
        .unwrap();
    let good = rt.launch(doubler("good")).unwrap();
    good.activate().unwrap();
    for i in 0..6 {
        bad.send(i).unwrap();
    }
    bad.activate().unwrap();
    // Outputs before the panic arrive, then the failure shows promptly.
    for i in 0..3 {
        assert_eq!(bad.receive(T).unwrap(), i);
    }
    let e = bad.receive(T).unwrap_err();
    assert!(
        matches!(&e, Error::KernelFailed { reason: reason @ Failure::HandlerPanicked { .. }, .. }
            if reason.to_string().contains("boom on 3")),
        "{e}"
    );
    assert!(matches!(bad.state(), KernelState::Failed(r) if r.to_string().contains("boom on 3")));
    let e = bad.send(9).unwrap_err();
    assert!(matches!(
        e,
        Error::NotAccepting {
            state: KernelState::Failed(_),
            ..
        }
    ));
    assert!(matches!(
        bad.call(1, T).unwrap_err(),
        Error::NotAccepting { .. }
    ));
    // The other kernel keeps running.
    assert_eq!(good.call(5, T).unwrap(), 10);
    let report = bad.terminate().unwrap();
    let (reason, failed) = report.failure.expect("failure reported");
    assert!(reason.to_string().contains("boom"));
    assert_eq!(failed.map(|(_, m)| m), Some(3));
    let left: Vec<u64> = report.undelivered.iter().map(|(_, m)| *m).collect();
    assert_eq!(
        left,
        vec![4, 5],
        "messages after the panic are returned, not lost"
    );
    assert_eq!(bad.telemetry().errors, 1);
}

#[test]
fn panic_wakes_waiting_callers_promptly() {
    let rt = rt();
    let h = rt
        .launch(
            RingKernel::<u64, u64>::new("p").handler(|_: &mut Context<()>, x: u64| {
                std::thread::sleep(Duration::from_millis(50));
                if x == 1 {
                    panic!("bad input");
                }
                Some(x)
            }),
        )
        .unwrap();
    h.activate().unwrap();
    let h2 = h.clone();
    let waiter = std::thread::spawn(move || h2.call(2, Duration::from_secs(30)));
    std::thread::sleep(Duration::from_millis(5));
    let start = std::time::Instant::now();
    assert!(matches!(
        h.call(1, Duration::from_secs(30)).unwrap_err(),
        Error::KernelFailed { .. }
    ));
    let r = waiter.join().unwrap();
    // Either answered before the panic or failed promptly: never waits out the 30 s.
    assert!(
        matches!(
            r,
            Ok(2) | Err(Error::KernelFailed { .. }) | Err(Error::NotAccepting { .. })
        ),
        "{r:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn terminate_reports_undelivered_inputs_and_unreceived_outputs() {
    let rt = rt();
    let h = rt.launch(doubler("t")).unwrap();
    h.activate().unwrap();
    for i in 0..3 {
        h.send(i).unwrap();
    }
    h.drain(T).unwrap();
    h.deactivate().unwrap();
    for i in 10..15 {
        h.send(i).unwrap();
    }
    let r = h.terminate().unwrap();
    assert_eq!(r.processed, 3);
    assert_eq!(
        r.undelivered.iter().map(|(_, m)| *m).collect::<Vec<_>>(),
        vec![10, 11, 12, 13, 14]
    );
    assert_eq!(
        r.unreceived.iter().map(|(_, m)| *m).collect::<Vec<_>>(),
        vec![0, 2, 4]
    );
    assert!(r.failure.is_none());
}

#[test]
fn kernel_to_kernel_pipeline_without_host_relay() {
    let rt = rt();
    let sink = rt
        .launch(
            RingKernel::<u64, u64>::new("sink").handler(|_: &mut Context<()>, x: u64| Some(x + 1)),
        )
        .unwrap();
    let stage = rt
        .launch(
            RingKernel::<u64, u64>::new("stage").handler(|ctx: &mut Context<()>, x: u64| {
                ctx.send_to("sink", x * 10).expect("route to sink");
                None
            }),
        )
        .unwrap();
    sink.activate().unwrap();
    stage.activate().unwrap();
    stage.send_batch(&[1, 2, 3]).unwrap();
    let got: Vec<u64> = (0..3).map(|_| sink.receive(T).unwrap()).collect();
    assert_eq!(got, vec![11, 21, 31]);
    assert_eq!(stage.try_receive().unwrap(), None);
}

#[test]
fn kernel_to_kernel_errors_are_typed() {
    let rt = rt();
    let errors = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let e2 = errors.clone();
    let h = rt
        .launch(
            RingKernel::<u64, u64>::new("src").handler(move |ctx: &mut Context<()>, x: u64| {
                let r = if x == 0 {
                    ctx.send_to("nobody", 1u64)
                } else {
                    ctx.send_to("src", 1.5f32)
                };
                e2.lock().push(r.unwrap_err().to_string());
                None
            }),
        )
        .unwrap();
    h.activate().unwrap();
    h.send(0).unwrap();
    h.send(1).unwrap();
    h.drain(T).unwrap();
    let errs = errors.lock().clone();
    assert_eq!(errs[0], "no kernel with id 'nobody'");
    assert!(errs[1].contains("is RingKernel<u64, u64>"), "{}", errs[1]);
}

#[test]
fn state_persists_across_messages() {
    let rt = rt();
    let h = rt
        .launch(RingKernel::<u64, u64>::new("sum").state(0u64).handler(
            |ctx: &mut Context<u64>, x: u64| {
                *ctx.state_mut() += x;
                Some(*ctx.state())
            },
        ))
        .unwrap();
    h.activate().unwrap();
    let sums: Vec<u64> = (1..=4).map(|i| h.call(i, T).unwrap()).collect();
    assert_eq!(sums, vec![1, 3, 6, 10]);
}

#[test]
fn loop_form_receive_send_and_terminate() {
    let rt = rt();
    let h = rt
        .launch(RingKernel::<u64, u64>::new("loop").state(0u64).run(|ctx| {
            while !ctx.should_terminate() {
                if !ctx.is_active() {
                    ctx.wait_active();
                    continue;
                }
                let batch = ctx.receive_batch(8, Duration::from_millis(5));
                for x in batch {
                    *ctx.state_mut() += 1;
                    ctx.send(x + 100);
                }
            }
        }))
        .unwrap();
    h.send(1).unwrap();
    h.activate().unwrap();
    assert_eq!(h.receive(T).unwrap(), 101);
    assert_eq!(
        h.call(7, T).unwrap(),
        107,
        "call works in the loop form: send answers the last message"
    );
    h.deactivate().unwrap();
    h.send(3).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(h.telemetry().queue_depth, 1, "no intake while inactive");
    let r = h.terminate().unwrap();
    assert_eq!(r.undelivered.len(), 1);
    assert_eq!(h.state(), KernelState::Terminated);
}

#[test]
fn loop_form_returning_early_is_a_failure_not_silence() {
    let rt = rt();
    let h = rt
        .launch(RingKernel::<u64, u64>::new("early").run(|_ctx| {}))
        .unwrap();
    h.activate().unwrap();
    let deadline = std::time::Instant::now() + T;
    while !matches!(h.state(), KernelState::Failed(_)) {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(h.send(1).is_err());
}

#[test]
fn telemetry_counts_latency_throughput_and_prometheus() {
    let rt = rt();
    let h = rt.launch(doubler("tel")).unwrap();
    h.activate().unwrap();
    for i in 0..1000 {
        h.send(i).unwrap();
    }
    for _ in 0..1000 {
        h.receive(T).unwrap();
    }
    let t = h.telemetry();
    assert_eq!(t.messages_received, 1000);
    assert_eq!(t.messages_processed, 1000);
    assert_eq!(t.messages_dropped, 0);
    assert_eq!(t.queue_depth, 0);
    assert_eq!(t.latency.count, 1000);
    assert!(
        t.latency.p50_ns > 0
            && t.latency.p50_ns <= t.latency.p99_ns
            && t.latency.p99_ns <= t.latency.max_ns
    );
    assert!(t.throughput > 0.0);
    assert!(t.batches >= 1 && t.batches <= 1000);
    let sum = rt.telemetry();
    assert_eq!(sum.messages_processed, 1000);
    let prom = rt.prometheus();
    assert!(
        prom.contains("resident_messages_processed_total{kernel=\"tel\"} 1000"),
        "{prom}"
    );
}

#[test]
fn dropping_the_runtime_drains_and_stops_every_kernel() {
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    {
        let rt = rt();
        let h = rt
            .launch(RingKernel::<u64, u64>::new("slow").handler(
                move |_: &mut Context<()>, _x: u64| {
                    std::thread::sleep(Duration::from_micros(200));
                    s2.fetch_add(1, Ordering::Relaxed);
                    None
                },
            ))
            .unwrap();
        h.activate().unwrap();
        for i in 0..100 {
            h.send(i).unwrap();
        }
        rt.launch(doubler("idle")).unwrap();
    }
    assert_eq!(
        seen.load(Ordering::Relaxed),
        100,
        "active kernels drain on drop"
    );
}

#[test]
fn backend_auto_runs_on_cpu_here_and_cuda_request_is_typed() {
    let rt = Runtime::builder().backend(Backend::Auto).build().unwrap();
    assert!(matches!(rt.backend(), Backend::Cpu | Backend::Cuda));
}

/// `snapshot_state` on a CPU handler reads between batches: racing a busy kernel it never sees a
/// half-updated state, values never go back, and the last read after a drain sees every message.
/// A wrong type, and a loop-form kernel (whose state is its loop's), are typed errors.
#[test]
fn snapshot_state_of_a_cpu_handler_is_never_torn() {
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    struct Four([u64; 4]);
    let rt = rt();
    let k = rt
        .launch(
            RingKernel::<u64, u64>::new("four")
                .state(Four([0; 4]))
                .batch_size(8)
                .handler(|ctx: &mut Context<Four>, x: u64| {
                    // Written one element at a time: a read in the middle would be torn.
                    for v in ctx.state_mut().0.iter_mut() {
                        *v += x;
                        for _ in 0..200 {
                            std::hint::spin_loop();
                        }
                        std::hint::black_box(&*v);
                    }
                    None
                }),
        )
        .unwrap();
    k.activate().unwrap();
    let sender = {
        let k = k.clone();
        std::thread::spawn(move || {
            for _ in 0..5_000 {
                k.send(1).unwrap();
            }
        })
    };
    // Read while the kernel is busy, until it has handled every message.
    let mut last = 0;
    while last < 5_000 {
        let s = k.snapshot_state::<Four>().unwrap();
        assert!(s.0.iter().all(|v| *v == s.0[0]), "torn read: {:?}", s.0);
        assert!(s.0[0] >= last, "went back: {} after {last}", s.0[0]);
        last = s.0[0];
    }
    sender.join().unwrap();
    k.drain(T).unwrap();
    assert_eq!(k.snapshot_state::<Four>().unwrap().0, [5_000; 4]);
    let e = k.snapshot_state::<u32>().unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    assert!(e.to_string().contains("Four"), "{e}");
    // After terminate: the final state.
    k.terminate().unwrap();
    assert_eq!(k.snapshot_state::<Four>().unwrap().0, [5_000; 4]);
    let lp = rt
        .launch(RingKernel::<u64, u64>::new("loop").state(7u64).run(
            |ctx: &mut LoopContext<u64, u64, u64>| {
                while !ctx.should_terminate() {
                    let _ = ctx.receive(Duration::from_millis(5));
                }
            },
        ))
        .unwrap();
    assert!(matches!(
        lp.snapshot_state::<u64>().unwrap_err(),
        Error::InvalidConfig { .. }
    ));
}

/// Telemetry never shows a processed message beside `batches: 0`: the batch is counted when it
/// is taken, before its messages count as processed (and read in that order).
#[test]
fn telemetry_counts_the_batch_before_its_messages() {
    let rt = rt();
    for round in 0..200 {
        let k = rt
            .launch(
                RingKernel::<u32, u32>::new(format!("count-{round}"))
                    .handler(|_: &mut Context<()>, x: u32| Some(x)),
            )
            .unwrap();
        k.activate().unwrap();
        k.send(1).unwrap();
        loop {
            let t = k.telemetry();
            assert!(
                t.messages_processed == 0 || t.batches >= 1,
                "round {round}: {} processed in {} batches: {t:?}",
                t.messages_processed,
                t.batches
            );
            if t.messages_processed == 1 {
                break;
            }
        }
        k.terminate().unwrap();
    }
}

#[test]
fn expired_inputs_are_skipped_by_the_loop_form_and_the_handler_and_counted() {
    let rt = rt();
    // Loop form: its `receive_batch` never returns an expired input.
    let lp = rt
        .launch(RingKernel::<u64, u64>::new("ttl-loop").run(|ctx| {
            while !ctx.should_terminate() {
                if !ctx.is_active() {
                    ctx.wait_active();
                    continue;
                }
                for x in ctx.receive_batch(4, Duration::from_millis(5)) {
                    ctx.send(x);
                }
            }
        }))
        .unwrap();
    // Handler form with batches of 4: several whole batches expire before a live message.
    let hd = rt.launch(doubler("ttl-handler").batch_size(4)).unwrap();
    let short = Duration::from_millis(1);
    for h in [&lp, &hd] {
        for i in 0..10 {
            h.send_with_ttl(i, short).unwrap();
        }
        h.send(100).unwrap();
        h.send_with_ttl(101, T * 100).unwrap();
        for i in 0..3 {
            h.send_with_ttl(200 + i, short).unwrap();
        }
        h.send(300).unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    for (h, f) in [(&lp, 1), (&hd, 2)] {
        h.activate().unwrap();
        let got: Vec<u64> = (0..3).map(|_| h.receive(T).unwrap()).collect();
        assert_eq!(got, vec![100 * f, 101 * f, 300 * f], "{}", h.id());
        h.drain(T).unwrap();
        assert_eq!(h.try_receive().unwrap(), None);
        let tm = h.telemetry();
        assert_eq!(
            (
                tm.messages_received,
                tm.messages_processed,
                tm.messages_expired
            ),
            (16, 3, 13),
            "{tm:?}"
        );
        // Left in the queue at terminate: returned, not expired, whatever its deadline.
        h.deactivate().unwrap();
        h.send_with_ttl(7, short).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let r = h.terminate().unwrap();
        assert_eq!((r.processed, r.expired, r.undelivered.len()), (3, 13, 1));
        assert_eq!(r.undelivered[0].0.ttl(), Some(short));
    }
    let text = rt.prometheus();
    assert!(
        text.contains("# TYPE resident_messages_expired_total counter"),
        "{text}"
    );
}

#[test]
fn a_call_carries_its_timeout_as_deadline_and_without_one_nothing_expires() {
    let rt = rt();
    let h = rt.launch(doubler("call-deadline")).unwrap();
    // Not active yet: the call times out with its request queued, and then expires.
    assert!(matches!(
        h.call(1, Duration::from_millis(2)),
        Err(Error::Timeout { op: Op::Call, .. })
    ));
    // A call with an unbounded timeout carries no deadline (nothing to check).
    let h2 = h.clone();
    let long = std::thread::spawn(move || h2.call(2, Duration::MAX));
    std::thread::sleep(Duration::from_millis(20));
    h.activate().unwrap();
    assert_eq!(long.join().unwrap().unwrap(), 4);
    assert_eq!(h.call(3, T).unwrap(), 6);
    let tm = h.telemetry();
    assert_eq!(
        (
            tm.messages_processed,
            tm.messages_expired,
            tm.messages_dropped
        ),
        (2, 1, 0),
        "{tm:?}"
    );
}
