//! Keyed kernels with a WGSL handler on wgpu (lavapipe in CI): the handler gets its key's state
//! as `ptr<function, KeyState>` (loaded and stored back by the key's leader), one invocation per
//! message, per-key order kept on the device (the first message of each key in a batch leads
//! its key and follows the links the host made to the key's next messages; no host-side
//! ticket), the states read back with `snapshot_key(s)`, 10^6 keys in one kernel, and
//! terminate accounting racing producers (the tests, shared with CudaSim, are in
//! `keyed_device/`); here, batches past llvmpipe's loop cap (few keys, distinct keys, and one
//! key past it, which must fail the kernel typed and lose nothing). Without an adapter the tests print `SKIP:` (and fail with
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

/// Messages in one batch of the loop-cap cases: past the 65535 loop iterations an invocation
/// runs in all on llvmpipe (so a scan of the batch per invocation would be cut short there).
const PAST_CAP: u32 = 70_000;

/// What one batch of `msgs` did: the outputs published and the kernel's state after them.
struct OneBatch {
    h: KernelHandle<KMsg, KMsg>,
    outputs: Vec<KMsg>,
    _rt: Runtime,
}

/// Launches a keyed kernel of `keys` keys whose batch holds all of `msgs`, sends them while it
/// is inactive (so they go as one batch), lets it go and collects its outputs until all came,
/// the kernel failed, or `keyed_device::T` passed.
fn one_batch(test: &str, keys: u32, msgs: &[KMsg]) -> Option<OneBatch> {
    let rt = keyed_device::runtime(&WGPU, test)?;
    let h = rt
        .launch(
            keyed_device::kernel(&WGPU, test, keys)
                .queue_size(1 << 17)
                .batch_size(msgs.len())
                .backpressure(Backpressure::Block(keyed_device::T)),
        )
        .unwrap();
    h.activate().unwrap();
    h.deactivate().unwrap();
    let mut sent = 0;
    while sent < msgs.len() {
        sent += h.send_batch(&msgs[sent..]).unwrap();
    }
    h.activate().unwrap();
    let mut outputs = Vec::with_capacity(msgs.len());
    let deadline = std::time::Instant::now() + keyed_device::T;
    while outputs.len() < msgs.len() && std::time::Instant::now() < deadline {
        match h.receive(std::time::Duration::from_millis(100)) {
            Ok(o) => {
                outputs.push(o);
                h.receive_batch(&mut outputs, 4096).unwrap();
            }
            Err(_) if matches!(h.state(), KernelState::Failed(_)) => break,
            Err(_) => {}
        }
    }
    Some(OneBatch {
        h,
        outputs,
        _rt: rt,
    })
}

/// `per` messages to each of `keys` keys, the keys interleaved (key `i % keys`), numbered per
/// key by `seq`.
fn interleaved(keys: u32, per: u32) -> Vec<KMsg> {
    (0..keys * per)
        .map(|i| KMsg {
            key: i % keys,
            producer: 0,
            seq: i / keys,
            value: 1,
        })
        .collect()
}

/// Checks that every message of `msgs` ran once, each key's in order: outputs (`value` counts
/// the key's messages) and the states the device kept.
fn check_in_order(b: &OneBatch, keys: u32, msgs: &[KMsg]) {
    if let KernelState::Failed(reason) = b.h.state() {
        panic!("the kernel failed: {reason}");
    }
    assert_eq!(b.outputs.len(), msgs.len(), "every message answered once");
    let mut last: Vec<u32> = vec![0; keys as usize];
    for o in &b.outputs {
        let l = &mut last[o.key as usize];
        assert_eq!(o.value, *l + 1, "key {}: outputs out of order", o.key);
        assert_eq!(
            o.seq, *l,
            "key {}: message {} ran as the key's {}th",
            o.key, o.seq, *l
        );
        *l = o.value;
    }
    let mut per_key: Vec<u32> = vec![0; keys as usize];
    for m in msgs {
        per_key[m.key as usize] += 1;
    }
    let states: Vec<keyed_device::KState> = b.h.snapshot_keys(0..keys).unwrap();
    for (k, st) in states.iter().enumerate() {
        assert_eq!(st.out_of_order, 0, "key {k}: out of order on the device");
        assert_eq!(st.handled, per_key[k], "key {k}: messages handled");
        assert_eq!(st.next[0], per_key[k], "key {k}: last sequence number");
    }
}

/// One batch of 70 000 messages over 7 keys (10 000 each, interleaved): each key's leader runs
/// its own messages, in order. A leader that scanned the batch for its key's messages (the
/// entry point before the host linked each key's messages) ran 70 000 iterations and was cut
/// short on lavapipe, failing the kernel (seen: this test failed there).
#[test]
fn one_batch_past_the_loop_cap_over_few_keys() {
    let (keys, msgs) = (7, interleaved(7, PAST_CAP / 7));
    let Some(b) = one_batch("one_batch_past_the_loop_cap_over_few_keys", keys, &msgs) else {
        return;
    };
    check_in_order(&b, keys, &msgs);
    let report = b.h.terminate().unwrap();
    assert!(report.failure.is_none(), "{:?}", report.failure);
    assert_eq!(report.returned(), 0);
}

/// One batch of 70 000 messages, each to its own key: every message leads its key. Before the
/// host linked each key's messages, every leader scanned the messages before it (to learn that
/// it led) and then the rest of the batch (for its key's messages): 70 000 iterations, cut
/// short on lavapipe, failing the kernel (seen: this test failed there).
#[test]
fn one_batch_past_the_loop_cap_of_distinct_keys() {
    let msgs = interleaved(PAST_CAP, 1);
    let Some(b) = one_batch(
        "one_batch_past_the_loop_cap_of_distinct_keys",
        PAST_CAP,
        &msgs,
    ) else {
        return;
    };
    check_in_order(&b, PAST_CAP, &msgs);
    let report = b.h.terminate().unwrap();
    assert!(report.failure.is_none(), "{:?}", report.failure);
    assert_eq!(report.returned(), 0);
}

/// One key with 70 000 messages in one batch: its leader's walk is past llvmpipe's loop cap.
/// There the kernel fails with the typed cut-short fault and publishes nothing of the batch,
/// and the batch comes back whole in the report (never lost); a device without the cap runs
/// it all, in order.
#[test]
fn a_key_past_the_loop_cap_in_one_batch_fails_the_kernel() {
    let msgs = interleaved(1, PAST_CAP);
    let Some(b) = one_batch(
        "a_key_past_the_loop_cap_in_one_batch_fails_the_kernel",
        3,
        &msgs,
    ) else {
        return;
    };
    match b.h.state() {
        KernelState::Failed(reason) => {
            println!("cut short, as on llvmpipe: {reason}");
            assert!(reason.to_string().contains("65535"), "{reason}");
            assert!(
                b.outputs.is_empty(),
                "no output of the cut batch is published"
            );
            let report = b.h.terminate().unwrap();
            assert_eq!(
                report.returned(),
                msgs.len(),
                "the cut batch comes back whole"
            );
        }
        s => {
            println!("the device ran the whole batch ({s})");
            check_in_order(&b, 3, &msgs);
            b.h.terminate().unwrap();
        }
    }
}
