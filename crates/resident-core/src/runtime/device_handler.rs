//! The seam between the runtime and the engines that run ring kernels on devices.
//!
//! A kernel definition carries its device handlers type-erased, as [`DeviceHandler`]s: at
//! launch the runtime takes the one that runs on its engine and lets it launch itself. The
//! runtime names no engine and no handler type; an engine's handler (`CudaHandler` for CUDA
//! and CudaSim, `WgslHandler` for wgpu) implements the trait in the engine's own module, next
//! to the `RingKernel` builder method that adds it (`.cuda(..)`, `.wgsl(..)`). A new engine is
//! one handler type, one `DeviceHandler` impl and one `DeviceRing` for the pump
//! ([`crate::runtime::host::device`]); nothing above it changes.

use std::sync::Arc;

use crate::engine::error::DeviceError;
use crate::engine::BackendKind;
use crate::runtime::bind::{DeviceBinding, DeviceBuffers};
use crate::runtime::host::RingHost;
use crate::runtime::io::StateSnapshot;

/// What the runtime asks of an engine when it launches a ring kernel on it.
#[cfg_attr(
    not(any(feature = "cuda", feature = "cudasim", feature = "wgpu")),
    allow(dead_code)
)]
pub struct RingSpec<'a> {
    /// The kernel's id.
    pub id: &'a str,
    /// Priority lanes.
    pub lanes: usize,
    /// Messages per lane.
    pub queue_size: usize,
    /// Largest batch.
    pub batch_size: usize,
    /// The bound buffers' declarations and initial values (the engine keeps device copies).
    pub bindings: &'a [DeviceBinding],
}

/// A kernel launched on a device: the host side the runtime's host thread runs, the device
/// state's snapshot access and the bound buffers' device side, when the engine has them.
pub struct DeviceHosted<In, Out> {
    /// What the kernel's host thread runs (the engine's `DeviceRing` in a `DeviceHost`).
    pub host: Box<dyn RingHost<In, Out>>,
    /// The device state's snapshot access (`KernelHandle::snapshot_state`).
    pub state: Option<Arc<dyn StateSnapshot>>,
    /// The bound buffers' device side.
    pub buffers: Option<Arc<dyn DeviceBuffers>>,
}

/// A kernel's handler for one family of engines, carried type-erased by `RingKernel`.
pub trait DeviceHandler<In, Out>: Send + 'static {
    /// The handler's language, for messages ("CUDA", "WGSL"). A kernel has at most one
    /// handler per language: adding a second replaces the first.
    fn language(&self) -> &'static str;
    /// Whether this handler runs on `engine` (in this build).
    fn runs_on(&self, engine: BackendKind) -> bool;
    /// Whether it is a keyed kernel's handler (made with the engine's `keyed` constructor).
    fn keyed(&self) -> bool;
    /// What to add to "it has only a .. handler" when the runtime cannot run it.
    fn elsewhere_hint(&self) -> &'static str {
        ""
    }
    /// Launches the device side on `engine` (one for which `runs_on` held).
    fn launch(
        self: Box<Self>,
        engine: BackendKind,
        spec: &RingSpec<'_>,
    ) -> Result<DeviceHosted<In, Out>, DeviceError>;
}

/// A handler in CUDA C (`resident::prelude::CudaHandler`), for [`RingKernel::cuda`] and
/// [`RingKernel::key_cuda`](crate::runtime::kernel::RingKernel::key_cuda).
///
/// [`RingKernel::cuda`]: crate::runtime::kernel::RingKernel::cuda
pub trait CudaSource<In, Out>: DeviceHandler<In, Out> {}

/// A handler in WGSL (`resident::prelude::WgslHandler`), for [`RingKernel::wgsl`] and
/// [`RingKernel::key_wgsl`](crate::runtime::kernel::RingKernel::key_wgsl).
///
/// [`RingKernel::wgsl`]: crate::runtime::kernel::RingKernel::wgsl
pub trait WgslSource<In, Out>: DeviceHandler<In, Out> {}

/// A kernel definition's device handlers, at most one per language.
pub(crate) struct DeviceHandlers<In, Out>(Vec<Box<dyn DeviceHandler<In, Out>>>);

impl<In, Out> Default for DeviceHandlers<In, Out> {
    fn default() -> Self {
        DeviceHandlers(Vec::new())
    }
}

impl<In: 'static, Out: 'static> DeviceHandlers<In, Out> {
    /// Adds `handler`, replacing one of the same language.
    pub fn set(&mut self, handler: Box<dyn DeviceHandler<In, Out>>) {
        self.0.retain(|h| h.language() != handler.language());
        self.0.push(handler);
    }

    /// Takes the handler that runs on `engine`, if any.
    pub fn take_for(&mut self, engine: BackendKind) -> Option<Box<dyn DeviceHandler<In, Out>>> {
        let i = self.0.iter().position(|h| h.runs_on(engine))?;
        Some(self.0.swap_remove(i))
    }

    /// Whether one of the handlers runs on `engine`.
    pub fn runs_on(&self, engine: BackendKind) -> bool {
        self.0.iter().any(|h| h.runs_on(engine))
    }

    /// The first handler left (for messages about a handler the runtime cannot run).
    pub fn first(&self) -> Option<&dyn DeviceHandler<In, Out>> {
        self.0.first().map(|h| h.as_ref())
    }
}
