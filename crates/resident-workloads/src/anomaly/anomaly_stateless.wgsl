// The anomaly detector's stateless baseline as a one-shot WGSL kernel (entry
// `anomaly_stateless`): one invocation folds one micro-batch in input order, with the
// statistics uploaded before and downloaded after every launch by the host. Same fold, same
// f32 arithmetic and same refusals as anomaly.wgsl (a reading whose slot is past the
// statistics or whose ticket is not its sensor's count is skipped, z = NaN).
//
// Arguments (`@group(0) @binding(i)` = launch argument i):
//   0 n        uniform u64 (vec2<u32>): readings in this micro-batch
//   1 slots    u32[n]
//   2 values   f64[n] (vec2<u32>)
//   3 tickets  u32[n]
//   4 stats    SensorStats[sensors], read and written
//   5 z        f64[n] out: the alert's score, NaN when the reading is no alert
//   6 status   u32[1] out: readings handled (== n unless the device cut the loop short:
//              llvmpipe runs at most 65535 loop iterations per invocation)

// Byte for byte anomaly::SensorStats (m f64, v f64, n u64): 24 bytes.
struct SensorStats {
    m: vec2<u32>,
    v: vec2<u32>,
    n: vec2<u32>,
}

@group(0) @binding(0) var<uniform> n: vec2<u32>;
@group(0) @binding(1) var<storage, read> slots: array<u32>;
@group(0) @binding(2) var<storage, read> values: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> tickets: array<u32>;
@group(0) @binding(4) var<storage, read_write> stats: array<SensorStats>;
@group(0) @binding(5) var<storage, read_write> z: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> status: array<u32>;

const STATELESS_ALPHA: f32 = 0.01;
const STATELESS_Z: f32 = 4.0;
const STATELESS_WARMUP: u32 = 100u;
// f64 NaN, low word first.
const STATELESS_NAN: vec2<u32> = vec2<u32>(0u, 0x7ff80000u);

@compute @workgroup_size(1)
fn anomaly_stateless(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x != 0u) {
        return;
    }
    let count = min(n.x, min(arrayLength(&slots), min(arrayLength(&values), min(arrayLength(&tickets), arrayLength(&z)))));
    let sensors = arrayLength(&stats);
    var i = 0u;
    for (; i < count; i += 1u) {
        z[i] = STATELESS_NAN;
        let slot = slots[i];
        if (slot >= sensors) {
            continue;
        }
        var s = stats[slot];
        if (s.n.x != tickets[i]) {
            continue;
        }
        let x = resident_f64_to_f32(values[i]);
        if (s.n.x == 0u && s.n.y == 0u) {
            s.m = resident_f32_to_f64(x);
            s.v = resident_u64(0u);
            s.n = resident_u64(1u);
            stats[slot] = s;
            continue;
        }
        let m = resident_f64_to_f32(s.m);
        let v = resident_f64_to_f32(s.v);
        let d = x - m;
        let scored = v > 0.0;
        var zi = 0.0;
        if (scored) {
            zi = abs(d) / sqrt(v);
        }
        let prior = s.n;
        s.m = resident_f32_to_f64(m + STATELESS_ALPHA * d);
        s.v = resident_f32_to_f64((1.0 - STATELESS_ALPHA) * (v + STATELESS_ALPHA * d * d));
        s.n = resident_u64_add(prior, resident_u64(1u));
        stats[slot] = s;
        if (scored && zi > STATELESS_Z && !resident_u64_lt(prior, resident_u64(STATELESS_WARMUP))) {
            z[i] = resident_f32_to_f64(zi);
        }
    }
    status[0] = i;
}
