// The anomaly detector as a WGSL ring-kernel handler: `anomaly::ReadingMsg -> AlertMsg` with
// the per-sensor statistics bound as `stats: array<SensorStats>` and the device state
// `anomaly::DetectorCounters` (processed, alerts, refused: atomic<u32>). Build it with
// `.in_order()`: the batch's readings run one after another in message order, so the readings
// of one sensor fold in input order without any waiting (WGSL gives no forward-progress
// guarantee to an invocation spinning on another). Arithmetic is f32 (the statistics are kept
// as f64 converted from f32).
//
// Per reading (slot != FLUSH):
//   - slot >= stats length: refused += 1, processed += 1, no output.
//   - ticket != stats[slot].n (low word): the reading is not this sensor's next one; in order
//     it can never come due, so it is refused at once (refused += 1, processed += 1, no output),
//     which is what a parallel handler's bounded wait ends in.
//   - else fold as anomaly::observe: first reading (n == 0) sets m = x, v = 0, n = 1; later
//     ones are scored z = |x - m| / sqrt(v) (only when v > 0), then d = x - m, m += a d,
//     v = (1 - a)(v + a d^2), n += 1; an alert when v > 0 before, z > 4 and n >= 100 before:
//     alerts += 1 and AlertMsg{index, value, z, slot}. Then processed += 1.
// FLUSH (slot 0xFFFFFFFF): every reading before it has been handled (in order, so
// processed - ticket >= 0 already holds); answers AlertMsg{index, value: refused, z: alerts,
// slot: FLUSH} with the kernel's totals.

const ANOMALY_FLUSH: u32 = 0xffffffffu;
const ANOMALY_ALPHA: f32 = 0.01;
const ANOMALY_Z: f32 = 4.0;
const ANOMALY_WARMUP: u32 = 100u;

fn anomaly(r: ReadingMsg, out: ptr<function, AlertMsg>, env: Envelope) -> bool {
    if (r.slot == ANOMALY_FLUSH) {
        (*out).index = r.index;
        (*out).value = resident_u32_to_f64(atomicLoad(&state.refused));
        (*out).z = resident_u32_to_f64(atomicLoad(&state.alerts));
        (*out).slot = ANOMALY_FLUSH;
        (*out)._pad = 0u;
        return true;
    }
    if (r.slot >= stats_len) {
        atomicAdd(&state.refused, 1u);
        atomicAdd(&state.processed, 1u);
        return false;
    }
    var s = stats[r.slot];
    if (s.n.x != r.ticket) {
        atomicAdd(&state.refused, 1u);
        atomicAdd(&state.processed, 1u);
        return false;
    }
    let x = resident_f64_to_f32(r.value);
    if (s.n.x == 0u && s.n.y == 0u) {
        s.m = resident_f32_to_f64(x);
        s.v = resident_u64(0u);
        s.n = resident_u64(1u);
        stats[r.slot] = s;
        atomicAdd(&state.processed, 1u);
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
    stats[r.slot] = s;
    let alert = scored && z > ANOMALY_Z && !resident_u64_lt(prior, resident_u64(ANOMALY_WARMUP));
    if (alert) {
        atomicAdd(&state.alerts, 1u);
        (*out).index = r.index;
        (*out).value = r.value;
        (*out).z = resident_f32_to_f64(z);
        (*out).slot = r.slot;
        (*out)._pad = 0u;
    }
    atomicAdd(&state.processed, 1u);
    return alert;
}
