//! naga under the compile's limits (issue 42): a WGSL kernel's source is checked in a process
//! of its own before this one parses it, so a source that makes naga run for minutes is stopped
//! at the wall-time limit, and naga's recursion over a long expression runs on a stack that
//! holds it (a sum of 4096 terms overflowed a 2 MiB thread's stack: the process aborted). In a
//! binary of its own: the limits come from the environment, which these tests set (in turns).
//! Without an adapter each test prints `SKIP:` unless `RESIDENT_REQUIRE_WGPU=1`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use resident::backend::{BackendError, DeviceHandle, Kernel, LaunchConfig};

static TURNS: Mutex<()> = Mutex::new(());

mod common;
use common::wgpu_device;

fn launch(d: &DeviceHandle, name: &str, src: &str) -> Result<(), BackendError> {
    let k = Kernel::new(name).wgsl(src, "main");
    d.launch(&k, LaunchConfig::new(1, 1), &[], None).map(|_| ())
}

const OK: &str = "@compute @workgroup_size(1) fn main() {}";

#[test]
fn a_wgsl_source_that_keeps_naga_busy_is_stopped_at_the_limit() {
    let _turn = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(d) = wgpu_device("a_wgsl_source_that_keeps_naga_busy_is_stopped_at_the_limit") else {
        return;
    };
    // 200 000 short statements: naga's time grows with their square (100 000 took 20 s).
    let src = format!(
        "fn f() -> f32 {{ var a: f32 = 0.0; {} return a; }}\n{OK}",
        "a = a + 1.0; ".repeat(200_000)
    );
    std::env::set_var(resident::limits::TIMEOUT_ENV, "2");
    let start = Instant::now();
    let r = launch(&d, "busy", &src);
    std::env::remove_var(resident::limits::TIMEOUT_ENV);
    let took = start.elapsed();
    match r {
        Err(e @ BackendError::WgslStopped { .. }) => {
            let text = e.to_string();
            assert!(text.contains("naga did not finish within 2s"), "{text}");
            assert!(text.contains("RESIDENT_COMPILE_TIMEOUT_S"), "{text}");
        }
        other => panic!("expected WgslStopped, got {other:?}"),
    }
    assert!(took < Duration::from_secs(30), "{took:?}");
    // The process goes on: the next kernel compiles and runs.
    launch(&d, "ok", OK).unwrap();
}

#[test]
fn a_long_wgsl_expression_compiles_on_nagas_own_stack() {
    let _turn = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(d) = wgpu_device("a_long_wgsl_expression_compiles_on_nagas_own_stack") else {
        return;
    };
    // A sum of 8192 terms (4096 overflowed a 2 MiB stack in an optimized build), compiled from
    // a thread with Rust's default 2 MiB stack.
    let src = format!(
        "fn f() -> f32 {{ var a: f32 = 1.0; return a{}; }}\n{OK}",
        " + a".repeat(8192)
    );
    let r = std::thread::spawn(move || launch(&d, "long", &src))
        .join()
        .expect("the launching thread lives");
    r.unwrap();
}
