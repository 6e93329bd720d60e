//! Priorities, queue sizes, what a full lane does, and deadlines
//! (`resident::guide::backpressure`).

mod common;

use resident::prelude::*;
use std::time::Duration;

fn main() -> Result<(), resident::Error> {
    let rt = common::runtime();
    let t = Duration::from_secs(5);
    let k = rt.launch(
        RingKernel::<u32, u32>::new("strict")
            .queue_size(2)
            .priority_lanes(256)
            .backpressure(Backpressure::Reject)
            .handler(|_: &mut Context<()>, x: u32| Some(x)),
    )?;
    k.send(1)?;
    k.send(2)?;
    let refused = k.send(3).unwrap_err();
    println!("third send into a lane of 2: {refused}");
    assert_eq!(refused.into_message::<u32>(), Some(3));
    k.send_with_priority(99, 255)?;
    k.activate()?;
    let order = [k.receive(t)?, k.receive(t)?, k.receive(t)?];
    println!("handled in order {order:?} (priority 255 first)");
    assert_eq!(order, [99, 1, 2]);

    let latest = rt.launch(
        RingKernel::<u32, u32>::new("latest")
            .queue_size(4)
            .backpressure(Backpressure::DropOldest)
            .handler(|_: &mut Context<()>, x: u32| Some(x)),
    )?;
    for i in 0..10 {
        latest.send(i)?;
    }
    latest.activate()?;
    let kept: Vec<u32> = (0..4)
        .map(|_| latest.receive(t))
        .collect::<Result<_, _>>()?;
    println!(
        "DropOldest kept {kept:?}, dropped {}",
        latest.telemetry().messages_dropped
    );
    assert_eq!(kept, vec![6, 7, 8, 9]);

    // Deadlines: a call's timeout and a send's TTL; late messages are counted, not handled.
    let fresh = rt.launch(
        RingKernel::<u32, u32>::new("fresh").handler(|_: &mut Context<()>, x: u32| Some(x * 10)),
    )?;
    let late = fresh.call(1, Duration::from_millis(1)).unwrap_err();
    println!("a call to a kernel not yet active: {late}");
    fresh.send_with_ttl(2, Duration::from_millis(1))?;
    fresh.send_with_ttl(3, Duration::from_secs(60))?;
    fresh.send(4)?;
    std::thread::sleep(Duration::from_millis(10));
    fresh.activate()?;
    assert_eq!([fresh.receive(t)?, fresh.receive(t)?], [30, 40]);
    let tm = fresh.telemetry();
    println!(
        "handled {}, expired {} (their deadlines passed in the queue)",
        tm.messages_processed, tm.messages_expired
    );
    assert_eq!((tm.messages_processed, tm.messages_expired), (2, 2));
    Ok(())
}
