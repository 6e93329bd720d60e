//! The thin layer: each driver call wrapped so it returns `Result<_, CudaError>` and nothing more.
//! Owners with `Drop` live in the other modules and are built on these functions.
//!
//! Nothing here may run before [`driver`] succeeded: cudarc panics when `libcuda` is missing,
//! and [`driver`] is the one place that asks first.

use crate::error::{CudaError, DriverFault, Result};
use cudarc::driver::result::DriverError;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::OnceLock;

pub use sys::{CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUmodule, CUstream};

/// The driver's description of `e` (`cuGetErrorString`).
fn describe(e: &DriverError) -> String {
    e.error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "no description".into())
}

pub(crate) fn fault(call: &'static str, e: DriverError) -> DriverFault {
    DriverFault {
        call,
        code: e.0,
        message: describe(&e),
    }
}

pub(crate) fn drv(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |e| CudaError::Driver(fault(call, e))
}

/// Whether `libcuda` can be loaded. Cached after the first call.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries `dlopen` on a fixed list of names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Every libcuda function this crate reaches through cudarc (`cuda-13000` bindings) or calls
/// directly. cudarc resolves a symbol on first use and panics when it is missing, so
/// [`driver`] checks them all first and turns a miss into [`CudaError::MissingDriverSymbols`].
pub const REQUIRED_DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxReset_v2",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemsetD8_v2",
    "cuMemsetD8Async",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuModuleLoadDataEx",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    "cuOccupancyMaxPotentialBlockSize",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
];

/// The names of `wanted` that `lib` does not export (a `dlsym` probe, nothing is called).
pub fn missing_symbols(lib: &libloading::Library, wanted: &[&'static str]) -> Vec<&'static str> {
    wanted
        .iter()
        .copied()
        .filter(|name| {
            // SAFETY: only the address is looked up; the symbol is never called or read.
            unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err()
        })
        .collect()
}

/// Opens libcuda under the names cudarc tries and checks [`REQUIRED_DRIVER_SYMBOLS`].
fn probe_driver_symbols() -> Result<()> {
    for name in cudarc::get_lib_name_candidates("cuda") {
        // SAFETY: loading libcuda runs only the driver's own initializers, as cudarc's load does.
        if let Ok(lib) = unsafe { libloading::Library::new(&name) } {
            let missing = missing_symbols(&lib, REQUIRED_DRIVER_SYMBOLS);
            return if missing.is_empty() {
                Ok(())
            } else {
                Err(CudaError::MissingDriverSymbols { symbols: missing })
            };
        }
    }
    Err(CudaError::DriverNotFound)
}

/// Refuses PTX from an NVRTC newer than the driver (the driver rejects a newer PTX ISA).
pub fn check_ptx_compatible(nvrtc: (u32, u32), driver: (u32, u32)) -> Result<()> {
    if nvrtc > driver {
        return Err(CudaError::NvrtcNewerThanDriver { nvrtc, driver });
    }
    Ok(())
}

/// Loads and initializes the driver once. Every entry point of this crate calls this first.
pub fn driver() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), DriverFault>> = OnceLock::new();
    static SYMBOLS: OnceLock<std::result::Result<(), Vec<&'static str>>> = OnceLock::new();
    if !driver_present() {
        return Err(CudaError::DriverNotFound);
    }
    SYMBOLS
        .get_or_init(|| match probe_driver_symbols() {
            Err(CudaError::MissingDriverSymbols { symbols }) => Err(symbols),
            _ => Ok(()),
        })
        .clone()
        .map_err(|symbols| CudaError::MissingDriverSymbols { symbols })?;
    INIT.get_or_init(|| cudarc::driver::result::init().map_err(|e| fault("cuInit", e)))
        .clone()
        .map_err(CudaError::Driver)
}

