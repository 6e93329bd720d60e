//! Device-side forwarding on CudaSim with its speed model on (`resident_engine_cuda::sim::driver`,
//! notes 3.): the host pauses that race the kernels are stretched 100 times, about as much as
//! CudaSim is slower than a GPU, so a race that an H100 lost is lost here too. There
//! (2026-11-27, `bench/results/gpu-h100-2026-11-27`), a producer launched before its target
//! relayed a whole 3000-message chain through the host (`on_device: 0`, 3 of 3 runs) while
//! CudaSim forwarded nearly all of it on the device: the producer offered the link only every
//! 20 ms, also while its target was not launched yet, and the GPU was done before the first
//! offer after the target appeared.
//!
//! Every test of this binary runs with the model on.

use std::time::{Duration, Instant};

use resident::prelude::*;
use resident_engine_cuda::sim::driver::SimContext;

device_message! {
    /// A message: its sequence number and a value the kernel transforms.
    #[derive(PartialEq, Eq)]
    pub struct Msg { pub seq: u32, pub value: u32 }
}

const CUDA_SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    out->seq = in->seq; out->value = in->value * 2u + 1u;
    return true;
}
"#;

/// CudaSim's speed model: host pauses that race the kernels, x100.
const DILATION: u32 = 100;
const T: Duration = Duration::from_secs(20);

fn expected(m: Msg) -> Msg {
    Msg {
        value: m.value.wrapping_mul(2).wrapping_add(1),
        ..m
    }
}

fn kernel(id: &str) -> RingKernel<Msg, Msg> {
    RingKernel::<Msg, Msg>::new(id)
        .queue_size(4096)
        .handler(|_: &mut Context<()>, m: Msg| Some(expected(m)))
        .cuda(CudaHandler::new(CUDA_SRC))
}

/// A CudaSim runtime with the speed model on, or `None` (after a `SKIP:` line) where CudaSim
/// cannot run and `RESIDENT_REQUIRE_CUDASIM` is not `1`.
fn rt(case: &str) -> Option<Runtime> {
    SimContext::get().set_host_dilation(DILATION);
    match Runtime::builder()
        .backend(Backend::CudaSim)
        .terminate_timeout(Duration::from_secs(30))
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) if std::env::var("RESIDENT_REQUIRE_CUDASIM").as_deref() == Ok("1") => {
            panic!("RESIDENT_REQUIRE_CUDASIM=1 but CudaSim is unavailable: {e}")
        }
        Err(e) => {
            println!("SKIP: {case}: CudaSim unavailable: {e}");
            None
        }
    }
}

/// Launches producer and target in the order asked, activates both, then sends `n` messages
/// through the chain as fast as it takes them. Both kernels exist before the first send, so
/// the link is asked for before the producer's first outputs: nearly every message on the
/// device, at any speed.
fn chain_all_on_device(case: &str, target_first: bool) {
    let Some(rt) = rt(case) else { return };
    let (pid, cid) = (format!("{case}-p"), format!("{case}-c"));
    let launch_c = || rt.launch(kernel(&cid)).unwrap();
    let early = target_first.then(launch_c);
    let p = rt.launch(kernel(&pid).forward_to(cid.clone())).unwrap();
    let c = early.unwrap_or_else(launch_c);
    p.activate().unwrap();
    c.activate().unwrap();
    let n = 1000u32;
    let start = Instant::now();
    let mut got = Vec::with_capacity(n as usize);
    for i in 0..n {
        p.send(Msg { seq: i, value: i }).unwrap();
        while let Ok(Some(o)) = c.try_receive() {
            got.push(o);
        }
    }
    while got.len() < n as usize {
        got.push(c.receive(T).unwrap());
    }
    let took = start.elapsed();
    for (i, m) in got.iter().enumerate() {
        let i = i as u32;
        assert_eq!(*m, expected(expected(Msg { seq: i, value: i })), "in order");
    }
    let f = p.forwarding();
    // The pump asks for the link in its first round after the target is registered; inputs
    // it pushed in that same round (the sends race the producer's activation) may be handled
    // before the kernel adopts the link and go via the host. Nearly all must go on the device;
    // the race measured on the H100 sent every one via the host.
    assert_eq!(f.on_device + f.via_host, n as u64, "{f:?}");
    assert!(
        f.via_host <= n as u64 / 10,
        "{case}: both kernels ran before the first send, so the link must carry nearly every \
         message: {f:?} ({n} messages in {took:?}, host pauses x{DILATION})"
    );
    assert_eq!(c.telemetry().forwarded_on_device, f.on_device);
    let (rp, rc) = (p.terminate().unwrap(), c.terminate().unwrap());
    assert_eq!(rp.returned() + rc.returned(), 0, "{rp:?} {rc:?}");
}

/// The order of the chain case of the conformance suite (and of the failing H100 run): the
/// producer first, its target after it.
#[test]
fn a_producer_launched_before_its_target_forwards_everything_on_the_device() {
    chain_all_on_device("fwd-sim-late-target", false);
}

#[test]
fn a_producer_launched_after_its_target_forwards_everything_on_the_device() {
    chain_all_on_device("fwd-sim-early-target", true);
}
