//! Checking a streaming kernel against the graph it should hold: the residual and error bound
//! computed on the host ([`residual_of`], [`error_bound`], [`stream_tolerance`]), the update
//! streams the checks and benchmarks feed ([`generate_updates`], [`apply_updates`]), and the
//! whole check ([`run_stream`]).

use super::*;

/// What [`StreamPageRank::verify`] found.
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamCheck {
    /// L1 distance between the kernel's residual (per node plus the uniform part) and the
    /// residual of the kernel's ranks on the expected graph, computed on the host in f64.
    pub mismatch: f64,
    /// The most `mismatch` may be (rounding); more is an error.
    pub mismatch_bound: f64,
    /// L1 norm of the host's residual.
    pub residual_l1: f64,
    /// Largest residual the kernel holds for one node (per node or uniform part). After a
    /// refresh it is at most the push threshold `d tol`.
    pub kernel_residual_max: f64,
    /// `residual_l1 / (1 - d)`: the most the ranks' L1 distance to the exact PageRank of the
    /// expected graph can be.
    pub error_bound: f64,
}

/// The residual `b + d M x - x` of ranks `x` on `g` (networkx's system: teleport `(1 - d) / N`,
/// dangling nodes' mass spread uniformly), in f64, parallel over nodes.
pub fn residual_of(g: &DynGraph, x: &[f64], p: Params) -> Vec<f64> {
    let n = g.nodes();
    let nf = n as f64;
    let dangling: f64 = (0..n)
        .into_par_iter()
        .filter(|&u| g.out[u].is_empty())
        .map(|u| x[u])
        .sum();
    let base = p.damping * dangling / nf + (1.0 - p.damping) / nf;
    (0..n)
        .into_par_iter()
        .map(|v| {
            let s: f64 = g.inn[v]
                .iter()
                .map(|&u| x[u as usize] / g.out[u as usize].len() as f64)
                .sum();
            base + p.damping * s - x[v]
        })
        .collect()
}

/// The certified L1 error of ranks `x` on `g`: `||b + d M x - x||_1 / (1 - d)` (see
/// [`StreamPageRank::verify`]).
pub fn error_bound(g: &DynGraph, x: &[f64], p: Params) -> f64 {
    residual_of(g, x, p).iter().map(|r| r.abs()).sum::<f64>() / (1.0 - p.damping)
}

/// One update batch of a streaming run.
#[derive(Clone, Debug)]
pub struct StreamStep {
    /// Incremental refresh: wall time.
    pub incremental: Duration,
    /// Pushes of the refresh.
    pub pushes: u64,
    /// Edges and nodes visited by the refresh.
    pub incremental_work: u64,
    /// Push rounds of the refresh (round trips to the kernel; 1 on the CPU).
    pub rounds: u32,
    /// Recompute from scratch: wall time.
    pub recompute: Duration,
    /// Iterations of the recompute.
    pub recompute_iterations: u32,
    /// Edges and nodes visited by the recompute.
    pub recompute_work: u64,
    /// L1 distance between the two rank vectors.
    pub l1_diff: f64,
    /// The most `l1_diff` may be: the two kernels' certified errors
    /// ([`StreamCheck::error_bound`]) added, at most [`stream_tolerance_with`].
    pub bound: f64,
    /// The incremental kernel's check against the graph it should hold
    /// ([`StreamPageRank::verify`]).
    pub check: StreamCheck,
    /// Updates applied (refused ones: duplicates, absent edges).
    pub applied: u64,
}

/// The worst-case L1 distance between incremental and recomputed ranks: `2 d/(1-d) N tol`
/// (each within `d/(1-d) N tol` of the exact ranks). Above 2, the largest L1 distance two
/// rank vectors can have, once `N tol > 0.18` (networkx's `tol = 1e-6` from 180 000 nodes):
/// the check of a streaming run uses the residual actually left instead
/// ([`StreamPageRank::verify`], [`StreamStep::bound`]); this is its ceiling.
pub fn stream_tolerance(nodes: usize, p: Params) -> f64 {
    2.0 * p.damping / (1.0 - p.damping) * nodes as f64 * p.tol
}

/// [`stream_tolerance`] for handlers computing at `precision`: at f32 plus
/// [`FULL_TOLERANCE_F32`](super::super::FULL_TOLERANCE_F32) (f32 rounding of ranks that sum to 1).
pub fn stream_tolerance_with(nodes: usize, p: Params, precision: crate::Precision) -> f64 {
    match precision {
        crate::Precision::F64 => stream_tolerance(nodes, p),
        crate::Precision::F32 => stream_tolerance(nodes, p) + super::super::FULL_TOLERANCE_F32,
    }
}

/// Deterministic update batches: each half removes an existing edge, half adds a random one.
pub fn generate_updates(
    g: &EdgeList,
    batches: usize,
    per_batch: usize,
    seed: u64,
) -> Vec<Vec<EdgeUpdate>> {
    let mut rng = crate::rng::SplitMix64::new(seed ^ 0x5EED);
    let n = g.nodes() as u64;
    (0..batches)
        .map(|_| {
            (0..per_batch)
                .map(|i| {
                    if i % 2 == 0 && !g.edges.is_empty() {
                        let (u, v) = g.edges[rng.below(g.edges.len() as u64) as usize];
                        EdgeUpdate {
                            src: u,
                            dst: v,
                            op: OP_REMOVE,
                            _pad: 0,
                        }
                    } else {
                        EdgeUpdate {
                            src: rng.below(n) as u32,
                            dst: rng.below(n) as u32,
                            op: OP_ADD,
                            _pad: 0,
                        }
                    }
                })
                .collect()
        })
        .collect()
}

