//! Streaming PageRank's CUDA handler (`src/pagerank/pagerank_stream.cu`: ticket waits, atomic
//! residual pushes, queue flags and counters, the pool allocator) under ThreadSanitizer: the
//! handler, compiled for CudaSim with g++ `-fsanitize=thread`, is driven by a C++ copy of the
//! host's protocol (`tests/sim/stream_tsan_driver.cpp`) on 8 threads per phase, with 500
//! changes on 6 hot sources per batch; the test fails on any TSan report, on a graph or counter
//! that differs from a sequential replay, or on ranks farther than `2 d/(1-d) N tol` from a
//! sequential power iteration.
//!
//! Needs g++ and libtsan (installed by `.ci/run`); without them the test prints `SKIP:` unless
//! `RESIDENT_REQUIRE_TSAN=1`. `RESIDENT_TSAN_KEEP=1` keeps the generated source and binary.

use std::time::Duration;

use resident::cuda::sim::{run_under_tsan, TsanError};
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
    let run = match run_under_tsan(&dir, "stream_tsan", &tu, Duration::from_secs(600)) {
        Ok(r) => r,
        Err(TsanError::Unavailable(why)) => return skip_or_fail(&why.to_string()),
        Err(e) => panic!("{e}"),
    };
    println!("{}", run.stdout);
    assert!(
        run.clean(),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    assert!(run.stdout.contains("0 failed checks"), "{}", run.stdout);
    if std::env::var("RESIDENT_TSAN_KEEP").as_deref() == Ok("1") {
        println!("kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
