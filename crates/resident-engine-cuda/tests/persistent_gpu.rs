//! The real GPU path. On a machine without the CUDA driver it must fail with a typed error,
//! never a panic; with a GPU (and NVRTC) it runs a kernel end to end.

use std::time::Duration;

use resident_engine_cuda::persistent::{
    DeviceState, KernelSource, LaunchOptions, MessageDecl, PersistentError, PersistentKernel,
    QueueConfig,
};
use resident_ring::{Envelope, Slot};

fn source() -> KernelSource {
    KernelSource::new(
        "gpu_double",
        MessageDecl::of::<u64>("In64", "typedef struct { unsigned long long v; } In64;"),
        MessageDecl::of::<u64>("Out64", "typedef struct { unsigned long long v; } Out64;"),
        MessageDecl::of::<u64>("St", "typedef struct { unsigned long long n; } St;"),
        "__device__ bool handle(St* s, const In64* in, Out64* out, const Envelope* env) {\n\
         atomicAdd(&s->n, 1ull); out->v = in->v * 2ull; return (in->v % 3ull) != 0ull; }\n",
        64,
    )
}

/// The GPU tests of this file take turns: the residency test fills the device's budget.
static GPU_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The GPU's turn for `test`, or `None` (with a visible `SKIP:`) without a GPU; with
/// `RESIDENT_REQUIRE_GPU=1` a missing GPU fails the test instead.
fn gpu_turn(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    if !gpu_present() {
        if std::env::var("RESIDENT_REQUIRE_GPU").as_deref() == Ok("1") {
            panic!("{test}: RESIDENT_REQUIRE_GPU=1 but the CUDA driver or NVRTC is missing");
        }
        eprintln!("SKIP: CUDA driver or NVRTC not available: {test}");
        return None;
    }
    Some(GPU_TURN.lock().unwrap_or_else(|p| p.into_inner()))
}

fn opts(lanes: usize, capacity: usize) -> LaunchOptions {
    LaunchOptions {
        queues: QueueConfig {
            lanes,
            lane_capacity: capacity,
            out_capacity: capacity,
        },
        ..Default::default()
    }
}

fn gpu_present() -> bool {
    // Each only tries to dlopen its library.
    resident_cuda::driver_present() && resident_cuda::nvrtc_present()
}

/// The ring benchmark's half of this check (`bench_ring` without a driver) moved with the
/// benchmark to resident-bench (`tests/ring_gpu.rs`).
#[test]
fn without_a_driver_launch_is_a_typed_error() {
    if gpu_present() {
        eprintln!("SKIP: a CUDA driver is present; covered by persistent_kernel_round_trip");
        return;
    }
    let r = PersistentKernel::<u64, u64>::launch(&source(), &[0u8; 8], &opts(2, 256));
    assert!(
        matches!(
            r,
            Err(PersistentError::DriverUnavailable(_)) | Err(PersistentError::NvrtcUnavailable(_))
        ),
        "{:?}",
        r.err()
    );
}

#[test]
fn launch_rejects_mismatched_rust_types_before_touching_the_driver() {
    let r = PersistentKernel::<u32, u64>::launch(&source(), &[0u8; 8], &LaunchOptions::default());
    assert!(
        matches!(r, Err(PersistentError::Config { .. })),
        "{:?}",
        r.err()
    );
    let r = PersistentKernel::<u64, u64>::launch(&source(), &[0u8; 4], &LaunchOptions::default());
    assert!(
        matches!(r, Err(PersistentError::Config { .. })),
        "{:?}",
        r.err()
    );
}