/// Streaming PageRank: an incremental kernel and a recompute-from-scratch kernel get the same
/// update batches; after each batch both answer and are checked. Each kernel against the
/// graph it should hold ([`StreamPageRank::verify`]: its residual is the residual of its
/// ranks on that graph, within rounding, so a dropped, repeated or misapplied change fails);
/// the incremental kernel's residual left by the refresh at most the push threshold per node;
/// and the two rank vectors within the sum of their certified errors ([`StreamStep::bound`]).
/// `on_step` sees every step.
pub fn run_stream(
    rt: &Runtime,
    device: &DeviceHandle,
    g: &EdgeList,
    p: Params,
    batches: &[Vec<EdgeUpdate>],
    mut on_step: impl FnMut(&StreamStep),
) -> Result<(Vec<StreamStep>, Vec<f64>), WorkloadError> {
    let tag = unique();
    let mut inc = StreamPageRank::launch(rt, device, g, p, &format!("pagerank-inc-{tag}"))?;
    let mut full =
        match StreamPageRank::launch(rt, device, g, p, &format!("pagerank-scratch-{tag}")) {
            Ok(f) => f,
            Err(e) => {
                inc.terminate()?;
                return Err(e);
            }
        };
    let precision = crate::Precision::of(device.kind());
    let result = (|| {
        // The graph both kernels should hold, kept on the host.
        let mut truth = DynGraph::new(g);
        // Both start from the same from-scratch ranks.
        inc.recompute()?;
        full.recompute()?;
        let mut steps = Vec::with_capacity(batches.len());
        for ups in batches {
            inc.update(ups)?;
            let t = std::time::Instant::now();
            let a = inc.refresh()?;
            let incremental = t.elapsed();
            full.update(ups)?;
            let t = std::time::Instant::now();
            let b = full.recompute()?;
            let recompute_t = t.elapsed();
            apply_to(&mut truth, ups);
            let ca = inc.verify(&truth)?;
            let cb = full.verify(&truth)?;
            refreshed_below_threshold(&ca, p, precision)?;
            let xa = inc.ranks()?;
            let xb = full.ranks()?;
            let l1: f64 = xa.iter().zip(xb.iter()).map(|(a, b)| (a - b).abs()).sum();
            let bound = (ca.error_bound + cb.error_bound + ca.mismatch_bound + cb.mismatch_bound)
                .min(stream_tolerance_with(g.nodes(), p, precision));
            let step = StreamStep {
                incremental,
                pushes: a.pushes,
                incremental_work: a.work,
                rounds: a.rounds,
                recompute: recompute_t,
                recompute_iterations: b.iterations,
                recompute_work: b.work,
                l1_diff: l1,
                bound,
                check: ca,
                applied: a.applied,
            };
            on_step(&step);
            if l1.is_nan() || l1 > bound {
                return Err(WorkloadError::Mismatch {
                    workload: "pagerank-stream",
                    detail: format!("L1 distance to the recompute {l1:e} > {bound:e}"),
                });
            }
            steps.push(step);
        }
        Ok((steps, inc.ranks()?))
    })();
    let a = inc.terminate();
    let b = full.terminate();
    let out = result?;
    a?;
    b?;
    Ok(out)
}

/// After a refresh every node's residual, and the uniform part, is at most the push
/// threshold `d tol` (at f32 the threshold as the handler holds it, rounded to f32).
pub fn refreshed_below_threshold(
    c: &StreamCheck,
    p: Params,
    precision: crate::Precision,
) -> Result<(), WorkloadError> {
    let eps = p.damping * p.tol;
    let eps = match precision {
        crate::Precision::F64 => eps,
        crate::Precision::F32 => eps.max(eps as f32 as f64),
    };
    if c.kernel_residual_max.is_nan() || c.kernel_residual_max > eps * (1.0 + 1e-9) {
        return Err(WorkloadError::Mismatch {
            workload: "pagerank-stream",
            detail: format!(
                "the refresh left a residual of {:e}, above the push threshold {eps:e}",
                c.kernel_residual_max
            ),
        });
    }
    Ok(())
}

/// Applies a batch of changes to `d` as the kernel applies them (see [`apply_updates`]).
pub fn apply_to(d: &mut DynGraph, batch: &[EdgeUpdate]) {
    let n = d.nodes();
    for e in batch {
        if (e.src as usize) < n && (e.dst as usize) < n {
            match e.op {
                OP_ADD => {
                    d.add(e.src, e.dst);
                }
                OP_REMOVE => {
                    d.remove(e.src, e.dst);
                }
                _ => {}
            }
        }
    }
}

/// The graph after `batches` of changes, applied as the kernel applies them (changes naming a
/// node past the graph, duplicate adds, removals of absent edges and unknown ops change
/// nothing): the input of an independent check of a streaming run's final ranks.
pub fn apply_updates(g: &EdgeList, batches: &[Vec<EdgeUpdate>]) -> EdgeList {
    let mut d = DynGraph::new(g);
    for batch in batches {
        apply_to(&mut d, batch);
    }
    let mut edges: Vec<(u32, u32)> = d
        .out
        .iter()
        .enumerate()
        .flat_map(|(u, o)| o.iter().map(move |&v| (u as u32, v)))
        .collect();
    edges.sort_unstable();
    EdgeList {
        ids: g.ids.clone(),
        edges,
    }
}
