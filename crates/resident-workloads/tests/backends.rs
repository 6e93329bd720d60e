//! Every workload, as defined once in `resident-workloads` (CPU closure + CUDA handler + WGSL
//! handler), run through its public runner on every backend present here, checked against
//! its sequential f64 reference at that backend's precision (`Precision::of`), with a check
//! that the kernels really ran on the device (`KernelHandle::placement`), not on a host thread.
//!
//! CPU always; CudaSim when a host C++ compiler works (`RESIDENT_REQUIRE_CUDASIM=1` makes its
//! absence a failure); wgpu when an adapter exists (lavapipe in CI; `RESIDENT_REQUIRE_WGPU=1`);
//! CUDA when a GPU is present (`RESIDENT_REQUIRE_GPU=1`). An absent backend prints `SKIP:`.

mod common;

use resident::backend::{BackendKind, DeviceHandle};
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::UnifiedBuffer;
use resident_workloads::input::{generate_graph, generate_readings};
use resident_workloads::{anomaly, pagerank, pipeline, vector_add, Precision};

fn placement_of(d: &DeviceHandle) -> Placement {
    match d.kind() {
        BackendKind::Cpu => Placement::Host,
        k => Placement::Device(k),
    }
}

/// The definitions land on the device of `rt` (checked by launching each once).
fn definitions_run_on_the_device(rt: &Runtime, d: &DeviceHandle) {
    let want = placement_of(d);
    let o = BufferOptions::default();
    let f = |n| UnifiedBuffer::<f32>::from_slice(d, &vec![1.0f32; n], o).unwrap();
    let k = rt
        .launch(vector_add::kernel("p-va", f(8), f(8), f(8)))
        .unwrap();
    assert_eq!(k.placement(), want, "vector add");
    k.terminate().unwrap();
    let s = rt.launch(pipeline::scorer("p-sc")).unwrap();
    let n = rt.launch(pipeline::normalizer("p-no", "p-sc")).unwrap();
    assert_eq!((n.placement(), s.placement()), (want, want), "pipeline");
    n.terminate().unwrap();
    s.terminate().unwrap();
    let k = rt.launch(anomaly::kernel("p-an", d, 4).unwrap()).unwrap();
    assert_eq!(k.placement(), want, "anomaly");
    k.terminate().unwrap();
    let g = generate_graph(10, 2, 1).unwrap();
    let k = rt
        .launch(pagerank::full_kernel("p-pr", d, &pagerank::Csr::new(&g)).unwrap())
        .unwrap();
    assert_eq!(k.placement(), want, "pagerank");
    k.terminate().unwrap();
    let p = pagerank::Params::default();
    let k = rt
        .launch(pagerank::stream_kernel("p-ps", d, &g, p).unwrap())
        .unwrap();
    assert_eq!(k.placement(), want, "streaming pagerank");
    k.terminate().unwrap();
}

fn all_workloads(rt: &Runtime, d: &DeviceHandle) {
    definitions_run_on_the_device(rt, d);
    let prec = Precision::of(d.kind());
    let name = d.kind();

    let (a, b) = vector_add::inputs(20_000, 3);
    let r = vector_add::run(rt, d, &a, &b, 1000).unwrap();
    vector_add::check(&a, &b, &r.c).unwrap_or_else(|e| panic!("{name}: {e}"));

    let mut values: Vec<f64> = (0..3000)
        .map(|i| (i as f64 * 0.37) % 140.0 - 20.0)
        .collect();
    values.extend([f64::NAN, f64::INFINITY, -1e300, 54.772_255_750_516_61]);
    let r = pipeline::run(rt, &values, |_| {}).unwrap();
    pipeline::check_with(&r.scored, &values, prec).unwrap_or_else(|e| panic!("{name}: {e}"));

    let p = pagerank::Params::default();
    for (nodes, k, seed) in [(1, 1, 1), (300, 3, 7)] {
        let g = generate_graph(nodes, k, seed).unwrap();
        let want = pagerank::reference(&g, p).unwrap();
        let got = pagerank::run_full(rt, d, &g, p).unwrap();
        pagerank::check_full_with(&got, &want, prec).unwrap_or_else(|e| panic!("{name}: {e}"));
    }

    streaming_pagerank(rt, d);

    // 12 sensors x 1000 readings: past the warm-up, with a spike every 97 readings.
    let (rs, spikes) = generate_readings(12_000, 12, 97, 11).unwrap();
    let s = anomaly::slot(&rs);
    for batch in [100, 1000] {
        let a = anomaly::run_actor(rt, d, &s, batch, anomaly::IN_FLIGHT, |_| {}).unwrap();
        anomaly::check_with(&a, &s, prec).unwrap_or_else(|e| panic!("{name} actor/{batch}: {e}"));
        let alerted: std::collections::HashSet<u64> = a.alerts.iter().map(|x| x.index).collect();
        let caught = spikes
            .iter()
            .filter(|&&i| alerted.contains(&(i as u64)))
            .count();
        assert!(
            caught * 10 >= spikes.len() * 9,
            "{name}: only {caught} of {} injected spikes alerted",
            spikes.len()
        );
        let st = anomaly::run_stateless(d, &s, batch, |_| {}).unwrap();
        anomaly::check_with(&st, &s, prec)
            .unwrap_or_else(|e| panic!("{name} stateless/{batch}: {e}"));
    }
}

