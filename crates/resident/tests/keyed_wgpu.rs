//! Keyed kernels with a WGSL handler on wgpu (lavapipe in CI): the handler gets its key's state
//! as `ptr<function, KeyState>` (loaded and stored back by the key's leader), one invocation per
//! message, per-key order kept on the device (the first message of each key in a batch leads
//! its key; no host-side ticket), the states read back with `snapshot_key(s)`, 10^6 keys in one
//! kernel, and terminate accounting racing producers (the tests, shared with CudaSim, are in
//! `keyed_device/`). Without an adapter the tests print `SKIP:` (and fail with
//! `RESIDENT_REQUIRE_WGPU=1`).

mod keyed_device;

use keyed_device::{Engine, KMsg};
use resident::prelude::*;

/// Plain loads and stores: the key's leader runs its messages one after another.
const WGSL_SRC: &str = r#"
fn handle(ks: ptr<function, KeyState>, input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    let p = input.producer & 3u;
    if (input.seq < (*ks).next[p]) { (*ks).out_of_order += 1u; }
    (*ks).next[p] = input.seq + 1u;
    (*ks).handled += 1u;
    (*ks).sum += input.value;
    (*out).key = input.key;
    (*out).producer = input.producer;
    (*out).seq = input.seq;
    (*out).value = (*ks).handled;
    return true;
}
"#;

const WGPU: Engine = Engine {
    file: "keyed_wgpu",
    label: "the wgpu backend",
    backend: Backend::Wgpu,
    kind: resident::backend::BackendKind::Wgpu,
    require: "RESIDENT_REQUIRE_WGPU",
    keyed: |k| k.key_wgsl(WgslHandler::<KMsg, KMsg>::new(WGSL_SRC).keyed("key")),
    plain: |k| k.wgsl(WgslHandler::new(WGSL_SRC)),
    few_keys_batch: 256,
};

/// Few keys (one leader runs hundreds of messages of its key per batch) and many keys.
#[test]
fn per_key_order_on_wgpu_with_many_producers() {
    keyed_device::per_key_order_with_many_producers(
        &WGPU,
        "per_key_order_on_wgpu_with_many_producers",
    );
}

#[test]
fn key_range_snapshots_and_bulk_init() {
    keyed_device::key_range_snapshots_and_bulk_init(&WGPU, "key_range_snapshots_and_bulk_init");
}

/// 10^6 keys of 32 bytes (32 MB of storage buffer) in one kernel.
#[test]
fn a_million_keys_on_wgpu() {
    keyed_device::a_million_keys(&WGPU, "a_million_keys_on_wgpu");
}

#[test]
fn terminate_racing_producers_on_wgpu() {
    keyed_device::terminate_racing_producers(&WGPU, "terminate_racing_producers_on_wgpu");
}
