//! The device side of a launched WGSL ring kernel ([`WgpuEngine`]): its batch sets in flight,
//! the [`DeviceRing`] the runtime's pump drives (push, pull, stop, reclaim), device-side
//! forwarding's producer and consumer ends (see `link.rs`), the kernel's state
//! ([`DeviceState`]) and its bound buffers ([`BoundBuffers`]), and why it fails
//! ([`WgpuFault`]).

use crate::{WgpuContext, WAIT_TIMEOUT};
use parking_lot::Mutex;
use resident_core::engine::error::{DeviceError, WgslLaunchError};
use resident_core::engine::{BackendError, BackendKind};
use resident_core::runtime::bind::{DeviceBinding, DeviceBuffers};
use resident_core::runtime::host::device::{DeviceRing, RingCounters};
use resident_ring::{Envelope, Message, Slot};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fault::WgpuFault;
use super::handler::WgslHandler;
use super::link;
use super::pipeline::{decode, BatchBuffers, BatchGeometry, MapResult, RingPipeline};

/// Read access to a kernel's device state, shared by the engine and the kernel's handles.
pub(crate) struct DeviceState {
    ctx: Arc<WgpuContext>,
    buffer: ::wgpu::Buffer,
    len: usize,
}

impl DeviceState {
    /// Copies the state to the host: its value after every batch submitted before this call
    /// (bounded wait).
    pub fn read(&self) -> Result<Vec<u8>, BackendError> {
        let mut v = vec![0u8; self.len];
        self.ctx.read(&mut v, &self.buffer)?;
        Ok(v)
    }
}

impl resident_core::runtime::host::device::StateSnapshot for DeviceState {
    fn read(&self) -> Result<Vec<u8>, DeviceError> {
        DeviceState::read(self).map_err(DeviceError::from)
    }
}

struct InFlight<In> {
    set: usize,
    inputs: Vec<Slot<In>>,
    /// A batch a producer handed over on the device (`set` and `inputs` unused).
    fused: Option<link::FusedBatch<In>>,
    mapped: MapResult,
    submitted: Instant,
}

/// A launched engine, its state, and its bound buffers' device copies (when any).
pub(crate) type Launched<In, Out> = (
    WgpuEngine<In, Out>,
    Arc<DeviceState>,
    Option<Arc<BoundBuffers>>,
);

/// The device side of a WGSL ring kernel (see the [module docs](super)).
pub(crate) struct WgpuEngine<In: Message, Out: Message> {
    ctx: Arc<WgpuContext>,
    pipeline: RingPipeline,
    sets: Vec<BatchBuffers>,
    free: Vec<usize>,
    in_flight: VecDeque<InFlight<In>>,
    /// Inputs taken from the pump but not yet submitted: a partial batch waits here while
    /// the device is busy (it is submitted as soon as it is full, or the device goes idle).
    pending: Vec<Slot<In>>,
    ready: VecDeque<Slot<Out>>,
    /// `call` requests the handler answered with `false`, for the pump to fail with NoReply.
    unanswered: Vec<Envelope>,
    geometry: BatchGeometry,
    /// Messages handled and batches run, shared with the links of a producer (the consumer's
    /// pump counts a producer's batches it ran there).
    counts: Arc<link::Counts>,
    failure: Option<WgpuFault>,
    scratch: Vec<u8>,
    /// The state buffer (a producer's fused batch sets bind it).
    state_buf: ::wgpu::Buffer,
    /// The kernel's io (`DeviceRing::attach`); `None` when driven by hand.
    io: Option<Arc<resident_core::runtime::io::KernelIo<In, Out>>>,
    /// As a consumer: what producers need to dispatch this kernel over their outputs
    /// (plain handlers only), and the inbox offered while the pump runs.
    consumer: Option<link::ConsumerSide>,
    inbox: Option<Arc<link::Inbox<In>>>,
    /// Of `processed`: messages producers handed over on the device.
    forwarded: u64,
    /// As a producer: the link to the `forward_to` target's inbox, while linked.
    link: Option<link::ProducerLink<In, Out>>,
    /// Batches a link gave back, oldest first: they run here before `pending`.
    backlog: VecDeque<Vec<Slot<In>>>,
    /// When the target was last looked for, and an inbox that could not be linked.
    last_probe: Option<Instant>,
    refused: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// `terminate` began: no new link.
    stopping: bool,
    /// Inputs of linked batches the device never completed (for the terminate report).
    link_failed: Vec<Slot<In>>,
    _t: PhantomData<fn() -> Out>,
}

