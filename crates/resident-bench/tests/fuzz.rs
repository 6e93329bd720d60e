//! Every fuzz target for a few thousand inputs (debug build), with the allocation bound
//! measured, and the named regressions of what fuzzing found.

use resident_bench::fuzz::{self, alloc::CountingAlloc, CrashKind, FuzzOptions, Target};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn fuzz_target(target: Target) {
    let opts = FuzzOptions {
        inputs: 2000,
        seed: 7,
        ..FuzzOptions::default()
    };
    let r = fuzz::run(target, &opts).unwrap();
    assert!(fuzz::alloc::installed());
    assert_eq!(r.inputs, 2000);
    assert!(
        r.crashes.is_empty(),
        "{target}: {} failing inputs, first: {:?}",
        r.crash_count,
        r.crashes.first()
    );
    assert!(!r.error_kinds.is_empty(), "{target}: no input was rejected");
    assert!(!r.accepted.is_empty(), "{target}: no input was accepted");
    assert!(r.alloc_peak.is_some());
    assert!(r.longest_error <= fuzz::MAX_ERROR_DISPLAY);
}

#[test]
fn fuzz_nats_codec() {
    fuzz_target(Target::NatsCodec);
}

#[test]
fn fuzz_edge_list() {
    fuzz_target(Target::EdgeList);
}

#[test]
fn fuzz_readings() {
    fuzz_target(Target::Readings);
}

#[test]
fn fuzz_layout() {
    fuzz_target(Target::Layout);
}

#[test]
fn fuzz_wgsl() {
    let opts = FuzzOptions {
        inputs: 300,
        seed: 7,
        ..FuzzOptions::default()
    };
    let r = fuzz::run(Target::Wgsl, &opts).unwrap();
    assert_eq!(r.crash_count, 0, "first: {:?}", r.crashes.first());
    assert!(
        r.accepted.contains_key("naga(handler module)"),
        "{:?}",
        r.accepted
    );
    assert!(r.accepted.contains_key("naga(source)"), "{:?}", r.accepted);
    assert!(r.longest_error <= fuzz::MAX_ERROR_DISPLAY);
}

/// The seed corpora are valid: every layout is declared, every handler compiles.
#[test]
fn layout_and_wgsl_corpora_are_accepted() {
    for t in [Target::Layout, Target::Wgsl] {
        let r = fuzz::run(
            t,
            &FuzzOptions {
                inputs: 4,
                ..FuzzOptions::default()
            },
        )
        .unwrap();
        assert_eq!(r.crash_count, 0, "{t}");
        if t == Target::Layout {
            assert_eq!(
                r.accepted.get("StructLayout::new"),
                Some(&4),
                "{:?}",
                r.error_kinds
            );
        } else {
            // Three ring handlers and one one-shot module.
            assert_eq!(
                r.accepted.get("naga(handler module)"),
                Some(&3),
                "{:?}",
                r.error_kinds
            );
            assert_eq!(
                r.accepted.get("naga(source)"),
                Some(&1),
                "{:?}",
                r.error_kinds
            );
        }
    }
}

/// Found by `resident fuzz --target layout` and `--target wgsl`: a WGSL layout error named a
/// long field whole, and naga's messages quoted long source lines whole.
#[test]
fn regression_layout_and_wgsl_errors_are_short() {
    let long = format!("T 1\n{} u1 - 0\n", "n".repeat(3000));
    assert_eq!(fuzz::replay(Target::Layout, long.as_bytes()), Ok(()));
    let src = format!("fn handle() -> u32 {{ return {}; }}\n", "(".repeat(3000));
    assert_eq!(fuzz::replay(Target::Wgsl, src.as_bytes()), Ok(()));
}

