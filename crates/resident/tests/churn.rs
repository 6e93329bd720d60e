//! Resources end with the kernel: a server that launches, uses and terminates kernels with
//! distinct ids for ever must stay flat in memory and threads. Before the runtime forgot
//! terminated kernels, every one kept about 64 KB (its queues, via the runtime's kernel map):
//! 10 000 of them grew the process by over 600 MB.

use std::time::Duration;

use resident::prelude::*;

/// (resident memory in KiB, thread count) of this process, from `/proc/self/status`.
fn rss_and_threads() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
    };
    Some((field("VmRSS:")?, field("Threads:")?))
}

fn churn(rt: &Runtime, from: usize, to: usize) {
    for i in from..to {
        let h = rt
            .launch(
                RingKernel::<u64, u64>::new(format!("k{i}"))
                    .queue_size(1024)
                    .handler(|_: &mut Context<()>, x: u64| Some(x + 1)),
            )
            .unwrap();
        h.activate().unwrap();
        h.send(i as u64).unwrap();
        assert_eq!(h.receive(Duration::from_secs(10)).unwrap(), i as u64 + 1);
        assert_eq!(h.call(1, Duration::from_secs(10)).unwrap(), 2);
        let report = h.terminate().unwrap();
        assert_eq!(report.processed, 2);
    }
}

#[test]
fn ten_thousand_kernels_leave_memory_and_threads_flat() {
    let Some(_) = rss_and_threads() else {
        println!("SKIP: no /proc/self/status on this system (memory and thread counts unreadable)");
        return;
    };
    let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    // Warm up: allocator arenas, thread stacks and lazily built statics settle first.
    churn(&rt, 0, 1_000);
    let (rss0, threads0) = rss_and_threads().unwrap();
    churn(&rt, 1_000, 10_000);
    let (rss1, threads1) = rss_and_threads().unwrap();
    println!("9 000 kernels: RSS {rss0} KiB -> {rss1} KiB, threads {threads0} -> {threads1}");
    // 9 000 kernels kept at 64 KB would be 560 MB; allow 16 MB of allocator noise.
    assert!(
        rss1 <= rss0 + 16 * 1024,
        "memory grew from {rss0} KiB to {rss1} KiB over 9 000 terminated kernels"
    );
    assert!(
        threads1 <= threads0,
        "threads grew from {threads0} to {threads1}"
    );
    // The runtime keeps only a bounded record, and every id can be launched again.
    assert!(rt.kernel_ids().is_empty(), "{:?}", rt.kernel_ids());
    let recent = rt.recently_terminated();
    assert_eq!(recent.len(), resident::runtime::RECENT_KERNELS);
    assert_eq!(
        recent.last().unwrap(),
        &("k9999".to_string(), KernelState::Terminated)
    );
    churn(&rt, 0, 10);
    assert!(matches!(
        rt.kernel::<u64, u64>("k5").unwrap_err(),
        Error::UnknownKernel { .. }
    ));
}

#[test]
fn a_relaunched_id_is_a_new_kernel_and_old_handles_keep_their_report() {
    let rt = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let k = |add: u64| {
        RingKernel::<u64, u64>::new("same")
            .handler(move |_: &mut Context<()>, x: u64| Some(x + add))
    };
    let old = rt.launch(k(1)).unwrap();
    old.activate().unwrap();
    assert_eq!(old.call(1, Duration::from_secs(10)).unwrap(), 2);
    let report = old.terminate().unwrap();
    let new = rt.launch(k(10)).unwrap();
    new.activate().unwrap();
    assert_eq!(new.call(1, Duration::from_secs(10)).unwrap(), 11);
    // The old handle still answers from its own kernel's report; terminating it again does not
    // touch the new kernel.
    assert_eq!(old.terminate().unwrap().processed, report.processed);
    assert_eq!(old.state(), KernelState::Terminated);
    assert_eq!(new.state(), KernelState::Active);
    assert_eq!(rt.kernel_ids(), vec!["same".to_string()]);
    assert_eq!(
        rt.kernel::<u64, u64>("same")
            .unwrap()
            .call(2, Duration::from_secs(10))
            .unwrap(),
        12
    );
}
