//! What running the host compiler under `resident_limits` costs per compile: the same
//! small compile (`g++ -O2 -c`) run plainly (`Command::output`) and under the limits, in
//! alternating pairs, each pair's difference reported. `cargo run --release -p resident-cuda
//! --example compile_limits_cost [pairs]` prints one JSON line.

use std::process::Command;
use std::time::Instant;

use resident_limits::{run, CompileLimits, Ended};

fn main() {
    let pairs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let dir = std::env::temp_dir().join(format!("resident-limits-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("t.cpp");
    std::fs::write(
        &src,
        "#include <atomic>\nint f(std::atomic<int>& a) { return a.fetch_add(1); }\n",
    )
    .expect("source");
    let cmd = || {
        let mut c =
            Command::new(std::env::var("RESIDENT_SIM_CXX").unwrap_or_else(|_| "g++".into()));
        c.args(["-O2", "-c", "-o"]).arg(dir.join("t.o")).arg(&src);
        c
    };
    let limits = CompileLimits::default();
    let (mut plain, mut limited, mut diff) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..pairs {
        let t = Instant::now();
        let ok = cmd().output().expect("g++").status.success();
        let a = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let r = run(&mut cmd(), &limits).expect("g++");
        let b = t.elapsed().as_secs_f64() * 1e3;
        assert!(
            ok && matches!(r, Ended::Exited { success: true, .. }),
            "{r:?}"
        );
        plain.push(a);
        limited.push(b);
        diff.push(b - a);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2], v[v.len() - 1])
    };
    let (p, l, d) = (med(&mut plain), med(&mut limited), med(&mut diff));
    println!(
        "{{\"pairs\": {pairs}, \"plain_ms\": [{:.2}, {:.2}, {:.2}], \"limited_ms\": [{:.2}, {:.2}, {:.2}], \"limited_minus_plain_ms\": [{:.2}, {:.2}, {:.2}], \"order\": \"min, median, max\"}}",
        p.0, p.1, p.2, l.0, l.1, l.2, d.0, d.1, d.2
    );
    let _ = std::fs::remove_dir_all(&dir);
}
