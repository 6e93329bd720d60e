//! Buffers bound to a ring kernel whose handler is CUDA C, on `Backend::CudaSim`: the handler
//! gets `ResidentBuffers*` (typed pointers, lengths, ids), the host reads and writes through
//! `KernelHandle::read_buffer` / `write_buffer` synchronized with the kernel's batches, and the
//! same source (bindings included) compiles with NVRTC for sm_90. Without a host C++ compiler
//! the CudaSim tests print `SKIP:` (and fail with `RESIDENT_REQUIRE_CUDASIM=1`); without NVRTC
//! the NVRTC test prints `SKIP:` (and fails with `RESIDENT_REQUIRE_NVRTC=1`). Nothing here says
//! anything about a GPU: none was available.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use resident::backend::{self, DeviceError};
use resident::cuda::persistent::PersistentError;
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::UnifiedBuffer;

const T: Duration = Duration::from_secs(20);

device_message! {
    /// An element index.
    pub struct Idx { pub index: u32 }
}

device_message! {
    /// What the handler did at `index`.
    pub struct Done { pub index: u32, pub ok: u32, pub value: f32 }
}

device_message! {
    /// Add `value` to element 0 of the buffer whose registry id is `buffer`.
    pub struct AddTo { pub buffer: u64, pub value: u32, pub _pad: u32 }
}

device_message! {
    /// A struct element type.
    pub struct Pair { pub sum: f64, pub count: u64 }
}

/// c[i] = 2 a[i] + 1, answering the value; an index past either buffer answers ok = 0.
const SCALE_SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                       ResidentBuffers* b) {
    unsigned int i = in->index;
    out->index = i;
    if (i >= b->a_len || i >= b->c_len) { out->ok = 0u; out->value = 0.0f; return true; }
    float v = 2.0f * b->a[i] + 1.0f;
    b->c[i] = v;
    out->ok = 1u;
    out->value = v;
    return true;
}
"#;

fn scale_cpu(ctx: &mut Context<()>, m: Idx) -> Option<Done> {
    let a = ctx.buffer::<f32>("a").ok()?;
    let mut c = ctx.buffer_mut::<f32>("c").ok()?;
    let i = m.index as usize;
    if i >= a.len() || i >= c.len() {
        return Some(Done {
            index: m.index,
            ok: 0,
            value: 0.0,
        });
    }
    let v = 2.0 * a[i] + 1.0;
    c[i] = v;
    Some(Done {
        index: m.index,
        ok: 1,
        value: v,
    })
}

/// Writes `index` into v[0]; index 999999 traps (a device fault).
const TRAP_SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                       ResidentBuffers* b) {
    if (in->index == 999999u) __trap();
    b->v[0] = in->index;
    out->index = in->index;
    out->ok = 1u;
    out->value = 0.0f;
    return true;
}
"#;

/// Every message adds one to every element of `v` (threads of a batch share it: atomics).
const BUMP_SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                       ResidentBuffers* b) {
    for (unsigned long long j = 0; j < b->v_len; ++j) atomicAdd(&b->v[j], 1u);
    out->index = in->index;
    out->ok = 1u;
    out->value = 0.0f;
    return true;
}
"#;

/// Adds to element 0 of the buffer named by id; an unknown id answers ok = 0 and touches
/// nothing.
const BY_ID_SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                       ResidentBuffers* b) {
    unsigned int* target = 0;
    if (in->buffer == b->x_id) target = b->x;
    else if (in->buffer == b->y_id) target = b->y;
    out->index = (unsigned int)in->buffer;
    if (target == 0) { out->ok = 0u; return true; }
    atomicAdd(&target[0], in->value);
    out->ok = 1u;
    return true;
}
"#;

/// Folds `Idx::index` into the pair at slot index % len (struct elements).
const PAIR_SRC: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                       ResidentBuffers* b) {
    Pair* p = &b->pairs[in->index % b->pairs_len];
    atomicAdd(&p->count, 1ull);
    out->index = in->index;
    out->ok = 1u;
    out->value = (float)b->pairs_len;
    return true;
}
"#;

