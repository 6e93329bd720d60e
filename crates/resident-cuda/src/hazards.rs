//! The driver's hazards for a resident kernel: which driver calls wait for every kernel of the
//! context to finish, and so never return while a ring kernel is resident.
//!
//! One table, [`DriverCall::synchronizes`], read by both launchers: the GPU launcher parks the
//! resident kernels around a call that synchronizes (or avoids the call: stream-ordered
//! allocation, the pinned [`arena`](crate::arena), modules loaded once), and CudaSim's driver
//! model (`resident_engine_cuda::sim::driver`, in the engine above this crate) makes such a
//! call wait for the running blocks exactly as the driver does, so a path that would hang on a
//! GPU fails on CudaSim in CI first.
//!
//! Sources, named per entry in [`DriverCall::source`]:
//! - **guide**: the CUDA C++ Programming Guide, "Implicit Synchronization" (streams): two
//!   commands from different streams cannot run concurrently if a page-locked host memory
//!   allocation, a device memory allocation, a device memory set, a copy between two addresses
//!   of the same device memory, or any command to the legacy NULL stream is issued between them.
//! - **api**: the driver API reference's notes: `cuMemFree`/`cuMemFreeHost` and module unload
//!   synchronize ("this function exhibits synchronous behavior for most use cases"); the
//!   synchronous `cuMemcpy*`/`cuMemset*` run on the legacy NULL stream; `cuCtxSynchronize` waits
//!   for every stream; `cuMemAllocAsync`/`cuMemFreeAsync` are stream-ordered (they wait only
//!   for their own stream); a launch that needs more local memory than the context holds
//!   resizes it, which waits for the device (`CU_CTX_LMEM_RESIZE_TO_MAX`'s note).
//! - **h200**: what the first GPU run showed (`shared/gpu-results/2026-11-27-h200`):
//!   `cuMemAlloc` + `cuMemFree` of 1 MiB did not return within 10 s while one ring kernel was
//!   resident. And `bench/results/gpu-h200-2026-11-28`: the 35th ring-kernel launch (one
//!   `cuStreamCreate` each) never returned with 34 resident, and the driver probe's 120 streams
//!   with a spinning kernel each took 7 s instead of about 1 (its spinners end themselves after
//!   3 s): `cuStreamCreate` now and then grows something of the driver's that waits for the
//!   device (also reported by pmodels/yaksa#228: "when a wait kernel is running, the CUDA
//!   stream creation will get blocked").

/// A driver call the launchers make, classified by whether it waits for the whole device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DriverCall {
    /// `cuMemAlloc`: device memory from the context's heap.
    MemAlloc,
    /// `cuMemFree`.
    MemFree,
    /// `cuMemAllocAsync` on a side stream, from the device's memory pool (stream-ordered).
    MemAllocAsync,
    /// `cuMemFreeAsync` on a side stream (stream-ordered).
    MemFreeAsync,
    /// `cuMemHostAlloc`: pinned, device-mapped host memory.
    MemHostAlloc,
    /// `cuMemFreeHost`.
    MemFreeHost,
    /// `cuModuleLoadData(Ex)` with every function loaded (eager loading).
    ModuleLoad,
    /// `cuModuleUnload`.
    ModuleUnload,
    /// `cuCtxSynchronize`.
    CtxSynchronize,
    /// A synchronous `cuMemcpyHtoD`/`cuMemcpyDtoH` (legacy NULL stream).
    MemcpySync,
    /// A synchronous `cuMemset*` (legacy NULL stream).
    MemsetSync,
    /// `cuMemcpy*Async` on a side (non-blocking) stream, then that stream's synchronize.
    MemcpyAsync,
    /// `cuStreamCreateWithFlags(CU_STREAM_NON_BLOCKING)`: usually quick, but now and then it
    /// waits for the device (h200), so it counts as synchronizing.
    StreamCreate,
    /// `cuLaunchKernel` of a function whose local memory fits what the context holds.
    LaunchKernel,
    /// `cuLaunchKernel` that must grow the context's local memory first.
    LaunchGrowingLocalMemory,
    /// `cuStreamQuery`: never waits.
    StreamQuery,
    /// `cuMemcpyHtoDAsync` from pinned host memory on a non-blocking copy stream, with no
    /// synchronize after it (the bulk input lane's copy engine).
    MemcpyHtoDAsyncPinned,
    /// `cuStreamWriteValue64` (or 32) of device memory on a non-blocking stream: a stream
    /// memory operation, ordered after the stream's earlier work (the bulk lane's tail).
    StreamWriteValue,
}

impl DriverCall {
    /// Every call, for tables and tests.
    pub const ALL: [DriverCall; 18] = [
        DriverCall::MemAlloc,
        DriverCall::MemFree,
        DriverCall::MemAllocAsync,
        DriverCall::MemFreeAsync,
        DriverCall::MemHostAlloc,
        DriverCall::MemFreeHost,
        DriverCall::ModuleLoad,
        DriverCall::ModuleUnload,
        DriverCall::CtxSynchronize,
        DriverCall::MemcpySync,
        DriverCall::MemsetSync,
        DriverCall::MemcpyAsync,
        DriverCall::StreamCreate,
        DriverCall::LaunchKernel,
        DriverCall::LaunchGrowingLocalMemory,
        DriverCall::StreamQuery,
        DriverCall::MemcpyHtoDAsyncPinned,
        DriverCall::StreamWriteValue,
    ];

