// Real-time anomaly detection as a ring kernel: per-sensor statistics in the bound buffer
// `stats` (SensorStats {m, v, n}; all zero = not seen), counters in the device state
// (DetectorCounters {processed, alerts, refused}, mod 2^32).
//
// Handler: anomaly_detect (ReadingMsg -> AlertMsg, state DetectorCounters, buffer stats).
//
// The threads of a batch fold their readings in parallel. Readings of one sensor fold in input
// order: a reading's `ticket` is the number of readings of its slot before it, and it waits
// until the slot's count `n` (low 32 bits) equals its ticket. The folder publishes `n` last
// (fence, then an atomic store) after `m` and `v`, so the next ticket holder, which reads `n`
// atomically and fences before reading `m` and `v`, sees them. A reading whose slot's count
// stops moving for ANOMALY_WAIT_NS (~1 s; 10 s on CudaSim) before its ticket comes due is given up (refused):
// the bound is on a stall, not on the whole wait, because a batch may hold a long chain of one
// sensor's readings (each handoff is quick on a GPU, but on CudaSim's host threads a chain of
// 1000 can take longer than a second). A FLUSH (slot 0xFFFFFFFF) waits, bounded the same way,
// until `processed` has reached its ticket (the readings sent before it) and answers the
// totals: value = refused, z = alerts.

#define ANOMALY_FLUSH 0xFFFFFFFFu
#define ANOMALY_ALPHA 0.01
#define ANOMALY_Z 4.0
#define ANOMALY_WARMUP 100ull
// The stall bound: ~1 s on a GPU. On CudaSim a batch's 1024 threads are OS threads sharing a
// few cores with everything else on the machine, so a slot's predecessor may not be scheduled
// for longer than that; the bound there is 10 s (still a bound).
#ifdef RESIDENT_SIM
#define ANOMALY_WAIT_NS 10000000000ull
#else
#define ANOMALY_WAIT_NS 1000000000ull
#endif

// How long a waiting reading sleeps between polls: proportional to how many tickets are still
// ahead of it, so the next in line polls often and the far end of a long chain rarely. On
// CudaSim every thread is an OS thread (a batch of 1024 on a few cores): there the steps are
// coarser, or the far end's wake-ups would starve the thread whose turn it is.
#ifdef RESIDENT_SIM
#define ANOMALY_SLEEP_PER_TICKET_NS 20000ull
#define ANOMALY_MAX_SLEEP_NS 20000000ull
#else
#define ANOMALY_SLEEP_PER_TICKET_NS 128ull
#define ANOMALY_MAX_SLEEP_NS 1000000ull
#endif

__device__ __forceinline__ unsigned int anomaly_sleep_ns(unsigned int ahead) {
    unsigned long long ns = (unsigned long long)ahead * ANOMALY_SLEEP_PER_TICKET_NS;
    return (unsigned int)(ns < ANOMALY_MAX_SLEEP_NS ? ns : ANOMALY_MAX_SLEEP_NS);
}

#ifdef RESIDENT_SIM
__device__ __forceinline__ unsigned long long anomaly_now_ns() { return resident_sim::now_ns(); }
#else
__device__ __forceinline__ unsigned long long anomaly_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#endif

// Atomic reads (a read-modify-write that adds nothing: coherent on every architecture).
__device__ __forceinline__ unsigned int anomaly_load_u32(unsigned int* p) { return atomicAdd(p, 0u); }
__device__ __forceinline__ unsigned long long anomaly_load_u64(unsigned long long* p) { return atomicAdd(p, 0ull); }

__device__ __forceinline__ void anomaly_count(DetectorCounters* c, bool refused) {
    if (refused) atomicAdd(&c->refused, 1u);
    // Release: the alert / refusal count is visible before the reading counts as processed.
    __threadfence();
    atomicAdd(&c->processed, 1u);
}

__device__ bool anomaly_detect(ResidentState* state, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                               ResidentBuffers* buffers) {
    DetectorCounters* c = state;
    if (in->slot == ANOMALY_FLUSH) {
        unsigned long long t0 = anomaly_now_ns();
        unsigned int seen = anomaly_load_u32(&c->processed);
        while ((int)(seen - in->ticket) < 0) {
            if (anomaly_now_ns() - t0 > ANOMALY_WAIT_NS) break;  // stalled: answer anyway
            __nanosleep(anomaly_sleep_ns(in->ticket - seen));
            const unsigned int now = anomaly_load_u32(&c->processed);
            if (now != seen) t0 = anomaly_now_ns();  // progress: the wait is for a stall
            seen = now;
        }
        __threadfence();  // acquire: the counts of the readings seen processed
        out->index = in->index;
        out->value = (double)anomaly_load_u32(&c->refused);
        out->z = (double)anomaly_load_u32(&c->alerts);
        out->slot = ANOMALY_FLUSH;
        out->_pad = 0u;
        return true;
    }
    if ((unsigned long long)in->slot >= buffers->stats_len) {
        anomaly_count(c, true);
        return false;
    }
    SensorStats* s = &buffers->stats[in->slot];
    unsigned long long t0 = anomaly_now_ns();
    unsigned long long n = anomaly_load_u64(&s->n);
    while ((unsigned int)n != in->ticket) {
        if (anomaly_now_ns() - t0 > ANOMALY_WAIT_NS) {
            anomaly_count(c, true);  // the slot stalled: its turn never came
            return false;
        }
        __nanosleep(anomaly_sleep_ns(in->ticket - (unsigned int)n));
        const unsigned long long now = anomaly_load_u64(&s->n);
        if (now != n) t0 = anomaly_now_ns();  // an earlier ticket folded: not stalled
        n = now;
    }
    __threadfence();  // acquire: pairs with the previous folder's fence before publishing n
    volatile double* vm = &s->m;
    volatile double* vv = &s->v;
    const double x = in->value;
    bool alert = false;
    double z = 0.0;
    if (n == 0ull) {
        *vm = x;
        *vv = 0.0;
    } else {
        const double m = *vm;
        const double v = *vv;
        const bool scored = v > 0.0;
        if (scored) z = fabs(x - m) / sqrt(v);
        const double d = x - m;
        *vm = m + ANOMALY_ALPHA * d;
        *vv = (1.0 - ANOMALY_ALPHA) * (v + ANOMALY_ALPHA * d * d);
        alert = scored && z > ANOMALY_Z && n >= ANOMALY_WARMUP;
    }
    // Release: m and v before the new count; the next ticket holder waits for it.
    __threadfence();
    atomicExch(&s->n, n + 1ull);
    if (alert) {
        atomicAdd(&c->alerts, 1u);
        out->index = in->index;
        out->value = x;
        out->z = z;
        out->slot = in->slot;
        out->_pad = 0u;
    }
    anomaly_count(c, false);
    return alert;
}
