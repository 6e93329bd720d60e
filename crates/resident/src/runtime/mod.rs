//! The runtime: launches ring kernels, finds them by id, reports their telemetry, and shuts
//! everything down gracefully when dropped.

pub mod context;
pub mod device;
pub mod handle;
pub mod kernel;
pub mod state;

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::RwLock;
use resident_ring::{Backpressure, Mailbox, MailboxConfig, Message, WaitStrategy};

use crate::backend::Backend;
use crate::telemetry::{RuntimeTelemetry, Telemetry};
use context::Context;
use device::CudaHandler;
use handle::{spawn_kernel, InputPort, KernelHandle, KernelShared};
use kernel::{Body, RingKernel};
use state::{Error, KernelState, Result};

/// Message ids and the clock of a runtime.
pub(crate) struct Ids {
    epoch: Instant,
    /// Bumped by every send: on its own line so readers of `epoch` (every clock read) do not
    /// pull the line away from senders.
    next: CachePadded<AtomicU64>,
}

impl Ids {
    pub fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
    /// Size of the id blocks a kernel reserves for its outputs, so its thread and the senders
    /// do not bounce the shared counter's cache line on every message.
    pub const BLOCK: u64 = 4096;
    /// The first of `n` consecutive ids.
    pub fn next_n(&self, n: u64) -> u64 {
        self.next.fetch_add(n.max(1), Ordering::Relaxed)
    }
    /// Nanoseconds since the runtime started (monotonic).
    pub fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// Type-erased view of a kernel, for the registry.
trait KernelEntry: Send + Sync {
    fn state(&self) -> KernelState;
    fn telemetry(&self) -> Telemetry;
    fn types(&self) -> (TypeId, TypeId, String);
    fn handle_any(&self) -> &(dyn Any + Send + Sync);
    fn port_any(&self) -> &(dyn Any + Send + Sync);
    /// Drains (if active, within `timeout`) then terminates; returns what was left behind.
    fn shutdown(&self, timeout: Duration) -> Option<(usize, usize)>;
}

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
    fn port_any(&self) -> &(dyn Any + Send + Sync) {
        &self.port
    }
    fn shutdown(&self, timeout: Duration) -> Option<(usize, usize)> {
        if self.handle.state() == KernelState::Active {
            let _ = self.handle.drain(timeout);
        }
        self.handle
            .terminate()
            .ok()
            .map(|r| (r.undelivered.len(), r.unreceived.len()))
    }
}

fn type_names<In, Out>() -> String {
    format!(
        "{}, {}",
        std::any::type_name::<In>(),
        std::any::type_name::<Out>()
    )
}

/// The part of a runtime that kernels reach by id.
pub(crate) struct RuntimeCore {
    ids: Arc<Ids>,
    kernels: RwLock<HashMap<String, Arc<dyn KernelEntry>>>,
    telemetry: bool,
    wait: WaitStrategy,
}

impl RuntimeCore {
    pub(crate) fn input_port<T: Message>(&self, id: &str) -> Result<InputPort<T>> {
        let kernels = self.kernels.read();
        let entry = kernels
            .get(id)
            .ok_or_else(|| Error::UnknownKernel { id: id.to_string() })?;
        entry
            .port_any()
            .downcast_ref::<InputPort<T>>()
            .cloned()
            .ok_or_else(|| Error::TypeMismatch {
                id: id.to_string(),
                expected: format!("{}, _", std::any::type_name::<T>()),
                actual: entry.types().2,
            })
    }
}

/// Configures and builds a [`Runtime`].
#[derive(Clone, Debug)]
pub struct RuntimeBuilder {
    backend: Backend,
    telemetry: bool,
    wait: WaitStrategy,
    shutdown_timeout: Duration,
    emulate_device: bool,
    profiler: Option<crate::profile::Profiler>,
}

impl RuntimeBuilder {
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

