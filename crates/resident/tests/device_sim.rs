//! Ring kernels with a CUDA handler on `Backend::CudaSim`, driven through the same
//! `KernelHandle` API: the persistent CUDA template and the handler's CUDA C source, compiled
//! by the host C++ compiler against our shim and run as one block of OS threads over the same
//! queue memory and control block as on a GPU. This runs the kernel source and the host side of
//! the device protocol (pump, lanes, output ring, correlation, faults, terminate accounting);
//! it says nothing about GPU timing, which needs a GPU run (none was available).

use std::time::Duration;

use resident::backend::DeviceError;
use resident::cuda::persistent::PersistentError;
use resident::prelude::*;

device_message! {
    /// A price tick.
    pub struct Tick { pub price: f32, pub qty: u32 }
}

device_message! {
    /// The handler's answer.
    pub struct Notional { pub value: f32, pub seq: u32 }
}

/// `qty` 999999 traps (a device fault).
const SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    if (in->qty == 999999u) __trap();
    if (in->qty == 0) return false;
    out->value = in->price * (float)in->qty;
    out->seq = (unsigned int)env->message_id;
    return true;
}
"#;

const T: Duration = Duration::from_secs(10);

fn runtime() -> Runtime {
    Runtime::builder()
        .backend(Backend::CudaSim)
        .enable_telemetry(true)
        .build()
        .unwrap()
}

fn kernel(id: &str) -> RingKernel<Tick, Notional> {
    RingKernel::<Tick, Notional>::new(id)
        .queue_size(256)
        .cuda(CudaHandler::new(SRC))
}

#[test]
fn send_receive_and_call_through_the_device_protocol() {
    let rt = runtime();
    let h = rt.launch(kernel("notional")).unwrap();
    h.activate().unwrap();
    let id = h.send(Tick { price: 2.5, qty: 4 }).unwrap();
    let (env, out) = h.receive_envelope(T).unwrap();
    assert_eq!(out.value, 10.0);
    assert_eq!(env.correlation_id, id);
    assert_eq!(out.seq, id as u32, "the device saw the request's envelope");
    // Many concurrent callers, replies matched by correlation id.
    let callers: Vec<_> = (0..4u32)
        .map(|t| {
            let h = h.clone();
            std::thread::spawn(move || {
                for i in 1..=500u32 {
                    let qty = t * 1000 + i;
                    let r = h.call(Tick { price: 1.0, qty }, T).unwrap();
                    assert_eq!(r.value, qty as f32);
                }
            })
        })
        .collect();
    for c in callers {
        c.join().unwrap();
    }
    assert_eq!(h.try_receive().unwrap().map(|n| n.value), None);
    let t = h.telemetry();
    assert_eq!(
        t.messages_processed, 2001,
        "processed comes from the device's own counter"
    );
    assert!(t.batches >= 1);
    assert_eq!(t.latency.count, 2001);
}

#[test]
fn handler_without_output_and_priority_order() {
    let rt = runtime();
    let h = rt.launch(kernel("prio").batch_size(32)).unwrap();
    // Queued before activation: the lanes decide the order.
    for (qty, p) in [(1u32, 10u8), (2, 250), (0, 250), (3, 128), (4, 251)] {
        h.send_with_priority(Tick { price: 1.0, qty }, p).unwrap();
    }
    h.activate().unwrap();
    let got: Vec<f32> = (0..4).map(|_| h.receive(T).unwrap().value).collect();
    assert_eq!(got, vec![2.0, 4.0, 3.0, 1.0]);
    assert!(
        h.receive(Duration::from_millis(50)).is_err(),
        "qty 0 produced no output"
    );
}

#[test]
fn deactivate_and_terminate_account_for_everything() {
    let rt = runtime();
    let h = rt.launch(kernel("acct")).unwrap();
    assert_eq!(rt.backend(), Backend::CudaSim);
    h.activate().unwrap();
    h.send(Tick { price: 1.0, qty: 1 }).unwrap();
    assert_eq!(h.receive(T).unwrap().value, 1.0);
    h.deactivate().unwrap();
    for qty in 1..=20 {
        h.send(Tick { price: 1.0, qty }).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        h.telemetry().messages_processed,
        1,
        "inactive: nothing processed"
    );
    let r = h.terminate().unwrap();
    assert_eq!(r.undelivered.len(), 20, "every queued message comes back");
    assert_eq!(
        r.undelivered.iter().map(|(_, t)| t.qty).collect::<Vec<_>>(),
        (1..=20).collect::<Vec<_>>()
    );
    assert_eq!(h.state(), KernelState::Terminated);
}

