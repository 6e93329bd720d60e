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
        Err(e)
            if matches!(&e, DeviceError::Cuda(c) if matches!(c.downcast_ref(), Some(PersistentError::NvrtcUnavailable(_))))
                && std::env::var("RESIDENT_REQUIRE_NVRTC").as_deref() != Ok("1") =>
        {
            println!("SKIP: keyed_sim::keyed_handler_compiles_with_nvrtc_for_sm_90: {e}");
        }
        Err(e) => panic!("the keyed handler does not compile: {e}"),
    }
    // The key field must name a C identifier; a wrong field is a compile error naming it.
    let wrong = CudaHandler::<KMsg, KMsg>::new(CUDA_SRC).keyed::<KState>("sensor");
    match wrong.compile_ptx("wrong", 64, "compute_90") {
        Err(DeviceError::Cuda(c))
            if matches!(c.downcast_ref(), Some(PersistentError::Compile { .. })) =>
        {
            let Some(PersistentError::Compile { log, .. }) = c.downcast_ref() else {
                unreachable!()
            };
            assert!(log.contains("sensor"), "{log}")
        }
        Err(DeviceError::Cuda(c))
            if matches!(c.downcast_ref(), Some(PersistentError::NvrtcUnavailable(_))) => {}
        other => panic!("a wrong key field must be a typed compile error: {other:?}"),
    }
}

/// A keyed kernel survives being parked and relaunched again and again while it works: every
/// CudaSim launch parks every resident kernel of the device first (the residency rule) and
/// relaunches it where it left off. Another thread launches and terminates kernels while the
/// producers send (they go on until it has done so 5 times); every message still comes out
/// once, in its key's order, and the states on the device agree.
#[test]
fn keyed_kernel_survives_relaunches_while_it_works() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
    use std::sync::Arc;
    let Some(rt) =
        keyed_device::runtime(&CUDASIM, "keyed_kernel_survives_relaunches_while_it_works")
    else {
        return;
    };
    let rt = Arc::new(rt);
    let (keys, producers, relaunches_wanted) = (16u32, 4u32, 5u32);
    let h = rt
        .launch(
            keyed_device::kernel(&CUDASIM, "parked-often", keys)
                .batch_size(64)
                .backpressure(Backpressure::Block(keyed_device::T)),
        )
        .unwrap();
    h.activate().unwrap();
    let relaunched_before = resident::cuda::persistent::sim::relaunch_count();
    let done = Arc::new(AtomicBool::new(false));
    let disturber_ended = Arc::new(AtomicBool::new(false));
    let relaunches = Arc::new(AtomicU32::new(0));
    // Each round launches and terminates another kernel beside it (the first loads a module:
    // every resident kernel parks for that; the later ones wait for no kernel) and reads this
    // kernel's key states, which parks it between two batches and relaunches it.
    let disturber = {
        let (rt, done, relaunches, h) = (rt.clone(), done.clone(), relaunches.clone(), h.clone());
        let ended = disturber_ended.clone();
        std::thread::spawn(move || {
            // If this thread fails, the producers must not wait for its rounds forever.
            struct Ended(Arc<AtomicBool>);
            impl Drop for Ended {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Release);
                }
            }
            let _ended = Ended(ended);
            let mut i = 0;
            while !done.load(Ordering::Acquire) {
                let k = rt
                    .launch(keyed_device::kernel(&CUDASIM, &format!("disturb-{i}"), 4))
                    .unwrap();
                k.terminate().unwrap();
                let _: Vec<KState> = h.snapshot_keys(0..keys).unwrap();
                relaunches.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        })
    };
    // The receiver takes outputs until it has as many as the producers sent (known once they
    // have all finished).
    let total = Arc::new(AtomicUsize::new(usize::MAX));
    let receiver = {
        let (h, total) = (h.clone(), total.clone());
        std::thread::spawn(move || {
            let mut outs = Vec::new();
            let mut longest_gap = std::time::Duration::ZERO;
            while outs.len() < total.load(Ordering::Acquire) {
                let t = std::time::Instant::now();
                match h.receive(std::time::Duration::from_millis(200)) {
                    Ok(m) => {
                        outs.push(m);
                        longest_gap = longest_gap.max(t.elapsed());
                    }
                    Err(Error::Timeout { .. }) => {}
                    Err(e) => panic!("receive: {e}"),
                }
            }
            (outs, longest_gap)
        })
    };
    let senders: Vec<_> = (0..producers)
        .map(|p| {
            let (h, relaunches, ended) = (h.clone(), relaunches.clone(), disturber_ended.clone());
            std::thread::spawn(move || {
                let mut next = vec![0u32; keys as usize];
                let mut i = 0u32;
                while i < 1000
                    || (relaunches.load(Ordering::Relaxed) < relaunches_wanted
                        && !ended.load(Ordering::Acquire))
                {
                    let key = (i * 7 + p * 5) % keys;
                    h.send(KMsg {
                        key,
                        producer: p,
                        seq: next[key as usize],
                        value: 1,
                    })
                    .unwrap();
                    next[key as usize] += 1;
                    i += 1;
                }
                next
            })
        })
        .collect();
    let sent: Vec<Vec<u32>> = senders.into_iter().map(|s| s.join().unwrap()).collect();
    let n = relaunches.load(Ordering::Relaxed);
    done.store(true, Ordering::Release);
    disturber.join().unwrap();
    let sum: usize = sent.iter().flatten().map(|&c| c as usize).sum();
    total.store(sum, Ordering::Release);
    let (outs, longest_gap) = receiver.join().unwrap();
    assert_eq!(outs.len(), sum);
    let mut last: HashMap<u32, u32> = HashMap::new();
    for o in &outs {
        let l = last.entry(o.key).or_insert(0);
        assert_eq!(o.value, *l + 1, "key {}: outputs out of order", o.key);
        *l = o.value;
    }
    let states: Vec<KState> = h.snapshot_keys(0..keys).unwrap();
    for (k, st) in states.iter().enumerate() {
        assert_eq!(st.out_of_order, 0, "key {k}: {st:?}");
        for (p, s) in sent.iter().enumerate() {
            assert_eq!(st.next[p], s[k], "key {k} producer {p}");
        }
    }
    let report = h.terminate().unwrap();
    assert!(report.failure.is_none(), "{:?}", report.failure);
    assert_eq!(report.returned(), 0);
    println!(
        "keyed kernel parked and relaunched in {n} rounds of other kernels' launches and key \
         snapshots while it handled {sum} messages; longest wait for one output {longest_gap:?}"
    );
    assert!(n >= relaunches_wanted);
    // Each round parked and relaunched this kernel (at least: its key snapshot).
    let relaunched = resident::cuda::persistent::sim::relaunch_count() - relaunched_before;
    assert!(
        relaunched >= n as u64,
        "{relaunched} relaunches for {n} rounds"
    );
}
