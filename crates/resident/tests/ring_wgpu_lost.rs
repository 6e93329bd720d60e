//! A lost wgpu device (destroyed here, as a driver reset would) fails the ring kernel on it:
//! the state becomes `Failed`, waiting callers get the error instead of hanging, and terminate
//! reports the failure. Its own test binary, because it destroys the process-wide device.

use std::time::{Duration, Instant};

use resident::backend::wgpu::WgpuContext;
use resident::prelude::*;

device_message! {
    pub struct Ping { pub v: u32 }
}

const ECHO: &str =
    "fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {\n\
                    \x20   (*out).v = input.v + 1u;\n    return true;\n}\n";

#[test]
fn lost_device_fails_the_kernel_and_its_callers() {
    let rt = match Runtime::builder().backend(Backend::Wgpu).build() {
        Ok(rt) => rt,
        Err(e) => {
            if std::env::var("RESIDENT_REQUIRE_WGPU").as_deref() == Ok("1") {
                panic!("RESIDENT_REQUIRE_WGPU=1 but the wgpu backend is unavailable: {e}");
            }
            println!("SKIP: lost_device_fails_the_kernel_and_its_callers: {e}");
            return;
        }
    };
    let h = rt
        .launch(RingKernel::<Ping, Ping>::new("echo").wgsl(WgslHandler::new(ECHO)))
        .unwrap();
    h.activate().unwrap();
    assert_eq!(h.call(Ping { v: 1 }, Duration::from_secs(30)).unwrap().v, 2);

    WgpuContext::shared(false).unwrap().destroy_device();
    let t0 = Instant::now();
    let r = h.call(Ping { v: 2 }, Duration::from_secs(20));
    assert!(
        matches!(
            r,
            Err(Error::KernelFailed { .. }) | Err(Error::NotAccepting { .. })
        ),
        "expected the failure, got {r:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "the caller waited {:?}",
        t0.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(h.state(), KernelState::Failed(_)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    match h.state() {
        KernelState::Failed(reason) => assert!(
            reason.device_error().is_some() && reason.to_string().contains("lost"),
            "{reason}"
        ),
        s => panic!("expected Failed, got {s}"),
    }
    let report = h.terminate().unwrap();
    assert!(report.failure.is_some());
    // A fresh device opens for the next kernel.
    let h2 = rt
        .launch(RingKernel::<Ping, Ping>::new("echo2").wgsl(WgslHandler::new(ECHO)))
        .unwrap();
    h2.activate().unwrap();
    assert_eq!(
        h2.call(Ping { v: 41 }, Duration::from_secs(30)).unwrap().v,
        42
    );
}
