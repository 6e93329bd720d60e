//! Streaming PageRank's device handlers under contention, checked end to end (a stress test
//! with a checksum, for the lock-free parts: the ticket order of one source's changes, the
//! atomic residual pushes, the queue flags and counters, the pool allocator):
//!
//! - batches whose changes pile onto a few hot sources, with adds and removes of the same
//!   edges interleaved (the order decides the final graph), so one device batch holds long
//!   chains of one source's changes and many pushes hit the same nodes at once;
//! - after every batch the incremental ranks are compared with a recompute from scratch, and
//!   at the end with the sequential f64 reference on the final graph (`apply_updates`): a
//!   change applied out of order, lost, or applied twice, or residual mass lost in a race,
//!   moves the ranks past the tolerance;
//! - the device's edge pool filled on purpose: the refused adds are a typed error naming the
//!   count, and the kernel keeps working.
//!
//! CudaSim and wgpu (lavapipe in CI); an absent backend prints `SKIP:` (a failure with
//! `RESIDENT_REQUIRE_CUDASIM=1` / `RESIDENT_REQUIRE_WGPU=1`). Nothing here ran on a GPU.

mod common;

use resident::backend::DeviceHandle;
use resident::prelude::*;
use resident_workloads::input::{generate_graph, EdgeList};
use resident_workloads::pagerank::{self, EdgeUpdate, Params, StreamPageRank, OP_ADD, OP_REMOVE};
use resident_workloads::{Precision, WorkloadError};

fn devices(test: &str) -> Vec<(Runtime, DeviceHandle)> {
    [
        (Backend::CudaSim, "RESIDENT_REQUIRE_CUDASIM"),
        (Backend::Wgpu, "RESIDENT_REQUIRE_WGPU"),
    ]
    .into_iter()
    .filter_map(|(b, req)| common::open(b, req, &format!("stream_stress::{test}")))
    .collect()
}

