//! The template linked with a function compiled outside it (what a Numba handler is on a GPU):
//! NVRTC makes LTO-IR of both, nvJitLink links them into one CUBIN. No GPU needed.
//!
//! Without NVRTC or nvJitLink the tests print `SKIP: ...` and return, unless
//! `RESIDENT_REQUIRE_NVJITLINK=1` (both are then required) or `RESIDENT_REQUIRE_NVRTC=1` (NVRTC
//! is), in which case they fail. Run with both libraries' folders on `LD_LIBRARY_PATH` (NVRTC's
//! first), or name nvJitLink in `RESIDENT_NVJITLINK`.

use resident_cuda::{CompileOptions, CudaError, MAX_LOG_BYTES};
use resident_engine_cuda::persistent::template::{
    link_cubin, nvjitlink_available, nvrtc_available,
};
use resident_engine_cuda::persistent::{ExternalFn, KernelSource, MessageDecl, PersistentError};

fn required(var: &str) -> bool {
    std::env::var(var).as_deref() == Ok("1")
}

/// Whether to run; panics when a library is required but missing.
fn libraries_or_skip() -> bool {
    if let Err(e) = nvrtc_available() {
        if required("RESIDENT_REQUIRE_NVJITLINK") || required("RESIDENT_REQUIRE_NVRTC") {
            panic!(
                "NVRTC is required (RESIDENT_REQUIRE_NVJITLINK / RESIDENT_REQUIRE_NVRTC) but {e}"
            );
        }
        eprintln!("SKIP: {e}");
        return false;
    }
    if let Err(e) = nvjitlink_available() {
        if required("RESIDENT_REQUIRE_NVJITLINK") {
            panic!("RESIDENT_REQUIRE_NVJITLINK=1 but {e}");
        }
        eprintln!("SKIP: {e}");
        return false;
    }
    true
}

/// A standalone CUDA C file standing in for Numba's output: `symbol` with the external
/// function's C signature.
fn external_source(symbol: &str) -> String {
    format!(
        "extern \"C\" __device__ int {symbol}(void* state, const void* in, void* out, const void* env) {{\n\
         \x20   unsigned int x = *(const unsigned int*)in;\n\
         \x20   atomicAdd((unsigned int*)state, 1u);\n\
         \x20   *(unsigned int*)out = x * 2u + 1u;\n\
         \x20   return (x & 1u) == 0u;\n\
         }}\n"
    )
}

/// LTO-IR of [`external_source`] for `arch`, from NVRTC.
fn external_ltoir(symbol: &str, arch: &str) -> Vec<u8> {
    let opts = CompileOptions::for_arch(arch);
    let ir = resident_cuda::compile_ltoir(&external_source(symbol), "ext.cu", &opts)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!ir.is_empty());
    ir
}

/// A ring kernel whose handler calls `ext_handle`, linked from `ltoir`.
fn source(ltoir: Option<(String, Vec<u8>)>) -> KernelSource {
    KernelSource::new(
        "numba_ping",
        MessageDecl::new("Ping", "typedef struct { unsigned int x; } Ping;", 4),
        MessageDecl::new("Ping", "", 4),
        MessageDecl::new("St", "typedef struct { unsigned int n; } St;", 4),
        "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) { return ext_handle(s, in, out, env) != 0; }\n",
        128,
    )
    .with_external(ExternalFn {
        symbol: "ext_handle".into(),
        ltoir,
        host_fn: None,
    })
}

#[test]
fn nvjitlink_is_version_13() {
    if !libraries_or_skip() {
        return;
    }
    let (major, minor) = resident_cuda::nvjitlink_version().unwrap();
    eprintln!("nvJitLink {major}.{minor}");
    assert_eq!(major, 13);
}

#[test]
fn template_and_external_function_link_into_an_sm90_cubin() {
    if !libraries_or_skip() {
        return;
    }
    let src = source(Some((
        "sm_90".into(),
        external_ltoir("ext_handle", "sm_90"),
    )));
    let start = std::time::Instant::now();
    let cubin = link_cubin(&src, "sm_90").unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "link_cubin (template + external, NVRTC + nvJitLink): {:?}, {} bytes",
        start.elapsed(),
        cubin.len()
    );
    assert!(
        cubin.starts_with(b"\x7fELF"),
        "{:?}",
        &cubin[..16.min(cubin.len())]
    );
    // Both kernels of the template are in the image.
    for entry in ["resident_persistent", "resident_batch"] {
        assert!(
            cubin.windows(entry.len()).any(|w| w == entry.as_bytes()),
            "{entry} not in the CUBIN"
        );
    }
}

#[test]
fn a_missing_symbol_is_a_typed_link_error_naming_it() {
    if !libraries_or_skip() {
        return;
    }
    let src = source(Some((
        "sm_90".into(),
        external_ltoir("another_name", "sm_90"),
    )));
    match link_cubin(&src, "sm_90") {
        Err(e @ PersistentError::Link { .. }) => {
            let PersistentError::Link { log, arch, .. } = &e else {
                unreachable!()
            };
            assert!(log.len() <= MAX_LOG_BYTES, "{} bytes", log.len());
            assert!(log.contains("ext_handle"), "{log}");
            assert_eq!(arch, "sm_90");
            let text = e.to_string();
            assert!(
                text.contains("numba_ping") && text.contains("ext_handle"),
                "{text}"
            );
            eprintln!("{text}");
        }
        other => panic!("expected a link error, got {:?}", other.map(|c| c.len())),
    }
}

