//! Bound buffers in a CUDA handler on a real GPU: the same script as `bind_cudasim.rs`'s
//! race and by-id tests, on `Backend::Cuda`. Without a GPU (driver and NVRTC) it prints `SKIP:`
//! and passes; with `RESIDENT_REQUIRE_GPU=1` a missing GPU is a failure. It has never run on a
//! GPU here (none was available): GPU behaviour of bound buffers is NOT verified by this repo's
//! CI.

use std::time::{Duration, Instant};

use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::UnifiedBuffer;

device_message! {
    /// Which buffer (registry id) to bump, and by how much.
    pub struct Bump { pub buffer: u64, pub value: u32, pub _pad: u32 }
}

device_message! {
    /// Whether the id named a bound buffer.
    pub struct Bumped { pub ok: u32 }
}

/// Adds `value` to every element of the buffer named by id (`x` or `y`).
const SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                       ResidentBuffers* b) {
    unsigned int* t = 0;
    unsigned long long n = 0;
    if (in->buffer == b->x_id) { t = b->x; n = b->x_len; }
    else if (in->buffer == b->y_id) { t = b->y; n = b->y_len; }
    out->ok = t != 0;
    for (unsigned long long i = 0; i < n; ++i) atomicAdd(&t[i], in->value);
    return true;
}
"#;

const T: Duration = Duration::from_secs(20);

fn gpu(test: &str) -> bool {
    let reason = match resident::cuda::unavailable_reason() {
        None if resident::cuda::nvrtc_present() => return true,
        None => "NVRTC not available".to_string(),
        Some(e) => e.to_string(),
    };
    if std::env::var("RESIDENT_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("{test}: RESIDENT_REQUIRE_GPU=1 but: {reason}");
    }
    println!("SKIP: no GPU: bind_gpu::{test}: {reason}");
    false
}

#[test]
fn bound_buffers_on_the_gpu_by_id_with_synchronized_reads() {
    if !gpu("bound_buffers_on_the_gpu_by_id_with_synchronized_reads") {
        return;
    }
    let rt = Runtime::builder().backend(Backend::Cuda).build().unwrap();
    let d = resident::backend::open(Backend::Cuda).unwrap();
    let o = BufferOptions::default();
    let k = rt
        .launch(
            RingKernel::<Bump, Bumped>::new("bind-gpu")
                .queue_size(1024)
                .batch_size(64)
                .bind(
                    "x",
                    UnifiedBuffer::from_slice(&d, &[0u32; 1000], o).unwrap(),
                )
                .bind("y", UnifiedBuffer::from_slice(&d, &[5u32; 3], o).unwrap())
                .cuda(CudaHandler::new(SRC)),
        )
        .unwrap();
    k.activate().unwrap();
    let (x, y) = (k.buffer_id("x").unwrap(), k.buffer_id("y").unwrap());
    let n = 2000u32;
    for _ in 0..n {
        k.send(Bump {
            buffer: x.0,
            value: 1,
            _pad: 0,
        })
        .unwrap();
    }
    let mut last = 0;
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while got < n {
        assert!(Instant::now() < deadline);
        got += k.try_receive().unwrap().is_some() as u32;
        let v = k.read_buffer::<u32>("x", T).unwrap();
        assert!(v.iter().all(|&e| e == v[0]), "a torn snapshot");
        assert!(v[0] >= last);
        last = v[0];
    }
    assert!(k
        .read_buffer::<u32>("x", T)
        .unwrap()
        .iter()
        .all(|&e| e == n));
    assert_eq!(
        k.call(
            Bump {
                buffer: y.0,
                value: 2,
                _pad: 0
            },
            T
        )
        .unwrap()
        .ok,
        1
    );
    assert_eq!(&*k.read_buffer::<u32>("y", T).unwrap(), &[7, 7, 7]);
    {
        let mut w = k.write_buffer::<u32>("y", T).unwrap();
        w.copy_from_slice(&[100, 200, 300]);
        w.commit().unwrap();
    }
    k.call(
        Bump {
            buffer: y.0,
            value: 1,
            _pad: 0,
        },
        T,
    )
    .unwrap();
    assert_eq!(&*k.read_buffer::<u32>("y", T).unwrap(), &[101, 201, 301]);
    k.terminate().unwrap();
}