impl<In: Message, Out: Message> WgpuEngine<In, Out> {
    /// Compiles `handler`, allocates the state and the handler's in-flight batch sets of
    /// `batch` messages.
    /// `bindings` must have passed [`check_bindings`](super::check_bindings); their device copies are created here,
    /// initialized from `DeviceBinding::initial`, and served to the host by the returned
    /// [`BoundBuffers`] (`None` without bindings).
    pub fn launch(
        ctx: Arc<WgpuContext>,
        id: &str,
        handler: &WgslHandler<In, Out>,
        batch: usize,
        bindings: &[DeviceBinding],
    ) -> Result<Launched<In, Out>, WgslLaunchError> {
        let geometry =
            BatchGeometry::new(batch, std::mem::size_of::<In>(), std::mem::size_of::<Out>());
        let mut p = RingPipeline::build(
            &ctx,
            id,
            handler,
            geometry.batch,
            std::mem::size_of::<In>(),
            std::mem::size_of::<Out>(),
            bindings,
        )?;
        let bound = match &p.bound_layout {
            Some(layout) => {
                let b = BoundBuffers::create(&ctx, id, layout, bindings)?;
                p.bound = Some(b.group.clone());
                Some(Arc::new(b))
            }
            None => None,
        };
        let state_buf = ctx.storage_buffer(
            "resident state",
            p.state_len as u64,
            ::wgpu::BufferUsages::empty(),
        )?;
        ctx.write(&state_buf, &handler.state);
        let consumer = if p.plain() {
            let source = handler.module_source_with(bindings)?
                + &link::linked_entry(handler.workgroup, &handler.function);
            Some(link::ConsumerSide {
                source,
                state: state_buf.clone(),
                bound_layout: p.bound_layout.clone(),
                bound: p.bound.clone(),
                workgroup: handler.workgroup,
                bound_count: bindings.len(),
                out_size: std::mem::size_of::<Out>() as u64,
            })
        } else {
            None
        };
        let mut sets = Vec::with_capacity(handler.in_flight);
        for _ in 0..handler.in_flight {
            sets.push(p.batch_buffers(&ctx, id, &state_buf, &geometry)?);
        }
        let state = Arc::new(DeviceState {
            ctx: ctx.clone(),
            buffer: state_buf.clone(),
            len: p.state_len,
        });
        let free = (0..sets.len()).rev().collect();
        Ok((
            WgpuEngine {
                ctx,
                pipeline: p,
                sets,
                free,
                in_flight: VecDeque::new(),
                pending: Vec::new(),
                ready: VecDeque::new(),
                unanswered: Vec::new(),
                geometry,
                counts: Arc::default(),
                failure: None,
                scratch: Vec::new(),
                state_buf,
                io: None,
                consumer,
                inbox: None,
                forwarded: 0,
                link: None,
                backlog: VecDeque::new(),
                last_probe: None,
                refused: None,
                stopping: false,
                link_failed: Vec::new(),
                _t: PhantomData,
            },
            state,
            bound,
        ))
    }
}

/// The device copies of a ring kernel's bound buffers: one storage buffer each, alive as long
/// as the kernel (and as long as a handle reading them), bound as group 1.
///
/// # How host access is synchronized with the kernel
/// Every batch of the kernel is one submission on the device's single queue, and the queue
/// runs submissions in order. A host [`read`](DeviceBuffers::read) submits a copy of the
/// buffer into a staging buffer on that queue: it runs after every batch submitted before it
/// and before every batch submitted after it, so the copy is the buffer **between two
/// batches** (never torn by one in flight), then maps it with a bounded wait. A host
/// [`write`](DeviceBuffers::write) is a `queue.write_buffer`, which wgpu orders before every
/// later submission: the next batch sees the whole write, the batches already submitted do
/// not see any of it.
pub(crate) struct BoundBuffers {
    ctx: Arc<WgpuContext>,
    /// Name, device buffer and byte length (the buffer may be padded past it).
    buffers: Vec<(String, ::wgpu::Buffer, usize)>,
    group: ::wgpu::BindGroup,
}

