//! One-shot WGSL kernels: `Kernel::new(..).wgsl(source, entry)` launched with the same
//! [`LaunchConfig`] and [`KernelArg`]s as the CUDA and CPU forms.
//!
//! Argument `i` is `@group(0) @binding(i)`: a read-only buffer binds `var<storage, read>`, a
//! writable one `var<storage, read_write>`, a scalar `var<uniform>` (a `u32`, `i32`, `f32`,
//! or `vec2<u32>` for 8 bytes). The workgroup size comes from the source's
//! `@workgroup_size`; the grid from the config, except that a config made with
//! `LaunchConfig::for_elements(n)` is re-gridded to cover `n` with the source's workgroup
//! size (as CUDA may re-pick its block size). What the adapter cannot do (workgroup too large,
//! too many workgroups, a buffer past the binding limit) is a typed error before dispatch.
//! The 64-bit helpers ([`super::wgsl::HELPERS_64`]) are appended to the source.

use super::wgsl::{compile, BindingKind, WgslError};
use super::WgpuContext;
use resident_core::engine::{BackendError, Kernel, KernelArg, LaunchConfig, Result};
use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A compiled one-shot kernel.
pub(crate) struct Pipeline {
    pipeline: ::wgpu::ComputePipeline,
    layout: ::wgpu::BindGroupLayout,
    bindings: Vec<super::wgsl::Binding>,
    workgroup: [u32; 3],
}

fn compile_error(kernel: &str, source: WgslError) -> BackendError {
    BackendError::WgslCompile {
        kernel: kernel.to_string(),
        source,
    }
}

/// Checks a workgroup size against the adapter's limits.
pub(crate) fn check_workgroup(ctx: &WgpuContext, wg: [u32; 3]) -> Result<()> {
    let l = &ctx.limits;
    for (v, max, limit) in [
        (
            wg[0],
            l.max_compute_workgroup_size_x,
            "max_compute_workgroup_size_x",
        ),
        (
            wg[1],
            l.max_compute_workgroup_size_y,
            "max_compute_workgroup_size_y",
        ),
        (
            wg[2],
            l.max_compute_workgroup_size_z,
            "max_compute_workgroup_size_z",
        ),
    ] {
        if v > max {
            return Err(BackendError::WgpuLimit {
                limit,
                requested: v as u64,
                max: max as u64,
            });
        }
    }
    let total = wg[0] as u64 * wg[1] as u64 * wg[2] as u64;
    if total > l.max_compute_invocations_per_workgroup as u64 {
        return Err(BackendError::WgpuLimit {
            limit: "max_compute_invocations_per_workgroup",
            requested: total,
            max: l.max_compute_invocations_per_workgroup as u64,
        });
    }
    Ok(())
}

/// Checks a dispatch's workgroup counts against the adapter's limits.
pub(crate) fn check_grid(ctx: &WgpuContext, grid: (u32, u32, u32)) -> Result<()> {
    let max = ctx.limits.max_compute_workgroups_per_dimension;
    for v in [grid.0, grid.1, grid.2] {
        if v > max {
            return Err(BackendError::WgpuLimit {
                limit: "max_compute_workgroups_per_dimension",
                requested: v as u64,
                max: max as u64,
            });
        }
    }
    Ok(())
}

/// Builds a compute pipeline for `entry` of `source` with an explicit layout of group 0, on
/// naga's stack (see `RingPipeline::build`).
pub(crate) fn build(
    ctx: &WgpuContext,
    kernel: &str,
    source: &str,
    entry: &str,
) -> Result<Pipeline> {
    crate::wgsl::on_naga_stack(|| build_here(ctx, kernel, source, entry))
}

