// Vector add over the bound buffers `a`, `b` (inputs) and `c` (output), all `float`:
// c[i] = a[i] + b[i] for i in offset .. offset + len. A range past any buffer (or one whose end
// overflows) answers ok = 0 and touches nothing. One message per handler call; the threads of a
// batch work on their own ranges.
//
// Handler: vector_add (ring kernel AddRange -> RangeDone, no state, buffers a, b, c).

__device__ bool vector_add(ResidentState* state, const ResidentIn* in, ResidentOut* out, const Envelope* env,
                           ResidentBuffers* buffers) {
    const unsigned long long off = in->offset;
    const unsigned long long len = in->len;
    out->offset = off;
    out->len = len;
    out->_pad = 0u;
    unsigned long long n = buffers->a_len;
    if (buffers->b_len < n) n = buffers->b_len;
    if (buffers->c_len < n) n = buffers->c_len;
    // `off > n || len > n - off` also refuses ranges whose end overflows.
    if (off > n || len > n - off) {
        out->ok = 0u;
        return true;
    }
    const float* a = buffers->a;
    const float* b = buffers->b;
    float* c = buffers->c;
    for (unsigned long long i = off; i < off + len; ++i) c[i] = a[i] + b[i];
    out->ok = 1u;
    return true;
}
