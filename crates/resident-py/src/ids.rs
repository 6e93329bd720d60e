//! Fresh message ids (`resident.message`'s `message_id`): version-4 `uuid.UUID`s, 122 random
//! bits each as `uuid.uuid4()` gives, made by one call into the extension instead of a Python
//! function (a frame, a `getrandbits` call, `object.__new__` and two `object.__setattr__`:
//! about 1 us on the shared VM, more than the rest of a small message's construction).
//!
//! The bits come from xoshiro256++ seeded with 32 bytes of `os.urandom` (`seed_ids`, called
//! by `resident.message` at import and again in a forked child, so parent and child never
//! draw the same ids). An id must be unique, not secret: this generator's 256-bit state gives
//! ids as unique as `uuid4()`'s, for the cost of a few arithmetic operations.

use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};

/// xoshiro256++ (Blackman and Vigna): 256 bits of state, 64 bits per step.
struct Xoshiro([u64; 4]);

impl Xoshiro {
    fn next(&mut self) -> u64 {
        let s = &mut self.0;
        let out = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }
}

/// The generator; `None` until `seed_ids` ran (ids are refused before: never a fixed seed).
static RNG: Mutex<Option<Xoshiro>> = Mutex::new(None);

/// What making a UUID needs, looked up once.
struct UuidParts {
    class: Py<PyType>,
    unknown: Py<PyAny>,
    int: Py<PyString>,
    is_safe: Py<PyString>,
}

static PARTS: PyOnceLock<UuidParts> = PyOnceLock::new();

fn parts(py: Python<'_>) -> PyResult<&UuidParts> {
    PARTS.get_or_try_init(py, || {
        let uuid = py.import("uuid")?;
        Ok::<_, PyErr>(UuidParts {
            class: uuid.getattr("UUID")?.cast_into::<PyType>()?.unbind(),
            unknown: uuid.getattr("SafeUUID")?.getattr("unknown")?.unbind(),
            int: PyString::intern(py, "int").unbind(),
            is_safe: PyString::intern(py, "is_safe").unbind(),
        })
    })
}

/// The version and variant bits of a version-4 UUID, as `uuid.UUID(version=4)` sets them.
const CLEAR: u128 = !((0xC000u128 << 48) | (0xF000u128 << 64));
const SET: u128 = (0x8000u128 << 48) | (4u128 << 76);

/// Seeds the id generator with `seed` (32 bytes, from `os.urandom`).
#[pyfunction]
fn seed_ids(seed: &[u8]) -> PyResult<()> {
    let Ok(bytes) = <[u8; 32]>::try_from(seed) else {
        return Err(PyValueError::new_err(format!(
            "seed_ids takes 32 bytes, got {}",
            seed.len()
        )));
    };
    let mut s = [0u64; 4];
    for (w, c) in s.iter_mut().zip(bytes.chunks_exact(8)) {
        *w = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
    }
    if s == [0; 4] {
        // The one state xoshiro never leaves.
        s[0] = 1;
    }
    *RNG.lock() = Some(Xoshiro(s));
    Ok(())
}

/// A fresh message id: a random (version 4) `uuid.UUID`, as `uuid.uuid4()` makes.
#[pyfunction]
fn new_id(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let bits = {
        let mut g = RNG.lock();
        let Some(rng) = g.as_mut() else {
            return Err(PyValueError::new_err(
                "message ids are not seeded (resident.message seeds them at import)",
            ));
        };
        ((rng.next() as u128) << 64) | rng.next() as u128
    };
    let p = parts(py)?;
    let value = ((bits & CLEAR) | SET).into_pyobject(py)?;
    // SAFETY: `class` is the type object `uuid.UUID` (a heap type, kept alive by `PARTS`);
    // `PyType_GenericAlloc` is its `tp_alloc` (what `object.__new__(uuid.UUID)` calls): it
    // returns a new, zeroed, GC-tracked instance or NULL with an exception set.
    let raw = unsafe { ffi::PyType_GenericAlloc(p.class.as_ptr().cast(), 0) };
    if raw.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `raw` is a new reference we own.
    let obj = unsafe { Bound::from_owned_ptr(py, raw) };
    for (name, v) in [(&p.int, value.as_ptr()), (&p.is_safe, p.unknown.as_ptr())] {
        // SAFETY: all three are live objects; `PyObject_GenericSetAttr` is
        // `object.__setattr__` (`uuid.UUID.__setattr__` refuses every assignment, its own
        // constructor uses this too): it stores into the `__slots__` member named `name`,
        // taking its own reference to `v`, and returns -1 with an exception set on failure.
        if unsafe { ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), v) } != 0 {
            return Err(PyErr::fetch(py));
        }
    }
    Ok(obj)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(seed_ids, m)?)?;
    m.add_function(wrap_pyfunction!(new_id, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generator's first outputs for the reference seed {1, 2, 3, 4} (xoshiro256++).
    #[test]
    fn xoshiro256pp_matches_its_reference_sequence() {
        let mut x = Xoshiro([1, 2, 3, 4]);
        let first: Vec<u64> = (0..3).map(|_| x.next()).collect();
        assert_eq!(first, [41943041, 58720359, 3588806011781223]);
    }

    #[test]
    fn version_and_variant_bits() {
        let v = CLEAR | SET;
        assert_eq!((v >> 76) & 0xF, 4, "version");
        assert_eq!((v >> 62) & 0x3, 0b10, "variant RFC 4122");
        let v = SET;
        assert_eq!((v >> 76) & 0xF, 4);
        assert_eq!((v >> 62) & 0x3, 0b10);
    }
}
