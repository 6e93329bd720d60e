//! wgpu's side of the seam ([`resident_core::engine`]): a kernel's [`WgslHandler`] launches a
//! `WgpuEngine` (batched re-dispatch, state resident in a storage buffer) for the one device
//! host to pump. The `RingKernel` builder methods `.wgsl(..)` and `.key_wgsl(..)` take it as a
//! [`WgslSource`].

use resident_ring::Message;

use crate::ring::WgslHandler;
use resident_core::engine::error::DeviceError;
use resident_core::engine::BackendKind;
use resident_core::runtime::device_handler::{DeviceHandler, DeviceHosted, RingSpec, WgslSource};

impl<In: Message, Out: Message> DeviceHandler<In, Out> for WgslHandler<In, Out> {
    fn language(&self) -> &'static str {
        "WGSL"
    }

    fn runs_on(&self, engine: BackendKind) -> bool {
        engine == BackendKind::Wgpu && cfg!(feature = "wgpu")
    }

    fn keyed(&self) -> bool {
        self.key_field.is_some()
    }

    #[cfg(feature = "wgpu")]
    fn launch(
        self: Box<Self>,
        _engine: BackendKind,
        spec: &RingSpec<'_>,
    ) -> Result<DeviceHosted<In, Out>, DeviceError> {
        use crate::{ring, WgpuContext};
        use resident_core::runtime::bind::DeviceBuffers;
        use resident_core::runtime::host::device::{DeviceHost, StateSnapshot};
        use std::sync::Arc;
        let ctx = WgpuContext::shared(false)?;
        ring::check_bindings(&ctx, spec.bindings)?;
        let (engine, state, bound) =
            ring::WgpuEngine::launch(ctx, spec.id, &self, spec.batch_size, spec.bindings)?;
        Ok(DeviceHosted {
            host: Box::new(DeviceHost::new(Box::new(engine))),
            state: Some(state as Arc<dyn StateSnapshot>),
            buffers: bound.map(|b| b as Arc<dyn DeviceBuffers>),
        })
    }

    #[cfg(not(feature = "wgpu"))]
    fn launch(
        self: Box<Self>,
        engine: BackendKind,
        _spec: &RingSpec<'_>,
    ) -> Result<DeviceHosted<In, Out>, DeviceError> {
        Err(DeviceError::Backend(resident_core::engine::not_compiled(
            engine,
        )))
    }
}

impl<In: Message, Out: Message> WgslSource<In, Out> for WgslHandler<In, Out> {}
