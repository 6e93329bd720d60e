//! Keyed kernels on the CPU engine against the same logic in a one-thread kernel whose state is a
//! `Vec` indexed by key, in one run, alternated, with per-key order verified after every run.
//!
//! ```text
//! cargo bench -p resident --bench keyed -- [--keys N] [--messages N] [--repeats N]
//!     [--work N] [--device-messages N] [--out FILE]
//! ```
//!
//! `--device-messages N` (default 10^6 on wgpu, a fifth of it on CudaSim; 0 skips) also runs a
//! keyed kernel with a device handler over the same keys on wgpu and CudaSim, where present,
//! for correctness (per-key order verified) and a throughput figure of that engine here.
//!
//! `--work` adds N rounds of integer mixing per message to the handler (0: the statistics update
//! alone), to show how the speed-up depends on how much a handler does.

use std::time::{Duration, Instant};

use resident::prelude::*;

device_message! {
    /// A reading for key `key`: the `seq`-th message sent to that key.
    pub struct Reading { pub key: u32, pub seq: u32, pub value: f32, pub pad: u32 }
}

impl Keyed for Reading {
    fn key(&self) -> u32 {
        self.key
    }
}

/// Per-key statistics (24 bytes): count, running mean and M2 (Welford), order violations.
#[derive(Clone, Copy, Default)]
struct Stats {
    count: u32,
    out_of_order: u32,
    mean: f64,
    m2: f64,
}

#[inline]
fn update(st: &mut Stats, m: &Reading, work: u32) {
    if st.count != m.seq {
        st.out_of_order += 1;
    }
    st.count += 1;
    let mut x = m.value as f64;
    if work > 0 {
        let mut h = m.key as u64 ^ ((m.seq as u64) << 32);
        for _ in 0..work {
            h = (h ^ (h >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        x += (h & 1) as f64 * 1e-9;
    }
    let d = x - st.mean;
    st.mean += d / st.count as f64;
    st.m2 += d * (x - st.mean);
}

struct Args {
    keys: u32,
    messages: usize,
    repeats: usize,
    work: u32,
    device_messages: usize,
    out: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        keys: 1_000_000,
        messages: 10_000_000,
        repeats: 3,
        work: 0,
        device_messages: 1_000_000,
        out: None,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let next = |i: usize| v.get(i + 1).cloned().unwrap_or_default();
        match v[i].as_str() {
            "--keys" => a.keys = next(i).parse().expect("--keys N"),
            "--messages" => a.messages = next(i).parse().expect("--messages N"),
            "--repeats" => a.repeats = next(i).parse().expect("--repeats N"),
            "--work" => a.work = next(i).parse().expect("--work N"),
            "--device-messages" => {
                a.device_messages = next(i).parse().expect("--device-messages N")
            }
            "--out" => a.out = Some(next(i)),
            _ => {
                i += 1;
                continue;
            } // cargo bench passes --bench
        }
        i += 2;
    }
    a
}

/// The messages, over random keys, each with its per-key sequence number.
fn workload(keys: u32, n: usize) -> (Vec<Reading>, Vec<u32>) {
    let mut per_key = vec![0u32; keys as usize];
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let msgs = (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % keys as u64) as u32;
            let seq = per_key[key as usize];
            per_key[key as usize] += 1;
            Reading {
                key,
                seq,
                value: (i % 1000) as f32 * 0.01,
                pad: 0,
            }
        })
        .collect();
    (msgs, per_key)
}

fn feed(h: &KernelHandle<Reading, u32>, msgs: &[Reading]) -> f64 {
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < msgs.len() {
        let end = (sent + 4096).min(msgs.len());
        sent += h.send_batch(&msgs[sent..end]).expect("send_batch");
    }
    h.drain(Duration::from_secs(600)).expect("drain");
    t0.elapsed().as_secs_f64()
}

fn verify(states: &[Stats], per_key: &[u32]) {
    for (k, (st, want)) in states.iter().zip(per_key).enumerate() {
        assert_eq!(st.out_of_order, 0, "key {k}: out of order");
        assert_eq!(st.count, *want, "key {k}: count");
    }
}

