//! Device-side forwarding between two WGSL ring kernels (`RingKernel::forward_to` on wgpu).
//!
//! # What runs where
//! The *producer* (the kernel with `forward_to`) and the *consumer* (its target) are WGSL ring
//! kernels on the runtime's one wgpu device. Instead of submitting a batch on its own, reading
//! its outputs back and sending them into the consumer's input queue, the producer's pump
//! records one command buffer holding
//!
//! 1. its own dispatch over the batch (its pipeline, its state, its bound buffers),
//! 2. the consumer's dispatch over the producer's output buffer (the consumer's *linked*
//!    entry point: the producer's keep flags gate which slots run, a slot whose request was a
//!    `call` to the producer is skipped, its reply goes to the caller), against the
//!    consumer's state and bound buffers,
//! 3. the copies of the consumer's outputs and keep flags, and of the producer's keep flags
//!    (and, only when the batch holds `call`s, the producer's outputs) into one staging buffer,
//!
//! and hands it to the consumer's [`Inbox`]. The consumer's pump submits it, on the device's
//! one queue, between its own batches (so the consumer's state and bound buffers see its
//! host-fed batches and the forwarded ones one after another, never concurrently), reads the
//! consumer's outputs back and publishes them through the consumer's own `Publisher` (its host
//! thread owns it). The producer's outputs never come back to the host.
//!
//! # Why the consumer submits
//! The consumer's lifecycle decides when it handles messages: an inactive consumer takes no
//! batch (the producer runs out of fused batch sets and waits: backpressure, nothing dropped),
//! a terminating consumer closes its inbox and gives the batches it has not submitted back to
//! their producer, which runs them itself and relays their outputs through the host (as
//! without a link: into a relaunched target, or into the producer's terminate report). The
//! consumer's outputs are published in submission order by the only thread that may publish
//! them. The producer only records; all of its dispatches go through the link while it is
//! linked, so its own state also sees its batches in order.
//!
//! # Accounting
//! A batch belongs to exactly one place at a time: the producer's pending inputs, the inbox
//! (`outstanding`), the consumer's in-flight list (`outstanding`), or, once run, the counters
//! of both kernels (the producer's `processed`, the consumer's `processed` and
//! `forwarded_on_device`). A batch the inbox gives back returns to the producer whole; a batch
//! submitted to a device that then fails goes to the producer's `failed` list, which the
//! producer's terminate report hands back (and the producer fails with the same fault).
//!
//! # Order
//! Batches leave the producer in order and the inbox is FIFO. When a producer links while
//! outputs it relayed through the host are still in the consumer's input queue, its first
//! batch carries a barrier (the queue's accepted count at that moment): the consumer submits
//! it only after taking that many messages from its queue, so those earlier outputs are
//! handled first.
//!
//! # What links
//! Both kernels plain WGSL ring kernels (one invocation per message: not `in_order`, not
//! keyed), the consumer without a `forward_to` of its own (so a kernel's outputs never take
//! two routes), the producer without `ForwardPath::HostRelay`, and the consumer's linked entry point
//! within the adapter's storage-buffer limit. Anything else forwards through the host.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};
use resident_ring::{Envelope, Mailbox, Message, Slot};

use super::fault::WgpuFault;
use super::pipeline::{BatchBuffers, BatchGeometry, RingPipeline};
use crate::{padded, WgpuContext};
use resident_core::engine::{BackendError, BackendKind};
use resident_core::runtime::host::device::DeviceLink;
use resident_core::runtime::io::KernelIo;

/// Why a producer could not link to its target on the device (it then forwards through the
/// host, which needs none of this).
#[derive(Clone, Debug, thiserror::Error)]
pub(super) enum LinkError {
    /// The linked entry point binds more storage buffers than the adapter allows.
    #[error("the linked entry point needs {needed} storage buffers, the adapter binds {max}")]
    StorageBuffers {
        /// Needed.
        needed: u64,
        /// The adapter's limit.
        max: u64,
    },
    /// The device refused a pipeline or a buffer.
    #[error(transparent)]
    Device(Arc<BackendError>),
}