/// The driver's CUDA version as (major, minor), e.g. (13, 0).
pub fn driver_version() -> Result<(u32, u32)> {
    driver()?;
    let mut v = 0;
    // SAFETY: the library is loaded (checked above); `v` is a valid out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(drv("cuDriverGetVersion"))?;
    Ok(((v / 1000) as u32, ((v % 1000) / 10) as u32))
}

/// Number of CUDA devices.
pub fn device_count() -> Result<usize> {
    driver()?;
    let n = cudarc::driver::result::device::get_count().map_err(drv("cuDeviceGetCount"))?;
    Ok(n.max(0) as usize)
}

/// The device handle of an ordinal.
pub fn device_get(ordinal: usize) -> Result<CUdevice> {
    let count = device_count()?;
    if count == 0 {
        return Err(CudaError::NoDevice);
    }
    if ordinal >= count {
        return Err(CudaError::DeviceOutOfRange { ordinal, count });
    }
    cudarc::driver::result::device::get(ordinal as i32).map_err(drv("cuDeviceGet"))
}

/// One integer attribute of a device.
pub fn device_attribute(dev: CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
    // SAFETY: `dev` came from `device_get`, so the driver is loaded and initialized.
    unsafe { cudarc::driver::result::device::get_attribute(dev, attr) }
        .map_err(drv("cuDeviceGetAttribute"))
}

/// The device's name.
pub fn device_name(dev: CUdevice) -> Result<String> {
    cudarc::driver::result::device::get_name(dev).map_err(drv("cuDeviceGetName"))
}

/// The device's total memory in bytes.
pub fn device_total_mem(dev: CUdevice) -> Result<usize> {
    // SAFETY: `dev` came from `device_get`.
    unsafe { cudarc::driver::result::device::total_mem(dev) }.map_err(drv("cuDeviceTotalMem"))
}

/// Retains the device's primary context.
pub fn primary_ctx_retain(dev: CUdevice) -> Result<CUcontext> {
    // SAFETY: `dev` came from `device_get`.
    unsafe { cudarc::driver::result::primary_ctx::retain(dev) }
        .map_err(drv("cuDevicePrimaryCtxRetain"))
}

/// Releases the device's primary context.
///
/// # Safety
/// Pairs with exactly one earlier `primary_ctx_retain`.
pub unsafe fn primary_ctx_release(dev: CUdevice) -> Result<()> {
    cudarc::driver::result::primary_ctx::release(dev).map_err(drv("cuDevicePrimaryCtxRelease"))
}

/// Makes `ctx` current on this thread.
///
/// # Safety
/// `ctx` must be a live context.
pub unsafe fn ctx_set_current(ctx: CUcontext) -> Result<()> {
    cudarc::driver::result::ctx::set_current(ctx).map_err(drv("cuCtxSetCurrent"))
}

/// Allocates device memory.
///
/// # Safety
/// A context must be current.
pub unsafe fn mem_alloc(bytes: usize) -> Result<CUdeviceptr> {
    cudarc::driver::result::malloc_sync(bytes).map_err(drv("cuMemAlloc"))
}

/// Stream-ordered allocation (`cuMemAllocAsync`) from the device's default memory pool, on
/// `stream`: it waits for that stream only, never for the whole device.
///
/// # Safety
/// The context is current and `stream` is live.
pub unsafe fn mem_alloc_async(bytes: usize, stream: CUstream) -> Result<CUdeviceptr> {
    cudarc::driver::result::malloc_async(stream, bytes).map_err(drv("cuMemAllocAsync"))
}

/// Stream-ordered free (`cuMemFreeAsync`) on `stream`.
///
/// # Safety
/// `ptr` came from `mem_alloc_async` and is freed once; nothing uses it after the work queued
/// on `stream` so far; the context is current.
pub unsafe fn mem_free_async(ptr: CUdeviceptr, stream: CUstream) -> Result<()> {
    cudarc::driver::result::free_async(ptr, stream).map_err(drv("cuMemFreeAsync"))
}

