//! The streaming PageRank check can fail: a kernel that missed an edge change, or got one
//! again after its inverse, holds a residual that is not the residual of its ranks on the
//! graph it should hold, and `StreamPageRank::verify` says so; the same kernel given the
//! changes as sent passes, with the rounding allowance far below what one wrong change moves.
//! On the CPU always, on CudaSim and wgpu when present (`SKIP:` otherwise).

mod common;

use resident::backend::DeviceHandle;
use resident::prelude::*;
use resident_workloads::input::generate_graph;
use resident_workloads::pagerank::{
    self, apply_to, refreshed_below_threshold, DynGraph, EdgeUpdate, Params, StreamPageRank,
    OP_ADD, OP_REMOVE,
};
use resident_workloads::{Precision, WorkloadError};

fn e(src: u32, dst: u32, op: u32) -> EdgeUpdate {
    EdgeUpdate {
        src,
        dst,
        op,
        _pad: 0,
    }
}

/// Launches a kernel on `g`, computes its ranks, sends `sent`, refreshes, and verifies it
/// against `g` with `truth` applied (what should have been sent).
fn refresh_and_verify(
    rt: &Runtime,
    d: &DeviceHandle,
    g: &resident_workloads::input::EdgeList,
    p: Params,
    id: &str,
    sent: &[EdgeUpdate],
    truth: &[EdgeUpdate],
) -> Result<pagerank::StreamCheck, WorkloadError> {
    let mut s = StreamPageRank::launch(rt, d, g, p, id)?;
    let out = (|| {
        s.recompute()?;
        s.update(sent)?;
        s.refresh()?;
        let mut expected = DynGraph::new(g);
        apply_to(&mut expected, truth);
        let c = s.verify(&expected)?;
        refreshed_below_threshold(&c, p, Precision::of(d.kind()))?;
        Ok(c)
    })();
    s.terminate()?;
    out
}

fn wrong_changes_fail(rt: &Runtime, d: &DeviceHandle) {
    let name = d.kind();
    // Small enough that one change moves every rank it touches well above rounding (ranks
    // are at least (1 - d) / N), deep tolerance so the refresh really pushes.
    let g = generate_graph(400, 3, 21).unwrap();
    let p = Params {
        tol: 1e-9,
        ..Default::default()
    };
    let mut batch = pagerank::generate_updates(&g, 1, 30, 4).remove(0);
    // An edge added and removed again in the same batch: present in neither graph. Its
    // source is the node whose share x[u] / (out(u) + 1) is largest, so that the duplicate
    // below moves the residual most (by 2 d x[u] / (out(u) + 1)).
    let x = pagerank::reference(&g, p).unwrap().ranks;
    let out = |u: u32| g.edges.iter().filter(|e| e.0 == u).count();
    let u = (0..g.nodes() as u32)
        .max_by(|&a, &b| {
            let share = |v: u32| x[v as usize] / (out(v) + 1) as f64;
            share(a).total_cmp(&share(b))
        })
        .unwrap();
    let w = (0..g.nodes() as u32)
        .rev()
        .find(|&w| !g.edges.contains(&(u, w)))
        .unwrap();
    batch.push(e(u, w, OP_ADD));
    batch.push(e(u, w, OP_REMOVE));
    // The first change removes an existing edge (generate_updates' even changes do).
    let dropped = batch[0];
    assert_eq!(dropped.op, OP_REMOVE);
    assert!(g.edges.contains(&(dropped.src, dropped.dst)));
    assert!(batch[1..]
        .iter()
        .all(|c| (c.src, c.dst) != (dropped.src, dropped.dst)));

    // As sent: passes, with room to spare.
    let ok = refresh_and_verify(rt, d, &g, p, "check-ok", &batch, &batch)
        .unwrap_or_else(|err| panic!("{name}: the correct stream fails the check: {err}"));
    println!("{name}: correct stream: {ok:?}");
    assert!(ok.mismatch <= ok.mismatch_bound, "{name}: {ok:?}");
    // An exactly repeated change is refused by the kernel as by the host's replay (a
    // duplicate add finds the edge present): not a wrong change, and it passes.
    let mut repeated_in_place = batch.clone();
    repeated_in_place.insert(1, batch[1]);
    refresh_and_verify(rt, d, &g, p, "check-rep", &repeated_in_place, &batch)
        .unwrap_or_else(|err| panic!("{name}: a refused duplicate fails the check: {err}"));

    // A dropped change: the kernel keeps an edge the graph lost.
    let sent: Vec<EdgeUpdate> = batch[1..].to_vec();
    match refresh_and_verify(rt, d, &g, p, "check-drop", &sent, &batch) {
        Err(WorkloadError::Mismatch { detail, .. }) => {
            println!("{name}: dropped change: {detail}");
            assert!(detail.contains("not the residual"), "{name}: {detail}");
        }
        other => panic!("{name}: a dropped change passes the check: {other:?}"),
    }

    // A duplicated change: the add of u -> w delivered again after its removal.
    let mut sent = batch.clone();
    sent.push(e(u, w, OP_ADD));
    match refresh_and_verify(rt, d, &g, p, "check-dup", &sent, &batch) {
        Err(WorkloadError::Mismatch { detail, .. }) => {
            println!("{name}: duplicated change: {detail}");
            assert!(detail.contains("not the residual"), "{name}: {detail}");
        }
        other => panic!("{name}: a duplicated change passes the check: {other:?}"),
    }
}

#[test]
fn wrong_changes_fail_the_check_on_the_cpu() {
    let (rt, d) = common::open(Backend::Cpu, "-", "stream_check").unwrap();
    wrong_changes_fail(&rt, &d);
}

#[test]
fn wrong_changes_fail_the_check_on_cudasim() {
    if let Some((rt, d)) =
        common::open(Backend::CudaSim, "RESIDENT_REQUIRE_CUDASIM", "stream_check")
    {
        wrong_changes_fail(&rt, &d);
    }
}

#[test]
fn wrong_changes_fail_the_check_on_wgpu() {
    if let Some((rt, d)) = common::open(Backend::Wgpu, "RESIDENT_REQUIRE_WGPU", "stream_check") {
        wrong_changes_fail(&rt, &d);
    }
}

/// The bound a streaming run is held to is the residual actually left, not the worst case:
/// at networkx's tol on a graph where the worst case (`2 d/(1-d) N tol`) is above 2, the
/// largest L1 distance two rank vectors can have, the bound of every step is below it.
#[test]
fn the_stream_bound_is_below_two_where_the_worst_case_is_not() {
    let (rt, d) = common::open(Backend::Cpu, "-", "stream_check").unwrap();
    let g = generate_graph(200_000, 5, 3).unwrap();
    let p = Params::default();
    let worst = pagerank::stream_tolerance(g.nodes(), p);
    assert!(worst > 2.0, "{worst}");
    let batches = pagerank::generate_updates(&g, 3, 100, 6);
    let (steps, _) = pagerank::run_stream(&rt, &d, &g, p, &batches, |_| {}).unwrap();
    for s in &steps {
        println!(
            "l1 {:e} <= bound {:e} (worst case {worst:e}); {:?}",
            s.l1_diff, s.bound, s.check
        );
        assert!(s.bound < 2.0, "{s:?}");
        assert!(s.check.mismatch <= s.check.mismatch_bound, "{s:?}");
    }
}
