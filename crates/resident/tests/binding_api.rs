//! The handle API language bindings use: `send_tracked` says what a drop policy discarded,
//! `call_start`/`PendingCall` waits for a reply in slices, `input_has_room`, and
//! `LoopContext::output_has_room`/`send_all`, and the batch forms `input_room`,
//! `LoopContext::receive_batch_envelopes`/`output_room`/`send_replies`, and kernels driven from
//! outside the engine (`run_outside`, `OutsideLoop`, `on_terminate`).

use std::time::Duration;

use resident::prelude::*;

fn rt() -> Runtime {
    Runtime::builder().backend(Backend::Cpu).build().unwrap()
}

#[test]
fn send_tracked_hands_back_what_the_policy_dropped() {
    let rt = rt();
    let k = rt
        .launch(
            RingKernel::<u64, u64>::new("oldest")
                .queue_size(2)
                .priority_lanes(1)
                .backpressure(Backpressure::DropOldest)
                .handler(|_: &mut Context<()>, x| Some(x)),
        )
        .unwrap();
    assert_eq!(k.send_tracked(1, 128).unwrap().1, SendOutcome::Queued);
    assert!(k.input_has_room());
    assert_eq!(k.send_tracked(2, 128).unwrap().1, SendOutcome::Queued);
    assert!(!k.input_has_room(), "two queued in a lane of two");
    match k.send_tracked(3, 128).unwrap().1 {
        SendOutcome::DroppedOldest(env, 1) => assert!(env.message_id > 0),
        other => panic!("expected the oldest (1) back, got {other:?}"),
    }
    let n = rt
        .launch(
            RingKernel::<u64, u64>::new("newest")
                .queue_size(1)
                .priority_lanes(1)
                .backpressure(Backpressure::DropNewest)
                .handler(|_: &mut Context<()>, x| Some(x)),
        )
        .unwrap();
    assert_eq!(n.send_tracked(1, 0).unwrap().1, SendOutcome::Queued);
    assert_eq!(n.send_tracked(2, 0).unwrap().1, SendOutcome::DroppedNewest);
    assert_eq!(n.telemetry().messages_dropped, 1);
    k.activate().unwrap();
    let got: Vec<u64> = (0..2)
        .map(|_| k.receive(Duration::from_secs(5)).unwrap())
        .collect();
    assert_eq!(got, vec![2, 3]);
}

#[test]
fn pending_call_waits_in_slices_and_counts_an_abandoned_reply() {
    let rt = rt();
    let k = rt
        .launch(
            RingKernel::<u64, u64>::new("slow").handler(|_: &mut Context<()>, x| {
                std::thread::sleep(Duration::from_millis(if x == 0 { 300 } else { 0 }));
                Some(x + 1)
            }),
        )
        .unwrap();
    let mut pc = k.call_start(41, 200).unwrap();
    assert!(
        pc.wait(Duration::ZERO).is_none(),
        "not active: no reply yet"
    );
    k.activate().unwrap();
    let mut r = None;
    for _ in 0..500 {
        if let Some(x) = pc.wait(Duration::from_millis(10)) {
            r = Some(x.unwrap());
            break;
        }
    }
    assert_eq!(r, Some(42));
    assert!(pc.wait(Duration::ZERO).is_none(), "taken once");
    // A call given up before its reply: the reply is counted as dropped.
    let pc = k.call_start(0, 128).unwrap();
    drop(pc);
    assert_eq!(k.call(5, Duration::from_secs(5)).unwrap(), 6);
    let t = k.telemetry();
    assert_eq!(t.messages_dropped, 1, "the abandoned reply is counted");
}

#[test]
fn call_start_with_timeout_carries_its_deadline() {
    // The kernel is inactive while the requests wait: one with a 20 ms deadline expires
    // unhandled (counted), one without a deadline and one with a long one are served.
    let rt = rt();
    let k = rt
        .launch(RingKernel::<u64, u64>::new("ttl").handler(|_: &mut Context<()>, x| Some(x + 1)))
        .unwrap();
    let stale = k
        .call_start_with_timeout(1, 128, Duration::from_millis(20))
        .unwrap();
    let mut plain = k.call_start(10, 128).unwrap();
    let mut long = k
        .call_start_with_timeout(100, 128, Duration::from_secs(60))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    k.activate().unwrap();
    let wait = |pc: &mut PendingCall<u64, u64>| {
        for _ in 0..500 {
            if let Some(r) = pc.wait(Duration::from_millis(10)) {
                return Some(r.unwrap());
            }
        }
        None
    };
    assert_eq!(wait(&mut plain), Some(11));
    assert_eq!(wait(&mut long), Some(101));
    drop(stale);
    let t = k.telemetry();
    assert_eq!((t.messages_expired, t.messages_processed), (1, 2));
}

#[test]
fn send_all_publishes_every_output() {
    let rt = rt();
    let k = rt
        .launch(
            RingKernel::<u32, u32>::new("fan").run(|ctx: &mut LoopContext<u32, u32, ()>| {
                while !ctx.should_terminate() {
                    let b = ctx.receive_batch(64, Duration::from_millis(10));
                    if !b.is_empty() {
                        assert!(ctx.output_has_room());
                        ctx.send_all(b.into_iter().map(|x| x * 10));
                    }
                }
            }),
        )
        .unwrap();
    k.activate().unwrap();
    assert_eq!(k.send_batch(&[1, 2, 3]).unwrap(), 3);
    let got: Vec<u32> = (0..3)
        .map(|_| k.receive(Duration::from_secs(5)).unwrap())
        .collect();
    assert_eq!(got, vec![10, 20, 30]);
}

