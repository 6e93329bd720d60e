//! Streaming PageRank's CUDA handler (`src/device/pagerank_stream.cu`: ticket waits, atomic
//! residual pushes, queue flags and counters, the pool allocator) under ThreadSanitizer: the
//! handler, compiled for CudaSim with g++ `-fsanitize=thread`, is driven by a C++ copy of the
//! host's protocol (`tests/sim/stream_tsan_driver.cpp`) on 8 threads per phase, with 500
//! changes on 6 hot sources per batch; the test fails on any TSan report, on a graph or counter
//! that differs from a sequential replay, or on ranks farther than `2 d/(1-d) N tol` from a
//! sequential power iteration.
//!
//! Needs g++ and libtsan (installed by `.ci/run`); without them the test prints `SKIP:` unless
//! `RESIDENT_REQUIRE_TSAN=1`. `RESIDENT_TSAN_KEEP=1` keeps the generated source and binary.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use resident::ring::DeviceMessage;
use resident_workloads::device::cuda::PAGERANK_STREAM_CU;
use resident_workloads::pagerank::{StreamAnswer, StreamCounters, StreamMsg};

const DRIVER: &str = include_str!("sim/stream_tsan_driver.cpp");

fn skip_or_fail(why: &str) {
    if std::env::var("RESIDENT_REQUIRE_TSAN").as_deref() == Ok("1") {
        panic!("RESIDENT_REQUIRE_TSAN=1 but {why}");
    }
    println!("SKIP: stream_tsan: {why}");
}

/// The declarations the ring-kernel template gives a handler: the message and state types,
/// the aliases, the envelope and the bound buffers (in `stream_kernel`'s order).
fn prelude() -> String {
    let mut s = String::new();
    for d in [
        StreamMsg::c_declarations(),
        StreamAnswer::c_declarations(),
        StreamCounters::c_declarations(),
    ] {
        s.push_str(&d);
        s.push('\n');
    }
    s.push_str(
        "typedef StreamCounters ResidentState;\ntypedef StreamMsg ResidentIn;\ntypedef StreamAnswer ResidentOut;\n\
         struct Envelope { unsigned long long message_id, correlation_id, timestamp_ns; unsigned int priority_flags, reserved1; };\n\
         struct ResidentBuffers {\n",
    );
    for name in ["ranks", "residual", "acc"] {
        s.push_str(&format!(
            "    double* {name}; unsigned long long {name}_len, {name}_id;\n"
        ));
    }
    for name in [
        "out_off", "out_len", "out_cap", "pool", "flags", "frontier", "src_seq",
    ] {
        s.push_str(&format!(
            "    unsigned int* {name}; unsigned long long {name}_len, {name}_id;\n"
        ));
    }
    s.push_str("};\n");
    s
}

#[test]
fn streaming_handler_is_clean_under_thread_sanitizer_and_matches_a_replay() {
    let Ok((cxx, _)) = resident::cuda::sim::compiler() else {
        skip_or_fail("no host C++ compiler");
        return;
    };
    let dir = std::env::temp_dir().join(format!("resident-stream-tsan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tu = resident::cuda::sim::translation_unit(
        "pagerank_stream",
        &format!(
            "{}\n#line 1 \"pagerank_stream.cu\"\n{PAGERANK_STREAM_CU}",
            prelude()
        ),
        &[],
    ) + "\n#line 1 \"stream_tsan_driver.cpp\"\n"
        + DRIVER;
    let (src, exe) = (dir.join("stream_tsan.cpp"), dir.join("stream_tsan"));
    std::fs::write(&src, tu).unwrap();
    let out = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O1",
            "-g",
            "-fsanitize=thread",
            "-pthread",
            "-o",
        ])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    if !out.status.success() {
        let log = String::from_utf8_lossy(&out.stderr);
        if log.contains("libtsan") || log.contains("-ltsan") {
            skip_or_fail(&format!("libtsan is missing: {log}"));
            return;
        }
        panic!("the TSan build failed:\n{log}");
    }
    let mut child = Command::new(&exe)
        .env("TSAN_OPTIONS", "halt_on_error=1 exitcode=66")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the TSan run timed out (a ticket or a round that never ends?)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    println!("{stdout}");
    assert!(
        status.success() && !stderr.contains("ThreadSanitizer"),
        "status {status:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("0 failed checks"), "{stdout}");
    if std::env::var("RESIDENT_TSAN_KEEP").as_deref() == Ok("1") {
        println!("kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