#[test]
fn device_fault_fails_the_kernel_promptly_and_a_fresh_one_can_launch() {
    // A fault loses the context for the whole process (as on a GPU): alone, in its own.
    if !resident::cuda::sim::fault_test_in_own_process(
        "device_fault_fails_the_kernel_promptly_and_a_fresh_one_can_launch",
    ) {
        return;
    }
    let rt = runtime();
    let h = rt.launch(kernel("fault")).unwrap();
    h.activate().unwrap();
    let start = std::time::Instant::now();
    let e = h
        .call(
            Tick {
                price: 1.0,
                qty: 999_999,
            },
            Duration::from_secs(30),
        )
        .unwrap_err();
    assert!(
        matches!(&e, Error::KernelFailed { reason: reason @ Failure::Device(_), .. }
            if reason.to_string().contains("device")),
        "{e}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "the waiting caller is not left hanging"
    );
    assert!(matches!(h.state(), KernelState::Failed(_)));
    assert!(h.send(Tick { price: 1.0, qty: 1 }).is_err());
    // The block faulted before it marked that batch consumed: the poisoned request comes
    // back in the report rather than vanishing.
    let report = h.terminate().unwrap();
    assert!(
        report.undelivered.iter().any(|(_, t)| t.qty == 999_999),
        "{:?}",
        report.undelivered.len()
    );
    let h2 = rt.launch(kernel("fault")).unwrap();
    h2.activate().unwrap();
    assert_eq!(h2.call(Tick { price: 3.0, qty: 2 }, T).unwrap().value, 6.0);
}

#[test]
fn cuda_only_kernel_without_a_device_is_a_typed_error_and_cpu_handler_is_the_fallback() {
    let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let only_cuda = RingKernel::<Tick, Notional>::new("gpu-only").cuda(CudaHandler::new(SRC));
    let e = rt.launch(only_cuda).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    assert!(e.to_string().contains("only a CUDA handler"), "{e}");
    let both = RingKernel::<Tick, Notional>::new("both")
        .handler(|_: &mut Context<()>, t: Tick| {
            Some(Notional {
                value: t.price,
                seq: 0,
            })
        })
        .cuda(CudaHandler::new(SRC));
    let h = rt.launch(both).unwrap();
    h.activate().unwrap();
    assert_eq!(h.call(Tick { price: 7.0, qty: 1 }, T).unwrap().value, 7.0);
}

// NVRTC is part of the `cuda` feature.
#[cfg(feature = "cuda")]
#[test]
fn handler_compiles_in_the_persistent_template_with_nvrtc() {
    let handler = CudaHandler::<Tick, Notional>::new(SRC);
    match handler.compile_ptx("notional", 64, "compute_90") {
        Ok(ptx) => {
            assert!(
                ptx.contains("ld.acquire.sys"),
                "system-scope acquire on the queues"
            );
            assert!(ptx.contains(".entry resident_persistent"));
        }
        Err(e)
            if matches!(&e, DeviceError::Cuda(c) if matches!(c.downcast_ref(), Some(PersistentError::NvrtcUnavailable(_))))
                && std::env::var("RESIDENT_REQUIRE_NVRTC").as_deref() != Ok("1") =>
        {
            eprintln!("SKIP: NVRTC not available: {e}");
        }
        Err(e) => panic!("compile failed: {e}"),
    }
    let broken = CudaHandler::<Tick, Notional>::new("__device__ bool handle(ResidentState*, const ResidentIn*, ResidentOut*, const Envelope*) { return nope; }");
    match broken.compile_ptx("broken", 64, "compute_90") {
        Err(DeviceError::Cuda(c))
            if matches!(c.downcast_ref(), Some(PersistentError::Compile { .. })) =>
        {
            let Some(PersistentError::Compile { log, .. }) = c.downcast_ref() else {
                unreachable!()
            };
            assert!(log.contains("nope"), "the NVRTC log names the error: {log}")
        }
        Err(DeviceError::Cuda(c))
            if matches!(c.downcast_ref(), Some(PersistentError::NvrtcUnavailable(_))) => {}
        other => panic!("a broken handler must be a typed compile error: {other:?}"),
    }
}

