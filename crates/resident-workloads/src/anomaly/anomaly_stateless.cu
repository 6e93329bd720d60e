// The stateless anomaly baseline: a one-shot kernel that folds one micro-batch into statistics
// uploaded for it (and downloaded after it). `SensorStats` is declared in front of this source
// by the runner (from the Rust type).
//
// Entry: anomaly_stateless(n, slots, values, tickets, stats, sensors, z, order)
// * n readings: slots[i], values[i], tickets[i] (readings of the slot before this one, mod 2^32,
//   counted over the whole stream: the uploaded statistics' n continues it);
// * stats[sensors] in/out; z[i] out: the reading's score when it is an anomaly, else NaN;
// * order: one zeroed u32. Each thread claims the next reading index with an atomic on it, so
//   a reading's index is claimed only after every lower index was, by a thread that already
//   runs: the in-order wait (as in the ring kernel's handler) can never wait for a thread that
//   has not started, whatever order blocks are scheduled in. Any grid works.
// A reading whose slot's count stops moving for ~1 s (10 s on CudaSim) before its ticket comes due is given up
// (z NaN, statistics untouched).

// The stall bound: ~1 s on a GPU, 10 s on CudaSim (its threads are OS threads on few cores).
#ifdef RESIDENT_SIM
#define STATELESS_WAIT_NS 10000000000ull
#else
#define STATELESS_WAIT_NS 1000000000ull
#endif

#ifdef RESIDENT_SIM
__device__ __forceinline__ unsigned long long stateless_now_ns() { return resident_sim::now_ns(); }
#else
__device__ __forceinline__ unsigned long long stateless_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#endif

extern "C" __global__ void anomaly_stateless(unsigned long long n, const unsigned int* slots, const double* values,
                                             const unsigned int* tickets, SensorStats* stats,
                                             unsigned long long sensors, double* z, unsigned int* order) {
    for (;;) {
        const unsigned long long i = atomicAdd(order, 1u);
        if (i >= n) return;
        z[i] = nan("");
        const unsigned int slot = slots[i];
        if ((unsigned long long)slot >= sensors) continue;
        SensorStats* s = &stats[slot];
        unsigned long long t0 = stateless_now_ns();
        unsigned int sleep = 32;
        unsigned long long seen = atomicAdd(&s->n, 0ull);
        bool due = true;
        while ((unsigned int)seen != tickets[i]) {
            if (stateless_now_ns() - t0 > STATELESS_WAIT_NS) {
                due = false;  // the slot stalled
                break;
            }
            __nanosleep(sleep);
            if (sleep < 2048) sleep *= 2;
            const unsigned long long now = atomicAdd(&s->n, 0ull);
            if (now != seen) t0 = stateless_now_ns();  // progress: not stalled
            seen = now;
        }
        if (!due) continue;
        __threadfence();  // acquire: pairs with the previous folder's fence
        volatile double* vm = &s->m;
        volatile double* vv = &s->v;
        const double x = values[i];
        if (seen == 0ull) {
            *vm = x;
            *vv = 0.0;
        } else {
            const double m = *vm;
            const double v = *vv;
            const bool scored = v > 0.0;
            const double zi = scored ? fabs(x - m) / sqrt(v) : 0.0;
            const double d = x - m;
            *vm = m + 0.01 * d;
            *vv = (1.0 - 0.01) * (v + 0.01 * d * d);
            if (scored && zi > 4.0 && seen >= 100ull) z[i] = zi;
        }
        __threadfence();  // release: m and v before the new count
        atomicExch(&s->n, seen + 1ull);
    }
}
