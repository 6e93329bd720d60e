//! CUDA ring kernels: the user's [`CudaHandler`] and the persistent kernel on a GPU that runs
//! it (a [`DeviceRing`]); the same kernel source runs on CudaSim in
//! [`cuda_sim`](super::cuda_sim). The pump that drives them is
//! [`device_host`](super::device_host).

use std::time::Duration;

use resident_cuda::persistent::{
    KernelSource, LaunchOptions, MessageDecl, PersistentKernel, QueueConfig,
};
use resident_ring::{DeviceMessage, Message, Slot};

use crate::backend::device_host::{DeviceError, DeviceRing, RingCounters};

/// A ring kernel's handler in CUDA C: `__device__ bool handle(ResidentState* state,
/// const ResidentIn* in, ResidentOut* out, const Envelope* env)`, returning `false` for "no
/// output". `ResidentIn` / `ResidentOut` are typedefs of the message types' C declarations
/// (generated from the Rust types by `device_message!`), and the runtime adds `static_assert`s
/// on their sizes. All threads of a batch share `state`: mutate it with atomics.
pub struct CudaHandler<In, Out> {
    pub(crate) source: String,
    pub(crate) function: String,
    pub(crate) state: Vec<u8>,
    pub(crate) state_decl: MessageDecl,
    pub(crate) decls: (MessageDecl, MessageDecl),
    _types: std::marker::PhantomData<fn(In) -> Out>,
}

const NO_STATE_DECL: &str = "typedef struct { unsigned int unused; } ResidentNoState;\n";

impl<In: DeviceMessage, Out: DeviceMessage> CudaHandler<In, Out> {
    /// A handler named `handle` defined in `source`, with no device state.
    pub fn new(source: impl Into<String>) -> Self {
        CudaHandler {
            source: source.into(),
            function: "handle".into(),
            state: vec![0; 4],
            state_decl: MessageDecl::new("ResidentNoState", NO_STATE_DECL, 4),
            _types: std::marker::PhantomData,
            decls: (
                MessageDecl::new(In::C_NAME, In::c_declarations(), std::mem::size_of::<In>()),
                MessageDecl::new(
                    Out::C_NAME,
                    Out::c_declarations(),
                    std::mem::size_of::<Out>(),
                ),
            ),
        }
    }

    /// The name of the handler function in `source` (default `handle`).
    pub fn function(mut self, name: impl Into<String>) -> Self {
        self.function = name.into();
        self
    }

    /// Device state that persists across messages, initialized to `init`; the handler sees it
    /// as `ResidentState*` (a typedef of `D`'s C declaration).
    pub fn state<D: DeviceMessage>(mut self, init: D) -> Self {
        self.state = bytemuck::bytes_of(&init).to_vec();
        self.state_decl =
            MessageDecl::new(D::C_NAME, D::c_declarations(), std::mem::size_of::<D>());
        self
    }
}

impl<In, Out> CudaHandler<In, Out> {
    pub(crate) fn kernel_source(&self, id: &str, batch_size: u32) -> KernelSource {
        let mut source = KernelSource::new(
            id.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
            self.decls.0.clone(),
            self.decls.1.clone(),
            self.state_decl.clone(),
            self.source.clone(),
            batch_size,
        );
        source.handler_fn = self.function.clone();
        source
    }

    /// Compiles the handler inside the persistent-kernel template to PTX for `arch` (e.g.
    /// `compute_90`) with NVRTC, without a GPU: layout `static_assert`s and handler errors
    /// show up here, in CI, instead of at launch. Needs NVRTC (not the driver).
    pub fn compile_ptx(
        &self,
        kernel_id: &str,
        batch_size: usize,
        arch: &str,
    ) -> Result<String, DeviceError> {
        let g = DeviceGeometry::new(1, 2, batch_size);
        resident_cuda::persistent::compile_ptx(&self.kernel_source(kernel_id, g.batch_size), arch)
            .map(|k| k.ptx)
            .map_err(DeviceError::from)
    }
}

