//! PageRank as a ring kernel, exactly networkx's `pagerank` definition: damping `d = 0.85`, no
//! personalization (`p = 1/N`), dangling nodes' mass spread uniformly, start `x = 1/N`, each
//! iteration `x'[v] = d * (sum over edges u->v of x[u] / out(u) + dangling / N) + (1 - d) / N`,
//! stop when the L1 change `sum |x' - x| < N * tol` (`tol = 1e-6`), and after `max_iter = 100`
//! iterations without that, a typed error ([`WorkloadError::NotConverged`], networkx's
//! `PowerIterationFailedConvergence`).
//!
//! **Full mode** ([`full_kernel`]): the graph in CSR (in-edges `in_offsets`/`in_sources`,
//! `out_degree`) and the ranks (two vectors, by iteration parity) are buffers bound to the
//! kernel; a message is one power-iteration step (pull form) over a node range
//! ([`PageRankStep`]), answered with the range's L1 change and dangling mass ([`StepDone`]).
//! The host sends an iteration's ranges, sums the answers and starts the next iteration, so
//! nothing but those scalars crosses between host and device. Checked against [`reference()`]
//! (a sequential push over the edge list, as networkx's Python loop): same iteration count,
//! every rank within relative [`FULL_TOLERANCE`] (f64 handlers), or L1 distance
//! [`FULL_TOLERANCE_F32`] for f32 handlers ([`check_full_with`]).
//!
//! **Streaming mode** ([`stream_kernel`]): messages add or remove edges; the ranks stay resident
//! in a bound buffer and are refreshed incrementally. The kernel keeps, besides the ranks `x`,
//! the residual `r = b + d M x - x` of the PageRank linear system (`b = (1-d)/N`, `M` the
//! transition matrix with uniform dangling columns) in a second bound buffer. An edge change
//! alters `M` in one column only, so it changes `r` only at the source's out-neighbours (or, for
//! a source that becomes or stops being dangling, by a uniform amount kept as one scalar).
//! A refresh then *pushes* residual (Gauss-Southwell: `x[u] += r[u]`, spread `d r[u] / out(u)`
//! to the out-neighbours) until every `|r[u]| <= eps = d * tol`, so `||x - x*||_1 <=
//! ||r||_1 / (1 - d) <= d/(1-d) * N * tol` -- the same bound networkx's stopping rule gives.
//! Why push rather than only a warm start: a warm-started power iteration still touches every
//! edge at least once per refresh (one full sweep just to measure the change), while the push
//! touches only the nodes whose residual an update made large, which for a small update batch
//! on a large graph is a tiny fraction. Work is proportional to the residual an update batch
//! creates, roughly `13 B / (N tol)` pushes for `B` edge changes.
//! The check ([`run_stream`]) holds each kernel to the graph it should hold: the host
//! recomputes, in f64, the residual of the kernel's ranks on that graph and the kernel's own
//! residual must equal it within rounding ([`StreamPageRank::verify`]), which a dropped,
//! repeated or misapplied edge change breaks by at least `2 d (1-d) / (N out(u))`. The
//! residual then bounds the ranks' error, `||x - x*||_1 <= ||r||_1 / (1-d)`, and the
//! incremental ranks must be within the sum of the two kernels' bounds of the ranks
//! recomputed from scratch (power iteration from `1/N` on the updated graph). The worst case
//! of that sum, `2 d/(1-d) N tol` ([`stream_tolerance`]), is only its ceiling: above 2 (the
//! largest L1 distance two rank vectors can have) for `N tol > 0.18`.

use std::time::Duration;

use rayon::prelude::*;
use resident::backend::{BackendKind, DeviceHandle};
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::UnifiedBuffer;

use crate::error::WorkloadError;
use crate::input::EdgeList;

/// networkx's `alpha`.
pub const DAMPING: f64 = 0.85;
/// networkx's `tol`.
pub const TOL: f64 = 1e-6;
/// networkx's `max_iter`.
pub const MAX_ITER: u32 = 100;
/// Full mode: relative error allowed per rank against the reference (summation order only).
pub const FULL_TOLERANCE: f64 = 1e-9;

