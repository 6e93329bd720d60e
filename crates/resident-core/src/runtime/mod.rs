//! The runtime: launches ring kernels, finds them by id, reports their telemetry, and shuts
//! everything down gracefully when dropped.

pub mod bind;
pub mod context;
pub mod device_handler;
pub mod handle;
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub mod host;
pub(crate) mod ids;
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub mod io;
pub mod kernel;
pub mod keyed;
pub(crate) mod keys;
pub(crate) mod port;
pub(crate) mod publisher;
pub(crate) mod registry;
pub mod report;

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::RwLock;
use resident_ring::{Backpressure, Mailbox, MailboxConfig, Message, WaitStrategy};

use crate::engine::cpu::CpuOnly;
use crate::engine::{Backend, BackendKind, DeviceHandle, Engines};
use crate::state::{Error, Failure, KernelState, Result};
use crate::telemetry::{RuntimeTelemetry, Telemetry};
use context::Context;
use handle::{Begin, KernelHandle};
use host::RingHost;
pub use ids::Ids;
use kernel::RingKernel;
use port::InputPort;
pub use registry::RECENT_KERNELS;
use registry::{KernelEntry, RuntimeCore};
use report::KernelReport;
use std::marker::PhantomData;

struct Entry<In, Out> {
    handle: KernelHandle<In, Out>,
    port: InputPort<In>,
}

impl<In: Message, Out: Message> KernelEntry for Entry<In, Out> {
    fn state(&self) -> KernelState {
        self.handle.state()
    }
    fn telemetry(&self) -> Telemetry {
        self.handle.telemetry()
    }
    fn types(&self) -> (TypeId, TypeId, String) {
        (
            TypeId::of::<In>(),
            TypeId::of::<Out>(),
            type_names::<In, Out>(),
        )
    }
    fn handle_any(&self) -> &(dyn Any + Send + Sync) {
        &self.handle
    }
    fn io_addr(&self) -> usize {
        Arc::as_ptr(&self.handle.io) as *const () as usize
    }
    fn port_any(&self) -> &(dyn Any + Send + Sync) {
        &self.port
    }
    fn drain_until(&self, deadline: Instant) {
        // A kernel driven from outside by this very thread cannot drain while it waits.
        let outside_here =
            *self.handle.io.outside_thread.lock() == Some(std::thread::current().id());
        if self.handle.state() == KernelState::Active && !outside_here {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = self.handle.drain(left);
        }
    }
    fn begin(&self) -> Option<Option<Failure>> {
        match self.handle.terminate_begin() {
            Ok(Begin::Started(failure)) => Some(failure),
            _ => None,
        }
    }
    fn finish(
        &self,
        begun: Option<Option<Failure>>,
        deadline: Option<Instant>,
        timeout: Duration,
    ) -> Option<KernelReport> {
        let report = match begun {
            Some(failure) => self.handle.terminate_finish(failure, deadline, timeout),
            None => self.handle.report()?,
        };
        Some(KernelReport::new(report))
    }
}

fn type_names<In, Out>() -> String {
    format!(
        "{}, {}",
        std::any::type_name::<In>(),
        std::any::type_name::<Out>()
    )
}

/// Configures and builds a [`Runtime`] on the engines `E` (`resident::RuntimeBuilder` has every
/// engine of the build; [`crate::engine::cpu::CpuOnly`] is the CPU alone).
#[derive(Clone, Debug)]
pub struct RuntimeBuilder<E: Engines = CpuOnly> {
    profiler: Option<crate::profile::Profiler>,
    backend: Backend,
    telemetry: bool,
    wait: WaitStrategy,
    shutdown_timeout: Duration,
    terminate_timeout: Duration,
    engines: PhantomData<fn() -> E>,
}

impl<E: Engines> RuntimeBuilder<E> {
    /// Records every kernel of the runtime into `profiler` (see [`crate::profile`]).
    pub fn profiler(mut self, profiler: crate::profile::Profiler) -> Self {
        self.profiler = Some(profiler);
        self
    }