/// Keeps what the device's default memory pool frees reserved (release threshold: all of
/// it), so a stream synchronize never hands pool memory back to the system, a step that could
/// wait for the device.
///
/// # Safety
/// The device's context is current.
pub unsafe fn mem_pool_keep_reserved(dev: CUdevice) -> Result<()> {
    let mut pool = std::mem::MaybeUninit::uninit();
    sys::cuDeviceGetDefaultMemPool(pool.as_mut_ptr(), dev)
        .result()
        .map_err(drv("cuDeviceGetDefaultMemPool"))?;
    let mut threshold = u64::MAX;
    sys::cuMemPoolSetAttribute(
        pool.assume_init(),
        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        (&mut threshold as *mut u64).cast(),
    )
    .result()
    .map_err(drv("cuMemPoolSetAttribute"))
}

/// Frees device memory.
///
/// # Safety
/// `ptr` came from `mem_alloc` and is freed once; its context is current.
pub unsafe fn mem_free(ptr: CUdeviceptr) -> Result<()> {
    cudarc::driver::result::free_sync(ptr).map_err(drv("cuMemFree"))
}

/// Sets `bytes` bytes of device memory to `value`.
///
/// # Safety
/// `[dst, dst + bytes)` is live device memory of the current context.
pub unsafe fn memset_d8(dst: CUdeviceptr, value: u8, bytes: usize) -> Result<()> {
    sys::cuMemsetD8_v2(dst, value, bytes)
        .result()
        .map_err(drv("cuMemsetD8"))
}

/// Queues setting `bytes` bytes at `dst` to `value` on `stream`.
///
/// # Safety
/// `dst` is device memory of the current context, valid for `bytes` bytes until the stream
/// has run the operation.
pub unsafe fn memset_d8_async(
    dst: CUdeviceptr,
    value: u8,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    sys::cuMemsetD8Async(dst, value, bytes, stream)
        .result()
        .map_err(drv("cuMemsetD8Async"))
}

/// Copies host to device, synchronously.
///
/// # Safety
/// `src` is valid for `bytes` reads; `[dst, dst + bytes)` is live device memory.
pub unsafe fn memcpy_htod(dst: CUdeviceptr, src: *const c_void, bytes: usize) -> Result<()> {
    sys::cuMemcpyHtoD_v2(dst, src, bytes)
        .result()
        .map_err(drv("cuMemcpyHtoD"))
}

/// Copies device to host, synchronously.
///
/// # Safety
/// `dst` is valid for `bytes` writes; `[src, src + bytes)` is live device memory.
pub unsafe fn memcpy_dtoh(dst: *mut c_void, src: CUdeviceptr, bytes: usize) -> Result<()> {
    sys::cuMemcpyDtoH_v2(dst, src, bytes)
        .result()
        .map_err(drv("cuMemcpyDtoH"))
}

/// Copies host to device on a stream.
///
/// # Safety
/// As [`memcpy_htod`], and `src` stays valid and unmodified until the stream reaches the copy.
pub unsafe fn memcpy_htod_async(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, stream)
        .result()
        .map_err(drv("cuMemcpyHtoDAsync"))
}

/// Writes `value` to the device address `addr` after the stream's earlier work (a stream
/// memory operation, `cuStreamWriteValue64`; `CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`
/// says whether the device takes it).
///
/// # Safety
/// `stream` is live; `addr` is an 8-aligned `u64` of live device memory.
pub unsafe fn stream_write_value64(stream: CUstream, addr: CUdeviceptr, value: u64) -> Result<()> {
    sys::cuStreamWriteValue64_v2(stream, addr, value, 0)
        .result()
        .map_err(drv("cuStreamWriteValue64"))
}

/// Copies device to host on a stream.
///
/// # Safety
/// As [`memcpy_dtoh`], and nothing reads or writes `dst` until the stream reaches the copy.
pub unsafe fn memcpy_dtoh_async(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, stream)
        .result()
        .map_err(drv("cuMemcpyDtoHAsync"))
}