/// Iteration parameters (networkx's defaults by `Default`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// Damping (`alpha`).
    pub damping: f64,
    /// Per-node tolerance; stop at L1 change `< N * tol`.
    pub tol: f64,
    /// Most iterations.
    pub max_iter: u32,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            damping: DAMPING,
            tol: TOL,
            max_iter: MAX_ITER,
        }
    }
}

/// Ranks and how they were reached.
#[derive(Clone, Debug, Default)]
pub struct Ranks {
    /// Rank per dense node.
    pub ranks: Vec<f64>,
    /// Iterations run.
    pub iterations: u32,
    /// Last L1 change.
    pub err: f64,
    /// Time inside the kernel (the run message's round trip), zero for host computations.
    pub kernel_time: Duration,
}

/// The graph in CSR by in-edges, with out-degrees (what the full kernel binds).
#[derive(Clone, Debug, Default)]
pub struct Csr {
    /// `in_sources[in_offsets[v] .. in_offsets[v + 1]]` are the sources of `v`'s in-edges.
    pub in_offsets: Vec<u64>,
    /// Sources of in-edges.
    pub in_sources: Vec<u32>,
    /// Out-degree per node.
    pub out_degree: Vec<u32>,
}

impl Csr {
    /// Builds the CSR of `g` (counting sort by destination).
    pub fn new(g: &EdgeList) -> Self {
        let n = g.nodes();
        let mut in_offsets = vec![0u64; n + 1];
        let mut out_degree = vec![0u32; n];
        for &(u, v) in &g.edges {
            in_offsets[v as usize + 1] += 1;
            out_degree[u as usize] += 1;
        }
        for i in 0..n {
            in_offsets[i + 1] += in_offsets[i];
        }
        let mut fill = in_offsets.clone();
        let mut in_sources = vec![0u32; g.edges.len()];
        for &(u, v) in &g.edges {
            in_sources[fill[v as usize] as usize] = u;
            fill[v as usize] += 1;
        }
        Csr {
            in_offsets,
            in_sources,
            out_degree,
        }
    }
}

/// The sequential reference: networkx's Python loop, node by node, pushing along out-edges.
pub fn reference(g: &EdgeList, p: Params) -> Result<Ranks, WorkloadError> {
    let n = g.nodes();
    if n == 0 {
        return Ok(Ranks::default());
    }
    let nf = n as f64;
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
    for &(u, v) in &g.edges {
        out[u as usize].push(v);
    }
    let mut x = vec![1.0 / nf; n];
    let mut err = f64::INFINITY;
    for it in 1..=p.max_iter {
        let xlast = std::mem::replace(&mut x, vec![0.0; n]);
        let danglesum: f64 = p.damping
            * (0..n)
                .filter(|&u| out[u].is_empty())
                .map(|u| xlast[u])
                .sum::<f64>();
        for u in 0..n {
            let wt = 1.0 / out[u].len() as f64;
            for &v in &out[u] {
                x[v as usize] += p.damping * xlast[u] * wt;
            }
            x[u] += danglesum / nf + (1.0 - p.damping) / nf;
        }
        err = x.iter().zip(&xlast).map(|(a, b)| (a - b).abs()).sum();
        if err < nf * p.tol {
            return Ok(Ranks {
                ranks: x,
                iterations: it,
                err,
                kernel_time: Duration::ZERO,
            });
        }
    }
    Err(WorkloadError::NotConverged {
        iterations: p.max_iter,
        err,
        threshold: nf * p.tol,
    })
}

/// The power iteration (pull form, parallel over nodes) on any in-edge structure. Returns
/// `(iterations, err, converged)`; `x` holds the ranks (it starts at `1/N`).
fn power_iterate<'g>(
    n: usize,
    in_of: impl Fn(usize) -> &'g [u32] + Sync,
    out_degree: impl Fn(usize) -> usize + Sync,
    p: Params,
    x: &mut [f64],
    next: &mut [f64],
    contrib: &mut Vec<f64>,
) -> (u32, f64, bool, u64) {
    let nf = n as f64;
    x.par_iter_mut().for_each(|e| *e = 1.0 / nf);
    contrib.resize(n, 0.0);
    let mut err = f64::INFINITY;
    let mut work = 0u64;
    for it in 1..=p.max_iter {
        let dangling: f64 = contrib
            .par_iter_mut()
            .enumerate()
            .map(|(u, c)| match out_degree(u) {
                0 => {
                    *c = 0.0;
                    x[u]
                }
                k => {
                    *c = x[u] / k as f64;
                    0.0
                }
            })
            .sum();
        let base = p.damping * dangling / nf + (1.0 - p.damping) / nf;
        let contrib_ref = &*contrib;
        let edges: u64 = next
            .par_iter_mut()
            .enumerate()
            .map(|(v, nv)| {
                let ins = in_of(v);
                let s: f64 = ins.iter().map(|&u| contrib_ref[u as usize]).sum();
                *nv = base + p.damping * s;
                ins.len() as u64
            })
            .sum();
        work += edges + n as u64;
        err = next.par_iter().zip(&*x).map(|(a, b)| (a - b).abs()).sum();
        x.copy_from_slice(next);
        if err < nf * p.tol {
            return (it, err, true, work);
        }
    }
    (p.max_iter, err, false, work)
}