fn run_keyed(rt: &Runtime, a: &Args, workers: usize, msgs: &[Reading], per_key: &[u32]) -> f64 {
    let work = a.work;
    let h = rt
        .launch(
            RingKernel::<Reading, u32>::new(format!("keyed-{workers}"))
                .queue_size(16384)
                .priority_lanes(1)
                .keyed(a.keys, Stats::default())
                .batch_size(8192)
                .workers(workers)
                .key_handler(move |ks: &mut KeyContext<Stats>, m: Reading| {
                    update(ks.state_mut(), &m, work);
                    None
                }),
        )
        .expect("launch");
    h.activate().unwrap();
    let secs = feed(&h, msgs);
    let mut states = Vec::with_capacity(a.keys as usize);
    let mut k = 0u32;
    while k < a.keys {
        let end = (k as u64 + 1_000_000).min(a.keys as u64) as u32;
        states.extend(h.snapshot_keys::<Stats>(k..end).unwrap());
        k = end;
    }
    verify(&states, per_key);
    h.terminate().unwrap();
    secs
}

fn run_single(rt: &Runtime, a: &Args, msgs: &[Reading], per_key: &[u32]) -> f64 {
    let work = a.work;
    let per_key = per_key.to_vec();
    let h = rt
        .launch(
            RingKernel::<Reading, u32>::new("single")
                .queue_size(16384)
                .priority_lanes(1)
                .batch_size(8192)
                .state(vec![Stats::default(); a.keys as usize])
                .handler(move |ctx: &mut Context<Vec<Stats>>, m: Reading| {
                    if m.key == u32::MAX {
                        // The check at the end: order violations and count mismatches.
                        let bad = ctx
                            .state()
                            .iter()
                            .zip(per_key.iter())
                            .filter(|(st, want)| st.out_of_order != 0 || st.count != **want)
                            .count();
                        return Some(bad as u32);
                    }
                    update(&mut ctx.state_mut()[m.key as usize], &m, work);
                    None
                }),
        )
        .expect("launch");
    h.activate().unwrap();
    let secs = feed(&h, msgs);
    let check = Reading {
        key: u32::MAX,
        seq: 0,
        value: 0.0,
        pad: 0,
    };
    let bad = h.call(check, Duration::from_secs(60)).expect("check");
    assert_eq!(
        bad, 0,
        "single-thread kernel: keys out of order or miscounted"
    );
    h.terminate().unwrap();
    secs
}

device_message! {
    /// A device kernel's per-key state (16 bytes).
    pub struct DevStats { pub count: u32, pub out_of_order: u32, pub sum: u32, pub pad: u32 }
}

device_message! {
    /// Never sent: the device handlers answer nothing.
    pub struct Ack { pub key: u32 }
}

const CUDA_SRC: &str = r#"
__device__ bool handle(KeyState* ks, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    if (in->seq != ks->count) ks->out_of_order += 1u;
    ks->count += 1u;
    ks->sum += (unsigned int)(in->value * 100.0f);
    return false;
}
"#;

const WGSL_SRC: &str = r#"
fn handle(ks: ptr<function, KeyState>, input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    if (input.seq != (*ks).count) { (*ks).out_of_order += 1u; }
    (*ks).count += 1u;
    (*ks).sum += u32(input.value * 100.0);
    return false;
}
"#;

/// A keyed kernel with a device handler on `backend`: messages per second, per-key order and
/// counts verified; `None` when the engine is not available here.
fn run_device(backend: Backend, keys: u32, msgs: &[Reading]) -> Option<f64> {
    let rt = match Runtime::builder().backend(backend).build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("SKIP {backend:?}: {e}");
            return None;
        }
    };
    let k = RingKernel::<Reading, Ack>::new("keyed-device")
        .queue_size(16384)
        .priority_lanes(1)
        .backpressure(Backpressure::Block(Duration::from_secs(600)))
        .keyed(keys, bytemuck::Zeroable::zeroed())
        .batch_size(1024)
        .key_handler(|ks: &mut KeyContext<DevStats>, _m: Reading| {
            ks.state_mut().count += 1;
            None
        });
    let k = match backend {
        Backend::Wgpu => k.key_wgsl(WgslHandler::new(WGSL_SRC).keyed("key")),
        _ => k.key_cuda(CudaHandler::new(CUDA_SRC).keyed::<DevStats>("key")),
    };
    let h = rt.launch(k).expect("launch");
    assert!(matches!(h.placement(), Placement::Device(_)));
    h.activate().unwrap();
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < msgs.len() {
        let end = (sent + 4096).min(msgs.len());
        sent += h.send_batch(&msgs[sent..end]).expect("send_batch");
    }
    h.drain(Duration::from_secs(3600)).expect("drain");
    let secs = t0.elapsed().as_secs_f64();
    let mut want = vec![0u32; keys as usize];
    for m in msgs {
        want[m.key as usize] += 1;
    }
    let mut k = 0u32;
    while k < keys {
        let end = (k as u64 + 1_000_000).min(keys as u64) as u32;
        let st: Vec<DevStats> = h.snapshot_keys(k..end).unwrap();
        for (i, s) in st.iter().enumerate() {
            let key = k as usize + i;
            assert_eq!(s.out_of_order, 0, "{backend:?} key {key}: out of order");
            assert_eq!(s.count, want[key], "{backend:?} key {key}: count");
        }
        k = end;
    }
    h.terminate().unwrap();
    Some(msgs.len() as f64 / secs)
}

