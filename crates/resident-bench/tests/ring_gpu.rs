//! The persistent-vs-launch-per-batch benchmark (moved here from resident-cuda with its
//! checks). Without a GPU it must fail with a typed error, never a panic; with one (and NVRTC)
//! it runs every variant with its outputs checked.
#![cfg(feature = "cuda")]

use resident_bench::ring_gpu::{bench_ring, MEASURES_BATCH, MEASURES_MESSAGE, MEASURES_STREAMING};
use resident_bench::BenchError;
use resident_engine_cuda::persistent::PersistentError;

fn gpu_present() -> bool {
    resident_cuda::driver_present() && resident_cuda::nvrtc_present()
}

#[test]
fn without_a_driver_bench_ring_is_a_typed_error() {
    if gpu_present() {
        eprintln!("SKIP: a CUDA driver is present; covered by bench_ring_on_a_gpu");
        return;
    }
    let r = bench_ring(0, 10, &[64]);
    assert!(
        matches!(
            r,
            Err(BenchError::Persistent(
                PersistentError::DriverUnavailable(_) | PersistentError::NvrtcUnavailable(_)
            ))
        ),
        "{r:?}"
    );
}

#[test]
fn bad_parameters_are_refused_before_touching_the_driver() {
    for (iters, in_flight) in [(0, 64), (10, 0), (10, (1 << 20) + 1)] {
        let r = bench_ring(0, iters, &[in_flight]);
        assert!(matches!(r, Err(BenchError::Parameter { .. })), "{r:?}");
    }
    // No depth at all, and a bad one among good ones.
    for depths in [&[][..], &[64, 0][..]] {
        let r = bench_ring(0, 10, depths);
        assert!(matches!(r, Err(BenchError::Parameter { .. })), "{r:?}");
    }
}

#[test]
fn bench_ring_on_a_gpu() {
    if !gpu_present() {
        if std::env::var("RESIDENT_REQUIRE_GPU").as_deref() == Ok("1") {
            panic!("bench_ring_on_a_gpu: RESIDENT_REQUIRE_GPU=1 but the CUDA driver or NVRTC is missing");
        }
        eprintln!("SKIP: CUDA driver or NVRTC not available: bench_ring_on_a_gpu");
        return;
    }
    let rows = bench_ring(0, 10, &[64]).unwrap();
    // Per payload: each persistent variant (auto, LL only, bulk only) at 1 and 64 in flight and
    // streaming at 64, and the two baselines at 1 and 64.
    assert_eq!(rows.len(), 3 * (3 * 3 + 2 * 2));
    for bytes in [16, 64, 256] {
        let of = |v: &str, n: usize| {
            rows.iter()
                .filter(|r| r.payload_bytes == bytes && r.variant == v && r.in_flight == n)
                .count()
        };
        for v in ["persistent", "launch_per_batch", "graph"] {
            assert_eq!(of(v, 1), 1, "{v} {bytes} B at 1 in flight");
            assert_eq!(of(v, 64), 1, "{v} {bytes} B at 64 in flight");
        }
        assert_eq!(of("persistent_streaming", 64), 1);
        for v in ["persistent_ll", "persistent_bulk"] {
            assert_eq!(of(v, 1), 1, "{v} {bytes} B at 1 in flight");
            assert_eq!(of(v, 64), 1, "{v} {bytes} B at 64 in flight");
            assert_eq!(
                of(&format!("{v}_streaming"), 64),
                1,
                "{v} {bytes} B streaming"
            );
        }
    }
    for r in &rows {
        let want = match (r.variant, r.in_flight) {
            (v, _) if v.ends_with("_streaming") => MEASURES_STREAMING,
            (_, 1) => MEASURES_MESSAGE,
            _ => MEASURES_BATCH,
        };
        assert_eq!(r.measures, want, "{r:?}");
        assert!(
            r.msgs_per_s > 0.0 && r.p50_ns <= r.p99_ns && r.p99_ns <= r.p999_ns,
            "{r:?}"
        );
    }
}
