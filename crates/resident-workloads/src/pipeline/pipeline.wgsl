// The streaming pipeline's two WGSL ring-kernel handlers, in f32 (f64 fields converted with
// the runtime's helpers). Both functions are in this one file, so each kernel compiles the
// other's message types too: build the normalizer with `.declare::<Scored>()` and the scorer
// with `.declare::<Raw>()`.
//
//   normalize: Raw{seq, value} -> Normalized{seq, x}, x = clamp(value, 0, 100) / 100, NaN -> 0;
//              always answers.
//   score:     Normalized{seq, x} -> Scored{seq, x, score: x * x, level}, level 0 when
//              score < 0.3, 1 when < 0.7, else 2.

fn normalize(r: Raw, out: ptr<function, Normalized>, env: Envelope) -> bool {
    let v = resident_f64_to_f32(r.value);
    var x = 0.0;
    // NaN compares false both ways: it stays 0.
    if (v >= 0.0 || v < 0.0) {
        x = clamp(v, 0.0, 100.0) / 100.0;
    }
    (*out).seq = r.seq;
    (*out).x = resident_f32_to_f64(x);
    return true;
}

fn score(n: Normalized, out: ptr<function, Scored>, env: Envelope) -> bool {
    let x = resident_f64_to_f32(n.x);
    let s = x * x;
    var level = 2u;
    if (s < 0.3) {
        level = 0u;
    } else if (s < 0.7) {
        level = 1u;
    }
    (*out).seq = n.seq;
    (*out).x = n.x;
    (*out).score = resident_f32_to_f64(s);
    (*out).level = level;
    (*out)._pad = 0u;
    return true;
}
