//! `UnifiedBuffer`, a one-shot kernel described once for every backend, a pool, and a buffer
//! bound to a ring kernel (`resident::guide::memory`).

mod common;

use resident::backend;
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::{Kernel, KernelArg, LaunchConfig, MemoryPool, PoolKind, UnifiedBuffer};
use std::time::Duration;

const SAXPY_WGSL: &str = r#"
@group(0) @binding(0) var<uniform> a: f32;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> n: vec2<u32>;
@compute @workgroup_size(64)
fn saxpy(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < n.x) { y[i] = a * x[i] + y[i]; }
}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let which = common::backend();
    let d = backend::open(which)?;
    println!("device: {:?}", d.kind());

    // One-shot saxpy.
    let saxpy = Kernel::new("saxpy")
        .cuda(resident::cuda::builtin::ELEMENTWISE.code, "resident_saxpy")
        .wgsl(SAXPY_WGSL, "saxpy")
        .cpu(|t| {
            let (a, x, y) = (t.scalar::<f32>(0)?, t.input::<f32>(1)?, t.output::<f32>(2)?);
            y.set(a * x[t.index()] + y.get()?)
        });
    let n = 10_000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut xb = UnifiedBuffer::from_slice(&d, &x, BufferOptions::default())?;
    let mut yb = UnifiedBuffer::from_slice(&d, &vec![1.0f32; n], BufferOptions::default())?;
    {
        let (xv, mut yv) = (xb.device()?, yb.device_mut()?);
        let args = [
            KernelArg::scalar(2.0f32),
            xv.arg(),
            yv.arg(),
            KernelArg::scalar(n as u64),
        ];
        d.launch(&saxpy, LaunchConfig::for_elements(n as u64), &args, None)?;
    }
    assert!(yb
        .host()?
        .iter()
        .enumerate()
        .all(|(i, &v)| v == 2.0 * i as f32 + 1.0));
    println!("saxpy on {n} elements: ok; copies {:?}", yb.transfers());

    // A pool.
    let pool = MemoryPool::new(&d, PoolKind::Device, None);
    for _ in 0..100 {
        let _block = pool.acquire(3000)?;
    }
    println!("pool after 100 acquisitions: {:?}", pool.stats());

    // A buffer bound to a ring kernel (the CPU closure's view; see the workloads for device handlers).
    let rt = Runtime::builder().backend(Backend::Cpu).build()?;
    let cpu = backend::open(Backend::Cpu)?;
    let counts = UnifiedBuffer::from_slice(&cpu, &[0u32; 8], BufferOptions::default())?;
    let hist = rt.launch(
        RingKernel::<u32, u32>::new("histogram")
            .bind("counts", counts)
            .handler(|ctx: &mut Context<()>, bucket: u32| {
                let mut c = ctx.buffer_mut::<u32>("counts").ok()?;
                let slot = c.get_mut(bucket as usize)?;
                *slot += 1;
                Some(*slot)
            }),
    )?;
    hist.activate()?;
    let t = Duration::from_secs(5);
    for b in [1, 3, 3, 7] {
        hist.call(b, t)?;
    }
    let view = hist.read_buffer::<u32>("counts", t)?;
    println!("bound histogram: {:?}", &view[..]);
    assert_eq!(&view[..], &[0, 1, 0, 2, 0, 0, 0, 1]);
    Ok(())
}
