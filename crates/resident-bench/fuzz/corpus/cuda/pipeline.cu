// A handler as a template over its types (after the workloads' pipeline.cu): normalizes a
// value to 0..1 (NaN -> 0) and scores it.
#define SCORE_LOW 0.3
#define SCORE_HIGH 0.7

template <typename S, typename In, typename Out>
__device__ bool handle(S* state, const In* in, Out* out, const Envelope* env) {
    double v = in->value;
    double x;
    if (v != v) {
        x = 0.0;  // NaN
    } else {
        if (v < 0.0) v = 0.0;
        if (v > 100.0) v = 100.0;
        x = v / 100.0;
    }
    const double score = x * x;
    out->seq = in->seq;
    out->value = x;
    out->y = (float)score;
    out->x = score < SCORE_LOW ? 0u : (score < SCORE_HIGH ? 1u : 2u);
    return true;
}