/// Allocates page-locked host memory with explicit `cuMemHostAlloc` flags.
///
/// # Safety
/// A context must be current. The memory is uninitialized.
pub unsafe fn host_alloc(bytes: usize, flags: u32) -> Result<*mut c_void> {
    cudarc::driver::result::malloc_host(bytes, flags).map_err(drv("cuMemHostAlloc"))
}

/// Frees memory from [`host_alloc`].
///
/// # Safety
/// `ptr` came from `host_alloc` and is freed once.
pub unsafe fn host_free(ptr: *mut c_void) -> Result<()> {
    cudarc::driver::result::free_host(ptr).map_err(drv("cuMemFreeHost"))
}

/// The device address of mapped pinned host memory.
///
/// # Safety
/// `ptr` came from `host_alloc` with `CU_MEMHOSTALLOC_DEVICEMAP`; a context is current.
pub unsafe fn host_device_pointer(ptr: *mut c_void) -> Result<CUdeviceptr> {
    let mut d: CUdeviceptr = 0;
    sys::cuMemHostGetDevicePointer_v2(&mut d, ptr, 0)
        .result()
        .map_err(drv("cuMemHostGetDevicePointer"))?;
    Ok(d)
}

/// Creates a non-blocking stream.
///
/// # Safety
/// A context must be current.
pub unsafe fn stream_create() -> Result<CUstream> {
    cudarc::driver::result::stream::create(cudarc::driver::result::stream::StreamKind::NonBlocking)
        .map_err(drv("cuStreamCreate"))
}

/// Waits for all work on a stream.
///
/// # Safety
/// `stream` is live.
pub unsafe fn stream_synchronize(stream: CUstream) -> Result<()> {
    cudarc::driver::result::stream::synchronize(stream).map_err(drv("cuStreamSynchronize"))
}

/// Destroys a stream.
///
/// # Safety
/// `stream` is live and destroyed once.
pub unsafe fn stream_destroy(stream: CUstream) -> Result<()> {
    cudarc::driver::result::stream::destroy(stream).map_err(drv("cuStreamDestroy"))
}

/// Makes later work on `stream` wait for `event`.
///
/// # Safety
/// Both are live.
pub unsafe fn stream_wait_event(stream: CUstream, event: CUevent) -> Result<()> {
    cudarc::driver::result::stream::wait_event(
        stream,
        event,
        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
    )
    .map_err(drv("cuStreamWaitEvent"))
}

/// Creates an event that records timing.
///
/// # Safety
/// A context must be current.
pub unsafe fn event_create() -> Result<CUevent> {
    cudarc::driver::result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
        .map_err(drv("cuEventCreate"))
}

/// Records an event on a stream.
///
/// # Safety
/// Both are live.
pub unsafe fn event_record(event: CUevent, stream: CUstream) -> Result<()> {
    cudarc::driver::result::event::record(event, stream).map_err(drv("cuEventRecord"))
}

/// Waits for an event.
///
/// # Safety
/// `event` is live.
pub unsafe fn event_synchronize(event: CUevent) -> Result<()> {
    cudarc::driver::result::event::synchronize(event).map_err(drv("cuEventSynchronize"))
}

/// Milliseconds between two recorded events.
///
/// # Safety
/// Both are live and recorded.
pub unsafe fn event_elapsed_ms(start: CUevent, end: CUevent) -> Result<f32> {
    cudarc::driver::result::event::elapsed(start, end).map_err(drv("cuEventElapsedTime"))
}

/// Destroys an event.
///
/// # Safety
/// `event` is live and destroyed once.
pub unsafe fn event_destroy(event: CUevent) -> Result<()> {
    cudarc::driver::result::event::destroy(event).map_err(drv("cuEventDestroy"))
}