/// The CudaSim device and runtime, or `None` after a visible `SKIP:` line.
fn cudasim(test: &str) -> Option<(Runtime, backend::DeviceHandle)> {
    match backend::open(Backend::CudaSim) {
        Ok(d) => Some((
            Runtime::builder()
                .backend(Backend::CudaSim)
                .build()
                .unwrap(),
            d,
        )),
        Err(e) => {
            if std::env::var("RESIDENT_REQUIRE_CUDASIM").as_deref() == Ok("1") {
                panic!("RESIDENT_REQUIRE_CUDASIM=1 but CudaSim is unavailable: {e}");
            }
            println!("SKIP: bind_cudasim::{test}: CudaSim unavailable: {e}");
            None
        }
    }
}

fn buf<T: bytemuck::Pod + Send>(d: &backend::DeviceHandle, v: &[T]) -> UnifiedBuffer<T> {
    UnifiedBuffer::from_slice(d, v, BufferOptions::default()).unwrap()
}

fn scale_kernel(
    id: &str,
    d: &backend::DeviceHandle,
    a: &[f32],
    c_len: usize,
) -> RingKernel<Idx, Done> {
    RingKernel::<Idx, Done>::new(id)
        .queue_size(256)
        .batch_size(32)
        .bind("a", buf(d, a))
        .bind("c", buf(d, &vec![0.0f32; c_len]))
        .handler(scale_cpu)
        .cuda(CudaHandler::new(SCALE_SRC))
}

#[test]
fn cuda_handler_writes_a_bound_buffer_like_the_cpu_closure() {
    let Some((rt, d)) = cudasim("cuda_handler_writes_a_bound_buffer_like_the_cpu_closure") else {
        return;
    };
    let a: Vec<f32> = (0..100).map(|i| i as f32 * 0.5 - 7.0).collect();
    let cpu_rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let cpu_d = backend::open(Backend::Cpu).unwrap();
    let mut results = Vec::new();
    for (rt, d) in [(&cpu_rt, &cpu_d), (&rt, &d)] {
        let k = rt.launch(scale_kernel("scale", d, &a, 80)).unwrap();
        k.activate().unwrap();
        // Indices past `c` (80..100) answer ok = 0 and write nothing.
        let answers: Vec<Done> = (0..100u32)
            .map(|i| k.call(Idx { index: i }, T).unwrap())
            .collect();
        let c = k.read_buffer::<f32>("c", T).unwrap().to_vec();
        let a_back = k.read_buffer::<f32>("a", T).unwrap().to_vec();
        assert_eq!(a_back, a, "the handler only read `a`");
        k.terminate().unwrap();
        results.push((answers, c));
    }
    let (cpu, sim) = (&results[0], &results[1]);
    assert_eq!(sim.1, cpu.1, "CudaSim's buffer equals the CPU closure's");
    for (x, y) in sim.0.iter().zip(&cpu.0) {
        assert_eq!((x.index, x.ok, x.value), (y.index, y.ok, y.value));
    }
    let want: Vec<f32> = a[..80].iter().map(|x| 2.0 * x + 1.0).collect();
    assert_eq!(sim.1, want);
    assert!(sim.0[80..].iter().all(|r| r.ok == 0));
}