impl<In, Out> CudaHandler<In, Out> {
    /// Compiles the handler inside the persistent-kernel template all the way to machine code
    /// for `sm` (e.g. `sm_90`) with NVRTC, without a GPU, and returns `ptxas`'s report per entry
    /// (registers, stack, spills): inline PTX and launch bounds are checked here, in CI, rather
    /// than at load time on a device. Needs NVRTC (not the driver).
    pub fn sass_report(
        &self,
        kernel_id: &str,
        batch_size: usize,
        sm: &str,
    ) -> Result<Vec<resident_cuda::persistent::SassReport>, DeviceError> {
        let g = DeviceGeometry::new(1, 2, batch_size);
        resident_cuda::persistent::compile_sass_report(
            &self.kernel_source(kernel_id, g.batch_size),
            sm,
        )
        .map_err(DeviceError::from)
    }
}

/// Geometry shared by both engines.
pub(crate) struct DeviceGeometry {
    pub lanes: usize,
    pub lane_capacity: usize,
    pub out_capacity: usize,
    pub batch_size: u32,
}

impl DeviceGeometry {
    pub fn new(lanes: usize, queue_size: usize, batch_size: usize) -> Self {
        // The GPU's block size is the batch size: a multiple of 32 in 32..=1024.
        let batch = (batch_size.clamp(32, 1024).div_ceil(32) * 32) as u32;
        let lane_capacity = queue_size.next_power_of_two().max(2);
        DeviceGeometry {
            lanes: lanes.clamp(1, resident_cuda::persistent::MAX_LANES),
            lane_capacity,
            out_capacity: lane_capacity.max(batch as usize).next_power_of_two(),
            batch_size: batch,
        }
    }

    pub(crate) fn queues(&self) -> QueueConfig {
        QueueConfig {
            lanes: self.lanes,
            lane_capacity: self.lane_capacity,
            out_capacity: self.out_capacity,
        }
    }
}

/// A persistent kernel on a GPU.
pub(crate) struct GpuEngine<In: Message, Out: Message> {
    kernel: PersistentKernel<In, Out>,
}

impl<In: Message, Out: Message> GpuEngine<In, Out> {
    pub fn launch(
        id: &str,
        handler: &CudaHandler<In, Out>,
        g: &DeviceGeometry,
    ) -> Result<Self, DeviceError> {
        let source = handler.kernel_source(id, g.batch_size);
        let opts = LaunchOptions {
            queues: g.queues(),
            ..LaunchOptions::default()
        };
        let kernel = PersistentKernel::launch(&source, &handler.state, &opts)?;
        Ok(GpuEngine { kernel })
    }
}

impl<In: Message, Out: Message> DeviceRing<In, Out> for GpuEngine<In, Out> {
    fn push(&mut self, slots: &[Slot<In>]) -> usize {
        self.kernel.send_batch(slots)
    }
    fn pull(&mut self, out: &mut Vec<Slot<Out>>, max: usize) -> usize {
        self.kernel.receive_into(out, max)
    }
    fn set_active(&mut self, on: bool) -> Result<(), DeviceError> {
        Ok(if on {
            self.kernel.activate()
        } else {
            self.kernel.deactivate()
        }?)
    }
    fn heartbeat(&mut self) {
        // PersistentKernel runs its own heartbeat thread.
    }
    fn check(&mut self) -> Result<(), DeviceError> {
        Ok(self.kernel.check()?)
    }
    fn counters(&self) -> RingCounters {
        let c = self.kernel.device_counters();
        RingCounters {
            processed: c.processed,
            batches: c.batches,
            lost: c.undelivered,
        }
    }
    fn stop(&mut self, timeout: Duration) -> Result<(), DeviceError> {
        self.kernel.terminate(timeout)?;
        Ok(())
    }
    fn reclaim(&mut self) -> Vec<Slot<In>> {
        self.kernel.reclaim_input().unwrap_or_default()
    }
}
