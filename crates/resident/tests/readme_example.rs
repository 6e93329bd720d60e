//! The README's "A handler on the GPU" example, verbatim, gives the same results on every
//! backend present: the CPU closure and the CUDA handler (run here by the device path without
//! a GPU) agree message by message.

use std::time::Duration;

use resident::prelude::*;

device_message! { pub struct Tick { pub price: f32, pub qty: u32 } }      // Rust + C layout, one definition
device_message! { pub struct Notional { pub value: f32, pub seq: u32 } }

const SRC: &str = r#"
        __device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
            out->value = in->price * (float)in->qty; out->seq = (unsigned)env->message_id; return true;
        }"#;

fn kernel() -> RingKernel<Tick, Notional> {
    RingKernel::<Tick, Notional>::new("notional")
        .handler(|ctx: &mut Context<()>, t: Tick| Some(Notional {                             // CPU backend
            value: t.price * t.qty as f32, seq: ctx.envelope().message_id as u32 }))
        .cuda(CudaHandler::new(SRC).emulate_with(|t: &Tick, o: &mut Notional, env: &Envelope| {
            o.value = t.price * t.qty as f32;
            o.seq = env.message_id as u32;
            true
        }))
}

/// (value, whether seq is the request's message id) for 100 ticks.
fn run(rt: Runtime) -> Vec<(f32, bool)> {
    let k = rt.launch(kernel()).unwrap();
    k.activate().unwrap();
    (0..100u32)
        .map(|i| {
            let id = k.send(Tick { price: 1.5 + i as f32, qty: i }).unwrap();
            let n = k.receive(Duration::from_secs(10)).unwrap();
            (n.value, n.seq == id as u32)
        })
        .collect()
}

#[test]
fn readme_gpu_example_gives_the_same_results_on_every_backend() {
    let cpu = run(Runtime::builder().backend(Backend::Cpu).build().unwrap());
    let device = run(
        Runtime::builder()
            .backend(Backend::Cpu)
            .device_emulation(true)
            .build()
            .unwrap(),
    );
    assert_eq!(cpu, device);
    assert_eq!(cpu[3], (4.5 * 3.0, true));
    assert!(cpu.iter().all(|&(_, seq_is_id)| seq_is_id));
}
