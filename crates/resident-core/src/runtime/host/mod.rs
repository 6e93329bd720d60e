//! The ring-host seam: "host this ring kernel's handler somewhere".
//!
//! The runtime keeps everything a message passes through on the host in one place,
//! [`KernelIo`]: mailbox lanes, the call table, stranded and unreceived messages, metrics, and
//! the one publish path for outputs. A backend implements [`RingHost`]: on the kernel's host
//! thread it takes batches from `KernelIo`, runs the handler (on this thread, or on a device it
//! drives), gives the results back through its one `Publisher`, and reports counters and
//! faults. Lifecycle flags, lane mapping, envelope stamping, wait-for-exit and terminate
//! accounting live above this seam, once.
//!
//! Hosts: `cpu` (the handler on a host thread) and [`device`] (a pump feeding a
//! [`DeviceRing`](device::DeviceRing): a persistent CUDA kernel, CudaSim, or wgpu; the
//! engines launch theirs through [`crate::engine`]).

pub(crate) mod cpu;
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub mod device;

use std::sync::Arc;

use resident_ring::{Message, Writer};

use crate::runtime::io::KernelIo;
use crate::runtime::publisher::Publisher;
use crate::state::{Error, Result};

/// Hosts one ring kernel. `run` is called once, on the kernel's own host thread, right after
/// launch, with the kernel's one [`Publisher`]; it returns when the kernel terminates or fails
/// (having called [`KernelIo::fail`] for a failure). It must see `io.terminating()` promptly,
/// publish only through its `Publisher`, and hand every input it took but did not handle back
/// with [`KernelIo::strand`] or [`KernelIo::fail`].
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub trait RingHost<In: Message, Out: Message>: Send + 'static {
    fn run(self: Box<Self>, io: &Arc<KernelIo<In, Out>>, out: Publisher<In, Out>);
    /// Called once on the launching thread, before the host thread starts and before the
    /// kernel can be found by id: whatever producers must find the moment they find the kernel
    /// (a device kernel's peer-input slot, `device::DeviceHost`).
    fn publish(&self, _io: &Arc<KernelIo<In, Out>>) {}
    /// Whether `run` only hands the kernel to whoever drives it from outside the engine
    /// (`RingKernel::run_outside`) and returns: no host thread is started then, `run` is
    /// called on the launching thread, and the driver reports the exit itself.
    fn threadless(&self) -> bool {
        false
    }
}

/// Starts the kernel's host thread, which waits for `activate` before handling anything.
pub(crate) fn spawn<In: Message, Out: Message>(
    io: Arc<KernelIo<In, Out>>,
    host: Box<dyn RingHost<In, Out>>,
    output: Writer<Out>,
) -> Result<()> {
    host.publish(&io);
    let io2 = io.clone();
    let publisher = Publisher::new(io.clone(), output);
    if host.threadless() {
        *io.outside_thread.lock() = Some(std::thread::current().id());
        host.run(&io2, publisher);
        return Ok(());
    }
    let handle = std::thread::Builder::new()
        .name(format!("resident:{}", io.id))
        .spawn(move || {
            *io2.thread_id.lock() = Some(std::thread::current().id());
            host.run(&io2, publisher);
            io2.host_exited();
        })
        .map_err(|source| Error::Spawn {
            id: io.id.to_string(),
            source,
        })?;
    *io.thread.lock() = Some(handle);
    Ok(())
}

/// Text of a panic payload.
pub(crate) fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
