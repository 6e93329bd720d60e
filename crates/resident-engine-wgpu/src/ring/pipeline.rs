//! A compiled WGSL ring-kernel module and its batches: the pipeline and bind-group layouts
//! ([`RingPipeline`]), one set of batch buffers ([`BatchBuffers`]), how a batch is uploaded,
//! dispatched and copied into staging, and how its outputs are read back in input order
//! ([`decode`]). The engine, device forwarding and the baselines build on these.

use crate::oneshot::{check_grid, check_workgroup};
use crate::wgsl::{compile, Compiled, WgslError};
use crate::{padded, WgpuContext};
use parking_lot::Mutex;
use resident_core::engine::error::WgslLaunchError;
use resident_core::engine::BackendError;
use resident_core::runtime::bind::DeviceBinding;
use resident_ring::{Envelope, Message, Slot};
use std::borrow::Cow;
use std::sync::Arc;

use super::handler::{WgslHandler, CUT_SHORT};
use super::keyed;

pub(super) struct BatchBuffers {
    pub(super) input: ::wgpu::Buffer,
    pub(super) env: ::wgpu::Buffer,
    pub(super) out: ::wgpu::Buffer,
    pub(super) keep: ::wgpu::Buffer,
    /// A keyed pipeline's links (binding 6).
    pub(super) links: Option<::wgpu::Buffer>,
    pub(super) count: ::wgpu::Buffer,
    pub(super) staging: ::wgpu::Buffer,
    pub(super) group: ::wgpu::BindGroup,
}

pub(super) type MapResult = Arc<Mutex<Option<Result<(), ::wgpu::BufferAsyncError>>>>;

pub(super) fn layout_check(
    compiled: &Compiled,
    ty: &str,
    rust: usize,
) -> Result<(), WgslLaunchError> {
    match compiled.type_size(ty) {
        Some(w) if w as usize == rust => Ok(()),
        Some(w) => Err(WgslLaunchError::LayoutMismatch {
            ty: ty.to_string(),
            wgsl: w,
            rust,
        }),
        None => Err(WgslLaunchError::Compile(WgslError {
            stage: "layout",
            message: format!("type `{ty}` not found in the compiled module"),
            line: None,
            column: None,
        })),
    }
}

/// A compiled WGSL ring-kernel module: its pipeline, bind-group layouts and state size.
pub(super) struct RingPipeline {
    pub(super) pipeline: ::wgpu::ComputePipeline,
    pub(super) layout: ::wgpu::BindGroupLayout,
    /// Group 1 (the bound buffers), when there are any.
    pub(super) bound_layout: Option<::wgpu::BindGroupLayout>,
    /// Group 1's bind group (set once the buffers exist).
    pub(super) bound: Option<::wgpu::BindGroup>,
    pub(super) state_len: usize,
    pub(super) workgroup: u32,
    pub(super) in_order: bool,
    /// A keyed handler: where its batches' keys are, to link each key's messages (binding 6;
    /// see `keyed.rs`). A leader cut short marks its own keep flag.
    pub(super) keyed: Option<keyed::KeyedBatches>,
}

impl RingPipeline {
    /// Compiles the handler's module and builds its pipeline, on naga's stack
    /// ([`crate::wgsl::NAGA_STACK_BYTES`]: wgpu parses the WGSL again and its backend writes it
    /// out, both recursing over the source's expressions as naga's checks do).
    pub(super) fn build<In, Out>(
        ctx: &WgpuContext,
        id: &str,
        handler: &WgslHandler<In, Out>,
        batch: usize,
        in_size: usize,
        out_size: usize,
        bindings: &[DeviceBinding],
    ) -> Result<Self, WgslLaunchError> {
        crate::wgsl::on_naga_stack(|| {
            Self::build_here(ctx, id, handler, batch, in_size, out_size, bindings)
        })
    }

