//! The checks every persistent launch makes before it touches a device, on a GPU and on CudaSim
//! alike, and the launch-per-batch kernel's scan-cell size. Kept apart from `kernel.rs`
//! (the GPU launch path, built with the `driver` feature) so CudaSim builds without the driver.

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
