//! CudaSim compiles users' CUDA C in a child process under limits (`resident_limits`): a
//! compile that never ends and one that allocates without bound each end within their limit
//! with a typed error, and a ring kernel already running keeps answering meanwhile.

use std::time::{Duration, Instant};

use resident_engine_cuda::persistent::{
    KernelSource, MessageDecl, QueueConfig, SimKernel, SimLaunchOptions,
};
use resident_engine_cuda::sim::{SimError, SimModule, SimOptions};
use resident_limits::CompileLimits;
use resident_ring::Envelope;

fn compiler_or_skip() -> bool {
    if resident_engine_cuda::sim::available() {
        return true;
    }
    if std::env::var("RESIDENT_REQUIRE_CUDASIM").as_deref() == Ok("1") {
        panic!("RESIDENT_REQUIRE_CUDASIM=1 but no host C++ compiler runs");
    }
    eprintln!("SKIP: no host C++ compiler for CudaSim");
    false
}

/// A constant evaluation of about 10^15 steps: g++ would run for hours (its step limit, about
/// 8.6 * 10^9, alone takes minutes).
const ENDLESS: &str = "
constexpr unsigned long long spin() {
    unsigned long long x = 0;
    for (unsigned long long i = 0; i < 200000; ++i)
        for (unsigned long long j = 0; j < 200000; ++j)
            for (unsigned long long k = 0; k < 200000; ++k) x += (i ^ j ^ k) >> 3;
    return x;
}
static_assert(spin() != 1, \"spin\");
";

/// A macro that doubles 34 times: an initializer of 2^34 elements, whose tokens alone take
/// hundreds of GB.
fn boundless() -> String {
    let mut s = String::from("#define E0 1,1\n");
    for i in 1..=34 {
        s.push_str(&format!("#define E{i} E{p},E{p}\n", p = i - 1));
    }
    s.push_str("static const int v[] = { E34 };\n");
    s
}

fn compile(tag: &str, source: &str, limits: CompileLimits) -> Result<SimModule, SimError> {
    let dir = std::env::temp_dir().join(format!("resident-limits-{tag}-{}", std::process::id()));
    let r = SimModule::compile_in(
        &dir,
        tag,
        source,
        &[],
        &SimOptions {
            limits: Some(limits),
            ..SimOptions::default()
        },
    );
    let _ = std::fs::remove_dir_all(&dir);
    r
}

#[test]
fn a_compile_that_never_ends_is_stopped_at_its_time_limit() {
    if !compiler_or_skip() {
        return;
    }
    let limits = CompileLimits {
        wall: Duration::from_secs(3),
        ..CompileLimits::default()
    };
    let start = Instant::now();
    let e = compile("endless", ENDLESS, limits).expect_err("it cannot compile");
    let took = start.elapsed();
    assert!(matches!(e, SimError::CompileTimeout { .. }), "{e}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(e.to_string().contains("RESIDENT_COMPILE_TIMEOUT_S"), "{e}");
}

#[test]
fn a_compile_that_allocates_without_bound_ends_at_its_memory_limit() {
    if !compiler_or_skip() {
        return;
    }
    let limits = CompileLimits {
        wall: Duration::from_secs(60),
        memory_bytes: 512 << 20,
    };
    let start = Instant::now();
    let e = compile("boundless", &boundless(), limits).expect_err("it cannot compile");
    assert!(matches!(e, SimError::CompileOutOfMemory { .. }), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
}

/// While a hostile compile runs into its limits, a ring kernel launched before it keeps
/// answering.
#[test]
fn other_kernels_keep_running_while_a_compile_is_stopped() {
    if !compiler_or_skip() {
        return;
    }
    let u64_decl = MessageDecl::new("U64", "typedef unsigned long long U64;", 8);
    let src = KernelSource::new(
        "beside_limits",
        u64_decl.clone(),
        u64_decl,
        MessageDecl::new("St", "typedef struct { unsigned long long n; } St;", 8),
        "__device__ bool handle(St* s, const U64* in, U64* out, const Envelope* e) { *out = *in + 1ull; return true; }",
        32,
    );
    let opts = SimLaunchOptions {
        queues: QueueConfig {
            lanes: 1,
            lane_capacity: 64,
            out_capacity: 64,
        },
        heartbeat_timeout: None,
        ..SimLaunchOptions::default()
    };
    let mut k = SimKernel::<u64, u64>::launch(&src, &[0u8; 8], &opts).unwrap();
    k.activate();
    let hostile = std::thread::spawn(|| {
        compile(
            "beside",
            ENDLESS,
            CompileLimits {
                wall: Duration::from_secs(3),
                ..CompileLimits::default()
            },
        )
    });
    let mut answered = 0u64;
    let mut out = Vec::new();
    while !hostile.is_finished() || answered < 10 {
        k.send(Envelope::new(answered + 1, 128, 0), answered)
            .unwrap();
        let t = Instant::now();
        loop {
            out.clear();
            if k.receive_into(&mut out, 1) == 1 {
                assert_eq!(out[0].payload, answered + 1);
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the kernel stopped answering"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        answered += 1;
    }
    assert!(matches!(
        hostile.join().unwrap(),
        Err(SimError::CompileTimeout { .. })
    ));
    k.terminate(Duration::from_secs(30)).unwrap();
}