fn main() {
    let a = args();
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    eprintln!(
        "keyed bench: {} keys, {} messages, {} repeats, work {}, {cores} cores, load {}",
        a.keys,
        a.messages,
        a.repeats,
        a.work,
        load.trim()
    );
    let (msgs, per_key) = workload(a.keys, a.messages);
    let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let mut single = Vec::new();
    let mut keyed_all = Vec::new();
    let mut keyed_one = Vec::new();
    let mut loads = Vec::new();
    for r in 0..a.repeats {
        let s = run_single(&rt, &a, &msgs, &per_key);
        let k = run_keyed(&rt, &a, cores, &msgs, &per_key);
        let k1 = run_keyed(&rt, &a, 1, &msgs, &per_key);
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        eprintln!(
            "repeat {r}: single {:.2} M/s, keyed x{cores} {:.2} M/s, keyed x1 {:.2} M/s (load {})",
            a.messages as f64 / s / 1e6,
            a.messages as f64 / k / 1e6,
            a.messages as f64 / k1 / 1e6,
            load.trim()
        );
        single.push(a.messages as f64 / s);
        keyed_all.push(a.messages as f64 / k);
        keyed_one.push(a.messages as f64 / k1);
        loads.push(load.split_whitespace().next().unwrap_or("?").to_string());
    }
    let mut device = Vec::new();
    if a.device_messages > 0 {
        for (backend, n) in [
            (Backend::Wgpu, a.device_messages),
            (Backend::CudaSim, a.device_messages / 5),
        ] {
            // The first `n` messages of the same stream: per-key sequence numbers still hold.
            if let Some(rate) = run_device(backend, a.keys, &msgs[..n.min(msgs.len())]) {
                eprintln!("{backend:?}: {n} messages, {:.3} M/s", rate / 1e6);
                device.push(format!(
                    "{{ \"backend\": \"{backend:?}\", \"messages\": {n}, \"msgs_per_s\": {rate:.0}, \"per_key_order_verified\": true }}"
                ));
            }
        }
    }
    let ratios: Vec<f64> = keyed_all.iter().zip(&single).map(|(k, s)| k / s).collect();
    let ratios1: Vec<f64> = keyed_one.iter().zip(&single).map(|(k, s)| k / s).collect();
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let spread = |v: &[f64]| {
        let lo = v.iter().cloned().fold(f64::MAX, f64::min);
        let hi = v.iter().cloned().fold(f64::MIN, f64::max);
        format!("[{lo:.3}, {hi:.3}]")
    };
    let json = format!(
        "{{\n  \"keys\": {},\n  \"messages\": {},\n  \"work\": {},\n  \"cores\": {cores},\n  \
         \"state_bytes_per_key\": {},\n  \"per_key_order_verified\": true,\n  \
         \"single_thread_vec_msgs_per_s\": [{}],\n  \"keyed_all_cores_msgs_per_s\": [{}],\n  \
         \"keyed_one_worker_msgs_per_s\": [{}],\n  \"ratio_keyed_all_cores_vs_single\": [{}],\n  \
         \"ratio_range\": \"{}\",\n  \"ratio_keyed_one_worker_vs_single\": [{}],\n  \
         \"load_1min_after_each_repeat\": [{}],\n  \"device\": [{}]\n}}",
        a.keys,
        a.messages,
        a.work,
        std::mem::size_of::<Stats>(),
        fmt(&single),
        fmt(&keyed_all),
        fmt(&keyed_one),
        ratios
            .iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(", "),
        spread(&ratios),
        ratios1
            .iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(", "),
        loads.join(", "),
        device.join(", ")
    );
    println!("{json}");
    if let Some(p) = a.out {
        std::fs::write(&p, &json).expect("write --out");
    }
}