/// The consumer's linked entry point: the plain entry point gated by the producer's keep
/// flags (binding 6) and by the envelope (message id 0: the slot answered a `call` to the
/// producer).
pub(super) fn linked_entry(workgroup: u32, function: &str) -> String {
    format!(
        r#"
// Device-side forwarding: this kernel's dispatch over a producer's outputs.
@group(0) @binding(6) var<storage, read> resident_gate: array<u32>;
@compute @workgroup_size({workgroup})
fn resident_main_linked(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let i = gid.x;
    if (i >= resident_count.x) {{ return; }}
    let id = resident_env[i].message_id;
    if (resident_gate[i] != 1u || (id.x == 0u && id.y == 0u)) {{
        resident_keep[i] = 0u;
        return;
    }}
    var out: ResidentOut;
    let keep = {function}(resident_in[i], &out, resident_env[i]);
    resident_out[i] = out;
    resident_keep[i] = select(0u, 1u, keep);
}}
"#
    )
}

/// What the consumer's side of a fused batch needs to build its pipeline.
pub(super) struct ConsumerSide {
    /// The consumer's module with [`linked_entry`] appended.
    pub source: String,
    pub state: ::wgpu::Buffer,
    pub bound_layout: Option<::wgpu::BindGroupLayout>,
    pub bound: Option<::wgpu::BindGroup>,
    pub workgroup: u32,
    /// Bound buffers (group 1), for the storage-buffer limit.
    pub bound_count: usize,
    pub out_size: u64,
}

/// The consumer's linked pipeline and its group-0 layout.
#[derive(Clone)]
pub(super) struct LinkedPipeline {
    pub pipeline: ::wgpu::ComputePipeline,
    pub layout: ::wgpu::BindGroupLayout,
}

/// Where producers hand a consumer their fused batches (see the module docs). Registered in
/// the consumer's `InputPort::device_link` while its pump runs.
pub(crate) struct Inbox<CIn> {
    pub(super) ctx: Arc<WgpuContext>,
    pub(super) side: ConsumerSide,
    linked: OnceLock<Result<LinkedPipeline, LinkError>>,
    queue: Mutex<InboxQueue<CIn>>,
    /// The consumer's input queue: its pump sleeps on it, so a hand-over wakes it there.
    wake: Mailbox<CIn>,
}

struct InboxQueue<CIn> {
    batches: VecDeque<FusedBatch<CIn>>,
    closed: bool,
}

impl<CIn: Message> Inbox<CIn> {
    pub(super) fn new(ctx: Arc<WgpuContext>, side: ConsumerSide, wake: Mailbox<CIn>) -> Self {
        Inbox {
            ctx,
            side,
            linked: OnceLock::new(),
            queue: Mutex::new(InboxQueue {
                batches: VecDeque::new(),
                closed: false,
            }),
            wake,
        }
    }

    /// The consumer's linked pipeline, built by the first producer that links (`Err` with
    /// the reason when the device refuses it: the producer then forwards through the host).
    pub(super) fn pipeline(&self) -> Result<LinkedPipeline, LinkError> {
        self.linked
            .get_or_init(|| {
                let ctx = &self.ctx;
                let storage = 6 + self.side.bound_count as u64;
                let max = ctx.limits.max_storage_buffers_per_shader_stage as u64;
                if storage > max {
                    return Err(LinkError::StorageBuffers {
                        needed: storage,
                        max,
                    });
                }
                let read = ::wgpu::BufferBindingType::Storage { read_only: true };
                let mut entries = super::pipeline::batch_layout_entries().to_vec();
                // The producer's outputs, read by the consumer's dispatch.
                entries.push(super::pipeline::buffer_entry(6, read));
                // On naga's stack: wgpu parses and writes out the WGSL (see
                // `RingPipeline::build`).
                crate::wgsl::on_naga_stack(|| {
                    ctx.scoped("create linked pipeline", || {
                        let module =
                            ctx.device
                                .create_shader_module(::wgpu::ShaderModuleDescriptor {
                                    label: Some("resident linked"),
                                    source: ::wgpu::ShaderSource::Wgsl(
                                        self.side.source.as_str().into(),
                                    ),
                                });
                        let layout = ctx.device.create_bind_group_layout(
                            &::wgpu::BindGroupLayoutDescriptor {
                                label: Some("resident linked"),
                                entries: &entries,
                            },
                        );
                        let pl =
                            ctx.device
                                .create_pipeline_layout(&::wgpu::PipelineLayoutDescriptor {
                                    label: Some("resident linked"),
                                    bind_group_layouts: &[
                                        Some(&layout),
                                        self.side.bound_layout.as_ref(),
                                    ],
                                    immediate_size: 0,
                                });
                        let pipeline = ctx.device.create_compute_pipeline(
                            &::wgpu::ComputePipelineDescriptor {
                                label: Some("resident linked"),
                                layout: Some(&pl),
                                module: &module,
                                entry_point: Some("resident_main_linked"),
                                compilation_options: Default::default(),
                                cache: None,
                            },
                        );
                        LinkedPipeline { pipeline, layout }
                    })
                })
                .map_err(|e| LinkError::Device(Arc::new(e)))
            })
            .clone()
    }