    fn build_here<In, Out>(
        ctx: &WgpuContext,
        id: &str,
        handler: &WgslHandler<In, Out>,
        batch: usize,
        in_size: usize,
        out_size: usize,
        bindings: &[DeviceBinding],
    ) -> Result<Self, WgslLaunchError> {
        ctx.check()?;
        handler.check_atomics(bindings)?;
        let source = handler.module_source_with(bindings)?;
        let compiled = compile(&source)?;
        layout_check(&compiled, &handler.names.0, in_size)?;
        layout_check(&compiled, &handler.names.1, out_size)?;
        let (_, _, state_len) = handler.state_decl.clone()?;
        layout_check(&compiled, "ResidentState", state_len)?;
        check_workgroup(ctx, [handler.workgroup, 1, 1])?;
        check_grid(
            ctx,
            (batch.div_ceil(handler.workgroup as usize) as u32, 1, 1),
        )?;
        let mut entries = batch_layout_entries().to_vec();
        let keyed = match &handler.key_field {
            Some(field) => {
                // The ring's five storage buffers, the links and the bound buffers (`keys`).
                let storage = 6 + bindings.len() as u64;
                let max = ctx.limits.max_storage_buffers_per_shader_stage as u64;
                if storage > max {
                    return Err(WgslLaunchError::Device(BackendError::WgpuLimit {
                        limit: "max_storage_buffers_per_shader_stage",
                        requested: storage,
                        max,
                    }));
                }
                if batch as u64 >= keyed::END as u64 {
                    return Err(WgslLaunchError::Device(BackendError::WgpuLimit {
                        limit: "messages in a keyed batch",
                        requested: batch as u64,
                        max: keyed::END as u64 - 1,
                    }));
                }
                entries.push(buffer_entry(
                    6,
                    ::wgpu::BufferBindingType::Storage { read_only: true },
                ));
                Some(keyed::KeyedBatches::new(keyed::key_offset(
                    &compiled, field,
                )?))
            }
            None => None,
        };
        let bound_entries: Vec<_> = (0..bindings.len())
            .map(|i| {
                buffer_entry(
                    i as u32,
                    ::wgpu::BufferBindingType::Storage { read_only: false },
                )
            })
            .collect();
        let (pipeline, layout, bound_layout) = ctx.scoped("create ring-kernel pipeline", || {
            let module = ctx
                .device
                .create_shader_module(::wgpu::ShaderModuleDescriptor {
                    label: Some(id),
                    source: ::wgpu::ShaderSource::Wgsl(Cow::Borrowed(&source)),
                });
            let layout = ctx
                .device
                .create_bind_group_layout(&::wgpu::BindGroupLayoutDescriptor {
                    label: Some(id),
                    entries: &entries,
                });
            let bound_layout = (!bound_entries.is_empty()).then(|| {
                ctx.device
                    .create_bind_group_layout(&::wgpu::BindGroupLayoutDescriptor {
                        label: Some(id),
                        entries: &bound_entries,
                    })
            });
            let pl = ctx
                .device
                .create_pipeline_layout(&::wgpu::PipelineLayoutDescriptor {
                    label: Some(id),
                    bind_group_layouts: &[Some(&layout), bound_layout.as_ref()],
                    immediate_size: 0,
                });
            let pipeline = ctx
                .device
                .create_compute_pipeline(&::wgpu::ComputePipelineDescriptor {
                    label: Some(id),
                    layout: Some(&pl),
                    module: &module,
                    entry_point: Some("resident_main"),
                    compilation_options: Default::default(),
                    cache: None,
                });
            (pipeline, layout, bound_layout)
        })?;
        Ok(RingPipeline {
            pipeline,
            layout,
            bound_layout,
            bound: None,
            state_len,
            workgroup: handler.workgroup,
            in_order: handler.in_order,
            keyed,
        })
    }