#[test]
fn batch_envelopes_and_replies_pair_each_output_with_its_request() {
    let rt = rt();
    let k = rt
        .launch(
            RingKernel::<u32, u32>::new("pairs")
                .queue_size(8)
                .priority_lanes(1)
                .output_queue_size(8)
                .run(|ctx: &mut LoopContext<u32, u32, ()>| {
                    while !ctx.should_terminate() {
                        let b = ctx.receive_batch_envelopes(4, Duration::from_millis(10));
                        if b.is_empty() {
                            continue;
                        }
                        assert!(b.len() <= 4, "max respected");
                        assert!(ctx.output_room() >= b.len());
                        // Answer in reverse order: each output names its own request.
                        let outs: Vec<_> =
                            b.iter().rev().map(|(e, x)| (Some(*e), x * 10)).collect();
                        ctx.send_replies(outs);
                    }
                }),
        )
        .unwrap();
    assert_eq!(k.input_room(), 8);
    assert_eq!(k.send_batch(&[1, 2, 3]).unwrap(), 3);
    assert_eq!(k.input_room(), 5, "three of eight queued");
    k.activate().unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        let (env, x) = k.receive_envelope(Duration::from_secs(5)).unwrap();
        got.push((env.correlation_id, x));
    }
    // Each output correlates with the request that carried x / 10: requests 1, 2, 3 have
    // consecutive ids in send order.
    got.sort();
    let base = got[0].0;
    assert_eq!(got, vec![(base, 10), (base + 1, 20), (base + 2, 30)]);
    assert_eq!(k.input_room(), 8, "all taken");
}

type Held = std::sync::Arc<std::sync::Mutex<Option<OutsideLoop<u32, u32, ()>>>>;

/// A kernel driven from outside the engine (`run_outside`): no host thread; the holder
/// receives and sends with zero timeouts.
fn outside(rt: &Runtime, id: &str) -> (KernelHandle<u32, u32>, Held) {
    let held: Held = Default::default();
    let put = held.clone();
    let rang = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let k = rt
        .launch(
            RingKernel::<u32, u32>::new(id)
                .priority_lanes(4)
                .on_terminate(move || rang.store(true, std::sync::atomic::Ordering::SeqCst))
                .run_outside(move |ol| *put.lock().unwrap() = Some(ol)),
        )
        .unwrap();
    assert!(held.lock().unwrap().is_some(), "handed over during launch");
    (k, held)
}

#[test]
fn run_outside_is_driven_by_its_holder_through_the_engines_queues() {
    let rt = rt();
    let (k, held) = outside(&rt, "outside");
    k.send_with_priority(1, 0).unwrap();
    k.send_with_priority(2, 255).unwrap();
    {
        let mut g = held.lock().unwrap();
        let ol = g.as_mut().unwrap();
        assert!(
            ol.receive(Duration::ZERO).is_none(),
            "nothing before activate"
        );
    }
    k.activate().unwrap();
    let got: Vec<u32> = {
        let mut g = held.lock().unwrap();
        let ol = g.as_mut().unwrap();
        let got = (0..2).filter_map(|_| ol.receive(Duration::ZERO)).collect();
        assert!(ol.receive(Duration::ZERO).is_none());
        ol.send(99);
        got
    };
    assert_eq!(got, vec![2, 1], "priority order");
    assert_eq!(k.receive(Duration::from_secs(5)).unwrap(), 99);
    // A terminate from another thread waits for the holder to finish the loop.
    k.send(3).unwrap();
    let k2 = k.clone();
    let t = std::thread::spawn(move || k2.terminate().unwrap());
    loop {
        let mut g = held.lock().unwrap();
        let ol = g.as_mut().unwrap();
        if ol.should_terminate() {
            ol.finish(None);
            assert!(ol.is_finished());
            break;
        }
        drop(g);
        std::thread::sleep(Duration::from_millis(1));
    }
    let rep = t.join().unwrap();
    assert!(rep.failure.is_none(), "{:?}", rep.failure);
    assert_eq!(rep.undelivered.len(), 1, "the message left in the queue");
    assert_eq!(k.telemetry().messages_processed, 2);
}

#[test]
fn run_outside_terminated_on_its_own_thread_ends_at_once() {
    let rt = rt();
    let (k, held) = outside(&rt, "outside_here");
    k.activate().unwrap();
    k.send(7).unwrap();
    let t0 = std::time::Instant::now();
    let rep = k.terminate().unwrap(); // this thread drives it: no wait
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert!(rep.failure.is_none());
    assert_eq!(rep.undelivered.len(), 1);
    assert!(held.lock().unwrap().as_ref().unwrap().is_finished());
    held.lock().unwrap().as_mut().unwrap().finish(None); // later finish: no effect
    assert_eq!(k.state(), KernelState::Terminated);
}

#[test]
fn run_outside_finished_with_a_failure_fails_the_kernel() {
    let rt = rt();
    let (k, held) = outside(&rt, "outside_bad");
    k.activate().unwrap();
    held.lock()
        .unwrap()
        .as_mut()
        .unwrap()
        .finish(Some("boom".into()));
    assert!(matches!(
        k.state(),
        KernelState::Failed(Failure::LoopPanicked { .. })
    ));
    drop(held.lock().unwrap().take());
    let (k2, held2) = outside(&rt, "outside_dropped");
    k2.activate().unwrap();
    drop(held2.lock().unwrap().take()); // dropped unfinished
    assert!(matches!(k2.state(), KernelState::Failed(_)));
}
