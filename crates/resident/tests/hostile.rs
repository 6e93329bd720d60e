//! Hostile input the way a user hits it: allocations larger than memory, duplicate ids with a
//! device kernel, handlers given before state, non-`Pod` messages (a compile error, see the
//! `compile_fail` doc test on `resident_ring::Message`). None of these may panic or abort.

use std::time::Duration;

use resident::backend::{self, Backend};
use resident::memory::{BufferOptions, MemoryError, MemoryPool, PoolKind, UnifiedBuffer};
use resident::prelude::*;

#[test]
fn a_queue_larger_than_memory_is_a_typed_error() {
    let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    // 2^30 slots of 4 KiB per lane: 4 TiB, far beyond this machine.
    let e = rt
        .launch(
            RingKernel::<[u8; 4096], u32>::new("huge")
                .queue_size(1 << 30)
                .handler(|_: &mut Context<()>, _m: [u8; 4096]| Some(1)),
        )
        .unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    // Beyond the documented range: a configuration error, not an allocation attempt.
    let e = rt
        .launch(
            RingKernel::<u32, u32>::new("too-many")
                .queue_size((1 << 30) + 1)
                .handler(|_: &mut Context<()>, m: u32| Some(m)),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    // The runtime is fine afterwards, and the id was never taken.
    let h = rt
        .launch(RingKernel::<u32, u32>::new("huge").handler(|_: &mut Context<()>, m: u32| Some(m)))
        .unwrap();
    h.activate().unwrap();
    assert_eq!(h.call(3, Duration::from_secs(10)).unwrap(), 3);
}

#[test]
fn pool_and_buffer_allocations_larger_than_memory_are_typed_errors() {
    let d = backend::open(Backend::Cpu).unwrap();
    let pool = MemoryPool::new(&d, PoolKind::Device, None);
    let e = pool
        .acquire(1 << 40)
        .err()
        .expect("1 TiB cannot be allocated here");
    assert!(matches!(e, MemoryError::AllocFailed { .. }), "{e}");
    let mut b = UnifiedBuffer::<f32>::new(&d, 1 << 40, BufferOptions::default()).unwrap();
    let e = b.host_mut().err().expect("4 TiB cannot be allocated here");
    assert!(matches!(e, MemoryError::AllocFailed { .. }), "{e}");
    // Still usable for a size that fits.
    let ok = pool.acquire(1 << 20).unwrap();
    drop(ok);
}

#[cfg(feature = "cudasim")]
#[test]
fn a_duplicate_id_leaves_no_device_kernel_running() {
    device_message! { pub struct N { pub v: u32 } }
    let rt = match Runtime::builder().backend(Backend::CudaSim).build() {
        Ok(rt) => rt,
        Err(e) => {
            println!("SKIP: a_duplicate_id_leaves_no_device_kernel_running: CudaSim: {e}");
            return;
        }
    };
    let kernel = |id: &str| {
        RingKernel::<N, N>::new(id)
            .handler(|_: &mut Context<()>, m: N| Some(m))
            .cuda(CudaHandler::new(
                "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) { *out = *in; return true; }",
            ))
    };
    let h = rt.launch(kernel("dup")).unwrap();
    let threads = || {
        std::fs::read_dir("/proc/self/task")
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let before = threads();
    for _ in 0..5 {
        let e = rt.launch(kernel("dup")).unwrap_err();
        assert!(matches!(e, Error::DuplicateKernel { .. }), "{e}");
    }
    assert_eq!(
        threads(),
        before,
        "a refused duplicate starts no pump or device thread"
    );
    h.activate().unwrap();
    assert_eq!(h.call(N { v: 7 }, Duration::from_secs(10)).unwrap().v, 7);
}

#[test]
fn handler_before_state_is_kept_not_discarded() {
    let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let h = rt
        .launch(
            RingKernel::<u32, u32>::new("order")
                .handler(|_: &mut Context<()>, m: u32| Some(m + 1))
                .state(42u64),
        )
        .unwrap();
    h.activate().unwrap();
    assert_eq!(h.call(1, Duration::from_secs(10)).unwrap(), 2);
    // And the usual order, where the handler sees the state.
    let h = rt
        .launch(RingKernel::<u32, u64>::new("order2").state(40u64).handler(
            |ctx: &mut Context<u64>, m: u32| {
                *ctx.state_mut() += m as u64;
                Some(*ctx.state())
            },
        ))
        .unwrap();
    h.activate().unwrap();
    assert_eq!(h.call(2, Duration::from_secs(10)).unwrap(), 42);
}

#[test]
fn outputs_are_visible_while_a_long_batch_is_still_running() {
    let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let h = rt
        .launch(
            RingKernel::<u32, u32>::new("long-batch")
                .batch_size(64)
                .handler(|_: &mut Context<()>, m: u32| {
                    if m == 1 {
                        std::thread::sleep(Duration::from_millis(400));
                    }
                    Some(m)
                }),
        )
        .unwrap();
    h.send(0).unwrap();
    h.send(1).unwrap();
    h.activate().unwrap();
    // Message 0's output is there long before message 1's handler (same batch) returns.
    let start = std::time::Instant::now();
    assert_eq!(h.receive(Duration::from_secs(10)).unwrap(), 0);
    assert!(
        start.elapsed() < Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(h.receive(Duration::from_secs(10)).unwrap(), 1);
}
