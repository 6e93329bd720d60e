//! The baselines the wgpu benchmark (`resident-bench`'s `wgpu_ring`) measures a ring kernel
//! against: [`StatelessBatches`] (the same compiled handler, state uploaded and downloaded
//! around every batch) and [`ResidentBatches`] (the engine driven by hand, without the
//! runtime). They stay in the engine crate rather than in `resident-bench` because they are
//! built from its private internals: the compiled pipeline, its batch buffers and read-back
//! (`pipeline.rs`) and the engine itself (`engine.rs`), none of which is public API.

use crate::{padded, WgpuContext, WAIT_TIMEOUT};
use parking_lot::Mutex;
use resident_core::engine::error::{DeviceError, WgslLaunchError};
use resident_core::engine::BackendError;
use resident_core::runtime::host::device::DeviceRing;
use resident_ring::{Message, Slot};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::engine::{DeviceState, WgpuEngine};
use super::fault::WgpuFault;
use super::handler::WgslHandler;
use super::pipeline::{decode, BatchBuffers, BatchGeometry, MapResult, RingPipeline};

/// The stateless baseline the benchmark measures a ring kernel against: the same compiled
/// handler, one batch at a time, with the state uploaded before and downloaded after every
/// batch (what a kernel without device residency must do). Not a ring kernel: no queues, no
/// pipelining, no runtime.
pub struct StatelessBatches<In, Out> {
    ctx: Arc<WgpuContext>,
    pipeline: RingPipeline,
    bufs: BatchBuffers,
    state_buf: ::wgpu::Buffer,
    state_staging: ::wgpu::Buffer,
    geometry: BatchGeometry,
    host_state: Vec<u8>,
    scratch: Vec<u8>,
    _t: PhantomData<fn(In) -> Out>,
}

impl<In: Message, Out: Message> StatelessBatches<In, Out> {
    /// Compiles `handler` for batches of up to `batch` messages on the shared wgpu device.
    pub fn new(handler: &WgslHandler<In, Out>, batch: usize) -> Result<Self, WgslLaunchError> {
        let ctx = WgpuContext::shared(false)?;
        let (is, os) = (std::mem::size_of::<In>(), std::mem::size_of::<Out>());
        let geometry = BatchGeometry::new(batch, is, os);
        let pipeline =
            RingPipeline::build(&ctx, "stateless", handler, geometry.batch, is, os, &[])?;
        let state_buf = ctx.storage_buffer(
            "stateless state",
            pipeline.state_len as u64,
            ::wgpu::BufferUsages::empty(),
        )?;
        let state_staging =
            ctx.readback_buffer("stateless state staging", pipeline.state_len as u64)?;
        let bufs = pipeline.batch_buffers(&ctx, "stateless", &state_buf, &geometry)?;
        Ok(StatelessBatches {
            ctx,
            pipeline,
            bufs,
            state_buf,
            state_staging,
            geometry,
            host_state: handler.state.clone(),
            scratch: Vec::new(),
            _t: PhantomData,
        })
    }

