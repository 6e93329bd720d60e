//! The residency rule on `Backend::CudaSim`: what needs the device idle (pinned memory, a new
//! module) quiesces every resident ring kernel (it finishes its batch and exits; queues,
//! indices, counters and device state stay) and relaunches it where it left off; a host read
//! of a kernel's state parks that kernel alone; launching a kernel of a loaded module and
//! allocating device memory (stream-ordered) park nothing. With messages in flight, nothing is
//! lost, duplicated or reordered, and device state carries across. (CudaSim only: nothing here
//! ran on a GPU.)

use std::time::{Duration, Instant};

use resident::backend::{self, Backend};
use resident::cuda::persistent::sim::relaunch_count;
use resident::prelude::*;

device_message! {
    /// A request: its send order.
    pub struct Req { pub x: u32 }
}

device_message! {
    /// The reply: the request's order and the kernel's running count.
    pub struct Rep { pub x: u32, pub seq: u32 }
}

device_message! {
    /// Device state.
    pub struct Seen { pub n: u32 }
}

const SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    out->x = in->x;
    out->seq = atomicAdd(&s->n, 1u) + 1u;
    return true;
}
"#;

const N: u32 = 6000;

fn prio(x: u32) -> u8 {
    (x.wrapping_mul(2_654_435_761) >> 24) as u8
}

fn kernel(id: &str) -> RingKernel<Req, Rep> {
    RingKernel::<Req, Rep>::new(id)
        .queue_size(256)
        .priority_lanes(4)
        .batch_size(32)
        .backpressure(Backpressure::Block(Duration::from_secs(60)))
        .cuda(CudaHandler::new(SRC).state(Seen { n: 0 }))
}

#[test]
fn launches_and_allocations_quiesce_resident_kernels_and_nothing_is_lost_or_reordered() {
    let rt = Runtime::builder()
        .backend(Backend::CudaSim)
        .build()
        .unwrap();
    let a = rt.launch(kernel("quiesce-a")).unwrap();
    a.activate().unwrap();
    let relaunches_before = relaunch_count();

    let sender = {
        let a = a.clone();
        std::thread::spawn(move || {
            for x in 1..=N {
                a.send_with_priority(Req { x }, prio(x)).unwrap();
            }
        })
    };
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let receiver = {
        let a = a.clone();
        let progress = progress.clone();
        std::thread::spawn(move || {
            let mut got = Vec::with_capacity(N as usize);
            let deadline = Instant::now() + Duration::from_secs(300);
            while got.len() < N as usize {
                assert!(Instant::now() < deadline, "received {} of {N}", got.len());
                if let Ok((env, r)) = a.receive_envelope(Duration::from_millis(100)) {
                    got.push((env.priority, r));
                    progress.store(got.len(), std::sync::atomic::Ordering::Relaxed);
                }
            }
            got
        })
    };

    // While messages flow, three rounds of: a launch beside `a` and a device allocation (no
    // quiesce: the module is loaded, the memory stream-ordered), a pinned allocation (every
    // resident kernel parks) and a read of `a`'s state (`a` parks alone): two relaunches of
    // `a` a round.
    let dev = backend::open(Backend::CudaSim).unwrap();
    let mut others = Vec::new();
    let mut in_flight = Vec::new();
    for k in 0..3 {
        std::thread::sleep(Duration::from_millis(30));
        in_flight.push(progress.load(std::sync::atomic::Ordering::Relaxed));
        let b = rt.launch(kernel(&format!("quiesce-b{k}"))).unwrap();
        b.activate().unwrap();
        assert_eq!(
            b.call(Req { x: 7 }, Duration::from_secs(30)).unwrap().seq,
            1
        );
        others.push(b);
        let _mem = dev.alloc(4096).unwrap();
        let _pinned = dev.alloc_host(4096, true).unwrap();
        let _: Seen = a.snapshot_state().unwrap();
    }
    sender.join().unwrap();
    let got = receiver.join().unwrap();
    println!("received before each launch: {in_flight:?} of {N}");
    assert!(
        in_flight.iter().any(|&r| r < N as usize),
        "at least one quiesce happened with messages in flight: {in_flight:?}"
    );

    assert!(
        relaunch_count() >= relaunches_before + 6,
        "`a` was quiesced and relaunched for every pinned allocation and state read"
    );
    // Exactly once.
    let mut xs: Vec<u32> = got.iter().map(|(_, r)| r.x).collect();
    xs.sort_unstable();
    assert_eq!(xs, (1..=N).collect::<Vec<_>>());
    // FIFO within each priority lane (one sender: send order is x).
    for lane in 0..4usize {
        let in_lane: Vec<u32> = got
            .iter()
            .filter(|(p, _)| (*p as usize * 4) >> 8 == lane)
            .map(|(_, r)| r.x)
            .collect();
        assert!(
            in_lane.windows(2).all(|w| w[0] < w[1]),
            "lane {lane} reordered across a quiesce"
        );
    }
    // Device state carried across every relaunch: each count handed out once.
    let mut seqs: Vec<u32> = got.iter().map(|(_, r)| r.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=N).collect::<Vec<_>>());
    assert_eq!(a.telemetry().messages_processed, N as u64);
    assert!(a.terminate().unwrap().undelivered.is_empty());
    for b in others {
        b.terminate().unwrap();
    }
}