    /// Profiling with a new [`Profiler`](crate::profile::Profiler) (`true`), or none (`false`,
    /// the default). Read it back with [`Runtime::profiler`].
    pub fn enable_profiling(mut self, on: bool) -> Self {
        self.profiler = on.then(|| self.profiler.take().unwrap_or_default());
        self
    }

    /// Which backend to run on (default `Backend::Auto`).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Latency histograms and throughput sampling (counters are always kept).
    pub fn enable_telemetry(mut self, on: bool) -> Self {
        self.telemetry = on;
        self
    }

    /// Default wait strategy of kernels and receivers (default: spin 50 us, then park).
    pub fn wait_strategy(mut self, wait: WaitStrategy) -> Self {
        self.wait = wait;
        self
    }

    /// How long dropping (or [`Runtime::shutdown`]) lets the active kernels drain, all
    /// together (default 5 s). Kernels still busy then are terminated; a handler that does
    /// not return within another `shutdown_timeout` is abandoned (its kernel `Failed`, the
    /// stuck message in its report). So a drop returns within about twice this bound.
    pub fn shutdown_timeout(mut self, t: Duration) -> Self {
        self.shutdown_timeout = t;
        self
    }

    /// Default bound on how long `terminate` and `deactivate` wait for a kernel's host thread
    /// (default 10 s; per kernel: `RingKernel::terminate_timeout`).
    pub fn terminate_timeout(mut self, t: Duration) -> Self {
        self.terminate_timeout = t;
        self
    }

    /// Builds the runtime on the backend asked for: `Auto` becomes CUDA when a device opens,
    /// else a hardware wgpu adapter, else the CPU (the engines `E` has); a backend that cannot
    /// be used is [`Error::BackendUnavailable`] saying why.
    pub fn build(self) -> Result<Runtime<E>> {
        let (backend, device) =
            E::resolve(self.backend).map_err(|source| Error::BackendUnavailable {
                backend: self.backend,
                source: Box::new(source),
            })?;
        if let Some(p) = &self.profiler {
            p.read_device_telemetry_with(E::device_telemetry);
        }
        Ok(Runtime {
            core: Arc::new(RuntimeCore {
                ids: Arc::new(Ids {
                    epoch: Instant::now(),
                    next: CachePadded::new(AtomicU64::new(1)),
                }),
                kernels: RwLock::new(HashMap::new()),
                registered: Arc::new(AtomicU64::new(0)),
                recent: parking_lot::Mutex::new(std::collections::VecDeque::new()),
                telemetry: self.telemetry,
                wait: self.wait,
                terminate_timeout: self.terminate_timeout,
            }),
            backend,
            device: parking_lot::Mutex::new(device),
            shutdown_timeout: self.shutdown_timeout,
            profiler: self.profiler,
            engines: PhantomData,
        })
    }
}

/// Hosts ring kernels on the engines `E` (`resident::Runtime` has every engine of the build).
/// Dropping it drains and terminates every kernel.
pub struct Runtime<E: Engines = CpuOnly> {
    core: Arc<RuntimeCore>,
    backend: Backend,
    /// The runtime's device, opened when the backend was chosen or on first use.
    device: parking_lot::Mutex<Option<DeviceHandle>>,
    shutdown_timeout: Duration,
    profiler: Option<crate::profile::Profiler>,
    engines: PhantomData<fn() -> E>,
}

impl<E: Engines> Runtime<E> {
    /// A builder with defaults: `Backend::Auto`, telemetry off, spin-then-park waiting.
    pub fn builder() -> RuntimeBuilder<E> {
        RuntimeBuilder {
            engines: PhantomData,
            profiler: None,
            backend: Backend::Auto,
            telemetry: false,
            wait: WaitStrategy::default(),
            shutdown_timeout: Duration::from_secs(5),
            terminate_timeout: kernel::TERMINATE_TIMEOUT,
        }
    }

