//! Device kernels from Python: message and state layouts given as numpy structured dtypes,
//! declared to CUDA C and WGSL by the engine's own generator
//! (`resident::ring::message::StructLayout`, the one `device_message!` emits through), and the
//! handler source compiled by the engine at launch (g++ for CudaSim, NVRTC for CUDA, naga for
//! wgpu).
//!
//! The Python half (`resident/device.py`) turns a dtype into a field list
//! `(name, scalar code, dims, offset)`; everything about layouts is decided here.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use resident::backend::wgpu::ring::WgslLaunchError;
use resident::backend::DeviceError;
use resident::cuda::persistent::{ExternalFn, PersistentError};
use resident::prelude::{CudaHandler, WgslHandler};
use resident::ring::message::{FieldLayout, LayoutError, Scalar, StructLayout};

/// A field as the Python half describes it: name, numpy scalar code (`u4`, `f8`, ...),
/// array extents, byte offset.
pub(crate) type FieldTuple = (String, String, Vec<usize>, usize);

fn scalar(code: &str) -> Option<Scalar> {
    Scalar::from_numpy_code(code)
}

/// The Python exception for a layout that cannot be declared: `DtypeLayoutError` (a
/// `TypeError` and an `InvalidConfigError`), naming the field.
pub(crate) fn layout_error(py: Python<'_>, e: &LayoutError) -> PyErr {
    crate::build(
        py,
        crate::Described {
            class: "DtypeLayoutError",
            text: e.to_string(),
            id: None,
            detail: e.field.clone(),
        },
        None,
    )
}

/// The engine's layout of `fields`, `size` bytes in all.
pub(crate) fn layout(
    py: Python<'_>,
    name: &str,
    origin: &str,
    fields: Vec<FieldTuple>,
    size: usize,
) -> PyResult<StructLayout> {
    let mut out = Vec::with_capacity(fields.len());
    for (fname, code, dims, offset) in fields {
        let Some(s) = scalar(&code) else {
            return Err(layout_error(
                py,
                &LayoutError {
                    layout: name.to_string(),
                    field: Some(fname),
                    reason: format!(
                        "numpy type `{code}` has no device type: use float32, float64, int8-int64 \
                         or uint8-uint64 (little-endian)"
                    ),
                },
            ));
        };
        out.push(FieldLayout {
            name: fname,
            scalar: s,
            dims,
            offset,
        });
    }
    StructLayout::new(name, origin, out, size).map_err(|e| layout_error(py, &e))
}

/// The Python exception for a bound-buffer error.
pub(crate) fn bind_error(
    py: Python<'_>,
    kernel_id: &str,
    e: &resident::prelude::BindError,
) -> PyErr {
    use resident::prelude::BindError as B;
    let class = match e {
        B::Busy { .. } => "KernelTimeoutError",
        B::Device { .. } => "DeviceError",
        B::Memory { .. } => "BufferStateError",
        _ => "InvalidConfigError",
    };
    crate::build(
        py,
        crate::Described {
            class,
            text: e.to_string(),
            id: Some(kernel_id.to_string()),
            detail: None,
        },
        None,
    )
}

/// A `numba=` handler's compiled forms, as Python passes them: its C name, its LTO-IR for a
/// GPU architecture (`("sm_90", bytes)`) and the address of its native form for CudaSim (a
/// Numba `cfunc` the Python spec keeps alive for the kernel's life).
pub(crate) type ExternalArgs = (String, Option<(String, Vec<u8>)>, Option<usize>);

/// One CUDA or WGSL handler: its source and function name.
#[derive(Clone)]
pub(crate) struct Source {
    pub text: String,
    pub function: String,
    /// A `numba=` handler's compiled function, which `text` calls.
    pub external: Option<ExternalFn>,
}

/// A device kernel's layouts and handler sources, checked when it is declared.
#[pyclass(frozen, module = "resident._resident")]
pub(crate) struct DeviceSpec {
    pub input: StructLayout,
    pub output: StructLayout,
    /// The state's layout and initial bytes.
    pub state: Option<(StructLayout, Vec<u8>)>,
    pub cuda: Option<Source>,
    pub wgsl: Option<Source>,
    pub wgsl_in_order: bool,
    pub workgroup_size: u32,
    /// Bound buffers a WGSL handler updates with atomics.
    pub atomic_buffers: Vec<String>,
}

