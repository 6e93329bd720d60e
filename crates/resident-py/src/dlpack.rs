//! DLPack, both ways: exporting memory the binding owns (a `UnifiedBuffer`'s host or device
//! copy, an imported array re-exported) as a DLPack capsule, and importing another library's
//! capsule without a copy.
//!
//! The C ABI is `dlpack.h` version 1: a capsule named `"dltensor"` holds a `DLManagedTensor`
//! (the legacy form, asked for by consumers that pass no `max_version`), one named
//! `"dltensor_versioned"` a `DLManagedTensorVersioned` (with a version and flags, asked for by
//! `max_version >= (1, 0)`). The rules both sides follow:
//!
//! - The producer's `deleter` releases what keeps the memory alive. Here that is one strong
//!   reference to the owner object (the engine buffer, or the import) plus the shape and
//!   strides the `DLTensor` points into; the deleter may run on any thread, with or without
//!   the GIL, so it attaches to the interpreter to drop the reference.
//! - A consumer takes the tensor by renaming the capsule `"used_dltensor"`
//!   (`"used_dltensor_versioned"`) and calls the deleter once when it is done. The capsule's
//!   destructor calls the deleter only while the capsule still has its unused name: a capsule
//!   never consumed frees the tensor, a consumed one leaves that to its consumer.
//! - A buffer counts its live exports (`live`): incremented when a capsule is made,
//!   decremented by the deleter, so the Python side can refuse to recycle memory an export
//!   still shows.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;

/// `kDLCPU`.
pub(crate) const DL_CPU: i32 = 1;
/// `kDLCUDA`.
pub(crate) const DL_CUDA: i32 = 2;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;
/// The DLPack version this module writes (and the major version it reads).
const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };
/// Dimensions accepted on import (numpy's own limit is 64).
const MAX_NDIM: i32 = 64;

const NAME_LEGACY: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";
const USED_LEGACY: &CStr = c"used_dltensor";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";

// ---- the C ABI of dlpack.h (v1.x), field for field -------------------------------------------

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    /// `DLDeviceType`, a C enum (an `int`).
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    /// In elements; null means C-contiguous.
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

// ---- export ----------------------------------------------------------------------------------

/// One tensor to export: where it is and how it is laid out.
pub(crate) struct Tensor {
    /// First element's address (host, or device on `DL_CUDA`).
    pub data: usize,
    /// `(DLDeviceType, device id)`.
    pub device: (i32, i32),
    /// `(code, bits, lanes)`.
    pub dtype: (u8, u8, u16),
    pub shape: Vec<i64>,
    /// In elements; None for C-contiguous.
    pub strides: Option<Vec<i64>>,
    pub read_only: bool,
}

/// What an exported tensor keeps alive until its deleter runs.
struct Keep {
    /// The `DLTensor`'s `shape` points into this (a boxed slice does not move with `Keep`).
    shape: Box<[i64]>,
    strides: Option<Box<[i64]>>,
    /// Owns the memory (an engine buffer, an import); None once released.
    owner: Option<Py<PyAny>>,
    /// The owner's count of live exports, decremented when this is dropped.
    live: Option<Arc<AtomicUsize>>,
}

