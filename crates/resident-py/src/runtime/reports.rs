//! A kernel's terminate report as Python dicts (records by value, or by bytes for batch
//! kernels).

use super::*;

/// A report as a dict: counts, failure, and the Python objects handed back.
pub(super) fn report_dict<'py>(
    py: Python<'py>,
    r: TerminateReport<u64, u64>,
    store: &Store,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kernel_id", &r.kernel_id)?;
    d.set_item("processed", r.processed)?;
    d.set_item("dropped", r.dropped)?;
    let undelivered = PyList::empty(py);
    let mut lost = 0usize;
    for (env, key) in &r.undelivered {
        match store.take(*key) {
            Some(o) => undelivered.append((o, env_tuple(env)))?,
            None => lost += 1,
        }
    }
    let unreceived = PyList::empty(py);
    for (env, key) in &r.unreceived {
        match store.take(*key) {
            Some(o) => unreceived.append((o, env_tuple(env)))?,
            None => lost += 1,
        }
    }
    d.set_item("undelivered", undelivered)?;
    d.set_item("unreceived", unreceived)?;
    match &r.failure {
        Some((reason, msg)) => {
            d.set_item("failure", reason.to_string())?;
            let m = msg
                .as_ref()
                .and_then(|(env, k)| store.take(*k).map(|o| (o, Some(env_tuple(env)))));
            // A Python handler that raised: its ctx handed the message back.
            let m = m.or_else(|| store.failed.lock().take().map(|o| (o, None)));
            d.set_item("failed_message", m)?;
        }
        None => {
            d.set_item("failure", py.None())?;
            d.set_item("failed_message", py.None())?;
        }
    }
    // Objects the engine discarded without telling (outputs dropped by policy, late replies).
    d.set_item("released", store.clear())?;
    d.set_item("missing", lost)?;
    Ok(d)
}

/// A batch kernel's report as a dict; records as one uint8 array each.
pub(super) fn bytes_report_dict<'py>(
    py: Python<'py>,
    id: &str,
    r: batch::BytesReport,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kernel_id", id)?;
    d.set_item("processed", r.processed)?;
    d.set_item("dropped", r.dropped)?;
    d.set_item("undelivered", PyArray1::from_vec(py, r.undelivered))?;
    d.set_item("unreceived", PyArray1::from_vec(py, r.unreceived))?;
    d.set_item("failure", r.failure)?;
    d.set_item("failed_message", py.None())?;
    d.set_item("released", 0)?;
    d.set_item("missing", 0)?;
    Ok(d)
}