    /// Runs kernels that have a CUDA handler with an `emulate_with` twin on the emulated
    /// device (a CPU thread playing the GPU's part over the same queue memory and control
    /// block) when the runtime has no CUDA device. For testing the host side of the device
    /// protocol; not a fast path.
    pub fn device_emulation(mut self, on: bool) -> Self {
        self.emulate_device = on;
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

    /// How long dropping the runtime lets each active kernel drain (default 5 s).
    pub fn shutdown_timeout(mut self, t: Duration) -> Self {
        self.shutdown_timeout = t;
        self
    }

    /// Builds the runtime.
    pub fn build(self) -> Result<Runtime> {
        let backend = crate::backend::resolve(self.backend)?;
        Ok(Runtime {
            core: Arc::new(RuntimeCore {
                ids: Arc::new(Ids {
                    epoch: Instant::now(),
                    next: CachePadded::new(AtomicU64::new(1)),
                }),
                kernels: RwLock::new(HashMap::new()),
                telemetry: self.telemetry,
                wait: self.wait,
            }),
            backend,
            shutdown_timeout: self.shutdown_timeout,
            emulate_device: self.emulate_device,
            profiler: self.profiler,
        })
    }
}

/// Hosts ring kernels. Dropping it drains and terminates every kernel.
pub struct Runtime {
    core: Arc<RuntimeCore>,
    backend: Backend,
    shutdown_timeout: Duration,
    emulate_device: bool,
    profiler: Option<crate::profile::Profiler>,
}

impl Runtime {
    /// A builder with defaults: `Backend::Auto`, telemetry off, spin-then-park waiting.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            backend: Backend::Auto,
            telemetry: false,
            wait: WaitStrategy::default(),
            shutdown_timeout: Duration::from_secs(5),
            emulate_device: false,
            profiler: None,
        }
    }

    /// The runtime's profiler, when profiling is on.
    pub fn profiler(&self) -> Option<&crate::profile::Profiler> {
        self.profiler.as_ref()
    }

    /// The backend this runtime resolved to (`Cpu` or `Cuda`, never `Auto`).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Phase 1 of the lifecycle: allocates the kernel's queues and state and starts its thread,
    /// which handles nothing until [`KernelHandle::activate`]. Messages sent before then queue up.
    pub fn launch<In: Message, Out: Message, S: Send + 'static>(
        &self,
        kernel: RingKernel<In, Out, S>,
    ) -> Result<KernelHandle<In, Out>> {
        let t_launch = Instant::now();
        let id = kernel.id.clone();
        let invalid = |reason: &str| Error::InvalidConfig {
            id: id.clone(),
            reason: reason.to_string(),
        };
        let geometry =
            device::DeviceGeometry::new(kernel.lanes, kernel.queue_size, kernel.batch_size);
        let body = match (kernel.cuda, kernel.body) {
            (Some(cuda), _) if self.backend == Backend::Cuda => Body::Device(Box::new(
                device::GpuEngine::launch(&id, &cuda, &geometry)
                    .map_err(|e| invalid(&format!("CUDA launch failed: {e}")))?,
            )),
            (Some(CudaHandler { emulate: Some(f), .. }), _) if self.emulate_device => Body::Device(Box::new(
                device::EmulatedEngine::launch(f, &geometry).map_err(|e| invalid(&e))?,
            )),
            (_, Some(body)) => body,
            (Some(_), None) => {
                return Err(invalid(
                    "it has only a CUDA handler and this runtime has no CUDA device: add .handler(..) for the CPU, \
                     or build the runtime with device_emulation(true) and give the handler emulate_with(..)",
                ))
            }
            (None, None) => return Err(invalid("no handler: call .handler(..), .run(..) or .cuda(..)")),
        };
        if id.is_empty() {
            return Err(invalid("the id is empty"));
        }
        if kernel.batch_size == 0 {
            return Err(invalid("batch_size must be at least 1"));
        }
        let wait = kernel.wait.unwrap_or(self.core.wait);
        fn mailbox<T: Message>(
            capacity: usize,
            lanes: usize,
            backpressure: resident_ring::Backpressure,
            wait: WaitStrategy,
        ) -> std::result::Result<Mailbox<T>, String> {
            Mailbox::new(MailboxConfig {
                capacity,
                lanes,
                backpressure,
                wait,
            })
            .map_err(|e| e.to_string())
        }
        let input = mailbox::<In>(kernel.queue_size, kernel.lanes, kernel.backpressure, wait)
            .map_err(|e| invalid(&e))?;
        // Outputs never fail a handler: a full output queue makes the kernel wait in short
        // steps (so terminate is seen), unless the user chose a drop policy.
        let output_policy = match kernel.backpressure {
            p @ (Backpressure::DropOldest | Backpressure::DropNewest) => p,
            _ => Backpressure::Block(Duration::from_millis(20)),
        };
        let output = mailbox::<Out>(
            kernel.output_queue_size.unwrap_or(kernel.queue_size),
            1,
            output_policy,
            wait,
        )
        .map_err(|e| invalid(&e))?;

        let mut kernels = self.core.kernels.write();
        if let Some(existing) = kernels.get(&id) {
            let state = existing.state();
            if state != KernelState::Terminated {
                return Err(Error::DuplicateKernel { id, state });
            }
        }
        let id_arc: Arc<str> = Arc::from(id.as_str());
        let shared = Arc::new(KernelShared::new(
            id_arc.clone(),
            input,
            output,
            self.core.ids.clone(),
            wait,
            kernel.batch_size,
            self.core.telemetry,
        ));
        let ctx = Context::new(
            kernel.state,
            id_arc,
            shared.control.clone(),
            Arc::downgrade(&self.core),
        );
        crate::profile::launched(
            self.profiler.as_ref(),
            &shared.profile,
            &shared.id,
            self.core.ids.epoch,
            t_launch,
        );
        spawn_kernel(shared.clone(), ctx, body)?;
        let handle = KernelHandle {
            shared: shared.clone(),
        };
        kernels.insert(
            id,
            Arc::new(Entry {
                handle: handle.clone(),
                port: shared.port.clone(),
            }),
        );
        Ok(handle)
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

    /// Ids of every kernel launched and not replaced, sorted.
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

    /// Drains active kernels (up to the shutdown timeout each) and terminates all of them.
    /// Returns, per kernel id, how many inputs and outputs were left undelivered.
    pub fn shutdown(self) -> Vec<(String, usize, usize)> {
        self.shutdown_all()
    }

    fn shutdown_all(&self) -> Vec<(String, usize, usize)> {
        let entries: Vec<(String, Arc<dyn KernelEntry>)> = self
            .core
            .kernels
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut left = Vec::new();
        for (id, e) in entries {
            if let Some((inputs, outputs)) = e.shutdown(self.shutdown_timeout) {
                if inputs + outputs > 0 {
                    tracing::warn!(kernel = %id, inputs, outputs, "runtime shutdown left messages undelivered");
                }
                left.push((id, inputs, outputs));
            }
        }
        left.sort();
        left
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown_all();
        self.core.kernels.write().clear();
    }
}
