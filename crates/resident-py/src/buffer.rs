//! `UnifiedBuffer` for Python: the engine's `UnifiedBuffer<u8>` (host and device copies with
//! the engine's state machine), its host copy shown to numpy without copying.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use numpy::ndarray::ArrayView1;
use numpy::PyArray1;
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use resident::backend::{open, BackendKind, DeviceHandle};
use resident::memory::BufferOptions;
use resident::{BufferState, MemoryError, UnifiedBuffer};

/// One device per backend name, opened on first use.
pub(crate) fn device(py: Python<'_>, backend: &str) -> PyResult<DeviceHandle> {
    static DEVICES: OnceLock<Mutex<HashMap<String, DeviceHandle>>> = OnceLock::new();
    let b = crate::parse_backend(backend)?;
    let key = backend.to_ascii_lowercase();
    let map = DEVICES.get_or_init(Default::default);
    if let Some(d) = map.lock().get(&key) {
        return Ok(d.clone());
    }
    let d = py.detach(|| open(b)).map_err(|e| {
        crate::build(
            py,
            crate::Described {
                class: "BackendNotAvailableError",
                text: format!("backend '{backend}': {e}"),
                id: None,
                detail: None,
            },
            None,
        )
    })?;
    map.lock().insert(key, d.clone());
    Ok(d)
}

fn memory_error(py: Python<'_>, e: MemoryError) -> PyErr {
    let class = match e {
        MemoryError::Uninitialized { .. } | MemoryError::NothingToSync { .. } => "BufferStateError",
        MemoryError::AllocFailed { .. } | MemoryError::TooLarge { .. } => "OutOfMemoryError",
        _ => "DeviceError",
    };
    crate::build(
        py,
        crate::Described {
            class,
            text: e.to_string(),
            id: None,
            detail: None,
        },
        None,
    )
}

fn state_name(s: BufferState) -> &'static str {
    match s {
        BufferState::Uninitialized => "uninitialized",
        BufferState::HostOnly => "host_only",
        BufferState::DeviceOnly => "device_only",
        BufferState::Synchronized => "synchronized",
        BufferState::HostDirty => "host_dirty",
        BufferState::DeviceDirty => "device_dirty",
    }
}

/// `nbytes` bytes on host and device (`resident.UnifiedBuffer` gives them a shape and dtype).
#[pyclass(frozen, name = "Buffer", module = "resident._resident")]
pub(crate) struct PyBuffer {
    buf: Mutex<UnifiedBuffer<u8>>,
    nbytes: usize,
    backend: String,
    dev: DeviceHandle,
    /// DLPack exports of this buffer whose consumer is not done yet.
    live: Arc<AtomicUsize>,
}

#[pymethods]
impl PyBuffer {
    #[new]
    #[pyo3(signature = (nbytes, pinned=false, backend="auto"))]
    fn new(py: Python<'_>, nbytes: usize, pinned: bool, backend: &str) -> PyResult<Self> {
        let d = device(py, backend)?;
        let opts = if pinned {
            BufferOptions::pinned()
        } else {
            BufferOptions::default()
        };
        let buf = UnifiedBuffer::<u8>::new(&d, nbytes, opts).map_err(|e| memory_error(py, e))?;
        Ok(PyBuffer {
            buf: Mutex::new(buf),
            nbytes,
            backend: d.kind().to_string(),
            dev: d,
            live: Arc::default(),
        })
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The device kind the buffer lives on (`cpu`, `cuda`, `wgpu`, `cuda-sim`).
    #[getter]
    fn backend(&self) -> &str {
        &self.backend
    }

    #[getter]
    fn state(&self) -> &'static str {
        state_name(self.buf.lock().state())
    }

    #[getter]
    fn pinned(&self) -> bool {
        self.buf.lock().is_pinned()
    }

    /// (to_device copies, to_host copies, bytes to device, bytes to host).
    #[getter]
    fn transfers(&self) -> (u64, u64, u64, u64) {
        let t = self.buf.lock().transfers();
        (t.to_device, t.to_host, t.to_device_bytes, t.to_host_bytes)
    }