#[test]
fn persistent_kernel_round_trip() {
    let Some(_turn) = gpu_turn("persistent_kernel_round_trip") else {
        return;
    };
    let opts = opts(2, 256);
    let mut k = PersistentKernel::<u64, u64>::launch(&source(), &[0u8; 8], &opts).unwrap();
    k.activate().unwrap();
    let mut expect = Vec::new();
    for i in 1..=1000u64 {
        while k.send(Envelope::new(i, 0, 0), i).is_err() {
            std::thread::yield_now();
        }
        if i % 3 != 0 {
            expect.push(i);
        }
        // Keep the output drained.
        while let Some(s) = k.try_receive() {
            assert_eq!(s.env.correlation_id, expect.remove(0));
            assert_eq!(s.payload, s.env.correlation_id * 2);
        }
    }
    while !expect.is_empty() {
        let s = k.receive(Duration::from_secs(5)).unwrap();
        assert_eq!(s.env.correlation_id, expect.remove(0));
    }
    assert_eq!(k.terminate(Duration::from_secs(5)).unwrap(), 0);
    let c = k.device_counters();
    assert_eq!(c.state, Some(DeviceState::Terminated));
    assert_eq!(c.processed, 1000);
}

/// A ring kernel whose handler calls `ext_double`, a function compiled outside the template
/// (what a Numba handler is), as LTO-IR for `arch`.
fn external_source(arch: &str) -> KernelSource {
    let ext = "extern \"C\" __device__ int ext_double(void* state, const void* in, void* out, const void* env) {\n\
               unsigned long long v = *(const unsigned long long*)in;\n\
               atomicAdd((unsigned long long*)state, 1ull);\n\
               *(unsigned long long*)out = v * 2ull + 1ull;\n\
               return (v % 3ull) != 0ull;\n}\n";
    let ir = resident_cuda::compile_ltoir(
        ext,
        "ext.cu",
        &resident_cuda::CompileOptions::for_arch(arch),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut src = source();
    src.name = "gpu_external".into();
    src.handler = "__device__ bool handle(St* s, const In64* in, Out64* out, const Envelope* env) { return ext_double(s, in, out, env) != 0; }\n".into();
    src.with_external(resident_engine_cuda::persistent::ExternalFn {
        symbol: "ext_double".into(),
        ltoir: Some((arch.to_string(), ir)),
        host_fn: None,
    })
}

/// Without a driver a kernel with an external function is the same typed error (the link
/// needs the device's architecture, so nothing is compiled first).
#[test]
fn without_a_driver_an_external_kernel_is_a_typed_error() {
    if gpu_present() || !resident_cuda::nvrtc_present() {
        eprintln!("SKIP: a CUDA driver is present, or NVRTC is not (the source needs NVRTC)");
        return;
    }
    let r =
        PersistentKernel::<u64, u64>::launch(&external_source("sm_90"), &[0u8; 8], &opts(1, 256));
    assert!(
        matches!(r, Err(PersistentError::DriverUnavailable(_))),
        "{:?}",
        r.err()
    );
}

/// The template linked with an external function by nvJitLink, for the device's own
/// architecture, runs end to end; an explicit `compute_XY` with it is refused, typed.
#[test]
fn a_kernel_with_an_external_function_runs_linked_on_a_gpu() {
    let Some(_turn) = gpu_turn("a_kernel_with_an_external_function_runs_linked_on_a_gpu") else {
        return;
    };
    if let Err(e) = resident_cuda::nvjitlink_available() {
        if std::env::var("RESIDENT_REQUIRE_NVJITLINK").as_deref() == Ok("1") {
            panic!("RESIDENT_REQUIRE_NVJITLINK=1 but {e}");
        }
        eprintln!("SKIP: {e}");
        return;
    }
    let (major, minor) = resident_cuda::device_info(0).unwrap().compute_capability;
    let src = external_source(&format!("sm_{major}{minor}"));
    let mut explicit = opts(1, 256);
    explicit.arch = Some(format!("compute_{major}{minor}"));
    let r = PersistentKernel::<u64, u64>::launch(&src, &[0u8; 8], &explicit);
    assert!(
        matches!(r, Err(PersistentError::Config { .. })),
        "{:?}",
        r.err()
    );
    let mut k = PersistentKernel::<u64, u64>::launch(&src, &[0u8; 8], &opts(1, 256)).unwrap();
    k.activate().unwrap();
    let mut expect = Vec::new();
    for i in 1..=300u64 {
        while k.send(Envelope::new(i, 0, 0), i).is_err() {
            std::thread::yield_now();
        }
        if i % 3 != 0 {
            expect.push(i);
        }
        while let Some(s) = k.try_receive() {
            assert_eq!(s.env.correlation_id, expect.remove(0));
            assert_eq!(s.payload, s.env.correlation_id * 2 + 1);
        }
    }
    while !expect.is_empty() {
        let s = k.receive(Duration::from_secs(5)).unwrap();
        assert_eq!(s.env.correlation_id, expect.remove(0));
        assert_eq!(s.payload, s.env.correlation_id * 2 + 1);
    }
    let t = Duration::from_secs(5);
    assert_eq!(
        u64::from_le_bytes(k.state().read(t).unwrap().try_into().unwrap()),
        300
    );
    assert_eq!(k.terminate(t).unwrap(), 0);
}

/// `PersistentKernel::state` reads the state under the residency rule (the kernel parked
/// between two batches): each read sees whole batches only (the count of the outputs received
/// by then at least, never past what was sent), and it stays readable after terminate and
/// after the kernel is dropped.
#[test]
fn state_reads_on_a_gpu_see_whole_batches_and_outlive_the_kernel() {
    let Some(_turn) = gpu_turn("state_reads_on_a_gpu_see_whole_batches_and_outlive_the_kernel")
    else {
        return;
    };
    let t = Duration::from_secs(10);
    let mut k = PersistentKernel::<u64, u64>::launch(&source(), &[0u8; 8], &opts(1, 1024)).unwrap();
    let state = k.state();
    assert_eq!(state.len(), 8);
    let n = |b: Vec<u8>| u64::from_le_bytes(b.try_into().unwrap());
    assert_eq!(n(state.read(t).unwrap()), 0, "the initial state");
    k.activate().unwrap();
    let mut answered = 0u64;
    let mut last = 0;
    for i in 1..=600u64 {
        while k.send(Envelope::new(i, 0, 0), 1).is_err() {
            std::thread::yield_now();
        }
        while k.try_receive().is_some() {
            answered += 1;
        }
        if i % 50 == 0 {
            let now = n(state.read(t).unwrap());
            assert!(
                now >= last && now >= answered && now <= i,
                "{last} {answered} {now} {i}"
            );
            last = now;
        }
    }
    while answered < 600 {
        k.receive(t).unwrap();
        answered += 1;
    }
    assert_eq!(n(state.read(t).unwrap()), 600);
    k.terminate(t).unwrap();
    assert_eq!(n(state.read(t).unwrap()), 600, "the final state");
    drop(k);
    assert_eq!(n(state.read(t).unwrap()), 600, "kept by the handle");
}

#[test]
fn residency_budget_holds_every_admitted_kernel_resident_and_refuses_one_more() {
    let Some(_turn) = gpu_turn("residency_budget") else {
        return;
    };
    let opts = opts(1, 64);
    let mut src = source();
    src.batch_size = 32;
    let first = PersistentKernel::<u64, u64>::launch(&src, &[0u8; 8], &opts).unwrap();
    let limit = first.device().resident_limit();
    let mut kernels = vec![first];
    // `launch` returns only once the kernel reports it is running: every admitted kernel is
    // really co-resident with the others.
    eprintln!("residency limit {limit}");
    while kernels.len() < limit {
        let t = std::time::Instant::now();
        kernels.push(PersistentKernel::<u64, u64>::launch(&src, &[0u8; 8], &opts).unwrap());
        // Progress (a GPU run hung here once with nothing printed): where it stops, and how
        // long each launch took.
        eprintln!("resident {} ({:?})", kernels.len(), t.elapsed());
    }
    assert_eq!(kernels[0].device().resident_kernels(), limit);
    // The default limit leaves SMs and grid slots for other work.
    assert!(limit <= resident_cuda::device::default_resident_limit(limit + 1).max(limit));
    assert!(
        limit
            <= resident_cuda::CONCURRENT_KERNEL_LIMIT - resident_cuda::device::RESERVED_GRID_SLOTS
    );
    // A whole-device wait while ring kernels are resident is refused, not hung.
    assert!(matches!(
        kernels[0].device().synchronize(),
        Err(resident_cuda::CudaError::WouldWaitForResident { .. })
    ));
    match PersistentKernel::<u64, u64>::launch(&src, &[0u8; 8], &opts) {
        Err(PersistentError::Cuda(resident_cuda::CudaError::ResidencyExceeded {
            resident,
            limit: l,
            ..
        })) => assert_eq!((resident, l), (limit, limit)),
        Err(e) => panic!("expected ResidencyExceeded, got {e}"),
        Ok(_) => panic!("expected ResidencyExceeded, got a kernel"),
    }
    // Every one of them still answers.
    for (i, k) in kernels.iter_mut().enumerate() {
        k.activate().unwrap();
        let v = i as u64 * 3 + 1;
        k.send(Envelope::new(1, 0, 0), v).unwrap();
        assert_eq!(k.receive(Duration::from_secs(5)).unwrap().payload, v * 2);
    }
    // A place given back is a place to launch again.
    let mut last = kernels.pop().unwrap();
    last.terminate(Duration::from_secs(5)).unwrap();
    drop(last);
    let again = PersistentKernel::<u64, u64>::launch(&src, &[0u8; 8], &opts).unwrap();
    assert_eq!(again.device().resident_kernels(), limit);
}

/// The residency probe for `scripts/gpu-run.sh`: with a ring kernel resident (not quiesced),
/// times each driver call of `resident_cuda::hazards` that matters, each on its own thread with
/// a deadline, and prints one `PROBE {json}` line per call: `"ms"` when it returned while the
/// kernel ran, `"blocked": true` when it had not within the deadline. A blocked call is then
/// released: the kernel is told to exit through its control block (no driver call), and the
/// line says how long after that the call returned; the next probe gets a fresh resident
/// kernel. So the probe never hangs, and records what the driver does on that machine.
/// Asserted: the paths the engine relies on while kernels are resident (stream-ordered
/// allocation and free, copies on the side stream, a second kernel of a loaded module) did not
/// block; the calls the table says synchronize are recorded, not asserted.
#[test]
fn residency_probe_times_driver_calls_while_a_ring_kernel_is_resident() {
    let Some(_turn) = gpu_turn("residency_probe") else {
        return;
    };
    use std::sync::mpsc;
    use std::time::Instant;
    let mut src = source();
    src.batch_size = 64;
    let resident = || {
        let mut k = PersistentKernel::<u64, u64>::launch(&src, &[0u8; 8], &opts(1, 64)).unwrap();
        k.activate().unwrap();
        k
    };
    // The one-shot kernel's module is loaded before anything is resident.
    let dev = resident().device().clone();
    let fill = dev
        .kernel(
            resident_cuda::builtin::ELEMENTWISE.code,
            "resident_fill_u32",
            &[],
            None,
        )
        .unwrap();
    let deadline = Duration::from_secs(5);
    // The bulk lanes' memory, made before anything is resident (pinned memory and a stream
    // wait for the device): 1 MiB of staging, its place in device memory and a tail word.
    let staging = resident_cuda::PinnedMemory::new(&dev, 1 << 20).unwrap();
    let ring = resident_cuda::DeviceBuffer::zeroed(&dev, (1 << 20) + 128).unwrap();
    let copy_stream = resident_cuda::Stream::new(&dev).unwrap();
    let mut k = resident();
    let mut blocked_any_expected_free = Vec::new();
    let mut probe = |what: &'static str,
                     must_not_block: bool,
                     k: &mut PersistentKernel<u64, u64>,
                     op: Box<dyn FnOnce() -> String + Send>| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let t = Instant::now();
            let detail = op();
            let _ = tx.send((t.elapsed(), detail));
        });
        match rx.recv_timeout(deadline) {
            Ok((d, detail)) => println!(
                "PROBE {{\"op\":\"{what}\",\"ms\":{:.3},\"blocked\":false,\"detail\":\"{}\"}}",
                d.as_secs_f64() * 1e3,
                detail.replace('"', "'")
            ),
            Err(_) => {
                if must_not_block {
                    blocked_any_expected_free.push(what);
                }
                let stop = Instant::now();
                k.signal_terminate();
                let after = rx.recv_timeout(Duration::from_secs(30));
                println!(
                    "PROBE {{\"op\":\"{what}\",\"blocked\":true,\"deadline_ms\":{},\"returned_after_kernel_exit_ms\":{}}}",
                    deadline.as_millis(),
                    after.map_or("null".to_string(), |_| format!("{:.3}", stop.elapsed().as_secs_f64() * 1e3))
                );
                let _ = k.terminate(Duration::from_secs(5));
                *k = resident();
            }
        }
    };
    let d = dev.clone();
    probe(
        "DeviceBuffer alloc + free (stream-ordered, side stream)",
        true,
        &mut k,
        Box::new(
            move || match resident_cuda::DeviceBuffer::zeroed(&d, 1 << 20) {
                Ok(b) => {
                    let mut host = vec![0u8; 1 << 20];
                    let r = b.copy_to_host(&mut host);
                    drop(b);
                    format!("pools {}: {r:?}", d.has_memory_pools())
                }
                Err(e) => e.to_string(),
            },
        ),
    );
    let s2 = src.clone();
    probe(
        "launch of a second ring kernel of a loaded module",
        true,
        &mut k,
        Box::new(move || {
            match PersistentKernel::<u64, u64>::launch(&s2, &[0u8; 8], &opts(1, 64)) {
                Ok(mut k2) => format!("ok: {:?}", k2.terminate(Duration::from_secs(5))),
                Err(e) => e.to_string(),
            }
        }),
    );
    let (d, f) = (dev.clone(), fill.clone());
    probe(
        "one-shot launch of a loaded module + its stream's sync",
        true,
        &mut k,
        Box::new(move || {
            let buf = match resident_cuda::DeviceBuffer::zeroed(&d, 4096) {
                Ok(b) => b,
                Err(e) => return e.to_string(),
            };
            let stream = match resident_cuda::Stream::new(&d) {
                Ok(s) => s,
                Err(e) => return e.to_string(),
            };
            let mut p = resident_cuda::KernelParams::new();
            p.push_ptr(buf.device_ptr());
            if let Err(e) = p.push(7u32).and_then(|p| p.push(1024u64)) {
                return e.to_string();
            }
            // SAFETY: params match `resident_fill_u32(unsigned*, unsigned, unsigned long long)`;
            // `buf` outlives the synchronize.
            let r = unsafe { f.launch(resident_cuda::LaunchConfig::new(4, 256), &stream, &mut p) }
                .and_then(|_| stream.synchronize());
            format!("{r:?}")
        }),
    );
    let d = dev.clone();
    probe(
        "bulk lane: cuMemcpyHtoDAsync (1 MiB pinned) + cuStreamWriteValue64 + that stream's sync",
        true,
        &mut k,
        Box::new(move || {
            if d.bind().is_err() {
                return "lost".into();
            }
            let t = std::time::Instant::now();
            // SAFETY: `staging` is 1 MiB of pinned memory and `ring` 1 MiB + 128 B of device
            // memory, both moved into this closure and alive until it returns, after the
            // stream's synchronize; the tail word is the 8 bytes after the copy's bytes.
            let r = unsafe {
                resident_cuda::result::memcpy_htod_async(
                    ring.device_ptr(),
                    staging.as_ptr() as *const core::ffi::c_void,
                    1 << 20,
                    copy_stream.raw(),
                )
                .map(|_| t.elapsed())
                .and_then(|c| {
                    let t2 = std::time::Instant::now();
                    resident_cuda::result::stream_write_value64(
                        copy_stream.raw(),
                        ring.device_ptr() + (1 << 20),
                        7,
                    )
                    .map(|_| (c, t2.elapsed()))
                })
                .and_then(|c| copy_stream.synchronize().map(|_| c))
            };
            match r {
                Ok((c, w)) => format!(
                    "copy call {:.1} us, write-value call {:.1} us, 64-bit memops {}",
                    c.as_secs_f64() * 1e6,
                    w.as_secs_f64() * 1e6,
                    d.info().stream_mem_ops_64
                ),
                Err(e) => e.to_string(),
            }
        }),
    );
    let d = dev.clone();
    probe(
        "cuMemAlloc + cuMemFree (1 MiB, synchronous)",
        false,
        &mut k,
        Box::new(move || {
            if d.bind().is_err() {
                return "lost".into();
            }
            // SAFETY: the context is current; the pointer is freed once, right here.
            unsafe {
                match resident_cuda::result::mem_alloc(1 << 20) {
                    Ok(p) => format!("{:?}", resident_cuda::result::mem_free(p)),
                    Err(e) => e.to_string(),
                }
            }
        }),
    );
    let d = dev.clone();
    probe(
        "cuMemHostAlloc + cuMemFreeHost (1 MiB)",
        false,
        &mut k,
        Box::new(move || {
            if d.bind().is_err() {
                return "lost".into();
            }
            // SAFETY: the context is current; the memory is freed once, right here.
            unsafe {
                match resident_cuda::result::host_alloc(1 << 20, resident_cuda::PINNED_FLAGS) {
                    Ok(p) => format!("{:?}", resident_cuda::result::host_free(p)),
                    Err(e) => e.to_string(),
                }
            }
        }),
    );
    let d = dev.clone();
    probe(
        "module load (NVRTC + cuModuleLoadDataEx, new module)",
        false,
        &mut k,
        Box::new(move || {
            let src = "extern \"C\" __global__ void probe_k(unsigned int* p) { if (p) p[0] = 1u; }";
            match d.kernel(src, "probe_k", &["-DPROBE=1".to_string()], None) {
                Ok(_) => "ok".into(),
                Err(e) => e.to_string(),
            }
        }),
    );
    // The ring kernel still answers after all that (22: `source`'s handler drops multiples
    // of 3, so 21 would never be answered).
    k.send(Envelope::new(1, 0, 0), 22).unwrap();
    let answer = k.receive(Duration::from_secs(10)).map(|s| s.payload);
    println!(
        "PROBE {{\"op\":\"ring kernel answers after the probe\",\"ok\":{},\"counters\":\"{:?}\"}}",
        answer.is_ok(),
        k.device_counters()
    );
    assert_eq!(answer.ok(), Some(44), "{:?}", k.device_counters());
    assert!(
        blocked_any_expected_free.is_empty(),
        "calls the engine makes beside resident kernels waited for them: {blocked_any_expected_free:?}"
    );
}

