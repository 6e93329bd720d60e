//! `RingKernel::forward_to`: outputs go kernel to kernel through the runtime, under the
//! target's backpressure, in order, and nothing is lost when the target is missing or ends.

use std::time::{Duration, Instant};

use resident::prelude::*;

const T: Duration = Duration::from_secs(10);

fn rt() -> Runtime {
    Runtime::builder().backend(Backend::Cpu).build().unwrap()
}

#[test]
fn outputs_reach_the_target_in_order_from_several_producers() {
    let rt = rt();
    // A small target queue with Block: the forwarding kernel must wait, not drop.
    let b = rt
        .launch(
            RingKernel::<u64, u64>::new("double")
                .queue_size(64)
                .backpressure(Backpressure::Block(T))
                .handler(|_: &mut Context<()>, x: u64| Some(x * 2)),
        )
        .unwrap();
    let a = rt
        .launch(
            RingKernel::<u64, u64>::new("plus-one")
                .forward_to("double")
                .handler(|_: &mut Context<()>, x: u64| Some(x + 1)),
        )
        .unwrap();
    b.activate().unwrap();
    a.activate().unwrap();
    const PER: u64 = 5_000;
    let producers: Vec<_> = (0..4u64)
        .map(|p| {
            let a = a.clone();
            std::thread::spawn(move || {
                for i in 0..PER {
                    a.send((p << 32) | i).unwrap();
                }
            })
        })
        .collect();
    let mut got = Vec::with_capacity(4 * PER as usize);
    while got.len() < (4 * PER) as usize {
        got.push(b.receive(T).unwrap());
    }
    for p in producers {
        p.join().unwrap();
    }
    // Per producer, in order and exact: ((p << 32 | i) + 1) * 2.
    let mut next = [0u64; 4];
    for v in got {
        let x = v / 2 - 1;
        let (p, i) = ((x >> 32) as usize, x & 0xffff_ffff);
        assert_eq!(i, next[p], "producer {p} out of order");
        next[p] += 1;
    }
    assert_eq!(next, [PER; 4]);
    assert_eq!(
        a.try_receive().unwrap(),
        None,
        "forwarded outputs never reach the source's own queue"
    );
    a.terminate().unwrap();
    b.terminate().unwrap();
}

#[test]
fn outputs_for_a_missing_target_end_in_the_terminate_report() {
    let rt = rt();
    let a = rt
        .launch(
            RingKernel::<u32, u32>::new("to-nowhere")
                .forward_to("nobody")
                .handler(|_: &mut Context<()>, x: u32| Some(x + 10)),
        )
        .unwrap();
    a.activate().unwrap();
    for i in 0..3 {
        a.send(i).unwrap();
    }
    let t0 = Instant::now();
    while a.telemetry().messages_processed < 3 && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = a.terminate().unwrap();
    let mut out: Vec<u32> = r.unreceived.iter().map(|(_, o)| *o).collect();
    out.extend(r.undelivered.iter().map(|(_, i)| *i + 10));
    out.sort();
    assert_eq!(
        out,
        vec![10, 11, 12],
        "every accepted message is accounted for: {r:?}"
    );
}

#[test]
fn a_target_of_another_input_type_is_refused_at_launch() {
    let rt = rt();
    let _b = rt
        .launch(RingKernel::<u8, u8>::new("bytes").handler(|_: &mut Context<()>, x: u8| Some(x)))
        .unwrap();
    let e = rt
        .launch(
            RingKernel::<u32, u32>::new("words")
                .forward_to("bytes")
                .handler(|_: &mut Context<()>, x: u32| Some(x)),
        )
        .unwrap_err();
    assert!(matches!(e, resident::Error::InvalidConfig { .. }), "{e}");
}
