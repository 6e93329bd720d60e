// Streaming PageRank on a CUDA-C device: the graph, the ranks and the residual stay in bound
// buffers for the kernel's life; the host drives refreshes and recomputes in rounds of range
// messages (see pagerank.rs, "Streaming mode").
//
// Handler: pagerank_stream (StreamMsg -> StreamAnswer, state StreamCounters).
// Bound buffers (in order): ranks, residual, acc (double[N]); out_off, out_len, out_cap (uint[N]:
// node u's out-neighbours are pool[out_off[u] .. out_off[u] + out_len[u]], room for out_cap[u]);
// pool (uint[P]); flags (uint[N], 1 = queued for the pending round); frontier (uint[2N], round
// k's queue is the half k & 1, its length the counter len[k % 3]); src_seq (uint[N], edge
// changes applied per source).
//
// Concurrency. The threads of a batch run their messages in parallel.
// * Edge changes of one source apply in the order sent: a change's `ticket` is the number of
//   changes of its source sent before it, and it waits (bounded, like the anomaly detector's
//   readings) until src_seq[src] equals it; the applier publishes src_seq last (fence, atomic
//   store). Changes of different sources touch different lists and meet only in the residual,
//   the flags, the frontier counters and `uniform`, which are atomics.
// * Residual mass moves by atomic adds. A node is queued once per round: the adder whose add
//   leaves |r| > eps sets its flag (CAS 0 -> 1) and appends it. A pusher clears the flag, fences,
//   then loads and takes the residual; an add after the clear sees the flag clear and queues the
//   node again, an add before the take is taken with it, so every node with |r| > eps is queued
//   or being pushed: no mass is lost and none pushed twice.
// * Ranks x[u] are written by u's pusher only (u is in a round's queue once) and read by edge
//   changes, which the host never runs together with a round (it waits for a SYNC first).
// * Phases that must not overlap (edge changes, rounds, scatter, gather) are separated by the
//   host, which waits for every answer of one before sending the next.

#define PRS_ADD 0u
#define PRS_REMOVE 1u
#define PRS_SYNC 2u
#define PRS_PUSH 3u
#define PRS_TAKE 4u
#define PRS_UNIFORM 5u
#define PRS_RESET 6u
#define PRS_FILL 7u
#define PRS_SCATTER 8u
#define PRS_GATHER 9u
#define PRS_RESIDUAL 10u
#define PRS_UNKNOWN 11u  // and above: a change that is refused (counted, not answered)

#ifdef RESIDENT_SIM
#define PRS_WAIT_NS 10000000000ull
#define PRS_SLEEP_NS 20000u
__device__ __forceinline__ unsigned long long prs_now_ns() { return resident_sim::now_ns(); }
__device__ __forceinline__ double prs_take(double* p) { return atomicExch(p, 0.0); }
#else
#define PRS_WAIT_NS 1000000000ull
#define PRS_SLEEP_NS 200u
__device__ __forceinline__ unsigned long long prs_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ double prs_take(double* p) {
    return __longlong_as_double((long long)atomicExch((unsigned long long*)p, 0ull));
}
#endif

// Atomic reads (a read-modify-write that adds nothing: coherent on every architecture).
__device__ __forceinline__ double prs_load(double* p) { return atomicAdd(p, 0.0); }
__device__ __forceinline__ unsigned int prs_load_u32(unsigned int* p) { return atomicAdd(p, 0u); }

// r[w] += delta; queues w for round `round` when that leaves |r[w]| > eps and w is not queued.
// Returns 1 when it queued w.
__device__ __forceinline__ unsigned int prs_bump(StreamCounters* s, ResidentBuffers* b, unsigned int w, double delta,
                                                 unsigned int round) {
    const double now = atomicAdd(&b->residual[w], delta) + delta;
    if (!(fabs(now) > s->eps)) return 0u;
    // Ordering: the add before the flag (pairs with the pusher's clear, fence, take).
    __threadfence();
    if (atomicCAS(&b->flags[w], 0u, 1u) != 0u) return 0u;
    const unsigned long long n = b->flags_len;
    const unsigned int slot = atomicAdd(&s->len[round % 3u], 1u);
    // One slot per flagged node: a half of N slots never overflows (checked all the same).
    if ((unsigned long long)slot < n) b->frontier[(unsigned long long)(round & 1u) * n + slot] = w;
    return 1u;
}

