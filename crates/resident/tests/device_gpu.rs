//! A ring kernel defined once runs on the CPU backend (its Rust handler) and, with its CUDA
//! handler, as a true persistent kernel on the GPU, through the same `KernelHandle` calls, with
//! the same results. Device faults: a trapping or out-of-bounds handler fails every kernel on
//! the device promptly; fresh kernels launch afterwards where the driver gives a fresh context,
//! and are refused promptly as a lost device where it does not (the driver measured on an H100).
//!
//! The same script also runs on `Backend::CudaSim` (the CUDA source on host threads), always.
//! Without a GPU (driver and NVRTC) the GPU parts print `SKIP:` and pass; with
//! `RESIDENT_REQUIRE_GPU=1` a missing GPU is a failure instead.

use std::time::{Duration, Instant};

use resident::prelude::*;

device_message! {
    /// A price tick.
    pub struct Tick { pub price: f32, pub qty: u32 }
}

device_message! {
    /// The handler's answer: the notional, and the kernel's running count of handled ticks.
    pub struct Notional { pub value: f32, pub seq: u32 }
}

device_message! {
    /// Device state that persists across messages and batches.
    pub struct Handled { pub n: u32 }
}

/// The CUDA handler: the same arithmetic as `rust_handler`; `seq` comes from device state
/// (atomic: the threads of a batch share it). `qty` 0xDEAD traps, 0xBEEF reads an unmapped
/// address: both are device faults.
const SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    if (in->qty == 0xDEADu) __trap();
    if (in->qty == 0xBEEFu) {
        volatile const unsigned int* bad = (volatile const unsigned int*)0x10ull;
        out->seq = *bad;
        return true;
    }
    out->value = in->price * (float)in->qty;
    out->seq = atomicAdd(&s->n, 1u) + 1u;
    return true;
}
"#;

const T: Duration = Duration::from_secs(10);

/// A device fault poisons the whole process's context on that device: the tests of this file
/// take turns.
static GPU_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    GPU_TURN.lock().unwrap_or_else(|p| p.into_inner())
}

fn gpu(test: &str) -> bool {
    let reason = match resident::cuda::unavailable_reason() {
        None if resident::cuda::nvrtc_present() => return true,
        None => "NVRTC not available".to_string(),
        Some(e) => e.to_string(),
    };
    if std::env::var("RESIDENT_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("{test}: RESIDENT_REQUIRE_GPU=1 but: {reason}");
    }
    eprintln!("SKIP: no GPU: {test}: {reason}");
    false
}

/// The one definition: a Rust handler for the CPU backend and a CUDA handler for the GPU.
fn define(id: &str) -> RingKernel<Tick, Notional, u32> {
    RingKernel::<Tick, Notional>::new(id)
        .queue_size(2048)
        .priority_lanes(4)
        .batch_size(64)
        .state(0u32)
        .handler(|ctx: &mut Context<u32>, t: Tick| {
            *ctx.state_mut() += 1;
            Some(Notional {
                value: t.price * t.qty as f32,
                seq: *ctx.state(),
            })
        })
        .cuda(CudaHandler::new(SRC).state(Handled { n: 0 }))
}

