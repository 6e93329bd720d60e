//! Where the time goes: the profiler's report and a Chrome trace (`resident::guide::profiling`).
//! `cargo run -p resident --example profiling [backend] [trace.json]`.

mod common;

use resident::prelude::*;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profiler = Profiler::new();
    let rt = Runtime::builder()
        .backend(common::backend())
        .profiler(profiler.clone())
        .build()?;
    let k = rt.launch(RingKernel::<u64, u64>::new("work").batch_size(16).handler(
        |_: &mut Context<()>, n: u64| Some((0..20_000 + n).fold(0u64, |a, i| a ^ (i * i))),
    ))?;
    k.activate()?;
    for i in 0..500u64 {
        k.send(i)?;
    }
    for _ in 0..500 {
        k.receive(Duration::from_secs(30))?;
    }
    let report = profiler.report();
    println!("bottleneck: {:?}", report.bottleneck);
    for (part, share) in &report.fractions {
        // The idle share's key is "utilization"; say idle.
        let part = if part == "utilization" {
            "idle"
        } else {
            part.as_str()
        };
        println!("  {part:<12} {:5.1}%", share * 100.0);
    }
    println!("remedy: {}", report.remedy);
    if let Some(path) = std::env::args().nth(2) {
        profiler.write_chrome_trace(&path)?;
        println!("trace written to {path} (open it in Perfetto)");
    }
    Ok(())
}