#[test]
fn host_writes_are_seen_by_the_next_messages() {
    let Some((rt, d)) = cudasim("host_writes_are_seen_by_the_next_messages") else {
        return;
    };
    let k = rt
        .launch(scale_kernel("scale-write", &d, &[1.0; 16], 16))
        .unwrap();
    k.activate().unwrap();
    assert_eq!(k.call(Idx { index: 3 }, T).unwrap().value, 3.0);
    {
        let mut g = k.write_buffer::<f32>("a", T).unwrap();
        assert_eq!(
            &g[..],
            &[1.0; 16],
            "the guard starts as the device's values"
        );
        for (i, x) in g.iter_mut().enumerate() {
            *x = i as f32 * 10.0;
        }
        g.commit().unwrap();
    }
    for i in 0..16u32 {
        let r = k.call(Idx { index: i }, T).unwrap();
        assert_eq!(r.value, 2.0 * (i as f32 * 10.0) + 1.0, "index {i}");
    }
    let c = k.read_buffer::<f32>("c", T).unwrap().to_vec();
    assert_eq!(
        c,
        (0..16).map(|i| 20.0 * i as f32 + 1.0).collect::<Vec<_>>()
    );
    // A write guard dropped without commit still stores (errors are only traced).
    k.write_buffer::<f32>("a", T).unwrap()[5] = -1.0;
    assert_eq!(k.call(Idx { index: 5 }, T).unwrap().value, -1.0);
    k.terminate().unwrap();
    // After the kernel ended a read returns its last values (never hangs).
    let t0 = Instant::now();
    let c = k.read_buffer::<f32>("c", T).unwrap();
    assert_eq!(c[5], -1.0);
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn host_reads_race_a_stream_of_increments_and_are_never_torn() {
    let Some((rt, d)) = cudasim("host_reads_race_a_stream_of_increments_and_are_never_torn") else {
        return;
    };
    const N: u32 = 5000;
    const LEN: usize = 256;
    let k = rt
        .launch(
            RingKernel::<Idx, Done>::new("bump")
                .queue_size(1024)
                .batch_size(64)
                .bind("v", buf(&d, &vec![0u32; LEN]))
                .cuda(CudaHandler::new(BUMP_SRC)),
        )
        .unwrap();
    k.activate().unwrap();
    let relaunches_before = resident::cuda::persistent::sim::relaunch_count();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let k = k.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut reads, mut last, mut distinct) = (0u32, 0u32, 0u32);
            while !stop.load(Ordering::Acquire) {
                let v = k.read_buffer::<u32>("v", T).unwrap();
                let first = v[0];
                assert!(
                    v.iter().all(|&x| x == first),
                    "a torn snapshot: element 0 is {first}, others differ: {:?}",
                    v.iter()
                        .filter(|&&x| x != first)
                        .take(4)
                        .collect::<Vec<_>>()
                );
                assert!(first >= last && first <= N, "{last} then {first}");
                if first != last {
                    distinct += 1;
                }
                last = first;
                reads += 1;
                drop(v);
                // Back to back: the engine lets the kernel run between two parks.
            }
            (reads, distinct)
        })
    };
    let sender = {
        let k = k.clone();
        std::thread::spawn(move || {
            for i in 0..N {
                // Reads park the kernel: a full mailbox is waited out, never skipped.
                let mut tries = 0;
                while let Err(e) = k.send(Idx { index: i }) {
                    tries += 1;
                    assert!(tries < 60, "send {i}: {e}");
                }
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut got = 0;
    while got < N {
        assert!(Instant::now() < deadline, "only {got} of {N} answers");
        if k.receive(T).is_ok() {
            got += 1;
        }
    }
    sender.join().unwrap();
    stop.store(true, Ordering::Release);
    let (reads, distinct) = reader.join().unwrap();
    // Every read parked the block and relaunched it (that is the synchronization).
    let relaunches = resident::cuda::persistent::sim::relaunch_count() - relaunches_before;
    // (The last read's relaunch may not have been counted yet.)
    assert!(
        relaunches + 1 >= reads as u64,
        "{reads} reads but only {relaunches} relaunches"
    );
    let v = k.read_buffer::<u32>("v", T).unwrap().to_vec();
    assert!(
        v.iter().all(|&x| x == N),
        "every message added one everywhere"
    );
    println!("{reads} host reads raced {N} messages, {distinct} distinct values seen");
    assert!(reads > 0);
    k.terminate().unwrap();
}

#[test]
fn reads_after_a_device_fault_return_the_last_values_without_hanging() {
    // A fault loses the context for the whole process (as on a GPU): alone, in its own.
    if !resident::cuda::sim::fault_test_in_own_process(
        "reads_after_a_device_fault_return_the_last_values_without_hanging",
    ) {
        return;
    }
    let Some((rt, d)) =
        cudasim("reads_after_a_device_fault_return_the_last_values_without_hanging")
    else {
        return;
    };
    let k = rt
        .launch(
            RingKernel::<Idx, Done>::new("trap-bound")
                .queue_size(64)
                .bind("v", buf(&d, &[0u32; 4]))
                .cuda(CudaHandler::new(TRAP_SRC)),
        )
        .unwrap();
    k.activate().unwrap();
    assert_eq!(k.call(Idx { index: 17 }, T).unwrap().ok, 1);
    k.send(Idx { index: 999_999 }).unwrap();
    let deadline = Instant::now() + T;
    while !matches!(k.state(), KernelState::Failed { .. }) {
        assert!(Instant::now() < deadline, "the fault is reported");
        std::thread::sleep(Duration::from_millis(10));
    }
    let t0 = Instant::now();
    match k.read_buffer::<u32>("v", T) {
        Ok(v) => assert_eq!(v[0], 17, "the last values before the faulting batch"),
        Err(BindError::Device { .. }) => {}
        Err(e) => panic!("expected the last values or a device error, got {e}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "no hang");
    let _ = k.terminate();
}

#[test]
fn a_message_names_a_buffer_by_id() {
    let Some((rt, d)) = cudasim("a_message_names_a_buffer_by_id") else {
        return;
    };
    let k = rt
        .launch(
            RingKernel::<AddTo, Done>::new("by-id")
                .queue_size(64)
                .bind("x", buf(&d, &[0u32; 2]))
                .bind("y", buf(&d, &[0u32; 3]))
                .cuda(CudaHandler::new(BY_ID_SRC)),
        )
        .unwrap();
    k.activate().unwrap();
    let (x, y) = (k.buffer_id("x").unwrap(), k.buffer_id("y").unwrap());
    assert_ne!(x, y);
    for (id, value) in [(x, 5), (y, 7), (x, 1)] {
        let r = k
            .call(
                AddTo {
                    buffer: id.0,
                    value,
                    _pad: 0,
                },
                T,
            )
            .unwrap();
        assert_eq!(r.ok, 1);
    }
    let unknown = x.0.max(y.0) + 1000;
    let r = k
        .call(
            AddTo {
                buffer: unknown,
                value: 1,
                _pad: 0,
            },
            T,
        )
        .unwrap();
    assert_eq!(r.ok, 0, "an id bound to no buffer of this kernel");
    assert_eq!(&*k.read_buffer::<u32>("x", T).unwrap(), &[6, 0]);
    assert_eq!(&*k.read_buffer::<u32>("y", T).unwrap(), &[7, 0, 0]);
    k.terminate().unwrap();
}

#[test]
fn struct_elements_and_typed_errors() {
    let Some((rt, d)) = cudasim("struct_elements_and_typed_errors") else {
        return;
    };
    let pairs = vec![Pair { sum: 0.0, count: 0 }; 4];
    let k = rt
        .launch(
            RingKernel::<Idx, Done>::new("pairs")
                .queue_size(64)
                .bind("pairs", buf(&d, &pairs))
                .cuda(CudaHandler::new(PAIR_SRC).buffer::<Pair>("pairs")),
        )
        .unwrap();
    k.activate().unwrap();
    for i in 0..10u32 {
        assert_eq!(k.call(Idx { index: i }, T).unwrap().value, 4.0);
    }
    let got: Vec<u64> = k
        .read_buffer::<Pair>("pairs", T)
        .unwrap()
        .iter()
        .map(|p| p.count)
        .collect();
    assert_eq!(got, vec![3, 3, 2, 2]);
    // Unknown name, wrong element type: typed, nothing touched.
    assert!(matches!(
        k.read_buffer::<Pair>("nope", T),
        Err(BindError::UnknownBuffer { .. })
    ));
    assert!(matches!(
        k.read_buffer::<u64>("pairs", T),
        Err(BindError::TypeMismatch { .. })
    ));
    assert!(matches!(
        k.buffer_id("nope"),
        Err(BindError::UnknownBuffer { .. })
    ));
    k.terminate().unwrap();

    let launch_err = |kernel: RingKernel<Idx, Done>| match rt.launch(kernel) {
        Err(Error::Device { source, .. }) => *source,
        Err(e) => panic!("expected a device error, got {e}"),
        Ok(_) => panic!("the launch must be refused"),
    };
    // A name that is not a C identifier.
    match launch_err(
        RingKernel::<Idx, Done>::new("bad-name")
            .bind("not-an-identifier", buf(&d, &[0u32; 2]))
            .cuda(CudaHandler::new(BUMP_SRC)),
    ) {
        DeviceError::Binding { name, .. } => assert_eq!(name, "not-an-identifier"),
        e => panic!("expected DeviceError::Binding, got {e}"),
    }
    // An array element type has no pointer type.
    match launch_err(
        RingKernel::<Idx, Done>::new("array-elem")
            .bind("v", buf(&d, &[[0u32; 4]; 2]))
            .cuda(CudaHandler::new(BUMP_SRC)),
    ) {
        DeviceError::Binding { name, reason } => {
            assert_eq!(name, "v");
            assert!(reason.contains("array"), "{reason}");
        }
        e => panic!("expected DeviceError::Binding, got {e}"),
    }
    // Declared buffers that differ from the bound ones.
    match launch_err(
        RingKernel::<Idx, Done>::new("declared-differs")
            .bind("v", buf(&d, &[0u32; 2]))
            .cuda(CudaHandler::new(BUMP_SRC).buffer::<f32>("v")),
    ) {
        DeviceError::Binding { reason, .. } => assert!(reason.contains("declares"), "{reason}"),
        e => panic!("expected DeviceError::Binding, got {e}"),
    }
    // A handler that uses a member no binding declares: the compiler's log names it.
    match launch_err(
        RingKernel::<Idx, Done>::new("missing-member")
            .bind("w", buf(&d, &[0u32; 2]))
            .cuda(CudaHandler::new(BUMP_SRC)),
    ) {
        DeviceError::Cuda(c)
            if matches!(c.downcast_ref(), Some(PersistentError::Compile { .. })) =>
        {
            let Some(PersistentError::Compile { log, .. }) = c.downcast_ref() else {
                unreachable!()
            };
            assert!(log.contains("v_len") || log.contains("v"), "{log}")
        }
        e => panic!("expected a compile error, got {e}"),
    }
}

// NVRTC is part of the `cuda` feature.
#[cfg(feature = "cuda")]
#[test]
fn handlers_with_bindings_compile_for_sm_90_with_nvrtc() {
    let handlers: Vec<(&str, CudaHandler<Idx, Done>)> = vec![
        (
            "scale",
            CudaHandler::new(SCALE_SRC)
                .buffer::<f32>("a")
                .buffer::<f32>("c"),
        ),
        ("bump", CudaHandler::new(BUMP_SRC).buffer::<u32>("v")),
        ("pairs", CudaHandler::new(PAIR_SRC).buffer::<Pair>("pairs")),
    ];
    for (name, h) in handlers {
        match h.sass_report(name, 256, "sm_90") {
            Ok(reports) => {
                let p = reports
                    .iter()
                    .find(|r| r.entry == "resident_persistent")
                    .expect("the persistent entry is compiled");
                assert!(p.registers > 0, "{p:?}");
            }
            Err(e)
                if matches!(&e, DeviceError::Cuda(c) if matches!(c.downcast_ref(), Some(PersistentError::NvrtcUnavailable(_))))
                    && std::env::var("RESIDENT_REQUIRE_NVRTC").as_deref() != Ok("1") =>
            {
                println!(
                    "SKIP: bind_cudasim::handlers_with_bindings_compile_for_sm_90_with_nvrtc: {e}"
                );
                return;
            }
            Err(e) => panic!("{name}: compile failed: {e}"),
        }
    }
    // Without the declarations the fifth argument is missing: a typed compile error.
    match CudaHandler::<Idx, Done>::new(SCALE_SRC).compile_ptx("undeclared", 64, "compute_90") {
        Err(DeviceError::Cuda(c))
            if matches!(c.downcast_ref(), Some(PersistentError::Compile { .. })) => {}
        Err(DeviceError::Cuda(c))
            if matches!(c.downcast_ref(), Some(PersistentError::NvrtcUnavailable(_))) => {}
        other => panic!("expected a compile error, got {other:?}"),
    }
}
