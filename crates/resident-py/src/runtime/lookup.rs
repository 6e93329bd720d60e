//! How the `Runtime`'s methods find their kernel (by id, with the states of kernels that are
//! gone) and wait for it with the GIL released: for an output, for room in its input queue,
//! in slices that let signals through.

use super::*;

impl PyRuntime {
    pub(super) fn kern(&self, py: Python<'_>, id: &str) -> PyResult<Arc<Kern>> {
        self.kernels
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| self.missing(py, id, "use"))
    }

    /// The final state of a kernel terminated and freed, if it is still remembered.
    pub(super) fn gone_state(&self, id: &str) -> Option<KernelState> {
        self.gone
            .lock()
            .iter()
            .rev()
            .find(|(g, _)| g == id)
            .map(|(_, st)| st.clone())
    }

    /// The error for an operation on a kernel that is not live: its final state when it was
    /// terminated (and is still remembered), else unknown.
    pub(super) fn missing(&self, py: Python<'_>, id: &str, op: &'static str) -> PyErr {
        match self.gone_state(id) {
            Some(state) => engine_error(
                py,
                &Error::InvalidState {
                    id: id.to_string(),
                    op,
                    state,
                },
            ),
            None => engine_error(py, &Error::UnknownKernel { id: id.to_string() }),
        }
    }

    /// A send to a kernel that is not live: refused with `obj` handed back when the kernel
    /// was terminated, else unknown.
    pub(super) fn refuse_missing(
        &self,
        py: Python<'_>,
        id: &str,
        op: &str,
        obj: Py<PyAny>,
    ) -> PyErr {
        match self.gone_state(id) {
            Some(state) => build(
                py,
                Described {
                    class: "KernelNotAcceptingError",
                    text: format!("kernel '{id}' is {state}: {op} refused, message returned"),
                    id: Some(id.to_string()),
                    detail: Some(state.to_string()),
                },
                Some(obj),
            ),
            None => engine_error(py, &Error::UnknownKernel { id: id.to_string() }),
        }
    }

    /// Frees a terminated kernel (queues, store, bell): the binding keeps only its id and
    /// final state among the last `GONE_MAX`, so a late operation gets the same typed error.
    pub(super) fn forget_kernel(&self, id: &str, state: KernelState) {
        let k = self.kernels.lock().remove(id);
        let b = self.batch.lock().remove(id);
        let bell = self.bells.lock().remove(id);
        if let Some(bell) = bell {
            bell.ring();
        }
        if k.is_some() || b.is_some() {
            let mut gone = self.gone.lock();
            gone.retain(|(g, _)| g != id);
            gone.push_back((id.to_string(), state));
            while gone.len() > GONE_MAX {
                gone.pop_front();
            }
        }
    }

    /// Rings a live kernel's bell (after a lifecycle change).
    pub(super) fn ring(&self, id: &str) {
        let b = self.bells.lock().get(id).cloned();
        if let Some(b) = b {
            b.ring();
        }
    }

    pub(super) fn bell(&self, py: Python<'_>, id: &str) -> PyResult<Arc<Bell>> {
        self.bells
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| self.missing(py, id, "wait"))
    }

    /// Any kernel's lifecycle operations.
    pub(super) fn ops(
        &self,
        py: Python<'_>,
        id: &str,
        op: &'static str,
    ) -> PyResult<Arc<dyn KernelOps>> {
        if let Some(k) = self.kernels.lock().get(id) {
            return Ok(Arc::new(k.handle.clone()));
        }
        if let Some(b) = self.batch.lock().get(id) {
            return Ok(Arc::new(BatchOps(b.clone())));
        }
        Err(self.missing(py, id, op))
    }

    /// A live kernel's state, or a freed kernel's final state.
    pub(super) fn state_of(&self, py: Python<'_>, id: &str) -> PyResult<KernelState> {
        match self.ops(py, id, "read the state of") {
            Ok(k) => Ok(k.state()),
            Err(e) => self.gone_state(id).ok_or(e),
        }
    }

    pub(super) fn batch_kern(
        &self,
        py: Python<'_>,
        id: &str,
    ) -> PyResult<Arc<dyn batch::BatchKernel>> {
        self.batch
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| self.missing(py, id, "use"))
    }

    /// Runs a blocking engine wait in slices with the GIL released, checking for signals
    /// between slices; `f(slice)` returns `None` to go on waiting. A wait for a Python
    /// kernel's outputs passes its `Handoff` (counted as a waiter; see there).
    /// The kernel's next output (its envelope and store key), waited for up to `t` in slices
    /// ([`Self::sliced`]); `None` when none came in time.
    pub(super) fn wait_output(
        py: Python<'_>,
        k: &Kern,
        t: Duration,
    ) -> PyResult<Option<Result<(Envelope, u64), Error>>> {
        let h = k.handle.clone();
        Self::sliced(py, Some(&k.hand), t, |slice| {
            match h.receive_envelope(slice) {
                Err(Error::Timeout { .. }) => None,
                other => Some(other),
            }
        })
    }

    pub(crate) fn sliced<R: Send>(
        py: Python<'_>,
        hand: Option<&Handoff>,
        timeout: Duration,
        mut f: impl FnMut(Duration) -> Option<R> + Send,
    ) -> PyResult<Option<R>> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let left = deadline.map_or(SLICE, |d| d.saturating_duration_since(Instant::now()));
            let slice = left.min(SLICE);
            let got = match hand {
                Some(hand) => {
                    let w = Waiter::new(hand);
                    py.detach(|| {
                        w.released();
                        let r = f(slice);
                        if r.is_some() {
                            w.got();
                        }
                        r
                    })
                }
                None => py.detach(|| f(slice)),
            };
            if let Some(r) = got {
                return Ok(Some(r));
            }
            py.check_signals()?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// Waits (GIL released, in slices with Ctrl-C honoured) until kernel `k`'s input queue
    /// has room, up to its block timeout: a send under `Block` to a full queue waits here
    /// rather than inside the engine, where a signal would not be seen until the block timeout.
    /// `Ok(false)`: no room came in time (the send would time out) and the kernel still
    /// accepts messages; a kernel that stopped accepting ends the wait at once (`Ok(true)`,
    /// the send is then refused by the engine with the message handed back).
    pub(super) fn wait_room(py: Python<'_>, k: &Kern) -> PyResult<bool> {
        let h = &k.handle;
        let ready = || h.input_has_room() || !h.state().accepts_messages();
        let got = Self::sliced(py, None, k.block, |slice| {
            let end = Instant::now() + slice;
            let mut spins = 0u32;
            loop {
                if ready() {
                    return Some(());
                }
                if Instant::now() >= end {
                    return None;
                }
                if spins < 64 {
                    spins += 1;
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        })?;
        Ok(got.is_some() || ready())
    }

    /// The `SendTimeoutError` of a send to kernel `kernel_id` that found no room within its
    /// block timeout, `obj` handed back.
    pub(super) fn room_timeout(
        py: Python<'_>,
        kernel_id: &str,
        k: &Kern,
        op: Op,
        obj: Py<PyAny>,
    ) -> PyErr {
        let e = Error::Timeout {
            id: kernel_id.to_string(),
            op,
            timeout: k.block,
            message: None,
        };
        build(py, describe(&e, true), Some(obj))
    }

    /// The next output of a Python kernel if one is ready, or comes within `wait` (one
    /// short wait, GIL released, at most a slice).
    pub(super) fn output_within(
        py: Python<'_>,
        k: &Kern,
        wait: Duration,
    ) -> PyResult<Option<(Envelope, Py<PyAny>)>> {
        let w = wait.min(SLICE);
        let mut r = k.handle.receive_envelope(Duration::ZERO);
        if !w.is_zero() && matches!(r, Err(Error::Timeout { .. })) {
            let waiter = Waiter::new(&k.hand);
            r = py.detach(|| {
                waiter.released();
                let r = match poll_for(POLL.min(w), || {
                    k.handle.receive_envelope(Duration::ZERO).ok()
                }) {
                    Some(x) => Ok(x),
                    None => k.handle.receive_envelope(w),
                };
                if r.is_ok() {
                    waiter.got();
                }
                r
            });
        }
        match r {
            Ok((env, key)) => Ok(k.store.take(key).map(|o| (env, o))),
            Err(Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(engine_error(py, &e)),
        }
    }
}
