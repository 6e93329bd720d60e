//! A host read of a bound buffer, and of the state (`snapshot_state`), while the CUDA handler
//! never returns (CudaSim): each read is bounded (the engine's 10 s `BUFFER_SYNC_TIMEOUT`) and fails with a typed error, and the
//! kernel still terminates within its bound. Its own test binary: a stuck block stays in the
//! process until it is abandoned, and would time out other tests' launches meanwhile (the
//! residency rule parks every CudaSim kernel of the process). Prints `SKIP:` without a host C++
//! compiler (fails with `RESIDENT_REQUIRE_CUDASIM=1`).

use std::time::{Duration, Instant};

use resident::backend::{self, DeviceError, BUFFER_SYNC_TIMEOUT};
use resident::cuda::persistent::PersistentError;
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::UnifiedBuffer;

device_message! {
    /// A value; 0xDEAD never returns.
    pub struct Val { pub v: u32 }
}

const SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                       ResidentBuffers* b) {
    if (in->v == 0xDEADu) { for (;;) { __nanosleep(1000000u); } }
    b->x[0] = in->v;
    out->v = in->v;
    return true;
}
"#;

#[test]
fn a_read_while_the_handler_is_stuck_is_a_bounded_typed_error() {
    let d = match backend::open(Backend::CudaSim) {
        Ok(d) => d,
        Err(e) => {
            if std::env::var("RESIDENT_REQUIRE_CUDASIM").as_deref() == Ok("1") {
                panic!("RESIDENT_REQUIRE_CUDASIM=1 but CudaSim is unavailable: {e}");
            }
            println!("SKIP: bind_cudasim_stuck: CudaSim unavailable: {e}");
            return;
        }
    };
    let rt = Runtime::builder()
        .backend(Backend::CudaSim)
        .build()
        .unwrap();
    let bound = Duration::from_millis(500);
    let k = rt
        .launch(
            RingKernel::<Val, Val>::new("stuck-bound")
                .queue_size(64)
                .batch_size(32)
                .terminate_timeout(bound)
                .bind(
                    "x",
                    UnifiedBuffer::from_slice(&d, &[0u32; 4], BufferOptions::default()).unwrap(),
                )
                .cuda(CudaHandler::new(SRC)),
        )
        .unwrap();
    k.activate().unwrap();
    assert_eq!(k.call(Val { v: 5 }, Duration::from_secs(10)).unwrap().v, 5);
    assert_eq!(
        k.read_buffer::<u32>("x", Duration::from_secs(10)).unwrap()[0],
        5
    );
    k.send(Val { v: 0xDEAD }).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    match k.read_buffer::<u32>("x", Duration::from_secs(1)) {
        Err(BindError::Device { source, .. }) => match *source {
            DeviceError::Cuda(c)
                if matches!(c.downcast_ref(), Some(PersistentError::Timeout { .. })) => {}
            e => panic!("expected a timeout, got {e}"),
        },
        Err(e) => panic!("expected a device timeout, got {e}"),
        Ok(_) => panic!("a stuck batch cannot be read around"),
    }
    let waited = t0.elapsed();
    assert!(
        waited >= BUFFER_SYNC_TIMEOUT && waited < BUFFER_SYNC_TIMEOUT + Duration::from_secs(5),
        "{waited:?}"
    );
    // The state is read the same way (the kernel parked between two batches): bounded by the
    // same timeout, the same typed error.
    let t0 = Instant::now();
    match k.snapshot_state::<u32>() {
        Err(Error::Device {
            op: "snapshot_state",
            source,
            ..
        }) => match *source {
            DeviceError::Cuda(c)
                if matches!(c.downcast_ref(), Some(PersistentError::Timeout { .. })) => {}
            e => panic!("expected a timeout, got {e}"),
        },
        other => panic!("expected a device timeout, got {other:?}"),
    }
    let waited = t0.elapsed();
    assert!(
        waited >= BUFFER_SYNC_TIMEOUT && waited < BUFFER_SYNC_TIMEOUT + Duration::from_secs(5),
        "{waited:?}"
    );
    let t0 = Instant::now();
    let r = k.terminate().unwrap();
    assert!(r.failure.is_some(), "a stuck handler is a failure");
    assert!(
        t0.elapsed() < bound + Duration::from_secs(5),
        "terminate is bounded"
    );
}