/// Loads a module from a NUL-terminated PTX image.
///
/// # Safety
/// A context must be current; `image` is NUL-terminated.
pub unsafe fn module_load_data(image: *const c_void) -> Result<CUmodule> {
    // The JIT's error log is kept (cuModuleLoadData discards it): a PTX the driver cannot
    // compile says why.
    const LOG_BYTES: usize = 16 * 1024;
    let mut log = vec![0u8; LOG_BYTES];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), LOG_BYTES as *mut c_void];
    let mut module = core::mem::MaybeUninit::<CUmodule>::uninit();
    // SAFETY: `image` per the caller; the option arrays have 2 entries each; the log buffer
    // has LOG_BYTES bytes and outlives the call; the size is passed by value in the pointer
    // slot, as the driver API specifies for CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES.
    let r = sys::cuModuleLoadDataEx(
        module.as_mut_ptr(),
        image,
        options.len() as u32,
        options.as_mut_ptr(),
        values.as_mut_ptr(),
    );
    match r.result() {
        // SAFETY: success initialized `module`.
        Ok(()) => Ok(module.assume_init()),
        Err(e) => {
            let n = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err(CudaError::ModuleLoad {
                code: e.0,
                message: describe(&e),
                log: crate::error::bounded_log(&log[..n]),
            })
        }
    }
}

/// Unloads a module.
///
/// # Safety
/// `module` is live and unloaded once; no function of it runs any more.
pub unsafe fn module_unload(module: CUmodule) -> Result<()> {
    cudarc::driver::result::module::unload(module).map_err(drv("cuModuleUnload"))
}

/// Looks a kernel up by its (unmangled, `extern "C"`) name.
///
/// # Safety
/// `module` is live.
pub unsafe fn module_get_function(module: CUmodule, name: &str) -> Result<CUfunction> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| CudaError::invalid("cuModuleGetFunction", "kernel name contains NUL"))?;
    cudarc::driver::result::module::get_function(module, cname).map_err(drv("cuModuleGetFunction"))
}

/// The driver's occupancy suggestion: (minimum grid size for full occupancy, block size).
///
/// # Safety
/// `f` is live.
pub unsafe fn occupancy_max_potential_block_size(
    f: CUfunction,
    dynamic_smem: usize,
    block_limit: u32,
) -> Result<(u32, u32)> {
    let (grid, block) = cudarc::driver::result::occupancy::max_potential_block_size(
        f,
        None,
        dynamic_smem,
        block_limit as i32,
    )
    .map_err(drv("cuOccupancyMaxPotentialBlockSize"))?;
    Ok((grid.max(0) as u32, block.max(0) as u32))
}

/// Launches a kernel.
///
/// # Safety
/// `params` holds one pointer per kernel parameter, each to a value of the parameter's type,
/// valid until this call returns; every device pointer among them stays live until the kernel
/// finished.
pub unsafe fn launch_kernel(
    f: CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_bytes: u32,
    stream: CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    cudarc::driver::result::launch_kernel(f, grid, block, shared_bytes, stream, params)
        .map_err(drv("cuLaunchKernel"))
}

/// Destroys every allocation, module and stream of the device's primary context and resets its
/// state, so a context poisoned by a sticky device fault becomes usable again.
///
/// # Safety
/// No live owner of this crate may still refer to anything in that context (see
/// [`crate::Device::mark_lost`]).
pub unsafe fn primary_ctx_reset(dev: CUdevice) -> Result<()> {
    sys::cuDevicePrimaryCtxReset_v2(dev)
        .result()
        .map_err(drv("cuDevicePrimaryCtxReset"))
}

/// Polls a stream: `Ok(true)` when all its work finished, `Ok(false)` while some still runs.
/// A device fault comes back as the error the fault left in the context.
///
/// # Safety
/// `stream` is live and its context current.
pub unsafe fn stream_query(stream: CUstream) -> Result<bool> {
    match sys::cuStreamQuery(stream) {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        e => Err(drv("cuStreamQuery")(DriverError(e))),
    }
}

