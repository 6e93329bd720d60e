//! `UnifiedBuffer` for Python: the engine's `UnifiedBuffer<u8>` (host and device copies with
//! the engine's state machine), its host copy shown to numpy without copying.

use std::collections::HashMap;
use std::sync::OnceLock;

use numpy::ndarray::ArrayView1;
use numpy::PyArray1;
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use resident::backend::{open, DeviceHandle};
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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBuffer>()?;
    m.add_function(wrap_pyfunction!(size_class, m)?)?;
    Ok(())
}