resident::ring::device_message! {
    /// One power-iteration step over nodes `lo..hi` (full mode, every backend): with
    /// `old = ranks[(iter & 1) * N ..]` and `new = ranks[((iter + 1) & 1) * N ..]`, for each `v`
    /// in `lo..hi`: `new[v] = base + damping * sum(old[u] / out_degree[u])` over the sources `u`
    /// of `v`'s in-edges (`in_sources[in_offsets[v] .. in_offsets[v + 1]]`).
    pub struct PageRankStep {
        /// Teleport term added to every rank.
        pub base: f64,
        /// Damping factor.
        pub damping: f64,
        /// Iteration (its parity picks the halves of `ranks`).
        pub iter: u32,
        /// First node of the range.
        pub lo: u32,
        /// One past the last node.
        pub hi: u32,
        /// Padding (zero).
        pub _pad: u32,
    }
}

resident::ring::device_message! {
    /// A step's answer: `l1 = sum |new[v] - old[v]|` and `dangling = sum new[v]` over the
    /// nodes of `lo..hi` without out-edges; `ok == 0` when the range or the buffers are invalid.
    pub struct StepDone {
        /// L1 change over the range.
        pub l1: f64,
        /// Rank of the range's dangling nodes.
        pub dangling: f64,
        /// The step's iteration.
        pub iter: u32,
        /// First node of the range.
        pub lo: u32,
        /// One past the last node.
        pub hi: u32,
        /// 0 when the range or the buffers were invalid.
        pub ok: u32,
    }
}

resident::ring::device_message! {
    /// The answer to a run, a refresh or a recompute.
    pub struct PageRankDone {
        /// Last L1 change (power iteration) or residual L1 (push).
        pub err: f64,
        /// Edges and nodes visited.
        pub work: u64,
        /// Edge updates applied / refused since the last answer.
        pub applied: u64,
        /// Edge updates refused since the last answer.
        pub rejected: u64,
        /// Iterations (power iteration) or pushes (refresh, low 32 bits).
        pub iterations: u32,
        /// 1 when converged.
        pub converged: u32,
    }
}

/// One step on the host (the CPU handler): see [`PageRankStep`]. Parallel over the range's
/// nodes (rayon: every core of the pool); `ok == 0` when the range or the buffers are invalid
/// (nothing written, except for a source outside the graph, found while the range's new
/// ranks are written: the old half is never touched). [`step_with`] with a scratch vector of
/// its own.
pub fn step(
    off: &[u64],
    src: &[u32],
    deg: &[u32],
    ranks: &mut [f64],
    m: &PageRankStep,
) -> StepDone {
    step_with(off, src, deg, ranks, m, &mut Vec::new())
}

