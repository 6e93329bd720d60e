//! Vector add as an actor over bound buffers: `a`, `b` and `c` (f32) are bound to the kernel;
//! a message names a range (`offset`, `len`) and the kernel computes `c = a + b` over it.
//! A range past the buffers is answered with `ok = 0` (the host turns it into
//! [`WorkloadError::OutOfRange`]), never a panic.
//!
//! Tolerance against the f64 reference: `|c - (a + b)| <= f32::EPSILON * |a + b|` per element
//! (an f32 addition is correctly rounded, so the true error is at most half that).

use std::time::{Duration, Instant};

use resident::backend::DeviceHandle;
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::UnifiedBuffer;

use crate::error::WorkloadError;
use crate::rng::SplitMix64;

resident::ring::device_message! {
    /// Add `c[offset .. offset + len] = a[..] + b[..]`.
    pub struct AddRange {
        /// First element.
        pub offset: u64,
        /// Elements.
        pub len: u64,
    }
}

resident::ring::device_message! {
    /// Done with a range (`ok == 0`: the range was outside the buffers).
    pub struct RangeDone {
        /// First element.
        pub offset: u64,
        /// Elements.
        pub len: u64,
        /// 0 when the range was outside the buffers.
        pub ok: u32,
        /// Padding (zero).
        pub _pad: u32,
    }
}

/// The vector-add actor over `a`, `b` (inputs) and `c` (output), bound by name.
pub fn kernel(
    id: &str,
    a: UnifiedBuffer<f32>,
    b: UnifiedBuffer<f32>,
    c: UnifiedBuffer<f32>,
) -> RingKernel<AddRange, RangeDone> {
    RingKernel::<AddRange, RangeDone>::new(id)
        .queue_size(1024)
        .bind("a", a)
        .bind("b", b)
        .bind("c", c)
        .cuda(vector_add_handler())
        .wgsl(WgslHandler::new(VECTOR_ADD_WGSL).function("vector_add"))
        .handler(|ctx: &mut Context<()>, m: AddRange| {
            let done = |ok: bool| RangeDone {
                offset: m.offset,
                len: m.len,
                ok: ok as u32,
                _pad: 0,
            };
            let (Ok(a), Ok(b), Ok(mut c)) = (
                ctx.buffer::<f32>("a"),
                ctx.buffer::<f32>("b"),
                ctx.buffer_mut::<f32>("c"),
            ) else {
                return Some(done(false));
            };
            let start = m.offset as usize;
            let Some(end) = start
                .checked_add(m.len as usize)
                .filter(|&e| e <= a.len().min(b.len()).min(c.len()))
            else {
                return Some(done(false));
            };
            for ((c, a), b) in c[start..end]
                .iter_mut()
                .zip(&a[start..end])
                .zip(&b[start..end])
            {
                *c = a + b;
            }
            Some(done(true))
        })
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// Elements.
    pub n: usize,
    /// Whole run (send -> every range answered).
    pub elapsed: Duration,
    /// The result, read back through the bound buffer.
    pub c: Vec<f32>,
}

/// The deterministic inputs for `n` elements.
pub fn inputs(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut r = SplitMix64::new(seed);
    let a = (0..n)
        .map(|_| (r.unit() * 2000.0 - 1000.0) as f32)
        .collect();
    let b = (0..n)
        .map(|_| (r.unit() * 2000.0 - 1000.0) as f32)
        .collect();
    (a, b)
}

/// Runs vector add on `n` elements in ranges of `chunk`.
pub fn run(
    rt: &Runtime,
    device: &DeviceHandle,
    a: &[f32],
    b: &[f32],
    chunk: usize,
) -> Result<Report, WorkloadError> {
    let n = a.len().min(b.len());
    let o = BufferOptions::default();
    let k = rt.launch(
        kernel(
            &format!("vector-add-{}", unique()),
            UnifiedBuffer::from_slice(device, &a[..n], o)?,
            UnifiedBuffer::from_slice(device, &b[..n], o)?,
            UnifiedBuffer::new(device, n, o)?,
        )
        .batch_size(crate::batch_size(device.kind(), 256)),
    )?;
    k.activate()?;
    let t = Instant::now();
    let chunk = chunk.max(1);
    let ranges: Vec<AddRange> = (0..n)
        .step_by(chunk)
        .map(|s| AddRange {
            offset: s as u64,
            len: chunk.min(n - s) as u64,
        })
        .collect();
    let result = (|| {
        let mut sent = 0;
        while sent < ranges.len() {
            sent += k.send_batch(&ranges[sent..])?;
        }
        for _ in 0..ranges.len() {
            let d = k.receive(Duration::from_secs(60))?;
            if d.ok == 0 {
                return Err(WorkloadError::OutOfRange {
                    workload: "vector-add",
                    detail: format!("range {}+{} outside {n} elements", d.offset, d.len),
                });
            }
        }
        let elapsed = t.elapsed();
        let c = if n == 0 {
            Vec::new()
        } else {
            k.read_buffer::<f32>("c", Duration::from_secs(60))?.to_vec()
        };
        Ok(Report { n, elapsed, c })
    })();
    k.terminate()?;
    result
}

/// Checks `c` against `a + b` computed in f64 (tolerance in the module docs).
pub fn check(a: &[f32], b: &[f32], c: &[f32]) -> Result<(), WorkloadError> {
    if c.len() != a.len().min(b.len()) {
        return Err(WorkloadError::Mismatch {
            workload: "vector-add",
            detail: format!("{} results for {} inputs", c.len(), a.len()),
        });
    }
    for (i, ((&x, &y), &z)) in a.iter().zip(b).zip(c).enumerate() {
        let want = x as f64 + y as f64;
        if ((z as f64) - want).abs() > f32::EPSILON as f64 * want.abs() {
            return Err(WorkloadError::Mismatch {
                workload: "vector-add",
                detail: format!("c[{i}] = {z}, reference {want}"),
            });
        }
    }
    Ok(())
}

fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Vector add (`vector_add`).
pub const VECTOR_ADD_CU: &str = include_str!("vector_add.cu");
/// Its handler function.
pub const VECTOR_ADD_FN: &str = "vector_add";
/// Its WGSL form: function `vector_add` (one message per invocation).
pub const VECTOR_ADD_WGSL: &str = include_str!("vector_add.wgsl");

/// The vector-add handler, buffers `a`, `b`, `c` (f32) declared.
pub fn vector_add_handler() -> CudaHandler<AddRange, RangeDone> {
    CudaHandler::new(VECTOR_ADD_CU)
        .function(VECTOR_ADD_FN)
        .buffer::<f32>("a")
        .buffer::<f32>("b")
        .buffer::<f32>("c")
}
