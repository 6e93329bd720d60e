//! `resident.workloads`: the reference workloads of `resident-workloads` on any backend.

use numpy::{PyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use resident_workloads::input::EdgeList;
use resident_workloads::pagerank::{run_full, Params};

/// Full PageRank of the graph of `edges` (an (E, 2) uint64 array of (src, dst) over any ids)
/// with the workload's kernel on `backend`. Returns (node ids ascending, ranks, iterations,
/// last L1 change).
#[pyfunction]
#[pyo3(signature = (edges, damping, tol, max_iter, backend="cpu"))]
#[allow(clippy::type_complexity)]
fn pagerank<'py>(
    py: Python<'py>,
    edges: PyReadonlyArray2<'py, u64>,
    damping: f64,
    tol: f64,
    max_iter: u32,
    backend: &str,
) -> PyResult<(
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<f64>>,
    u32,
    f64,
)> {
    if edges.shape()[1] != 2 {
        return Err(PyValueError::new_err(
            "edges must be an (E, 2) array of (src, dst)",
        ));
    }
    if !(0.0..1.0).contains(&damping) || tol.is_nan() || tol <= 0.0 || max_iter == 0 {
        return Err(PyValueError::new_err(
            "damping must be in [0, 1), tol > 0 and max_iter >= 1",
        ));
    }
    let a = edges.as_array();
    let raw: Vec<(u64, u64)> = a.rows().into_iter().map(|r| (r[0], r[1])).collect();
    let g = EdgeList::from_pairs(raw);
    let b = crate::parse_backend(backend)?;
    let d = crate::buffer::device(py, backend)?;
    let p = Params {
        damping,
        tol,
        max_iter,
    };
    let r = py.detach(|| {
        let rt = resident::runtime::Runtime::builder()
            .backend(b)
            .build()
            .map_err(|e| e.to_string())?;
        let r = run_full(&rt, &d, &g, p).map_err(|e| e.to_string());
        rt.shutdown();
        r
    });
    let r = r.map_err(|e| {
        crate::build(
            py,
            crate::Described {
                class: "WorkloadError",
                text: e,
                id: None,
                detail: None,
            },
            None,
        )
    })?;
    Ok((
        PyArray1::from_vec(py, g.ids),
        PyArray1::from_vec(py, r.ranks),
        r.iterations,
        r.err,
    ))
}

/// The defaults of the Rust workload: (damping, tol, max_iter).
#[pyfunction]
fn pagerank_defaults() -> (f64, f64, u32) {
    let p = Params::default();
    (p.damping, p.tol, p.max_iter)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pagerank, m)?)?;
    m.add_function(wrap_pyfunction!(pagerank_defaults, m)?)?;
    Ok(())
}