impl BoundBuffers {
    fn create(
        ctx: &Arc<WgpuContext>,
        id: &str,
        layout: &::wgpu::BindGroupLayout,
        bindings: &[DeviceBinding],
    ) -> Result<Self, WgslLaunchError> {
        let mut buffers = Vec::with_capacity(bindings.len());
        for b in bindings {
            let err = |source| WgslLaunchError::BoundBuffer {
                name: b.name.clone(),
                source,
            };
            let bytes = b.len as u64 * b.elem.size as u64;
            // A runtime-sized array binds at least one element: an empty buffer is padded
            // (the handler uses `<name>_len`, which stays 0).
            let buf = ctx
                .storage_buffer(
                    &b.name,
                    bytes.max(b.elem.size as u64),
                    ::wgpu::BufferUsages::empty(),
                )
                .map_err(err)?;
            ctx.write(&buf, &b.initial);
            buffers.push((b.name.clone(), buf, bytes as usize));
        }
        let group = ctx.scoped("create bound-buffer bind group", || {
            let entries: Vec<_> = buffers
                .iter()
                .enumerate()
                .map(|(i, (_, b, _))| ::wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: b.as_entire_binding(),
                })
                .collect();
            ctx.device.create_bind_group(&::wgpu::BindGroupDescriptor {
                label: Some(id),
                layout,
                entries: &entries,
            })
        })?;
        Ok(BoundBuffers {
            ctx: ctx.clone(),
            buffers,
            group,
        })
    }

    fn get(&self, index: usize, len: usize) -> Result<&::wgpu::Buffer, DeviceError> {
        let Some((name, buf, bytes)) = self.buffers.get(index) else {
            return Err(DeviceError::Binding {
                name: format!("#{index}"),
                reason: format!("the kernel has {} bound buffers", self.buffers.len()),
            });
        };
        if len != *bytes {
            return Err(DeviceError::Binding {
                name: name.clone(),
                reason: format!("{len} bytes given, the buffer holds {bytes}"),
            });
        }
        Ok(buf)
    }
}

impl DeviceBuffers for BoundBuffers {
    fn read(&self, index: usize, out: &mut [u8]) -> Result<(), DeviceError> {
        let buf = self.get(index, out.len())?;
        // Submitted behind every batch already submitted (see the type's docs); bounded wait.
        self.ctx.read(out, buf).map_err(DeviceError::from)
    }

    fn write(&self, index: usize, data: &[u8]) -> Result<(), DeviceError> {
        let buf = self.get(index, data.len())?;
        // Ordered before every later submission, so before the kernel's next batch; the empty
        // submission sends it now rather than with that batch.
        self.ctx.write(buf, data);
        self.ctx.queue.submit([]);
        self.ctx.check().map_err(DeviceError::from)
    }
}

impl<In: Message, Out: Message> WgpuEngine<In, Out> {
    fn submit(
        &mut self,
        set: usize,
        chunk: Vec<Slot<In>>,
    ) -> Result<(), (BackendError, Vec<Slot<In>>)> {
        let bufs = &self.sets[set];
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        self.pipeline.record(
            &self.ctx,
            &mut enc,
            bufs,
            &self.geometry,
            &chunk,
            &mut self.scratch,
        );
        self.ctx.queue.submit([enc.finish()]);
        let mapped: MapResult = Arc::new(Mutex::new(None));
        let m = mapped.clone();
        bufs.staging
            .map_async(::wgpu::MapMode::Read, .., move |r| *m.lock() = Some(r));
        if let Err(e) = self.ctx.check() {
            return Err((e, chunk));
        }
        self.in_flight.push_back(InFlight {
            set,
            inputs: chunk,
            fused: None,
            mapped,
            submitted: Instant::now(),
        });
        Ok(())
    }

