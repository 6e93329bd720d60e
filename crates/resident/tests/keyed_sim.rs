//! Keyed kernels with a CUDA C handler, on `Backend::CudaSim` (the same CUDA source the GPU
//! runs, compiled by the host C++ compiler, one OS thread per CUDA thread): the handler gets its
//! key's state (`KeyState* ks`), one thread per message, per-key order kept on the device (no
//! host-side ticket), the states read back with `snapshot_key(s)`, 10^6 keys in one kernel, and
//! terminate accounting racing producers (the tests, shared with wgpu, are in `keyed_device/`).
//! The same source compiles with NVRTC for sm_90. Without a host C++ compiler the CudaSim tests
//! print `SKIP:` (and fail with `RESIDENT_REQUIRE_CUDASIM=1`); without NVRTC the NVRTC test
//! prints `SKIP:` (and fails with `RESIDENT_REQUIRE_NVRTC=1`). Nothing here was run on a GPU
//! (none was available).

mod keyed_device;

use keyed_device::{Engine, KMsg, KState};
use resident::backend::DeviceError;
use resident::cuda::persistent::PersistentError;
use resident::prelude::*;

/// No atomics: the template runs one key's messages one after another.
const CUDA_SRC: &str = r#"
__device__ bool handle(KeyState* ks, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    const unsigned int p = in->producer & 3u;
    if (in->seq < ks->next[p]) ks->out_of_order += 1u;
    ks->next[p] = in->seq + 1u;
    ks->handled += 1u;
    ks->sum += in->value;
    out->key = in->key;
    out->producer = in->producer;
    out->seq = in->seq;
    out->value = ks->handled;
    return true;
}
"#;

fn handler() -> CudaHandler<KMsg, KMsg> {
    CudaHandler::new(CUDA_SRC).keyed::<KState>("key")
}

const CUDASIM: Engine = Engine {
    file: "keyed_sim",
    label: "CudaSim",
    backend: Backend::CudaSim,
    kind: resident::backend::BackendKind::CudaSim,
    require: "RESIDENT_REQUIRE_CUDASIM",
    keyed: |k| k.key_cuda(handler()),
    plain: |k| k.cuda(CudaHandler::new(CUDA_SRC)),
    // Many messages of one key in every batch run as many rounds, and CudaSim's barrier is a
    // barrier of OS threads: small batches.
    few_keys_batch: 64,
};

/// Few keys (many messages of one key in every batch: as many rounds) and many keys (full
/// batches).
#[test]
fn per_key_order_on_the_device_with_many_producers() {
    keyed_device::per_key_order_with_many_producers(
        &CUDASIM,
        "per_key_order_on_the_device_with_many_producers",
    );
}

#[test]
fn key_range_snapshots_and_bulk_init() {
    keyed_device::key_range_snapshots_and_bulk_init(&CUDASIM, "key_range_snapshots_and_bulk_init");
}

/// 10^6 keys of 32 bytes (32 MB of device state) in one kernel.
#[test]
fn a_million_keys_on_the_device() {
    keyed_device::a_million_keys(&CUDASIM, "a_million_keys_on_the_device");
}

#[test]
fn terminate_racing_producers_on_the_device() {
    keyed_device::terminate_racing_producers(&CUDASIM, "terminate_racing_producers_on_the_device");
}

#[test]
fn keyed_handler_compiles_with_nvrtc_for_sm_90() {
    match handler().compile_ptx("keyed", 1024, "compute_90") {
        Ok(ptx) => {
            assert!(ptx.contains(".entry resident_persistent"));
            assert!(
                ptx.contains("atom.shared.max") || ptx.contains("atom.max"),
                "the round count"
            );
        }
        Err(e @ DeviceError::Cuda(PersistentError::NvrtcUnavailable(_)))
            if std::env::var("RESIDENT_REQUIRE_NVRTC").as_deref() != Ok("1") =>
        {
            println!("SKIP: keyed_sim::keyed_handler_compiles_with_nvrtc_for_sm_90: {e}");
        }
        Err(e) => panic!("the keyed handler does not compile: {e}"),
    }
    // The key field must name a C identifier; a wrong field is a compile error naming it.
    let wrong = CudaHandler::<KMsg, KMsg>::new(CUDA_SRC).keyed::<KState>("sensor");
    match wrong.compile_ptx("wrong", 64, "compute_90") {
        Err(DeviceError::Cuda(PersistentError::Compile { log, .. })) => {
            assert!(log.contains("sensor"), "{log}")
        }
        Err(DeviceError::Cuda(PersistentError::NvrtcUnavailable(_))) => {}
        other => panic!("a wrong key field must be a typed compile error: {other:?}"),
    }
}