fn build_here(ctx: &WgpuContext, kernel: &str, source: &str, entry: &str) -> Result<Pipeline> {
    let compiled = compile(source).map_err(|e| match e {
        crate::wgsl::CompileFailed::Source(e) => compile_error(kernel, e),
        crate::wgsl::CompileFailed::Stopped(source) => BackendError::WgslStopped {
            kernel: kernel.to_string(),
            source,
        },
    })?;
    let (_, workgroup) = compiled.entry(entry).ok_or_else(|| {
        compile_error(
            kernel,
            WgslError {
                stage: "entry point",
                message: format!("no `@compute` function named `{entry}`"),
                line: None,
                column: None,
            },
        )
    })?;
    check_workgroup(ctx, workgroup)?;
    let bindings = compiled.group0().map_err(|e| compile_error(kernel, e))?;
    let storage = bindings
        .iter()
        .filter(|b| b.kind != BindingKind::Uniform)
        .count() as u32;
    if storage > ctx.limits.max_storage_buffers_per_shader_stage {
        return Err(BackendError::WgpuLimit {
            limit: "max_storage_buffers_per_shader_stage",
            requested: storage as u64,
            max: ctx.limits.max_storage_buffers_per_shader_stage as u64,
        });
    }
    let mut entries = Vec::with_capacity(bindings.len());
    for b in &bindings {
        let ty = match b.kind {
            BindingKind::StorageRead => ::wgpu::BufferBindingType::Storage { read_only: true },
            BindingKind::StorageReadWrite => {
                ::wgpu::BufferBindingType::Storage { read_only: false }
            }
            BindingKind::Uniform => ::wgpu::BufferBindingType::Uniform,
            BindingKind::Other => {
                return Err(compile_error(
                    kernel,
                    WgslError {
                        stage: "bindings",
                        message: format!(
                            "binding {} (`{}`) is not a buffer; kernel arguments are buffers and uniforms",
                            b.binding, b.name
                        ),
                        line: None,
                        column: None,
                    },
                ))
            }
        };
        entries.push(::wgpu::BindGroupLayoutEntry {
            binding: b.binding,
            visibility: ::wgpu::ShaderStages::COMPUTE,
            ty: ::wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
    }
    let (pipeline, layout) = ctx.scoped("create compute pipeline", || {
        let module = ctx
            .device
            .create_shader_module(::wgpu::ShaderModuleDescriptor {
                label: Some(kernel),
                source: ::wgpu::ShaderSource::Wgsl(Cow::Borrowed(source)),
            });
        let layout = ctx
            .device
            .create_bind_group_layout(&::wgpu::BindGroupLayoutDescriptor {
                label: Some(kernel),
                entries: &entries,
            });
        let pl = ctx
            .device
            .create_pipeline_layout(&::wgpu::PipelineLayoutDescriptor {
                label: Some(kernel),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let pipeline = ctx
            .device
            .create_compute_pipeline(&::wgpu::ComputePipelineDescriptor {
                label: Some(kernel),
                layout: Some(&pl),
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            });
        (pipeline, layout)
    })?;
    Ok(Pipeline {
        pipeline,
        layout,
        bindings,
        workgroup,
    })
}

fn cached(ctx: &WgpuContext, kernel: &str, source: &str, entry: &str) -> Result<Arc<Pipeline>> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    let key = (h.finish(), entry.to_string());
    if let Some(p) = ctx.pipelines.lock().get(&key) {
        return Ok(p.clone());
    }
    let p = Arc::new(build(
        ctx,
        kernel,
        &super::wgsl::with_helpers(source),
        entry,
    )?);
    ctx.pipelines.lock().insert(key, p.clone());
    Ok(p)
}

fn bad(index: usize, reason: impl Into<String>) -> BackendError {
    BackendError::BadArgument {
        index,
        reason: reason.into(),
    }
}

/// Runs `kernel`'s WGSL form over `cfg` and waits (bounded).
pub(crate) fn launch(
    ctx: &WgpuContext,
    kernel: &Kernel,
    cfg: LaunchConfig,
    args: &[KernelArg<'_>],
) -> Result<()> {
    ctx.check()?;
    let (source, entry) = kernel
        .wgsl
        .as_ref()
        .ok_or_else(|| BackendError::NoWgslSource {
            kernel: kernel.name().to_string(),
        })?;
    let p = cached(ctx, kernel.name(), source, entry)?;
    if p.bindings.len() != args.len() {
        return Err(bad(
            args.len().min(p.bindings.len()),
            format!(
                "kernel `{}` binds {} resources in @group(0), {} arguments given",
                kernel.name(),
                p.bindings.len(),
                args.len()
            ),
        ));
    }
    let mut uniforms = Vec::new();
    let mut resources: Vec<(u32, ::wgpu::Buffer)> = Vec::with_capacity(args.len());
    for (i, (a, b)) in args.iter().zip(&p.bindings).enumerate() {
        if b.binding != i as u32 {
            return Err(bad(
                i,
                format!(
                    "argument {i} binds @binding({i}), but the shader's bindings are not numbered 0..{}",
                    args.len()
                ),
            ));
        }
        let want = match a {
            KernelArg::Buffer { .. } => BindingKind::StorageRead,
            KernelArg::BufferMut { .. } => BindingKind::StorageReadWrite,
            KernelArg::Scalar { .. } => BindingKind::Uniform,
        };
        if want != b.kind {
            return Err(bad(
                i,
                format!("is bound as {want} but `{}` is declared {}", b.name, b.kind),
            ));
        }
        match a {
            KernelArg::Buffer { address, bytes, .. }
            | KernelArg::BufferMut { address, bytes, .. } => {
                let buf = ctx
                    .buffer_at(*address)
                    .ok_or_else(|| bad(i, "is not memory of this wgpu device"))?;
                if (*bytes as u64) < b.size as u64 {
                    return Err(bad(
                        i,
                        format!(
                            "buffer of {bytes} bytes is smaller than `{}` ({} bytes)",
                            b.name, b.size
                        ),
                    ));
                }
                ctx.check_buffer_size(buf.size(), true)?;
                resources.push((i as u32, buf));
            }
            KernelArg::Scalar { bytes, len } => {
                if *len as u32 != b.size {
                    return Err(bad(
                        i,
                        format!("scalar of {len} bytes for `{}` of {} bytes", b.name, b.size),
                    ));
                }
                let u = ctx.scoped("create uniform", || {
                    ctx.device.create_buffer(&::wgpu::BufferDescriptor {
                        label: Some("resident scalar"),
                        size: 16,
                        usage: ::wgpu::BufferUsages::UNIFORM | ::wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    })
                })?;
                let mut data = [0u8; 16];
                data[..*len].copy_from_slice(&bytes[..*len]);
                ctx.queue.write_buffer(&u, 0, &data);
                uniforms.push(u.clone());
                resources.push((i as u32, u));
            }
        }
    }
    let grid = match cfg.elements {
        Some(n) => {
            let per = p.workgroup[0] as u64 * p.workgroup[1] as u64 * p.workgroup[2] as u64;
            (
                n.div_ceil(per.max(1)).max(1).min(u32::MAX as u64) as u32,
                1,
                1,
            )
        }
        None => cfg.grid,
    };
    check_grid(ctx, grid)?;
    let index = ctx.scoped("dispatch", || {
        let entries: Vec<::wgpu::BindGroupEntry<'_>> = resources
            .iter()
            .map(|(binding, buf)| ::wgpu::BindGroupEntry {
                binding: *binding,
                resource: buf.as_entire_binding(),
            })
            .collect();
        let group = ctx.device.create_bind_group(&::wgpu::BindGroupDescriptor {
            label: Some(kernel.name()),
            layout: &p.layout,
            entries: &entries,
        });
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&p.pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(grid.0, grid.1, grid.2);
        }
        ctx.queue.submit([enc.finish()])
    })?;
    ctx.wait_for(Some(index), "kernel launch")
}