/// Streaming PageRank: batches of changes (random ones, a node made dangling and live again,
/// one source's add/remove/add chains of the same edges inside one batch, junk), refreshed
/// incrementally and recomputed from scratch after every batch, the two compared, and the
/// final ranks checked against the sequential reference on the final graph.
fn streaming_pagerank(rt: &Runtime, d: &DeviceHandle) {
    let name = d.kind();
    let g = generate_graph(1500, 4, 9).unwrap();
    let p = pagerank::Params {
        tol: 1e-9,
        ..Default::default()
    };
    let e = |src, dst, op| pagerank::EdgeUpdate {
        src,
        dst,
        op,
        _pad: 0,
    };
    let mut ups = pagerank::generate_updates(&g, 5, 40, 5);
    let u = g.edges[0].0;
    ups[1].extend(
        g.edges
            .iter()
            .filter(|x| x.0 == u)
            .map(|&(s, t)| e(s, t, pagerank::OP_REMOVE)),
    );
    ups[2].push(e(u, 7, pagerank::OP_ADD));
    // Order matters: the edge 3 -> w ends present for w odd, absent for w even.
    for w in 20..40u32 {
        ups[3].push(e(3, w, pagerank::OP_ADD));
        ups[3].push(e(3, w, pagerank::OP_REMOVE));
        if w % 2 == 1 {
            ups[3].push(e(3, w, pagerank::OP_ADD));
        }
    }
    ups[4].extend([e(99_999, 1, pagerank::OP_ADD), e(1, 99_999, 0), e(1, 2, 77)]);
    let t = std::time::Instant::now();
    let (steps, ranks) =
        pagerank::run_stream(rt, d, &g, p, &ups, |_| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
    println!(
        "{name}: streaming PageRank, {} batches in {:?}: {:?}",
        steps.len(),
        t.elapsed(),
        steps
            .iter()
            .map(|s| (s.pushes, s.rounds, s.l1_diff))
            .collect::<Vec<_>>()
    );
    assert_eq!(steps.len(), ups.len());
    for s in &steps {
        assert!(s.applied > 0, "{name}: {s:?}");
    }
    let want = pagerank::reference(&pagerank::apply_updates(&g, &ups), p).unwrap();
    let l1: f64 = ranks
        .iter()
        .zip(&want.ranks)
        .map(|(a, b)| (a - b).abs())
        .sum();
    let tol = pagerank::stream_tolerance_with(g.nodes(), p, Precision::of(d.kind()));
    println!("{name}: final ranks {l1:e} from the reference (allowed {tol:e})");
    assert!(
        l1 <= tol,
        "{name}: final ranks {l1:e} from the reference (> {tol:e})"
    );
}

#[test]
fn workloads_on_the_cpu() {
    let (rt, d) = common::open(Backend::Cpu, "-", "backends").unwrap();
    all_workloads(&rt, &d);
}

#[test]
fn workloads_on_cudasim() {
    if let Some((rt, d)) = common::open(Backend::CudaSim, "RESIDENT_REQUIRE_CUDASIM", "backends") {
        all_workloads(&rt, &d);
    }
}

#[test]
fn workloads_on_wgpu() {
    if let Some((rt, d)) = common::open(Backend::Wgpu, "RESIDENT_REQUIRE_WGPU", "backends") {
        all_workloads(&rt, &d);
    }
}

#[test]
fn workloads_on_a_gpu() {
    if let Some((rt, d)) = common::open(Backend::Cuda, "RESIDENT_REQUIRE_GPU", "backends") {
        all_workloads(&rt, &d);
    }
}