    /// Whether the consumer stopped taking batches.
    pub(super) fn is_closed(&self) -> bool {
        self.queue.lock().closed
    }

    /// Queues a batch; `Err` gives it back when the consumer has closed the inbox (moved
    /// back whole, once per closed link: no reason to box it).
    #[allow(clippy::result_large_err)]
    fn offer(&self, batch: FusedBatch<CIn>) -> Result<(), FusedBatch<CIn>> {
        {
            let mut q = self.queue.lock();
            if q.closed {
                return Err(batch);
            }
            q.batches.push_back(batch);
        }
        self.wake.notify_receivers();
        Ok(())
    }

    /// The next batch, if its barrier is passed (`taken`: messages the consumer has taken
    /// from its input queue).
    pub(super) fn next(&self, taken: u64) -> Option<FusedBatch<CIn>> {
        let mut q = self.queue.lock();
        match q.batches.front() {
            Some(b) if b.barrier <= taken => q.batches.pop_front(),
            _ => None,
        }
    }

    /// Whether a batch waits.
    pub(super) fn waiting(&self) -> bool {
        !self.queue.lock().batches.is_empty()
    }

    /// The consumer stops: no more batches; those not taken go back to their producers.
    pub(super) fn close(&self) {
        let back: Vec<_> = {
            let mut q = self.queue.lock();
            q.closed = true;
            q.batches.drain(..).collect()
        };
        for b in back {
            b.done.returned();
        }
    }

    /// A producer stops: its batches not taken come back to it (in order).
    fn withdraw(&self, producer: usize) {
        let back: VecDeque<_> = {
            let mut q = self.queue.lock();
            let (mine, rest): (VecDeque<_>, VecDeque<_>) =
                q.batches.drain(..).partition(|b| b.producer == producer);
            q.batches = rest;
            mine
        };
        for b in back {
            b.done.returned();
        }
    }
}

/// Where the consumer's part of a fused batch lands in its staging buffer.
#[derive(Clone, Copy)]
pub(super) struct StagingLayout {
    pub c_keep: u64,
    pub p_keep: u64,
    pub p_out: u64,
}

/// One fused batch on its way from a producer to the device (see the module docs).
pub(crate) struct FusedBatch<CIn> {
    /// The recorded producer and consumer dispatches and copies (taken at submission).
    pub(super) commands: Option<::wgpu::CommandBuffer>,
    pub(super) staging: ::wgpu::Buffer,
    pub(super) layout: StagingLayout,
    /// The consumer's input envelopes, one per producer slot (message id 0: not forwarded).
    pub(super) envs: Vec<Envelope>,
    /// Messages the consumer must have taken from its input queue before this batch runs.
    pub(super) barrier: u64,
    pub(super) producer: usize,
    pub(super) done: Box<dyn ProducerDone>,
    _t: std::marker::PhantomData<fn(CIn)>,
}

