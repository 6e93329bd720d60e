//! The README's example gives the same results on every backend present: the CPU closure and
//! the CUDA handler (on CudaSim here; on a GPU where one is present) agree message by message.
//! The lines between the README markers appear verbatim in README.md (checked below); the
//! README's whole program, `main` included, is compiled and run as a doctest
//! (`resident::guide`'s `ReadmeExample`, `cargo test -p resident --doc`).

use std::time::Duration;

// README:begin
use resident::prelude::*;

device_message! { pub struct Tick { pub price: f32, pub qty: u32 } } // Rust + C layout, one definition
device_message! { pub struct Notional { pub value: f32, pub seq: u32 } }

const SRC: &str = r#"
        __device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
            out->value = in->price * (float)in->qty; out->seq = (unsigned)env->message_id; return true;
        }"#;

fn kernel() -> RingKernel<Tick, Notional> {
    RingKernel::<Tick, Notional>::new("notional")
        .handler(|ctx: &mut Context<()>, t: Tick| {
            Some(Notional {
                // CPU backend
                value: t.price * t.qty as f32,
                seq: ctx.envelope().message_id as u32,
            })
        })
        .cuda(CudaHandler::new(SRC))
}
// README:end

/// (value, whether seq is the request's message id) for 100 ticks.
fn run(rt: Runtime) -> Vec<(f32, bool)> {
    let k = rt.launch(kernel()).unwrap();
    k.activate().unwrap();
    (0..100u32)
        .map(|i| {
            let id = k
                .send(Tick {
                    price: 1.5 + i as f32,
                    qty: i,
                })
                .unwrap();
            let n = k.receive(Duration::from_secs(10)).unwrap();
            (n.value, n.seq == id as u32)
        })
        .collect()
}

#[test]
fn readme_gpu_example_gives_the_same_results_on_every_backend() {
    let cpu = run(Runtime::builder().backend(Backend::Cpu).build().unwrap());
    // The CUDA handler on CudaSim (the same CUDA C source on host threads).
    #[cfg(feature = "cudasim")]
    match Runtime::builder().backend(Backend::CudaSim).build() {
        Ok(rt) => assert_eq!(cpu, run(rt)),
        Err(e) => println!("SKIP: the README's CUDA handler on CudaSim: {e}"),
    }
    assert_eq!(cpu[3], (4.5 * 3.0, true));
    assert!(cpu.iter().all(|&(_, seq_is_id)| seq_is_id));
}

#[test]
fn the_readme_shows_this_file() {
    let me = include_str!("readme_example.rs");
    let begin = me.find("// README:begin\n").unwrap() + "// README:begin\n".len();
    let end = me.find("// README:end").unwrap();
    let readme = include_str!("../../../README.md");
    assert!(
        readme.contains(&me[begin..end]),
        "README.md must contain the lines between the README markers of tests/readme_example.rs verbatim"
    );
}
