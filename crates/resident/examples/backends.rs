//! One kernel defined once -- a CPU closure, a CUDA handler and a WGSL handler -- run on the
//! backend named on the command line (`resident::guide::backends`).

mod common;

use resident::prelude::*;
use std::time::Duration;

device_message! { pub struct Tick { pub price: f32, pub qty: u32 } }
device_message! { pub struct Notional { pub value: f32, pub qty: u32 } }
device_message! { pub struct Seen { pub ticks: u32, pub volume: u32 } }

const CUDA: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    if (in->qty == 0) return false;
    atomicAdd(&s->ticks, 1u); atomicAdd(&s->volume, in->qty);
    out->value = in->price * (float)in->qty; out->qty = in->qty;
    return true;
}"#;

const WGSL: &str = r#"
fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    if (input.qty == 0u) { return false; }
    atomicAdd(&state.ticks, 1u); atomicAdd(&state.volume, input.qty);
    (*out).value = input.price * f32(input.qty); (*out).qty = input.qty;
    return true;
}"#;

fn notional() -> RingKernel<Tick, Notional, Seen> {
    let zero = Seen {
        ticks: 0,
        volume: 0,
    };
    RingKernel::<Tick, Notional>::new("notional")
        .state(zero)
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
        .cuda(CudaHandler::new(CUDA).state(zero))
        .wgsl(WgslHandler::new(WGSL).state(zero))
}

fn run(rt: &Runtime) -> Result<Vec<(u32, f32)>, resident::Error> {
    let k = rt.launch(notional())?;
    k.activate()?;
    println!("{} runs on {:?}", k.id(), k.placement());
    let ticks: Vec<Tick> = (0..20u32)
        .map(|i| Tick {
            price: 0.5 * i as f32,
            qty: i % 3,
        })
        .collect();
    let mut sent = 0;
    while sent < ticks.len() {
        sent += k.send_batch(&ticks[sent..])?;
    }
    let answered = ticks.iter().filter(|t| t.qty != 0).count();
    let out = (0..answered)
        .map(|_| k.receive(Duration::from_secs(30)).map(|n| (n.qty, n.value)))
        .collect::<Result<Vec<_>, _>>()?;
    k.terminate()?;
    Ok(out)
}

fn main() -> Result<(), resident::Error> {
    let rt = common::runtime();
    let got = run(&rt)?;
    let cpu = run(&Runtime::builder().backend(Backend::Cpu).build()?)?;
    assert_eq!(got, cpu, "{:?} and the CPU differ", rt.backend());
    println!("{} outputs, the same as the CPU backend's", got.len());
    Ok(())
}
