// A plain ring handler (after resident-cuda's tests): counts every message, doubles x and
// answers the even ones, stamped with the message id.
__device__ bool handle(FuzzState* s, const FuzzIn* in, FuzzOut* out, const Envelope* env) {
    atomicAdd(&s->n, 1ull);
    atomicAdd(&s->hist[in->x & 3u], 1u);
    out->x = in->x * 2u;
    out->y = in->y;
    out->value = in->value;
    out->seq = env->message_id;
    return (in->x % 2u) == 0u;
}
