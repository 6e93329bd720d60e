//! Launch, activate, deactivate, terminate and what comes back; a failing handler stays with
//! its kernel (`resident::guide::lifecycle`).

mod common;

use resident::prelude::*;
use std::time::Duration;

fn main() -> Result<(), resident::Error> {
    let rt = common::runtime();
    let k = rt.launch(
        RingKernel::<u32, u32>::new("inc").handler(|_: &mut Context<()>, x: u32| Some(x + 1)),
    )?;
    println!("after launch: {:?}", k.state());
    k.send_batch(&[1, 2, 3])?;
    k.activate()?;
    k.drain(Duration::from_secs(5))?;
    k.deactivate()?;
    println!("after deactivate: {:?}", k.state());
    k.send(10)?;
    let report = k.terminate()?;
    println!(
        "terminate: processed {}, {} outputs never received, {} inputs never handled",
        report.processed,
        report.unreceived.len(),
        report.undelivered.len()
    );
    assert_eq!(
        (
            report.processed,
            report.unreceived.len(),
            report.undelivered.len()
        ),
        (3, 3, 1)
    );

    let fragile = rt.launch(RingKernel::<u32, u32>::new("fragile").handler(
        |_: &mut Context<()>, x: u32| {
            assert!(x != 13, "unlucky input");
            Some(x)
        },
    ))?;
    fragile.activate()?;
    println!("(the panic message that follows is the handler's, on purpose)");
    let err = fragile.call(13, Duration::from_secs(5)).unwrap_err();
    println!("a panicking handler: {err}");
    assert!(matches!(fragile.state(), KernelState::Failed(_)));
    let reports = rt.shutdown();
    println!("shutdown returned {} reports", reports.len());
    Ok(())
}
