// The anomaly detector as a keyed WGSL handler: `anomaly::ReadingMsg -> AlertMsg`, keyed on
// `slot`, with KeyState = `anomaly::SensorStats` (the per-sensor statistics, kept in the keyed
// kernel's storage buffer `keys` for the kernel's life). Build it with
// `WgslHandler::new(ANOMALY_WGSL).function("anomaly").keyed("slot")` and `RingKernel::key_wgsl`.
//
// The keyed entry point gives each sensor of a batch one leader invocation that runs that
// sensor's readings of the batch one after another, in the order sent, against a copy of its
// statistics: so readings of one sensor fold in input order with plain loads and stores, and
// different sensors run in parallel. No tickets and no waiting (WGSL gives no forward-progress
// guarantee to an invocation spinning on another). Arithmetic is f32 (the statistics are kept
// as f64 converted from f32).
//
// Per reading: fold as anomaly::observe: the first reading (n == 0) sets m = x, v = 0, n = 1;
// later ones are scored z = |x - m| / sqrt(v) (only when v > 0), then d = x - m, m += a d,
// v = (1 - a)(v + a d^2), n += 1; an alert when v > 0 before, z > 4 and n >= 100 before:
// AlertMsg{index, value, z, slot}.
// A reading with `flush != 0` is a barrier marker: the statistics are left alone and it is
// answered with slot = ANOMALY_FLUSH.

const ANOMALY_FLUSH: u32 = 0xffffffffu;
const ANOMALY_ALPHA: f32 = 0.01;
const ANOMALY_Z: f32 = 4.0;
const ANOMALY_WARMUP: u32 = 100u;

fn anomaly(ks: ptr<function, KeyState>, r: ReadingMsg, out: ptr<function, AlertMsg>, env: Envelope) -> bool {
    if (r.flush != 0u) {
        (*out).index = r.index;
        (*out).value = resident_u32_to_f64(0u);
        (*out).z = resident_u32_to_f64(0u);
        (*out).slot = ANOMALY_FLUSH;
        (*out)._pad = 0u;
        return true;
    }
    var s = *ks;
    let x = resident_f64_to_f32(r.value);
    if (s.n.x == 0u && s.n.y == 0u) {
        s.m = resident_f32_to_f64(x);
        s.v = resident_u64(0u);
        s.n = resident_u64(1u);
        *ks = s;
        return false;
    }
    let m = resident_f64_to_f32(s.m);
    let v = resident_f64_to_f32(s.v);
    let d = x - m;
    let scored = v > 0.0;
    var z = 0.0;
    if (scored) {
        z = abs(d) / sqrt(v);
    }
    let prior = s.n;
    s.m = resident_f32_to_f64(m + ANOMALY_ALPHA * d);
    s.v = resident_f32_to_f64((1.0 - ANOMALY_ALPHA) * (v + ANOMALY_ALPHA * d * d));
    s.n = resident_u64_add(prior, resident_u64(1u));
    *ks = s;
    let alert = scored && z > ANOMALY_Z && !resident_u64_lt(prior, resident_u64(ANOMALY_WARMUP));
    if (alert) {
        (*out).index = r.index;
        (*out).value = r.value;
        (*out).z = resident_f32_to_f64(z);
        (*out).slot = r.slot;
        (*out)._pad = 0u;
    }
    return alert;
}
