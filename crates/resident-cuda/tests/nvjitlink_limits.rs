//! nvJitLink under the compile's wall-time limit: a link whose link-time optimizer runs for
//! many seconds is answered with `CudaError::CompileTimeout` at the limit, and the next link
//! works. A binary of its own: the limit comes from the environment, which this test sets for
//! its whole process.
#![cfg(feature = "driver")]

use std::time::{Duration, Instant};

use resident_cuda::{compile_ltoir, nvjitlink, nvrtc_present, CompileOptions, CudaError};

/// 3000 device functions, each a chain of dependent arithmetic, all called from one kernel:
/// NVRTC's LTO-IR leaves their optimization to the link, which inlines and optimizes them all.
fn heavy() -> String {
    let mut s = String::new();
    for i in 0..3000 {
        s.push_str(&format!(
            "__device__ __noinline__ double f{i}(double x) {{ double a = x; for (int k = 0; k < 64; ++k) {{ a = a * 1.0000001 + {i}.5 / (a + 3.0); }} return a; }}\n"
        ));
    }
    s.push_str("extern \"C\" __global__ void k(double* p) { double a = p[0];\n");
    for i in 0..3000 {
        s.push_str(&format!("  a += f{i}(a);\n"));
    }
    s.push_str("  p[0] = a; }\n");
    s
}

#[test]
fn a_link_past_its_time_limit_is_answered_at_the_limit() {
    let required = std::env::var("RESIDENT_REQUIRE_NVJITLINK").as_deref() == Ok("1");
    if !nvrtc_present() || !nvjitlink::nvjitlink_present() {
        assert!(!required, "RESIDENT_REQUIRE_NVJITLINK=1 but NVRTC or nvJitLink cannot be loaded");
        eprintln!("SKIP: NVRTC or nvJitLink not found");
        return;
    }
    let opts = CompileOptions::for_arch("sm_90");
    let big = compile_ltoir(&heavy(), "heavy", &opts).expect("the heavy source compiles");
    let small = compile_ltoir(
        "extern \"C\" __global__ void k(int* p) { p[0] = 1; }",
        "small",
        &opts,
    )
    .expect("the small source compiles");
    // Without a limit below its time, the heavy link is slow: measured so the test shows the
    // limit cut it short (on a machine fast enough to link it in 1 s the test says so).
    std::env::set_var(resident_cuda::limits::TIMEOUT_ENV, "1");
    let start = Instant::now();
    let r = nvjitlink::link_cubin("sm_90", &[("heavy", &big)]);
    let took = start.elapsed();
    match r {
        Err(CudaError::CompileTimeout { limit, .. }) => {
            assert_eq!(limit, Duration::from_secs(1));
            assert!(took < Duration::from_secs(5), "answered after {took:?}");
        }
        Ok(_) => {
            eprintln!("NOTE: the heavy link finished within the 1 s limit ({took:?}) here");
            assert!(took <= Duration::from_millis(1500), "{took:?}");
        }
        Err(e) => panic!("unexpected: {e}"),
    }
    // The next link, beside the abandoned one, works.
    std::env::set_var(resident_cuda::limits::TIMEOUT_ENV, "120");
    let cubin = nvjitlink::link_cubin("sm_90", &[("small", &small)]).expect("a small link");
    assert_eq!(&cubin[..4], b"\x7fELF");
}