// NVRTC is part of the `cuda` feature.
#[cfg(feature = "cuda")]
#[test]
fn handler_assembles_to_hopper_machine_code_with_nvrtc() {
    let handler = CudaHandler::<Tick, Notional>::new(SRC);
    match handler.sass_report("notional", 256, "sm_90") {
        Ok(reports) => {
            let persistent = reports
                .iter()
                .find(|r| r.entry == "resident_persistent")
                .expect("the persistent entry is compiled");
            assert!(persistent.registers > 0);
            assert_eq!(persistent.spill_store_bytes, 0, "{persistent:?}");
        }
        Err(e)
            if matches!(&e, DeviceError::Cuda(c) if matches!(c.downcast_ref(), Some(PersistentError::NvrtcUnavailable(_))))
                && std::env::var("RESIDENT_REQUIRE_NVRTC").as_deref() != Ok("1") =>
        {
            eprintln!("SKIP: NVRTC not available: {e}");
        }
        Err(e) => panic!("compile failed: {e}"),
    }
}

device_message! {
    /// Two counters a message bumps one after the other.
    pub struct Steps { pub a: u32, pub b: u32 }
}

/// Bumps `a`, sleeps 1 ms, bumps `b`: between two batches `a == b`, mid-batch `a > b`.
const STEPS_SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    atomicAdd(&s->a, 1u);
    __nanosleep(1000000);
    atomicAdd(&s->b, 1u);
    out->value = in->price;
    out->seq = (unsigned int)env->message_id;
    return true;
}
"#;

/// `snapshot_state` reads a CUDA handler's state with the kernel parked between two batches:
/// read over and over while a stream of batches runs, no read shows a batch half done, the
/// reads only grow, a wrong type is a typed error, and after terminate it is the final state.
#[test]
fn snapshot_state_reads_the_cuda_state_between_batches() {
    let rt = runtime();
    let k = rt
        .launch(
            RingKernel::<Tick, Notional>::new("steps")
                .queue_size(1024)
                .batch_size(32)
                .cuda(CudaHandler::new(STEPS_SRC).state(Steps { a: 0, b: 0 })),
        )
        .unwrap();
    let st = k.snapshot_state::<Steps>().unwrap();
    assert_eq!((st.a, st.b), (0, 0), "the initial state");
    match k.snapshot_state::<u32>() {
        Err(Error::InvalidConfig { reason, .. }) => {
            assert!(
                reason.contains("4-byte") && reason.contains("8 bytes"),
                "{reason}"
            )
        }
        other => panic!("expected InvalidConfig for a wrong-size type, got {other:?}"),
    }
    k.activate().unwrap();
    const N: u32 = 400;
    let reads = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut reads = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                let st = k.snapshot_state::<Steps>().unwrap();
                reads.push((st.a, st.b));
                if st.a == N || std::time::Instant::now() > deadline {
                    return reads;
                }
            }
        });
        for i in 0..N {
            k.send(Tick {
                price: i as f32,
                qty: 1,
            })
            .unwrap();
        }
        for _ in 0..N {
            k.receive(T).unwrap();
        }
        reader.join().unwrap()
    });
    assert!(reads.len() > 2, "reads while batches ran: {reads:?}");
    for w in reads.windows(2) {
        assert!(w[0].0 <= w[1].0, "the state only grows: {w:?}");
    }
    for &(a, b) in &reads {
        assert_eq!(a, b, "a read saw a batch half done ({} reads)", reads.len());
    }
    assert_eq!(*reads.last().unwrap(), (N, N));
    k.terminate().unwrap();
    let st = k.snapshot_state::<Steps>().unwrap();
    assert_eq!((st.a, st.b), (N, N), "the final state, after terminate");
}
