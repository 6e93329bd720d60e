//! The CPU handler of streaming PageRank: its state ([`StreamState`]: the graph as out- and
//! in-lists, the uniform part of the residual, the push queue) and what each operation does to
//! it (see the protocol in the parent module's docs).

use super::*;

/// The CPU handler's state: its graph, the uniform part of the residual, the push queue.
pub struct StreamState {
    /// The graph.
    pub graph: DynGraph,
    pub(super) params: Params,
    pub(super) uniform: f64,
    pub(super) queue: VecDeque<u32>,
    pub(super) queued: Vec<bool>,
    pub(super) applied: u32,
    pub(super) rejected: u32,
}

/// `r[w] += delta` and queue `w` when it is over `eps`; true when it queued `w`.
#[inline]
pub(super) fn bump(
    r: &mut [f64],
    q: &mut VecDeque<u32>,
    queued: &mut [bool],
    w: u32,
    delta: f64,
    eps: f64,
) -> bool {
    let rw = &mut r[w as usize];
    *rw += delta;
    if rw.abs() > eps && !queued[w as usize] {
        queued[w as usize] = true;
        q.push_back(w);
        return true;
    }
    false
}

impl StreamState {
    pub(super) fn eps(&self) -> f64 {
        self.params.damping * self.params.tol
    }

    /// Applies an edge change to the graph and the residual (`d (M' - M) x`).
    pub(super) fn apply(&mut self, x: &[f64], r: &mut [f64], op: u32, u: u32, v: u32) -> bool {
        let n = self.graph.nodes();
        if u as usize >= n || v as usize >= n || (op != OP_ADD && op != OP_REMOVE) {
            return false;
        }
        let (d, eps, nf) = (self.params.damping, self.eps(), n as f64);
        let k = self.graph.out[u as usize].len() as f64;
        let mass = d * x[u as usize];
        let changed = match op {
            OP_ADD => self.graph.add(u, v),
            _ => self.graph.remove(u, v),
        };
        if !changed {
            return false;
        }
        let k2 = self.graph.out[u as usize].len() as f64;
        let StreamState {
            graph,
            queue,
            queued,
            uniform,
            ..
        } = self;
        // Old column: mass/k to each old out-neighbour (or mass/N to all when dangling);
        // new column likewise with k2. The difference lands on the union of both lists.
        let (old_share, new_share) = (
            if k > 0.0 { mass / k } else { 0.0 },
            if k2 > 0.0 { mass / k2 } else { 0.0 },
        );
        if k == 0.0 {
            *uniform -= mass / nf;
        }
        if k2 == 0.0 {
            *uniform += mass / nf;
        }
        for &w in &graph.out[u as usize] {
            // Nodes in the new list: were in the old list too, except `v` on an add.
            let was = op != OP_ADD || w != v;
            let delta = new_share - if was { old_share } else { 0.0 };
            bump(r, queue, queued, w, delta, eps);
        }
        if op == OP_REMOVE {
            bump(r, queue, queued, v, -old_share, eps);
        }
        true
    }

    /// Pushes residual until every node's is at most `eps` (and the uniform part too).
    /// Returns (pushes, work, residual L1).
    pub(super) fn refresh(&mut self, x: &mut [f64], r: &mut [f64]) -> (u64, u64, f64) {
        let (d, eps) = (self.params.damping, self.eps());
        let n = self.graph.nodes();
        let nf = n as f64;
        let (mut pushes, mut work) = (0u64, 0u64);
        loop {
            while let Some(u) = self.queue.pop_front() {
                self.queued[u as usize] = false;
                let delta = r[u as usize];
                if delta.abs() <= eps {
                    continue;
                }
                x[u as usize] += delta;
                r[u as usize] = 0.0;
                pushes += 1;
                let outs = &self.graph.out[u as usize];
                if outs.is_empty() {
                    self.uniform += d * delta / nf;
                } else {
                    let share = d * delta / outs.len() as f64;
                    work += outs.len() as u64;
                    for &w in outs {
                        bump(r, &mut self.queue, &mut self.queued, w, share, eps);
                    }
                }
            }
            if self.uniform.abs() <= eps {
                break;
            }
            // Push the uniform part to every node at once, with every later uniform push it
            // would cause (dangling nodes send d c D / N back): x += c', r += d M' (c' 1)
            // along the edges, c' = c / (1 - d D / N).
            let dangling = self.graph.out.iter().filter(|o| o.is_empty()).count() as f64;
            let c = std::mem::take(&mut self.uniform) / (1.0 - d * dangling / nf);
            let g = &self.graph;
            x.par_iter_mut().for_each(|e| *e += c);
            r.par_iter_mut().enumerate().for_each(|(v, rv)| {
                let s: f64 = g.inn[v]
                    .iter()
                    .map(|&w| 1.0 / g.out[w as usize].len() as f64)
                    .sum();
                *rv += d * c * s;
            });
            work += (self.graph.inn.iter().map(|l| l.len()).sum::<usize>() + n) as u64;
            for (v, rv) in r.iter().enumerate() {
                if rv.abs() > eps && !self.queued[v] {
                    self.queued[v] = true;
                    self.queue.push_back(v as u32);
                }
            }
        }
        let l1 = r.iter().map(|e| e.abs()).sum::<f64>() + nf * self.uniform.abs();
        (pushes, work, l1)
    }

