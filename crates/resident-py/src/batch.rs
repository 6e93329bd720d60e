//! Batch kernels: fixed-size records (a numpy dtype) moved as whole arrays, handled by a
//! vectorized Python function per drained batch, so no Python object exists per message.
//!
//! The engine's message type is a compile-time `Pod`; a record of a numpy dtype is known only
//! at run time. The binding therefore monomorphizes the engine for byte blobs `[u8; N]` of a
//! few sizes (8 to 256 bytes, powers of two) and pads each record to the smallest that holds
//! it: six instantiations keep compile time and code size bounded, padding costs at most 2x
//! the bytes of a record, and every engine feature (lanes, backpressure, accounting, reports)
//! applies unchanged because the kernel *is* an engine kernel of `[u8; N]`.

use std::sync::Arc;
use std::time::Duration;

use numpy::{PyArray1, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::UnifiedBuffer;

/// Record sizes the engine is instantiated for.
pub(crate) const SIZES: [usize; 6] = [8, 16, 32, 64, 128, 256];

/// A terminate report of a batch kernel, its records as bytes.
pub(crate) struct BytesReport {
    pub processed: u64,
    pub dropped: u64,
    pub undelivered: Vec<u8>,
    pub unreceived: Vec<u8>,
    pub failure: Option<String>,
}

/// What the runtime does with a kernel of any record size.
pub(crate) trait BatchKernel: Send + Sync {
    fn record(&self) -> usize;
    fn ops(&self) -> &dyn crate::KernelOps;
    /// How many more records the input queue takes now (see `KernelHandle::input_room`).
    fn input_room(&self) -> usize;
    /// Sends whole records from `bytes` (a multiple of `record()`); returns how many were
    /// taken, or the error when none was.
    fn send_bytes(&self, bytes: &[u8]) -> resident::Result<usize>;
    /// Up to `max` outputs, waiting up to `wait` for the first.
    fn recv_bytes(&self, max: usize, wait: Duration) -> resident::Result<Vec<u8>>;
    fn terminate(&self, timeout: Option<Duration>) -> resident::Result<BytesReport>;
    fn report_of(&self, r: KernelReport) -> Option<BytesReport>;
    /// Where the handler runs: `host`, or the device (`cuda`, `cudasim`, `wgpu`).
    fn placement(&self) -> String;
    /// The device state's bytes (`size`, one of [`STATE_SIZES`]), read back by the engine.
    fn snapshot_state(&self, size: usize) -> resident::Result<Vec<u8>>;
    /// The bound buffer `name` (elements of numpy scalar `code`) as bytes, synchronized with
    /// the kernel (between two batches).
    fn read_buffer(&self, name: &str, code: &str, timeout: Duration) -> Result<Vec<u8>, BindError>;
    /// Replaces the bound buffer `name`'s values (exactly its bytes); the next batch sees them.
    fn write_buffer(
        &self,
        name: &str,
        code: &str,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<(), BindError>;
}

/// Runs `$body` with `$t` the Rust scalar of numpy code `$code`, or returns `$none`.
macro_rules! with_scalar {
    ($code:expr, $t:ident => $body:expr, $none:expr) => {
        match $code {
            "f4" => {
                type $t = f32;
                $body
            }
            "f8" => {
                type $t = f64;
                $body
            }
            "i1" => {
                type $t = i8;
                $body
            }
            "i2" => {
                type $t = i16;
                $body
            }
            "i4" => {
                type $t = i32;
                $body
            }
            "i8" => {
                type $t = i64;
                $body
            }
            "u1" => {
                type $t = u8;
                $body
            }
            "u2" => {
                type $t = u16;
                $body
            }
            "u4" => {
                type $t = u32;
                $body
            }
            "u8" => {
                type $t = u64;
                $body
            }
            _ => $none,
        }
    };
}

fn bad_code(name: &str, code: &str) -> BindError {
    BindError::UnknownBuffer {
        kernel: String::new(),
        name: format!("{name} (element type `{code}` is not a device scalar)"),
    }
}

/// Sizes a device kernel's state is padded to, so the engine's typed `snapshot_state` can
/// read it back as `[u8; S]`.
pub(crate) const STATE_SIZES: [usize; 11] = [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096];

fn flat<const N: usize>(v: impl IntoIterator<Item = [u8; N]>) -> Vec<u8> {
    v.into_iter().flatten().collect()
}

fn bytes_report<const N: usize>(r: TerminateReport<[u8; N], [u8; N]>) -> BytesReport {
    let mut undelivered = Vec::new();
    if let Some((_, Some((_, m)))) = &r.failure {
        undelivered.extend_from_slice(m);
    }
    undelivered.extend(flat(r.undelivered.iter().map(|(_, m)| *m)));
    BytesReport {
        processed: r.processed,
        dropped: r.dropped,
        unreceived: flat(r.unreceived.iter().map(|(_, m)| *m)),
        undelivered,
        failure: r.failure.map(|(reason, _)| reason.to_string()),
    }
}

impl<const N: usize> BatchKernel for KernelHandle<[u8; N], [u8; N]> {
    fn record(&self) -> usize {
        N
    }

    fn ops(&self) -> &dyn crate::KernelOps {
        self
    }

    fn input_room(&self) -> usize {
        KernelHandle::input_room(self)
    }

    fn send_bytes(&self, bytes: &[u8]) -> resident::Result<usize> {
        let recs: Vec<[u8; N]> = bytes
            .chunks_exact(N)
            .map(|c| c.try_into().expect("chunks of N bytes"))
            .collect();
        self.send_batch(&recs)
    }

    fn recv_bytes(&self, max: usize, wait: Duration) -> resident::Result<Vec<u8>> {
        let mut out: Vec<[u8; N]> = Vec::with_capacity(max.min(65536));
        if max == 0 {
            return Ok(Vec::new());
        }
        self.receive_batch(&mut out, max)?;
        if out.is_empty() && !wait.is_zero() {
            match self.receive(wait) {
                Ok(first) => {
                    out.push(first);
                    self.receive_batch(&mut out, max - 1)?;
                }
                Err(Error::Timeout { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(flat(out))
    }

    fn terminate(&self, timeout: Option<Duration>) -> resident::Result<BytesReport> {
        let r = match timeout {
            Some(t) => self.terminate_within(t)?,
            None => KernelHandle::terminate(self)?,
        };
        Ok(bytes_report(r))
    }

    fn report_of(&self, r: KernelReport) -> Option<BytesReport> {
        r.into_typed::<[u8; N], [u8; N]>().ok().map(bytes_report)
    }

    fn read_buffer(&self, name: &str, code: &str, timeout: Duration) -> Result<Vec<u8>, BindError> {
        with_scalar!(code, T => {
            let g = KernelHandle::read_buffer::<T>(self, name, timeout)?;
            Ok(bytemuck::cast_slice::<T, u8>(&g).to_vec())
        }, Err(bad_code(name, code)))
    }

    fn write_buffer(
        &self,
        name: &str,
        code: &str,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<(), BindError> {
        with_scalar!(code, T => {
            let mut g = KernelHandle::write_buffer::<T>(self, name, timeout)?;
            let dst = bytemuck::cast_slice_mut::<T, u8>(&mut g);
            if dst.len() != bytes.len() {
                return Err(BindError::UnknownBuffer {
                    kernel: self.id().to_string(),
                    name: format!("{name} ({} bytes given, it holds {})", bytes.len(), dst.len()),
                });
            }
            dst.copy_from_slice(bytes);
            g.commit()
        }, Err(bad_code(name, code)))
    }

    fn snapshot_state(&self, size: usize) -> resident::Result<Vec<u8>> {
        macro_rules! sized {
            ($($s:literal),*) => {
                match size {
                    $($s => self.snapshot_state::<[u8; $s]>().map(|a| a.to_vec()),)*
                    other => Err(Error::InvalidConfig {
                        id: self.id().to_string(),
                        reason: format!("a state of {other} bytes: expected one of {STATE_SIZES:?}"),
                    }),
                }
            };
        }
        sized!(4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    }

    fn placement(&self) -> String {
        match KernelHandle::placement(self) {
            Placement::Host => "host".into(),
            Placement::Device(kind) => format!("{kind:?}").to_ascii_lowercase(),
        }
    }
}

/// The loop of a batch kernel: drain up to `max_batch` records, hand them to Python as one
/// uint8 array, send what the function returns.
fn body<const N: usize>(
    runner: Py<PyAny>,
    func: Py<PyAny>,
    state: Py<PyAny>,
    max_batch: usize,
    bell: Arc<crate::waker::Bell>,
) -> impl FnOnce(&mut LoopContext<[u8; N], [u8; N], ()>) + Send + 'static {
    move |lctx| {
        let mut failure: Option<PyErr> = None;
        while !lctx.should_terminate() {
            if !lctx.is_active() {
                lctx.wait_active();
                continue;
            }
            let batch = lctx.receive_batch(max_batch, Duration::from_millis(10));
            if batch.is_empty() {
                continue;
            }
            let n = batch.len();
            // A Python exception (raised by the handler, or made here for output that is not
            // whole records) fails the kernel with its text and traceback.
            let out: PyResult<Vec<u8>> = Python::attach(|py| {
                let arr = PyArray1::from_vec(py, flat(batch));
                let r = runner.call1(py, (func.clone_ref(py), state.clone_ref(py), arr, n))?;
                let r = r.bind(py);
                let out = r.extract::<PyReadonlyArray1<u8>>()?;
                if out.len() % N != 0 {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "handler output of {} bytes is not whole records",
                        out.len()
                    )));
                }
                Ok(out.as_slice()?.to_vec())
            });
            match out {
                Ok(bytes) => {
                    lctx.send_all(
                        bytes
                            .chunks_exact(N)
                            .map(|c| <[u8; N]>::try_from(c).expect("chunks of N bytes")),
                    );
                    bell.ring();
                }
                Err(reason) => {
                    failure = Some(reason);
                    break;
                }
            }
        }
        bell.ring();
        if let Some(e) = failure {
            let reason = Python::attach(|py| crate::py_failure(py, e));
            std::panic::resume_unwind(Box::new(format!("Python handler raised: {reason}")));
        }
    }
}

/// Why a batch kernel did not launch.
pub(crate) enum LaunchError {
    /// The engine refused it.
    Engine(Error),
    /// A device layout does not fit the records.
    Layout(resident::ring::message::LayoutError),
    /// A buffer to bind could not be made.
    Buffer(String),
}

/// Binds a buffer of numpy scalar `code` holding `bytes` (its initial values) as `name`.
fn bind<In: resident::ring::Message, Out: resident::ring::Message>(
    k: RingKernel<In, Out>,
    dev: &resident::backend::DeviceHandle,
    name: &str,
    code: &str,
    bytes: &[u8],
) -> Result<RingKernel<In, Out>, LaunchError> {
    with_scalar!(code, T => {
        let size = std::mem::size_of::<T>();
        if !bytes.len().is_multiple_of(size) {
            return Err(LaunchError::Buffer(format!(
                "buffer '{name}': {} bytes are not whole `{code}` elements",
                bytes.len()
            )));
        }
        let mut b = UnifiedBuffer::<T>::new(dev, bytes.len() / size, BufferOptions::default())
            .map_err(|e| LaunchError::Buffer(format!("buffer '{name}': {e}")))?;
        b.host_mut()
            .map(|h| bytemuck::cast_slice_mut::<T, u8>(h).copy_from_slice(bytes))
            .map_err(|e| LaunchError::Buffer(format!("buffer '{name}': {e}")))?;
        Ok(k.bind(name.to_string(), b))
    }, Err(LaunchError::Buffer(format!("buffer '{name}': `{code}` is not a device scalar type"))))
}

/// Launches a batch kernel of records of `record` bytes (one of [`SIZES`]). With `device`,
/// the kernel also has the CUDA and/or WGSL handler it declares: the runtime runs that on
/// its device (CUDA or CudaSim for CUDA C, wgpu for WGSL) and the vectorized Python
/// function elsewhere.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    rt: &resident::runtime::Runtime,
    id: String,
    record: usize,
    queue_size: usize,
    policy: Backpressure,
    lanes: usize,
    runner: Py<PyAny>,
    func: Py<PyAny>,
    state: Py<PyAny>,
    max_batch: usize,
    device: Option<&crate::device::DeviceSpec>,
    buffers: Vec<(String, String, Vec<u8>)>,
    bell: Arc<crate::waker::Bell>,
) -> Result<Arc<dyn BatchKernel>, LaunchError> {
    // Buffers are bound where the handler runs on the device; the CPU form gets numpy arrays
    // of its own (a loop-form kernel has no engine bindings on the host).
    let on_device = device.is_some_and(|d| match rt.backend() {
        Backend::Cuda | Backend::CudaSim => d.cuda.is_some(),
        Backend::Wgpu => d.wgsl.is_some(),
        _ => false,
    });
    let dev = if on_device && !buffers.is_empty() {
        Some(rt.device().map_err(LaunchError::Engine)?)
    } else {
        None
    };
    macro_rules! sized {
        ($($n:literal),*) => {
            match record {
                $($n => {
                    let mut k = RingKernel::<[u8; $n], [u8; $n]>::new(id)
                        .queue_size(queue_size)
                        .priority_lanes(lanes)
                        .backpressure(policy)
                        .batch_size(max_batch);
                    // Inputs taken (by this loop, or by the pump feeding a device handler):
                    // room for a sender waiting on a full lane. Rings only while one waits: a
                    // ring per batch would wake every coroutine waiting for outputs for nothing.
                    let take_bell = bell.clone();
                    k = k.on_take(move || take_bell.ring_room());
                    if let Some(d) = device {
                        if let Some(h) = d.cuda_handler().map_err(LaunchError::Layout)? {
                            k = k.cuda(h);
                        }
                        if let Some(h) = d.wgsl_handler().map_err(LaunchError::Layout)? {
                            k = k.wgsl(h);
                        }
                    }
                    if let Some(dev) = &dev {
                        for (name, code, bytes) in &buffers {
                            k = bind(k, dev, name, code, bytes)?;
                        }
                    }
                    let k = k.run(body::<$n>(runner, func, state, max_batch, bell));
                    Ok(Arc::new(rt.launch(k).map_err(LaunchError::Engine)?) as Arc<dyn BatchKernel>)
                })*
                other => Err(LaunchError::Engine(Error::InvalidConfig {
                    id,
                    reason: format!("record of {other} bytes: expected one of {SIZES:?}"),
                })),
            }
        };
    }
    sized!(8, 16, 32, 64, 128, 256)
}