/// The producer's side of a fused batch, type-erased over the producer's input type.
pub(super) trait ProducerDone: Send {
    /// The batch ran: the producer's bookkeeping from the mapped staging buffer (its keep
    /// flags, and the replies to `call`s).
    fn ran(&mut self, view: &[u8], layout: StagingLayout);
    /// After `ran` and the staging buffer's unmap: the batch set is free again.
    fn finish(self: Box<Self>);
    /// Never submitted: the inputs go back to the producer.
    fn returned(self: Box<Self>);
    /// Submitted, never completed (the device failed): the inputs go to the producer's
    /// terminate report and the producer fails with `fault`.
    fn failed(self: Box<Self>, fault: WgpuFault);
}

/// A fused batch set: the producer's batch buffers, the consumer's, and one staging buffer.
struct FusedSet {
    p: BatchBuffers,
    c_env: ::wgpu::Buffer,
    c_out: ::wgpu::Buffer,
    c_keep: ::wgpu::Buffer,
    c_count: ::wgpu::Buffer,
    c_group: ::wgpu::BindGroup,
    staging: ::wgpu::Buffer,
}

/// A kernel's handled messages and batches, shared by its engine and the links it hands
/// batches over (the consumer's pump counts the producer's batches it ran).
#[derive(Default)]
pub(crate) struct Counts {
    pub processed: AtomicU64,
    pub batches: AtomicU64,
}

impl Counts {
    /// One batch of `n` messages done; returns the new total. Batches first: a reader that
    /// sees a message processed sees its batch counted.
    pub(super) fn add(&self, n: u64) -> u64 {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.processed.fetch_add(n, Ordering::AcqRel) + n
    }
}

/// What producer and consumer share about a link.
pub(super) struct LinkShared<PIn> {
    /// Free fused sets, and the condition a producer without one waits on.
    free: Mutex<Vec<usize>>,
    freed: Condvar,
    /// The producer's counts.
    counts: Arc<Counts>,
    /// Batches handed to the inbox and neither finished, returned nor failed.
    pub outstanding: AtomicUsize,
    /// Batches given back unsubmitted, with their sequence number.
    returned: Mutex<Vec<(u64, Vec<Slot<PIn>>)>>,
    /// Inputs of batches the device never completed, and why.
    failed: Mutex<(Vec<Slot<PIn>>, Option<WgpuFault>)>,
}

/// The producer's bookkeeping for one fused batch.
struct Done<PIn, POut> {
    shared: Arc<LinkShared<PIn>>,
    io: Arc<KernelIo<PIn, POut>>,
    set: usize,
    seq: u64,
    inputs: Vec<Slot<PIn>>,
}

impl<PIn: Message, POut: Message> ProducerDone for Done<PIn, POut> {
    fn ran(&mut self, view: &[u8], layout: StagingLayout) {
        let io = &*self.io;
        let now = io.now_ns();
        let osz = std::mem::size_of::<POut>();
        // Outputs the consumer's dispatch took on the device (`KernelHandle::forwarding`).
        let mut handed = 0u64;
        for (i, s) in self.inputs.iter().enumerate() {
            let at = layout.p_keep as usize + 4 * i;
            let kept = view[at..at + 4] == 1u32.to_le_bytes();
            if s.env.is_call() {
                // The reply goes to its caller, as the producer's publisher would send it.
                let out = kept.then(|| {
                    let o = layout.p_out as usize + i * osz;
                    bytemuck::pod_read_unaligned::<POut>(&view[o..o + osz])
                });
                io.record_latency(s.env.timestamp_ns, now);
                io.reply(s.env, out);
            } else if kept {
                handed += 1;
                io.record_latency(s.env.timestamp_ns, now);
            }
        }
        io.count_forwarded_on_device(handed);
        let total = self.shared.counts.add(self.inputs.len() as u64);
        // The producer's telemetry now, not when its pump next stores its counters: the
        // consumer publishes this batch's outputs next, and whoever sees one sees the
        // producer's message counted (`store_counters` only raises these values too).
        io.raise_done(self.shared.counts.batches.load(Ordering::Relaxed), total);
    }

    fn finish(self: Box<Self>) {
        self.shared.free.lock().push(self.set);
        self.shared.outstanding.fetch_sub(1, Ordering::AcqRel);
        self.shared.freed.notify_all();
    }

