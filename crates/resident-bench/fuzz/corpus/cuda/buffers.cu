//fuzz:buffers
// A handler with bound buffers (a weight per slot, a histogram): reads its slot's weight and
// counts the message in its bucket.
__device__ bool handle(FuzzState* s, const FuzzIn* in, FuzzOut* out, const Envelope* env,
                       ResidentBuffers* b) {
    if (b->weights_len == 0ull) return false;
    const unsigned long long slot = in->x % b->weights_len;
    const float w = b->weights[slot];
    atomicAdd(&b->hist[in->x % b->hist_len], 1u);
    atomicAdd(&s->n, 1ull);
    out->x = (unsigned int)slot;
    out->y = in->y * w;
    out->value = (double)w;
    out->seq = b->weights_id ^ env->message_id;
    return w != 0.0f;
}