/// `batches` batches of `per_batch` changes on `hot` sources: each source toggles edges to a
/// small set of targets (add, remove, add again ...), interleaved across sources.
fn hot_updates(
    n: u32,
    hot: u32,
    batches: usize,
    per_batch: usize,
    seed: u64,
) -> Vec<Vec<EdgeUpdate>> {
    let mut s = seed;
    let mut next = move || {
        // SplitMix64.
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    (0..batches)
        .map(|_| {
            (0..per_batch)
                .map(|_| {
                    let src = (next() % hot as u64) as u32 * 7 % n;
                    let dst = (next() % 24) as u32 * 13 % n;
                    let op = if next() % 2 == 0 { OP_ADD } else { OP_REMOVE };
                    EdgeUpdate {
                        src,
                        dst,
                        op,
                        _pad: 0,
                    }
                })
                .collect()
        })
        .collect()
}

fn check_final(
    name: &str,
    g: &EdgeList,
    ups: &[Vec<EdgeUpdate>],
    ranks: &[f64],
    p: Params,
    prec: Precision,
) {
    let want = pagerank::reference(&pagerank::apply_updates(g, ups), p).unwrap();
    let l1: f64 = ranks
        .iter()
        .zip(&want.ranks)
        .map(|(a, b)| (a - b).abs())
        .sum();
    let tol = pagerank::stream_tolerance_with(g.nodes(), p, prec);
    println!("{name}: final ranks {l1:e} from the reference (allowed {tol:e})");
    assert!(
        l1 <= tol,
        "{name}: final ranks {l1:e} from the reference (> {tol:e})"
    );
}

#[test]
fn hot_sources_and_interleaved_toggles_match_the_reference() {
    for (rt, d) in devices("hot_sources_and_interleaved_toggles_match_the_reference") {
        let name = d.kind();
        let g = generate_graph(2000, 3, 21).unwrap();
        let p = Params {
            tol: 1e-9,
            ..Default::default()
        };
        for seed in [1u64, 2, 3] {
            let ups = hot_updates(g.nodes() as u32, 5, 4, 300, seed);
            let (steps, ranks) = pagerank::run_stream(&rt, &d, &g, p, &ups, |_| {})
                .unwrap_or_else(|e| panic!("{name}, seed {seed}: {e}"));
            assert!(steps.iter().all(|s| s.applied > 0), "{name}: {steps:?}");
            check_final(
                &format!("{name}, seed {seed}"),
                &g,
                &ups,
                &ranks,
                p,
                Precision::of(d.kind()),
            );
        }
    }
}

#[test]
fn a_full_edge_pool_is_a_typed_error_and_the_kernel_goes_on() {
    for (rt, d) in devices("a_full_edge_pool_is_a_typed_error_and_the_kernel_goes_on") {
        let name = d.kind();
        // 3000 nodes without edges: room 4 each (12 000), as much again spare. Two sources
        // gaining an edge to every node need 2 x (8 + 16 + ... + 4096) > 12 000 entries.
        let g = EdgeList {
            ids: (0..3000).collect(),
            edges: Vec::new(),
        };
        let p = Params::default();
        let mut s = StreamPageRank::launch(&rt, &d, &g, p, &format!("full-{name}")).unwrap();
        s.recompute().unwrap();
        let ups: Vec<EdgeUpdate> = [0u32, 1]
            .iter()
            .flat_map(|&src| {
                (2..3000u32).map(move |dst| EdgeUpdate {
                    src,
                    dst,
                    op: OP_ADD,
                    _pad: 0,
                })
            })
            .collect();
        s.update(&ups).unwrap();
        match s.refresh() {
            Err(WorkloadError::Refused { count, reason, .. }) => {
                assert!(
                    count > 0 && reason.contains("pool is full"),
                    "{name}: {count} {reason}"
                );
                println!("{name}: {count} adds refused: {reason}");
            }
            other => panic!("{name}: expected a refusal, got {other:?}"),
        }
        // With the spare sized for it, the same additions all apply.
        let mut big = StreamPageRank::launch_with_spare(
            &rt,
            &d,
            &g,
            p,
            &format!("roomy-{name}"),
            Some(20_000),
        )
        .unwrap();
        big.recompute().unwrap();
        big.update(&ups).unwrap();
        let r = big.refresh().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((r.applied, r.rejected), (ups.len() as u64, 0), "{name}");
        big.terminate().unwrap();
        // The kernel goes on: a removal applies and the next refresh is clean.
        s.update(&[EdgeUpdate {
            src: 0,
            dst: 2,
            op: OP_REMOVE,
            _pad: 0,
        }])
        .unwrap();
        let r = s.refresh().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((r.applied, r.rejected), (1, 0), "{name}: {r:?}");
        let x = s.ranks().unwrap();
        assert!(x.iter().all(|v| v.is_finite() && *v > 0.0), "{name}");
        s.terminate().unwrap();
    }
}

/// A graph with a third of its nodes dangling, and changes that make nodes dangling and live
/// again: the uniform residual (the dangling mass) is pushed in closed form (`c / (1 - d D /
/// N)`, the dangling nodes' own feedback absorbed), and the ranks still match the reference.
#[test]
fn dangling_heavy_graphs_match_the_reference() {
    let mut all = devices("dangling_heavy_graphs_match_the_reference");
    all.extend(common::open(Backend::Cpu, "-", "stream_stress"));
    for (rt, d) in all {
        let name = d.kind();
        let mut g = generate_graph(1500, 3, 5).unwrap();
        g.edges.retain(|&(u, _)| u % 3 != 0);
        let p = Params {
            tol: 1e-9,
            ..Default::default()
        };
        let mut ups: Vec<Vec<EdgeUpdate>> = Vec::new();
        for b in 0..4u32 {
            let mut batch = Vec::new();
            // Make 10 live nodes dangling, and give 10 dangling nodes an edge.
            for (u, v) in g.edges.iter().filter(|e| e.0 % 50 == 1 + b).take(30) {
                batch.push(EdgeUpdate {
                    src: *u,
                    dst: *v,
                    op: OP_REMOVE,
                    _pad: 0,
                });
            }
            for i in 0..10u32 {
                batch.push(EdgeUpdate {
                    src: 3 * (b * 10 + i),
                    dst: 7 * i + 1,
                    op: OP_ADD,
                    _pad: 0,
                });
            }
            ups.push(batch);
        }
        let mut s = StreamPageRank::launch(&rt, &d, &g, p, &format!("dangling-{name}")).unwrap();
        s.recompute().unwrap();
        for batch in &ups {
            s.update(batch).unwrap();
            let r = s.refresh().unwrap_or_else(|e| panic!("{name}: {e}"));
            println!("{name}: {r:?}");
        }
        let x = s.ranks().unwrap();
        s.terminate().unwrap();
        check_final(
            &format!("{name}, dangling"),
            &g,
            &ups,
            &x,
            p,
            Precision::of(d.kind()),
        );
    }
}
