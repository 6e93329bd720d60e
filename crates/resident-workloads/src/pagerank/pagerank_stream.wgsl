// Streaming PageRank as a WGSL ring-kernel handler (wgpu): `pagerank::StreamMsg ->
// StreamAnswer`, state `WgslStreamCounters`, the same protocol and the same algorithm as the
// CUDA handler (pagerank_stream.cu; see stream.rs for the protocol), in f32.
//
// Bound buffers (in order): ranks (f32[N]); residual, acc (f32 kept as bits in u32[N], declared
// atomic: adds are compare-exchange loops); out_off, out_len, out_cap (u32[N]), pool (u32[P]);
// frontier (u32[2N]).
//
// One message per invocation: a batch's messages run in parallel and meet only in atomics
// (residual, acc, the queue counters, the uniform residual, the pool's top). WGSL's atomics are
// relaxed and it has no fence across invocations of different workgroups, so nothing here
// relies on the order of two different locations: a node's "queued" flag is the lowest bit of
// its residual's bits (the residual keeps 23 mantissa bits). A bump's compare-exchange adds
// and, when that leaves |r| > eps on an unqueued node, sets the bit in the same exchange, and
// the bumper that set it appends the node; a pusher's compare-exchange takes the residual and
// clears the bit at once. So a node is queued exactly when its bit is set, and every node with
// |r| > eps is queued or being pushed.
//
// Edge changes of one source must not share a batch (WGSL gives no forward progress to an
// invocation waiting for another, so there is no ticket wait here): the host sends a source's
// changes in separate waves, waiting for each wave's sync. SYNC only reports (the host syncs
// twice: the second sync's batch runs after every change).
//
// On llvmpipe/lavapipe one invocation runs at most 65535 loop iterations in all (then every
// loop runs once): a handler whose loop ended early answers ok = 0 (an edge change, which has
// no answer, is counted as stalled), and the host fails the operation instead of losing mass.

const PRS_ADD: u32 = 0u;
const PRS_REMOVE: u32 = 1u;
const PRS_SYNC: u32 = 2u;
const PRS_PUSH: u32 = 3u;
const PRS_TAKE: u32 = 4u;
const PRS_UNIFORM: u32 = 5u;
const PRS_RESET: u32 = 6u;
const PRS_FILL: u32 = 7u;
const PRS_SCATTER: u32 = 8u;
const PRS_GATHER: u32 = 9u;
const PRS_RESIDUAL: u32 = 10u;
const PRS_UNKNOWN: u32 = 11u;

// False once a loop of this invocation ended before its end (lavapipe's cap).
var<private> prs_complete: bool = true;

// The residual's value and queued bit.
fn prs_value(bits: u32) -> f32 { return bitcast<f32>(bits & 0xfffffffeu); }
fn prs_bits(v: f32, queued: bool) -> u32 { return (bitcast<u32>(v) & 0xfffffffeu) | select(0u, 1u, queued); }

// r[w] += delta; queues w for `round` when that leaves |r[w]| > eps and w was not queued.
// Returns 1 when it queued w.
fn prs_bump(w: u32, delta: f32, round: u32) -> u32 {
    var old = atomicLoad(&residual[w]);
    var done = false;
    var queue = false;
    for (var tries = 0u; tries < 1000000u; tries += 1u) {
        let now = prs_value(old) + delta;
        let was = (old & 1u) == 1u;
        queue = !was && abs(now) > state.eps;
        let r = atomicCompareExchangeWeak(&residual[w], old, prs_bits(now, was || queue));
        if (r.exchanged) { done = true; break; }
        old = r.old_value;
    }
    prs_complete = prs_complete && done;
    if (!done || !queue) { return 0u; }
    let slot = atomicAdd(&state.len[round % 3u], 1u);
    if (slot < ranks_len) { frontier[(round & 1u) * ranks_len + slot] = w; }
    return 1u;
}

// Takes u's residual when |r| > eps (else leaves it) and clears its queued bit, in one exchange.
fn prs_take(u: u32) -> f32 {
    var old = atomicLoad(&residual[u]);
    for (var tries = 0u; tries < 1000000u; tries += 1u) {
        let v = prs_value(old);
        let take = abs(v) > state.eps;
        let r = atomicCompareExchangeWeak(&residual[u], old, select(prs_bits(v, false), 0u, take));
        if (r.exchanged) { return select(0.0, v, take); }
        old = r.old_value;
    }
    prs_complete = false;
    return 0.0;
}

fn prs_add_acc(i: u32, delta: f32) {
    var old = atomicLoad(&acc[i]);
    var done = false;
    for (var tries = 0u; tries < 1000000u; tries += 1u) {
        let r = atomicCompareExchangeWeak(&acc[i], old, bitcast<u32>(bitcast<f32>(old) + delta));
        if (r.exchanged) { done = true; break; }
        old = r.old_value;
    }
    prs_complete = prs_complete && done;
}

