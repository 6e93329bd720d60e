//! wgpu's side of the seam ([`crate::engine`]): a kernel's [`WgslHandler`] launches a
//! `WgpuEngine` (batched re-dispatch, state resident in a storage buffer) for the one device
//! host to pump. The `RingKernel` builder methods that add a WGSL handler live here, with the
//! handler.

use bytemuck::Pod;
use resident_ring::message::CField;
use resident_ring::Message;

use crate::backend::wgpu::ring::WgslHandler;
use crate::backend::BackendKind;
use crate::engine::error::DeviceError;
use crate::engine::ring::{DeviceHandler, DeviceHosted, RingSpec};
use crate::runtime::kernel::RingKernel;
use crate::runtime::keyed::{device_keys, Keyed, Keys};

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
        use crate::backend::wgpu::{ring, WgpuContext};
        use crate::runtime::bind::DeviceBuffers;
        use crate::runtime::host::device::{DeviceHost, StateSnapshot};
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
        Err(DeviceError::Backend(crate::backend::not_compiled(engine)))
    }
}

impl<In: Message, Out: Message, S: Send + 'static> RingKernel<In, Out, S> {
    /// Runs the kernel's handler on a wgpu device: on a `Backend::Wgpu` runtime, `launch`
    /// compiles `handler` (WGSL), keeps its state in a device buffer for the kernel's life and
    /// feeds it pipelined batches behind the same
    /// [`KernelHandle`](crate::prelude::KernelHandle). On other backends the kernel uses its
    /// CPU `handler`/`run` (or its CUDA handler on CUDA).
    pub fn wgsl(mut self, handler: WgslHandler<In, Out>) -> Self {
        self.device.set(Box::new(handler));
        self
    }
}

impl<In: Message + Keyed, Out: Message, S: Pod + CField + Clone + Send + 'static>
    RingKernel<In, Out, Keys<S>>
{
    /// The WGSL handler of a keyed kernel, made with [`WgslHandler::keyed`]: on a wgpu
    /// runtime the per-key states live in a storage buffer for the kernel's life (bound as
    /// `keys`, `size_of::<S>()` bytes per key) and the handler gets its key's state as
    /// `ptr<function, KeyState>`; `snapshot_key(s)` read them back (a copy behind
    /// the batches already submitted). Other runtimes run the
    /// [`key_handler`](RingKernel::key_handler) (or the CUDA handler on CUDA and CudaSim).
    pub fn key_wgsl(mut self, handler: WgslHandler<In, Out>) -> Self {
        self.device.set(Box::new(handler));
        self.device_keys = Some(device_keys::<In, Out, S>());
        self
    }
}