    fn returned(self: Box<Self>) {
        let Done {
            shared,
            set,
            seq,
            inputs,
            ..
        } = *self;
        shared.returned.lock().push((seq, inputs));
        shared.free.lock().push(set);
        shared.outstanding.fetch_sub(1, Ordering::AcqRel);
        shared.freed.notify_all();
    }

    fn failed(self: Box<Self>, fault: WgpuFault) {
        let Done {
            shared,
            set,
            mut inputs,
            ..
        } = *self;
        {
            let mut f = shared.failed.lock();
            f.0.append(&mut inputs);
            f.1.get_or_insert(fault);
        }
        shared.free.lock().push(set);
        shared.outstanding.fetch_sub(1, Ordering::AcqRel);
        shared.freed.notify_all();
    }
}

/// A producer's link to one consumer's inbox (owned by the producer's engine).
pub(super) struct ProducerLink<PIn: Message, POut: Message> {
    inbox: Arc<Inbox<POut>>,
    linked: LinkedPipeline,
    sets: Vec<FusedSet>,
    pub shared: Arc<LinkShared<PIn>>,
    io: Arc<KernelIo<PIn, POut>>,
    seq: u64,
    /// The barrier of the next batch (only the first batch after linking has one).
    barrier: u64,
    /// The inbox closed (or this producer stops): no more hand-overs.
    pub closing: bool,
}