#[test]
fn garbage_lto_ir_is_a_typed_error() {
    if !libraries_or_skip() {
        return;
    }
    for garbage in [
        b"this is not LTO-IR".to_vec(),
        vec![0u8; 4096],
        (0..=255u8).cycle().take(100_000).collect(),
        b"\x7fELF\x02\x01\x01".to_vec(),
    ] {
        let src = source(Some(("sm_90".into(), garbage.clone())));
        match link_cubin(&src, "sm_90") {
            Err(e @ PersistentError::Link { .. }) => {
                let text = e.to_string();
                assert!(text.len() <= MAX_LOG_BYTES + 512, "{} bytes", text.len());
                eprintln!("{} bytes of garbage: {text}", garbage.len());
            }
            other => panic!("expected a link error, got {:?}", other.map(|c| c.len())),
        }
    }
}

#[test]
fn an_arch_mismatch_is_a_typed_config_error() {
    // Checked before either library is loaded: runs everywhere.
    let src = source(Some(("sm_80".into(), b"whatever".to_vec())));
    match link_cubin(&src, "sm_90") {
        Err(e @ PersistentError::Config { .. }) => {
            let text = e.to_string();
            assert!(text.contains("sm_80") && text.contains("sm_90"), "{text}");
        }
        other => panic!("expected a config error, got {:?}", other.map(|c| c.len())),
    }
    // No LTO-IR at all, or no external function: the same.
    assert!(matches!(
        link_cubin(&source(None), "sm_90"),
        Err(PersistentError::Config { .. })
    ));
    let mut plain = source(None);
    plain.external = None;
    assert!(matches!(
        link_cubin(&plain, "sm_90"),
        Err(PersistentError::Config { .. })
    ));
    // The external function's LTO-IR must name exactly the architecture linked for.
    let src = source(Some(("compute_90".into(), b"whatever".to_vec())));
    assert!(matches!(
        link_cubin(&src, "sm_90"),
        Err(PersistentError::Config { .. })
    ));
    // Machine code is for one real architecture: compute_90 is refused.
    let src = source(Some(("compute_90".into(), b"whatever".to_vec())));
    assert!(matches!(
        link_cubin(&src, "compute_90"),
        Err(PersistentError::Config { .. })
    ));
}

#[test]
fn the_low_level_link_refuses_bad_arguments() {
    if !libraries_or_skip() {
        return;
    }
    let ir = external_ltoir("ext_handle", "sm_90");
    for (arch, inputs) in [
        ("compute_90", vec![("a", ir.as_slice())]),
        ("sm_90 -lto", vec![("a", ir.as_slice())]),
        ("sm_90", vec![]),
        ("sm_90", vec![("a", &[][..])]),
        ("sm_90", vec![("a\0b", ir.as_slice())]),
    ] {
        match resident_cuda::link_cubin(arch, &inputs) {
            Err(CudaError::InvalidArgument { .. }) => {}
            other => panic!("{arch}: expected an invalid argument, got {other:?}"),
        }
    }
    // One input alone links (nothing is undefined in it).
    let cubin = resident_cuda::link_cubin("sm_90", &[("ext.ltoir", &ir)]).unwrap();
    assert!(cubin.starts_with(b"\x7fELF"));
    // LTO-IR for sm_90 linked for sm_80: nvJitLink's typed error.
    match resident_cuda::link_cubin("sm_80", &[("ext.ltoir", &ir)]) {
        Err(e @ CudaError::JitLink { .. }) => eprintln!("{e}"),
        other => panic!(
            "expected an nvJitLink error, got {:?}",
            other.map(|c| c.len())
        ),
    }
}

/// C names carry no types: a function of the right name with another signature links (LTO
/// calls it through a cast, which is undefined behaviour on the device). Whoever makes the
/// LTO-IR must give it [`resident_engine_cuda::persistent::EXTERNAL_FN_SIGNATURE`]; this test pins
/// what nvJitLink does, so a version that starts refusing it is noticed.
#[test]
fn a_mismatched_signature_is_not_caught_by_the_link() {
    if !libraries_or_skip() {
        return;
    }
    let opts = CompileOptions::for_arch("sm_90");
    let wrong = "extern \"C\" __device__ float ext_handle(float a, int b) { return a * b; }\n";
    let ir = resident_cuda::compile_ltoir(wrong, "ext.cu", &opts).unwrap();
    let linked = link_cubin(&source(Some(("sm_90".into(), ir))), "sm_90");
    assert!(
        linked.is_ok(),
        "nvJitLink now refuses a mismatched signature: {:?}",
        linked.err().map(|e| e.to_string())
    );
    // A variable of that name is refused (NVVM finds the call broken): the typed link error.
    let variable = "extern \"C\" __device__ int ext_handle = 3;\n";
    let ir = resident_cuda::compile_ltoir(variable, "ext.cu", &opts).unwrap();
    match link_cubin(&source(Some(("sm_90".into(), ir))), "sm_90") {
        Err(PersistentError::Link { log, .. }) => assert!(log.len() <= MAX_LOG_BYTES),
        other => panic!("expected a link error, got {:?}", other.map(|c| c.len())),
    }
}