    /// Publishes every completed batch at the front, in order. `Err` on a failed map or a
    /// batch past its deadline.
    fn collect(&mut self) -> Result<(), WgpuFault> {
        while let Some(front) = self.in_flight.front() {
            let r = front.mapped.lock().take();
            match r {
                None => {
                    if front.submitted.elapsed() > WAIT_TIMEOUT {
                        return Err(WgpuFault::BatchTimeout(WAIT_TIMEOUT));
                    }
                    return Ok(());
                }
                Some(Err(e)) => return Err(WgpuFault::ReadBack(e)),
                Some(Ok(())) => {}
            }
            let mut f = self.in_flight.pop_front().expect("front exists");
            if let Some(mut b) = f.fused.take() {
                // A producer's batch and this kernel's dispatch over its outputs.
                match b.staging.get_mapped_range(..) {
                    Ok(view) => {
                        let handled = link::decode_fused(&view, b.layout, &b.envs, &mut self.ready);
                        b.done.ran(&view, b.layout);
                        // Counted before the outputs become visible (the pump stores
                        // counters first).
                        self.counts.add(handled);
                        self.forwarded += handled;
                    }
                    Err(e) => {
                        f.fused = Some(b);
                        self.in_flight.push_front(f);
                        return Err(WgpuFault::MapRange(e));
                    }
                }
                b.staging.unmap();
                b.done.finish();
                continue;
            }
            let bufs = &self.sets[f.set];
            match bufs.staging.get_mapped_range(..) {
                Ok(view)
                    if self
                        .pipeline
                        .cut_short(&view, &self.geometry, f.inputs.len()) =>
                {
                    let n = f.inputs.len();
                    drop(view);
                    // The batch goes back whole through `reclaim_input` (its first messages did run).
                    self.in_flight.push_front(f);
                    return Err(WgpuFault::CutShort { messages: n });
                }
                Ok(view) => {
                    // Counted before the outputs become visible (the pump stores counters
                    // first).
                    self.counts.add(f.inputs.len() as u64);
                    decode(
                        &view,
                        &self.geometry,
                        &f.inputs,
                        &mut self.ready,
                        &mut self.unanswered,
                    );
                }
                Err(e) => {
                    // Keep the batch so `reclaim_input` hands its inputs back.
                    self.in_flight.push_front(f);
                    return Err(WgpuFault::MapRange(e));
                }
            }
            bufs.staging.unmap();
            self.free.push(f.set);
        }
        Ok(())
    }

    /// Batches of this kernel handed to a consumer and not yet run or given back.
    fn link_outstanding(&self) -> usize {
        self.link.as_ref().map_or(0, |l| l.outstanding())
    }

    /// Nothing of this kernel on the device: a partial batch may go.
    fn idle(&self) -> bool {
        self.in_flight.is_empty() && self.link_outstanding() == 0
    }

    /// Submits the pending inputs (after any batches a link gave back): handed to the linked
    /// consumer, or on this kernel's own batch sets. `false` when they cannot go now (no
    /// free set, or the other route still has batches of this kernel on the device: the two
    /// never run batches of one kernel at once, so its state sees them in order), or the
    /// submission failed (then the inputs stay for `reclaim_input`).
    fn flush(&mut self) -> bool {
        self.absorb_link();
        if self.failure.is_some() {
            return self.pending.is_empty() && self.backlog.is_empty();
        }
        while !self.backlog.is_empty() {
            if self.link_outstanding() > 0 {
                return false;
            }
            let Some(set) = self.free.pop() else {
                return false;
            };
            let chunk = self.backlog.pop_front().expect("not empty");
            if !self.submit_own(set, chunk, true) {
                return false;
            }
        }
        if self.pending.is_empty() {
            return true;
        }
        if self.link.is_none() && self.in_flight.is_empty() && self.ready.is_empty() {
            self.probe_link();
        }
        if let Some(l) = self.link.as_mut() {
            if l.closing {
                // Unlinked once its batches are back or done (`absorb_link`).
                return false;
            }
            if !self.in_flight.is_empty() {
                return false;
            }
            let chunk =
                std::mem::replace(&mut self.pending, Vec::with_capacity(self.geometry.batch));
            return match l.hand_over(
                &self.ctx,
                &self.pipeline,
                &self.geometry,
                chunk,
                &mut self.scratch,
            ) {
                Ok(()) => true,
                Err(chunk) => {
                    // No free fused set (the consumer is behind), or the inbox closed (then
                    // the chunk is in the link's returned batches, empty here).
                    if !chunk.is_empty() {
                        self.pending = chunk;
                    }
                    false
                }
            };
        }
        let Some(set) = self.free.pop() else {
            return false;
        };
        let chunk = std::mem::replace(&mut self.pending, Vec::with_capacity(self.geometry.batch));
        self.submit_own(set, chunk, false)
    }

