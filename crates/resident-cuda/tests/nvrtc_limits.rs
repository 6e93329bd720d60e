//! NVRTC under the compile's wall-time limit: a source that keeps NVRTC's parser busy for
//! minutes is answered with `CudaError::CompileTimeout` at the limit, in a binary of its own
//! (the limit comes from the environment, which this test sets for its whole process).
#![cfg(feature = "driver")]

use std::time::{Duration, Instant};

use resident_cuda::{compile_ptx, nvrtc_present, CompileOptions, CudaError};

/// Six statements chaining 40 000 assignments each: NVRTC 13's parser recurses once per link
/// (it took 2.4 s for one chain of 30 000 on the shared 2-vCPU VM, release build), so this
/// keeps it busy for many seconds. Ring-kernel sources are refused past 256 links before NVRTC
/// sees them (`persistent::template::MAX_CHAIN`); a raw source is not, hence the limit.
fn endless() -> String {
    let chain = format!("a = {}1ull; ", "a = ".repeat(40_000));
    format!(
        "extern \"C\" __global__ void k(unsigned long long* p) {{ unsigned long long a = 0; {}p[0] = a; }}",
        chain.repeat(6)
    )
}

#[test]
fn an_nvrtc_compile_past_its_time_limit_is_answered_at_the_limit() {
    if !nvrtc_present() {
        if std::env::var("RESIDENT_REQUIRE_NVRTC").as_deref() == Ok("1") {
            panic!("RESIDENT_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded");
        }
        eprintln!("SKIP: NVRTC not found");
        return;
    }
    std::env::set_var(resident_cuda::limits::TIMEOUT_ENV, "1");
    let start = Instant::now();
    let r = compile_ptx(
        &endless(),
        "endless",
        &CompileOptions::for_arch("compute_90"),
    );
    let took = start.elapsed();
    match r {
        Err(CudaError::CompileTimeout { limit, .. }) => assert_eq!(limit, Duration::from_secs(1)),
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(20), "{took:?}");
    // The process goes on: another compile works meanwhile.
    std::env::set_var(resident_cuda::limits::TIMEOUT_ENV, "120");
    compile_ptx(
        "extern \"C\" __global__ void ok(int* p) { p[0] = 1; }",
        "ok",
        &CompileOptions::for_arch("compute_90"),
    )
    .unwrap();
}
