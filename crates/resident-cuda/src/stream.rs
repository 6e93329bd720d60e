//! Streams and events: ordering, overlap and timing of device work.

use crate::device::Device;
use crate::error::Result;
use crate::result as r;
use std::sync::Arc;

/// A non-blocking CUDA stream, destroyed on drop.
pub struct Stream {
    raw: r::CUstream,
    device: Arc<Device>,
    /// From the device's spare streams ([`Stream::from_pool`]): given back on drop.
    pooled: bool,
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
            pooled: false,
        })
    }

    /// One of `device`'s spare streams, with no driver call (`cuStreamCreate` may wait for the
    /// device, see [`crate::hazards`]); `None` when it has none ([`Device::fill_streams`]).
    /// Given back to the device on drop: drop it only once its work has finished.
    #[doc(hidden)] // for the CUDA engine (`resident-engine-cuda`), not the API
    pub fn from_pool(device: &Arc<Device>) -> Option<Self> {
        device.take_stream().map(|raw| Stream {
            raw,
            device: device.clone(),
            pooled: true,
        })
    }

    /// The raw handle, for this crate's calls and for [`crate::result`]'s (tests and probes
    /// that time one driver call).
    pub fn raw(&self) -> r::CUstream {
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
        self.device
            .watch(unsafe { r::stream_synchronize(self.raw) })
    }

    /// Whether everything queued on the stream has finished (`false` while work still runs),
    /// without waiting. A device fault comes back as an error and marks the device lost.
    pub fn query(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: `raw` is live until drop; the context is current.
        self.device.watch(unsafe { r::stream_query(self.raw) })
    }

    /// Captures what `record` queues on this stream (from this thread) into a graph and
    /// instantiates it, for replay with [`Graph::launch`].
    pub fn capture(&self, record: impl FnOnce(&Stream) -> Result<()>) -> Result<Graph> {
        self.device.bind()?;
        // SAFETY: `raw` is a live stream of the current context, not the legacy default stream.
        unsafe { r::stream_begin_capture(self.raw)? };
        let recorded = record(self);
        // SAFETY: ends the capture begun above, whatever `record` did.
        let graph = unsafe { r::stream_end_capture(self.raw) };
        recorded?;
        let graph = graph?;
        // SAFETY: `graph` was just captured.
        match unsafe { r::graph_instantiate(graph) } {
            Ok(exec) => Ok(Graph {
                graph,
                exec,
                device: self.device.clone(),
            }),
            Err(e) => {
                // SAFETY: destroys the graph we own, once.
                let _ = unsafe { r::graph_destroy(graph, None) };
                Err(e)
            }
        }
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
        if self.pooled {
            // Reused by the next ring kernel: no driver call. A reset context takes its
            // streams with it.
            if self.device.is_alive() {
                self.device.give_stream(self.raw);
            }
            return;
        }
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
        self.device.watch(unsafe { r::event_synchronize(self.raw) })
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

/// A captured, instantiated CUDA graph ([`Stream::capture`]), destroyed on drop.
pub struct Graph {
    graph: cudarc::driver::sys::CUgraph,
    exec: cudarc::driver::sys::CUgraphExec,
    device: Arc<Device>,
}

// SAFETY: graph handles may be used from any thread with their context current; every method
// binds it first.
unsafe impl Send for Graph {}

impl Graph {
    /// Queues one replay of the graph on `stream`.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        self.device.bind()?;
        // SAFETY: both handles are live.
        unsafe { r::graph_launch(self.exec, stream.raw()) }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: owned handles, destroyed once.
            let _ = unsafe { r::graph_destroy(self.graph, Some(self.exec)) };
        }
    }
}