impl<PIn: Message, POut: Message> ProducerLink<PIn, POut> {
    /// Links to `inbox`: builds `depth` fused batch sets over the producer's `pipeline` and
    /// the consumer's linked pipeline. `barrier`: the consumer's input queue's accepted count
    /// now.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        ctx: &WgpuContext,
        pipeline: &RingPipeline,
        p_state: &::wgpu::Buffer,
        geometry: &BatchGeometry,
        inbox: Arc<Inbox<POut>>,
        io: Arc<KernelIo<PIn, POut>>,
        counts: Arc<Counts>,
        depth: usize,
        barrier: u64,
    ) -> Result<Self, LinkError> {
        let linked = inbox.pipeline()?;
        let b = geometry.batch as u64;
        let none = ::wgpu::BufferUsages::empty();
        let co = inbox.side.out_size;
        let layout = staging_layout(geometry, co);
        let mut sets = Vec::with_capacity(depth);
        for _ in 0..depth {
            let p = pipeline
                .batch_buffers(ctx, "resident fused", p_state, geometry)
                .map_err(|e| LinkError::Device(Arc::new(e)))?;
            let mk = |label, bytes| ctx.storage_buffer(label, bytes, none);
            let c_env =
                mk("resident fused env", b * 32).map_err(|e| LinkError::Device(Arc::new(e)))?;
            let c_out =
                mk("resident fused out", b * co).map_err(|e| LinkError::Device(Arc::new(e)))?;
            let c_keep =
                mk("resident fused keep", b * 4).map_err(|e| LinkError::Device(Arc::new(e)))?;
            let staging = ctx
                .readback_buffer(
                    "resident fused staging",
                    layout.p_out + b * geometry.out_size,
                )
                .map_err(|e| LinkError::Device(Arc::new(e)))?;
            let c_count = ctx
                .scoped("create uniform", || {
                    ctx.device.create_buffer(&::wgpu::BufferDescriptor {
                        label: Some("resident fused count"),
                        size: 16,
                        usage: ::wgpu::BufferUsages::UNIFORM | ::wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    })
                })
                .map_err(|e| LinkError::Device(Arc::new(e)))?;
            let c_group = ctx
                .scoped("create linked bind group", || {
                    let bufs = [
                        &p.out,
                        &c_env,
                        &c_out,
                        &c_keep,
                        &inbox.side.state,
                        &c_count,
                        &p.keep,
                    ];
                    let entries: Vec<_> = bufs
                        .iter()
                        .enumerate()
                        .map(|(i, b)| ::wgpu::BindGroupEntry {
                            binding: i as u32,
                            resource: b.as_entire_binding(),
                        })
                        .collect();
                    ctx.device.create_bind_group(&::wgpu::BindGroupDescriptor {
                        label: Some("resident linked"),
                        layout: &linked.layout,
                        entries: &entries,
                    })
                })
                .map_err(|e| LinkError::Device(Arc::new(e)))?;
            sets.push(FusedSet {
                p,
                c_env,
                c_out,
                c_keep,
                c_count,
                c_group,
                staging,
            });
        }
        let shared = Arc::new(LinkShared {
            free: Mutex::new((0..depth).rev().collect()),
            freed: Condvar::new(),
            counts,
            outstanding: AtomicUsize::new(0),
            returned: Mutex::new(Vec::new()),
            failed: Mutex::new((Vec::new(), None)),
        });
        Ok(ProducerLink {
            inbox,
            linked,
            sets,
            shared,
            io,
            seq: 0,
            barrier,
            closing: false,
        })
    }

    /// Whether the consumer closed its inbox.
    pub(super) fn inbox_closed(&self) -> bool {
        self.inbox.is_closed()
    }

    fn producer(&self) -> usize {
        Arc::as_ptr(&self.shared) as *const () as usize
    }

    /// Records `chunk` as one fused batch and hands it to the consumer. `Err` gives the
    /// chunk back: no free fused set (the consumer is behind: backpressure) or the inbox
    /// closed (then `closing` is set).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hand_over(
        &mut self,
        ctx: &WgpuContext,
        pipeline: &RingPipeline,
        geometry: &BatchGeometry,
        chunk: Vec<Slot<PIn>>,
        scratch: &mut Vec<u8>,
    ) -> Result<(), Vec<Slot<PIn>>> {
        if self.closing || chunk.is_empty() {
            return Err(chunk);
        }
        if self.inbox.is_closed() {
            self.closing = true;
            return Err(chunk);
        }
        let Some(set) = self.shared.free.lock().pop() else {
            return Err(chunk);
        };
        let n = chunk.len();
        let fs = &self.sets[set];
        let layout = staging_layout(geometry, self.inbox.side.out_size);
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        pipeline.upload_and_dispatch(ctx, &mut enc, &fs.p, &chunk, scratch);
        // The consumer's envelopes, stamped as the producer's publisher stamps an output
        // (fresh id, correlation id = the request's id, its priority and flags, now); a slot
        // that answers a `call` to the producer gets id 0 (the linked entry point skips it).
        let now = self.io.now_ns();
        let first = self.io.next_ids(n as u64);
        let has_calls = chunk.iter().any(|s| s.env.is_call());
        let envs: Vec<Envelope> = chunk
            .iter()
            .enumerate()
            .map(|(i, s)| Envelope {
                message_id: if s.env.is_call() { 0 } else { first + i as u64 },
                correlation_id: s.env.message_id,
                timestamp_ns: now,
                priority: s.env.priority,
                flags: s.env.flags,
                ..Default::default()
            })
            .collect();
        scratch.clear();
        for e in &envs {
            scratch.extend_from_slice(bytemuck::bytes_of(e));
        }
        ctx.write(&fs.c_env, scratch);
        ctx.write(&fs.c_count, bytemuck::bytes_of(&[n as u32, 0, 0, 0]));
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.linked.pipeline);
            pass.set_bind_group(0, &fs.c_group, &[]);
            if let Some(g) = &self.inbox.side.bound {
                pass.set_bind_group(1, g, &[]);
            }
            pass.dispatch_workgroups((n as u32).div_ceil(self.inbox.side.workgroup), 1, 1);
        }
        let co = self.inbox.side.out_size;
        enc.copy_buffer_to_buffer(&fs.c_out, 0, &fs.staging, 0, padded(n as u64 * co));
        enc.copy_buffer_to_buffer(&fs.c_keep, 0, &fs.staging, layout.c_keep, n as u64 * 4);
        enc.copy_buffer_to_buffer(&fs.p.keep, 0, &fs.staging, layout.p_keep, n as u64 * 4);
        if has_calls {
            let po = n as u64 * geometry.out_size;
            enc.copy_buffer_to_buffer(&fs.p.out, 0, &fs.staging, layout.p_out, padded(po));
        }
        let seq = self.seq;
        self.seq += 1;
        let batch = FusedBatch {
            commands: Some(enc.finish()),
            staging: fs.staging.clone(),
            layout,
            envs,
            barrier: std::mem::take(&mut self.barrier),
            producer: self.producer(),
            done: Box::new(Done {
                shared: self.shared.clone(),
                io: self.io.clone(),
                set,
                seq,
                inputs: chunk,
            }),
            _t: std::marker::PhantomData,
        };
        self.shared.outstanding.fetch_add(1, Ordering::AcqRel);
        match self.inbox.offer(batch) {
            Ok(()) => Ok(()),
            Err(batch) => {
                self.closing = true;
                batch.done.returned();
                // The inputs are now in `returned`; the caller takes them from there.
                Err(Vec::new())
            }
        }
    }

    /// The producer stops handing over: batches the consumer has not taken come back.
    pub(super) fn withdraw(&mut self) {
        self.closing = true;
        self.inbox.withdraw(self.producer());
    }

    /// Batches given back, oldest first.
    pub(super) fn take_returned(&self) -> Vec<Vec<Slot<PIn>>> {
        let mut r = std::mem::take(&mut *self.shared.returned.lock());
        r.sort_by_key(|(seq, _)| *seq);
        r.into_iter().map(|(_, v)| v).collect()
    }

    /// Inputs of batches the device never completed, and the fault (taken once).
    pub(super) fn take_failed(&self) -> (Vec<Slot<PIn>>, Option<WgpuFault>) {
        std::mem::take(&mut *self.shared.failed.lock())
    }

    /// Waits (at most `max`) until a fused set is free or nothing is out; a producer whose
    /// consumer is behind waits here rather than spinning on its full input queue.
    pub(super) fn wait_free(&self, max: std::time::Duration) {
        let mut free = self.shared.free.lock();
        if free.is_empty() && !self.closing {
            self.shared.freed.wait_for(&mut free, max);
        }
    }

    pub(super) fn outstanding(&self) -> usize {
        self.shared.outstanding.load(Ordering::Acquire)
    }
}

