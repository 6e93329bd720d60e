//! Every backend and why it is or is not usable here (`resident::guide::troubleshooting`);
//! `resident info` prints the same with each adapter's limits.

fn main() {
    for b in resident::backend::probe() {
        match &b.unavailable {
            None => println!("{}: {} device(s)", b.backend, b.devices.len()),
            Some(why) => println!("{}: unavailable: {why}", b.backend),
        }
        if let Some(nvrtc) = b.nvrtc {
            println!(
                "  NVRTC: {}",
                if nvrtc {
                    "loads"
                } else {
                    "not found (eval \"$(bash scripts/setup-nvrtc.sh --env)\")"
                }
            );
        }
    }
    let sim = resident::prelude::Runtime::builder()
        .backend(resident::backend::Backend::CudaSim)
        .build();
    match sim {
        Ok(_) => println!("cuda-sim: available (a simulator: correctness, not speed)"),
        Err(e) => println!("cuda-sim: unavailable: {e} (apt-get install g++)"),
    }
}
