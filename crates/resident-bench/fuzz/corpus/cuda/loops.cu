// Helpers, loops, a switch and bit tricks.
__device__ __forceinline__ unsigned int mix(unsigned int a) {
    a ^= a >> 16;
    a *= 0x7feb352du;
    a ^= a >> 15;
    return a;
}

__device__ bool handle(FuzzState* s, const FuzzIn* in, FuzzOut* out, const Envelope* env) {
    unsigned int h = mix(in->x);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        acc += (float)((h >> (4 * i)) & 0xfu) * in->y;
    }
    switch (env->priority >> 6) {
    case 0: h = __popc(h); break;
    case 1: h = __clz(h); break;
    case 2: h = __brev(h); break;
    default: h = max(h, 7u) - min(h, 3u); break;
    }
    unsigned int k = 0;
    while (k < 4u && (h & (1u << k)) == 0u) ++k;
    out->x = h + k;
    out->y = acc;
    out->value = sqrt(fabs(in->value)) + (double)__int_as_float(in->x & 0x3f7fffffu);
    out->seq = in->seq + (unsigned long long)atomicAdd(&s->hist[k & 3u], 1u);
    return true;
}