// Reserves `count` pool entries; false (nothing reserved) when they do not fit.
__device__ __forceinline__ bool prs_reserve(StreamCounters* s, unsigned long long pool_len, unsigned int count,
                                            unsigned int* start) {
    unsigned int top = prs_load_u32(&s->pool_top);
    for (;;) {
        if ((unsigned long long)top + count > pool_len) return false;
        const unsigned int seen = atomicCAS(&s->pool_top, top, top + count);
        if (seen == top) {
            *start = top;
            return true;
        }
        top = seen;
    }
}

// One edge change, applied to the out-list of `u` and to the residual (d (M' - M) x, which
// differs from zero only at u's old and new out-neighbours, or uniformly when u is or becomes
// dangling). Returns 1 applied, 0 refused (duplicate add, absent edge), 2 refused (pool full).
__device__ unsigned int prs_apply(StreamCounters* s, ResidentBuffers* b, unsigned int op, unsigned int u, unsigned int v,
                                  unsigned int round) {
    const unsigned long long n = b->ranks_len;
    const double nf = (double)n;
    const double d = s->damping;
    const unsigned int k = b->out_len[u];
    unsigned int cap = b->out_cap[u];
    unsigned int off = b->out_off[u];
    if ((unsigned long long)off + cap > b->pool_len || k > cap) return 0u;  // corrupt: refuse
    unsigned int* list = b->pool + off;
    unsigned int at = k;
    for (unsigned int i = 0; i < k; ++i) {
        if (list[i] == v) {
            at = i;
            break;
        }
    }
    if (op == PRS_ADD) {
        if (at < k) return 0u;
        if (k == cap) {
            const unsigned int grown = cap < 2u ? 4u : 2u * cap;
            unsigned int start;
            if (!prs_reserve(s, b->pool_len, grown, &start)) return 2u;
            for (unsigned int i = 0; i < k; ++i) b->pool[start + i] = list[i];
            off = start;
            cap = grown;
            list = b->pool + off;
            b->out_off[u] = off;
            b->out_cap[u] = cap;
        }
        list[k] = v;
        b->out_len[u] = k + 1u;
    } else {
        if (at == k) return 0u;
        list[at] = list[k - 1u];
        b->out_len[u] = k - 1u;
    }
    const unsigned int k2 = b->out_len[u];
    const double mass = d * b->ranks[u];
    const double old_share = k > 0u ? mass / (double)k : 0.0;
    const double new_share = k2 > 0u ? mass / (double)k2 : 0.0;
    if (k == 0u) atomicAdd(&s->uniform, -mass / nf);
    if (k2 == 0u) atomicAdd(&s->uniform, mass / nf);
    if (k == 0u && k2 > 0u) atomicSub(&s->dangling, 1u);
    if (k > 0u && k2 == 0u) atomicAdd(&s->dangling, 1u);
    for (unsigned int i = 0; i < k2; ++i) {
        const unsigned int w = list[i];
        const bool was = op != PRS_ADD || w != v;  // in the old list too
        prs_bump(s, b, w, new_share - (was ? old_share : 0.0), round);
    }
    if (op == PRS_REMOVE) prs_bump(s, b, v, -old_share, round);
    return 1u;
}