#[pymethods]
impl DeviceSpec {
    /// Checks the layouts (every record padded to `record` bytes) and, when a WGSL source is
    /// given, that WGSL can hold them byte for byte; raises `DtypeLayoutError` otherwise.
    #[new]
    #[pyo3(signature = (record, in_fields, out_fields, state_fields, state_size, state_init, cuda, wgsl, function, wgsl_in_order, workgroup_size, origins, atomic_buffers=Vec::new(), buffer_types=Vec::new(), external=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        record: usize,
        in_fields: Vec<FieldTuple>,
        out_fields: Vec<FieldTuple>,
        state_fields: Option<Vec<FieldTuple>>,
        state_size: usize,
        state_init: Option<Vec<u8>>,
        cuda: Option<String>,
        wgsl: Option<String>,
        function: String,
        wgsl_in_order: bool,
        workgroup_size: u32,
        origins: (String, String, String),
        atomic_buffers: Vec<String>,
        buffer_types: Vec<(String, String)>,
        external: Option<ExternalArgs>,
    ) -> PyResult<Self> {
        if cuda.is_none() && wgsl.is_none() {
            return Err(PyValueError::new_err(
                "a device kernel needs a `cuda` or a `wgsl` source (or both)",
            ));
        }
        let input = layout(py, "InRecord", &origins.0, in_fields, record)?;
        let output = layout(py, "OutRecord", &origins.1, out_fields, record)?;
        let state = match (state_fields, state_init) {
            (Some(f), Some(init)) => {
                let l = layout(py, "StateRecord", &origins.2, f, state_size)?;
                if init.len() != l.size() {
                    return Err(PyValueError::new_err(format!(
                        "the initial state has {} bytes, its dtype {}",
                        init.len(),
                        l.size()
                    )));
                }
                Some((l, init))
            }
            (None, None) => None,
            _ => {
                return Err(PyValueError::new_err(
                    "a state needs both its dtype and its initial value",
                ))
            }
        };
        let spec = DeviceSpec {
            input,
            output,
            state,
            cuda: cuda.map(|text| Source {
                text,
                function: function.clone(),
                external: external.map(|(symbol, ltoir, host_fn)| ExternalFn {
                    symbol,
                    ltoir,
                    host_fn,
                }),
            }),
            wgsl: wgsl.map(|text| Source {
                text,
                function: function.clone(),
                external: None,
            }),
            wgsl_in_order,
            workgroup_size,
            atomic_buffers,
        };
        if spec.wgsl.is_some() {
            // WGSL's refusals (8- and 16-bit fields, padding that is not whole words) now,
            // not at launch.
            spec.check_wgsl().map_err(|e| layout_error(py, &e))?;
            // Bound buffers' elements too (the engine would refuse them at launch).
            for (name, code) in &buffer_types {
                if let Some(Err(e)) = scalar(code).map(|s| s.wgsl(false)) {
                    return Err(layout_error(
                        py,
                        &LayoutError {
                            layout: format!("buffer {name}"),
                            field: None,
                            reason: e.to_string(),
                        },
                    ));
                }
            }
        }
        Ok(spec)
    }

    /// The CUDA handler's `numba=` function linked into the persistent kernel's machine code
    /// for `sm` (e.g. `"sm_90"`) with NVRTC and nvJitLink, without a GPU: the CUBIN a device of
    /// that architecture would load. Raises `CompilationError` when it does not link,
    /// `NumbaNotAvailableError` without nvJitLink.
    fn link_cubin<'py>(
        &self,
        py: Python<'py>,
        kernel_id: &str,
        sm: &str,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let size = self.input.size();
        macro_rules! sized {
            ($($n:literal),*) => {
                match size {
                    $($n => self.cuda_handler::<[u8; $n], [u8; $n]>().map(|h| {
                        h.map(|h| py.detach(|| h.link_cubin(kernel_id, 256, sm)))
                    }),)*
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "no ring of {other}-byte records"
                        )))
                    }
                }
            };
        }
        match sized!(8, 16, 32, 64, 128, 256) {
            Err(e) => Err(layout_error(py, &e)),
            Ok(None) => Err(PyValueError::new_err("this kernel has no CUDA handler")),
            Ok(Some(Ok(cubin))) => Ok(pyo3::types::PyBytes::new(py, &cubin)),
            Ok(Some(Err(e))) => {
                let class = match e.engine::<PersistentError>() {
                    Some(
                        PersistentError::JitLinkUnavailable(_)
                        | PersistentError::NvrtcUnavailable(_),
                    ) => "NumbaNotAvailableError",
                    _ if is_compile_error(&e) => "CompilationError",
                    _ => "DeviceError",
                };
                Err(crate::build(
                    py,
                    crate::Described {
                        class,
                        text: e.to_string(),
                        id: Some(kernel_id.to_string()),
                        detail: None,
                    },
                    None,
                ))
            }
        }
    }

    /// The generated declarations the handler is compiled with: `"c"` (CUDA C, CudaSim) or
    /// `"wgsl"`.
    fn declarations(&self, py: Python<'_>, lang: &str) -> PyResult<String> {
        match lang {
            "c" | "cuda" => {
                let mut s = self.input.c_declaration();
                s.push_str(&self.output.c_declaration());
                if let Some((l, _)) = &self.state {
                    s.push_str(&l.c_declaration());
                }
                s.push_str(&format!(
                    "typedef {} ResidentIn;\ntypedef {} ResidentOut;\n",
                    self.input.name(),
                    self.output.name()
                ));
                if let Some((l, _)) = &self.state {
                    s.push_str(&format!("typedef {} ResidentState;\n", l.name()));
                }
                Ok(s)
            }
            "wgsl" => {
                let w = |l: &StructLayout, name: &str, atomic: bool| {
                    l.wgsl_struct(name, atomic).map_err(|e| {
                        layout_error(
                            py,
                            &LayoutError {
                                layout: l.name().to_string(),
                                field: None,
                                reason: e.to_string(),
                            },
                        )
                    })
                };
                let mut s = w(&self.input, self.input.name(), false)?;
                s.push_str(&w(&self.output, self.output.name(), false)?);
                if let Some((l, _)) = &self.state {
                    s.push_str(&w(l, "ResidentState", true)?);
                }
                s.push_str(&format!(
                    "alias ResidentIn = {};\nalias ResidentOut = {};\n",
                    self.input.name(),
                    self.output.name()
                ));
                Ok(s)
            }
            other => Err(PyValueError::new_err(format!(
                "unknown language '{other}': expected 'c' or 'wgsl'"
            ))),
        }
    }
}

