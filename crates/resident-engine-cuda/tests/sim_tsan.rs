//! The persistent ring kernel under ThreadSanitizer: for every batch size we ship, the CudaSim
//! translation unit (shim + generated prelude + a handler + the template) is compiled together
//! with a C++ driver (`tests/sim/tsan_driver.cpp`) that plays the host's half of the protocol,
//! with `g++ -fsanitize=thread`, and run. The test fails on any TSan report, a driver check
//! (exactly once, FIFO per lane, payloads, counters) or a timeout.
//!
//! Needs g++ and libtsan (Debian: `libtsan2`, installed by `.ci/run`). Without them the test
//! prints `SKIP:` unless `RESIDENT_REQUIRE_TSAN=1`.

use std::time::Duration;

use resident_engine_cuda::persistent::{KernelSource, MessageDecl};
use resident_engine_cuda::sim::TsanError;

const DRIVER: &str = include_str!("sim/tsan_driver.cpp");
const PEER_DRIVER: &str = include_str!("sim/tsan_peer_driver.cpp");

/// The batch sizes the crates use: 32 (smallest), 64 (`RingKernel` default), 96 (not a power of
/// two), 256 (bench baseline), 1024 (bench persistent kernel, largest).
const BATCH_SIZES: &[u32] = &[32, 64, 96, 256, 1024];

// RESIDENT_TSAN_KEEP=1 keeps the generated sources and binaries (the folder is printed).

const HANDLER: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) {
    *out = *in * 2ull + 1ull;
    atomicAdd(&s->n, 1ull);
    return true;
}
"#;

fn source(batch: u32) -> KernelSource {
    let u64_decl = MessageDecl::new("U64", "typedef unsigned long long U64;", 8);
    KernelSource::new(
        format!("tsan_{batch}"),
        u64_decl.clone(),
        u64_decl,
        MessageDecl::new(
            "Count",
            "typedef struct { unsigned long long n; } Count;",
            8,
        ),
        HANDLER,
        batch,
    )
}

fn skip_or_fail(why: &str) {
    if std::env::var("RESIDENT_REQUIRE_TSAN").as_deref() == Ok("1") {
        panic!("RESIDENT_REQUIRE_TSAN=1 but {why}");
    }
    eprintln!("SKIP: ThreadSanitizer run: {why}");
}

/// Builds `rendered` (a rendered template) with the driver under TSan and runs it; returns
/// (exit status success, stdout, stderr), or `None` after a skip.
fn build_and_run(
    dir: &std::path::Path,
    tag: &str,
    rendered: &str,
) -> Option<(bool, String, String)> {
    build_and_run_with(dir, tag, rendered, DRIVER)
}

fn build_and_run_with(
    dir: &std::path::Path,
    tag: &str,
    rendered: &str,
    driver: &str,
) -> Option<(bool, String, String)> {
    let tu = resident_engine_cuda::sim::translation_unit(tag, rendered, &[])
        + "\n#line 1 \"tsan_driver.cpp\"\n"
        + driver;
    match resident_engine_cuda::sim::run_under_tsan(dir, tag, &tu, Duration::from_secs(600)) {
        Ok(r) => Some((r.success, r.stdout, r.stderr)),
        Err(TsanError::Unavailable(why)) => {
            skip_or_fail(&why.to_string());
            None
        }
        Err(e) => panic!("{tag}: {e}"),
    }
}