/// The cuda target: render for every input, NVRTC for the corpus and every 100th input here
/// (compiles are skipped, not failed, without NVRTC).
#[test]
fn fuzz_cuda() {
    let opts = FuzzOptions {
        inputs: 1000,
        seed: 7,
        compile_every: 100,
        ..FuzzOptions::default()
    };
    let r = fuzz::run(Target::Cuda, &opts).unwrap();
    assert_eq!(r.crash_count, 0, "first: {:?}", r.crashes.first());
    assert!(
        r.accepted.contains_key("KernelSource::render"),
        "{:?}",
        r.accepted
    );
    assert!(
        r.error_kinds
            .contains_key(&("KernelSource::render", "Config")),
        "{:?}",
        r.error_kinds
    );
    let compiles: u64 = r
        .accepted
        .iter()
        .filter(|(d, _)| d.starts_with("compile_ptx"))
        .map(|(_, n)| n)
        .chain(
            r.error_kinds
                .iter()
                .filter(|((d, _), _)| d.starts_with("compile_ptx"))
                .map(|(_, n)| n),
        )
        .chain(r.skipped.values())
        .sum();
    // The 5 corpus inputs and inputs 0, 100, ..., 900 (0 is a corpus input).
    assert_eq!(compiles, 14, "{:?} {:?}", r.accepted, r.error_kinds);
    assert!(r.longest_error <= fuzz::MAX_ERROR_DISPLAY);
    assert!(r.longest_compile_error <= fuzz::MAX_COMPILE_ERROR_DISPLAY);
}

/// The cuda seed corpus renders, and compiles where NVRTC is.
#[test]
fn cuda_corpus_is_accepted() {
    let r = fuzz::run(
        Target::Cuda,
        &FuzzOptions {
            inputs: 5,
            ..FuzzOptions::default()
        },
    )
    .unwrap();
    assert_eq!(r.crash_count, 0, "{:?}", r.crashes);
    assert_eq!(
        r.accepted.get("KernelSource::render"),
        Some(&5),
        "{:?}",
        r.error_kinds
    );
    if r.skipped.is_empty() {
        assert_eq!(
            r.accepted.get("compile_ptx(compute_90)"),
            Some(&5),
            "{:?}",
            r.error_kinds
        );
    }
}

/// Found by `resident fuzz --target cuda`: a compile error kept NVRTC's whole log (a 1 MB line
/// holding 100 typos: 105 MB) and the kernel's whole name; a source nesting brackets 1024 deep
/// overflowed NVRTC's stack and aborted the process.
#[test]
fn regression_fuzz_cuda_errors_are_short_and_deep_sources_are_refused() {
    let typos: String = (0..100).map(|i| format!("undefined_{i} + ")).collect();
    let handler = format!(
        "__device__ bool handle(FuzzState* s, const FuzzIn* in, FuzzOut* out, const Envelope* env) {{\n    out->x = {typos}in->x; /*{}*/\n    return true;\n}}\n",
        "c".repeat(1 << 20)
    );
    assert_eq!(fuzz::replay(Target::Cuda, handler.as_bytes()), Ok(()));
    let name = format!("//fuzz:name\n{}", "n-".repeat(1 << 19));
    assert_eq!(fuzz::replay(Target::Cuda, name.as_bytes()), Ok(()));
    let deep = format!(
        "__device__ bool handle(FuzzState* s, const FuzzIn* in, FuzzOut* out, const Envelope* env) {{\n    out->x = {}in->x{};\n    return true;\n}}\n",
        "(".repeat(1 << 20),
        ")".repeat(1 << 20)
    );
    assert_eq!(fuzz::replay(Target::Cuda, deep.as_bytes()), Ok(()));
}

#[test]
fn runs_are_deterministic_and_names_round_trip() {
    let opts = FuzzOptions {
        inputs: 300,
        seed: 3,
        ..FuzzOptions::default()
    };
    let a = fuzz::run(Target::EdgeList, &opts).unwrap();
    let b = fuzz::run(Target::EdgeList, &opts).unwrap();
    assert_eq!(a.error_kinds, b.error_kinds);
    assert_eq!(a.accepted, b.accepted);
    for t in Target::ALL {
        assert_eq!(Target::from_name(t.name()).unwrap(), t);
    }
    assert!(Target::from_name("nope").is_err());
}

/// Replaying a valid and a rejected input: both pass (a typed, short rejection is no failure).
#[test]
fn replay_passes_valid_and_typed_rejections() {
    assert_eq!(fuzz::replay(Target::EdgeList, b"0 1\n1 2\n"), Ok(()));
    assert_eq!(fuzz::replay(Target::Readings, b"x\n"), Ok(()));
}

