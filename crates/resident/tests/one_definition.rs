//! The guide's example of one ring kernel defined once with a CPU closure, a CUDA handler and
//! a WGSL handler. The lines between the README markers below appear verbatim in the guide's
//! backends chapter (`crates/resident/src/guide/backends.md`, checked here, and run there as a
//! doctest on every backend present), and the definition runs on the CPU backend and on wgpu (lavapipe in CI) with
//! the same results; the CUDA handler is compiled with NVRTC when NVRTC is present (it runs
//! only on a GPU). Without a wgpu adapter the wgpu half prints `SKIP:` unless
//! `RESIDENT_REQUIRE_WGPU=1`.
// Without the `wgpu` and `cuda` features only the guide check runs; the definition stays.
#![cfg_attr(not(all(feature = "wgpu", feature = "cuda")), allow(dead_code))]

use std::time::Duration;

// README:begin
use resident::prelude::*;

device_message! { pub struct Tick { pub price: f32, pub qty: u32 } }
device_message! { pub struct Notional { pub value: f32, pub qty: u32 } }
device_message! { pub struct Seen { pub ticks: u32, pub volume: u32 } }

const CUDA: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    if (in->qty == 0) return false;                       // no output
    atomicAdd(&s->ticks, 1u); atomicAdd(&s->volume, in->qty);
    out->value = in->price * (float)in->qty; out->qty = in->qty;
    return true;
}"#;

const WGSL: &str = r#"
fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    if (input.qty == 0u) { return false; }                // no output
    atomicAdd(&state.ticks, 1u); atomicAdd(&state.volume, input.qty);
    (*out).value = input.price * f32(input.qty); (*out).qty = input.qty;
    return true;
}"#;

/// One definition; the runtime's backend picks the handler: CUDA on `Backend::Cuda`,
/// WGSL on `Backend::Wgpu`, the closure on the CPU.
fn notional() -> RingKernel<Tick, Notional, Seen> {
    RingKernel::<Tick, Notional>::new("notional")
        .state(Seen {
            ticks: 0,
            volume: 0,
        })
        .handler(|ctx: &mut Context<Seen>, t: Tick| {
            if t.qty == 0 {
                return None;
            }
            let s = ctx.state_mut();
            s.ticks += 1;
            s.volume += t.qty;
            Some(Notional {
                value: t.price * t.qty as f32,
                qty: t.qty,
            })
        })
        .cuda(CudaHandler::new(CUDA).state(Seen {
            ticks: 0,
            volume: 0,
        }))
        .wgsl(WgslHandler::new(WGSL).state(Seen {
            ticks: 0,
            volume: 0,
        }))
}
// README:end

const T: Duration = Duration::from_secs(30);

fn exercise(rt: &Runtime) -> Vec<(u32, f32)> {
    let h = rt.launch(notional()).unwrap();
    h.activate().unwrap();
    let ticks: Vec<Tick> = (0..500u32)
        .map(|i| Tick {
            price: 0.5 + (i % 4) as f32,
            qty: i % 5,
        })
        .collect();
    let mut sent = 0;
    while sent < ticks.len() {
        sent += h.send_batch(&ticks[sent..]).unwrap();
    }
    let mut out = Vec::new();
    for _ in 0..400 {
        let n = h.receive(T).unwrap();
        out.push((n.qty, n.value));
    }
    assert_eq!(h.call(Tick { price: 2.0, qty: 3 }, T).unwrap().value, 6.0);
    let r = h.terminate().unwrap();
    assert!(r.undelivered.is_empty() && r.unreceived.is_empty());
    assert_eq!(r.processed, 501);
    out
}

#[test]
fn the_guide_shows_this_file() {
    let me = include_str!("one_definition.rs");
    let begin = me.find("// README:begin\n").unwrap() + "// README:begin\n".len();
    let end = me.find("// README:end").unwrap();
    let guide = include_str!("../src/guide/backends.md");
    assert!(
        guide.contains(&me[begin..end]),
        "the guide's backends chapter must contain the lines between the README markers of tests/one_definition.rs verbatim"
    );
}

#[cfg(feature = "wgpu")]
#[test]
fn one_definition_same_results_on_cpu_and_wgpu() {
    let cpu = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let want = exercise(&cpu);
    assert_eq!(want.len(), 400);
    match Runtime::builder().backend(Backend::Wgpu).build() {
        Ok(rt) => {
            assert_eq!(rt.backend(), Backend::Wgpu);
            assert_eq!(exercise(&rt), want, "wgpu and CPU differ");
        }
        Err(e) if std::env::var("RESIDENT_REQUIRE_WGPU").as_deref() != Ok("1") => {
            println!("SKIP: one_definition on wgpu: {e}")
        }
        Err(e) => panic!("RESIDENT_REQUIRE_WGPU=1 but wgpu is unavailable: {e}"),
    }
}

#[cfg(feature = "cuda")]
#[test]
fn the_cuda_handler_compiles() {
    if !resident::cuda::nvrtc_present() {
        if std::env::var("RESIDENT_REQUIRE_NVRTC").as_deref() == Ok("1") {
            panic!("RESIDENT_REQUIRE_NVRTC=1 but NVRTC is not loadable");
        }
        println!("SKIP: the_cuda_handler_compiles: NVRTC not found");
        return;
    }
    let k = CudaHandler::<Tick, Notional>::new(CUDA).state(Seen {
        ticks: 0,
        volume: 0,
    });
    k.compile_ptx("notional", 64, "compute_90")
        .expect("the README's CUDA handler compiles");
}
