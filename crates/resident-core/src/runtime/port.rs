//! The sending side of a kernel's input ([`InputPort`]): what handles, other kernels and
//! forwarding producers send through. It checks keys, applies the mailbox's backpressure
//! policy, and turns every refusal into a typed error that hands the message back.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use resident_ring::mailbox::{SendError, Sent};
use resident_ring::{Backpressure, Envelope, Mailbox, Message, MessageId, Slot};

use crate::runtime::ids::Ids;
use crate::state::{Error, KernelState, Op, Result, Returned};

/// What the input side needs to tell a kernel about a `call` its policy dropped.
pub(crate) trait DroppedCalls: Send + Sync {
    fn call_dropped(&self, request: &Envelope);
}

/// The sending side of a kernel's input: what handles and other kernels send through.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub struct InputPort<In> {
    pub id: Arc<str>,
    pub mailbox: Mailbox<In>,
    pub ids: Arc<Ids>,
    pub state: Arc<Mutex<KernelState>>,
    pub(crate) calls: Weak<dyn DroppedCalls>,
    /// A keyed kernel's key range: a message naming a key outside it is refused at send.
    pub(crate) keys: Option<crate::runtime::keys::KeyCheck<In>>,
    /// Where a device kernel offers producers on its device to hand it their outputs there
    /// (`RingKernel::forward_to` without a host hop); set by the kernel's device host, empty
    /// for a kernel hosted on the CPU.
    pub device_link: DeviceLinkSlot,
}

/// A kernel's device-side inbox (`RingKernel::forward_to` without a host hop): what it offers
/// producers on its device. Each device engine implements it for its own inbox (the CUDA
/// engine's peer-input slot, the wgpu engine's `link::Inbox`) and finds its own by
/// [`DeviceLink::backend`] and a downcast; a producer that finds none it can use relays
/// through the host.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
/// (The engines name it through the device host module, beside `DeviceRing`.)
pub trait DeviceLink: Send + Sync + 'static {
    /// The engine whose producers can link to it.
    fn backend(&self) -> crate::engine::BackendKind;
    /// The engine's own inbox, to downcast.
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// The slot of a kernel's [`DeviceLink`], shared by the kernel's port and its device host.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub type DeviceLinkSlot = Arc<Mutex<Option<Arc<dyn DeviceLink>>>>;

impl<In> Clone for InputPort<In> {
    fn clone(&self) -> Self {
        InputPort {
            id: self.id.clone(),
            mailbox: self.mailbox.clone(),
            ids: self.ids.clone(),
            state: self.state.clone(),
            calls: self.calls.clone(),
            keys: self.keys,
            device_link: self.device_link.clone(),
        }
    }
}

impl<In: Message> InputPort<In> {
    pub fn send(&self, msg: In, priority: u8, flags: u8, op: Op) -> Result<MessageId> {
        let id = self.ids.next();
        let mut env = Envelope::new(id, priority, self.ids.now_ns());
        env.flags = flags;
        self.send_slot(Slot::new(env, msg), op).map(|_| id)
    }

    /// Enqueues one message; `Ok(false)` when the `DropNewest` policy dropped it (counted).
    pub fn send_slot(&self, slot: Slot<In>, op: Op) -> Result<bool> {
        self.send_slot_outcome(slot, op)
            .map(|o| !matches!(o, Sent::DroppedNewest))
    }

    /// Enqueues one message and says what the drop policy did, handing back the slot a
    /// `DropOldest` send discarded (counted).
    pub fn send_slot_outcome(&self, slot: Slot<In>, op: Op) -> Result<Sent<Slot<In>>> {
        self.check_key(&slot.payload, op)?;
        match self.mailbox.send(slot) {
            Ok(Sent::Queued) => Ok(Sent::Queued),
            Ok(Sent::QueuedDroppedOldest(old)) => {
                crate::profile::dropped(&self.id, op.as_str(), "DropOldest");
                self.dropped(&old.env);
                Ok(Sent::QueuedDroppedOldest(old))
            }
            Ok(Sent::DroppedNewest) => {
                crate::profile::dropped(&self.id, op.as_str(), "DropNewest");
                self.dropped(&slot.env);
                Ok(Sent::DroppedNewest)
            }
            Err(e) => Err(self.refused(e, op)),
        }
    }

    /// Whether this is a keyed kernel's port (each message's key is checked on the host, so
    /// producers stay host-relayed).
    pub fn is_keyed(&self) -> bool {
        self.keys.is_some()
    }

    /// A keyed kernel refuses a message naming a key it does not have (nothing is queued).
    #[inline]
    pub fn check_key(&self, msg: &In, op: Op) -> Result<()> {
        match self.keys {
            Some(k) => k.check(msg).map_err(|key| Error::KeyOutOfRange {
                id: self.id.to_string(),
                op: op.as_str(),
                key: key as u64,
                keys: k.keys,
                message: Some(Returned::new(*msg)),
            }),
            None => Ok(()),
        }
    }

    /// A message the policy dropped: if it was a `call`, its caller learns at once.
    pub fn dropped(&self, env: &Envelope) {
        if env.is_call() {
            if let Some(c) = self.calls.upgrade() {
                c.call_dropped(env);
            }
        }
    }

    pub fn refused(&self, e: SendError<Slot<In>>, op: Op) -> Error {
        crate::profile::refused(&self.id, op.as_str(), &e);
        let id = self.id.to_string();
        match e {
            SendError::Full(s) => Error::QueueFull {
                id,
                op: op.as_str(),
                message: Returned::new(s.payload),
            },
            SendError::Timeout(s) => {
                let timeout = match self.mailbox.config().backpressure {
                    Backpressure::Block(t) => t,
                    _ => Duration::ZERO,
                };
                Error::Timeout {
                    id,
                    op,
                    timeout,
                    message: Some(Returned::new(s.payload)),
                }
            }
            SendError::Closed(s) => Error::NotAccepting {
                id,
                op: op.as_str(),
                state: self.state.lock().clone(),
                message: Returned::new(s.payload),
            },
        }
    }
}