fn prs_add_uniform(delta: f32) {
    var old = atomicLoad(&state.uniform_bits);
    var done = false;
    for (var tries = 0u; tries < 1000000u; tries += 1u) {
        let r = atomicCompareExchangeWeak(&state.uniform_bits, old, bitcast<u32>(bitcast<f32>(old) + delta));
        if (r.exchanged) { done = true; break; }
        old = r.old_value;
    }
    prs_complete = prs_complete && done;
}

// Reserves `count` pool entries at the top; false when they do not fit.
fn prs_reserve(count: u32) -> vec2<u32> {
    var top = atomicLoad(&state.pool_top);
    for (var tries = 0u; tries < 1000000u; tries += 1u) {
        if (top > pool_len || count > pool_len - top) { return vec2<u32>(0u, 0u); }
        let r = atomicCompareExchangeWeak(&state.pool_top, top, top + count);
        if (r.exchanged) { return vec2<u32>(top, 1u); }
        top = r.old_value;
    }
    prs_complete = false;
    return vec2<u32>(0u, 0u);
}

// One edge change: 1 applied, 0 refused (duplicate, absent, bad), 2 refused (pool full).
fn prs_apply(op: u32, u: u32, v: u32, round: u32) -> u32 {
    let n = ranks_len;
    let k = out_len[u];
    var cap = out_cap[u];
    var off = out_off[u];
    if (off > pool_len || cap > pool_len - off || k > cap) { return 0u; }
    var at = k;
    var i = 0u;
    for (; i < k; i += 1u) {
        if (pool[off + i] == v) { at = i; break; }
    }
    if (at == k && i != k) { prs_complete = false; return 0u; }
    if (op == PRS_ADD) {
        if (at < k) { return 0u; }
        if (k == cap) {
            let grown = select(2u * cap, 4u, cap < 2u);
            let got = prs_reserve(grown);
            if (got.y == 0u) { return 2u; }
            var j = 0u;
            for (; j < k; j += 1u) { pool[got.x + j] = pool[off + j]; }
            if (j != k) { prs_complete = false; }
            off = got.x;
            cap = grown;
            out_off[u] = off;
            out_cap[u] = cap;
        }
        pool[off + k] = v;
        out_len[u] = k + 1u;
    } else {
        if (at == k) { return 0u; }
        pool[off + at] = pool[off + k - 1u];
        out_len[u] = k - 1u;
    }
    let k2 = out_len[u];
    let nf = f32(n);
    let d = state.damping;
    let mass = d * ranks[u];
    let old_share = select(0.0, mass / f32(k), k > 0u);
    let new_share = select(0.0, mass / f32(k2), k2 > 0u);
    if (k == 0u) { prs_add_uniform(-mass / nf); }
    if (k2 == 0u) { prs_add_uniform(mass / nf); }
    if (k == 0u && k2 > 0u) { atomicSub(&state.dangling, 1u); }
    if (k > 0u && k2 == 0u) { atomicAdd(&state.dangling, 1u); }
    var j = 0u;
    for (; j < k2; j += 1u) {
        let w = pool[off + j];
        let was = op != PRS_ADD || w != v;
        prs_bump(w, new_share - select(0.0, old_share, was), round);
    }
    if (j != k2) { prs_complete = false; }
    if (op == PRS_REMOVE) { prs_bump(v, -old_share, round); }
    return 1u;
}

