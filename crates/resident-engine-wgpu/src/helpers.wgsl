// ---- resident: 64-bit values as vec2<u32> (low word .x, high word .y) ----
// u64 / i64 / f64 fields and buffer elements are declared vec2<u32>: the same 8 bytes, low
// word first. Names starting with `resident_` are reserved for these helpers.

// A u64 from its low word (high word 0).
fn resident_u64(lo: u32) -> vec2<u32> { return vec2<u32>(lo, 0u); }
// An i64 from an i32 (sign-extended).
fn resident_i64(x: i32) -> vec2<u32> {
    return vec2<u32>(bitcast<u32>(x), select(0u, 0xffffffffu, x < 0));
}
// a + b, wrapping (u64 and i64 alike).
fn resident_u64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
// a - b, wrapping (u64 and i64 alike).
fn resident_u64_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}
// a < b as unsigned 64-bit integers.
fn resident_u64_lt(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y < b.y || (a.y == b.y && a.x < b.x);
}
// The f64 with sign bit `sign` (0 or 1), biased exponent `e` and significand `m`, whose leading
// one is bit `p` (p <= 31; that bit is the implicit one and is dropped).
fn resident_f64_pack(sign: u32, e: u32, m: u32, p: u32) -> vec2<u32> {
    let r = m ^ (1u << p);
    let sh = 52u - p; // 21 ..= 52
    var hi: u32;
    var lo: u32;
    if (sh >= 32u) {
        hi = r << (sh - 32u);
        lo = 0u;
    } else {
        hi = r >> (32u - sh);
        lo = r << sh;
    }
    return vec2<u32>(lo, (sign << 31u) | (e << 20u) | hi);
}
// An f32 as f64, exactly (zero, subnormals, infinities kept; a NaN stays a NaN, its payload
// shifted up as in Rust's `x as f64`).
fn resident_f32_to_f64(x: f32) -> vec2<u32> {
    let u = bitcast<u32>(x);
    let sign = u >> 31u;
    let e = (u >> 23u) & 0xffu;
    let m = u & 0x7fffffu;
    if (e == 0xffu) {
        return vec2<u32>(m << 29u, (sign << 31u) | 0x7ff00000u | (m >> 3u));
    }
    if (e == 0u) {
        if (m == 0u) {
            return vec2<u32>(0u, sign << 31u);
        }
        // A subnormal f32 is a normal f64: m * 2^-149 with its leading one at bit p.
        let p = firstLeadingBit(m);
        return resident_f64_pack(sign, p + 874u, m, p);
    }
    return resident_f64_pack(sign, e + 896u, m | 0x800000u, 23u);
}
// A u32 as f64, exactly.
fn resident_u32_to_f64(x: u32) -> vec2<u32> {
    if (x == 0u) {
        return vec2<u32>(0u, 0u);
    }
    let p = firstLeadingBit(x);
    return resident_f64_pack(0u, 1023u + p, x, p);
}
// An f64 as f32, rounded to nearest, ties to even (Rust's `x as f32`): values past the f32
// range become infinities, tiny values become f32 subnormals or (signed) zero, f64 subnormals
// become zero (exactly what rounding gives), infinities stay, NaN stays NaN (quiet).
fn resident_f64_to_f32(b: vec2<u32>) -> f32 {
    let sign = b.y & 0x80000000u;
    let e = (b.y >> 20u) & 0x7ffu;
    let mh = b.y & 0xfffffu;
    if (e == 0x7ffu) {
        if ((mh | b.x) != 0u) {
            return bitcast<f32>(sign | 0x7fc00000u | (mh << 3u) | (b.x >> 29u));
        }
        return bitcast<f32>(sign | 0x7f800000u);
    }
    if (e >= 1151u) { // 1023 + 128: at least 2^128, past f32::MAX even before rounding
        return bitcast<f32>(sign | 0x7f800000u);
    }
    if (e < 872u) { // below 2^-151: under half the smallest f32 subnormal (f64 subnormals too)
        return bitcast<f32>(sign);
    }
    // The 53-bit significand (hi: 21 bits, lo: 32 bits), shifted right by `s` to its f32
    // place: 29 for a normal result, more for a subnormal one (s <= 54 here).
    let hi = mh | 0x100000u;
    let lo = b.x;
    var s = 29u;
    var base = 0u;
    if (e > 896u) {
        base = (e - 897u) << 23u; // biased f32 exponent minus one: the leading one adds it back
    } else {
        s = 926u - e; // 30 ..= 54
    }
    var q: u32;
    if (s >= 32u) {
        q = hi >> (s - 32u);
    } else {
        q = (hi << (32u - s)) | (lo >> s);
    }
    // Round half to even: the first bit shifted out (guard) and whether any below it is set.
    let g = s - 1u;
    var guard: u32;
    var sticky: bool;
    if (g >= 32u) {
        guard = (hi >> (g - 32u)) & 1u;
        sticky = lo != 0u || (hi & ((1u << (g - 32u)) - 1u)) != 0u;
    } else {
        guard = (lo >> g) & 1u;
        sticky = (lo & ((1u << g) - 1u)) != 0u;
    }
    let up = select(0u, 1u, guard == 1u && (sticky || (q & 1u) == 1u));
    // A carry out of the significand moves into the exponent (up to infinity), as it should.
    return bitcast<f32>(sign | (base + q + up));
}