/// The residency rule on a GPU: launching a second kernel (its module loaded, its queues from
/// the pinned arena) and allocating stream-ordered memory happen beside the resident one, or
/// park it and relaunch it where it left off where the device lacks memory pools; messages sent
/// around it all come back, in order. (Skips without a GPU; CudaSim's driver model checks the
/// same rules in CI.)
#[test]
fn launch_and_alloc_quiesce_the_resident_kernel_and_nothing_is_lost() {
    let Some(_turn) = gpu_turn("quiesce") else {
        return;
    };
    let mut src = source();
    src.batch_size = 64;
    let mut a = PersistentKernel::<u64, u64>::launch(&src, &[0u8; 8], &opts(1, 1024)).unwrap();
    a.activate().unwrap();
    let mut got = Vec::new();
    let mut next = 1u64;
    for round in 0..3 {
        for _ in 0..200 {
            a.send(Envelope::new(next, 0, 0), next).unwrap();
            next += 1;
        }
        let b = PersistentKernel::<u64, u64>::launch(&src, &[0u8; 8], &opts(1, 64)).unwrap();
        let _buf = resident_cuda::DeviceBuffer::alloc(b.device(), 1 << 20).unwrap();
        drop(b);
        // The handler answers every id not divisible by 3.
        let want = (1..next).filter(|v| v % 3 != 0).count();
        while got.len() < want {
            got.push(a.receive(Duration::from_secs(10)).unwrap());
        }
        let _ = round;
    }
    let ids: Vec<u64> = got.iter().map(|s| s.env.correlation_id).collect();
    assert_eq!(ids, (1..next).filter(|v| v % 3 != 0).collect::<Vec<_>>());
    assert!(got.iter().all(|s| s.payload == s.env.correlation_id * 2));
    a.terminate(Duration::from_secs(5)).unwrap();
}

