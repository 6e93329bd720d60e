//! Untrusted source (`persistent::untrusted`): nothing from the host's disk; and an external
//! function called through its pointer.

use super::*;

// ---- untrusted source (persistent::untrusted): nothing from the host's disk ----

/// Handlers that ask the compiler for a file of the host are refused before any compiler
/// runs: a device file that never ends, a host file whose lines an error would quote, a file
/// that includes itself, a 1 GB file, and the spellings that hide a directive. Each ends at
/// once with a typed error naming what was asked for, and quotes nothing of the file.
#[test]
fn hostile_includes_are_refused_before_any_compiler_runs() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("resident-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cycle = dir.join("cycle.h");
    std::fs::write(&cycle, format!("#include \"{}\"\n", cycle.display())).unwrap();
    let big = dir.join("big.h");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(1 << 30).unwrap(); // sparse: 1 GB of zeros, no disk used
    drop(f);
    let cases = [
        "#include \"/dev/zero\"".to_string(),
        "#include </etc/passwd>".to_string(),
        format!("#include \"{}\"", cycle.display()),
        format!("#include \"{}\"", big.display()),
        "%:include \"/etc/passwd\"".to_string(),
        "#  /* x */ inc\\\nlude \"/etc/passwd\"".to_string(),
        "#if __has_include(\"/etc/shadow\")\n#endif".to_string(),
    ];
    for inc in cases {
        let handler = format!("{inc}\n{DOUBLE}");
        let start = Instant::now();
        let e = launch_with("hostile", &handler, 32, cfg(1, 64, 64), None)
            .err()
            .unwrap_or_else(|| panic!("launched: {inc:?}"));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{inc:?} took {:?}",
            start.elapsed()
        );
        assert!(
            matches!(e, PersistentError::Include { line: 1, .. }),
            "{inc:?}: {e}"
        );
        let text = e.to_string();
        assert!(!text.contains("root:"), "{text}");
        assert!(text.len() < 400, "{text}");
        // The NVRTC path renders the same source first: refused the same way.
        let src = source("hostile", &handler, 32);
        assert!(matches!(src.render(), Err(PersistentError::Include { .. })));
    }
    let _ = std::fs::remove_dir_all(&dir);
    // NVRTC's own half-precision header is allowed (CudaSim's compiler has none: a compile
    // error naming it, no file of the host read).
    let e = launch_with(
        "fp16",
        &format!("#include <cuda_fp16.h>\n{DOUBLE}"),
        32,
        cfg(1, 64, 64),
        None,
    )
    .err()
    .expect("CudaSim has no cuda_fp16.h");
    assert!(
        matches!(e, PersistentError::Compile { .. }) && e.to_string().contains("cuda_fp16.h"),
        "{e}"
    );
}

/// The host form of an external handler (what a Numba `cfunc` is): out = in * 3 + state.n,
/// state.n += 1 per call (atomically: a batch's threads call it at once), odd inputs answered.
extern "C" fn triple(state: *mut u8, input: *const u8, out: *mut u8, _env: *const u8) -> i32 {
    // SAFETY: the template passes its state (a `Count`, 8 bytes, 8-aligned), the message's
    // `U64` payload and its output slot's payload, all valid for the call; `n` is only ever
    // touched atomically by the handler's callers.
    unsafe {
        let n = &*(state as *const std::sync::atomic::AtomicU64);
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let x = *(input as *const u64);
        *(out as *mut u64) = x * 3;
        (x % 2 == 1) as i32
    }
}

const CALLS_TRIPLE: &str = "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) { return ext_triple((void*)s, (const void*)in, (void*)out, (const void*)e) != 0; }";

#[test]
fn an_external_function_is_called_through_its_pointer() {
    use resident_engine_cuda::persistent::ExternalFn;
    let _serial = serial();
    let ext = |host_fn| ExternalFn {
        symbol: "ext_triple".into(),
        ltoir: None,
        host_fn,
    };
    let opts = SimLaunchOptions {
        queues: cfg(1, 256, 256),
        ..SimLaunchOptions::default()
    };
    let src =
        source("ext", CALLS_TRIPLE, 64).with_external(ext(Some(triple as *const () as usize)));
    let mut q = SimKernel::<u64, u64>::launch(&src, &[0u8; 8], &opts).unwrap();
    q.activate();
    let mut next = 0u64;
    let mut got: Vec<Slot<u64>> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 500 {
        assert!(Instant::now() < deadline, "timed out");
        if next < 1000 && q.send(env(next + 1, 7), next).is_ok() {
            next += 1;
        }
        q.receive_into(&mut got, 64);
    }
    let mut outs: Vec<u64> = got.iter().map(|s| s.payload).collect();
    outs.sort_unstable();
    assert_eq!(
        outs,
        (0..1000u64)
            .filter(|x| x % 2 == 1)
            .map(|x| x * 3)
            .collect::<Vec<_>>()
    );
    q.terminate(T).unwrap();
    let st = q.state_bytes().expect("state after terminate");
    assert_eq!(
        u64::from_ne_bytes(st[..8].try_into().unwrap()),
        1000,
        "one call per message"
    );
    // Without a host form the launch is refused with a typed error, before anything runs.
    let e = SimKernel::<u64, u64>::launch(
        &source("ext", CALLS_TRIPLE, 64).with_external(ext(None)),
        &[0u8; 8],
        &opts,
    )
    .err()
    .expect("no host form");
    assert!(
        matches!(e, PersistentError::Config { .. }) && e.to_string().contains("CudaSim"),
        "{e}"
    );
    // A symbol that is not a C identifier is refused by `validate`.
    let mut bad = ext(Some(triple as *const () as usize));
    bad.symbol = "ext triple".into();
    let e = source("ext", CALLS_TRIPLE, 64)
        .with_external(bad)
        .render()
        .unwrap_err();
    assert!(e.to_string().contains("not a C identifier"), "{e}");
}
