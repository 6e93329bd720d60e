//! `resident.workloads`: the reference workloads of `resident-workloads` on any backend.

use std::collections::HashMap;

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use resident::runtime::Runtime;
use resident_workloads::anomaly as detector;
use resident_workloads::input::{EdgeList, SensorReading};
use resident_workloads::pagerank::{
    run_full, EdgeUpdate, Params, StreamPageRank, OP_ADD, OP_REMOVE,
};
use resident_workloads::WorkloadError;

/// A workload's error as its Python class: an engine error keeps its own class (timeouts are
/// `KernelTimeoutError`s, a refused key `ResidentError`, ...), a backend that cannot be opened
/// is `BackendNotAvailableError`, a workload timeout `KernelTimeoutError`, and the rest
/// (mismatch against the reference, refused edge changes, bad input) `WorkloadError`.
fn workload_error(py: Python<'_>, e: Failed) -> PyErr {
    let (class, text) = match e {
        Failed::Workload(WorkloadError::Runtime(e)) => return crate::engine_error(py, &e),
        Failed::Workload(e @ WorkloadError::Backend(_)) | Failed::Backend(e) => {
            ("BackendNotAvailableError", e.to_string())
        }
        Failed::Workload(e @ WorkloadError::Timeout { .. }) => {
            ("KernelTimeoutError", e.to_string())
        }
        Failed::Workload(e) => ("WorkloadError", e.to_string()),
    };
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

/// Why a workload run failed, before it becomes a Python exception (outside the GIL).
enum Failed {
    /// The runtime of the backend could not be built.
    Backend(WorkloadError),
    /// The run failed.
    Workload(WorkloadError),
}

impl From<WorkloadError> for Failed {
    fn from(e: WorkloadError) -> Self {
        Failed::Workload(e)
    }
}

fn runtime(b: resident::prelude::Backend) -> Result<Runtime, Failed> {
    Runtime::builder()
        .backend(b)
        .build()
        .map_err(|e| Failed::Backend(e.into()))
}

fn params(damping: f64, tol: f64, max_iter: u32) -> PyResult<Params> {
    if !(0.0..1.0).contains(&damping) || tol.is_nan() || tol <= 0.0 || max_iter == 0 {
        return Err(PyValueError::new_err(
            "damping must be in [0, 1), tol > 0 and max_iter >= 1",
        ));
    }
    Ok(Params {
        damping,
        tol,
        max_iter,
    })
}

fn edge_list(edges: &PyReadonlyArray2<'_, u64>) -> PyResult<EdgeList> {
    if edges.shape()[1] != 2 {
        return Err(PyValueError::new_err(
            "edges must be an (E, 2) array of (src, dst)",
        ));
    }
    let a = edges.as_array();
    Ok(EdgeList::from_pairs(
        a.rows().into_iter().map(|r| (r[0], r[1])).collect(),
    ))
}

fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

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
    let g = edge_list(&edges)?;
    let p = params(damping, tol, max_iter)?;
    let b = crate::parse_backend(backend)?;
    let d = crate::buffer::device(py, backend)?;
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

/// Streaming PageRank of the graph of `edges` under batches of edge changes, with the
/// workload's kernel (`StreamPageRank`) on `backend`: the ranks are computed once (a first
/// refresh), then after each batch `updates[i]` = (pairs (K, 2) uint64 of (src, dst) node ids
/// of the graph, ops (K,) int64: 1 = add, -1 = remove) is sent, incrementally refreshed.
/// Returns (node ids ascending, ranks flat ((batches + 1) x N, row 0 the initial ranks),
/// changes applied per batch, changes rejected per batch (an add of an edge present, a remove
/// of an edge absent), node pushes per refresh (batches + 1)).
#[pyfunction]
#[pyo3(signature = (edges, updates, damping, tol, max_iter, backend="cpu"))]
#[allow(clippy::type_complexity)]
fn streaming_pagerank<'py>(
    py: Python<'py>,
    edges: PyReadonlyArray2<'py, u64>,
    updates: Vec<(PyReadonlyArray2<'py, u64>, PyReadonlyArray1<'py, i64>)>,
    damping: f64,
    tol: f64,
    max_iter: u32,
    backend: &str,
) -> PyResult<(
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u64>>,
)> {
    let g = edge_list(&edges)?;
    let p = params(damping, tol, max_iter)?;
    let index: HashMap<u64, u32> = g
        .ids
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, i as u32))
        .collect();
    let mut batches: Vec<Vec<EdgeUpdate>> = Vec::with_capacity(updates.len());
    for (bi, (pairs, ops)) in updates.iter().enumerate() {
        let (pairs, ops) = (pairs.as_array(), ops.as_array());
        if pairs.ncols() != 2 || pairs.nrows() != ops.len() {
            return Err(PyValueError::new_err(format!(
                "update batch {bi}: pairs must be (K, 2) and ops (K,), got {:?} and {:?}",
                pairs.shape(),
                ops.shape()
            )));
        }
        let mut batch = Vec::with_capacity(ops.len());
        for (j, (r, &op)) in pairs.rows().into_iter().zip(ops.iter()).enumerate() {
            let node = |id: u64| {
                index.get(&id).copied().ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "update batch {bi}, change {j}: node {id} is not a node of the graph \
                         (the node set is fixed by edges)"
                    ))
                })
            };
            let op = match op {
                1 => OP_ADD,
                -1 => OP_REMOVE,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "update batch {bi}, change {j}: op {other}, expected 1 (add) or -1 \
                         (remove)"
                    )))
                }
            };
            batch.push(EdgeUpdate {
                src: node(r[0])?,
                dst: node(r[1])?,
                op,
                _pad: 0,
            });
        }
        batches.push(batch);
    }
    let n = g.nodes();
    let rows = batches.len() + 1;
    if n == 0 {
        // No nodes: no ranks; every batch is empty (a change would have named a node).
        let zeros = vec![0u64; batches.len()];
        return Ok((
            PyArray1::from_vec(py, Vec::new()),
            PyArray1::from_vec(py, Vec::new()),
            PyArray1::from_vec(py, zeros.clone()),
            PyArray1::from_vec(py, zeros),
            PyArray1::from_vec(py, vec![0; rows]),
        ));
    }
    let b = crate::parse_backend(backend)?;
    let d = crate::buffer::device(py, backend)?;
    let r = py.detach(|| -> Result<_, Failed> {
        let rt = runtime(b)?;
        let run = || -> Result<_, WorkloadError> {
            let mut s = StreamPageRank::launch(
                &rt,
                &d,
                &g,
                p,
                &format!("py-pagerank-stream-{}", unique()),
            )?;
            let mut ranks = Vec::with_capacity(rows * n);
            let (mut applied, mut rejected, mut pushes) = (Vec::new(), Vec::new(), Vec::new());
            let out = (|| {
                pushes.push(s.refresh()?.pushes);
                ranks.extend(s.ranks()?);
                for batch in &batches {
                    s.update(batch)?;
                    let r = s.refresh()?;
                    applied.push(r.applied);
                    rejected.push(r.rejected);
                    pushes.push(r.pushes);
                    ranks.extend(s.ranks()?);
                }
                Ok::<(), WorkloadError>(())
            })();
            let end = s.terminate();
            out?;
            end?;
            Ok((ranks, applied, rejected, pushes))
        };
        let r = run();
        rt.shutdown();
        Ok(r?)
    });
    let (ranks, applied, rejected, pushes) = r.map_err(|e| workload_error(py, e))?;
    Ok((
        PyArray1::from_vec(py, g.ids),
        PyArray1::from_vec(py, ranks),
        PyArray1::from_vec(py, applied),
        PyArray1::from_vec(py, rejected),
        PyArray1::from_vec(py, pushes),
    ))
}