    /// Submits `chunk` on batch set `set`; on failure the chunk goes back where it came from.
    fn submit_own(&mut self, set: usize, chunk: Vec<Slot<In>>, from_backlog: bool) -> bool {
        match self.submit(set, chunk) {
            Ok(()) => true,
            Err((e, chunk)) => {
                self.free.push(set);
                if from_backlog {
                    self.backlog.push_front(chunk);
                } else {
                    self.pending = chunk;
                }
                self.fail(WgpuFault::Device(Arc::new(e)));
                false
            }
        }
    }

    /// Links to the `forward_to` target's inbox when there is one this kernel can hand its
    /// batches to (see `link`'s docs); looked for at most every `PROBE_EVERY`.
    fn probe_link(&mut self) {
        if self.stopping || self.link.is_some() || self.failure.is_some() || !self.pipeline.plain()
        {
            return;
        }
        let Some(io) = &self.io else {
            return;
        };
        let Some(f) = io.forward_target() else {
            return;
        };
        if f.path() == resident_core::runtime::kernel::ForwardPath::HostRelay {
            return;
        }
        if self.last_probe.is_some_and(|t| t.elapsed() < PROBE_EVERY) {
            return;
        }
        self.last_probe = Some(Instant::now());
        let Ok(port) = f.port() else {
            return;
        };
        let Some(any) = port
            .device_link
            .lock()
            .clone()
            .filter(|l| l.backend() == BackendKind::Wgpu)
            .map(|l| l.into_any())
        else {
            return;
        };
        if self.refused.as_ref().is_some_and(|r| Arc::ptr_eq(r, &any)) {
            return;
        }
        let Ok(inbox) = any.clone().downcast::<link::Inbox<Out>>() else {
            return;
        };
        if inbox.is_closed() {
            // The target is terminating; a relaunched one is looked up anew.
            f.forget();
            return;
        }
        if !Arc::ptr_eq(&inbox.ctx, &self.ctx) {
            return;
        }
        // Outputs relayed before now are in the target's queue: they go first (barrier).
        let barrier = port.mailbox.counters().accepted;
        match link::ProducerLink::new(
            &self.ctx,
            &self.pipeline,
            &self.state_buf,
            &self.geometry,
            inbox,
            io.clone(),
            self.counts.clone(),
            self.sets.len(),
            barrier,
        ) {
            Ok(l) => self.link = Some(l),
            Err(_) => self.refused = Some(any),
        }
    }

    /// Takes back what the link returned (batches the consumer gave back, into `backlog`;
    /// inputs of batches the device never completed, with the fault), and unlinks once the
    /// inbox closed and no batch of this kernel is out.
    fn absorb_link(&mut self) {
        let Some(l) = self.link.as_mut() else {
            return;
        };
        if !l.closing && l.inbox_closed() {
            l.closing = true;
        }
        self.backlog.extend(l.take_returned());
        let (mut failed, fault) = l.take_failed();
        self.link_failed.append(&mut failed);
        if l.closing && l.outstanding() == 0 {
            // Late returns (a batch given back while we looked) are taken before unlinking.
            self.backlog.extend(l.take_returned());
            let (mut failed, _) = l.take_failed();
            self.link_failed.append(&mut failed);
            self.link = None;
            if let Some(f) = self.io.as_ref().and_then(|io| io.forward_target()) {
                f.forget();
            }
        }
        if let Some(fault) = fault {
            self.fail(fault);
        }
    }

    fn fail(&mut self, reason: WgpuFault) {
        if self.failure.is_none() {
            self.failure = Some(reason);
        }
    }
}

/// How often a producer whose target has no inbox (yet) looks again.
const PROBE_EVERY: Duration = Duration::from_millis(20);

/// How long a consumer's pump waits for the producer's batch at the front of its in-flight
/// list before it goes on with its loop (new inputs, lifecycle flags).
const FUSED_WAIT: Duration = Duration::from_micros(500);

/// Fused batches a consumer keeps in flight besides its own batch sets.
const FUSED_IN_FLIGHT: usize = 4;

impl<In: Message, Out: Message> DeviceRing<In, Out> for WgpuEngine<In, Out> {
    fn push(&mut self, slots: &[Slot<In>]) -> usize {
        // Full batches go out while a batch set is free; a partial batch waits while the
        // device is busy (it fills up meanwhile, which is what throughput needs) and goes at
        // once when the device is idle (which is what latency needs).
        let mut taken = 0;
        while self.failure.is_none() {
            if self.pending.len() >= self.geometry.batch {
                if !self.flush() {
                    break;
                }
                continue;
            }
            if taken == slots.len() {
                break;
            }
            let n = (self.geometry.batch - self.pending.len()).min(slots.len() - taken);
            self.pending.extend_from_slice(&slots[taken..taken + n]);
            taken += n;
        }
        if self.idle() {
            self.flush();
        }
        taken
    }