    /// Whether the call waits until no kernel of the context runs (and so never returns while
    /// a ring kernel is resident).
    pub const fn synchronizes(self) -> bool {
        match self {
            DriverCall::MemAlloc
            | DriverCall::MemFree
            | DriverCall::MemHostAlloc
            | DriverCall::MemFreeHost
            | DriverCall::ModuleLoad
            | DriverCall::ModuleUnload
            | DriverCall::CtxSynchronize
            | DriverCall::MemcpySync
            | DriverCall::MemsetSync
            | DriverCall::StreamCreate
            | DriverCall::LaunchGrowingLocalMemory => true,
            DriverCall::MemAllocAsync
            | DriverCall::MemFreeAsync
            | DriverCall::MemcpyAsync
            | DriverCall::LaunchKernel
            | DriverCall::StreamQuery
            | DriverCall::MemcpyHtoDAsyncPinned
            | DriverCall::StreamWriteValue => false,
        }
    }

    /// The driver function's name.
    pub const fn name(self) -> &'static str {
        match self {
            DriverCall::MemAlloc => "cuMemAlloc",
            DriverCall::MemFree => "cuMemFree",
            DriverCall::MemAllocAsync => "cuMemAllocAsync",
            DriverCall::MemFreeAsync => "cuMemFreeAsync",
            DriverCall::MemHostAlloc => "cuMemHostAlloc",
            DriverCall::MemFreeHost => "cuMemFreeHost",
            DriverCall::ModuleLoad => "cuModuleLoadData",
            DriverCall::ModuleUnload => "cuModuleUnload",
            DriverCall::CtxSynchronize => "cuCtxSynchronize",
            DriverCall::MemcpySync => "cuMemcpy (synchronous)",
            DriverCall::MemsetSync => "cuMemset (synchronous)",
            DriverCall::MemcpyAsync => "cuMemcpyAsync (side stream)",
            DriverCall::StreamCreate => "cuStreamCreate",
            DriverCall::LaunchKernel => "cuLaunchKernel",
            DriverCall::LaunchGrowingLocalMemory => "cuLaunchKernel (local memory grows)",
            DriverCall::StreamQuery => "cuStreamQuery",
            DriverCall::MemcpyHtoDAsyncPinned => "cuMemcpyHtoDAsync (pinned, copy stream)",
            DriverCall::StreamWriteValue => "cuStreamWriteValue64",
        }
    }

    /// Where the classification comes from (see the module documentation).
    pub const fn source(self) -> &'static str {
        match self {
            DriverCall::MemAlloc => "guide (a device memory allocation); h200 (blocked > 10 s)",
            DriverCall::MemFree => "api (cuMemFree synchronizes); h200 (blocked > 10 s)",
            DriverCall::MemHostAlloc => "guide (a page-locked host memory allocation)",
            DriverCall::MemFreeHost => "api (cuMemFreeHost synchronizes)",
            DriverCall::ModuleLoad => "api (module load allocates and initializes device memory)",
            DriverCall::ModuleUnload => "api (module unload frees device memory)",
            DriverCall::CtxSynchronize => "api (waits for every stream of the context)",
            DriverCall::MemcpySync => "guide (any command to the legacy NULL stream)",
            DriverCall::MemsetSync => "guide (a device memory set; the NULL stream)",
            DriverCall::LaunchGrowingLocalMemory => {
                "api (a local memory resize waits for the device)"
            }
            DriverCall::MemAllocAsync | DriverCall::MemFreeAsync => {
                "api (stream-ordered: waits for its own stream only)"
            }
            DriverCall::MemcpyAsync => "api (ordered on its own non-blocking stream)",
            DriverCall::StreamCreate => {
                "h200 (the 35th launch hung with 34 ring kernels resident; 120 streams took 7 s)"
            }
            DriverCall::LaunchKernel => "api (asynchronous launch)",
            DriverCall::StreamQuery => "api (never blocks)",
            DriverCall::MemcpyHtoDAsyncPinned => {
                "api (asynchronous from page-locked memory; a non-blocking stream does not \
                 order against the NULL stream); not yet timed beside a resident kernel"
            }
            DriverCall::StreamWriteValue => {
                "api (a stream memory operation: enqueued, ordered on its stream only); not yet \
                 timed beside a resident kernel"
            }
        }
    }
}

impl std::fmt::Display for DriverCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calls_the_h200_and_the_guide_name_synchronize_and_their_replacements_do_not() {
        for c in [
            DriverCall::MemAlloc,
            DriverCall::MemFree,
            DriverCall::MemHostAlloc,
            DriverCall::MemFreeHost,
            DriverCall::ModuleLoad,
            DriverCall::ModuleUnload,
            DriverCall::CtxSynchronize,
            DriverCall::MemcpySync,
            DriverCall::MemsetSync,
            DriverCall::StreamCreate,
            DriverCall::LaunchGrowingLocalMemory,
        ] {
            assert!(c.synchronizes(), "{c}");
        }
        for c in [
            DriverCall::MemAllocAsync,
            DriverCall::MemFreeAsync,
            DriverCall::MemcpyAsync,
            DriverCall::LaunchKernel,
            DriverCall::MemcpyHtoDAsyncPinned,
            DriverCall::StreamWriteValue,
        ] {
            assert!(!c.synchronizes(), "{c}");
        }
        for c in DriverCall::ALL {
            assert!(!c.source().is_empty() && !c.name().is_empty());
        }
    }
}
