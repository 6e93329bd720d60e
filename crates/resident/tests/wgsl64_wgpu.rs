//! The WGSL helpers for 64-bit values (`resident::backend::wgpu::wgsl::HELPERS_64`), run on the
//! wgpu backend (lavapipe in CI) and compared bit for bit with Rust's own conversions over edge
//! cases and about 200k generated values. Without an adapter each test prints `SKIP:` and
//! returns, unless `RESIDENT_REQUIRE_WGPU=1`, then it fails.

use resident::backend::{Kernel, KernelArg, LaunchConfig};
use resident::memory::{BufferOptions, UnifiedBuffer};

mod common;
use common::wgpu_device;

/// SplitMix64: deterministic test values.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

const FLOATS: &str = r#"
@group(0) @binding(0) var<storage, read> d: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> to32: array<u32>;
@group(0) @binding(2) var<storage, read> f: array<u32>;
@group(0) @binding(3) var<storage, read_write> to64: array<vec2<u32>>;
@group(0) @binding(4) var<uniform> n: vec2<u32>;

@compute @workgroup_size(64)
fn convert(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < n.x) {
        to32[i] = bitcast<u32>(resident_f64_to_f32(d[i]));
        to64[i] = resident_f32_to_f64(bitcast<f32>(f[i]));
    }
}
"#;

const INTS: &str = r#"
@group(0) @binding(0) var<storage, read> a: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read> b: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec2<u32>>;
@group(0) @binding(3) var<uniform> n: vec2<u32>;

@compute @workgroup_size(64)
fn ints(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < n.x) {
        let x = a[i];
        let y = b[i];
        out[6u * i] = resident_u64_add(x, y);
        out[6u * i + 1u] = resident_u64_sub(x, y);
        out[6u * i + 2u] = resident_u64(select(0u, 1u, resident_u64_lt(x, y)));
        out[6u * i + 3u] = resident_u64(x.x);
        out[6u * i + 4u] = resident_i64(bitcast<i32>(x.x));
        out[6u * i + 5u] = resident_u32_to_f64(x.x);
    }
}
"#;

fn f64_cases(rng: &mut Rng) -> Vec<f64> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.1,
        1.0 / 3.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        f64::MAX,
        f64::MIN,
        f64::MIN_POSITIVE,
        5e-324,
        -5e-324,
        f32::MAX as f64,
        -(f32::MAX as f64),
        f32::MIN_POSITIVE as f64,
        1.0e-45,
        1.4e-45,
        f32::MIN_POSITIVE as f64 / 2.0,
        2f64.powi(-150),
        2f64.powi(-150) * (1.0 + f64::EPSILON),
        -(2f64.powi(-150) * (1.0 + f64::EPSILON)),
        2f64.powi(-151),
        2f64.powi(-149) * 1.5,
        2f64.powi(-149) * 2.5,
        2f64.powi(128),
        2f64.powi(127) * 1.999_999_9,
        // Just below, at and just above the rounding point to infinity.
        f32::MAX as f64 + 2f64.powi(103) - 2f64.powi(60),
        f32::MAX as f64 + 2f64.powi(103),
        f32::MAX as f64 + 2f64.powi(103) + 2f64.powi(80),
        16_777_217.0,
        16_777_219.0,
        1e300,
        -1e-300,
    ];
    for _ in 0..60_000 {
        // Any bit pattern: every exponent, NaNs with payloads, subnormals.
        v.push(f64::from_bits(rng.next()));
    }
    for _ in 0..60_000 {
        // Inside and around the f32 range, subnormals included.
        let e = (rng.next() % 320) as i32 - 170;
        let m = 1.0 + (rng.next() >> 12) as f64 / (1u64 << 52) as f64;
        let s = if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
        v.push(s * m * 2f64.powi(e));
    }
    for _ in 0..40_000 {
        // Exact ties between two neighbouring f32 (normal or subnormal): ties go to even.
        let lo = f32::from_bits((rng.next() as u32) & 0x7f7f_fffe);
        let hi = f32::from_bits(lo.to_bits() + 1);
        v.push((lo as f64 + hi as f64) / 2.0);
    }
    v
}

fn f32_cases(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::from_bits(0x007f_ffff),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    while v.len() < n {
        v.push(f32::from_bits(rng.next() as u32));
    }
    v
}