fn pagerank_stream(m: StreamMsg, out: ptr<function, StreamAnswer>, env: Envelope) -> bool {
    prs_complete = true;
    let n = ranks_len;
    let nf = f32(n);
    let d = state.damping;
    let eps = state.eps;
    (*out).sum = resident_u64(0u);
    (*out).dangling = resident_u64(0u);
    (*out).work = resident_u64(0u);
    (*out).count = resident_u64(0u);
    (*out).pushes = resident_u64(0u);
    (*out).applied = 0u;
    (*out).rejected = 0u;
    (*out).full = 0u;
    (*out).op = m.op;
    (*out).ok = 1u;
    (*out).stalled = 0u;
    let op = m.op;
    let shapes = residual_len == n && acc_len == n && out_off_len == n && out_len_len == n
        && out_cap_len == n && frontier_len == 2u * n;
    if (op == PRS_ADD || op == PRS_REMOVE || op >= PRS_UNKNOWN) {
        var result = 0u;
        if (shapes && m.a < n && m.b < n && op < PRS_UNKNOWN) {
            result = prs_apply(op, m.a, m.b, m.round);
        }
        if (!prs_complete) {
            atomicAdd(&state.stalled, 1u);
            result = 0u;
        }
        if (result == 1u) {
            atomicAdd(&state.applied, 1u);
        } else {
            atomicAdd(&state.rejected, 1u);
            if (result == 2u) { atomicAdd(&state.full, 1u); }
        }
        atomicAdd(&state.updates, 1u);
        return false;
    }
    if (!shapes) {
        (*out).ok = 0u;
        return true;
    }
    if (op == PRS_SYNC) {
        (*out).count = resident_u64(atomicLoad(&state.len[m.round % 3u]));
        (*out).applied = atomicLoad(&state.applied);
        (*out).rejected = atomicLoad(&state.rejected);
        (*out).full = atomicLoad(&state.full);
        (*out).stalled = atomicLoad(&state.stalled);
        (*out).sum = resident_f32_to_f64(bitcast<f32>(atomicLoad(&state.uniform_bits)));
        return true;
    }
    if (op == PRS_TAKE) {
        let c = bitcast<f32>(atomicLoad(&state.uniform_bits));
        (*out).sum = resident_f32_to_f64(c);
        (*out).dangling = resident_u32_to_f64(atomicLoad(&state.dangling));
        if (abs(c) > eps) {
            (*out).sum = resident_f32_to_f64(bitcast<f32>(atomicExchange(&state.uniform_bits, 0u)));
            (*out).count = resident_u64(1u);
        }
        return true;
    }
    if (op == PRS_RESET) {
        atomicStore(&state.len[0], 0u);
        atomicStore(&state.len[1], 0u);
        atomicStore(&state.len[2], 0u);
        atomicStore(&state.uniform_bits, 0u);
        atomicStore(&state.dangling, 0u);
        return true;
    }
    if (m.a > m.b || m.b > n) {
        (*out).ok = 0u;
        return true;
    }
    let value = resident_f64_to_f32(m.value);
    var work = 0u;
    var count = 0u;
    var pushes = 0u;
    var sum = 0.0;
    var dangling = 0.0;
    var i = m.a;
    if (op == PRS_PUSH) {
        atomicStore(&state.len[(m.round + 2u) % 3u], 0u);
        let queue_at = (m.round & 1u) * n;
        var to_uniform = 0.0;
        for (; i < m.b; i += 1u) {
            let u = frontier[queue_at + i];
            if (u >= n) { continue; }
            let delta = prs_take(u);
            if (delta == 0.0) { continue; }
            ranks[u] += delta;
            pushes += 1u;
            let k = out_len[u];
            if (k == 0u) {
                to_uniform += d * delta / nf;
                continue;
            }
            let off = out_off[u];
            let share = d * delta / f32(k);
            var j = 0u;
            for (; j < k; j += 1u) { count += prs_bump(pool[off + j], share, m.round + 1u); }
            if (j != k) { prs_complete = false; }
            work += k;
        }
        if (to_uniform != 0.0) { prs_add_uniform(to_uniform); }
    } else if (op == PRS_UNIFORM) {
        // A dangling node's share is absorbed: the host scaled the value for it.
        for (; i < m.b; i += 1u) {
            ranks[i] += value;
            let k = out_len[i];
            if (k == 0u) { continue; }
            let off = out_off[i];
            let share = d * value / f32(k);
            var j = 0u;
            for (; j < k; j += 1u) { count += prs_bump(pool[off + j], share, m.round); }
            if (j != k) { prs_complete = false; }
            work += k;
        }
    } else if (op == PRS_FILL) {
        for (; i < m.b; i += 1u) {
            ranks[i] = value;
            if (out_len[i] == 0u) {
                dangling += value;
                count += 1u;
            }
        }
        atomicAdd(&state.dangling, count);
    } else if (op == PRS_SCATTER) {
        for (; i < m.b; i += 1u) {
            let k = out_len[i];
            if (k == 0u) { continue; }
            let off = out_off[i];
            let share = ranks[i] / f32(k);
            var j = 0u;
            for (; j < k; j += 1u) { prs_add_acc(pool[off + j], share); }
            if (j != k) { prs_complete = false; }
            work += k;
        }
    } else if (op == PRS_GATHER) {
        for (; i < m.b; i += 1u) {
            let x = value + d * bitcast<f32>(atomicExchange(&acc[i], 0u));
            sum += abs(x - ranks[i]);
            ranks[i] = x;
            if (out_len[i] == 0u) { dangling += x; }
        }
        work = m.b - m.a;
    } else if (op == PRS_RESIDUAL) {
        for (; i < m.b; i += 1u) {
            let r = value + d * bitcast<f32>(atomicExchange(&acc[i], 0u)) - ranks[i];
            let queued = abs(r) > eps;
            atomicStore(&residual[i], prs_bits(r, queued));
            sum += abs(r);
            if (queued) {
                let slot = atomicAdd(&state.len[m.round % 3u], 1u);
                if (slot < n) { frontier[(m.round & 1u) * n + slot] = i; }
                count += 1u;
            }
        }
        work = m.b - m.a;
    } else {
        (*out).ok = 0u;
    }
    (*out).sum = resident_f32_to_f64(sum);
    (*out).dangling = resident_f32_to_f64(dangling);
    (*out).work = resident_u64(work);
    (*out).count = resident_u64(count);
    (*out).pushes = resident_u64(pushes);
    if (!prs_complete || i != m.b) { (*out).ok = 0u; }
    return true;
}
