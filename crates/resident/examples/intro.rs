//! The guide's first program (`resident::guide::intro`):
//! `cargo run -p resident --example intro [cpu|cuda-sim|wgpu|cuda|auto]`.

mod common;

use resident::prelude::*;
use std::time::Duration;

fn main() -> Result<(), resident::Error> {
    let rt = common::runtime();
    let double = rt.launch(
        RingKernel::<f32, f32>::new("double")
            .handler(|_ctx: &mut Context<()>, x: f32| Some(2.0 * x)),
    )?;
    double.activate()?;
    double.send(21.0)?;
    let y = double.receive(Duration::from_secs(5))?;
    let z = double.call(1.5, Duration::from_secs(5))?;
    println!("double(21) = {y}, double(1.5) = {z}");
    assert_eq!((y, z), (42.0, 3.0));
    let report = double.terminate()?;
    println!("processed {} messages", report.processed);
    Ok(())
}