    /// Uploads the state and `inputs`, runs the handler, downloads the outputs (appended to
    /// `out` in input order) and the state, and waits (bounded).
    pub fn run(
        &mut self,
        inputs: &[Slot<In>],
        out: &mut Vec<Slot<Out>>,
    ) -> Result<(), BackendError> {
        if inputs.len() > self.geometry.batch {
            return Err(BackendError::BadArgument {
                index: 0,
                reason: format!(
                    "{} inputs, batch size is {}",
                    inputs.len(),
                    self.geometry.batch
                ),
            });
        }
        if inputs.is_empty() {
            return Ok(());
        }
        let ctx = &self.ctx;
        ctx.write(&self.state_buf, &self.host_state);
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        self.pipeline.record(
            ctx,
            &mut enc,
            &self.bufs,
            &self.geometry,
            inputs,
            &mut self.scratch,
        );
        enc.copy_buffer_to_buffer(
            &self.state_buf,
            0,
            &self.state_staging,
            0,
            padded(self.host_state.len() as u64),
        );
        let index = ctx.queue.submit([enc.finish()]);
        let done: [MapResult; 2] = [Arc::new(Mutex::new(None)), Arc::new(Mutex::new(None))];
        for (buf, d) in [&self.bufs.staging, &self.state_staging]
            .into_iter()
            .zip(&done)
        {
            let d = d.clone();
            buf.map_async(::wgpu::MapMode::Read, .., move |r| *d.lock() = Some(r));
        }
        ctx.wait_for(Some(index), "stateless batch")?;
        let deadline = Instant::now() + WAIT_TIMEOUT;
        while done.iter().any(|d| d.lock().is_none()) {
            if Instant::now() > deadline {
                return Err(BackendError::WgpuTimeout {
                    operation: "stateless batch map",
                    waited: WAIT_TIMEOUT,
                });
            }
            ctx.wait_idle("stateless batch map")?;
        }
        for d in &done {
            if let Some(Err(e)) = d.lock().take() {
                return Err(BackendError::WgpuDevice {
                    operation: "stateless batch map",
                    reason: e.to_string(),
                });
            }
        }
        let map_err = |e: ::wgpu::MapRangeError| BackendError::WgpuDevice {
            operation: "stateless batch map",
            reason: e.to_string(),
        };
        {
            let view = self.bufs.staging.get_mapped_range(..).map_err(map_err)?;
            if self.pipeline.cut_short(&view, &self.geometry, inputs.len()) {
                drop(view);
                self.bufs.staging.unmap();
                self.state_staging.unmap();
                return Err(BackendError::WgpuDevice {
                    operation: "stateless batch",
                    reason: WgpuFault::CutShort {
                        messages: inputs.len(),
                    }
                    .to_string(),
                });
            }
            decode(&view, &self.geometry, inputs, out, &mut Vec::new());
            let sv = self.state_staging.get_mapped_range(..).map_err(map_err)?;
            let n = self.host_state.len();
            self.host_state.copy_from_slice(&sv[..n]);
        }
        self.bufs.staging.unmap();
        self.state_staging.unmap();
        Ok(())
    }

    /// The state as of the last batch (host copy).
    pub fn state(&self) -> &[u8] {
        &self.host_state
    }
}

/// The device side of a WGSL ring kernel without the runtime around it (no host mailboxes,
/// no pump thread, no call routing): the engine a `RingKernel` on wgpu runs, driven by hand.
/// It exists so the benchmark can separate what device residency and pipelining buy from
/// what the runtime's host queues cost; applications use `RingKernel::wgsl`.
pub struct ResidentBatches<In: Message, Out: Message> {
    engine: WgpuEngine<In, Out>,
    state: Arc<DeviceState>,
}

impl<In: Message, Out: Message> ResidentBatches<In, Out> {
    /// Compiles `handler` for batches of up to `batch` messages on the shared wgpu device.
    pub fn new(handler: &WgslHandler<In, Out>, batch: usize) -> Result<Self, WgslLaunchError> {
        let ctx = WgpuContext::shared(false)?;
        let (engine, state, _) = WgpuEngine::launch(ctx, "resident-batches", handler, batch, &[])?;
        Ok(ResidentBatches { engine, state })
    }

    /// Takes the longest prefix of `inputs` that fits (full batches are submitted while a
    /// batch set is free; see the [module docs](super)); returns how many were taken.
    pub fn push(&mut self, inputs: &[Slot<In>]) -> usize {
        self.engine.push(inputs)
    }

    /// Moves up to `max` outputs of completed batches to `out`, in input order, without
    /// blocking; `Err` once the device failed.
    pub fn pull(&mut self, out: &mut Vec<Slot<Out>>, max: usize) -> Result<usize, DeviceError> {
        let n = self.engine.pull(out, max);
        self.engine.check()?;
        Ok(n)
    }

    /// Waits (bounded) until every input taken so far has run and its outputs are ready.
    pub fn finish(&mut self, timeout: Duration) -> Result<(), DeviceError> {
        self.engine.terminate(timeout)
    }

    /// A copy of the device state (see `KernelHandle::snapshot_state`).
    pub fn snapshot_state(&self) -> Result<Vec<u8>, BackendError> {
        self.state.read()
    }
}
