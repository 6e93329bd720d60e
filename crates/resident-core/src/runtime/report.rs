//! [`KernelReport`]: a kernel's [`TerminateReport`] without its message types, as returned by
//! [`Runtime::shutdown`](crate::runtime::Runtime::shutdown) for kernels of any types.

use std::any::Any;

use resident_ring::{Envelope, Message};

use crate::state::Failure;

/// Where a kernel's handler runs ([`KernelHandle::placement`](crate::runtime::handle::KernelHandle::placement)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// A host thread runs the CPU closure.
    Host,
    /// The device of this backend runs the device handler.
    Device(crate::engine::BackendKind),
}

/// What `terminate` found: counts, and every message that was not delivered, so nothing is
/// lost silently.
#[derive(Debug, Clone)]
pub struct TerminateReport<In, Out> {
    /// Kernel id.
    pub kernel_id: String,
    /// Messages the handler finished.
    pub processed: u64,
    /// Messages discarded by a drop policy, late replies and outputs of an abandoned handler
    /// (counted, as in telemetry).
    pub dropped: u64,
    /// Inputs not handled because their deadline (a `call`'s timeout, a send's TTL) had passed
    /// when the kernel took them (counted, as `messages_expired` in telemetry).
    pub expired: u64,
    /// Inputs accepted but never handled (still queued, or stranded by a failure), with their
    /// envelopes: stranded ones first, then the queue highest priority first.
    pub undelivered: Vec<(Envelope, In)>,
    /// Outputs produced but never received.
    pub unreceived: Vec<(Envelope, Out)>,
    /// The failure, if the kernel failed (a panic, a device fault, a handler that did not
    /// return in time), and the message whose handling failed.
    pub failure: Option<(Failure, Option<(Envelope, In)>)>,
}

impl<In, Out> TerminateReport<In, Out> {
    /// Messages this report hands back (undelivered inputs, unreceived outputs, the failed
    /// message).
    pub fn returned(&self) -> usize {
        self.undelivered.len()
            + self.unreceived.len()
            + self
                .failure
                .as_ref()
                .map_or(0, |(_, m)| usize::from(m.is_some()))
    }
}

/// One kernel's terminate report, with counts readable without knowing its message types and
/// the full typed report inside ([`KernelReport::typed`], [`KernelReport::into_typed`]).
pub struct KernelReport {
    /// Kernel id.
    pub kernel_id: String,
    /// Messages the handler finished.
    pub processed: u64,
    /// Messages counted as dropped (policy, late replies).
    pub dropped: u64,
    /// Inputs not handled because their deadline passed before the kernel took them.
    pub expired: u64,
    /// Inputs handed back (never handled).
    pub undelivered: usize,
    /// Outputs handed back (never received).
    pub unreceived: usize,
    /// The failure, if the kernel failed or was abandoned.
    pub failure: Option<crate::state::Failure>,
    report: Box<dyn Any + Send>,
}

impl std::fmt::Debug for KernelReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelReport")
            .field("kernel_id", &self.kernel_id)
            .field("processed", &self.processed)
            .field("dropped", &self.dropped)
            .field("expired", &self.expired)
            .field("undelivered", &self.undelivered)
            .field("unreceived", &self.unreceived)
            .field("failure", &self.failure)
            .finish()
    }
}

impl KernelReport {
    pub(crate) fn new<In: Message, Out: Message>(r: TerminateReport<In, Out>) -> Self {
        KernelReport {
            kernel_id: r.kernel_id.clone(),
            processed: r.processed,
            dropped: r.dropped,
            expired: r.expired,
            undelivered: r.undelivered.len(),
            unreceived: r.unreceived.len(),
            failure: r.failure.as_ref().map(|(reason, _)| reason.clone()),
            report: Box::new(r),
        }
    }

    /// The typed report, if the kernel's messages are `In` and `Out`.
    pub fn typed<In: Message, Out: Message>(&self) -> Option<&TerminateReport<In, Out>> {
        self.report.downcast_ref()
    }

    /// The typed report, or `self` back if the types are not `In` and `Out`.
    pub fn into_typed<In: Message, Out: Message>(self) -> Result<TerminateReport<In, Out>, Self> {
        if self.report.is::<TerminateReport<In, Out>>() {
            Ok(*self.report.downcast().expect("type checked just above"))
        } else {
            Err(self)
        }
    }
}