__device__ bool pagerank_stream(ResidentState* state, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                                ResidentBuffers* b) {
    StreamCounters* s = state;
    const unsigned long long n = b->ranks_len;
    const double nf = (double)n;
    const double d = s->damping;
    const double eps = s->eps;
    out->sum = 0.0;
    out->dangling = 0.0;
    out->work = 0ull;
    out->count = 0ull;
    out->pushes = 0ull;
    out->applied = 0u;
    out->rejected = 0u;
    out->full = 0u;
    out->op = in->op;
    out->ok = 1u;
    out->stalled = 0u;
    const bool shapes = b->residual_len == n && b->acc_len == n && b->out_off_len == n && b->out_len_len == n &&
                        b->out_cap_len == n && b->flags_len == n && b->frontier_len == 2ull * n && b->src_seq_len == n;
    if (!shapes) {
        out->ok = 0u;
        return in->op != PRS_ADD && in->op != PRS_REMOVE && in->op < PRS_UNKNOWN;
    }
    const unsigned int op = in->op;
    if (op == PRS_ADD || op == PRS_REMOVE || op >= PRS_UNKNOWN) {
        const unsigned int u = in->a, v = in->b;
        unsigned int result = 0u;  // 0 refused, 1 applied, 2 pool full, 3 stalled
        // The host numbers every change of a source in range (whatever its target or op), so
        // each takes its turn and passes it on, applied or not.
        if ((unsigned long long)u < n) {
            unsigned long long t0 = prs_now_ns();
            unsigned int seen = prs_load_u32(&b->src_seq[u]);
            bool due = true;
            while (seen != in->ticket) {
                if (prs_now_ns() - t0 > PRS_WAIT_NS) {
                    due = false;  // the source's earlier change never came: refuse this one
                    break;
                }
                __nanosleep(PRS_SLEEP_NS);
                const unsigned int now = prs_load_u32(&b->src_seq[u]);
                if (now != seen) t0 = prs_now_ns();  // progress: the bound is on a stall
                seen = now;
            }
            if (due) {
                __threadfence();  // acquire: the previous change of u's list
                if ((unsigned long long)v < n && op < PRS_UNKNOWN) result = prs_apply(s, b, op, u, v, in->round);
                __threadfence();  // release: the list before the sequence number
                atomicExch(&b->src_seq[u], in->ticket + 1u);
            } else {
                result = 3u;
            }
        }
        if (result == 1u) {
            atomicAdd(&s->applied, 1u);
        } else if (result == 3u) {
            atomicAdd(&s->rejected, 1u);
            atomicAdd(&s->stalled, 1u);
        } else {
            atomicAdd(&s->rejected, 1u);
            if (result == 2u) atomicAdd(&s->full, 1u);
        }
        // Release: the change and its counts before it counts as processed (SYNC waits on it).
        __threadfence();
        atomicAdd(&s->updates, 1u);
        return false;
    }
    if (op == PRS_SYNC) {
        unsigned long long t0 = prs_now_ns();
        unsigned int seen = prs_load_u32(&s->updates);
        while ((int)(seen - in->ticket) < 0) {
            if (prs_now_ns() - t0 > PRS_WAIT_NS) {
                out->ok = 0u;  // stalled: answer anyway, not ok
                break;
            }
            __nanosleep(PRS_SLEEP_NS);
            const unsigned int now = prs_load_u32(&s->updates);
            if (now != seen) t0 = prs_now_ns();
            seen = now;
        }
        __threadfence();  // acquire: the changes counted
        out->count = prs_load_u32(&s->len[in->round % 3u]);
        out->applied = prs_load_u32(&s->applied);
        out->rejected = prs_load_u32(&s->rejected);
        out->full = prs_load_u32(&s->full);
        out->stalled = prs_load_u32(&s->stalled);
        out->sum = prs_load(&s->uniform);
        return true;
    }
    if (op == PRS_TAKE) {
        const double c = prs_load(&s->uniform);
        out->sum = c;
        out->dangling = (double)prs_load_u32(&s->dangling);
        if (fabs(c) > eps) {
            out->sum = prs_take(&s->uniform);
            out->count = 1ull;
        }
        return true;
    }
    if (op == PRS_RESET) {
        for (unsigned int i = 0; i < 3u; ++i) atomicExch(&s->len[i], 0u);
        atomicExch(&s->dangling, 0u);
        prs_take(&s->uniform);
        return true;
    }
    // The rest are ranges: a..b of the frontier (PUSH) or of the nodes.
    if (in->a > in->b || (unsigned long long)in->b > n) {
        out->ok = 0u;
        return true;
    }
    unsigned long long work = 0ull, count = 0ull, pushes = 0ull;
    double sum = 0.0, dangling = 0.0;
    if (op == PRS_PUSH) {
        const unsigned int round = in->round;
        // Round `round + 2` appends to this counter; nobody uses it during this round.
        atomicExch(&s->len[(round + 2u) % 3u], 0u);
        const unsigned int* queue = b->frontier + (unsigned long long)(round & 1u) * n;
        double to_uniform = 0.0;
        for (unsigned int i = in->a; i < in->b; ++i) {
            const unsigned int u = queue[i];
            if ((unsigned long long)u >= n) continue;
            atomicExch(&b->flags[u], 0u);
            __threadfence();  // ordering: the clear before the take (see prs_bump)
            if (!(fabs(prs_load(&b->residual[u])) > eps)) continue;
            const double delta = prs_take(&b->residual[u]);
            b->ranks[u] += delta;
            ++pushes;
            const unsigned int k = b->out_len[u];
            if (k == 0u) {
                to_uniform += d * delta / nf;
                continue;
            }
            const unsigned int* list = b->pool + b->out_off[u];
            const double share = d * delta / (double)k;
            for (unsigned int j = 0; j < k; ++j) count += prs_bump(s, b, list[j], share, round + 1u);
            work += k;
        }
        if (to_uniform != 0.0) atomicAdd(&s->uniform, to_uniform);
    } else if (op == PRS_UNIFORM) {
        // Push c from every node of the range: x += c, its out-neighbours' residual += d c / k.
        // A dangling node's share (d c / N to every node) is absorbed: the host passed
        // c = c0 / (1 - d D / N), every later uniform push at once.
        const double c = in->value;
        for (unsigned int u = in->a; u < in->b; ++u) {
            b->ranks[u] += c;
            const unsigned int k = b->out_len[u];
            if (k == 0u) continue;
            const unsigned int* list = b->pool + b->out_off[u];
            const double share = d * c / (double)k;
            for (unsigned int j = 0; j < k; ++j) count += prs_bump(s, b, list[j], share, in->round);
            work += k;
        }
    } else if (op == PRS_FILL) {
        for (unsigned int v = in->a; v < in->b; ++v) {
            b->ranks[v] = in->value;
            if (b->out_len[v] == 0u) {
                dangling += in->value;
                ++count;
            }
        }
        atomicAdd(&s->dangling, (unsigned int)count);
    } else if (op == PRS_SCATTER) {
        for (unsigned int u = in->a; u < in->b; ++u) {
            const unsigned int k = b->out_len[u];
            if (k == 0u) continue;
            const unsigned int* list = b->pool + b->out_off[u];
            const double share = b->ranks[u] / (double)k;
            for (unsigned int j = 0; j < k; ++j) atomicAdd(&b->acc[list[j]], share);
            work += k;
        }
    } else if (op == PRS_GATHER) {
        for (unsigned int v = in->a; v < in->b; ++v) {
            const double x = in->value + d * b->acc[v];
            b->acc[v] = 0.0;
            sum += fabs(x - b->ranks[v]);
            b->ranks[v] = x;
            if (b->out_len[v] == 0u) dangling += x;
        }
        work = in->b - in->a;
    } else if (op == PRS_RESIDUAL) {
        for (unsigned int v = in->a; v < in->b; ++v) {
            const double r = in->value + d * b->acc[v] - b->ranks[v];
            b->acc[v] = 0.0;
            b->residual[v] = r;
            sum += fabs(r);
            if (fabs(r) > eps) {
                b->flags[v] = 1u;
                const unsigned int slot = atomicAdd(&s->len[in->round % 3u], 1u);
                if ((unsigned long long)slot < n) b->frontier[(unsigned long long)(in->round & 1u) * n + slot] = v;
                ++count;
            } else {
                b->flags[v] = 0u;
            }
        }
        work = in->b - in->a;
    } else {
        out->ok = 0u;
    }
    out->sum = sum;
    out->dangling = dangling;
    out->work = work;
    out->count = count;
    out->pushes = pushes;
    return true;
}
