// The host's half of streaming PageRank's protocol (StreamPageRank in pagerank/stream.rs),
// played against the CUDA handler `pagerank_stream` on plain threads under ThreadSanitizer.
// A phase's messages run on THREADS threads at once (thread t takes messages t, t + THREADS,
// ..., in order, like a batch's device threads, each waiting for its tickets); phases are
// separated by joins, as the host separates them by waiting for every answer.
//
// Checks: no TSan report (the exit code says so), every change applied or refused as a
// sequential replay says, the device graph equal to the replay's, the counters, and the ranks
// after every refresh within 2 d/(1-d) N tol of a sequential power iteration on the replayed
// graph. Prints one line per batch; exits 1 on a failed check.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

namespace {

const unsigned N = 400;
const unsigned THREADS = 8;
const unsigned CHUNK = 16;
const double DAMPING = 0.85;
const double TOL = 1e-9;

unsigned long long lcg_state = 12345;
unsigned rnd(unsigned below) {
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)((lcg_state >> 33) % below);
}

int failures = 0;
void fail(const char* what, double a, double b) {
    std::printf("FAIL: %s (%g vs %g)\n", what, a, b);
    ++failures;
}

struct Device {
    std::vector<double> ranks, residual, acc;
    std::vector<unsigned> out_off, out_len, out_cap, pool, flags, frontier, src_seq;
    StreamCounters st{};
    ResidentBuffers b{};
};

Device dev;
std::vector<std::set<unsigned>> replay;  // the graph as a sequential replay sees it
unsigned round_k = 0, sent = 0;
std::vector<unsigned> seq(N, 0);

template <typename T>
void bind(T** p, unsigned long long* len, std::vector<T>& v) {
    *p = v.data();
    *len = v.size();
}

void setup() {
    replay.assign(N, {});
    for (unsigned u = 0; u < N; ++u) {
        if (u % 17 == 0) continue;  // dangling
        for (int e = 0; e < 3; ++e) replay[u].insert(rnd(N));
    }
    unsigned used = 0;
    for (unsigned u = 0; u < N; ++u) {
        const unsigned deg = (unsigned)replay[u].size();
        const unsigned room = std::max(4u, deg + deg / 2);
        dev.out_off.push_back(used);
        dev.out_len.push_back(deg);
        dev.out_cap.push_back(room);
        used += room;
    }
    dev.pool.assign(2 * used, 0u);
    for (unsigned u = 0; u < N; ++u) {
        unsigned i = 0;
        for (unsigned v : replay[u]) dev.pool[dev.out_off[u] + i++] = v;
    }
    dev.ranks.assign(N, 0.0);
    dev.residual.assign(N, 0.0);
    dev.acc.assign(N, 0.0);
    dev.flags.assign(N, 0u);
    dev.frontier.assign(2 * N, 0u);
    dev.src_seq.assign(N, 0u);
    dev.st.damping = DAMPING;
    dev.st.eps = DAMPING * TOL;
    dev.st.pool_top = used;
    bind(&dev.b.ranks, &dev.b.ranks_len, dev.ranks);
    bind(&dev.b.residual, &dev.b.residual_len, dev.residual);
    bind(&dev.b.acc, &dev.b.acc_len, dev.acc);
    bind(&dev.b.out_off, &dev.b.out_off_len, dev.out_off);
    bind(&dev.b.out_len, &dev.b.out_len_len, dev.out_len);
    bind(&dev.b.out_cap, &dev.b.out_cap_len, dev.out_cap);
    bind(&dev.b.pool, &dev.b.pool_len, dev.pool);
    bind(&dev.b.flags, &dev.b.flags_len, dev.flags);
    bind(&dev.b.frontier, &dev.b.frontier_len, dev.frontier);
    bind(&dev.b.src_seq, &dev.b.src_seq_len, dev.src_seq);
}

StreamMsg msg(unsigned op, unsigned a, unsigned b, double value, unsigned ticket) {
    StreamMsg m{};
    m.value = value;
    m.a = a;
    m.b = b;
    m.op = op;
    m.round = round_k;
    m.ticket = ticket;
    return m;
}

// One phase: every message on THREADS threads; the answers of those that answer.
std::vector<StreamAnswer> phase(const std::vector<StreamMsg>& msgs) {
    std::vector<StreamAnswer> outs(msgs.size());
    std::vector<char> answered(msgs.size(), 0);
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < THREADS; ++t) {
        ts.emplace_back([&, t] {
            Envelope env{};
            for (size_t i = t; i < msgs.size(); i += THREADS)
                answered[i] = pagerank_stream(&dev.st, &msgs[i], &outs[i], &env, &dev.b) ? 1 : 0;
        });
    }
    for (auto& th : ts) th.join();
    std::vector<StreamAnswer> got;
    for (size_t i = 0; i < msgs.size(); ++i) {
        if (!answered[i]) continue;
        if (outs[i].ok == 0) fail("an operation answered ok = 0", outs[i].op, 0);
        got.push_back(outs[i]);
    }
    return got;
}

std::vector<StreamMsg> ranges(unsigned len, unsigned op, double value) {
    std::vector<StreamMsg> v;
    for (unsigned lo = 0; lo < len; lo += CHUNK) v.push_back(msg(op, lo, std::min(len, lo + CHUNK), value, 0));
    return v;
}

