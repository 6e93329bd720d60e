//! The few CUDA driver calls the persistent-kernel path needs, as small owners with `Drop`
//! (cudarc's `result` layer underneath). Every entry point checks that `libcuda` can be loaded
//! first: cudarc panics otherwise. Kept narrow on purpose; the crate-wide CUDA layer will
//! replace it.

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::{result, sys, DriverError};
use resident_ring::spsc::RingMemory;

use super::PersistentError;

fn err(call: &'static str) -> impl Fn(DriverError) -> PersistentError {
    move |e| PersistentError::Driver {
        call,
        error: format!("{e:?}"),
    }
}

/// Checks that the driver loads, initializes and has device `ordinal`.
pub(crate) fn driver_available(ordinal: usize) -> Result<(), PersistentError> {
    // SAFETY: only tries to dlopen libcuda by its candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(PersistentError::DriverUnavailable(
            "libcuda could not be loaded".into(),
        ));
    }
    result::init().map_err(|e| PersistentError::DriverUnavailable(format!("cuInit: {e:?}")))?;
    let n = result::device::get_count()
        .map_err(|e| PersistentError::DriverUnavailable(format!("cuDeviceGetCount: {e:?}")))?;
    if ordinal >= n.max(0) as usize {
        return Err(PersistentError::DriverUnavailable(format!(
            "device {ordinal} requested, {n} present"
        )));
    }
    Ok(())
}

/// A retained primary context of one device.
pub(crate) struct Context {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: a CUDA context handle may be used from any thread once made current there.
unsafe impl Send for Context {}
// SAFETY: as above; the driver synchronizes access to the context internally.
unsafe impl Sync for Context {}

impl Context {
    pub(crate) fn new(ordinal: usize) -> Result<Arc<Self>, PersistentError> {
        driver_available(ordinal)?;
        let dev = result::device::get(ordinal as i32).map_err(err("cuDeviceGet"))?;
        // SAFETY: `dev` was returned by cuDeviceGet.
        let ctx =
            unsafe { result::primary_ctx::retain(dev) }.map_err(err("cuDevicePrimaryCtxRetain"))?;
        let c = Arc::new(Context { dev, ctx });
        c.bind()?;
        // SAFETY: `dev` is valid.
        let can_map = unsafe {
            result::device::get_attribute(
                dev,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
            )
        }
        .map_err(err("cuDeviceGetAttribute"))?;
        if can_map == 0 {
            return Err(PersistentError::DriverUnavailable(
                "device cannot map host memory".into(),
            ));
        }
        Ok(c)
    }

    /// Makes the context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), PersistentError> {
        // SAFETY: the context is retained for our life.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(err("cuCtxSetCurrent"))
    }

