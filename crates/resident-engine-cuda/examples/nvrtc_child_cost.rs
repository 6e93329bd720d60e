//! What compiling in a process of its own (`resident_cuda::compile_ptx`, forked under the
//! compile's limits) costs per compile against NVRTC in this process with no limit
//! (`compile_ptx_in_this_process`): the same source compiled both ways in alternating pairs,
//! each pair's difference reported, for a one-line kernel and for the persistent ring-kernel
//! template with a small handler. `cargo run --release -p resident-engine-cuda --features cuda --example
//! nvrtc_child_cost [pairs]` prints one JSON line.

use std::time::Instant;

use resident_cuda::nvrtc::compile_ptx_in_this_process;
use resident_cuda::{compile_ptx, CompileOptions};
use resident_engine_cuda::persistent::{KernelSource, MessageDecl};

fn main() {
    let pairs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let tiny = "extern \"C\" __global__ void k(int* p) { p[0] = 1; }".to_string();
    let ring = KernelSource::new(
        "cost",
        MessageDecl::new("Ping", "typedef struct { unsigned int x; } Ping;", 4),
        MessageDecl::new("Ping", "", 4),
        MessageDecl::new("St", "typedef struct { unsigned int n; } St;", 4),
        "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) { out->x = in->x + atomicAdd(&s->n, 1u); return true; }",
        64,
    )
    .render()
    .expect("the template renders");
    let opts = CompileOptions::for_arch("compute_90");
    let mut rows = Vec::new();
    for (what, src) in [("one-line kernel", &tiny), ("ring-kernel template", &ring)] {
        // The first compile of the process loads NVRTC: not counted.
        compile_ptx(src, "cost", &opts).expect("compiles");
        let (mut inproc, mut child, mut diff) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..pairs {
            let t = Instant::now();
            let a_ptx = compile_ptx_in_this_process(src, "cost", &opts).expect("compiles");
            let a = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let b_ptx = compile_ptx(src, "cost", &opts).expect("compiles");
            let b = t.elapsed().as_secs_f64() * 1e3;
            assert_eq!(a_ptx, b_ptx, "the same PTX either way");
            inproc.push(a);
            child.push(b);
            diff.push(b - a);
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[0], v[v.len() / 2], v[v.len() - 1])
        };
        let (p, c, d) = (med(&mut inproc), med(&mut child), med(&mut diff));
        rows.push(format!(
            "{{\"source\": \"{what}\", \"in_process_ms\": [{:.2}, {:.2}, {:.2}], \"own_process_ms\": [{:.2}, {:.2}, {:.2}], \"own_minus_in_process_ms\": [{:.2}, {:.2}, {:.2}]}}",
            p.0, p.1, p.2, c.0, c.1, c.2, d.0, d.1, d.2
        ));
    }
    println!(
        "{{\"pairs\": {pairs}, \"order\": \"min, median, max\", \"rows\": [{}]}}",
        rows.join(", ")
    );
}