/// Anomaly detection over readings (`sensors[i]`, `values[i]`) with the workload's keyed
/// kernel on `backend` (`anomaly::run_actor`: micro-batches of `micro_batch`, at most
/// `in_flight` outstanding). Returns (alert index, alert sensor, alert value, alert z; sensor
/// ids in order of first appearance, their final m, v, n; elapsed seconds; per micro-batch
/// latency in seconds).
#[pyfunction]
#[pyo3(signature = (sensors, values, micro_batch=100, in_flight=detector::IN_FLIGHT, backend="cpu"))]
#[allow(clippy::type_complexity)]
fn anomaly<'py>(
    py: Python<'py>,
    sensors: PyReadonlyArray1<'py, u64>,
    values: PyReadonlyArray1<'py, f64>,
    micro_batch: usize,
    in_flight: usize,
    backend: &str,
) -> PyResult<(
    (
        Bound<'py, PyArray1<u64>>,
        Bound<'py, PyArray1<u64>>,
        Bound<'py, PyArray1<f64>>,
        Bound<'py, PyArray1<f64>>,
    ),
    (
        Bound<'py, PyArray1<u64>>,
        Bound<'py, PyArray1<f64>>,
        Bound<'py, PyArray1<f64>>,
        Bound<'py, PyArray1<u64>>,
    ),
    f64,
    Bound<'py, PyArray1<f64>>,
)> {
    let (sensors, values) = (sensors.as_array(), values.as_array());
    if sensors.len() != values.len() {
        return Err(PyValueError::new_err(format!(
            "sensors and values must have the same length, got {} and {}",
            sensors.len(),
            values.len()
        )));
    }
    if micro_batch == 0 || in_flight == 0 {
        return Err(PyValueError::new_err(
            "micro_batch and in_flight must be >= 1",
        ));
    }
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(PyValueError::new_err(format!(
            "reading {i} is not finite ({})",
            values[i]
        )));
    }
    let readings: Vec<SensorReading> = sensors
        .iter()
        .zip(values.iter())
        .map(|(&sensor, &value)| SensorReading { sensor, value })
        .collect();
    let slotted = detector::slot(&readings);
    let b = crate::parse_backend(backend)?;
    let d = crate::buffer::device(py, backend)?;
    let r = py.detach(|| -> Result<_, Failed> {
        let rt = runtime(b)?;
        let r = detector::run_actor(&rt, &d, &slotted, micro_batch, in_flight, |_| {});
        rt.shutdown();
        Ok(r?)
    });
    let r = r.map_err(|e| workload_error(py, e))?;
    let alerts = (
        PyArray1::from_iter(py, r.alerts.iter().map(|a| a.index)),
        PyArray1::from_iter(py, r.alerts.iter().map(|a| a.sensor)),
        PyArray1::from_iter(py, r.alerts.iter().map(|a| a.value)),
        PyArray1::from_iter(py, r.alerts.iter().map(|a| a.z)),
    );
    let stats = (
        PyArray1::from_vec(py, slotted.sensor_ids),
        PyArray1::from_iter(py, r.stats.iter().map(|s| s.m)),
        PyArray1::from_iter(py, r.stats.iter().map(|s| s.v)),
        PyArray1::from_iter(py, r.stats.iter().map(|s| s.n)),
    );
    Ok((
        alerts,
        stats,
        r.elapsed.as_secs_f64(),
        PyArray1::from_iter(py, r.batch_latency.iter().map(|t| t.as_secs_f64())),
    ))
}

/// The CUDA C handlers of a workload as `resident-workloads` ships them (`"anomaly"`,
/// `"pipeline"`): the twins of the Python package's `numba=` handlers.
#[pyfunction]
fn workload_cuda_source(name: &str) -> PyResult<&'static str> {
    match name {
        "anomaly" => Ok(detector::ANOMALY_CU),
        "pipeline" => Ok(resident_workloads::pipeline::PIPELINE_CU),
        other => Err(PyValueError::new_err(format!(
            "no CUDA C source of a workload named {other:?}: \"anomaly\" or \"pipeline\""
        ))),
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(workload_cuda_source, m)?)?;
    m.add_function(wrap_pyfunction!(pagerank, m)?)?;
    m.add_function(wrap_pyfunction!(streaming_pagerank, m)?)?;
    m.add_function(wrap_pyfunction!(anomaly, m)?)?;
    m.add_function(wrap_pyfunction!(pagerank_defaults, m)?)?;
    Ok(())
}