/// [`step`] with the CPU handler's scratch vector: when the range covers at least half the
/// graph, every source's share `old[u] / out_degree[u]` is computed once, in parallel, into
/// `contrib` (one division per node instead of one per edge, and one gather per edge instead
/// of two), then the range pulls from it. The shares are the same expression on the same
/// operands, so the result is bit for bit the one of the per-edge form (which smaller ranges
/// keep, as a device does).
pub fn step_with(
    off: &[u64],
    src: &[u32],
    deg: &[u32],
    ranks: &mut [f64],
    m: &PageRankStep,
    contrib: &mut Vec<f64>,
) -> StepDone {
    let n = deg.len();
    let mut done = StepDone {
        l1: 0.0,
        dangling: 0.0,
        iter: m.iter,
        lo: m.lo,
        hi: m.hi,
        ok: 0,
    };
    let (lo, hi) = (m.lo as usize, m.hi as usize);
    if lo > hi || hi > n || ranks.len() != 2 * n || off.len() != n + 1 {
        return done;
    }
    // Offsets ascending and within `src`: otherwise a refusal (`ok == 0`), never a panic of
    // the handler. A source outside the graph is found where it is read (below).
    if off[n] as usize > src.len() || off.par_windows(2).any(|w| w[0] > w[1]) {
        return done;
    }
    let (first, second) = ranks.split_at_mut(n);
    let (old, new): (&[f64], &mut [f64]) = if m.iter & 1 == 0 {
        (first, second)
    } else {
        (second, first)
    };
    let hoist = 2 * (hi - lo) >= n;
    if hoist {
        contrib.resize(n, 0.0);
        contrib
            .par_iter_mut()
            .zip(old.par_iter().zip(deg.par_iter()))
            .for_each(|(c, (&x, &k))| *c = x / k as f64);
    }
    let shares: &[f64] = contrib;
    // (l1, dangling, a source outside the graph was met)
    let (l1, dangling, bad) = new[lo..hi]
        .par_iter_mut()
        .enumerate()
        .with_min_len(1024)
        .map(|(i, nv)| {
            let v = lo + i;
            let ins = &src[off[v] as usize..off[v + 1] as usize];
            let (mut s, mut bad) = (0.0f64, false);
            if hoist {
                for &u in ins {
                    match shares.get(u as usize) {
                        Some(&c) => s += c,
                        None => bad = true,
                    }
                }
            } else {
                for &u in ins {
                    match old.get(u as usize) {
                        Some(&x) => s += x / deg[u as usize] as f64,
                        None => bad = true,
                    }
                }
            }
            *nv = m.base + m.damping * s;
            let d = if deg[v] == 0 { *nv } else { 0.0 };
            ((*nv - old[v]).abs(), d, bad)
        })
        .reduce(
            || (0.0, 0.0, false),
            |a, b| (a.0 + b.0, a.1 + b.1, a.2 || b.2),
        );
    if bad {
        return done;
    }
    done.l1 = l1;
    done.dangling = dangling;
    done.ok = 1;
    done
}

/// Full mode: one ring kernel with the CSR of the graph (`in_offsets`, `in_sources`,
/// `out_degree`) and the ranks (`ranks`, `2 N`: this iteration's and the next one's, by
/// parity; starts at `1/N`) bound to it. A message is one [`PageRankStep`] over a node range;
/// the host sends all ranges of an iteration, sums the answers, and sends the next iteration
/// ([`run_full`]). The same definition (message, buffers, arithmetic) runs on every backend:
/// the CPU gets one range per iteration, the whole graph, and its handler splits it over the
/// rayon pool (every core; [`step_with`] computes the sources' shares once per step), a
/// device gets many small ranges that its threads take in parallel.
pub fn full_kernel(
    id: &str,
    device: &DeviceHandle,
    csr: &Csr,
) -> Result<RingKernel<PageRankStep, StepDone>, WorkloadError> {
    let n = csr.out_degree.len();
    let o = BufferOptions::default();
    let mut init = vec![0.0f64; 2 * n];
    init[..n].fill(1.0 / n.max(1) as f64);
    // The CPU handler's scratch (the sources' shares, see `step_with`), kept across steps.
    let mut contrib: Vec<f64> = Vec::new();
    let k = RingKernel::<PageRankStep, StepDone>::new(id)
        .queue_size(4096)
        .batch_size(crate::batch_size(device.kind(), 256))
        .bind(
            "in_offsets",
            UnifiedBuffer::from_slice(device, &csr.in_offsets, o)?,
        )
        .bind(
            "in_sources",
            UnifiedBuffer::from_slice(device, &csr.in_sources, o)?,
        )
        .bind(
            "out_degree",
            UnifiedBuffer::from_slice(device, &csr.out_degree, o)?,
        )
        .bind("ranks", UnifiedBuffer::from_slice(device, &init, o)?)
        .cuda(pagerank_handler())
        .wgsl(WgslHandler::new(PAGERANK_WGSL).function("pagerank_step"))
        .handler(move |ctx: &mut Context<()>, m: PageRankStep| {
            let bad = StepDone {
                l1: 0.0,
                dangling: 0.0,
                iter: m.iter,
                lo: m.lo,
                hi: m.hi,
                ok: 0,
            };
            let (Ok(off), Ok(src), Ok(deg), Ok(mut x)) = (
                ctx.buffer::<u64>("in_offsets"),
                ctx.buffer::<u32>("in_sources"),
                ctx.buffer::<u32>("out_degree"),
                ctx.buffer_mut::<f64>("ranks"),
            ) else {
                return Some(bad);
            };
            Some(step_with(&off, &src, &deg, &mut x, &m, &mut contrib))
        });
    Ok(k)
}

