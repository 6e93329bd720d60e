//! The CUDA family's side of the seam ([`crate::engine`]): a kernel's [`CudaHandler`] runs on
//! two launchers of one engine, the persistent kernel on a GPU (`cuda` feature) and the same
//! source on CudaSim's host threads (`cudasim` feature), both pumped by the one device host.
//! The `RingKernel` builder methods that add a CUDA handler live here, with the handler.

use bytemuck::Pod;
use resident_ring::message::CField;
use resident_ring::Message;

use crate::backend::cuda_ring::{CudaHandler, DeviceGeometry};
use crate::backend::BackendKind;
use crate::engine::error::DeviceError;
use crate::engine::ring::{DeviceHandler, DeviceHosted, RingSpec};
use crate::runtime::host::device::{DeviceHost, DeviceRing};
use crate::runtime::kernel::RingKernel;
use crate::runtime::keyed::{device_keys, Keyed, Keys};

impl<In: Message, Out: Message> DeviceHandler<In, Out> for CudaHandler<In, Out> {
    fn language(&self) -> &'static str {
        "CUDA"
    }

    fn runs_on(&self, engine: BackendKind) -> bool {
        (engine == BackendKind::Cuda && cfg!(feature = "cuda"))
            || (engine == BackendKind::CudaSim && cfg!(feature = "cudasim"))
    }

    fn keyed(&self) -> bool {
        self.key_field.is_some()
    }

    fn elsewhere_hint(&self) -> &'static str {
        ", or run it on Backend::CudaSim (the same CUDA source on host threads)"
    }

    #[cfg_attr(
        not(any(feature = "cuda", feature = "cudasim")),
        allow(unreachable_code, unused_variables)
    )]
    fn launch(
        self: Box<Self>,
        engine: BackendKind,
        spec: &RingSpec<'_>,
    ) -> Result<DeviceHosted<In, Out>, DeviceError> {
        let geometry = DeviceGeometry::new(spec.lanes, spec.queue_size, spec.batch_size);
        // Both launchers take the bound buffers (device copies for the kernel's life, and the
        // synchronized host access the runtime routes `read_buffer` / `write_buffer` through)
        // and read the state back the same way: the kernel parked between two batches.
        let (ring, buffers, state): (Box<dyn DeviceRing<In, Out>>, _, _) = match engine {
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => {
                let (e, b, s) = crate::backend::cuda_ring::GpuEngine::launch(
                    spec.id,
                    &self,
                    &geometry,
                    spec.bindings,
                )?;
                (Box::new(e), b, s)
            }
            #[cfg(feature = "cudasim")]
            BackendKind::CudaSim => {
                let (e, b, s) = crate::backend::cuda_sim::SimEngine::launch(
                    spec.id,
                    &self,
                    &geometry,
                    spec.bindings,
                )?;
                (Box::new(e), b, s)
            }
            other => return Err(DeviceError::Backend(crate::backend::not_compiled(other))),
        };
        Ok(DeviceHosted {
            host: Box::new(DeviceHost::new(ring)),
            state: Some(state),
            buffers,
        })
    }
}

impl<In: Message, Out: Message, S: Send + 'static> RingKernel<In, Out, S> {
    /// Runs the kernel's handler on the GPU: on a CUDA runtime, `launch` compiles `handler`
    /// into a persistent kernel, launched once, fed through pinned device-mapped queues, and
    /// the same [`KernelHandle`](crate::prelude::KernelHandle) API drives it. On
    /// `Backend::CudaSim` the same source runs on host threads (compiled by the host C++
    /// compiler). On the CPU backend the kernel uses its CPU `handler`/`run`.
    pub fn cuda(mut self, handler: CudaHandler<In, Out>) -> Self {
        self.device.set(Box::new(handler));
        self
    }
}

impl<In: Message + Keyed, Out: Message, S: Pod + CField + Clone + Send + 'static>
    RingKernel<In, Out, Keys<S>>
{
    /// The CUDA handler of a keyed kernel, made with [`CudaHandler::keyed`]: on a CUDA or
    /// CudaSim runtime the per-key states live in device memory for the kernel's life (bound
    /// as the buffer `keys`, `size_of::<S>()` bytes per key) and the handler gets its key's
    /// state; `snapshot_key(s)` read them back (the kernel parks between two batches for it).
    /// Other runtimes run the [`key_handler`](RingKernel::key_handler).
    pub fn key_cuda(mut self, handler: CudaHandler<In, Out>) -> Self {
        self.device.set(Box::new(handler));
        self.device_keys = Some(device_keys::<In, Out, S>());
        self
    }
}
