//fuzz:keyed
// A keyed handler (after the workloads' anomaly.cu): the key is the input's `x`, each key's
// state its running mean and variance; answers a reading more than 4 sigma off.
#define ALPHA 0.01
#define Z_ALERT 4.0

__device__ bool handle(KeyStats* ks, const FuzzIn* in, FuzzOut* out, const Envelope* env) {
    (void)env;
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
    double z = 0.0;
    if (v > 0.0) z = fabs(x - m) / sqrt(v);
    const double d = x - m;
    ks->m = m + ALPHA * d;
    ks->v = (1.0 - ALPHA) * (v + ALPHA * d * d);
    ks->n = n + 1ull;
    out->x = in->x;
    out->y = (float)z;
    out->value = x;
    out->seq = in->seq;
    return v > 0.0 && z > Z_ALERT && n >= 100ull;
}