/// The fused staging buffer: consumer outputs, consumer keep flags, producer keep flags,
/// producer outputs (the last only copied for batches with `call`s).
fn staging_layout(geometry: &BatchGeometry, c_out_size: u64) -> StagingLayout {
    let b = geometry.batch as u64;
    let c_keep = padded(b * c_out_size);
    let p_keep = c_keep + padded(b * 4);
    let p_out = p_keep + padded(b * 4);
    StagingLayout {
        c_keep,
        p_keep,
        p_out,
    }
}

/// Decodes the consumer's part of a completed fused batch: outputs (request envelope
/// convention, as `decode`), and how many slots the consumer handled.
pub(super) fn decode_fused<Out: Message>(
    view: &[u8],
    layout: StagingLayout,
    envs: &[Envelope],
    out: &mut VecDeque<Slot<Out>>,
) -> u64 {
    let osz = std::mem::size_of::<Out>();
    let mut handled = 0;
    for (i, e) in envs.iter().enumerate() {
        let p = layout.p_keep as usize + 4 * i;
        if e.message_id == 0 || view[p..p + 4] != 1u32.to_le_bytes() {
            continue;
        }
        handled += 1;
        let k = layout.c_keep as usize + 4 * i;
        if view[k..k + 4] == [0, 0, 0, 0] {
            continue;
        }
        let payload: Out = bytemuck::pod_read_unaligned(&view[i * osz..(i + 1) * osz]);
        out.push_back(Slot::new(
            Envelope {
                correlation_id: e.message_id,
                ..*e
            },
            payload,
        ));
    }
    handled
}

impl<CIn: Message> DeviceLink for Inbox<CIn> {
    fn backend(&self) -> BackendKind {
        BackendKind::Wgpu
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// The form registered in `InputPort::device_link`.
pub(crate) fn erase<CIn: Message>(inbox: Arc<Inbox<CIn>>) -> Arc<dyn DeviceLink> {
    inbox
}