/// Blocks of `f` with `block` threads and `dynamic_smem` bytes that one SM can hold at once.
///
/// # Safety
/// `f` is live.
pub unsafe fn occupancy_max_active_blocks(
    f: CUfunction,
    block: u32,
    dynamic_smem: usize,
) -> Result<u32> {
    cudarc::driver::result::occupancy::max_active_block_per_multiprocessor(
        f,
        block as i32,
        dynamic_smem,
    )
    .map(|n| n.max(0) as u32)
    .map_err(drv("cuOccupancyMaxActiveBlocksPerMultiprocessor"))
}

/// Starts capturing the work queued on `stream` (this thread's calls only) into a graph.
///
/// # Safety
/// `stream` is live and not the legacy default stream.
pub unsafe fn stream_begin_capture(stream: CUstream) -> Result<()> {
    cudarc::driver::result::stream::begin_capture(
        stream,
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    )
    .map_err(drv("cuStreamBeginCapture"))
}

/// Ends a capture begun with [`stream_begin_capture`]; returns the captured graph.
///
/// # Safety
/// `stream` is capturing.
pub unsafe fn stream_end_capture(stream: CUstream) -> Result<sys::CUgraph> {
    cudarc::driver::result::stream::end_capture(stream).map_err(drv("cuStreamEndCapture"))
}

/// Instantiates a graph for launching.
///
/// # Safety
/// `graph` is live.
pub unsafe fn graph_instantiate(graph: sys::CUgraph) -> Result<sys::CUgraphExec> {
    cudarc::driver::result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0))
        .map_err(drv("cuGraphInstantiate"))
}

/// Launches an instantiated graph on a stream.
///
/// # Safety
/// Both handles are live.
pub unsafe fn graph_launch(exec: sys::CUgraphExec, stream: CUstream) -> Result<()> {
    cudarc::driver::result::graph::launch(exec, stream).map_err(drv("cuGraphLaunch"))
}

/// Destroys a graph and (when non-null) its instantiation.
///
/// # Safety
/// Both handles are live (or `exec` null) and destroyed once.
pub unsafe fn graph_destroy(graph: sys::CUgraph, exec: Option<sys::CUgraphExec>) -> Result<()> {
    if let Some(e) = exec {
        cudarc::driver::result::graph::exec_destroy(e).map_err(drv("cuGraphExecDestroy"))?;
    }
    cudarc::driver::result::graph::destroy(graph).map_err(drv("cuGraphDestroy"))
}

#[cfg(test)]
mod probe_tests {
    use super::*;

    #[test]
    fn a_missing_driver_symbol_is_found_by_the_probe_not_by_a_panic() {
        // libc stands in for an old libcuda: it has `malloc`, not `cuEventElapsedTime_v2`.
        // SAFETY: loading libc (already mapped into every process) runs no new initializer.
        let libc = unsafe { libloading::Library::new("libc.so.6") }.unwrap();
        assert_eq!(
            missing_symbols(&libc, &["malloc", "cuEventElapsedTime_v2", "free"]),
            vec!["cuEventElapsedTime_v2"]
        );
        assert_eq!(
            missing_symbols(&libc, REQUIRED_DRIVER_SYMBOLS).len(),
            REQUIRED_DRIVER_SYMBOLS.len()
        );
    }

    #[test]
    fn nvrtc_newer_than_the_driver_is_refused_naming_both() {
        assert!(check_ptx_compatible((12, 4), (12, 4)).is_ok());
        assert!(check_ptx_compatible((12, 2), (13, 0)).is_ok());
        let e = check_ptx_compatible((13, 0), (12, 8)).unwrap_err();
        assert!(matches!(
            e,
            CudaError::NvrtcNewerThanDriver {
                nvrtc: (13, 0),
                driver: (12, 8)
            }
        ));
        let text = e.to_string();
        assert!(text.contains("13.0") && text.contains("12.8"), "{text}");
    }
}
