//! An idle kernel parks: after its short spin its thread uses no CPU.

use std::time::Duration;

use resident::prelude::*;

/// utime + stime (clock ticks) of the thread whose name is `name`, from /proc.
fn thread_cpu_ticks(name: &str) -> Option<u64> {
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let path = entry.ok()?.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let stat = std::fs::read_to_string(path.join("stat")).ok()?;
            // Fields after the parenthesised name: state is field 3; utime 14, stime 15.
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            return Some(f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?);
        }
    }
    None
}

#[test]
fn idle_kernel_uses_no_cpu() {
    if !std::path::Path::new("/proc/self/task").exists() {
        eprintln!("SKIP: no /proc on this system");
        return;
    }
    let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let h = rt
        .launch(RingKernel::<u64, u64>::new("idle1").handler(|_: &mut Context<()>, x: u64| Some(x)))
        .unwrap();
    h.activate().unwrap();
    assert_eq!(h.call(1, Duration::from_secs(5)).unwrap(), 1);
    // Thread names are cut to 15 bytes by the kernel: "resident:idle1".
    std::thread::sleep(Duration::from_millis(100));
    let before = thread_cpu_ticks("resident:idle1").expect("kernel thread found by name");
    std::thread::sleep(Duration::from_millis(1000));
    let after = thread_cpu_ticks("resident:idle1").unwrap();
    // A spinning thread would burn ~100 ticks in 1 s; a parked one burns none.
    assert!(
        after - before <= 3,
        "idle kernel thread used {} ticks in 1 s",
        after - before
    );
    // And it still wakes up.
    assert_eq!(h.call(2, Duration::from_secs(5)).unwrap(), 2);
}