const LONG: Duration = Duration::from_secs(3600);

/// Messages [`round_trip`] leaves unanswered at most (a quarter of the kernels' queues).
const WINDOW: usize = 1024;

/// Sends `msgs` to a kernel that answers each once and appends the answers to `answers`,
/// keeping at most [`WINDOW`] unanswered: the kernel always has room for its answers, so a
/// send never waits on a kernel that waits on us to take answers.
fn round_trip<In: resident::ring::Message, Out: resident::ring::Message>(
    k: &KernelHandle<In, Out>,
    msgs: &[In],
    answers: &mut Vec<Out>,
) -> Result<(), WorkloadError> {
    let (start, mut sent) = (answers.len(), 0);
    while answers.len() - start < msgs.len() {
        let end = msgs.len().min(answers.len() - start + WINDOW);
        if sent < end {
            sent += k.send_batch(&msgs[sent..end])?;
        }
        let before = answers.len();
        let want = msgs.len() - (answers.len() - start);
        k.receive_batch(answers, want)?;
        if answers.len() == before && sent == end {
            answers.push(k.receive(LONG)?);
        }
    }
    Ok(())
}

/// Nodes per step message: the whole graph on the CPU (its handler is parallel inside), small
/// ranges on a device (a batch's messages run on parallel threads).
pub fn default_chunk(backend: BackendKind, nodes: usize) -> usize {
    match backend {
        BackendKind::Cpu => nodes.max(1),
        // lavapipe cuts a WGSL invocation off after 65 535 loop iterations: keep ranges small.
        BackendKind::Wgpu => 256,
        _ => 512,
    }
}

/// Runs full-mode PageRank on `g` with a kernel launched on `rt` (the device of `device`),
/// `chunk` nodes per step message; the ranks come back through the bound buffer's host read.
pub fn run_full(
    rt: &Runtime,
    device: &DeviceHandle,
    g: &EdgeList,
    p: Params,
) -> Result<Ranks, WorkloadError> {
    run_full_chunked(rt, device, g, p, default_chunk(device.kind(), g.nodes()))
}

/// [`run_full`] with an explicit range size.
pub fn run_full_chunked(
    rt: &Runtime,
    device: &DeviceHandle,
    g: &EdgeList,
    p: Params,
    chunk: usize,
) -> Result<Ranks, WorkloadError> {
    let n = g.nodes();
    if n == 0 {
        return Ok(Ranks::default());
    }
    let csr = Csr::new(g);
    let nf = n as f64;
    let dangling0 = csr.out_degree.iter().filter(|&&d| d == 0).count() as f64 / nf;
    let k = rt.launch(full_kernel(
        &format!("pagerank-{}", unique()),
        device,
        &csr,
    )?)?;
    k.activate()?;
    let chunk = chunk.max(1);
    let t = std::time::Instant::now();
    let result = (|| {
        let mut dangling = dangling0;
        let mut steps = Vec::with_capacity(n.div_ceil(chunk));
        let mut answers = Vec::with_capacity(steps.capacity());
        let mut err = f64::INFINITY;
        for iter in 0..p.max_iter {
            let base = p.damping * dangling / nf + (1.0 - p.damping) / nf;
            steps.clear();
            steps.extend((0..n).step_by(chunk).map(|lo| PageRankStep {
                base,
                damping: p.damping,
                iter,
                lo: lo as u32,
                hi: (lo + chunk).min(n) as u32,
                _pad: 0,
            }));
            answers.clear();
            round_trip(&k, &steps, &mut answers)?;
            // Sum in range order, so a run is deterministic however the device ordered them.
            answers.sort_by_key(|a| a.lo);
            if let Some(a) = answers.iter().find(|a| a.ok == 0 || a.iter != iter) {
                return Err(WorkloadError::Mismatch {
                    workload: "pagerank",
                    detail: format!("the kernel refused step {a:?}"),
                });
            }
            err = answers.iter().map(|a| a.l1).sum();
            dangling = answers.iter().map(|a| a.dangling).sum();
            if err < nf * p.tol {
                let kernel_time = t.elapsed();
                let x = k.read_buffer::<f64>("ranks", LONG)?;
                let half = ((iter + 1) & 1) as usize * n;
                return Ok(Ranks {
                    ranks: x[half..half + n].to_vec(),
                    iterations: iter + 1,
                    err,
                    kernel_time,
                });
            }
        }
        Err(WorkloadError::NotConverged {
            iterations: p.max_iter,
            err,
            threshold: nf * p.tol,
        })
    })();
    k.terminate()?;
    result
}

