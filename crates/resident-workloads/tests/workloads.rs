//! Every workload on the CPU backend at small sizes, checked against its sequential f64
//! reference with the tolerance its module states.

use resident::backend::{self, DeviceHandle};
use resident::prelude::*;
use resident_workloads::input::{
    generate_graph, generate_readings, parse_edge_list, SensorReading,
};
use resident_workloads::{anomaly, pagerank, pipeline, vector_add, WorkloadError};

fn cpu() -> (Runtime, DeviceHandle) {
    (
        Runtime::builder().backend(Backend::Cpu).build().unwrap(),
        backend::open(Backend::Cpu).unwrap(),
    )
}

#[test]
fn vector_add_matches_the_reference_and_refuses_bad_ranges() {
    let (rt, d) = cpu();
    let (a, b) = vector_add::inputs(10_007, 3);
    let r = vector_add::run(&rt, &d, &a, &b, 1000).unwrap();
    vector_add::check(&a, &b, &r.c).unwrap();
    // The check can fail: one wrong element is caught.
    let mut c = r.c.clone();
    c[5000] += 1.0;
    assert!(matches!(
        vector_add::check(&a, &b, &c),
        Err(WorkloadError::Mismatch { .. })
    ));
    // A range past the buffers is answered ok = 0, not a panic.
    let k = rt
        .launch(vector_add::kernel(
            "va-bad",
            resident::UnifiedBuffer::from_slice(&d, &a[..10], Default::default()).unwrap(),
            resident::UnifiedBuffer::from_slice(&d, &b[..10], Default::default()).unwrap(),
            resident::UnifiedBuffer::new(&d, 10, Default::default()).unwrap(),
        ))
        .unwrap();
    k.activate().unwrap();
    let t = std::time::Duration::from_secs(5);
    assert_eq!(
        k.call(vector_add::AddRange { offset: 5, len: 6 }, t)
            .unwrap()
            .ok,
        0
    );
    assert_eq!(
        k.call(
            vector_add::AddRange {
                offset: u64::MAX,
                len: 2
            },
            t
        )
        .unwrap()
        .ok,
        0
    );
    assert_eq!(
        k.call(vector_add::AddRange { offset: 5, len: 5 }, t)
            .unwrap()
            .ok,
        1
    );
    k.terminate().unwrap();
}