impl DeviceSpec {
    /// The CUDA handler for records of `In`/`Out` (`[u8; N]`), if a CUDA source was given.
    pub(crate) fn cuda_handler<In: resident::ring::Message, Out: resident::ring::Message>(
        &self,
    ) -> Result<Option<CudaHandler<In, Out>>, LayoutError> {
        let Some(src) = &self.cuda else {
            return Ok(None);
        };
        let mut h =
            CudaHandler::<In, Out>::with_layouts(src.text.clone(), &self.input, &self.output)?
                .function(src.function.clone());
        if let Some(f) = &src.external {
            h = h.external(f.clone());
        }
        if let Some((l, init)) = &self.state {
            h = h.state_layout(l, init.clone())?;
        }
        Ok(Some(h))
    }

    /// Whether WGSL can hold every layout byte for byte (8- and 16-bit fields cannot).
    fn check_wgsl(&self) -> Result<(), LayoutError> {
        let decl = |l: &StructLayout, name: &str, atomic: bool| {
            l.wgsl_struct(name, atomic)
                .map(drop)
                .map_err(|e| LayoutError {
                    layout: l.name().to_string(),
                    field: None,
                    reason: e.to_string(),
                })
        };
        decl(&self.input, self.input.name(), false)?;
        decl(&self.output, self.output.name(), false)?;
        if let Some((l, _)) = &self.state {
            decl(l, "ResidentState", true)?;
        }
        Ok(())
    }

    /// The WGSL handler for records of `In`/`Out` (`[u8; N]`), if a WGSL source was given.
    pub(crate) fn wgsl_handler<In: resident::ring::Message, Out: resident::ring::Message>(
        &self,
    ) -> Result<Option<WgslHandler<In, Out>>, LayoutError> {
        let Some(src) = &self.wgsl else {
            return Ok(None);
        };
        let mut h =
            WgslHandler::<In, Out>::with_layouts(src.text.clone(), &self.input, &self.output)?
                .function(src.function.clone())
                .workgroup_size(self.workgroup_size);
        if self.wgsl_in_order {
            h = h.in_order();
        }
        for name in &self.atomic_buffers {
            h = h.atomic(name.clone());
        }
        if let Some((l, init)) = &self.state {
            h = h.state_layout(l, init.clone())?;
        }
        Ok(Some(h))
    }
}

/// Whether a device error is a handler that did not compile (NVRTC, the host compiler of
/// CudaSim, naga's WGSL front end and validator, or a source refused before any compiler ran
/// for asking for a file of the host): its text then carries the compiler's log or the reason.
pub(crate) fn is_compile_error(e: &DeviceError) -> bool {
    use resident::cuda::{sim::SimError, CudaError};
    matches!(
        e.engine::<PersistentError>(),
        Some(
            PersistentError::Compile { .. }
                | PersistentError::Link { .. }
                | PersistentError::Include { .. }
                | PersistentError::Sim(
                    SimError::Compile { .. }
                        | SimError::CompileTimeout { .. }
                        | SimError::CompileOutOfMemory { .. }
                        | SimError::CompileCrashed { .. }
                        | SimError::ForbiddenAssembly { .. }
                )
                | PersistentError::Cuda(
                    CudaError::Compile { .. }
                        | CudaError::CompileTimeout { .. }
                        | CudaError::CompileOutOfMemory { .. }
                        | CudaError::CompileCrashed { .. }
                        | CudaError::JitLinkStopped { .. }
                )
        )
    ) || matches!(
        e,
        DeviceError::Wgsl(WgslLaunchError::Compile(_) | WgslLaunchError::Stopped(_))
    )
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DeviceSpec>()?;
    Ok(())
}