    /// The backend this runtime resolved to (`Cpu`, `Cuda` or `CudaSim`, never `Auto`).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The device of this runtime's backend: the one its kernels run on, for the buffers you
    /// bind to them (`RingKernel::bind`) and for one-shot kernels, so no second
    /// `backend::open` is needed. Opened once and shared; errors are typed
    /// ([`Error::BackendUnavailable`]).
    ///
    /// ```
    /// use resident::prelude::*;
    /// use resident::memory::{BufferOptions, UnifiedBuffer};
    /// let rt = Runtime::builder().backend(Backend::Cpu).build()?;
    /// let d = rt.device()?;
    /// let buf = UnifiedBuffer::from_slice(&d, &[1.0f32, 2.0], BufferOptions::default()).unwrap();
    /// let k = rt.launch(
    ///     RingKernel::<u32, f32>::new("read")
    ///         .bind("xs", buf)
    ///         .handler(|ctx: &mut Context<()>, i: u32| {
    ///             Some(ctx.buffer::<f32>("xs").ok()?[i as usize])
    ///         }),
    /// )?;
    /// k.activate()?;
    /// assert_eq!(k.call(1, std::time::Duration::from_secs(5))?, 2.0);
    /// # Ok::<(), resident::Error>(())
    /// ```
    pub fn device(&self) -> Result<crate::engine::DeviceHandle> {
        let mut d = self.device.lock();
        if let Some(d) = d.as_ref() {
            return Ok(d.clone());
        }
        let opened = E::open(self.backend).map_err(|e| Error::BackendUnavailable {
            backend: self.backend,
            source: Box::new(e),
        })?;
        *d = Some(opened.clone());
        Ok(opened)
    }

    /// The runtime's profiler, when profiling is on.
    pub fn profiler(&self) -> Option<&crate::profile::Profiler> {
        self.profiler.as_ref()
    }