    /// One set of batch buffers bound to `state`.
    pub(super) fn batch_buffers(
        &self,
        ctx: &WgpuContext,
        id: &str,
        state: &::wgpu::Buffer,
        geometry: &BatchGeometry,
    ) -> Result<BatchBuffers, BackendError> {
        let b = geometry.batch as u64;
        let none = ::wgpu::BufferUsages::empty();
        let input = ctx.storage_buffer("resident batch in", b * geometry.in_size, none)?;
        let env = ctx.storage_buffer("resident batch env", b * 32, none)?;
        let out = ctx.storage_buffer("resident batch out", b * geometry.out_size, none)?;
        let keep = ctx.storage_buffer("resident batch keep", b * 4, none)?;
        let links = match self.keyed {
            Some(_) => Some(ctx.storage_buffer("resident batch links", b * 4, none)?),
            None => None,
        };
        let staging =
            ctx.readback_buffer("resident batch staging", geometry.keep_offset + b * 4)?;
        let count = ctx.scoped("create uniform", || {
            ctx.device.create_buffer(&::wgpu::BufferDescriptor {
                label: Some("resident batch count"),
                size: 16,
                usage: ::wgpu::BufferUsages::UNIFORM | ::wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        let group = ctx.scoped("create bind group", || {
            let mut bufs = vec![&input, &env, &out, &keep, state, &count];
            bufs.extend(links.as_ref());
            let entries: Vec<_> = bufs
                .iter()
                .enumerate()
                .map(|(i, b)| ::wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: b.as_entire_binding(),
                })
                .collect();
            ctx.device.create_bind_group(&::wgpu::BindGroupDescriptor {
                label: Some(id),
                layout: &self.layout,
                entries: &entries,
            })
        })?;
        Ok(BatchBuffers {
            input,
            env,
            out,
            keep,
            links,
            count,
            staging,
            group,
        })
    }

    /// Uploads a batch into `bufs`, records its dispatch and the copies of its outputs into
    /// staging on `enc`.
    pub(super) fn record<In: Message>(
        &self,
        ctx: &WgpuContext,
        enc: &mut ::wgpu::CommandEncoder,
        bufs: &BatchBuffers,
        geometry: &BatchGeometry,
        chunk: &[Slot<In>],
        scratch: &mut Vec<u8>,
    ) {
        self.upload_and_dispatch(ctx, enc, bufs, chunk, scratch);
        let n = chunk.len();
        let out_bytes = n as u64 * geometry.out_size;
        if out_bytes > 0 {
            enc.copy_buffer_to_buffer(&bufs.out, 0, &bufs.staging, 0, padded(out_bytes));
        }
        enc.copy_buffer_to_buffer(
            &bufs.keep,
            0,
            &bufs.staging,
            geometry.keep_offset,
            n as u64 * 4,
        );
    }

    /// Uploads a batch into `bufs` and records its dispatch on `enc`.
    pub(super) fn upload_and_dispatch<In: Message>(
        &self,
        ctx: &WgpuContext,
        enc: &mut ::wgpu::CommandEncoder,
        bufs: &BatchBuffers,
        chunk: &[Slot<In>],
        scratch: &mut Vec<u8>,
    ) {
        let n = chunk.len();
        scratch.clear();
        for s in chunk {
            scratch.extend_from_slice(bytemuck::bytes_of(&s.payload));
        }
        ctx.write(&bufs.input, scratch);
        if let (Some(k), Some(links)) = (&self.keyed, &bufs.links) {
            // Grouped by key here, in one pass, so the device's leaders walk their own keys.
            k.with_links(scratch, std::mem::size_of::<In>(), |l| {
                ctx.write(links, bytemuck::cast_slice(l))
            });
        }
        scratch.clear();
        for s in chunk {
            scratch.extend_from_slice(bytemuck::bytes_of(&s.env));
        }
        ctx.write(&bufs.env, scratch);
        ctx.write(&bufs.count, bytemuck::bytes_of(&[n as u32, 0, 0, 0]));
        if self.in_order || self.keyed.is_some() {
            // Messages an in-order (or keyed) loop never reached must not show last batch's
            // flags.
            enc.clear_buffer(&bufs.keep, 0, Some(n as u64 * 4));
        }
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &bufs.group, &[]);
            if let Some(g) = &self.bound {
                pass.set_bind_group(1, g, &[]);
            }
            let groups = if self.in_order {
                1
            } else {
                (n as u32).div_ceil(self.workgroup)
            };
            pass.dispatch_workgroups(groups, 1, 1);
        }
    }
}

impl RingPipeline {
    /// One invocation per message (neither in order nor keyed): what device forwarding links.
    pub(super) fn plain(&self) -> bool {
        !self.in_order && self.keyed.is_none()
    }