impl Drop for Keep {
    fn drop(&mut self) {
        if let Some(l) = &self.live {
            l.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(o) = self.owner.take() {
            let mut o = Some(o);
            // The deleter may run without the GIL, on any thread: attach to drop the
            // reference. When the interpreter is gone (finalizing), leak it instead of
            // touching a dead interpreter.
            if Python::try_attach(|_py| drop(o.take())).is_none() {
                std::mem::forget(o);
            }
        }
    }
}

/// A legacy managed tensor and what it keeps: `managed` first, so a pointer to it is a
/// pointer to the whole (`repr(C)`).
#[repr(C)]
struct LegacyBox {
    managed: DLManagedTensor,
    keep: Keep,
}

/// A versioned managed tensor and what it keeps (`managed` first, as above).
#[repr(C)]
struct VersionedBox {
    managed: DLManagedTensorVersioned,
    keep: Keep,
}

/// The deleter of a legacy tensor made by [`export`].
unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` came from `Box::into_raw(Box<LegacyBox>)` in `export`, and `managed` is the
    // first field of the `repr(C)` `LegacyBox`, so the pointer is the box's own. DLPack calls
    // the deleter once (the capsule destructor only when nobody consumed the capsule, a
    // consumer once when done), so the box is reclaimed once.
    drop(unsafe { Box::from_raw(m.cast::<LegacyBox>()) });
}

/// The deleter of a versioned tensor made by [`export`].
unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // SAFETY: as in `delete_legacy`, for `VersionedBox`.
    drop(unsafe { Box::from_raw(m.cast::<VersionedBox>()) });
}

/// Destructor of a `"dltensor"` capsule: frees the tensor unless a consumer took it (renamed
/// the capsule).
unsafe extern "C" fn capsule_legacy(cap: *mut ffi::PyObject) {
    // SAFETY: CPython calls a capsule's destructor with the capsule being destroyed, the GIL
    // held. `PyCapsule_IsValid` sets no exception; it is true only while the capsule still has
    // its unused name, and then its pointer is the `DLManagedTensor` it was made with, whose
    // deleter has not run (a consumer would have renamed the capsule).
    unsafe {
        if ffi::PyCapsule_IsValid(cap, NAME_LEGACY.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(cap, NAME_LEGACY.as_ptr()).cast::<DLManagedTensor>();
            if let Some(d) = m.as_ref().and_then(|t| t.deleter) {
                d(m);
            }
        }
    }
}

/// Destructor of a `"dltensor_versioned"` capsule (as `capsule_legacy`).
unsafe extern "C" fn capsule_versioned(cap: *mut ffi::PyObject) {
    // SAFETY: as in `capsule_legacy`, for the versioned name and struct.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, NAME_VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(cap, NAME_VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if let Some(d) = m.as_ref().and_then(|t| t.deleter) {
                d(m);
            }
        }
    }
}

/// A DLPack capsule of `t`, keeping `owner` alive (and counted in `live`) until the consumer
/// is done. `versioned` makes a `"dltensor_versioned"` capsule (DLPack 1.0), else a legacy
/// `"dltensor"` one.
///
/// The caller vouches that `t` describes memory that `owner` keeps valid for as long as it
/// lives (the address and every element the shape and strides reach).
pub(crate) fn export(
    py: Python<'_>,
    t: Tensor,
    owner: Py<PyAny>,
    live: Option<Arc<AtomicUsize>>,
    versioned: bool,
) -> PyResult<Py<PyAny>> {
    if let Some(l) = &live {
        l.fetch_add(1, Ordering::AcqRel);
    }
    let mut keep = Keep {
        shape: t.shape.into_boxed_slice(),
        strides: t.strides.map(Vec::into_boxed_slice),
        owner: Some(owner),
        live,
    };
    let tensor = DLTensor {
        data: t.data as *mut c_void,
        device: DLDevice {
            device_type: t.device.0,
            device_id: t.device.1,
        },
        ndim: keep.shape.len() as i32,
        dtype: DLDataType {
            code: t.dtype.0,
            bits: t.dtype.1,
            lanes: t.dtype.2,
        },
        shape: keep.shape.as_mut_ptr(),
        strides: keep
            .strides
            .as_mut()
            .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
        byte_offset: 0,
    };
    let (ptr, name, destructor): (*mut c_void, &CStr, ffi::PyCapsule_Destructor) = if versioned {
        let b = Box::new(VersionedBox {
            managed: DLManagedTensorVersioned {
                version: VERSION,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: if t.read_only { FLAG_READ_ONLY } else { 0 },
                dl_tensor: tensor,
            },
            keep,
        });
        (
            Box::into_raw(b).cast(),
            NAME_VERSIONED,
            capsule_versioned as _,
        )
    } else {
        let b = Box::new(LegacyBox {
            managed: DLManagedTensor {
                dl_tensor: tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            keep,
        });
        (Box::into_raw(b).cast(), NAME_LEGACY, capsule_legacy as _)
    };
    // SAFETY: `ptr` is a live box whose first field is the managed tensor; `name` is a static
    // C string (the capsule keeps the pointer, not a copy); the destructor matches the name.
    let cap = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor)) };
    if cap.is_null() {
        // No capsule: nobody else has the box, reclaim it (which releases the owner).
        // SAFETY: `ptr` came from `Box::into_raw` above, of the type `versioned` says.
        unsafe {
            if versioned {
                delete_versioned(ptr.cast());
            } else {
                delete_legacy(ptr.cast());
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `PyCapsule_New` returned a new (owned) reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}

// ---- import ----------------------------------------------------------------------------------

fn dlpack_error(py: Python<'_>, class: &'static str, text: String) -> PyErr {
    crate::build(
        py,
        crate::Described {
            class,
            text,
            id: None,
            detail: None,
        },
        None,
    )
}

/// A tensor taken from another library's capsule, held until this object is dropped (then its
/// producer's deleter runs). `resident.from_dlpack` wraps it.
#[pyclass(frozen, name = "DLPackImport", module = "resident._resident")]
pub(crate) struct Import {
    /// The consumed `DLManagedTensor*` or `DLManagedTensorVersioned*` (as an address: the
    /// object is shared between threads; only `Drop` uses it).
    managed: usize,
    versioned: bool,
    /// `data + byte_offset`.
    data: usize,
    device: (i32, i32),
    dtype: (u8, u8, u16),
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    read_only: bool,
}

/// A `DLTensor`'s description, copied out of it.
struct TensorDesc {
    /// `data + byte_offset`.
    data: usize,
    device: (i32, i32),
    dtype: (u8, u8, u16),
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
}

/// Reads a `DLTensor` into owned values; refuses what cannot be described.
///
/// # Safety
/// `t` must point to a valid `DLTensor` whose `shape` (and `strides`, when not null) hold
/// `ndim` values.
unsafe fn read_tensor(py: Python<'_>, t: &DLTensor) -> PyResult<TensorDesc> {
    if !(0..=MAX_NDIM).contains(&t.ndim) {
        return Err(dlpack_error(
            py,
            "DLPackError",
            format!("a tensor of {} dimensions (at most {MAX_NDIM})", t.ndim),
        ));
    }
    let n = t.ndim as usize;
    if n > 0 && t.shape.is_null() {
        return Err(dlpack_error(
            py,
            "DLPackError",
            "a tensor with dimensions but no shape".into(),
        ));
    }
    let shape = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller vouches that `shape` holds `ndim` values (checked non-null above).
        unsafe { std::slice::from_raw_parts(t.shape, n) }.to_vec()
    };
    let strides = if t.strides.is_null() || n == 0 {
        None
    } else {
        // SAFETY: the caller vouches that a non-null `strides` holds `ndim` values.
        Some(unsafe { std::slice::from_raw_parts(t.strides, n) }.to_vec())
    };
    if shape.iter().any(|&s| s < 0) {
        return Err(dlpack_error(
            py,
            "DLPackError",
            format!("a tensor of negative shape {shape:?}"),
        ));
    }
    Ok(TensorDesc {
        data: (t.data as usize).wrapping_add(t.byte_offset as usize),
        device: (t.device.device_type, t.device.device_id),
        dtype: (t.dtype.code, t.dtype.bits, t.dtype.lanes),
        shape,
        strides,
    })
}

#[pymethods]
impl Import {
    /// Consumes `capsule` (renames it `used_dltensor[_versioned]`); the tensor is released
    /// when this object is dropped. A capsule that is not an unused DLPack capsule, or of a
    /// DLPack major version above 1, is refused and left as it is (its own destructor frees
    /// it).
    #[new]
    fn new(py: Python<'_>, capsule: &Bound<'_, PyAny>) -> PyResult<Self> {
        let cap = capsule.as_ptr();
        // SAFETY: `cap` is a live object (borrowed for this call, GIL held); `IsValid` checks
        // that it is a capsule of that name and sets no exception.
        let (versioned, legacy) = unsafe {
            (
                ffi::PyCapsule_IsValid(cap, NAME_VERSIONED.as_ptr()) == 1,
                ffi::PyCapsule_IsValid(cap, NAME_LEGACY.as_ptr()) == 1,
            )
        };
        let imp = if versioned {
            // SAFETY: the capsule is valid under this name; a producer puts a
            // `DLManagedTensorVersioned*` in it, which stays valid until its deleter runs (not
            // before we release it: nobody else consumed the capsule).
            let m = unsafe { ffi::PyCapsule_GetPointer(cap, NAME_VERSIONED.as_ptr()) }
                .cast::<DLManagedTensorVersioned>();
            // SAFETY: as above; `as_ref` checks for null.
            let Some(mt) = (unsafe { m.as_ref() }) else {
                return Err(dlpack_error(
                    py,
                    "DLPackError",
                    "an empty DLPack capsule".into(),
                ));
            };
            if mt.version.major != VERSION.major {
                return Err(dlpack_error(
                    py,
                    "DLPackError",
                    format!(
                        "DLPack version {}.{} (this reads {}.x)",
                        mt.version.major, mt.version.minor, VERSION.major
                    ),
                ));
            }
            // SAFETY: a valid versioned tensor's `dl_tensor` follows the DLPack contract.
            let d = unsafe { read_tensor(py, &mt.dl_tensor)? };
            Import {
                managed: m as usize,
                versioned: true,
                data: d.data,
                device: d.device,
                dtype: d.dtype,
                shape: d.shape,
                strides: d.strides,
                read_only: mt.flags & FLAG_READ_ONLY != 0,
            }
        } else if legacy {
            // SAFETY: as above, for a legacy `DLManagedTensor*`.
            let m = unsafe { ffi::PyCapsule_GetPointer(cap, NAME_LEGACY.as_ptr()) }
                .cast::<DLManagedTensor>();
            // SAFETY: as above.
            let Some(mt) = (unsafe { m.as_ref() }) else {
                return Err(dlpack_error(
                    py,
                    "DLPackError",
                    "an empty DLPack capsule".into(),
                ));
            };
            // SAFETY: as above.
            let d = unsafe { read_tensor(py, &mt.dl_tensor)? };
            Import {
                managed: m as usize,
                versioned: false,
                data: d.data,
                device: d.device,
                dtype: d.dtype,
                shape: d.shape,
                strides: d.strides,
                read_only: false,
            }
        } else {
            return Err(dlpack_error(
                py,
                "DLPackError",
                "not an unused DLPack capsule (named 'dltensor' or 'dltensor_versioned'): \
                 a capsule can be consumed once"
                    .into(),
            ));
        };
        let used = if versioned {
            USED_VERSIONED
        } else {
            USED_LEGACY
        };
        // SAFETY: renaming marks the capsule consumed: from here its destructor leaves the
        // tensor alone and `Drop` of `imp` calls the deleter, exactly once. A static name.
        if unsafe { ffi::PyCapsule_SetName(cap, used.as_ptr()) } != 0 {
            // Not renamed: the capsule still owns the tensor; do not release it twice.
            std::mem::forget(imp);
            return Err(PyErr::fetch(py));
        }
        Ok(imp)
    }

    /// Address of the first element (`data + byte_offset`).
    #[getter]
    fn data(&self) -> usize {
        self.data
    }

    /// `(DLDeviceType, device id)`.
    #[getter]
    fn device(&self) -> (i32, i32) {
        self.device
    }

    /// `(code, bits, lanes)`.
    #[getter]
    fn dtype(&self) -> (u8, u8, u16) {
        self.dtype
    }

    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }

    /// In elements; None when the producer gave none (C-contiguous).
    #[getter]
    fn strides(&self) -> Option<Vec<i64>> {
        self.strides.clone()
    }

    #[getter]
    fn read_only(&self) -> bool {
        self.read_only
    }

    #[getter]
    fn versioned(&self) -> bool {
        self.versioned
    }

    /// A new capsule of the same memory, keeping this import (so the producer) alive until its
    /// consumer is done.
    fn export(slf: &Bound<'_, Self>, versioned: bool) -> PyResult<Py<PyAny>> {
        let this = slf.get();
        let t = Tensor {
            data: this.data,
            device: this.device,
            dtype: this.dtype,
            shape: this.shape.clone(),
            strides: this.strides.clone(),
            read_only: this.read_only,
        };
        export(
            slf.py(),
            t,
            slf.clone().into_any().unbind(),
            None,
            versioned,
        )
    }
}

impl Drop for Import {
    fn drop(&mut self) {
        // SAFETY: `managed` is the tensor this import consumed (renamed its capsule), of the
        // kind `versioned` says; DLPack hands the consumer the one call of its deleter, made
        // here once. The producer's tensor stays valid until then.
        unsafe {
            if self.versioned {
                let m = self.managed as *mut DLManagedTensorVersioned;
                if let Some(d) = (*m).deleter {
                    d(m);
                }
            } else {
                let m = self.managed as *mut DLManagedTensor;
                if let Some(d) = (*m).deleter {
                    d(m);
                }
            }
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Import>()?;
    Ok(())
}
