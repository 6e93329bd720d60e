//! Compiling and loading a persistent kernel's module on a GPU: through the on-disk kernel
//! cache and the device's module cache, the template alone (NVRTC) or linked with an external
//! function's LTO-IR (nvJitLink); and the template's launch-per-batch kernel.

use super::*;

/// Compiles `source` (through the on-disk kernel cache when it can be opened, and the device's
/// module cache), loads it and returns the function `name`, checked to fit on one SM.
pub(super) fn load(
    device: &Arc<Device>,
    source: &KernelSource,
    arch: Option<&str>,
    name: &str,
) -> Result<Function, PersistentError> {
    let text = source.render()?;
    let mut failed: Option<PersistentError> = None;
    let module = match arch {
        // An external function (a Numba handler): its LTO-IR is machine code for one exact
        // architecture, linked with the template's into a CUBIN for the device's own.
        _ if source.external.is_some() => load_linked(device, source, &text, arch)?,
        // An explicit `compute_XY`: PTX for it, JIT-compiled by the driver.
        Some(arch) => {
            let key = CacheKey::new(
                &text,
                &["resident-persistent".to_string()],
                arch,
                device.info().driver_version,
            );
            let mut build = || {
                compile_ptx(source, arch).map(|k| k.ptx).map_err(|e| {
                    failed = Some(e);
                    CudaError::invalid("nvrtcCompileProgram", "the kernel did not compile")
                })
            };
            let ptx = match KernelCache::from_env() {
                Ok(cache) => cache.get_or_build(&key, build).map(|(ptx, _)| ptx),
                Err(_) => build(),
            };
            let ptx = match ptx {
                Ok(p) => p,
                Err(e) => return Err(failed.take().unwrap_or_else(|| cuda_error(e))),
            };
            if let Ok(nv) = resident_cuda::nvrtc::nvrtc_version() {
                resident_cuda::result::check_ptx_compatible(nv, device.info().driver_version)
                    .map_err(cuda_error)?;
            }
            device.load_ptx(key.0, &ptx).map_err(cuda_error)?
        }
        // The device's own architecture: machine code, PTX only as the fallback.
        None => {
            let failed_cubin = std::cell::RefCell::new(None);
            let r = device.load_best(
                &text,
                &["resident-persistent".to_string()],
                None,
                |sm| {
                    crate::persistent::template::compile_cubin(source, sm).map_err(|e| {
                        let compile = matches!(e, PersistentError::Compile { .. });
                        *failed_cubin.borrow_mut() = Some(e);
                        if compile {
                            CudaError::Compile {
                                name: resident_ring::message::quoted_name(&source.name),
                                arch: sm.to_string(),
                                log: "see the kernel's compile error".into(),
                            }
                        } else {
                            CudaError::invalid("nvrtcGetCUBIN", "no machine code for this device")
                        }
                    })
                },
                |arch| {
                    compile_ptx(source, arch).map(|k| k.ptx).map_err(|e| {
                        failed = Some(e);
                        CudaError::invalid("nvrtcCompileProgram", "the kernel did not compile")
                    })
                },
            );
            match r {
                Ok(m) => m,
                Err(e) => {
                    let first = failed_cubin.into_inner();
                    return Err(match (e, first, failed.take()) {
                        (CudaError::Compile { .. }, Some(c), _) => c,
                        (_, _, Some(p)) => p,
                        (e, _, None) => cuda_error(e),
                    });
                }
            }
        }
    };
    let f = device.function(&module, name).map_err(cuda_error)?;
    if f.max_active_blocks_per_sm(source.batch_size, 0)
        .map_err(cuda_error)?
        < 1
    {
        return Err(PersistentError::config(format!(
            "kernel `{}`: a block of {} threads does not fit on one SM",
            source.name, source.batch_size
        )));
    }
    Ok(f)
}

/// The device's own real architecture, `sm_{major}{minor}`.
pub(super) fn device_sm(device: &Device) -> String {
    let (major, minor) = device.info().compute_capability;
    format!("sm_{major}{minor}")
}

/// The refusal of an explicit `compute_XY` for a kernel with an external function.
pub(super) fn external_needs_device_arch(source: &KernelSource, arch: &str) -> PersistentError {
    PersistentError::config(format!(
        "kernel `{}`: architecture {} asked for, but an external function's LTO-IR links into machine code for the device's exact architecture only (leave LaunchOptions::arch unset)",
        resident_ring::message::quoted_name(&source.name),
        resident_ring::message::quoted_name(arch)
    ))
}