    /// Phase 1 of the lifecycle: allocates the kernel's queues and state and starts its host
    /// thread (on a device backend: compiles and launches the device side), which handles
    /// nothing until [`KernelHandle::activate`]. Messages sent before then queue up.
    ///
    /// The id, the configuration and duplicates are checked before anything is allocated or
    /// touches a device; errors are typed (a device's own error is the `source` of
    /// [`Error::Device`]).
    pub fn launch<In: Message, Out: Message, S: Send + 'static>(
        &self,
        mut kernel: RingKernel<In, Out, S>,
    ) -> Result<KernelHandle<In, Out>> {
        let t_launch = Instant::now();
        let id = kernel.id.clone();
        let invalid = |reason: String| Error::InvalidConfig {
            id: id.clone(),
            reason,
        };
        if id.is_empty() {
            return Err(invalid("the id is empty".into()));
        }
        if kernel.batch_size == 0 {
            return Err(invalid("batch_size must be at least 1".into()));
        }
        if kernel.lanes == 0 || kernel.lanes > 256 {
            return Err(invalid(format!(
                "priority_lanes must be 1 to 256, got {}",
                kernel.lanes
            )));
        }
        self.check_duplicate(&id)?;
        // The engine this runtime runs on, and the kernel's handler for it, if it has one.
        let engine = engine_of(self.backend);
        let device_handler = kernel.device.take_for(engine);
        let runs_on_device = device_handler.is_some();
        // A keyed kernel on a device keeps its states in the bound buffer `keys`.
        let mut key_states = None;
        if kernel.keys.is_some() {
            if !kernel.bindings.is_empty() {
                return Err(invalid(
                    "a keyed kernel binds no buffers (its per-key states are its memory)".into(),
                ));
            }
            if runs_on_device {
                let keyed_handler = device_handler.as_ref().is_some_and(|h| h.keyed());
                let Some(make) = kernel.device_keys.take().filter(|_| keyed_handler) else {
                    return Err(invalid(
                        "a keyed kernel runs on a device through .key_cuda(CudaHandler::keyed::<S>(field)) \
                         or .key_wgsl(WgslHandler::keyed(field)); a plain .cuda(..) or .wgsl(..) \
                         handler knows nothing of its keys"
                            .into(),
                    ));
                };
                let (binding, snapshots) =
                    make(&kernel.state, &self.device()?).map_err(|e| invalid(e.to_string()))?;
                kernel.bindings.push(binding);
                key_states = Some(snapshots);
            }
        }
        let bound = match bind::table(std::mem::take(&mut kernel.bindings))
            .map_err(|e| invalid(e.to_string()))?
        {
            None => None,
            Some(t) if runs_on_device => Some(t),
            Some(_)
                if matches!(
                    kernel.body,
                    Some(kernel::Body::Loop(_) | kernel::Body::Outside(_))
                ) =>
            {
                return Err(invalid(
                    "bound buffers need the handler form (.handler), not .run".into(),
                ))
            }
            Some(t) => Some(t),
        };
        let wait = kernel.wait.unwrap_or(self.core.wait);
        let cfg = |capacity: usize, lanes: usize, backpressure: Backpressure| MailboxConfig {
            capacity,
            lanes,
            backpressure,
            wait,
        };
        let input_cfg = cfg(kernel.queue_size, kernel.lanes, kernel.backpressure);
        // Outputs never fail a handler: a full output queue makes the kernel wait in short
        // steps (so terminate is seen), unless the user chose a drop policy.
        let output_policy = match kernel.backpressure {
            p @ (Backpressure::DropOldest | Backpressure::DropNewest) => p,
            _ => Backpressure::Block(Duration::from_millis(20)),
        };
        let output_cfg = cfg(
            kernel.output_queue_size.unwrap_or(kernel.queue_size),
            1,
            output_policy,
        );
        fn build<R>(
            built: std::result::Result<R, resident_ring::mailbox::MailboxError>,
            id: &str,
            what: &'static str,
        ) -> Result<R> {
            built.map_err(|e| match e {
                resident_ring::mailbox::MailboxError::Ring(
                    resident_ring::spsc::RingError::OutOfMemory { bytes },
                ) => Error::OutOfMemory {
                    id: id.to_string(),
                    what,
                    bytes,
                },
                other => Error::InvalidConfig {
                    id: id.to_string(),
                    reason: format!("{what}: {other}"),
                },
            })
        }
        let input = build(Mailbox::new(input_cfg), &id, "input queue")?;
        // The output side has one writer, the kernel's host thread: it gets the `Writer`.
        let (writer, output) = build(Mailbox::with_writer(output_cfg), &id, "output queue")?;

        let id_arc: Arc<str> = Arc::from(id.as_str());
        let io = io::kernel_io(
            id_arc.clone(),
            input,
            output,
            self.core.ids.clone(),
            wait,
            kernel.batch_size,
            self.core.telemetry,
            kernel
                .terminate_timeout
                .unwrap_or(self.core.terminate_timeout),
            Arc::downgrade(&self.core),
            kernel.keys,
        );
        if let Some(snapshots) = key_states {
            let _ = io.keyed.set(snapshots(&io));
        }
        if let Some(hook) = kernel.on_publish.take() {
            let _ = io.on_publish.set(hook);
        }
        if let Some(hook) = kernel.on_take.take() {
            let _ = io.on_take.set(hook);
        }
        if let Some(hook) = kernel.on_terminate.take() {
            let _ = io.on_terminate.set(hook);
        }
        if let Some(target) = kernel.forward.take() {
            // A target already running must take `Out`; one launched later is checked by type
            // when the first output is forwarded.
            if let Err(e @ Error::TypeMismatch { .. }) = self.core.input_port::<Out>(&target) {
                return Err(invalid(format!("forward_to('{target}'): {e}")));
            }
            let _ = io.forward.set(io::Forward::new(
                target,
                Arc::downgrade(&self.core),
                self.core.registered.clone(),
                kernel.forward_path,
            ));
        }
        // A device handler gets the bound buffers' declarations and initial values; the engine
        // keeps their device copies and serves the host's reads and writes.
        let device_bindings = match &bound {
            Some(t) if runs_on_device => {
                bind::device_bindings(&id, t).map_err(|e| Error::InvalidConfig {
                    id: id.clone(),
                    reason: e.to_string(),
                })?
            }
            _ => Vec::new(),
        };
        let device = match device_handler {
            None => None,
            Some(h) => Some(
                h.launch(
                    engine,
                    &crate::runtime::device_handler::RingSpec {
                        id: &id,
                        lanes: kernel.lanes,
                        queue_size: kernel.queue_size,
                        batch_size: kernel.batch_size,
                        bindings: &device_bindings,
                    },
                )
                .map_err(|source| Error::Device {
                    id: id.clone(),
                    op: "launch",
                    source: Box::new(source),
                })?,
            ),
        };
        // A keyed kernel builds its own host from its states (`RingKernel::key_handler`).
        let own_host = if device.is_none() {
            kernel.host.take()
        } else {
            None
        };
        let host: Box<dyn RingHost<In, Out>> = match (device, kernel.body, kernel.unit_body) {
            (None, _, _) if own_host.is_some() => {
                let make = own_host.expect("checked by the guard");
                make(kernel.state, &io).map_err(|e| invalid(e.to_string()))?
            }
            (Some(hosted), _, _) => {
                let _ = io.placement.set(handle::Placement::Device(engine));
                *io.device_state.lock() = hosted.state;
                if let (Some(t), Some(b)) = (bound, hosted.buffers) {
                    bind::attach_device(&t, b);
                    let _ = io.bound.set(t);
                }
                hosted.host
            }
            (None, Some(body), _) => {
                let mut ctx = Context::new(
                    kernel.state,
                    id_arc,
                    io.control.clone(),
                    Arc::downgrade(&self.core),
                );
                // A handler touches its state only inside a batch (batch gate held), so a
                // snapshot under the gate is safe; a loop's state is its loop's alone.
                if matches!(body, kernel::Body::Handler(_)) {
                    let _ = io.host_state.set(ctx.state_cell());
                }
                if let Some(t) = bound {
                    ctx.bound = bind::BatchBinding::new(Some(t.clone()));
                    let _ = io.bound.set(t);
                }
                Box::new(host::cpu::CpuHost::new(ctx, body))
            }
            (None, None, Some(body)) => {
                // A handler given before `.state(..)`: it runs with a unit context; the state
                // is kept with the kernel until it ends.
                let state = kernel.state;
                let mut ctx =
                    Context::new((), id_arc, io.control.clone(), Arc::downgrade(&self.core));
                if let Some(t) = bound {
                    ctx.bound = bind::BatchBinding::new(Some(t.clone()));
                    let _ = io.bound.set(t);
                }
                Box::new(host::cpu::KeepState::new(
                    host::cpu::CpuHost::new(ctx, body),
                    state,
                ))
            }
            (None, None, None) if kernel.device.first().is_some() => {
                let h = kernel.device.first().expect("checked by the guard");
                return Err(invalid(format!(
                    "it has only a {} handler and this runtime ({engine}) does not run it: add \
                     .handler(..) for the CPU{}",
                    h.language(),
                    h.elsewhere_hint()
                )));
            }
            (None, None, None) => {
                return Err(invalid(
                    "no handler: call .handler(..), .run(..), .key_handler(..), .cuda(..) or \
                     .wgsl(..)"
                        .into(),
                ))
            }
        };

        let mut kernels = self.core.kernels.write();
        if let Some(existing) = kernels.get(&id) {
            let state = existing.state();
            if state != KernelState::Terminated {
                // Dropping `host` frees its device side: nothing keeps running.
                return Err(Error::DuplicateKernel { id, state });
            }
        }
        crate::profile::launched(
            self.profiler.as_ref(),
            &io.profile,
            &io.id,
            self.core.ids.epoch,
            t_launch,
        );
        host::spawn(io.clone(), host, writer)?;
        let handle = KernelHandle { io: io.clone() };
        kernels.insert(
            id,
            Arc::new(Entry {
                handle: handle.clone(),
                port: io.port.clone(),
            }),
        );
        // Release, under the write lock and after the entry (and its port's device peer slot,
        // published by `host::spawn`): a producer that acquires the new count finds both.
        self.core.registered.fetch_add(1, Ordering::Release);
        Ok(handle)
    }

    fn check_duplicate(&self, id: &str) -> Result<()> {
        if let Some(existing) = self.core.kernels.read().get(id) {
            let state = existing.state();
            if state != KernelState::Terminated {
                return Err(Error::DuplicateKernel {
                    id: id.to_string(),
                    state,
                });
            }
        }
        Ok(())
    }

    /// The typed handle of kernel `id`; an error for an unknown id or other message types.
    pub fn kernel<In: Message, Out: Message>(&self, id: &str) -> Result<KernelHandle<In, Out>> {
        let kernels = self.core.kernels.read();
        let entry = kernels
            .get(id)
            .ok_or_else(|| Error::UnknownKernel { id: id.to_string() })?;
        entry
            .handle_any()
            .downcast_ref::<KernelHandle<In, Out>>()
            .cloned()
            .ok_or_else(|| Error::TypeMismatch {
                id: id.to_string(),
                expected: type_names::<In, Out>(),
                actual: entry.types().2,
            })
    }

    /// Ids and final states (`Terminated`, or `Failed` for a kernel whose terminate gave up
    /// on its handler) of the last [`RECENT_KERNELS`] kernels terminated, oldest first. A
    /// terminated kernel is not kept otherwise: its queues, call table, bindings and thread
    /// are gone, its id can be launched again, and its report is with its handles
    /// ([`KernelHandle::report`]).
    pub fn recently_terminated(&self) -> Vec<(String, KernelState)> {
        self.core.recent.lock().iter().cloned().collect()
    }

    /// Ids of every live kernel (launched and not terminated), sorted.
    pub fn kernel_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.core.kernels.read().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Telemetry of every kernel with totals.
    pub fn telemetry(&self) -> RuntimeTelemetry {
        let entries: Vec<_> = self.core.kernels.read().values().cloned().collect();
        RuntimeTelemetry::from_kernels(entries.iter().map(|e| e.telemetry()).collect())
    }

    /// Telemetry in Prometheus text format.
    pub fn prometheus(&self) -> String {
        self.telemetry().to_prometheus()
    }

    /// Drains the active kernels (together, up to the shutdown timeout), then terminates all
    /// of them (a handler stuck beyond another shutdown timeout is abandoned) and returns
    /// every kernel's full report, sorted by id. Each handle the user still holds can get its
    /// kernel's report too ([`KernelHandle::report`], or `terminate`).
    pub fn shutdown(self) -> Vec<KernelReport> {
        self.shutdown_all()
    }

    fn shutdown_all(&self) -> Vec<KernelReport> {
        let entries: Vec<Arc<dyn KernelEntry>> =
            self.core.kernels.read().values().cloned().collect();
        let t = self.shutdown_timeout;
        let drain_deadline = Instant::now().checked_add(t);
        if let Some(d) = drain_deadline {
            for e in &entries {
                e.drain_until(d);
            }
        }
        // Tell every kernel first, then wait for all of them against one deadline.
        let begun: Vec<_> = entries.iter().map(|e| e.begin()).collect();
        let deadline = resident_ring::wait::deadline_after(t);
        let mut reports: Vec<KernelReport> = entries
            .iter()
            .zip(begun)
            .filter_map(|(e, b)| e.finish(b, deadline, t))
            .collect();
        for r in &reports {
            let left = r.undelivered + r.unreceived;
            if left > 0 || r.failure.is_some() {
                tracing::warn!(kernel = %r.kernel_id, undelivered = r.undelivered,
                    unreceived = r.unreceived, failure = ?r.failure,
                    "runtime shutdown: messages handed back in the kernel's report");
            }
        }
        reports.sort_by(|a, b| a.kernel_id.cmp(&b.kernel_id));
        reports
    }
}

impl<E: Engines> Drop for Runtime<E> {
    fn drop(&mut self) {
        self.shutdown_all();
        self.core.kernels.write().clear();
    }
}

/// The engine a resolved runtime runs on (a runtime is never on `Auto`).
fn engine_of(backend: Backend) -> BackendKind {
    match backend {
        Backend::Cuda => BackendKind::Cuda,
        Backend::Wgpu => BackendKind::Wgpu,
        Backend::CudaSim => BackendKind::CudaSim,
        Backend::Cpu | Backend::Auto => BackendKind::Cpu,
    }
}