#[test]
fn f64_f32_conversions_match_rust_bit_for_bit() {
    let Some(d) = wgpu_device("f64_f32_conversions_match_rust_bit_for_bit") else {
        return;
    };
    let mut rng = Rng(11);
    let doubles = f64_cases(&mut rng);
    let n = doubles.len();
    let floats = f32_cases(&mut rng, n);
    let o = BufferOptions::default();
    let mut db = UnifiedBuffer::from_slice(&d, &doubles, o).unwrap();
    let mut to32 = UnifiedBuffer::<u32>::new(&d, n, o).unwrap();
    let fbits: Vec<u32> = floats.iter().map(|f| f.to_bits()).collect();
    let mut fb = UnifiedBuffer::from_slice(&d, &fbits, o).unwrap();
    let mut to64 = UnifiedBuffer::<u64>::new(&d, n, o).unwrap();
    {
        let (dv, fv) = (db.device().unwrap(), fb.device().unwrap());
        let (mut t32, mut t64) = (to32.device_mut().unwrap(), to64.device_mut().unwrap());
        let args = [
            dv.arg(),
            t32.arg(),
            fv.arg(),
            t64.arg(),
            KernelArg::scalar(n as u64),
        ];
        let k = Kernel::new("convert").wgsl(FLOATS, "convert");
        d.launch(&k, LaunchConfig::for_elements(n as u64), &args, None)
            .unwrap();
    }
    let got32 = to32.host().unwrap().to_vec();
    let mut checked = [0usize; 5]; // zero, subnormal, normal, inf, nan results
    for (x, &g) in doubles.iter().zip(&got32) {
        let want = *x as f32;
        let got = f32::from_bits(g);
        if want.is_nan() {
            assert!(got.is_nan(), "{x:e} ({:#x}): got {got:e}", x.to_bits());
            checked[4] += 1;
            continue;
        }
        assert_eq!(
            g,
            want.to_bits(),
            "{x:e} ({:#018x}) as f32: got {got:e} ({g:#x}), want {want:e} ({:#x})",
            x.to_bits(),
            want.to_bits()
        );
        checked[match want.classify() {
            std::num::FpCategory::Zero => 0,
            std::num::FpCategory::Subnormal => 1,
            std::num::FpCategory::Normal => 2,
            _ => 3,
        }] += 1;
    }
    // Every class of result was really exercised.
    assert!(checked[..4].iter().all(|&c| c > 100), "{checked:?}");
    assert!(checked[4] > 10, "{checked:?}");
    let got64 = to64.host().unwrap().to_vec();
    for (x, &g) in floats.iter().zip(&got64) {
        let want = *x as f64;
        if want.is_nan() {
            assert!(f64::from_bits(g).is_nan(), "{x:e}: got {g:#x}");
            continue;
        }
        assert_eq!(
            g,
            want.to_bits(),
            "{x:e} ({:#x}) as f64: got {:e}",
            x.to_bits(),
            f64::from_bits(g)
        );
    }
}

#[test]
fn u64_helpers_match_rust() {
    let Some(d) = wgpu_device("u64_helpers_match_rust") else {
        return;
    };
    let mut rng = Rng(5);
    let mut a = vec![0u64, u64::MAX, 1 << 32, (1 << 32) - 1, 7, u64::MAX];
    let mut b = vec![0u64, 1, 1, 1 << 32, 7, u64::MAX];
    while a.len() < 20_000 {
        let (x, y) = (rng.next(), rng.next());
        // Equal high words, equal low words and small values too.
        match a.len() % 4 {
            0 => {
                a.push(x);
                b.push(y);
            }
            1 => {
                a.push(x);
                b.push((x & !0xffff_ffff) | (y & 0xffff_ffff));
            }
            2 => {
                a.push(x);
                b.push((y & !0xffff_ffff) | (x & 0xffff_ffff));
            }
            _ => {
                a.push(x & 0xffff_ffff);
                b.push(y >> 40);
            }
        }
    }
    let n = a.len();
    let o = BufferOptions::default();
    let mut ab = UnifiedBuffer::from_slice(&d, &a, o).unwrap();
    let mut bb = UnifiedBuffer::from_slice(&d, &b, o).unwrap();
    let mut out = UnifiedBuffer::<u64>::new(&d, 6 * n, o).unwrap();
    {
        let (av, bv) = (ab.device().unwrap(), bb.device().unwrap());
        let mut ov = out.device_mut().unwrap();
        let args = [av.arg(), bv.arg(), ov.arg(), KernelArg::scalar(n as u64)];
        let k = Kernel::new("ints").wgsl(INTS, "ints");
        d.launch(&k, LaunchConfig::for_elements(n as u64), &args, None)
            .unwrap();
    }
    let got = out.host().unwrap().to_vec();
    for i in 0..n {
        let (x, y) = (a[i], b[i]);
        let lo = x as u32;
        let want = [
            x.wrapping_add(y),
            x.wrapping_sub(y),
            (x < y) as u64,
            lo as u64,
            lo as i32 as i64 as u64,
            (lo as f64).to_bits(),
        ];
        assert_eq!(&got[6 * i..6 * i + 6], &want, "a = {x:#x}, b = {y:#x}");
    }
}
