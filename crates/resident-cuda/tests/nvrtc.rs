//! NVRTC tests: run wherever `libnvrtc` loads (no GPU needed; see scripts/setup-nvrtc.sh),
//! skip visibly elsewhere, and fail when `RESIDENT_REQUIRE_NVRTC=1` says NVRTC must be there.

use resident_cuda::builtin::ALL;
use resident_cuda::cache::{CacheKey, CacheOutcome, KernelCache};
use resident_cuda::{compile_ptx, nvrtc_present, CompileOptions, CudaError};

const ARCHES: &[&str] = &["compute_80", "compute_90"];

fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc_present() {
        return true;
    }
    if std::env::var("RESIDENT_REQUIRE_NVRTC").as_deref() == Ok("1") {
        panic!(
            "{test}: RESIDENT_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded; run scripts/setup-nvrtc.sh and set LD_LIBRARY_PATH"
        );
    }
    eprintln!("SKIP: {test}: NVRTC not found (run scripts/setup-nvrtc.sh and set LD_LIBRARY_PATH)");
    false
}

#[test]
fn nvrtc_compiles_shipped_sources() {
    if !nvrtc_or_skip("nvrtc_compiles_shipped_sources") {
        return;
    }
    for src in ALL {
        for arch in ARCHES {
            let ptx = compile_ptx(src.code, src.name, &CompileOptions::for_arch(*arch))
                .unwrap_or_else(|e| panic!("{} for {arch}: {e}", src.name));
            let target = arch.replace("compute_", "sm_");
            assert!(
                ptx.contains(&format!(".target {target}")),
                "{}: no .target {target}",
                src.name
            );
            for entry in src.entries {
                assert!(
                    ptx.contains(&format!(".entry {entry}(")),
                    "{}: entry {entry} missing for {arch}",
                    src.name
                );
            }
        }
    }
}

#[test]
fn compile_error_returns_the_log() {
    if !nvrtc_or_skip("compile_error_returns_the_log") {
        return;
    }
    let bad = "extern \"C\" __global__ void k(int* p) { p[0] = undefined_name; }";
    match compile_ptx(bad, "bad_kernel", &CompileOptions::for_arch("compute_90")) {
        Err(CudaError::Compile { name, arch, log }) => {
            assert_eq!(name, "bad_kernel");
            assert_eq!(arch, "compute_90");
            assert!(log.contains("undefined_name"), "log: {log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn bad_option_is_a_typed_error() {
    if !nvrtc_or_skip("bad_option_is_a_typed_error") {
        return;
    }
    let mut o = CompileOptions::for_arch("compute_90");
    o.extra.push("--no-such-option".into());
    let e = compile_ptx("extern \"C\" __global__ void k() {}", "k", &o).unwrap_err();
    assert!(
        matches!(e, CudaError::Nvrtc { .. } | CudaError::Compile { .. }),
        "{e:?}"
    );
    let mut o = CompileOptions::for_arch("compute_90");
    o.extra.push("nul\0inside".into());
    assert!(matches!(
        compile_ptx("", "k", &o),
        Err(CudaError::InvalidArgument { .. })
    ));
}

#[test]
fn missing_nvrtc_is_a_typed_error() {
    let r = compile_ptx(
        "extern \"C\" __global__ void k() {}",
        "k",
        &CompileOptions::for_arch("compute_90"),
    );
    if nvrtc_present() {
        assert!(r.is_ok(), "{r:?}");
    } else {
        assert!(matches!(r, Err(CudaError::NvrtcNotFound)), "{r:?}");
    }
}

#[test]
fn disk_cache_serves_real_ptx() {
    if !nvrtc_or_skip("disk_cache_serves_real_ptx") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("resident-nvrtc-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = KernelCache::new(&dir, 1 << 20).unwrap();
    let src = ALL[0];
    let opts = CompileOptions::for_arch("compute_90");
    let key = CacheKey::new(src.code, &opts.extra, &opts.arch, (0, 0));
    let build = || compile_ptx(src.code, src.name, &opts);
    let (a, o) = cache.get_or_build(&key, build).unwrap();
    assert_eq!(o, CacheOutcome::Miss);
    let (b, o) = cache.get_or_build(&key, build).unwrap();
    assert_eq!(o, CacheOutcome::Hit);
    assert_eq!(a, b);
    let _ = std::fs::remove_dir_all(&dir);
}
