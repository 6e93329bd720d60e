//! Messages, state, `call` from several threads, kernel to kernel and the loop form
//! (`resident::guide::ring_kernels`).

mod common;

use resident::prelude::*;
use std::sync::Arc;
use std::time::Duration;

device_message! { pub struct Reading { pub sensor: u32, pub value: f32 } }
device_message! { pub struct Mean { pub sensor: u32, pub count: u32, pub mean: f32 } }

const T: Duration = Duration::from_secs(10);

fn main() -> Result<(), resident::Error> {
    let rt = common::runtime();

    // State: a running mean per sensor.
    let means = rt.launch(
        RingKernel::<Reading, Mean>::new("means")
            .state(vec![(0u32, 0.0f64); 4])
            .handler(|ctx: &mut Context<Vec<(u32, f64)>>, r: Reading| {
                let slot = ctx.state_mut().get_mut(r.sensor as usize)?;
                slot.0 += 1;
                slot.1 += r.value as f64;
                Some(Mean {
                    sensor: r.sensor,
                    count: slot.0,
                    mean: (slot.1 / slot.0 as f64) as f32,
                })
            }),
    )?;
    means.activate()?;
    for v in [1.0, 2.0, 3.0] {
        means.send(Reading {
            sensor: 2,
            value: v,
        })?;
    }
    let mut last = means.receive(T)?;
    for _ in 0..2 {
        last = means.receive(T)?; // the third answer has all three readings
    }
    println!("sensor 2: {} readings, mean {}", last.count, last.mean);
    assert_eq!(last.mean, 2.0);

    // call from four threads.
    let square = Arc::new(rt.launch(
        RingKernel::<u64, u64>::new("square").handler(|_: &mut Context<()>, x: u64| Some(x * x)),
    )?);
    square.activate()?;
    let threads: Vec<_> = (1..=4u64)
        .map(|i| {
            let k = Arc::clone(&square);
            std::thread::spawn(move || k.call(i, T))
        })
        .collect();
    let got: Vec<u64> = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect::<Result<_, _>>()?;
    println!("squares from 4 threads: {got:?}");
    assert_eq!(got, vec![1, 4, 9, 16]);

    // Kernel to kernel.
    let sink = rt.launch(
        RingKernel::<f32, f32>::new("plus-one")
            .handler(|_: &mut Context<()>, x: f32| Some(x + 1.0)),
    )?;
    let first = rt.launch(
        RingKernel::<f32, f32>::new("times-ten")
            .forward_to("plus-one")
            .handler(|_: &mut Context<()>, x: f32| Some(x * 10.0)),
    )?;
    sink.activate()?;
    first.activate()?;
    first.send(4.0)?;
    let y = sink.receive(T)?;
    println!("4 -> times-ten -> plus-one = {y}");
    assert_eq!(y, 41.0);
    Ok(())
}