/// Full mode in f32 arithmetic (WGSL): L1 distance to the reference ranks (which sum to 1).
pub const FULL_TOLERANCE_F32: f64 = 1e-4;

/// Checks full-mode ranks against the reference: at f64, [`check_full`]; at f32 the L1
/// distance must be at most [`FULL_TOLERANCE_F32`] and the iteration count within 2 (f32
/// rounding moves the L1 change that decides when to stop).
pub fn check_full_with(
    got: &Ranks,
    want: &Ranks,
    precision: crate::Precision,
) -> Result<(), WorkloadError> {
    if precision == crate::Precision::F64 {
        return check_full(got, want);
    }
    let bad = |detail: String| WorkloadError::Mismatch {
        workload: "pagerank",
        detail,
    };
    if got.ranks.len() != want.ranks.len() || got.iterations.abs_diff(want.iterations) > 2 {
        return Err(bad(format!(
            "{} iterations over {} nodes, reference {} over {}",
            got.iterations,
            got.ranks.len(),
            want.iterations,
            want.ranks.len()
        )));
    }
    let l1: f64 = got
        .ranks
        .iter()
        .zip(&want.ranks)
        .map(|(a, b)| (a - b).abs())
        .sum();
    if l1.is_nan() || l1 > FULL_TOLERANCE_F32 {
        return Err(bad(format!(
            "L1 distance {l1:e} to the reference, more than {FULL_TOLERANCE_F32:e}"
        )));
    }
    Ok(())
}

/// Checks full-mode ranks against the reference (same iterations, relative [`FULL_TOLERANCE`]).
pub fn check_full(got: &Ranks, want: &Ranks) -> Result<(), WorkloadError> {
    let bad = |detail: String| WorkloadError::Mismatch {
        workload: "pagerank",
        detail,
    };
    if got.iterations != want.iterations || got.ranks.len() != want.ranks.len() {
        return Err(bad(format!(
            "{} iterations over {} nodes, reference {} over {}",
            got.iterations,
            got.ranks.len(),
            want.iterations,
            want.ranks.len()
        )));
    }
    for (v, (a, b)) in got.ranks.iter().zip(&want.ranks).enumerate() {
        if (a - b).abs() > FULL_TOLERANCE * b.abs() {
            return Err(bad(format!("node {v}: {a:e}, reference {b:e}")));
        }
    }
    Ok(())
}

/// A mutable graph: out- and in-lists per node (the streaming kernels' state).
#[derive(Clone, Debug, Default)]
pub struct DynGraph {
    /// Out-neighbours.
    pub out: Vec<Vec<u32>>,
    /// In-neighbours.
    pub inn: Vec<Vec<u32>>,
}