#[test]
fn pagerank_full_matches_the_networkx_style_reference() {
    let (rt, d) = cpu();
    let p = pagerank::Params::default();
    for (nodes, k, seed) in [(1, 1, 1), (50, 3, 7), (2000, 5, 42)] {
        let g = generate_graph(nodes, k, seed).unwrap();
        let want = pagerank::reference(&g, p).unwrap();
        let got = pagerank::run_full(&rt, &d, &g, p).unwrap();
        pagerank::check_full(&got, &want).unwrap();
        assert!((got.ranks.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        // The device protocol (many small step messages per iteration) on the CPU handler.
        let got = pagerank::run_full_chunked(&rt, &d, &g, p, 7).unwrap();
        pagerank::check_full(&got, &want).unwrap();
    }
}

/// The CPU step's two forms (shares computed once per step for a range of at least half the
/// graph, per edge otherwise) write the same ranks bit for bit, and buffers that do not
/// describe a graph are refused (`ok == 0`), never a handler panic.
#[test]
fn pagerank_step_forms_agree_and_bad_buffers_are_refused() {
    let g = generate_graph(1000, 4, 3).unwrap();
    let csr = pagerank::Csr::new(&g);
    let n = g.nodes();
    let start = || {
        let mut x = vec![0.0; 2 * n];
        x[..n].fill(1.0 / n as f64);
        x
    };
    let msg = |lo: usize, hi: usize| pagerank::PageRankStep {
        base: 0.15 / n as f64,
        damping: 0.85,
        iter: 0,
        lo: lo as u32,
        hi: hi as u32,
        _pad: 0,
    };
    let (off, src, deg) = (&csr.in_offsets, &csr.in_sources, &csr.out_degree);
    let mut whole = start();
    let a = pagerank::step(off, src, deg, &mut whole, &msg(0, n));
    // 0..499 per edge (under half the graph), 499..1000 with shares.
    let mut split = start();
    let b = pagerank::step(off, src, deg, &mut split, &msg(0, 499));
    let c = pagerank::step(off, src, deg, &mut split, &msg(499, n));
    assert_eq!((a.ok, b.ok, c.ok), (1, 1, 1));
    assert!(whole == split, "the two forms of the step differ");
    assert!(
        (a.l1 - (b.l1 + c.l1)).abs() <= 1e-12 * a.l1,
        "{a:?} {b:?} {c:?}"
    );

    // A source outside the graph, offsets going backwards, offsets past the sources.
    let mut bad_src = src.clone();
    bad_src[17] = n as u32;
    let mut back = off.clone();
    back[500] = back[499] - 1;
    let mut past = off.clone();
    past[n] += 1;
    for (o, s, what) in [
        (off, &bad_src, "a source outside the graph"),
        (&back, src, "offsets going backwards"),
        (&past, src, "offsets past the sources"),
    ] {
        for (lo, hi) in [(0, n), (0, 100)] {
            let r = pagerank::step(o, s, deg, &mut start(), &msg(lo, hi));
            assert_eq!(r.ok, 0, "{what}, range {lo}..{hi}: {r:?}");
        }
    }
}

/// Values printed by networkx 3.6.1 (`networkx.algorithms.link_analysis.pagerank_alg.
/// _pagerank_python`, the definition `pagerank` implements; the scipy path needs numpy).
#[test]
fn pagerank_equals_networkx_on_dangling_nodes_self_loops_and_duplicates() {
    // nx.DiGraph([(1,2),(2,3),(3,1),(3,4),(5,5),(1,2)]): node 4 dangling, 5 a self-loop,
    // (1,2) twice.
    let text = "# comment\n1 2\n2 3\n\n3 1\n3 4 # trailing comment\n5 5\n1 2\n";
    let g = parse_edge_list(std::path::Path::new("t.txt"), text.as_bytes()).unwrap();
    assert_eq!(g.nodes(), 5);
    assert_eq!(g.edges.len(), 5, "duplicate counted once, self-loop kept");
    let nx = [
        0.1376618146958882,
        0.17041553103813492,
        0.19825629079831525,
        0.1376618146958882,
        0.3560045487717735,
    ];
    let (rt, d) = cpu();
    let p = pagerank::Params::default();
    let got = pagerank::run_full(&rt, &d, &g, p).unwrap();
    for (a, b) in got.ranks.iter().zip(nx) {
        assert!(
            (a - b).abs() <= pagerank::FULL_TOLERANCE * b,
            "{a} vs networkx {b}"
        );
    }
    pagerank::check_full(&got, &pagerank::reference(&g, p).unwrap()).unwrap();
    // A 41-node random graph from networkx (node 41 has no in-edges; ids 0..39 and 41).
    let g = resident_workloads::input::read_edge_list(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nx41.txt"),
    )
    .unwrap();
    let nx41 = include_str!("data/nx41.ranks")
        .split_whitespace()
        .map(|t| t.parse::<f64>().unwrap())
        .collect::<Vec<_>>();
    let got = pagerank::run_full(&rt, &d, &g, p).unwrap();
    assert_eq!(got.ranks.len(), nx41.len());
    for (a, b) in got.ranks.iter().zip(&nx41) {
        assert!(
            (a - b).abs() <= pagerank::FULL_TOLERANCE * b,
            "{a} vs networkx {b}"
        );
    }
}

#[test]
fn pagerank_reports_non_convergence_as_a_typed_error() {
    let (rt, d) = cpu();
    let g = generate_graph(500, 3, 1).unwrap();
    let p = pagerank::Params {
        max_iter: 2,
        ..Default::default()
    };
    assert!(matches!(
        pagerank::reference(&g, p),
        Err(WorkloadError::NotConverged { iterations: 2, .. })
    ));
    assert!(matches!(
        pagerank::run_full(&rt, &d, &g, p),
        Err(WorkloadError::NotConverged { iterations: 2, .. })
    ));
}

#[test]
fn streaming_pagerank_tracks_the_recompute_after_every_batch() {
    let (rt, d) = cpu();
    let g = generate_graph(3000, 4, 9).unwrap();
    // A tight tolerance so the comparison bound (2 d/(1-d) N tol = 3.4e-5) means something.
    let p = pagerank::Params {
        tol: 1e-9,
        ..Default::default()
    };
    let mut ups = pagerank::generate_updates(&g, 6, 40, 5);
    // Make some nodes dangling and un-dangling (the uniform residual path), and add junk.
    let u = g.edges[0].0;
    let outs: Vec<_> = g.edges.iter().filter(|e| e.0 == u).cloned().collect();
    ups[2].extend(outs.iter().map(|&(s, t)| pagerank::EdgeUpdate {
        src: s,
        dst: t,
        op: pagerank::OP_REMOVE,
        _pad: 0,
    }));
    ups[3].push(pagerank::EdgeUpdate {
        src: u,
        dst: 7,
        op: pagerank::OP_ADD,
        _pad: 0,
    });
    ups[4].push(pagerank::EdgeUpdate {
        src: 99_999,
        dst: 1,
        op: pagerank::OP_ADD,
        _pad: 0,
    });
    ups[4].push(pagerank::EdgeUpdate {
        src: 1,
        dst: 2,
        op: 77,
        _pad: 0,
    });
    let (steps, ranks) = pagerank::run_stream(&rt, &d, &g, p, &ups, |_| {}).unwrap();
    assert_eq!(steps.len(), 6);
    for s in &steps {
        assert!(
            s.l1_diff <= pagerank::stream_tolerance(g.nodes(), p),
            "{s:?}"
        );
        assert!(s.pushes > 0 && s.applied > 0, "{s:?}");
    }
    // The final ranks agree with an independent recompute on the final graph.
    let fg = pagerank::apply_updates(&g, &ups);
    let want = pagerank::reference(&fg, p).unwrap();
    let l1: f64 = ranks
        .iter()
        .zip(&want.ranks)
        .map(|(a, b)| (a - b).abs())
        .sum();
    assert!(l1 <= pagerank::stream_tolerance(g.nodes(), p), "l1 {l1:e}");
}

#[test]
fn pipeline_matches_the_reference_in_order() {
    let (rt, _) = cpu();
    let mut values: Vec<f64> = (0..20_000)
        .map(|i| (i % 250) as f64 - 50.0 + 0.37)
        .collect();
    values.extend([
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        100.0,
        54.772,
        83.67,
    ]);
    let r = pipeline::run(&rt, &values, |_| {}).unwrap();
    pipeline::check(&r.scored, &values).unwrap();
    assert_eq!(pipeline::score(0.5).1, pipeline::LOW);
    assert_eq!(pipeline::score(0.6).1, pipeline::MEDIUM);
    assert_eq!(pipeline::score(0.9).1, pipeline::HIGH);
    let mut bad = r.scored.clone();
    bad.swap(0, 1);
    assert!(pipeline::check(&bad, &values).is_err());
}

#[test]
fn anomaly_actor_and_stateless_match_the_reference_and_catch_every_injected_spike() {
    let (rt, d) = cpu();
    let (readings, spikes) = generate_readings(60_000, 50, 997, 11).unwrap();
    assert!(spikes.len() > 20, "{} spikes", spikes.len());
    let r = anomaly::slot(&readings);
    for batch in [100, 500, 1000] {
        let a = anomaly::run_actor(&rt, &d, &r, batch, anomaly::IN_FLIGHT, |_| {}).unwrap();
        anomaly::check(&a, &r).unwrap();
        anomaly::check(
            &anomaly::run_actor(&rt, &d, &r, batch, 1, |_| {}).unwrap(),
            &r,
        )
        .unwrap();
        let s = anomaly::run_stateless(&d, &r, batch, |_| {}).unwrap();
        anomaly::check(&s, &r).unwrap();
        let alerted: std::collections::HashSet<u64> = a.alerts.iter().map(|x| x.index).collect();
        for i in &spikes {
            assert!(
                alerted.contains(&(*i as u64)),
                "spike at {i} not alerted (batch {batch})"
            );
        }
    }
}

#[test]
fn anomaly_follows_the_definition_on_one_sensor_in_one_batch() {
    // 100 readings of one sensor alternate 10/12 (v > 0), then a spike: the spike is the
    // 101st reading (100 prior) and must alert; the same spike as the 100th reading must not.
    let (rt, d) = cpu();
    let mut rs: Vec<SensorReading> = (0..100)
        .map(|i| SensorReading {
            sensor: 7,
            value: if i % 2 == 0 { 10.0 } else { 12.0 },
        })
        .collect();
    rs.push(SensorReading {
        sensor: 7,
        value: 40.0,
    });
    let r = anomaly::slot(&rs);
    let a = anomaly::run_actor(&rt, &d, &r, 1000, 2, |_| {}).unwrap();
    anomaly::check(&a, &r).unwrap();
    assert_eq!(a.alerts.len(), 1);
    assert_eq!((a.alerts[0].index, a.alerts[0].sensor), (100, 7));
    let mut early: Vec<SensorReading> = rs[..99].to_vec();
    early.push(SensorReading {
        sensor: 7,
        value: 40.0,
    });
    let r = anomaly::slot(&early);
    let a = anomaly::run_actor(&rt, &d, &r, 1000, 2, |_| {}).unwrap();
    assert!(a.alerts.is_empty());
    // First reading: m = x, v = 0; a second equal reading has no score (v = 0).
    let mut s = anomaly::SensorStats::default();
    assert_eq!(anomaly::observe(&mut s, 5.0), None);
    assert_eq!(
        s,
        anomaly::SensorStats {
            m: 5.0,
            v: 0.0,
            n: 1
        }
    );
    anomaly::observe(&mut s, 7.0);
    assert!((s.m - 5.02).abs() < 1e-12 && (s.v - 0.99 * 0.04).abs() < 1e-12);
}

#[test]
fn anomaly_kernel_counts_and_reports_readings_it_cannot_place() {
    // A keyed kernel: a reading for a slot past the sensors is refused at send with a typed
    // error (the reading handed back, nothing queued); the statistics show it never folded.
    let (rt, d) = cpu();
    let k = rt
        .launch(anomaly::kernel("an-small", &d, 2).unwrap())
        .unwrap();
    k.activate().unwrap();
    let t = std::time::Duration::from_secs(5);
    k.send(anomaly::ReadingMsg {
        index: 0,
        value: 1.0,
        slot: 1,
        flush: 0,
    })
    .unwrap();
    let e = k
        .send(anomaly::ReadingMsg {
            index: 1,
            value: 1.0,
            slot: 9,
            flush: 0,
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            resident::Error::KeyOutOfRange {
                key: 9,
                keys: 2,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.into_message::<anomaly::ReadingMsg>().map(|r| r.index),
        Some(1)
    );
    let f = k.call(anomaly::flush_marker(0), t).unwrap();
    assert_eq!((f.slot, f.value, f.z), (anomaly::FLUSH, 0.0, 0.0));
    let s = anomaly::read_stats(&k, 2).unwrap();
    assert_eq!(s[1].n, 1);
    assert_eq!(s[0].n, 0);
    let tel = k.telemetry();
    assert_eq!((tel.messages_processed, tel.messages_refused), (2, 0));
    let report = k.terminate().unwrap();
    assert_eq!(report.processed, 2, "the reading and the flush marker");
}

/// The f32 checks accept what f32 arithmetic can change and nothing more.
#[test]
fn precision_aware_checks_accept_rounding_and_refuse_real_differences() {
    use resident_workloads::Precision;
    let (rs, _) = resident_workloads::input::generate_readings(5_000, 20, 97, 3).unwrap();
    let r = anomaly::slot(&rs);
    let (alerts, stats) = anomaly::reference(&r);
    assert!(alerts.len() > 3);
    let exact = anomaly::RunReport {
        alerts: alerts.clone(),
        stats: stats.clone(),
        ..Default::default()
    };
    anomaly::check_with(&exact, &r, Precision::F64).unwrap();
    anomaly::check_with(&exact, &r, Precision::F32).unwrap();
    // z off by 1e-4 relative: fine for f32 handlers, not for f64 ones.
    let mut nudged = exact.clone();
    nudged.alerts.iter_mut().for_each(|a| a.z *= 1.0 + 1e-4);
    nudged.stats.iter_mut().for_each(|s| s.v *= 1.0 + 1e-5);
    anomaly::check_with(&nudged, &r, Precision::F32).unwrap();
    assert!(anomaly::check_with(&nudged, &r, Precision::F64).is_err());
    // A missing clear alert, an extra alert, a wrong count: refused at both precisions.
    let clear = alerts
        .iter()
        .position(|a| a.z > 4.5)
        .expect("a clear spike");
    let mut missing = exact.clone();
    missing.alerts.remove(clear);
    assert!(anomaly::check_with(&missing, &r, Precision::F32).is_err());
    let mut extra = exact.clone();
    let quiet = (0..r.slots.len() as u64)
        .find(|i| !alerts.iter().any(|a| a.index == *i))
        .unwrap();
    extra.alerts.push(anomaly::Alert {
        index: quiet,
        sensor: r.sensor_ids[r.slots[quiet as usize] as usize],
        value: 0.0,
        z: 5.0,
    });
    assert!(anomaly::check_with(&extra, &r, Precision::F32).is_err());
    let mut count = exact.clone();
    count.stats[0].n += 1;
    assert!(anomaly::check_with(&count, &r, Precision::F32).is_err());

    // Pipeline: a level flip is accepted only at a boundary.
    let values = [54.772_25, 10.0, 90.0]; // 0.5477225^2 = 0.3 (within f32 rounding)
    let mut got = pipeline::reference(&values);
    got[0].level = 1 - got[0].level.min(1);
    pipeline::check_with(&got, &values, Precision::F32).unwrap();
    got[2].level = 0;
    assert!(pipeline::check_with(&got, &values, Precision::F32).is_err());

    // PageRank: f32 L1 tolerance, iteration count within 2.
    let g = generate_graph(300, 4, 5).unwrap();
    let want = pagerank::reference(&g, pagerank::Params::default()).unwrap();
    let mut near = want.clone();
    near.ranks[0] += 1e-5;
    near.iterations += 1;
    pagerank::check_full_with(&near, &want, Precision::F32).unwrap();
    assert!(pagerank::check_full_with(&near, &want, Precision::F64).is_err());
    near.ranks[1] += 1e-3;
    assert!(pagerank::check_full_with(&near, &want, Precision::F32).is_err());
}

/// The streaming kernel's operation codes are written three times (Rust, CUDA C, WGSL): they
/// must agree.
#[test]
fn streaming_op_codes_agree_in_rust_cuda_and_wgsl() {
    use resident_workloads::device::{cuda, wgsl};
    use resident_workloads::pagerank::op;
    let ops = [
        ("ADD", op::ADD),
        ("REMOVE", op::REMOVE),
        ("SYNC", op::SYNC),
        ("PUSH", op::PUSH),
        ("TAKE", op::TAKE),
        ("UNIFORM", op::UNIFORM),
        ("RESET", op::RESET),
        ("FILL", op::FILL),
        ("SCATTER", op::SCATTER),
        ("GATHER", op::GATHER),
        ("RESIDUAL", op::RESIDUAL),
        ("UNKNOWN", op::UNKNOWN),
    ];
    for (name, code) in ops {
        let c = format!("#define PRS_{name} {code}u");
        let w = format!("const PRS_{name}: u32 = {code}u;");
        assert!(
            cuda::PAGERANK_STREAM_CU.lines().any(|l| l.starts_with(&c)),
            "{c} missing in pagerank_stream.cu"
        );
        assert!(
            wgsl::PAGERANK_STREAM_WGSL.lines().any(|l| l == w),
            "{w} missing in pagerank_stream.wgsl"
        );
    }
}