    /// Whether the device stopped a loop of this batch before its end: the in-order loop
    /// marks the last keep flag, a keyed leader its own message's.
    pub(super) fn cut_short(&self, view: &[u8], geometry: &BatchGeometry, n: usize) -> bool {
        if self.keyed.is_some() {
            let at = geometry.keep_offset as usize;
            return view[at..at + 4 * n]
                .chunks_exact(4)
                .any(|f| f == CUT_SHORT.to_le_bytes());
        }
        self.in_order && cut_short(view, geometry, n)
    }
}

/// Whether the in-order batch of `n` messages whose staging buffer is `view` was cut short.
pub(super) fn cut_short(view: &[u8], geometry: &BatchGeometry, n: usize) -> bool {
    let at = geometry.keep_offset as usize + 4 * n.saturating_sub(1);
    n > 0 && view[at..at + 4] == CUT_SHORT.to_le_bytes()
}

/// Sizes of one batch set.
pub(super) struct BatchGeometry {
    pub(super) batch: usize,
    pub(super) in_size: u64,
    pub(super) out_size: u64,
    /// Where the keep flags start in the staging buffer (after the outputs).
    pub(super) keep_offset: u64,
}

impl BatchGeometry {
    pub(super) fn new(batch: usize, in_size: usize, out_size: usize) -> Self {
        let batch = batch.max(1);
        BatchGeometry {
            batch,
            in_size: in_size as u64,
            out_size: out_size as u64,
            keep_offset: padded(batch as u64 * out_size as u64),
        }
    }
}

/// Reads the outputs of a completed batch from its mapped staging buffer, in input order:
/// each kept output carries the request's envelope with `correlation_id` = its `message_id`.
/// Requests that were `call`s and got no output go to `unanswered`.
pub(super) fn decode<In, Out: Message>(
    view: &[u8],
    geometry: &BatchGeometry,
    inputs: &[Slot<In>],
    out: &mut impl Extend<Slot<Out>>,
    unanswered: &mut Vec<Envelope>,
) {
    let osz = std::mem::size_of::<Out>();
    let keep_at = geometry.keep_offset as usize;
    out.extend(inputs.iter().enumerate().filter_map(|(i, s)| {
        let k = &view[keep_at + 4 * i..keep_at + 4 * i + 4];
        if k == [0, 0, 0, 0] {
            if s.env.is_call() {
                unanswered.push(s.env);
            }
            return None;
        }
        let payload: Out = bytemuck::pod_read_unaligned(&view[i * osz..(i + 1) * osz]);
        let env = Envelope {
            correlation_id: s.env.message_id,
            ..s.env
        };
        Some(Slot::new(env, payload))
    }));
}

/// One compute-visible buffer binding of a batch pipeline's layout.
pub(super) fn buffer_entry(
    binding: u32,
    ty: ::wgpu::BufferBindingType,
) -> ::wgpu::BindGroupLayoutEntry {
    ::wgpu::BindGroupLayoutEntry {
        binding,
        visibility: ::wgpu::ShaderStages::COMPUTE,
        ty: ::wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

/// The fixed bindings 0-5 of a ring kernel's batch pipeline (inputs and envelopes read;
/// outputs, keep flags and state written; the batch parameters as a uniform), shared by the
/// plain pipeline and the linked one (`link.rs`, which adds the producer's outputs as 6).
pub(super) fn batch_layout_entries() -> [::wgpu::BindGroupLayoutEntry; 6] {
    let read = ::wgpu::BufferBindingType::Storage { read_only: true };
    let write = ::wgpu::BufferBindingType::Storage { read_only: false };
    [
        buffer_entry(0, read),
        buffer_entry(1, read),
        buffer_entry(2, write),
        buffer_entry(3, write),
        buffer_entry(4, write),
        buffer_entry(5, ::wgpu::BufferBindingType::Uniform),
    ]
}