impl DynGraph {
    /// From an edge list.
    pub fn new(g: &EdgeList) -> Self {
        let n = g.nodes();
        let mut d = DynGraph {
            out: vec![Vec::new(); n],
            inn: vec![Vec::new(); n],
        };
        for &(u, v) in &g.edges {
            d.out[u as usize].push(v);
            d.inn[v as usize].push(u);
        }
        d
    }
    /// Nodes.
    pub fn nodes(&self) -> usize {
        self.out.len()
    }
    /// Adds `u -> v`; false when present.
    pub fn add(&mut self, u: u32, v: u32) -> bool {
        if self.out[u as usize].contains(&v) {
            return false;
        }
        self.out[u as usize].push(v);
        self.inn[v as usize].push(u);
        true
    }
    /// Removes `u -> v`; false when absent.
    pub fn remove(&mut self, u: u32, v: u32) -> bool {
        let Some(i) = self.out[u as usize].iter().position(|&w| w == v) else {
            return false;
        };
        self.out[u as usize].swap_remove(i);
        let j = self.inn[v as usize]
            .iter()
            .position(|&w| w == u)
            .expect("in-list mirrors out-list");
        self.inn[v as usize].swap_remove(j);
        true
    }
    /// Ranks from scratch (networkx's iteration from `1/N`) into `x`.
    fn recompute(
        &self,
        p: Params,
        x: &mut [f64],
        next: &mut Vec<f64>,
        contrib: &mut Vec<f64>,
    ) -> (u32, f64, bool, u64) {
        next.resize(self.nodes(), 0.0);
        power_iterate(
            self.nodes(),
            |v| &self.inn[v],
            |u| self.out[u].len(),
            p,
            x,
            next,
            contrib,
        )
    }
}

mod stream;
pub use stream::*;

/// The baseline alone: ranks from scratch (networkx's iteration) on the edge list.
pub fn recompute(g: &EdgeList, p: Params) -> Result<Ranks, WorkloadError> {
    let d = DynGraph::new(g);
    let mut x = vec![0.0; g.nodes()];
    let (mut next, mut contrib) = (Vec::new(), Vec::new());
    if g.nodes() == 0 {
        return Ok(Ranks::default());
    }
    let (iterations, err, ok, _) = d.recompute(p, &mut x, &mut next, &mut contrib);
    if !ok {
        return Err(WorkloadError::NotConverged {
            iterations,
            err,
            threshold: g.nodes() as f64 * p.tol,
        });
    }
    Ok(Ranks {
        ranks: x,
        iterations,
        err,
        kernel_time: Duration::ZERO,
    })
}

fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Full PageRank, one step over a node range per message (`pagerank_step`).
pub const PAGERANK_CU: &str = include_str!("pagerank.cu");
/// Its handler function.
pub const PAGERANK_FN: &str = "pagerank_step";
/// One PageRank power-iteration step over a node range: function `pagerank_step`.
pub const PAGERANK_WGSL: &str = include_str!("pagerank.wgsl");

/// The PageRank step handler, buffers `in_offsets` (u64), `in_sources` (u32), `out_degree`
/// (u32), `ranks` (f64, 2N) declared.
pub fn pagerank_handler() -> CudaHandler<PageRankStep, StepDone> {
    CudaHandler::new(PAGERANK_CU)
        .function(PAGERANK_FN)
        .buffer::<u64>("in_offsets")
        .buffer::<u32>("in_sources")
        .buffer::<u32>("out_degree")
        .buffer::<f64>("ranks")
}

/// Streaming PageRank (`pagerank_stream`).
pub const PAGERANK_STREAM_CU: &str = include_str!("pagerank_stream.cu");
/// Its handler function.
pub const PAGERANK_STREAM_FN: &str = "pagerank_stream";
/// Streaming PageRank: function `pagerank_stream` (state `WgslStreamCounters`, `residual`
/// and `acc` declared atomic).
pub const PAGERANK_STREAM_WGSL: &str = include_str!("pagerank_stream.wgsl");

/// The streaming PageRank handler with its state `init`, buffers `ranks`, `residual`, `acc`
/// (f64), `out_off`, `out_len`, `out_cap`, `pool`, `flags`, `frontier`, `src_seq` (u32)
/// declared (see [`pagerank::stream_kernel`](crate::pagerank::stream_kernel)).
pub fn pagerank_stream_handler(init: StreamCounters) -> CudaHandler<StreamMsg, StreamAnswer> {
    let mut h = CudaHandler::new(PAGERANK_STREAM_CU)
        .function(PAGERANK_STREAM_FN)
        .state(init);
    for name in ["ranks", "residual", "acc"] {
        h = h.buffer::<f64>(name);
    }
    for name in [
        "out_off", "out_len", "out_cap", "pool", "flags", "frontier", "src_seq",
    ] {
        h = h.buffer::<u32>(name);
    }
    h
}