/// Everything a user does with a handle; returns the values in the order they came back.
fn exercise(rt: &Runtime, id: &str) -> Vec<f32> {
    let h = rt.launch(define(id)).unwrap();
    let mut values = Vec::new();
    let mut seqs = Vec::new();
    // Queued before activation: priority decides the order (4 lanes: p * 4 >> 8).
    for (qty, p) in [10u8, 250, 128, 251, 0, 200, 60, 255]
        .iter()
        .zip(1u32..)
        .map(|(p, q)| (q, *p))
    {
        h.send_with_priority(Tick { price: 1.0, qty }, p).unwrap();
    }
    h.activate().unwrap();
    for _ in 0..8 {
        let n = h.receive(T).unwrap();
        values.push(n.value);
        seqs.push(n.seq);
    }
    assert_eq!(values, vec![2.0, 4.0, 6.0, 8.0, 3.0, 1.0, 5.0, 7.0]);
    // Concurrent callers, replies matched by correlation id.
    let callers: Vec<_> = (0..4u32)
        .map(|t| {
            let h = h.clone();
            std::thread::spawn(move || {
                (1..=250u32)
                    .map(|i| {
                        let qty = t * 1000 + i;
                        let r = h.call(Tick { price: 0.5, qty }, T).unwrap();
                        assert_eq!(r.value, 0.5 * qty as f32);
                        r.seq
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for c in callers {
        seqs.extend(c.join().unwrap());
    }
    // A batch in, a batch out, in order.
    let ticks: Vec<Tick> = (1..=1000u32).map(|qty| Tick { price: 2.0, qty }).collect();
    let mut sent = 0;
    while sent < ticks.len() {
        sent += h.send_batch(&ticks[sent..]).unwrap();
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + T;
    while got.len() < 1000 && Instant::now() < deadline {
        let want = 1000 - got.len();
        if h.receive_batch(&mut got, want).unwrap() == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    assert_eq!(got.len(), 1000);
    for (i, n) in got.iter().enumerate() {
        assert_eq!(n.value, 2.0 * (i + 1) as f32, "outputs keep input order");
        values.push(n.value);
        seqs.push(n.seq);
    }
    // The state persisted across every message and batch: each count handed out once.
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=2008u32).collect::<Vec<_>>());
    let t = h.telemetry();
    assert_eq!(t.messages_processed, 2008);
    assert!(t.batches >= 1);
    let r = h.terminate().unwrap();
    assert!(r.undelivered.is_empty());
    assert_eq!(h.state(), KernelState::Terminated);
    values
}

#[test]
fn one_definition_runs_on_the_cpu_and_as_a_persistent_gpu_kernel() {
    let _turn = turn();
    let cpu = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    assert_eq!(cpu.backend(), Backend::Cpu);
    let on_cpu = exercise(&cpu, "notional-cpu");
    // The CUDA handler's source, run by CudaSim: same results, same order.
    let sim = Runtime::builder()
        .backend(Backend::CudaSim)
        .enable_telemetry(true)
        .build()
        .unwrap();
    assert_eq!(sim.backend(), Backend::CudaSim);
    let on_sim = exercise(&sim, "notional-sim");
    assert_eq!(on_cpu, on_sim, "CudaSim: same results, same order");
    if !gpu("one_definition_runs_on_the_cpu_and_as_a_persistent_gpu_kernel") {
        return;
    }
    let rt = Runtime::builder()
        .backend(Backend::Cuda)
        .enable_telemetry(true)
        .build()
        .unwrap();
    assert_eq!(rt.backend(), Backend::Cuda);
    let on_gpu = exercise(&rt, "notional-gpu");
    assert_eq!(on_cpu, on_gpu, "same results, same order");
}

fn fault_round(rt: &Runtime, round: &str, poison: u32) -> bool {
    let a = rt.launch(define(&format!("{round}-a"))).unwrap();
    let b = rt.launch(define(&format!("{round}-b"))).unwrap();
    a.activate().unwrap();
    b.activate().unwrap();
    assert_eq!(b.call(Tick { price: 1.0, qty: 3 }, T).unwrap().value, 3.0);
    let start = Instant::now();
    let e = a
        .call(
            Tick {
                price: 1.0,
                qty: poison,
            },
            Duration::from_secs(60),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::KernelFailed { .. }),
        "{round}: the caller gets the failure: {e}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{round}: the waiting caller is not left hanging ({:?})",
        start.elapsed()
    );
    assert!(matches!(a.state(), KernelState::Failed(_)));
    assert!(a.send(Tick { price: 1.0, qty: 1 }).is_err());
    // The fault poisoned the device's context: the other kernel on it fails too, promptly.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !matches!(b.state(), KernelState::Failed(_)) {
        assert!(
            Instant::now() < deadline,
            "{round}: b did not fail: {:?}",
            b.state()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = a.terminate();
    let _ = b.terminate();
    after_fault(rt, round)
}

/// Whether `e` says the device was lost to a fault (the GPU's `DeviceLost`, CudaSim's
/// `ContextLost`), as opposed to any other failure.
fn is_lost(e: &Error) -> bool {
    let d = format!("{e:?}");
    matches!(e, Error::Device { .. }) && (d.contains("DeviceLost") || d.contains("ContextLost"))
}

/// Nothing from before the fault is alive: a fresh kernel gets a fresh context where the
/// driver allows one (it launches and answers), and where it does not (the driver measured on
/// an H100: a reset leaves the fault in place for the process) the launch is refused promptly
/// as a lost device, again on every later try, while the CPU engine of the same process still
/// runs. Returns whether the device came back.
fn after_fault(rt: &Runtime, round: &str) -> bool {
    let start = Instant::now();
    match rt.launch(define(&format!("{round}-c"))) {
        Ok(c) => {
            c.activate().unwrap();
            assert_eq!(c.call(Tick { price: 3.0, qty: 2 }, T).unwrap().value, 6.0);
            c.terminate().unwrap();
            true
        }
        Err(e) => {
            assert!(is_lost(&e), "{round}: a launch after the fault: {e:?}");
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{round}: refused promptly ({:?})",
                start.elapsed()
            );
            eprintln!("{round}: the device stays lost to this process: {e}");
            let again = Instant::now();
            let e2 = rt.launch(define(&format!("{round}-d"))).unwrap_err();
            assert!(is_lost(&e2), "{round}: again: {e2:?}");
            assert!(again.elapsed() < Duration::from_secs(1), "{round}: at once");
            let cpu = Runtime::builder().backend(Backend::Cpu).build().unwrap();
            let k = cpu.launch(define(&format!("{round}-cpu"))).unwrap();
            k.activate().unwrap();
            assert_eq!(k.call(Tick { price: 3.0, qty: 2 }, T).unwrap().value, 6.0);
            k.terminate().unwrap();
            false
        }
    }
}

#[test]
fn device_faults_fail_every_kernel_on_the_device_and_fresh_ones_launch_after() {
    let _turn = turn();
    if !gpu("device_faults_fail_every_kernel_on_the_device_and_fresh_ones_launch_after") {
        return;
    }
    let rt = Runtime::builder().backend(Backend::Cuda).build().unwrap();
    // The out-of-bounds round needs a device that came back from the trap.
    if fault_round(&rt, "trap", 0xDEAD) {
        fault_round(&rt, "oob", 0xBEEF);
    }
}

/// The same fault script on CudaSim's driver model, always: a trap is sticky for the whole
/// context (the other kernel fails too, typed, with its messages in its report), and once no
/// kernel of the lost context is left it is reset and fresh kernels launch and answer. The
/// out-of-bounds round is GPU-only: CudaSim's threads are the process's own, and a wild read
/// there is the process's fault, not a device's.
#[test]
fn device_faults_on_cudasim_are_sticky_for_the_context_and_fresh_kernels_launch_after() {
    let _turn = turn();
    let rt = Runtime::builder()
        .backend(Backend::CudaSim)
        .build()
        .unwrap();
    assert!(
        fault_round(&rt, "sim-trap", 0xDEAD),
        "CudaSim's default reset recovers"
    );
    assert!(fault_round(&rt, "sim-trap-again", 0xDEAD));
}

/// CudaSim with the driver measured on a GPU (an H100, driver 580): a context lost to a trap
/// stays lost after the reset. Every launch after the fault is refused promptly as a lost
/// device, the CPU engine still runs; once the model lets the reset recover again, fresh
/// kernels launch and answer.
#[test]
fn on_cudasim_with_the_measured_driver_a_lost_device_stays_lost_and_is_refused_promptly() {
    let _turn = turn();
    let ctx = resident_engine_cuda::sim::driver::SimContext::get();
    let before = ctx.set_reset_recovers(false);
    let rt = Runtime::builder()
        .backend(Backend::CudaSim)
        .build()
        .unwrap();
    let came_back = fault_round(&rt, "sim-never", 0xDEAD);
    ctx.set_reset_recovers(true);
    assert!(
        !came_back,
        "the measured driver does not give a fresh context"
    );
    assert!(
        after_fault(&rt, "sim-recovers"),
        "the default model recovers"
    );
    ctx.set_reset_recovers(before);
}
