//! The CUDA family's side of the seam ([`resident_core::engine`]): a kernel's [`CudaHandler`] runs on
//! two launchers of one engine, the persistent kernel on a GPU (`cuda` feature) and the same
//! source on CudaSim's host threads (`cudasim` feature), both pumped by the one device host.
//! The `RingKernel` builder methods `.cuda(..)` and `.key_cuda(..)` take it as a
//! [`CudaSource`].

use resident_ring::Message;

use crate::ring::{CudaHandler, DeviceGeometry};
use resident_core::engine::error::DeviceError;
use resident_core::engine::BackendKind;
use resident_core::runtime::device_handler::{CudaSource, DeviceHandler, DeviceHosted, RingSpec};
use resident_core::runtime::host::device::{DeviceHost, DeviceRing};

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
                let (e, b, s) =
                    crate::ring::GpuEngine::launch(spec.id, &self, &geometry, spec.bindings)?;
                (Box::new(e), b, s)
            }
            #[cfg(feature = "cudasim")]
            BackendKind::CudaSim => {
                let (e, b, s) = crate::sim::engine::SimEngine::launch(
                    spec.id,
                    &self,
                    &geometry,
                    spec.bindings,
                )?;
                (Box::new(e), b, s)
            }
            other => {
                return Err(DeviceError::Backend(resident_core::engine::not_compiled(
                    other,
                )))
            }
        };
        Ok(DeviceHosted {
            host: Box::new(DeviceHost::new(ring)),
            state: Some(state),
            buffers,
        })
    }
}

impl<In: Message, Out: Message> CudaSource<In, Out> for CudaHandler<In, Out> {}
