// One PageRank power-iteration step as a WGSL ring-kernel handler:
// `pagerank::PageRankStep -> StepDone` over the bound buffers `in_offsets: u64[N+1]`,
// `in_sources: u32[E]`, `out_degree: u32[N]` and `ranks: f64[2N]` (double-buffered by iteration
// parity). One message per invocation: the messages of a batch (disjoint node ranges of one
// iteration) run in parallel. Arithmetic is f32 (ranks kept as f64 converted from f32).
//
//   old = ranks[(iter & 1) * N ..], new = ranks[((iter + 1) & 1) * N ..];
//   for v in lo .. hi: new[v] = base + damping * sum(old[u] / out_degree[u]) over the sources
//   u of v's in-edges; answer l1 = sum |new[v] - old[v]| and dangling = sum new[v] over the
//   range's nodes without out-edges, ok = 1.
//   ok = 0 and nothing written when hi > N, lo > hi, ranks.len() != 2N, in_offsets.len() != N+1
//   or an offset is past in_sources. ok = 0 also when the device cut a loop short (llvmpipe
//   runs at most 65535 loop iterations per invocation, nodes and edges of the range together):
//   on lavapipe keep ranges to a few hundred nodes.

fn pagerank_step(m: PageRankStep, out: ptr<function, StepDone>, env: Envelope) -> bool {
    (*out).iter = m.iter;
    (*out).lo = m.lo;
    (*out).hi = m.hi;
    (*out).ok = 0u;
    (*out).l1 = resident_u64(0u);
    (*out).dangling = resident_u64(0u);
    let n = out_degree_len;
    if (m.hi > n || m.lo > m.hi || ranks_len / 2u != n || ranks_len % 2u != 0u || in_offsets_len != n + 1u) {
        return true;
    }
    let first = in_offsets[m.lo];
    let last = in_offsets[m.hi];
    if (first.y != 0u || last.y != 0u || first.x > last.x || last.x > in_sources_len) {
        return true;
    }
    let old_at = (m.iter & 1u) * n;
    let new_at = ((m.iter + 1u) & 1u) * n;
    let base = resident_f64_to_f32(m.base);
    let damping = resident_f64_to_f32(m.damping);
    var l1 = 0.0;
    var dangling = 0.0;
    var complete = true;
    var v = m.lo;
    for (; v < m.hi; v += 1u) {
        // Offsets are non-decreasing, so every one in the range is within first ..= last.
        let e1 = in_offsets[v + 1u].x;
        var e = in_offsets[v].x;
        var sum = 0.0;
        for (; e < e1; e += 1u) {
            let u = in_sources[e];
            if (u < n) {
                let d = out_degree[u];
                if (d > 0u) {
                    sum += resident_f64_to_f32(ranks[old_at + u]) / f32(d);
                }
            }
        }
        complete = complete && e == e1;
        let nv = base + damping * sum;
        l1 += abs(nv - resident_f64_to_f32(ranks[old_at + v]));
        ranks[new_at + v] = resident_f32_to_f64(nv);
        if (out_degree[v] == 0u) {
            dangling += nv;
        }
    }
    (*out).l1 = resident_f32_to_f64(l1);
    (*out).dangling = resident_f32_to_f64(dangling);
    (*out).ok = select(0u, 1u, complete && v == m.hi);
    return true;
}