    /// The host copy as a writable uint8 numpy array over the buffer's own memory (no copy);
    /// copied back from the device first when the device copy is newer, and marked newer
    /// than the device copy (it is handed out for writing).
    fn host_view<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let py = slf.py();
        let this = slf.get();
        let (ptr, len) = {
            let mut b = this.buf.lock();
            let s = py
                .detach(|| b.host_mut().map(|s| (s.as_mut_ptr() as usize, s.len())))
                .map_err(|e| memory_error(py, e))?;
            s
        };
        // SAFETY: the host copy is allocated once and lives as long as the buffer, which the
        // array keeps alive as its base object.
        let view = unsafe { ArrayView1::from_shape_ptr(len, ptr as *const u8) };
        let arr = unsafe { PyArray1::borrow_from_array(&view, slf.clone().into_any()) };
        Ok(arr)
    }

    /// Makes the device copy current (copies when the host copy is newer); returns the
    /// device address (host memory on the CPU backend).
    fn device_address(&self, py: Python<'_>) -> PyResult<u64> {
        let mut b = self.buf.lock();
        py.detach(|| b.device().map(|v| v.address()))
            .map_err(|e| memory_error(py, e))
    }

    /// Marks the device copy newer (a device kernel wrote it).
    fn mark_device_dirty(&self, py: Python<'_>) -> PyResult<()> {
        let mut b = self.buf.lock();
        py.detach(|| b.device_mut().map(|_| ()))
            .map_err(|e| memory_error(py, e))
    }

    /// Marks the host copy newer (it was written through a view or export taken earlier);
    /// copies the device copy back first when that one is newer.
    fn mark_host_dirty(&self, py: Python<'_>) -> PyResult<()> {
        let mut b = self.buf.lock();
        py.detach(|| b.host_mut().map(|_| ()))
            .map_err(|e| memory_error(py, e))
    }

    /// The device's ordinal within its backend (the CUDA device id).
    #[getter]
    fn ordinal(&self) -> usize {
        self.dev.info().ordinal
    }

    /// DLPack exports of this buffer still held by a consumer.
    #[getter]
    fn exports(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// A DLPack capsule of the first bytes of the host copy (`device=False`: copied back first
    /// when the device copy is newer, then marked newer) or of the device copy (`device=True`:
    /// copied over first when the host copy is newer, then marked newer; CPU and CUDA only),
    /// as a C-contiguous tensor of `shape` and DLPack `dtype` `(code, bits, lanes)`.
    /// `versioned`: a DLPack 1.0 `dltensor_versioned` capsule, else a legacy `dltensor`. The
    /// capsule keeps this buffer alive and is counted in `exports` until its consumer is done.
    #[pyo3(signature = (shape, dtype, device=false, versioned=false))]
    fn dlpack(
        slf: &Bound<'_, Self>,
        shape: Vec<i64>,
        dtype: (u8, u8, u16),
        device: bool,
        versioned: bool,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = slf.get();
        // The tensor must lie inside the buffer: consumers read and write all of it.
        let bytes = shape
            .iter()
            .try_fold(1u64, |acc, &s| {
                u64::try_from(s).ok().and_then(|s| acc.checked_mul(s))
            })
            .and_then(|n| n.checked_mul(u64::from(dtype.1).div_ceil(8) * u64::from(dtype.2)));
        match bytes {
            Some(b) if b <= this.nbytes as u64 => {}
            _ => {
                return Err(PyValueError::new_err(format!(
                    "a tensor of shape {shape:?} and {} bits x {} lanes does not fit the buffer's \
                     {} bytes",
                    dtype.1, dtype.2, this.nbytes
                )))
            }
        }
        let (data, dev) = if device {
            let kind = this.dev.kind();
            let dl = match kind {
                BackendKind::Cpu => (crate::dlpack::DL_CPU, 0),
                BackendKind::Cuda => (
                    crate::dlpack::DL_CUDA,
                    i32::try_from(this.dev.info().ordinal).unwrap_or(i32::MAX),
                ),
                other => {
                    return Err(crate::build(
                        py,
                        crate::Described {
                            class: "DLPackError",
                            text: format!(
                                "the device copy of a buffer on '{other}' is not addressable by \
                                 other libraries (DLPack exports the device side on cpu and cuda)"
                            ),
                            id: None,
                            detail: None,
                        },
                        None,
                    ))
                }
            };
            let mut b = this.buf.lock();
            let a = py
                .detach(|| b.device_mut().map(|v| v.address()))
                .map_err(|e| memory_error(py, e))?;
            (a as usize, dl)
        } else {
            let mut b = this.buf.lock();
            let a = py
                .detach(|| b.host_mut().map(|s| s.as_mut_ptr() as usize))
                .map_err(|e| memory_error(py, e))?;
            (a, (crate::dlpack::DL_CPU, 0))
        };
        let t = crate::dlpack::Tensor {
            data,
            device: dev,
            dtype,
            shape,
            strides: None,
            read_only: false,
        };
        // The host and device copies are allocated once and live as long as the engine
        // buffer, which the capsule keeps alive through this object.
        crate::dlpack::export(
            py,
            t,
            slf.clone().into_any().unbind(),
            Some(this.live.clone()),
            versioned,
        )
    }

    fn sync_to_device(&self, py: Python<'_>) -> PyResult<()> {
        let mut b = self.buf.lock();
        py.detach(|| b.sync_to_device())
            .map_err(|e| memory_error(py, e))
    }

    fn sync_to_host(&self, py: Python<'_>) -> PyResult<()> {
        let mut b = self.buf.lock();
        py.detach(|| b.sync_to_host())
            .map_err(|e| memory_error(py, e))
    }
}

