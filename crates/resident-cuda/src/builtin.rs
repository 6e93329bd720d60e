//! CUDA C sources this crate ships for one-shot work. Every entry of [`ALL`] is compiled by the
//! `nvrtc_compiles_shipped_sources` test for several architectures.

/// A shipped CUDA C source.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    /// Program name (for logs and cache keys).
    pub name: &'static str,
    /// The CUDA C text.
    pub code: &'static str,
    /// The `extern "C"` kernels it defines.
    pub entries: &'static [&'static str],
}

/// Element-wise kernels over `float` and `unsigned int` arrays.
pub const ELEMENTWISE: Source = Source {
    name: "resident_elementwise",
    code: r#"
extern "C" __global__ void resident_fill_u32(unsigned int* out, unsigned int value, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}

extern "C" __global__ void resident_iota_u32(unsigned int* out, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (unsigned int)i;
}

extern "C" __global__ void resident_saxpy(float a, const float* x, float* y, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#,
    entries: &["resident_fill_u32", "resident_iota_u32", "resident_saxpy"],
};

/// A kernel that keeps the GPU busy for a given number of clock cycles while touching a
/// buffer, used to prove that copies overlap compute.
pub const SPIN: Source = Source {
    name: "resident_spin",
    code: r#"
extern "C" __global__ void resident_spin(unsigned int* data, unsigned long long n, long long cycles) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long start = clock64();
    while (clock64() - start < cycles) { }
    if (i < n) data[i] += 1u;
}
"#,
    entries: &["resident_spin"],
};

/// Every shipped source.
pub const ALL: &[Source] = &[ELEMENTWISE, SPIN];