/// Found by `resident fuzz --target nats-codec`: serde_json quotes an offending string whole,
/// so a JSON string payload of 1 MB sent to a `JsonCodec<u32, _>` worker came back as a 1 MB
/// error reply (`DecodeError::Json`); and a reply with the error header but a body that is not
/// an `ErrorReply` was quoted whole by `parse_reply`.
#[test]
fn regression_nats_json_error_quotes_the_whole_string() {
    let payload = format!("\"{}\"", "x".repeat(1 << 20));
    assert_eq!(fuzz::replay(Target::NatsCodec, payload.as_bytes()), Ok(()));
    let order = format!(
        "{{\"id\":1,\"side\":\"{}\",\"price\":1,\"qty\":1}}",
        "s".repeat(100_000)
    );
    assert_eq!(fuzz::replay(Target::NatsCodec, order.as_bytes()), Ok(()));
    let reply = format!("busy\n{}", "y".repeat(100_000));
    assert_eq!(fuzz::replay(Target::NatsCodec, reply.as_bytes()), Ok(()));
}

/// Found by `resident fuzz --target edge-list` / `readings` (and the issue's `resident demo
/// pagerank --graph` on a 50 MB line): a bad line or field was quoted whole in the error.
#[test]
fn regression_edge_list_and_readings_quote_a_whole_line() {
    let long = "9".repeat(1 << 20);
    for input in [
        format!("{long}x 1\n"),
        format!("1 2 {long}\n"),
        format!("{long}\n"),
    ] {
        assert_eq!(fuzz::replay(Target::EdgeList, input.as_bytes()), Ok(()));
    }
    for input in [
        format!("{long}\n"),
        format!("1,{long}x\n"),
        format!("1,{long}e999\n"),
    ] {
        assert_eq!(fuzz::replay(Target::Readings, input.as_bytes()), Ok(()));
    }
}

#[test]
fn crash_kinds_print_short() {
    let k = CrashKind::LongError {
        decoder: "d",
        kind: "K",
        bytes: 600,
        max: 512,
    };
    assert!(k.to_string().contains("600") && k.to_string().contains("at most 512"));
}

/// The report of a run is the same on one job as on several (but for its seconds): one thread
/// draws the inputs in order whatever the number of jobs.
#[test]
fn jobs_do_not_change_the_report() {
    for (target, inputs, compile_every) in [
        (Target::NatsCodec, 3000, 0),
        (Target::Layout, 3000, 0),
        (Target::Cuda, 400, 100),
    ] {
        let report = |jobs: usize| {
            let opts = FuzzOptions {
                inputs,
                seed: 11,
                compile_every,
                jobs: std::num::NonZeroUsize::new(jobs).unwrap(),
                ..FuzzOptions::default()
            };
            let mut json = fuzz::run(target, &opts).unwrap().to_json();
            json.as_object_mut().unwrap().remove("seconds");
            json
        };
        let one = report(1);
        assert_eq!(one["inputs"], inputs);
        assert_eq!(report(3), one, "{target}");
    }
}

/// Progress is reported while a run goes, with the inputs judged so far.
#[test]
fn progress_is_reported() {
    let seen = std::sync::Mutex::new(Vec::new());
    let opts = FuzzOptions {
        inputs: 4096,
        jobs: std::num::NonZeroUsize::new(2).unwrap(),
        progress_every: Some(std::time::Duration::ZERO),
        ..FuzzOptions::default()
    };
    let r = fuzz::run_with_progress(Target::EdgeList, &opts, &|p| {
        seen.lock().unwrap().push((p.judged, p.inputs))
    })
    .unwrap();
    assert_eq!(r.crash_count, 0);
    let seen = seen.into_inner().unwrap();
    // A report every 256 inputs drawn (the last one after the last input is drawn).
    assert_eq!(seen.len(), 16, "{seen:?}");
    assert!(
        seen.iter().all(|&(j, n)| j <= 4096 && n == 4096),
        "{seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
}