/// The engine pool's size class of a request of `nbytes` (a power of two, at least 256).
#[pyfunction]
fn size_class(nbytes: usize) -> PyResult<usize> {
    resident::memory::size_class(nbytes)
        .ok_or_else(|| PyValueError::new_err(format!("{nbytes} bytes overflow a size class")))
}

/// The device `backend` opens: `(kind, ordinal)` (`kind` as `Buffer.backend` names it).
#[pyfunction]
fn device_of(py: Python<'_>, backend: &str) -> PyResult<(String, usize)> {
    let d = device(py, backend)?;
    Ok((d.kind().to_string(), d.info().ordinal))
}

/// Every backend this build knows, probed now (`resident::backend::probe`): one dict each,
/// `name`, `available`, `reason` (why not, or None), `nvrtc` (CUDA only, else None) and
/// `devices` (a dict of each device's properties).
#[pyfunction]
fn probe_backends(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    let reports = py.detach(resident::backend::probe);
    let mut out = Vec::with_capacity(reports.len());
    for r in reports {
        let d = PyDict::new(py);
        d.set_item("name", backend_name(r.backend))?;
        d.set_item("available", r.unavailable.is_none())?;
        d.set_item("reason", r.unavailable)?;
        d.set_item("nvrtc", r.nvrtc)?;
        let mut devices = Vec::with_capacity(r.devices.len());
        for i in r.devices {
            let dev = PyDict::new(py);
            dev.set_item("backend", backend_name(i.backend))?;
            dev.set_item("ordinal", i.ordinal)?;
            dev.set_item("name", i.name)?;
            dev.set_item("compute_units", i.compute_units)?;
            dev.set_item("total_memory", i.total_memory)?;
            dev.set_item("max_threads_per_block", i.max_threads_per_block)?;
            dev.set_item("compute_capability", i.compute_capability)?;
            dev.set_item("shared_memory_per_block", i.shared_memory_per_block)?;
            dev.set_item("shared_memory_per_sm", i.shared_memory_per_sm)?;
            dev.set_item("can_map_host_memory", i.can_map_host_memory)?;
            dev.set_item("driver_version", i.driver_version)?;
            devices.push(dev);
        }
        d.set_item("devices", devices)?;
        out.push(d);
    }
    Ok(out)
}

/// A backend as `Runtime(backend=...)` names it.
fn backend_name(b: BackendKind) -> &'static str {
    match b {
        BackendKind::Cpu => "cpu",
        BackendKind::Cuda => "cuda",
        BackendKind::Wgpu => "wgpu",
        BackendKind::CudaSim => "cudasim",
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(probe_backends, m)?)?;
    m.add_class::<PyBuffer>()?;
    m.add_function(wrap_pyfunction!(size_class, m)?)?;
    m.add_function(wrap_pyfunction!(device_of, m)?)?;
    Ok(())
}
