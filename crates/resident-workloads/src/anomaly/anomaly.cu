// Real-time anomaly detection as a keyed ring kernel: the sensor's dense slot is the key, and
// each key's state is its SensorStats {m, v, n} (all zero = not seen), kept in device memory
// for the kernel's life (the keyed kernel's bound buffer `keys`).
//
// Handler: anomaly_detect (ReadingMsg -> AlertMsg, keyed on `slot`, KeyState = SensorStats).
//
// The keyed template runs one thread per message and keeps each key's messages in the order
// sent (a batch runs in rounds, the r-th reading of each sensor in round r), so this handler
// folds its reading into `ks` with plain loads and stores: no tickets, no atomics, no waiting.
// A reading with `flush != 0` is a barrier marker: it leaves the statistics alone and is
// answered with slot = ANOMALY_FLUSH (the host sends it once everything before it has been
// processed, so its answer comes after every earlier alert).

#define ANOMALY_FLUSH 0xFFFFFFFFu
#define ANOMALY_ALPHA 0.01
#define ANOMALY_Z 4.0
#define ANOMALY_WARMUP 100ull

__device__ bool anomaly_detect(KeyState* ks, const ResidentIn* in, ResidentOut* out, const Envelope* env) {
    (void)env;
    if (in->flush != 0u) {
        out->index = in->index;
        out->value = 0.0;
        out->z = 0.0;
        out->slot = ANOMALY_FLUSH;
        out->_pad = 0u;
        return true;
    }
    const double x = in->value;
    const unsigned long long n = ks->n;
    if (n == 0ull) {
        ks->m = x;
        ks->v = 0.0;
        ks->n = 1ull;
        return false;
    }
    const double m = ks->m;
    const double v = ks->v;
    const bool scored = v > 0.0;
    double z = 0.0;
    if (scored) z = fabs(x - m) / sqrt(v);
    const double d = x - m;
    ks->m = m + ANOMALY_ALPHA * d;
    ks->v = (1.0 - ANOMALY_ALPHA) * (v + ANOMALY_ALPHA * d * d);
    ks->n = n + 1ull;
    const bool alert = scored && z > ANOMALY_Z && n >= ANOMALY_WARMUP;
    if (alert) {
        out->index = in->index;
        out->value = x;
        out->z = z;
        out->slot = in->slot;
        out->_pad = 0u;
    }
    return alert;
}