StreamAnswer one(unsigned op, unsigned ticket = 0) {
    auto a = phase({msg(op, 0, 0, 0.0, ticket)});
    return a.empty() ? StreamAnswer{} : a[0];
}

double sum_of(const std::vector<StreamAnswer>& a, double StreamAnswer::*f) {
    double s = 0;
    for (auto& x : a) s += x.*f;
    return s;
}
unsigned long long count_of(const std::vector<StreamAnswer>& a) {
    unsigned long long s = 0;
    for (auto& x : a) s += x.count;
    return s;
}

void recompute() {
    one(PRS_SYNC, sent);
    one(PRS_RESET);
    round_k = 0;
    double dangling = sum_of(phase(ranges(N, PRS_FILL, 1.0 / N)), &StreamAnswer::dangling);
    for (int it = 0; it < 200; ++it) {
        phase(ranges(N, PRS_SCATTER, 0.0));
        const double base = DAMPING * dangling / N + (1.0 - DAMPING) / N;
        auto g = phase(ranges(N, PRS_GATHER, base));
        dangling = sum_of(g, &StreamAnswer::dangling);
        if (sum_of(g, &StreamAnswer::sum) < N * TOL) break;
    }
    phase(ranges(N, PRS_SCATTER, 0.0));
    phase(ranges(N, PRS_RESIDUAL, DAMPING * dangling / N + (1.0 - DAMPING) / N));
}

void refresh() {
    unsigned long long pending = one(PRS_SYNC, sent).count;
    for (;;) {
        while (pending > 0) {
            pending = count_of(phase(ranges((unsigned)pending, PRS_PUSH, 0.0)));
            ++round_k;
        }
        StreamAnswer t = one(PRS_TAKE);
        if (t.count == 0) break;
        const double c = t.sum / (1.0 - DAMPING * t.dangling / N);  // every later uniform push
        pending = count_of(phase(ranges(N, PRS_UNIFORM, c)));
    }
}

// networkx's power iteration on the replayed graph, to a tolerance far below the check's.
std::vector<double> reference() {
    std::vector<double> x(N, 1.0 / N), next(N);
    for (int it = 0; it < 1000; ++it) {
        double dangling = 0;
        for (unsigned u = 0; u < N; ++u)
            if (replay[u].empty()) dangling += x[u];
        std::fill(next.begin(), next.end(), DAMPING * dangling / N + (1.0 - DAMPING) / N);
        for (unsigned u = 0; u < N; ++u)
            for (unsigned v : replay[u]) next[v] += DAMPING * x[u] / replay[u].size();
        double err = 0;
        for (unsigned v = 0; v < N; ++v) err += std::fabs(next[v] - x[v]);
        x.swap(next);
        if (err < 1e-15) break;
    }
    return x;
}

void check_ranks(const char* when) {
    const std::vector<double> want = reference();
    double l1 = 0;
    for (unsigned v = 0; v < N; ++v) l1 += std::fabs(dev.ranks[v] - want[v]);
    const double tol = 2.0 * DAMPING / (1.0 - DAMPING) * N * TOL;
    std::printf("%s: ranks at L1 %.3e from the sequential reference (allowed %.3e)\n", when, l1, tol);
    if (!(l1 <= tol)) fail(when, l1, tol);
}

}  // namespace

int main() {
    setup();
    recompute();
    check_ranks("after the first recompute");
    const unsigned hot[] = {0, 5, 17, 33, 99, 250};  // 0, 17, 99: dangling at the start
    unsigned applied = 0, rejected = 0;
    for (int batch = 0; batch < 4; ++batch) {
        std::vector<StreamMsg> changes;
        for (int i = 0; i < 500; ++i) {
            const unsigned u = hot[rnd(6)];
            const unsigned v = (rnd(40) * 7) % N;
            const unsigned op = rnd(2) == 0 ? PRS_ADD : PRS_REMOVE;
            changes.push_back(msg(op, u, v, 0.0, seq[u]++));
            ++sent;
            const bool ok = op == PRS_ADD ? replay[u].insert(v).second : replay[u].erase(v) == 1;
            (ok ? applied : rejected)++;
        }
        phase(changes);
        refresh();
        char when[64];
        std::snprintf(when, sizeof when, "after batch %d (500 changes on 6 sources)", batch);
        check_ranks(when);
    }
    // The graph and the counters agree with the replay.
    for (unsigned u = 0; u < N; ++u) {
        std::set<unsigned> got(dev.pool.begin() + dev.out_off[u], dev.pool.begin() + dev.out_off[u] + dev.out_len[u]);
        if (got != replay[u] || got.size() != dev.out_len[u]) fail("an out-list differs from the replay", u, 0);
    }
    StreamAnswer s = one(PRS_SYNC, sent);
    if (s.applied != applied) fail("applied", s.applied, applied);
    if (s.rejected != rejected) fail("rejected", s.rejected, rejected);
    if (s.full != 0 || s.stalled != 0) fail("full / stalled", s.full, s.stalled);
    std::printf("%u applied, %u refused, %d failed checks\n", applied, rejected, failures);
    return failures == 0 ? 0 : 1;
}
