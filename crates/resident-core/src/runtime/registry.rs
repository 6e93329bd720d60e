//! The part of a runtime that kernels reach by id: the live kernels, type-erased
//! ([`KernelEntry`]), and a bounded record of the ones that ended. Kernels find forward targets
//! and other kernels' input ports here; a terminated kernel retires itself here.

use std::any::Any;
use std::any::TypeId;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use resident_ring::{Message, WaitStrategy};

use crate::runtime::ids::Ids;
use crate::runtime::port::InputPort;
use crate::runtime::report::KernelReport;
use crate::state::{Error, Failure, KernelState, Result};
use crate::telemetry::Telemetry;

/// Type-erased view of a kernel, for the registry.
pub(crate) trait KernelEntry: Send + Sync {
    fn state(&self) -> KernelState;
    fn telemetry(&self) -> Telemetry;
    fn types(&self) -> (TypeId, TypeId, String);
    fn handle_any(&self) -> &(dyn Any + Send + Sync);
    /// The kernel's `KernelIo`, as an address: tells a relaunched id from the kernel before.
    fn io_addr(&self) -> usize;
    fn port_any(&self) -> &(dyn Any + Send + Sync);
    /// Drains, if active, until `deadline`.
    fn drain_until(&self, deadline: Instant);
    /// First half of terminate; `None` when already terminated (the kept report comes from
    /// `finish`).
    fn begin(&self) -> Option<Option<Failure>>;
    /// Second half of terminate (or the kept report).
    fn finish(
        &self,
        begun: Option<Option<Failure>>,
        deadline: Option<Instant>,
        timeout: Duration,
    ) -> Option<KernelReport>;
}

/// How many terminated kernels' ids and final states a runtime remembers
/// ([`Runtime::recently_terminated`](crate::runtime::Runtime::recently_terminated)).
pub const RECENT_KERNELS: usize = 256;

/// The part of a runtime that kernels reach by id.
pub(crate) struct RuntimeCore {
    pub(crate) ids: Arc<Ids>,
    /// Live kernels (launched, not yet terminated) by id. A terminated kernel leaves at once:
    /// its handles keep its report, the runtime only its id and final state in `recent`.
    pub(crate) kernels: RwLock<HashMap<String, Arc<dyn KernelEntry>>>,
    /// Kernels entered into `kernels` so far (bumped under its write lock, after the entry):
    /// a producer whose forward target was missing looks it up again as soon as this changes
    /// ([`Forward::registrations`](crate::runtime::io::Forward::registrations)).
    pub(crate) registered: Arc<AtomicU64>,
    /// Ids and final states of the last [`RECENT_KERNELS`] terminated kernels, oldest first.
    pub(crate) recent: parking_lot::Mutex<std::collections::VecDeque<(String, KernelState)>>,
    pub(crate) telemetry: bool,
    pub(crate) wait: WaitStrategy,
    pub(crate) terminate_timeout: Duration,
}

impl RuntimeCore {
    /// Forgets a terminated kernel: removes it from the live map (if the entry under its id is
    /// still this kernel, `io_addr`, and not a later launch of the same id) and keeps a
    /// bounded record of its id and final state.
    pub(crate) fn retire(&self, id: &str, io_addr: usize, state: KernelState) {
        {
            let mut kernels = self.kernels.write();
            if kernels.get(id).is_some_and(|e| e.io_addr() == io_addr) {
                kernels.remove(id);
            }
        }
        let mut recent = self.recent.lock();
        if recent.len() == RECENT_KERNELS {
            recent.pop_front();
        }
        recent.push_back((id.to_string(), state));
    }

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
