//! A CUDA C handler with device state, checked against its CPU closure
//! (`resident::guide::cuda_handlers`). Run it with `cuda-sim` (needs g++) or `cuda`.

mod common;

use resident::prelude::*;
use std::time::Duration;

device_message! { pub struct Num { pub v: u32 } }
device_message! { pub struct Count { pub messages: u32, pub total: u32 } }

const COUNT: &str = r#"
__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    atomicAdd(&s->messages, 1u);
    out->v = atomicAdd(&s->total, in->v) + in->v;
    return true;
}"#;

fn main() -> Result<(), resident::Error> {
    let rt = common::runtime();
    let k = rt.launch(
        RingKernel::<Num, Num>::new("count")
            .state(0u32)
            .handler(|ctx: &mut Context<u32>, x: Num| {
                *ctx.state_mut() += x.v;
                Some(Num { v: *ctx.state() })
            })
            .cuda(CudaHandler::new(COUNT).state(Count {
                messages: 0,
                total: 0,
            })),
    )?;
    k.activate()?;
    println!("the handler runs on {:?}", k.placement());
    let t = Duration::from_secs(30);
    let totals: Vec<u32> = (1..=10)
        .map(|v| k.call(Num { v }, t).map(|n| n.v))
        .collect::<Result<_, _>>()?;
    println!("running totals: {totals:?}");
    assert_eq!(totals[9], 55);
    if resident::cuda::nvrtc_present() {
        let ptx = CudaHandler::<Num, Num>::new(COUNT)
            .state(Count {
                messages: 0,
                total: 0,
            })
            .compile_ptx("count", 64, "compute_90")
            .map_err(|e| resident::Error::InvalidConfig {
                id: "count".into(),
                reason: e.to_string(),
            })?;
        println!(
            "NVRTC compiled it to {} bytes of PTX for compute_90",
            ptx.len()
        );
    } else {
        println!("NVRTC is not installed: the PTX check is skipped (scripts/setup-nvrtc.sh)");
    }
    Ok(())
}
