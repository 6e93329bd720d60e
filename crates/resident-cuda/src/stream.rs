//! Streams and events: ordering, overlap and timing of device work.

use crate::device::Device;
use crate::error::Result;
use crate::result as r;
use std::sync::Arc;

/// A non-blocking CUDA stream, destroyed on drop.
pub struct Stream {
    raw: r::CUstream,
    device: Arc<Device>,
}

// SAFETY: a stream handle may be used from any thread with its context current; every method
// binds the context first.
unsafe impl Send for Stream {}
// SAFETY: the driver serializes operations on a stream internally.
unsafe impl Sync for Stream {}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("raw", &self.raw).finish()
    }
}

impl Stream {
    /// A new stream on `device` that does not synchronize with the legacy default stream.
    pub fn new(device: &Arc<Device>) -> Result<Self> {
        device.bind()?;
        // SAFETY: the context is current.
        let raw = unsafe { r::stream_create()? };
        Ok(Stream {
            raw,
            device: device.clone(),
        })
    }

    /// The raw handle, for this crate's calls.
    pub(crate) fn raw(&self) -> r::CUstream {
        self.raw
    }

    /// The device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Waits until everything queued on the stream finished.
    pub fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: `raw` is live until drop.
        unsafe { r::stream_synchronize(self.raw) }
    }

    /// Makes work queued later on this stream wait for `event`.
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.device.bind()?;
        // SAFETY: both handles are live.
        unsafe { r::stream_wait_event(self.raw, event.raw) }
    }

    /// Records a new event at the current end of the stream.
    pub fn record(&self) -> Result<Event> {
        let e = Event::new(&self.device)?;
        e.record(self)?;
        Ok(e)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: created in `new`, destroyed once; the driver lets queued work finish.
            let _ = unsafe { r::stream_destroy(self.raw) };
        }
    }
}

/// A timing event, destroyed on drop.
pub struct Event {
    raw: r::CUevent,
    device: Arc<Device>,
}

// SAFETY: as for `Stream`.
unsafe impl Send for Event {}
// SAFETY: as for `Stream`.
unsafe impl Sync for Event {}

impl Event {
    /// A new event that records timing.
    pub fn new(device: &Arc<Device>) -> Result<Self> {
        device.bind()?;
        // SAFETY: the context is current.
        let raw = unsafe { r::event_create()? };
        Ok(Event {
            raw,
            device: device.clone(),
        })
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.device.bind()?;
        // SAFETY: both live.
        unsafe { r::event_record(self.raw, stream.raw) }
    }

    /// Waits until the work before the event finished.
    pub fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: live.
        unsafe { r::event_synchronize(self.raw) }
    }

    /// Milliseconds from `self` to `end` (both recorded; waits for `end`).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        end.synchronize()?;
        // SAFETY: both live and recorded.
        unsafe { r::event_elapsed_ms(self.raw, end.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: created in `new`, destroyed once.
            let _ = unsafe { r::event_destroy(self.raw) };
        }
    }
}
