//! Double buffering: the H2D copy of batch `i + 1` runs on one stream while batch `i` computes
//! on another. Two device buffers alternate; events order each buffer's reuse after the compute
//! that read it, and time every phase.

use crate::device::Device;
use crate::error::{CudaError, Result};
use crate::memory::DeviceBuffer;
use crate::pinned::PinnedMemory;
use crate::stream::{Event, Stream};
use std::sync::Arc;

/// Times of one [`DoubleBuffer::run`], measured with device events.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PipelineTiming {
    /// Batches processed.
    pub batches: usize,
    /// From the first copy's start to the last compute's end.
    pub total_ms: f32,
    /// Sum of the copies' durations.
    pub copy_ms: f32,
    /// Sum of the computes' durations.
    pub compute_ms: f32,
}

impl PipelineTiming {
    /// `total / (copy + compute)`: 1.0 means no overlap, 0.5 perfect overlap of equal parts.
    pub fn overlap_ratio(&self) -> f32 {
        self.total_ms / (self.copy_ms + self.compute_ms).max(f32::MIN_POSITIVE)
    }
}

/// Two device buffers, a copy stream and a compute stream.
pub struct DoubleBuffer {
    device: Arc<Device>,
    copy: Stream,
    compute: Stream,
    buffers: [DeviceBuffer; 2],
}

impl DoubleBuffer {
    /// Buffers of `batch_bytes` each on `device`.
    pub fn new(device: &Arc<Device>, batch_bytes: usize) -> Result<Self> {
        Ok(DoubleBuffer {
            device: device.clone(),
            copy: Stream::new(device)?,
            compute: Stream::new(device)?,
            buffers: [
                DeviceBuffer::alloc(device, batch_bytes)?,
                DeviceBuffer::alloc(device, batch_bytes)?,
            ],
        })
    }

    /// Bytes per batch.
    pub fn batch_bytes(&self) -> usize {
        self.buffers[0].len()
    }

    /// Copies each batch to the device and calls `compute(stream, buffer, index)` to queue its
    /// work on the compute stream (it must only queue work on that stream). Waits for the end.
    pub fn run(
        &mut self,
        batches: &[&PinnedMemory],
        mut compute: impl FnMut(&Stream, &DeviceBuffer, usize) -> Result<()>,
    ) -> Result<PipelineTiming> {
        if let Some((i, b)) = batches
            .iter()
            .enumerate()
            .find(|(_, b)| b.len() != self.batch_bytes())
        {
            return Err(CudaError::invalid(
                "DoubleBuffer::run",
                format!(
                    "batch {i} has {} bytes, buffers {}",
                    b.len(),
                    self.batch_bytes()
                ),
            ));
        }
        let ev = || Event::new(&self.device);
        let start = ev()?;
        start.record(&self.copy)?;
        let mut copies: Vec<(Event, Event)> = Vec::with_capacity(batches.len());
        let mut computes: Vec<(Event, Event)> = Vec::with_capacity(batches.len());
        for (i, batch) in batches.iter().enumerate() {
            let slot = i % 2;
            if i >= 2 {
                // The buffer is free once the compute of batch i - 2 finished reading it.
                self.copy.wait(&computes[i - 2].1)?;
            }
            let (c0, c1) = (ev()?, ev()?);
            c0.record(&self.copy)?;
            // SAFETY: `batch` is borrowed for the whole of `run`, which synchronizes both
            // streams before returning, so it stays valid and unmodified until the copy ran.
            unsafe {
                self.buffers[slot].copy_from_host_async(batch.as_bytes(), &self.copy)?;
            }
            c1.record(&self.copy)?;
            self.compute.wait(&c1)?;
            let (k0, k1) = (ev()?, ev()?);
            k0.record(&self.compute)?;
            compute(&self.compute, &self.buffers[slot], i)?;
            k1.record(&self.compute)?;
            copies.push((c0, c1));
            computes.push((k0, k1));
        }
        let end = ev()?;
        end.record(&self.compute)?;
        self.copy.synchronize()?;
        self.compute.synchronize()?;
        let mut t = PipelineTiming {
            batches: batches.len(),
            total_ms: start.elapsed_ms(&end)?,
            ..Default::default()
        };
        for (a, b) in &copies {
            t.copy_ms += a.elapsed_ms(b)?;
        }
        for (a, b) in &computes {
            t.compute_ms += a.elapsed_ms(b)?;
        }
        Ok(t)
    }
}