/// The disk and module cache key of `source` (rendered as `text`, with an external function)
/// linked for `sm`: the text, a hash of the external LTO-IR and its symbol, the NVRTC and
/// nvJitLink versions, the architecture and the driver version.
pub(super) fn linked_key(device: &Device, source: &KernelSource, text: &str, sm: &str) -> CacheKey {
    let version = |v: resident_cuda::Result<(u32, u32)>| match v {
        Ok((major, minor)) => format!("{major}.{minor}"),
        Err(_) => "none".to_string(),
    };
    let (symbol, ltoir) = match &source.external {
        Some(f) => (
            f.symbol.as_str(),
            f.ltoir
                .as_ref()
                .map(|(arch, ir)| format!("{arch}:{:032x}", resident_cuda::cache::fnv128(ir)))
                .unwrap_or_default(),
        ),
        None => ("", String::new()),
    };
    let extra = [
        "resident-persistent-lto".to_string(),
        format!("external={symbol}"),
        format!("ltoir={ltoir}"),
        format!("nvrtc={}", version(resident_cuda::nvrtc::nvrtc_version())),
        format!(
            "nvjitlink={}",
            version(resident_cuda::nvjitlink::nvjitlink_version())
        ),
    ];
    CacheKey::new(text, &extra, sm, device.info().driver_version)
}

/// The linked CUBIN of `source` for `sm` as the disk cache stores it (hex text).
pub(super) fn build_linked(
    source: &KernelSource,
    sm: &str,
    failed: &mut Option<PersistentError>,
) -> resident_cuda::Result<String> {
    crate::persistent::template::link_cubin(source, sm)
        .map(|b| resident_cuda::module::to_hex(&b))
        .map_err(|e| {
            *failed = Some(e);
            CudaError::invalid("nvJitLinkComplete", "the kernel did not link")
        })
}

/// Loads the module of `source`, which has an external function: the template and the
/// function linked for the device's architecture ([`crate::persistent::template::link_cubin`]), through
/// the on-disk kernel cache when it can be opened and the device's module cache.
pub(super) fn load_linked(
    device: &Arc<Device>,
    source: &KernelSource,
    text: &str,
    arch: Option<&str>,
) -> Result<Arc<resident_cuda::Module>, PersistentError> {
    if let Some(a) = arch {
        return Err(external_needs_device_arch(source, a));
    }
    let sm = device_sm(device);
    let key = linked_key(device, source, text, &sm);
    if let Some(m) = device.modules.get(key.0) {
        return Ok(m);
    }
    let mut failed = None;
    let hex = match KernelCache::from_env() {
        Ok(cache) => cache
            .get_or_build(&key, || build_linked(source, &sm, &mut failed))
            .map(|(h, _)| h),
        Err(_) => build_linked(source, &sm, &mut failed),
    };
    let hex = hex.map_err(|e| failed.take().unwrap_or_else(|| cuda_error(e)))?;
    let image = resident_cuda::module::from_hex(&hex).ok_or_else(|| {
        cuda_error(CudaError::invalid(
            "cuModuleLoadDataEx",
            "cached CUBIN is not hex",
        ))
    })?;
    device.load_cubin(key.0, &image).map_err(cuda_error)
}

/// Whether `source`'s module is loaded on `device` with its function `name` looked up, so a
/// launch makes no module call (each waits for the device): the keys [`load`] uses.
pub(super) fn module_ready(
    device: &Arc<Device>,
    source: &KernelSource,
    arch: Option<&str>,
    name: &str,
) -> bool {
    let Ok(text) = source.render() else {
        return false;
    };
    if source.external.is_some() {
        // The linked module's key (`load_linked`); an explicit arch is refused there.
        let key = linked_key(device, source, &text, &device_sm(device));
        return arch.is_none()
            && device
                .modules
                .get(key.0)
                .is_some_and(|m| m.has_function(name));
    }
    let extra = ["resident-persistent".to_string()];
    let driver = device.info().driver_version;
    let archs = match arch {
        Some(a) => vec![a.to_string()],
        None => {
            let (major, minor) = device.info().compute_capability;
            vec![format!("sm_{major}{minor}"), device.info().arch()]
        }
    };
    archs.iter().any(|a| {
        let key = CacheKey::new(&text, &extra, a, driver);
        device
            .modules
            .get(key.0)
            .is_some_and(|m| m.has_function(name))
    })
}

/// The template's launch-per-batch kernel, [`BATCH_KERNEL_NAME`]
/// (`resident_batch(in, n, out, out_count, state, scan)`, see [`template`](crate::persistent::template)),
/// loaded on `device`: `source` checked against the Rust message types, compiled for the
/// device's own architecture through the same caches as [`PersistentKernel::launch`], and
/// checked to fit one block of `source.batch_size` threads on an SM. The caller launches it on
/// `ceil(n / source.batch_size)` blocks with [`batch_scan_bytes`](crate::persistent::batch_scan_bytes) of
/// zeroed scan cells. A source with bound buffers is refused: the batch kernel takes none.
///
/// The one-shot form of a ring kernel, which the launch-per-batch and CUDA-graph baselines of
/// resident-bench's ring benchmark launch (their figures are only comparable if both variants
/// come from the same template, compiled the same way).
pub fn load_batch_kernel<In, Out>(
    device: &Arc<Device>,
    source: &KernelSource,
) -> Result<Function, PersistentError> {
    check_sizes::<In, Out>(source)?;
    if !source.buffers.is_empty() {
        return Err(PersistentError::config(format!(
            "kernel `{}`: the launch-per-batch kernel does not bind buffers",
            source.name
        )));
    }
    load(device, source, None, BATCH_KERNEL_NAME)
}
