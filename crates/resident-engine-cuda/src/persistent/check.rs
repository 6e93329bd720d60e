//! The checks every persistent launch makes before it touches a device, on a GPU and on CudaSim
//! alike, the wait for a launched kernel to become resident ([`wait_resident`]), and the
//! launch-per-batch kernel's scan-cell size. Kept apart from `kernel/` (the GPU launch path,
//! built with the `driver` feature) so CudaSim builds without the driver.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use super::control::{DeviceCounters, DeviceState};
use super::template::{BufferInit, KernelSource};
use super::{PersistentError, QueueConfig};

/// Everything a launch checks before touching a device, on a GPU and on CudaSim alike: message
/// sizes and alignment against the source, the initial state's size, and the queue geometry.
pub(crate) fn check_launch<In, Out>(
    source: &KernelSource,
    initial_state: &[u8],
    queues: &QueueConfig,
    buffers: &[BufferInit],
) -> Result<(), PersistentError> {
    check_sizes::<In, Out>(source)?;
    if buffers.len() != source.buffers.len() {
        return Err(PersistentError::config(format!(
            "kernel `{}`: the source declares {} bound buffers, the launch gives {}",
            source.name,
            source.buffers.len(),
            buffers.len()
        )));
    }
    for (d, b) in source.buffers.iter().zip(buffers) {
        if b.len.checked_mul(d.elem_size) != Some(b.initial.len()) {
            return Err(PersistentError::config(format!(
                "kernel `{}`: bound buffer `{}` has {} elements of {} bytes but {} initial bytes",
                source.name,
                d.name,
                b.len,
                d.elem_size,
                b.initial.len()
            )));
        }
    }
    if initial_state.len() != source.state.size {
        return Err(PersistentError::config(format!(
            "kernel `{}`: initial state is {} bytes, the state type {}",
            source.name,
            initial_state.len(),
            source.state.size
        )));
    }
    if (source.batch_size as usize) > queues.out_capacity {
        return Err(PersistentError::config(format!(
            "kernel `{}`: out_capacity {} is below the batch size {}",
            source.name, queues.out_capacity, source.batch_size
        )));
    }
    queues.validate()
}

pub(crate) fn check_sizes<In, Out>(source: &KernelSource) -> Result<(), PersistentError> {
    let (i, o) = (core::mem::size_of::<In>(), core::mem::size_of::<Out>());
    if source.input.size != i || source.output.size != o {
        return Err(PersistentError::config(format!(
            "kernel `{}`: declared sizes in {} / out {} differ from the Rust types' {i} / {o}",
            source.name, source.input.size, source.output.size
        )));
    }
    if core::mem::align_of::<In>() > 8 || core::mem::align_of::<Out>() > 8 {
        return Err(PersistentError::config(format!(
            "kernel `{}`: message types must be aligned to at most 8 bytes",
            source.name
        )));
    }
    Ok(())
}

/// Bytes of the launch-per-batch kernel's scan cells for batches of up to `max_n` messages:
/// a block ticket, then per block a "done" flag and the inclusive output count.
pub fn batch_scan_bytes(max_n: usize, block: u32) -> usize {
    4 * (1 + 2 * max_n.div_ceil(block as usize).max(1))
}

/// A kernel just launched, as [`wait_resident`] sees it: what the GPU launcher
/// (`PersistentKernel`) and CudaSim's (`SimKernel`) each provide.
pub(crate) trait Starting {
    /// The kernel's name, for errors.
    fn starting_name(&self) -> &str;
    /// The engine's own check: `Err` once the kernel faulted, its launcher is gone, a relaunch
    /// failed, or its block exited for good. A block parked by the residency rule is `Ok`.
    fn starting_check(&mut self) -> Result<(), PersistentError>;
    /// The device-written counters (the state first).
    fn starting_counters(&self) -> DeviceCounters;
    /// Waits a moment before the next look.
    fn starting_pause(&mut self);
}

/// Waits, up to `timeout`, for a kernel just launched to report that it is resident (running or
/// idle), on a GPU and on CudaSim alike.
///
/// A quiesced kernel has not failed: the residency rule (the GPU's `Device::with_quiesced`,
/// CudaSim's `with_all_quiesced`) parks every registered kernel, one still starting included,
/// around a call that waits for the whole device (another launch's module load, an allocation)
/// and relaunches it right after, over the same memory. Until the relaunched block shows its
/// state the launch waits on, as for a block that has not started yet, within its own
/// deadline ([`PersistentError::Timeout`] past it). A block that exited for good (terminated,
/// heartbeat timeout, its own error) is [`PersistentError::Exited`] at once, and a fault, a lost
/// launcher or a failed relaunch is the engine check's error.
pub(crate) fn wait_resident<K: Starting>(
    k: &mut K,
    timeout: Duration,
) -> Result<(), PersistentError> {
    let deadline = Instant::now() + timeout;
    loop {
        run_wait_hook();
        k.starting_check()?;
        let c = k.starting_counters();
        match c.state {
            Some(DeviceState::NotStarted | DeviceState::Quiesced) => {}
            Some(s) if s.has_exited() => {
                // A fault reported meanwhile is the cause, not the state it left behind.
                k.starting_check()?;
                return Err(PersistentError::Exited {
                    name: k.starting_name().to_string(),
                    state: Some(s),
                    error_code: c.error_code,
                });
            }
            // Running or idle (or a state this host does not know: the block runs).
            _ => return Ok(()),
        }
        if Instant::now() > deadline {
            return Err(PersistentError::Timeout {
                name: k.starting_name().to_string(),
                what: "the kernel to become resident",
            });
        }
        k.starting_pause();
    }
}

thread_local! {
    /// This thread's [`on_resident_wait`] hook.
    static WAIT_HOOK: RefCell<Option<Box<dyn FnMut()>>> = const { RefCell::new(None) };
}

/// Runs this thread's hook, if any (taken out while it runs, so a hook that launches a kernel
/// itself does not find it borrowed).
fn run_wait_hook() {
    let Some(mut hook) = WAIT_HOOK.with(|h| h.borrow_mut().take()) else {
        return;
    };
    hook();
    WAIT_HOOK.with(|h| {
        let mut slot = h.borrow_mut();
        if slot.is_none() {
            *slot = Some(hook);
        }
    });
}

/// Test support for the crates of this workspace: `hook` runs at the start of every round of
/// the wait of every persistent launch made on this thread (GPU and CudaSim) for its kernel to
/// become resident, before the kernel's state is read, until the returned guard drops. A test
/// parks the kernels there (the residency rule, from another thread) to make the race between
/// a launch and a quiesce deterministic.
#[doc(hidden)]
pub fn on_resident_wait(hook: impl FnMut() + 'static) -> ResidentWaitHook {
    WAIT_HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    ResidentWaitHook {
        _not_send: core::marker::PhantomData,
    }
}

/// Removes this thread's [`on_resident_wait`] hook when dropped (on the thread that set it).
#[doc(hidden)]
#[must_use = "the hook is removed when this guard drops"]
pub struct ResidentWaitHook {
    _not_send: core::marker::PhantomData<*const ()>,
}

impl Drop for ResidentWaitHook {
    fn drop(&mut self) {
        WAIT_HOOK.with(|h| h.borrow_mut().take());
    }
}