fn work_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("resident-tsan-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn finish(dir: &std::path::Path) {
    if std::env::var("RESIDENT_TSAN_KEEP").as_deref() == Ok("1") {
        println!("kept the TSan sources and binaries in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn persistent_kernel_is_clean_under_thread_sanitizer_for_every_batch_size() {
    let dir = work_dir("clean");
    for &batch in BATCH_SIZES {
        let rendered = source(batch).render().unwrap();
        let Some((ok, stdout, stderr)) = build_and_run(&dir, &format!("tsan_{batch}"), &rendered)
        else {
            return;
        };
        assert!(
            ok && !stderr.contains("ThreadSanitizer"),
            "batch {batch}:\n{stdout}\n{stderr}"
        );
        println!("batch {batch}: {}", stdout.trim());
    }
    finish(&dir);
}

/// The harness has teeth: the template's start-up broadcast as it was before the fix (thread 0
/// reused `s_cmd` for it, then rewrote `s_cmd` in the loop while other threads could still be
/// reading the start value) is reported as a data race. Eight warps: warp 0 polls behind warp
/// barriers with thread 0, which order its own reads of the start value before thread 0's
/// rewrite, so the race is between thread 0 and the other warps (with one warp, as at batch
/// 32, that barrier closes it; with two, TSan's four-entry history of the word often kept
/// only warp 0's ordered reads, and 4 runs under load reported nothing).
#[test]
fn thread_sanitizer_reports_the_old_s_cmd_race() {
    let dir = work_dir("race");
    let rendered = source(256).render().unwrap();
    let old = rendered
        .replace("s_start = RESIDENT_CMD_RUN;", "s_cmd = RESIDENT_CMD_RUN;")
        .replace("s_start = RESIDENT_CMD_EXIT;", "s_cmd = RESIDENT_CMD_EXIT;")
        .replace(
            "if (s_start == RESIDENT_CMD_EXIT) return;",
            "if (s_cmd == RESIDENT_CMD_EXIT) return;",
        );
    assert_ne!(
        old, rendered,
        "the template still has the start-up broadcast"
    );
    // The race needs the reading threads to read the start value before thread 0 rewrites it:
    // a thread that wakes from the start-up barrier later takes the barrier's mutex after
    // thread 0 released it at barrier A, which orders the two for TSan. So the kernel stays
    // inactive for 500 ms (the driver's first pause, 30 ms otherwise), time for every thread
    // of the block to wake on a loaded 2-core machine. One of six runs must report it (under a
    // parallel build, four runs once reported nothing, with no log kept; the panic keeps it).
    let pause = "std::this_thread::sleep_for(std::chrono::milliseconds(30));";
    assert!(DRIVER.contains(pause), "the driver's first pause moved");
    let driver = DRIVER.replacen(
        pause,
        "std::this_thread::sleep_for(std::chrono::milliseconds(500));",
        1,
    );
    let mut last = String::new();
    for attempt in 0..6 {
        let Some((ok, stdout, stderr)) =
            build_and_run_with(&dir, &format!("old_s_cmd_{attempt}"), &old, &driver)
        else {
            return;
        };
        if !ok && stderr.contains("ThreadSanitizer: data race") {
            finish(&dir);
            return;
        }
        last = format!("{stdout}\n{stderr}");
    }
    panic!("expected a data race report in one of 6 runs:\n{last}");
}

/// The bulk lanes under TSan (`DRV_BULK`): runs switch lanes between their LL and bulk paths
/// while the kernel runs (and parks, and runs again), a copy-engine thread copies staging into
/// the device rings and releases the bulk tails; every message exactly once, FIFO per lane,
/// and no race report between the copies, the kernel's device-ring reads and its head stores.
/// Twice: runs of 16 or more by the bulk path (as `auto`), and every message by it (as `on`);
/// the LL-only driver above is `off`.
#[test]
fn bulk_lanes_are_clean_under_thread_sanitizer() {
    let dir = work_dir("bulk");
    for (mode, threshold, batch) in [("auto", 16u32, 32u32), ("auto", 16, 256), ("on", 1, 256)] {
        let driver =
            format!("#define DRV_BULK 1\n#define DRV_BULK_THRESHOLD {threshold}\n{DRIVER}");
        let rendered = source(batch).render().unwrap();
        let Some((ok, stdout, stderr)) = build_and_run_with(
            &dir,
            &format!("tsan_bulk_{mode}_{batch}"),
            &rendered,
            &driver,
        ) else {
            return;
        };
        assert!(
            ok && !stderr.contains("ThreadSanitizer") && stdout.contains("bulk path:"),
            "{mode}, batch {batch}:\n{stdout}\n{stderr}"
        );
        println!("{mode}, batch {batch}: {}", stdout.trim());
    }
    finish(&dir);
}

/// Device-side forwarding under TSan: two blocks, the consumer taking the producer's output
/// ring through its peer-input slot, linked and unlinked over and over while messages flow
/// (with `call` replies the consumer must stop at), the host popping the ring between links.
/// Every message exactly once, FIFO on both paths, and no race report on the handoff.
#[test]
fn device_forwarding_handoff_is_clean_under_thread_sanitizer() {
    let dir = work_dir("peer");
    for &batch in &[32u32, 256] {
        let rendered = source(batch).render().unwrap();
        let Some((ok, stdout, stderr)) =
            build_and_run_with(&dir, &format!("tsan_peer_{batch}"), &rendered, PEER_DRIVER)
        else {
            return;
        };
        assert!(
            ok && !stderr.contains("ThreadSanitizer"),
            "batch {batch}:\n{stdout}\n{stderr}"
        );
        println!("batch {batch}: {}", stdout.trim());
    }
    finish(&dir);
}