    fn pull(&mut self, out: &mut Vec<Slot<Out>>, max: usize) -> usize {
        if self.ready.is_empty() && !self.in_flight.is_empty() && self.failure.is_none() {
            // Runs the map callbacks of whatever has completed. A producer's batch at the
            // front is waited for briefly (bounded by `FUSED_WAIT`): nothing but this pump
            // polls for it, and its producer waits for the batch set it frees, so sleeping
            // blind (the pump's idle backoff) would add that sleep to every forwarded batch.
            //
            // Polled, not `PollType::Wait` with a timeout: wgpu-core 30 asserts (panics) when
            // a wait that timed out meets another thread's submission half published (seen
            // here with several pumps submitting at once).
            let fused_front = self.in_flight.front().is_some_and(|f| f.fused.is_some());
            let wait = fused_front
                && self
                    .io
                    .as_ref()
                    .is_none_or(|io| io.input_queue().is_empty());
            let until = Instant::now() + FUSED_WAIT;
            loop {
                if let Err(e) = self.ctx.device.poll(::wgpu::PollType::Poll) {
                    self.fail(WgpuFault::Poll(Arc::new(e)));
                    break;
                }
                let done = self
                    .in_flight
                    .front()
                    .is_none_or(|f| f.mapped.lock().is_some());
                if !wait || done || Instant::now() >= until {
                    break;
                }
                std::thread::sleep(Duration::from_micros(20));
            }
            if let Err(e) = self.collect() {
                self.fail(e);
            }
        }
        // A partial batch goes only when nothing of this kernel is on the device (linked or
        // not), as in `push`; batches a link gave back go as soon as they can.
        self.absorb_link();
        if !self.backlog.is_empty() || self.idle() {
            self.flush();
        }
        if let Some(l) = &self.link {
            // A whole batch waits for a fused set the consumer has not freed yet: wait for
            // it (bounded) instead of spinning on the full input queue.
            if self.pending.len() >= self.geometry.batch && self.ready.is_empty() {
                l.wait_free(FUSED_WAIT);
            }
        }
        let n = self.ready.len().min(max);
        out.extend(self.ready.drain(..n));
        n
    }

    fn set_active(&mut self, _on: bool) -> Result<(), DeviceError> {
        // Nothing runs on the device between batches: the pump stops feeding when inactive.
        Ok(())
    }

    fn heartbeat(&mut self) {}

    fn check(&mut self) -> Result<(), DeviceError> {
        if let Err(e) = self.ctx.check() {
            self.fail(WgpuFault::Device(Arc::new(e)));
        }
        self.absorb_link();
        match &self.failure {
            Some(f) => Err(DeviceError::Fault(Arc::new(f.clone()))),
            None => Ok(()),
        }
    }

    fn counters(&self) -> RingCounters {
        RingCounters {
            // Batches first: see `store_counters`.
            batches: self.counts.batches.load(Ordering::Relaxed),
            processed: self.counts.processed.load(Ordering::Acquire),
            lost: 0,
            forwarded: self.forwarded,
        }
    }