    /// One operation on the CPU (see the module docs); `None` for edge changes.
    pub(super) fn handle(
        &mut self,
        x: &mut [f64],
        r: &mut [f64],
        acc: &mut [f64],
        m: &StreamMsg,
    ) -> Option<StreamAnswer> {
        let n = self.graph.nodes();
        let (d, eps) = (self.params.damping, self.eps());
        let mut a = StreamAnswer {
            sum: 0.0,
            dangling: 0.0,
            work: 0,
            count: 0,
            pushes: 0,
            applied: 0,
            rejected: 0,
            full: 0,
            op: m.op,
            ok: 1,
            stalled: 0,
        };
        let (lo, hi) = (m.a as usize, m.b as usize);
        let range_ok = lo <= hi && hi <= n;
        let g = &self.graph;
        match m.op {
            // An unknown op is a change that is refused: counted, never answered.
            op::ADD | op::REMOVE | op::UNKNOWN.. => {
                if self.apply(x, r, m.op, m.a, m.b) {
                    self.applied = self.applied.wrapping_add(1);
                } else {
                    self.rejected = self.rejected.wrapping_add(1);
                }
                return None;
            }
            op::SYNC => {
                // Changes apply as they come on the CPU: everything sent before is applied.
                a.count = self.queue.len() as u64;
                a.sum = self.uniform;
                a.applied = self.applied;
                a.rejected = self.rejected;
            }
            op::PUSH => {
                // The whole queue at once (and the uniform part): nothing left for a next round.
                let (pushes, work, l1) = self.refresh(x, r);
                a.pushes = pushes;
                a.work = work;
                a.sum = l1;
            }
            op::TAKE => {
                a.sum = self.uniform;
                if self.uniform.abs() > eps {
                    // Counted only when taken (the host needs it to scale the push).
                    a.dangling = g.out.iter().filter(|o| o.is_empty()).count() as f64;
                    self.uniform = 0.0;
                    a.count = 1;
                }
            }
            op::RESET => {
                self.uniform = 0.0;
                self.queue.clear();
                self.queued.iter_mut().for_each(|q| *q = false);
            }
            _ if !range_ok => a.ok = 0,
            op::UNIFORM => {
                let c = m.value;
                for (xu, outs) in x[lo..hi].iter_mut().zip(&self.graph.out[lo..hi]) {
                    *xu += c;
                    if outs.is_empty() {
                        continue; // absorbed: the host scaled c for it
                    }
                    let share = d * c / outs.len() as f64;
                    a.work += outs.len() as u64;
                    for &w in outs {
                        a.count += bump(r, &mut self.queue, &mut self.queued, w, share, eps) as u64;
                    }
                }
            }
            op::FILL => {
                x[lo..hi].par_iter_mut().for_each(|e| *e = m.value);
                a.count = (lo..hi).filter(|&v| g.out[v].is_empty()).count() as u64;
                a.dangling = a.count as f64 * m.value;
            }
            op::SCATTER if lo == 0 && hi == n => {
                // The whole graph: pull along the in-lists (parallel, no atomics needed).
                acc.par_iter_mut().enumerate().for_each(|(v, av)| {
                    *av += g.inn[v]
                        .iter()
                        .map(|&u| x[u as usize] / g.out[u as usize].len() as f64)
                        .sum::<f64>();
                });
                a.work = g.inn.iter().map(|l| l.len() as u64).sum();
            }
            op::SCATTER => {
                for (xu, outs) in x[lo..hi].iter().zip(&g.out[lo..hi]) {
                    for &w in outs {
                        acc[w as usize] += xu / outs.len() as f64;
                    }
                    a.work += outs.len() as u64;
                }
            }
            op::GATHER => {
                let (l1, dangling) = x[lo..hi]
                    .par_iter_mut()
                    .zip(&mut acc[lo..hi])
                    .enumerate()
                    .map(|(i, (xv, av))| {
                        let new = m.value + d * *av;
                        *av = 0.0;
                        let change = (new - *xv).abs();
                        *xv = new;
                        (change, if g.out[lo + i].is_empty() { new } else { 0.0 })
                    })
                    .reduce(|| (0.0, 0.0), |p, q| (p.0 + q.0, p.1 + q.1));
                a.sum = l1;
                a.dangling = dangling;
                a.work = (hi - lo) as u64;
            }
            op::RESIDUAL => {
                a.sum = r[lo..hi]
                    .par_iter_mut()
                    .zip(&mut acc[lo..hi])
                    .zip(&x[lo..hi])
                    .map(|((rv, av), xv)| {
                        *rv = m.value + d * *av - xv;
                        *av = 0.0;
                        rv.abs()
                    })
                    .sum();
                for (v, (rv, q)) in r[lo..hi].iter().zip(&mut self.queued[lo..hi]).enumerate() {
                    if rv.abs() > eps && !*q {
                        *q = true;
                        self.queue.push_back((lo + v) as u32);
                        a.count += 1;
                    }
                }
                a.work = (hi - lo) as u64;
            }
        }
        Some(a)
    }
}
