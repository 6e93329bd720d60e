// Full PageRank, one power-iteration step over a node range per message, over the bound CSR:
// in_offsets (u64[N+1]), in_sources (u32[E]), out_degree (u32[N]) and ranks (double[2N],
// double-buffered by iteration parity: old = ranks[(iter & 1) * N ..], new = the other half).
//
// Handler: pagerank_step (PageRankStep -> StepDone, no state).
// For v in lo..hi: new[v] = base + damping * sum(old[u] / out_degree[u]) over v's in-edges;
// answers l1 = sum |new[v] - old[v]| and dangling = sum new[v] over the range's nodes without
// out-edges. ok = 0 (nothing written) when hi > N, lo > hi, or the buffers' lengths disagree
// (ranks_len != 2 N, in_offsets_len != N + 1). The host sends all ranges of iteration k, waits
// for every answer, then sends k + 1: ranges of one iteration write disjoint nodes of `new`
// and only read `old`.

__device__ bool pagerank_step(ResidentState* state, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                              ResidentBuffers* buffers) {
    const unsigned long long n = buffers->out_degree_len;
    out->iter = in->iter;
    out->lo = in->lo;
    out->hi = in->hi;
    out->l1 = 0.0;
    out->dangling = 0.0;
    const bool shapes = buffers->ranks_len == 2ull * n && buffers->in_offsets_len == n + 1ull;
    if (!shapes || (unsigned long long)in->hi > n || in->lo > in->hi) {
        out->ok = 0u;
        return true;
    }
    const unsigned long long* off = buffers->in_offsets;
    const unsigned int* src = buffers->in_sources;
    const unsigned int* deg = buffers->out_degree;
    const double* old_r = buffers->ranks + (unsigned long long)(in->iter & 1u) * n;
    double* new_r = buffers->ranks + (unsigned long long)((in->iter + 1u) & 1u) * n;
    const unsigned long long edges = buffers->in_sources_len;
    double l1 = 0.0, dangling = 0.0;
    for (unsigned int v = in->lo; v < in->hi; ++v) {
        unsigned long long e0 = off[v], e1 = off[v + 1];
        if (e1 > edges) e1 = edges;  // a corrupt offset never reads past the sources
        double s = 0.0;
        for (unsigned long long e = e0; e < e1; ++e) {
            const unsigned int u = src[e];
            if ((unsigned long long)u < n && deg[u] != 0u) s += old_r[u] / (double)deg[u];
        }
        const double r = in->base + in->damping * s;
        new_r[v] = r;
        l1 += fabs(r - old_r[v]);
        if (deg[v] == 0u) dangling += r;
    }
    out->l1 = l1;
    out->dangling = dangling;
    out->ok = 1u;
    return true;
}