    fn terminate(&mut self, timeout: Duration) -> Result<(), DeviceError> {
        // Finish the batches in flight so their outputs are published (bounded).
        let deadline = Instant::now() + timeout.min(WAIT_TIMEOUT);
        self.stopping = true;
        // As a consumer: no more batches from producers; those not taken go back to them.
        if let Some(inbox) = self.inbox.take() {
            if let Some(io) = &self.io {
                let mut slot = io.device_link().lock();
                let ours = link::erase(inbox.clone());
                if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, &ours)) {
                    *slot = None;
                }
            }
            inbox.close();
            self.inbox = Some(inbox);
        }
        // As a producer: batches the consumer has not taken come back and run here.
        if let Some(l) = self.link.as_mut() {
            l.withdraw();
        }
        // The pending partial batch is "in hand": it runs too.
        self.flush();
        while (!self.in_flight.is_empty()
            || !self.pending.is_empty()
            || !self.backlog.is_empty()
            || self.link.is_some())
            && self.failure.is_none()
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.fail(WgpuFault::StopTimeout(timeout));
                break;
            }
            if self.in_flight.is_empty() {
                // Only the consumer's pump completes this kernel's linked batches.
                std::thread::sleep(Duration::from_micros(200));
            } else {
                let r = self.ctx.device.poll(::wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: Some(left.min(Duration::from_millis(100))),
                });
                if let Err(e) = r {
                    if !matches!(e, ::wgpu::PollError::Timeout) {
                        self.fail(WgpuFault::Poll(Arc::new(e)));
                    }
                }
            }
            if let Err(e) = self.ctx.check() {
                self.fail(WgpuFault::Device(Arc::new(e)));
            }
            if let Err(e) = self.collect() {
                self.fail(e);
            }
            self.flush();
        }
        match &self.failure {
            Some(f) => Err(DeviceError::Fault(Arc::new(f.clone()))),
            None => Ok(()),
        }
    }

    fn take_unanswered_calls(&mut self, out: &mut Vec<Envelope>) {
        out.append(&mut self.unanswered);
    }

    fn reclaim_input(&mut self) -> Vec<Slot<In>> {
        // Batches that never completed (device lost or timed out) and inputs never submitted:
        // they come back, in the order they were taken. A producer's batch this kernel
        // submitted goes back to that producer's report (and fails it with this fault).
        self.absorb_link();
        let fault = self
            .failure
            .clone()
            .unwrap_or(WgpuFault::StopTimeout(Duration::ZERO));
        let mut v: Vec<Slot<In>> = std::mem::take(&mut self.link_failed);
        for mut f in self.in_flight.drain(..) {
            match f.fused.take() {
                Some(b) => b.done.failed(fault.clone()),
                None => v.append(&mut f.inputs),
            }
        }
        v.extend(self.backlog.drain(..).flatten());
        v.append(&mut self.pending);
        v
    }

    fn attach(&mut self, io: &Arc<resident_core::runtime::io::KernelIo<In, Out>>) {
        self.io = Some(io.clone());
        // A kernel whose own outputs are forwarded takes no batches on the device: its
        // outputs would otherwise leave by two routes (see `link`).
        if io.forward_target().is_none() {
            if let Some(side) = self.consumer.take() {
                let inbox = Arc::new(link::Inbox::new(
                    self.ctx.clone(),
                    side,
                    io.input_queue().clone(),
                ));
                *io.device_link().lock() = Some(link::erase(inbox.clone()));
                self.inbox = Some(inbox);
            }
        }
    }

    fn take_forwarded(&mut self, unpushed: usize) -> usize {
        let Some(inbox) = self.inbox.clone() else {
            return 0;
        };
        if self.failure.is_some() || self.stopping {
            return 0;
        }
        // This kernel's pending inputs first (the barrier counts them as submitted).
        if !self.pending.is_empty() && (!self.flush() || !self.pending.is_empty()) {
            return 0;
        }
        // Messages taken from the queue and submitted (or dropped by its policy): a batch's
        // barrier is passed once everything accepted before it was linked is among them.
        let taken = self.io.as_ref().map_or(u64::MAX, |io| {
            let c = io.input_queue().counters();
            (c.delivered + c.dropped).saturating_sub(unpushed as u64)
        });
        let mut n = 0;
        while self.in_flight.len() < self.sets.len() + FUSED_IN_FLIGHT {
            let Some(mut b) = inbox.next(taken) else {
                break;
            };
            let commands = b.commands.take().expect("a fused batch is submitted once");
            self.ctx.queue.submit([commands]);
            let mapped: MapResult = Arc::new(Mutex::new(None));
            let m = mapped.clone();
            b.staging
                .map_async(::wgpu::MapMode::Read, .., move |r| *m.lock() = Some(r));
            n += b.envs.len();
            self.in_flight.push_back(InFlight {
                set: usize::MAX,
                inputs: Vec::new(),
                fused: Some(b),
                mapped,
                submitted: Instant::now(),
            });
            if let Err(e) = self.ctx.check() {
                self.fail(WgpuFault::Device(Arc::new(e)));
                break;
            }
        }
        n
    }

    fn forwarded_waiting(&self) -> bool {
        self.inbox.as_ref().is_some_and(|i| i.waiting())
    }
}
