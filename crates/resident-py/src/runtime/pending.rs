//! `PendingCallPy`: a `call` in flight, whose reply its `wait` takes.

use super::*;

/// A `call` in flight; `wait` takes the reply.
#[pyclass(frozen, module = "resident._resident")]
pub(crate) struct PendingCallPy {
    pub(crate) pc: Mutex<Option<PendingCall<u64, u64>>>,
    pub(crate) kern: Arc<Kern>,
    pub(crate) request: u64,
}

impl PendingCallPy {
    pub(super) fn finish(&self, py: Python<'_>, r: Result<u64, Error>) -> PyResult<Py<PyAny>> {
        *self.pc.lock() = None;
        match r {
            Ok(key) => self
                .kern
                .store
                .take(key)
                .ok_or_else(|| PyRuntimeError::new_err("reply handle without an object")),
            Err(e) => {
                // A request dropped by a drop policy, or expired (its deadline passed before
                // the kernel took it): its object will never be taken.
                if matches!(e, Error::Dropped { .. } | Error::Timeout { .. }) {
                    self.kern.store.take(self.request);
                }
                Err(engine_error(py, &e))
            }
        }
    }
}

#[pymethods]
impl PendingCallPy {
    /// Looks for the reply without waiting: the reply object (any object, `None` included),
    /// or `NOTHING` if it is not there yet.
    pub(super) fn poll(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let r = {
            let mut g = self.pc.lock();
            let Some(pc) = g.as_mut() else {
                return Err(PyRuntimeError::new_err(
                    "this call's reply was already taken",
                ));
            };
            pc.wait(Duration::ZERO)
        };
        match r {
            None => nothing(py),
            Some(r) => self.finish(py, r),
        }
    }

    /// Waits up to `timeout` seconds for the reply, GIL released, Ctrl-C honoured; `NOTHING`
    /// when it did not come (the call stays pending). Must run on the thread that started
    /// the call unless `timeout` is 0.
    pub(super) fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<Py<PyAny>> {
        let t = secs(timeout)?;
        let r = Self::sliced_wait(py, &self.kern.hand, &self.pc, t)?;
        match r {
            None => nothing(py),
            Some(r) => self.finish(py, r),
        }
    }

    /// Gives up on the reply (a later reply is counted as dropped by the engine) and
    /// releases the request object if the kernel has not taken it: a request whose caller
    /// gave up is never handed to the handler (one with a deadline has expired; one without
    /// is withdrawn), so its object does not wait for the kernel's end.
    pub(super) fn cancel(&self) {
        let pc = self.pc.lock().take();
        let Some(mut pc) = pc else { return };
        // A reply that came already: nobody will take it.
        if let Some(Ok(key)) = pc.wait(Duration::ZERO) {
            self.kern.store.take(key);
            return;
        }
        let id = pc.message_id();
        // Unregisters the call: a reply published from now on is discarded by the engine.
        drop(pc);
        if self.kern.store.take(self.request).is_none() {
            // The kernel has the request: release the reply it may still publish.
            self.kern.store.abandon(id);
        }
    }
}

impl PendingCallPy {
    pub(super) fn sliced_wait(
        py: Python<'_>,
        hand: &Handoff,
        pc: &Mutex<Option<PendingCall<u64, u64>>>,
        t: Duration,
    ) -> PyResult<Option<Result<u64, Error>>> {
        PyRuntime::sliced(py, Some(hand), t, |slice| {
            let mut g = pc.lock();
            match g.as_mut() {
                None => Some(None),
                Some(pc) => poll_for(POLL.min(slice), || pc.wait(Duration::ZERO))
                    .or_else(|| pc.wait(slice))
                    .map(Some),
            }
        })
        .map(Option::flatten)
    }
}