/// The quiescing thread a [`a_launch_waits_out_a_quiesce_of_its_starting_kernel`] round starts.
type Quiescer = std::rc::Rc<
    std::cell::RefCell<Option<std::thread::JoinHandle<Result<(), resident_cuda::CudaError>>>>,
>;

/// A launch that waits for its kernel to become resident while another thread's call parks
/// every resident kernel of the device (the residency rule, `Device::with_quiesced`: another
/// launch's module load, an allocation) waits the park out instead of failing with
/// `Exited { state: Quiesced }`. Deterministic through the launch's wait hook: the park starts
/// before the launch's first look at its kernel's state and ends after its second. (Skips
/// without a GPU; `tests/launch_quiesce_sim.rs` checks the same on CudaSim in CI.)
#[test]
fn a_launch_waits_out_a_quiesce_of_its_starting_kernel() {
    let Some(_turn) = gpu_turn("launch_quiesce") else {
        return;
    };
    let device = resident_engine_cuda::persistent::open_device(0).unwrap();
    let rounds = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let quiescer: Quiescer = Default::default();
    let (parked_tx, parked_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let mut release_rx = Some(release_rx);
    let mut release_tx = Some(release_tx);
    let hook = {
        let rounds = rounds.clone();
        let quiescer = quiescer.clone();
        move || {
            rounds.set(rounds.get() + 1);
            match rounds.get() {
                1 => {
                    let release = release_rx.take().expect("round 1 runs once");
                    let parked = parked_tx.clone();
                    let device = device.clone();
                    *quiescer.borrow_mut() = Some(std::thread::spawn(move || {
                        device.with_quiesced(Duration::from_secs(10), move || {
                            parked.send(()).unwrap();
                            let _ = release.recv_timeout(Duration::from_secs(30));
                        })
                    }));
                    parked_rx
                        .recv_timeout(Duration::from_secs(30))
                        .expect("the starting kernel parked");
                }
                2 => {
                    let _ = release_tx.take().expect("round 2 runs once").send(());
                }
                _ => {}
            }
        }
    };
    let hook = resident_engine_cuda::persistent::on_resident_wait(hook);
    let launched = PersistentKernel::<u64, u64>::launch(&source(), &[0u8; 8], &opts(1, 256));
    drop(hook);
    let mut k = match launched {
        Ok(k) => k,
        Err(e) => panic!("a quiesce during the launch's wait failed the launch: {e}"),
    };
    assert!(rounds.get() >= 2, "{} rounds", rounds.get());
    let quiescer = quiescer
        .borrow_mut()
        .take()
        .expect("the quiesce was started");
    quiescer
        .join()
        .expect("the quiescing thread")
        .expect("every kernel parked");
    let state = k.device_counters().state;
    assert!(
        matches!(state, Some(DeviceState::Idle | DeviceState::Running)),
        "resident after the launch: {state:?}"
    );
    k.activate().unwrap();
    k.send(Envelope::new(1, 0, 0), 1).unwrap();
    let out = k.receive(Duration::from_secs(10)).unwrap();
    assert_eq!(out.payload, 2);
    k.terminate(Duration::from_secs(5)).unwrap();
}

/// A kernel dropped while another thread holds it parked (`Device::with_quiesced`) is not
/// relaunched by that thread's resume: its drop's terminate goes through the residency side,
/// which cancels the pending resume, and a later park leaves a terminated kernel alone. Before,
/// the drop wrote `Terminate` to the control block directly; the resume wrote the saved run
/// state back over it and relaunched the kernel on the queues the drop had freed, where it
/// stayed resident, unregistered, for good (the next synchronous call would wait for it
/// forever). Afterwards a fresh kernel launches and answers. (Skips without a GPU.)
#[test]
fn a_kernel_dropped_while_parked_is_not_relaunched() {
    let Some(_turn) = gpu_turn("drop_while_parked") else {
        return;
    };
    let device = resident_engine_cuda::persistent::open_device(0).unwrap();
    let mut k = PersistentKernel::<u64, u64>::launch(&source(), &[0u8; 8], &opts(1, 256)).unwrap();
    k.activate().unwrap();
    k.send(Envelope::new(1, 0, 0), 1).unwrap();
    assert_eq!(k.receive(Duration::from_secs(10)).unwrap().payload, 2);
    let (parked_tx, parked_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let quiescer = {
        let device = device.clone();
        std::thread::spawn(move || {
            device.with_quiesced(Duration::from_secs(10), move || {
                parked_tx.send(()).unwrap();
                let _ = release_rx.recv_timeout(Duration::from_secs(30));
            })
        })
    };
    parked_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the kernel parked");
    drop(k);
    release_tx.send(()).unwrap();
    quiescer
        .join()
        .expect("the quiescing thread")
        .expect("the park and the resume");
    // A module load and a launch wait for every kernel of the device: a relaunched zombie
    // would make this time out.
    let mut fresh =
        PersistentKernel::<u64, u64>::launch(&source(), &[0u8; 8], &opts(1, 256)).unwrap();
    fresh.activate().unwrap();
    // Not a multiple of 3: `source`'s handler answers only those (21 was never answered).
    fresh.send(Envelope::new(2, 0, 0), 22).unwrap();
    let out = fresh.receive(Duration::from_secs(10));
    assert_eq!(
        out.map(|s| s.payload).ok(),
        Some(44),
        "{:?}",
        fresh.device_counters()
    );
    fresh.terminate(Duration::from_secs(5)).unwrap();
}

/// The bulk lanes on a GPU: every message by staging, the copy engine and the device ring
/// (`BulkMode::On`), then the automatic choice with runs long and short, over two lanes; every
/// answer once, FIFO within its lane, the doubled value.
#[test]
fn bulk_lanes_round_trip_on_a_gpu() {
    let Some(_turn) = gpu_turn("bulk_lanes_round_trip_on_a_gpu") else {
        return;
    };
    use resident_engine_cuda::persistent::{BulkConfig, BulkMode};
    for mode in [BulkMode::On, BulkMode::Auto] {
        let mut o = opts(2, 1024);
        o.bulk = BulkConfig {
            mode,
            threshold: 64,
        };
        let mut k = PersistentKernel::<u64, u64>::launch(&source(), &[0u8; 8], &o).unwrap();
        k.activate().unwrap();
        let mut expect: [std::collections::VecDeque<u64>; 2] = Default::default();
        let mut next = 1u64;
        let mut pending: Vec<Slot<u64>> = Vec::new();
        let start = std::time::Instant::now();
        while next <= 20_000 || expect.iter().any(|e| !e.is_empty()) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{mode:?}: timed out"
            );
            if pending.is_empty() && next <= 20_000 {
                let prio = if next % 7 < 3 { 0 } else { 200 };
                let len = if next.is_multiple_of(5) { 1 } else { 300 };
                for id in next..next + len {
                    pending.push(Slot::new(Envelope::new(id, prio, 0), id));
                    if id % 3 != 0 {
                        expect[(prio >= 128) as usize].push_back(id);
                    }
                }
                next += len;
            }
            let n = k.send_batch(&pending);
            pending.drain(..n);
            while let Some(s) = k.try_receive() {
                let lane = (s.env.priority >= 128) as usize;
                assert_eq!(
                    expect[lane].pop_front(),
                    Some(s.env.correlation_id),
                    "{mode:?}"
                );
                assert_eq!(s.payload, 2 * s.env.correlation_id);
            }
        }
        assert_eq!(k.terminate(Duration::from_secs(5)).unwrap(), 0, "{mode:?}");
    }
}
