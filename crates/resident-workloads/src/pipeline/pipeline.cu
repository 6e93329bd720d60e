// The streaming pipeline's two stages, kernel to kernel (the runtime forwards the normalizer's
// outputs to the scorer). Both live in this one file and each ring kernel compiles all of it,
// so the handlers are templates over their message types: only the one a kernel calls is
// instantiated against that kernel's types.
//
// Handlers:
// * pipeline_normalize: Raw{seq, value} -> Normalized{seq, x}, x = clamp(value, 0, 100) / 100,
//   NaN -> 0; always answers.
// * pipeline_score: Normalized{seq, x} -> Scored{seq, x, score = x * x, level}, level 0 when
//   score < 0.3, 1 when < 0.7, else 2.

template <typename S, typename In, typename Out>
__device__ bool pipeline_normalize(S* state, const In* in, Out* out, const Envelope* env) {
    double v = in->value;
    double x;
    if (v != v) {
        x = 0.0;  // NaN
    } else {
        if (v < 0.0) v = 0.0;
        if (v > 100.0) v = 100.0;
        x = v / 100.0;
    }
    out->seq = in->seq;
    out->x = x;
    return true;
}

template <typename S, typename In, typename Out>
__device__ bool pipeline_score(S* state, const In* in, Out* out, const Envelope* env) {
    const double x = in->x;
    const double s = x * x;
    out->seq = in->seq;
    out->x = x;
    out->score = s;
    out->level = s < 0.3 ? 0u : (s < 0.7 ? 1u : 2u);
    out->_pad = 0u;
    return true;
}