    /// `compute_XY` of the device.
    pub(crate) fn arch(&self) -> Result<String, PersistentError> {
        use sys::CUdevice_attribute::*;
        // SAFETY: `dev` is valid.
        let major = unsafe {
            result::device::get_attribute(self.dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        }
        .map_err(err("cuDeviceGetAttribute"))?;
        // SAFETY: as above.
        let minor = unsafe {
            result::device::get_attribute(self.dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        }
        .map_err(err("cuDeviceGetAttribute"))?;
        Ok(format!("compute_{major}{minor}"))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: retained in `new`, released once.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

/// Pinned, device-mapped, cached (not write-combined) host memory.
pub(crate) struct MappedHostMemory {
    ptr: *mut u8,
    len: usize,
    device_ptr: u64,
    _ctx: Arc<Context>,
}

// SAFETY: the allocation is owned by this value; access is synchronized by the ring protocol.
unsafe impl Send for MappedHostMemory {}
// SAFETY: as above.
unsafe impl Sync for MappedHostMemory {}

impl MappedHostMemory {
    pub(crate) fn new(ctx: &Arc<Context>, len: usize) -> Result<Self, PersistentError> {
        ctx.bind()?;
        let len = len.max(256);
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: plain allocation; the memory is zeroed by PersistentQueues before use.
        let ptr =
            unsafe { result::malloc_host(len, flags) }.map_err(err("cuMemHostAlloc"))? as *mut u8;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` was returned by cuMemHostAlloc with DEVICEMAP; flags must be 0.
        let r =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, ptr as *mut c_void, 0) }.result();
        let mem = MappedHostMemory {
            ptr,
            len,
            device_ptr: dptr,
            _ctx: ctx.clone(),
        };
        r.map_err(err("cuMemHostGetDevicePointer"))?;
        if (ptr as usize) % 128 != 0 {
            return Err(PersistentError::Memory {
                what: "pinned mapped memory",
                need: len,
                got: len,
            });
        }
        Ok(mem)
    }

    pub(crate) fn device_ptr(&self) -> u64 {
        self.device_ptr
    }
}

impl Drop for MappedHostMemory {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once; the owner guarantees no kernel uses
        // it any more (PersistentKernel leaks it instead when its kernel did not exit).
        let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
    }
}

// SAFETY: fixed pointer for the value's life, `len` bytes, 128-aligned (checked in `new`).
unsafe impl RingMemory for MappedHostMemory {
    fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Device memory.
pub(crate) struct DeviceBuffer {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    _ctx: Arc<Context>,
}

impl DeviceBuffer {
    pub(crate) fn new(ctx: &Arc<Context>, len: usize) -> Result<Self, PersistentError> {
        ctx.bind()?;
        // SAFETY: plain allocation of at least one byte.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }.map_err(err("cuMemAlloc"))?;
        Ok(DeviceBuffer {
            ptr,
            len,
            _ctx: ctx.clone(),
        })
    }

    /// Synchronous copy from the host; `src` must fit.
    pub(crate) fn write(&self, src: &[u8]) -> Result<(), PersistentError> {
        if src.len() > self.len {
            return Err(PersistentError::Config(format!(
                "{} bytes into a {}-byte device buffer",
                src.len(),
                self.len
            )));
        }
        // SAFETY: the buffer holds at least src.len() bytes.
        unsafe { result::memcpy_htod_sync(self.ptr, src) }.map_err(err("cuMemcpyHtoD"))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc, freed once, unused by any running kernel (see owner).
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// A loaded module.
pub(crate) struct Module {
    m: sys::CUmodule,
    _ctx: Arc<Context>,
}

impl Module {
    pub(crate) fn load_ptx(ctx: &Arc<Context>, ptx: &str) -> Result<Self, PersistentError> {
        ctx.bind()?;
        let image =
            CString::new(ptx).map_err(|_| PersistentError::Config("PTX contains NUL".into()))?;
        // SAFETY: a NUL-terminated PTX image.
        let m = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            .map_err(err("cuModuleLoadData"))?;
        Ok(Module {
            m,
            _ctx: ctx.clone(),
        })
    }

    pub(crate) fn function(&self, name: &str) -> Result<sys::CUfunction, PersistentError> {
        let n = CString::new(name)
            .map_err(|_| PersistentError::Config("kernel name contains NUL".into()))?;
        // SAFETY: the module is loaded for our life; the function handle is only used while it is.
        unsafe { result::module::get_function(self.m, n) }.map_err(err("cuModuleGetFunction"))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded in `load_ptx`, unloaded once, no kernel of it running (see owner).
        let _ = unsafe { result::module::unload(self.m) };
    }
}

/// A non-blocking stream.
pub(crate) struct Stream {
    pub(crate) s: sys::CUstream,
    _ctx: Arc<Context>,
}

// SAFETY: stream handles may be used from any thread with the context current.
unsafe impl Send for Stream {}

/// What `cuStreamQuery` said.
pub(crate) enum StreamStatus {
    /// Work still running.
    Busy,
    /// All work finished.
    Done,
}

impl Stream {
    pub(crate) fn new(ctx: &Arc<Context>) -> Result<Self, PersistentError> {
        ctx.bind()?;
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(err("cuStreamCreate"))?;
        Ok(Stream {
            s,
            _ctx: ctx.clone(),
        })
    }

    /// Polls the stream: a device fault (trap, illegal address) comes back as `Err`.
    pub(crate) fn query(&self) -> Result<StreamStatus, DriverError> {
        // SAFETY: the stream is valid for our life.
        match unsafe { sys::cuStreamQuery(self.s) } {
            sys::CUresult::CUDA_SUCCESS => Ok(StreamStatus::Done),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(StreamStatus::Busy),
            e => Err(DriverError(e)),
        }
    }

    pub(crate) fn synchronize(&self) -> Result<(), PersistentError> {
        // SAFETY: the stream is valid.
        unsafe { result::stream::synchronize(self.s) }.map_err(err("cuStreamSynchronize"))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { result::stream::destroy(self.s) };
    }
}

/// Launches `f` with one block of `block` threads on `stream`, with `params` as the kernel's
/// argument pointers.
///
/// # Safety
/// `f` must belong to a loaded module and `params` must match its signature; every pointer the
/// arguments carry must stay valid until the kernel has finished.
pub(crate) unsafe fn launch(
    f: sys::CUfunction,
    block: u32,
    stream: &Stream,
    params: &mut [*mut c_void],
) -> Result<(), PersistentError> {
    result::launch_kernel(f, (1, 1, 1), (block, 1, 1), 0, stream.s, params)
        .map_err(err("cuLaunchKernel"))
}

/// Blocks of `f` with `block` threads that fit on one SM.
pub(crate) fn max_blocks_per_sm(f: sys::CUfunction, block: u32) -> Result<i32, PersistentError> {
    // SAFETY: `f` comes from a loaded module.
    unsafe { result::occupancy::max_active_block_per_multiprocessor(f, block as i32, 0) }
        .map_err(err("cuOccupancyMaxActiveBlocksPerMultiprocessor"))
}

/// An instantiated CUDA graph.
pub(crate) struct GraphExec {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl GraphExec {
    /// Captures what `record` enqueues on `stream` into a graph and instantiates it.
    pub(crate) fn capture(
        stream: &Stream,
        record: impl FnOnce() -> Result<(), PersistentError>,
    ) -> Result<Self, PersistentError> {
        // SAFETY: the stream is valid.
        unsafe {
            result::stream::begin_capture(
                stream.s,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(err("cuStreamBeginCapture"))?;
        let recorded = record();
        // SAFETY: ends the capture begun above, whatever `record` did.
        let graph =
            unsafe { result::stream::end_capture(stream.s) }.map_err(err("cuStreamEndCapture"));
        recorded?;
        let graph = graph?;
        // SAFETY: `graph` was just captured.
        let exec =
            match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
                Ok(e) => e,
                Err(e) => {
                    // SAFETY: destroy the graph we own.
                    let _ = unsafe { result::graph::destroy(graph) };
                    return Err(err("cuGraphInstantiate")(e));
                }
            };
        Ok(GraphExec { graph, exec })
    }

    pub(crate) fn launch(&self, stream: &Stream) -> Result<(), PersistentError> {
        // SAFETY: both handles are valid for our life.
        unsafe { result::graph::launch(self.exec, stream.s) }.map_err(err("cuGraphLaunch"))
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: owned handles, destroyed once.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}
