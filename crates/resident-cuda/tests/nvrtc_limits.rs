//! NVRTC under the compile's limits, in a process of its own: a source that keeps NVRTC's
//! parser busy for minutes is stopped at the wall-time limit (`CudaError::CompileTimeout`), one
//! that makes it allocate without bound ends at the memory limit (`CompileOutOfMemory`), one
//! that overflows its parser's stack ends its process alone (`CompileCrashed`); each within 30 s,
//! with this process's memory unchanged and the next compile working. In a binary of its own:
//! the limits come from the environment, which these tests set for the whole process (they take
//! turns).
#![cfg(feature = "driver")]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use resident_cuda::{compile_ptx, nvrtc_present, CompileOptions, CudaError};

static TURNS: Mutex<()> = Mutex::new(());

fn present() -> bool {
    if !nvrtc_present() {
        if std::env::var("RESIDENT_REQUIRE_NVRTC").as_deref() == Ok("1") {
            panic!("RESIDENT_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded");
        }
        eprintln!("SKIP: NVRTC not found");
        return false;
    }
    true
}

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

/// A macro that expands to 10 * 2^11 statements per level: NVRTC's preprocessor builds a token
/// list without end (in this process it grew past 3 GB before failing, 12 s).
fn macro_bomb() -> String {
    let mut s = String::from("#define A0(x) x x x x x x x x x x\n");
    for i in 1..12 {
        s += &format!("#define A{i}(x) A{p}(A{p}(x))\n", p = i - 1);
    }
    s + "extern \"C\" __global__ void k(int* p) { int a = 0; A11(a += 1;) p[0] = a; }"
}

/// A million nested parentheses: NVRTC's parser recurses once per level, past the compile
/// thread's 512 MiB stack (in this process that was a SIGSEGV of the whole process).
fn too_deep() -> String {
    let n = 1_000_000;
    format!(
        "extern \"C\" __global__ void k(int* p) {{ p[0] = {}1{}; }}",
        "(".repeat(n),
        ")".repeat(n)
    )
}

fn ok_compiles() {
    let ptx = compile_ptx(
        "extern \"C\" __global__ void ok(int* p) { p[0] = 1; }",
        "ok",
        &CompileOptions::for_arch("compute_90"),
    )
    .unwrap();
    assert!(ptx.contains(".entry ok"), "{ptx}");
}

/// The children of this process (every thread's), from procfs.
fn children() -> Vec<String> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(c.split_whitespace().map(str::to_string));
        }
    }
    out
}

/// This process's peak resident memory, KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn with_limits<T>(timeout_s: &str, memory_mb: &str, f: impl FnOnce() -> T) -> T {
    std::env::set_var(resident_limits::TIMEOUT_ENV, timeout_s);
    std::env::set_var(resident_limits::MEMORY_ENV, memory_mb);
    let r = f();
    std::env::remove_var(resident_limits::TIMEOUT_ENV);
    std::env::remove_var(resident_limits::MEMORY_ENV);
    r
}

#[test]
fn an_nvrtc_compile_past_its_time_limit_is_answered_at_the_limit() {
    let _turn = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    if !present() {
        return;
    }
    let start = Instant::now();
    let r = with_limits("1", "4096", || {
        compile_ptx(
            &endless(),
            "endless",
            &CompileOptions::for_arch("compute_90"),
        )
    });
    let took = start.elapsed();
    match r {
        Err(CudaError::CompileTimeout { limit, .. }) => assert_eq!(limit, Duration::from_secs(1)),
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(20), "{took:?}");
    // Stopped, not abandoned: no compile is left running.
    assert_eq!(children(), Vec::<String>::new());
    // The process goes on: another compile works.
    ok_compiles();
}

#[test]
fn an_nvrtc_compile_that_allocates_without_bound_ends_at_the_memory_limit() {
    let _turn = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    if !present() {
        return;
    }
    ok_compiles();
    let before = peak_rss_kib();
    let start = Instant::now();
    let r = with_limits("60", "256", || {
        compile_ptx(
            &macro_bomb(),
            "bomb",
            &CompileOptions::for_arch("compute_90"),
        )
    });
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    match r {
        Err(e @ CudaError::CompileOutOfMemory { limit_mb: 256, .. }) => {
            assert!(e.to_string().contains("RESIDENT_COMPILE_MEMORY_MB"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // The allocations were the compile's process's, not this one's.
    let grew = peak_rss_kib().saturating_sub(before);
    assert!(grew < 100 << 10, "this process grew by {grew} KiB");
    ok_compiles();
}

#[test]
fn an_nvrtc_parser_stack_overflow_ends_its_process_alone() {
    let _turn = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    if !present() {
        return;
    }
    let start = Instant::now();
    let r = with_limits("60", "4096", || {
        compile_ptx(&too_deep(), "deep", &CompileOptions::for_arch("compute_90"))
    });
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    match r {
        Err(e @ CudaError::CompileCrashed { .. }) => {
            let text = e.to_string();
            assert!(text.contains("signal 11"), "{text}");
            assert!(!text.contains("(((("), "quotes no source: {text}");
        }
        other => panic!("{other:?}"),
    }
    ok_compiles();
}

#[test]
fn an_nvjitlink_link_runs_in_a_process_of_its_own() {
    let _turn = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    if !present() {
        return;
    }
    if let Err(e) = resident_cuda::nvjitlink::nvjitlink_available() {
        if std::env::var("RESIDENT_REQUIRE_NVJITLINK").as_deref() == Ok("1") {
            panic!("RESIDENT_REQUIRE_NVJITLINK=1 but {e}");
        }
        eprintln!("SKIP: {e}");
        return;
    }
    let ltoir = resident_cuda::compile_ltoir(
        "extern \"C\" __global__ void k(int* p) { p[0] = 1; }",
        "k",
        &CompileOptions::for_arch("sm_90"),
    )
    .unwrap();
    // A link and a refused link both come back whole from the link's process, which is gone.
    let cubin = resident_cuda::nvjitlink::link_cubin("sm_90", &[("k", &ltoir)]).unwrap();
    assert!(cubin.starts_with(b"\x7fELF"), "a CUBIN");
    match resident_cuda::nvjitlink::link_cubin("sm_90", &[("junk", b"not LTO-IR")]) {
        Err(CudaError::JitLink { call, log, .. }) => {
            assert_eq!(call, "nvJitLinkAddData", "{log}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(children(), Vec::<String>::new());
}
