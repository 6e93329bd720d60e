//! CUDA ring kernels: the user's [`CudaHandler`], the one `DeviceRing` of the engine
//! (`CudaRing`, over a persistent kernel on either launcher) and the GPU launcher (the `cuda`
//! feature); the same kernel source runs on CudaSim in [`crate::sim`] (the `cudasim` feature).
//! The pump that drives them is `resident_core::runtime::host::device`.

#[cfg(feature = "cuda")]
use crate::seam::SeamResult;
use std::sync::Arc;
#[cfg(any(feature = "cuda", feature = "cudasim"))]
use std::time::Duration;

#[cfg(any(feature = "cuda", feature = "cudasim"))]
use crate::persistent::PersistentQueues;
use crate::persistent::{
    BufferDecl, BufferInit, ExternalFn, KernelSource, MessageDecl, QueueConfig,
};
#[cfg(feature = "cuda")]
use crate::persistent::{GpuBuffers, LaunchOptions, PersistentKernel};
use resident_ring::message::{CField, LayoutError, StructLayout};
#[cfg(any(feature = "cuda", feature = "cudasim"))]
use resident_ring::Slot;
use resident_ring::{DeviceMessage, Message};

use resident_core::engine::error::DeviceError;
use resident_core::runtime::bind::{DeviceBinding, DeviceBuffers, ElemDecl};
#[cfg(any(feature = "cuda", feature = "cudasim"))]
use resident_core::runtime::host::device::StateSnapshot;
#[cfg(any(feature = "cuda", feature = "cudasim"))]
use resident_core::runtime::host::device::{DeviceLink, DeviceRing, RingCounters};
#[cfg(any(feature = "cuda", feature = "cudasim"))]
use resident_core::{engine::BackendKind, runtime::io::KernelIo};

#[cfg(any(feature = "cuda", feature = "cudasim"))]
use crate::forward::{CudaInbox, ForwardRing, Forwarder};

pub use resident_core::engine::BUFFER_SYNC_TIMEOUT;

/// A ring kernel's handler in CUDA C: `__device__ bool handle(ResidentState* state,
/// const ResidentIn* in, ResidentOut* out, const Envelope* env)`, returning `false` for "no
/// output". `ResidentIn` / `ResidentOut` are typedefs of the message types' C declarations
/// (generated from the Rust types by `device_message!`), and the runtime adds `static_assert`s
/// on their sizes. All threads of a batch share `state`: mutate it with atomics.
///
/// # Bound buffers
/// A kernel with buffers bound (`RingKernel::bind(name, UnifiedBuffer<T>)`) calls the handler
/// with a fifth argument:
///
/// ```c
/// __device__ bool handle(ResidentState* state, const ResidentIn* in, ResidentOut* out,
///                        const Envelope* env, ResidentBuffers* buffers);
/// ```
///
/// `ResidentBuffers` is generated from the bindings, in `bind` order: for each buffer `name`
/// holding `T`, the members `T* name` (its device copy), `unsigned long long name_len`
/// (elements) and `unsigned long long name_id` (its `BufferId`, what a message carries to name
/// it: compare it with `buffers->name_id`). `T` is the C declaration of the element type
/// (from its `CField` impl: `float`, `double`, a `device_message!` struct), declared once and
/// `static_assert`ed to the Rust size; buffer names must be C identifiers. The buffers stay in
/// device memory for the kernel's life (on CudaSim, host memory the block's threads use), start
/// as the host values at launch, and every thread of a batch sees the same memory: threads that
/// write the same elements must use atomics or an order of their own. The table itself lives in
/// device memory, written once before the launch, and reaches the kernel as a pointer in its
/// launch parameters. The host's `read_buffer` / `write_buffer` are synchronized with the
/// kernel: they park it between two batches (the residency rule's quiesce), copy, and relaunch
/// it, so a read never sees a batch half done and a write is seen whole by the next batch
/// (bounded by [`BUFFER_SYNC_TIMEOUT`]). After the kernel ended, a read returns its last values.
/// Each access costs a park and a relaunch (on a GPU of every resident kernel of the device,
/// the residency rule): it is for occasional reads and writes, not a data path. Between two
/// accesses the kernel runs a batch or at least 1 ms
/// (`crate::persistent::MIN_RUN_BETWEEN_ACCESSES`; on a GPU the 1 ms only), so a host
/// reading back to back slows the kernel down but does not starve it.
///
/// Declaring the buffers on the handler too ([`CudaHandler::buffer`]) lets
/// `compile_ptx` / `sass_report` (NVRTC, with the `cuda` feature) see
/// the exact source the launch compiles; a launch whose bindings differ from the declared ones
/// is refused ([`DeviceError::Binding`]). Without declarations the launch takes the bindings as
/// they are.
pub struct CudaHandler<In, Out> {
    pub(crate) source: String,
    pub(crate) function: String,
    pub(crate) state: Vec<u8>,
    pub(crate) state_decl: MessageDecl,
    pub(crate) decls: (MessageDecl, MessageDecl),
    /// Buffers declared for compile checks (name, element declaration), in `bind` order.
    pub(crate) buffers: Vec<(String, ElemDecl)>,
    /// A keyed kernel's key field in the input message (`CudaHandler::keyed`).
    pub(crate) key_field: Option<String>,
    /// A function compiled outside the template that `source` calls (`CudaHandler::external`).
    pub(crate) external: Option<ExternalFn>,
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
            buffers: Vec::new(),
            key_field: None,
            external: None,
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

    /// Device state that persists across messages, initialized to `init`; the handler sees it
    /// as `ResidentState*` (a typedef of `D`'s C declaration).
    pub fn state<D: DeviceMessage>(mut self, init: D) -> Self {
        self.state = bytemuck::bytes_of(&init).to_vec();
        self.state_decl =
            MessageDecl::new(D::C_NAME, D::c_declarations(), std::mem::size_of::<D>());
        self
    }

    /// The handler of a keyed kernel (`RingKernel::keyed`, launched with
    /// `RingKernel::key_cuda`) whose per-key state is `K` and whose input messages name their
    /// key in the field `key_field` (the field the message's `Keyed::key` returns). The
    /// handler is
    ///
    /// ```c
    /// __device__ bool handle(KeyState* ks, const ResidentIn* in, ResidentOut* out,
    ///                        const Envelope* env);
    /// ```
    ///
    /// with `KeyState` the C declaration of `K` and `ks` the state of the message's key, in
    /// device memory for the kernel's life (bound as the buffer `keys`). One thread per
    /// message; the messages of one key run one after another in the order sent (within a
    /// priority lane), with no host-side ticket: the persistent kernel runs a batch in rounds,
    /// the `r`-th message of each key in round `r`, so a handler touches its key's state
    /// without atomics, and different keys run in parallel.
    pub fn keyed<K: bytemuck::Pod + CField>(mut self, key_field: impl Into<String>) -> Self {
        self.key_field = Some(key_field.into());
        self.buffers.retain(|(n, _)| n != "keys");
        self.buffers.insert(0, ("keys".into(), ElemDecl::of::<K>()));
        self
    }

    /// Declares the bound buffer `name` holding `T` (the next one in `bind` order), so compile
    /// checks see `ResidentBuffers` exactly as the launch will; the kernel must then bind the
    /// same names and element types, in the same order.
    pub fn buffer<T: bytemuck::Pod + CField>(mut self, name: impl Into<String>) -> Self {
        self.buffers.push((name.into(), ElemDecl::of::<T>()));
        self
    }
}

impl<In: Message, Out: Message> CudaHandler<In, Out> {
    /// A function compiled elsewhere that `source` calls by its C name (the Python package's
    /// `numba=` handlers): the template declares it, nvJitLink links its LTO-IR into the
    /// kernel on a GPU and CudaSim calls its native form (see [`ExternalFn`]).
    pub fn external(mut self, f: ExternalFn) -> Self {
        self.external = Some(f);
        self
    }

    /// The name of the handler function in `source` (default `handle`).
    pub fn function(mut self, name: impl Into<String>) -> Self {
        self.function = name.into();
        self
    }

    /// A handler named `handle` defined in `source` whose message layouts are known only at
    /// run time (the Python package's numpy dtypes): `input` and `output` are declared from
    /// their [`StructLayout`]s exactly as `device_message!` declares a Rust type, and must have
    /// the size of `In` / `Out` (the bytes the ring carries). No device state until
    /// [`state_layout`](Self::state_layout).
    pub fn with_layouts(
        source: impl Into<String>,
        input: &StructLayout,
        output: &StructLayout,
    ) -> Result<Self, LayoutError> {
        input.expect_size(std::mem::size_of::<In>())?;
        output.expect_size(std::mem::size_of::<Out>())?;
        Ok(CudaHandler {
            source: source.into(),
            function: "handle".into(),
            state: vec![0; 4],
            state_decl: MessageDecl::new("ResidentNoState", NO_STATE_DECL, 4),
            buffers: Vec::new(),
            _types: std::marker::PhantomData,
            decls: io_decls(input, output)?,
            key_field: None,
            external: None,
        })
    }

    /// Device state laid out as `layout`, initialized to `init` (exactly `layout.size()`
    /// bytes); the handler sees it as `ResidentState*`.
    pub fn state_layout(
        mut self,
        layout: &StructLayout,
        init: Vec<u8>,
    ) -> Result<Self, LayoutError> {
        if init.len() != layout.size() {
            return Err(LayoutError {
                layout: layout.name().to_string(),
                field: None,
                reason: format!(
                    "the initial state has {} bytes, the layout {}",
                    init.len(),
                    layout.size()
                ),
            });
        }
        self.state = init;
        self.state_decl = MessageDecl::new(layout.name(), layout.c_declaration(), layout.size());
        Ok(self)
    }
}

/// The C declarations of the input and output layouts; one declaration when both are the
/// same struct (the same name for two different layouts is refused).
fn io_decls(
    input: &StructLayout,
    output: &StructLayout,
) -> Result<(MessageDecl, MessageDecl), LayoutError> {
    let inp = MessageDecl::new(input.name(), input.c_declaration(), input.size());
    if output.name() != input.name() {
        let out = MessageDecl::new(output.name(), output.c_declaration(), output.size());
        return Ok((inp, out));
    }
    if output != input {
        return Err(LayoutError {
            layout: output.name().to_string(),
            field: None,
            reason: "the input and output layouts differ but have the same name".into(),
        });
    }
    Ok((inp, MessageDecl::new(output.name(), "", output.size())))
}

/// The device declaration of one bound buffer, or why it has none.
fn buffer_decl(name: &str, elem: &ElemDecl) -> Result<BufferDecl, DeviceError> {
    let refuse = |reason: String| DeviceError::Binding {
        name: name.to_string(),
        reason,
    };
    if !crate::persistent::is_c_identifier(name) {
        return Err(refuse(
            "a CUDA handler names it `buffers-><name>`, so the name must be a C identifier (letters, digits, `_`)".into(),
        ));
    }
    if elem.c_type.contains('[') {
        return Err(refuse(format!(
            "its element type `{}` is an array, which has no CUDA pointer type; wrap it in a device_message! struct",
            elem.c_type
        )));
    }
    Ok(BufferDecl {
        name: name.to_string(),
        c_type: elem.c_type.clone(),
        c_deps: elem.c_deps.clone(),
        elem_size: elem.size,
    })
}

impl<In, Out> CudaHandler<In, Out> {
    /// The declarations of the buffers bound at launch, checked against the handler's own.
    fn bound_decls(&self, bindings: &[DeviceBinding]) -> Result<Vec<BufferDecl>, DeviceError> {
        if !self.buffers.is_empty() {
            let declared: Vec<(&str, &str)> = self
                .buffers
                .iter()
                .map(|(n, e)| (n.as_str(), e.c_type.as_str()))
                .collect();
            let bound: Vec<(&str, &str)> = bindings
                .iter()
                .map(|b| (b.name.as_str(), b.elem.c_type.as_str()))
                .collect();
            if declared != bound {
                let name = bindings
                    .iter()
                    .map(|b| b.name.clone())
                    .chain(self.buffers.iter().map(|b| b.0.clone()))
                    .next()
                    .unwrap_or_default();
                return Err(DeviceError::Binding {
                    name,
                    reason: format!(
                        "the CUDA handler declares the buffers {declared:?} (name, C type) but the kernel binds {bound:?}"
                    ),
                });
            }
        }
        bindings
            .iter()
            .map(|b| buffer_decl(&b.name, &b.elem))
            .collect()
    }

    #[cfg(feature = "cuda")]
    fn declared_decls(&self) -> Result<Vec<BufferDecl>, DeviceError> {
        self.buffers
            .iter()
            .map(|(n, e)| buffer_decl(n, e))
            .collect()
    }

    pub(crate) fn kernel_source(
        &self,
        id: &str,
        batch_size: u32,
        buffers: Vec<BufferDecl>,
    ) -> KernelSource {
        let mut source = KernelSource::new(
            id.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
            self.decls.0.clone(),
            self.decls.1.clone(),
            self.state_decl.clone(),
            self.source.clone(),
            batch_size,
        );
        source.handler_fn = self.function.clone();
        source.key_field = self.key_field.clone();
        source.external = self.external.clone();
        source.with_buffers(buffers)
    }

    /// The source and the buffers' initial values for a launch with `bindings`.
    pub(crate) fn launch_source(
        &self,
        id: &str,
        batch_size: u32,
        bindings: &[DeviceBinding],
    ) -> Result<(KernelSource, Vec<BufferInit>), DeviceError> {
        let decls = self.bound_decls(bindings)?;
        let inits = bindings
            .iter()
            .map(|b| BufferInit {
                id: b.id.0,
                len: b.len,
                initial: b.initial.clone(),
            })
            .collect();
        Ok((self.kernel_source(id, batch_size, decls), inits))
    }

    #[cfg(feature = "cuda")]
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
        let source = self.kernel_source(kernel_id, g.batch_size, self.declared_decls()?);
        crate::persistent::compile_ptx(&source, arch)
            .map(|k| k.ptx)
            .seam()
    }
}

impl<In, Out> CudaHandler<In, Out> {
    #[cfg(feature = "cuda")]
    /// Compiles the handler inside the persistent-kernel template all the way to machine code
    /// for `sm` (e.g. `sm_90`) with NVRTC, without a GPU, and returns `ptxas`'s report per entry
    /// (registers, stack, spills): inline PTX and launch bounds are checked here, in CI, rather
    /// than at load time on a device. Needs NVRTC (not the driver).
    pub fn sass_report(
        &self,
        kernel_id: &str,
        batch_size: usize,
        sm: &str,
    ) -> Result<Vec<crate::persistent::SassReport>, DeviceError> {
        let g = DeviceGeometry::new(1, 2, batch_size);
        let source = self.kernel_source(kernel_id, g.batch_size, self.declared_decls()?);
        crate::persistent::compile_sass_report(&source, sm).seam()
    }

    #[cfg(feature = "cuda")]
    /// Links the handler's [`external`](CudaHandler::external) function into the
    /// persistent-kernel template's machine code for `sm` (e.g. `sm_90`) with NVRTC and
    /// nvJitLink, without a GPU, and returns the CUBIN: what a launch on a device of that
    /// architecture loads. Needs NVRTC and nvJitLink (not the driver).
    pub fn link_cubin(
        &self,
        kernel_id: &str,
        batch_size: usize,
        sm: &str,
    ) -> Result<Vec<u8>, DeviceError> {
        let g = DeviceGeometry::new(1, 2, batch_size);
        let source = self.kernel_source(kernel_id, g.batch_size, self.declared_decls()?);
        crate::persistent::link_cubin(&source, sm).seam()
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
            lanes: lanes.clamp(1, crate::persistent::MAX_LANES),
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

#[cfg(feature = "cuda")]
/// A persistent kernel on a GPU, as the one CUDA ring.
pub(crate) type GpuEngine<In, Out> = CudaRing<In, Out, PersistentKernel<In, Out>>;

/// The engines' bound buffers as the runtime's [`DeviceBuffers`]: sizes checked per binding,
/// then the engine's synchronized copy.
pub(crate) struct BoundBuffers<B> {
    pub(crate) inner: Arc<B>,
    /// Name and byte length of each binding.
    pub(crate) shape: Vec<(String, usize)>,
}

/// The engine side of [`BoundBuffers`].
pub(crate) trait EngineBuffers: Send + Sync {
    fn read(&self, index: usize, out: &mut [u8]) -> Result<(), DeviceError>;
    fn write(&self, index: usize, data: &[u8]) -> Result<(), DeviceError>;
}

#[cfg(feature = "cuda")]
impl EngineBuffers for GpuBuffers {
    fn read(&self, index: usize, out: &mut [u8]) -> Result<(), DeviceError> {
        GpuBuffers::read(self, index, out, BUFFER_SYNC_TIMEOUT).seam()
    }
    fn write(&self, index: usize, data: &[u8]) -> Result<(), DeviceError> {
        GpuBuffers::write(self, index, data, BUFFER_SYNC_TIMEOUT).seam()
    }
}

/// What a CUDA engine's launch hands the runtime: the engine, its bound buffers (if any) and
/// its state.
#[cfg(any(feature = "cuda", feature = "cudasim"))]
pub(crate) type Launched<E> = (E, Option<Arc<dyn DeviceBuffers>>, Arc<dyn StateSnapshot>);

/// The state of a kernel on a GPU, read between two batches under the residency rule.
#[cfg(feature = "cuda")]
struct GpuStateRead(Arc<crate::persistent::GpuState>);

#[cfg(feature = "cuda")]
impl StateSnapshot for GpuStateRead {
    fn read(&self) -> Result<Vec<u8>, DeviceError> {
        self.0.read(BUFFER_SYNC_TIMEOUT).seam()
    }
}

impl<B> BoundBuffers<B> {
    pub(crate) fn new(inner: Arc<B>, bindings: &[DeviceBinding]) -> Self {
        BoundBuffers {
            inner,
            shape: bindings
                .iter()
                .map(|b| (b.name.clone(), b.initial.len()))
                .collect(),
        }
    }

    fn check(&self, index: usize, bytes: usize) -> Result<(), DeviceError> {
        match self.shape.get(index) {
            Some((_, n)) if *n == bytes => Ok(()),
            Some((name, n)) => Err(DeviceError::Binding {
                name: name.clone(),
                reason: format!("the host side has {bytes} bytes, the device copy {n}"),
            }),
            None => Err(DeviceError::Binding {
                name: format!("#{index}"),
                reason: format!("the kernel has {} bound buffers", self.shape.len()),
            }),
        }
    }
}

impl<B: EngineBuffers + 'static> DeviceBuffers for BoundBuffers<B> {
    fn read(&self, index: usize, out: &mut [u8]) -> Result<(), DeviceError> {
        self.check(index, out.len())?;
        self.inner.read(index, out)
    }
    fn write(&self, index: usize, data: &[u8]) -> Result<(), DeviceError> {
        self.check(index, data.len())?;
        self.inner.write(index, data)
    }
}

#[cfg(feature = "cuda")]
impl<In: Message, Out: Message> CudaRing<In, Out, PersistentKernel<In, Out>> {
    pub fn launch(
        id: &str,
        handler: &CudaHandler<In, Out>,
        g: &DeviceGeometry,
        bindings: &[DeviceBinding],
    ) -> Result<Launched<Self>, DeviceError> {
        let (source, buffers) = handler.launch_source(id, g.batch_size, bindings)?;
        let opts = LaunchOptions {
            queues: g.queues(),
            buffers,
            // RESIDENT_BULK_LANE / RESIDENT_BULK_THRESHOLD; a bad value is a typed error.
            bulk: crate::persistent::BulkConfig::from_env().seam()?,
            ..LaunchOptions::default()
        };
        let kernel = PersistentKernel::launch(&source, &handler.state, &opts).seam()?;
        let buffers = kernel
            .buffers()
            .map(|b| Arc::new(BoundBuffers::new(b, bindings)) as Arc<dyn DeviceBuffers>);
        let state: Arc<dyn StateSnapshot> = Arc::new(GpuStateRead(kernel.state()));
        Ok((CudaRing::new(kernel, BackendKind::Cuda), buffers, state))
    }
}

/// What the one CUDA ring ([`CudaRing`]) needs of a persistent ring kernel: the same
/// template, queues and control block on a GPU (`PersistentKernel`) and on CudaSim's host
/// threads (`SimKernel`). The two launchers differ in how they start a kernel, not in how it is
/// driven.
#[cfg(any(feature = "cuda", feature = "cudasim"))]
pub(crate) trait ResidentKernel<In: Message, Out: Message>: ForwardRing + Send {
    /// The host side of the kernel's queues: the ring's `push` and `pull` go straight to it.
    fn queues(&mut self) -> &mut PersistentQueues<In, Out>;
    fn set_active(&mut self, on: bool) -> Result<(), DeviceError>;
    /// Tells the kernel its host is alive (a GPU kernel's own heartbeat thread does it there).
    fn heartbeat(&mut self);
    fn check(&mut self) -> Result<(), DeviceError>;
    fn device_counters(&self) -> crate::persistent::DeviceCounters;
    fn terminate(&mut self, timeout: Duration) -> Result<(), DeviceError>;
    fn reclaim_input(&mut self) -> Option<Vec<Slot<In>>>;
    fn peer_input(&self) -> Arc<crate::persistent::PeerInput>;
    /// As `DeviceRing::host_dilation`: 1 on a GPU.
    fn host_dilation(&self) -> u32 {
        1
    }
}

#[cfg(feature = "cuda")]
impl<In: Message, Out: Message> ResidentKernel<In, Out> for PersistentKernel<In, Out> {
    fn queues(&mut self) -> &mut PersistentQueues<In, Out> {
        PersistentKernel::queues(self)
    }
    fn set_active(&mut self, on: bool) -> Result<(), DeviceError> {
        if on {
            self.activate()
        } else {
            self.deactivate()
        }
        .seam()
    }
    fn heartbeat(&mut self) {
        // PersistentKernel runs its own heartbeat thread.
    }
    fn check(&mut self) -> Result<(), DeviceError> {
        PersistentKernel::check(self).seam()
    }
    fn device_counters(&self) -> crate::persistent::DeviceCounters {
        PersistentKernel::device_counters(self)
    }
    fn terminate(&mut self, timeout: Duration) -> Result<(), DeviceError> {
        PersistentKernel::terminate(self, timeout).seam()?;
        Ok(())
    }
    fn reclaim_input(&mut self) -> Option<Vec<Slot<In>>> {
        PersistentKernel::reclaim_input(self)
    }
    fn peer_input(&self) -> Arc<crate::persistent::PeerInput> {
        PersistentKernel::peer_input(self)
    }
}

#[cfg(feature = "cuda")]
impl<In: Message, Out: Message> ForwardRing for PersistentKernel<In, Out> {
    fn output_peer_ring(&self) -> Option<crate::persistent::PeerRing> {
        PersistentKernel::output_peer_ring(self)
    }
    unsafe fn resync_output(&mut self) -> Result<(), DeviceError> {
        // SAFETY: the caller's contract (the link's phase is Free).
        unsafe { PersistentKernel::resync_output(self) }.seam()
    }
}

/// The one `DeviceRing` of the CUDA engine, over a persistent kernel on either launcher. It
/// holds what the seam adds to a kernel (its inbox as a forwarding consumer, its link as a
/// producer), once for both launchers; each seam method is one call into the kernel, under the
/// seam's own name where the kernel has it (`terminate`, `reclaim_input`, `check`).
#[cfg(any(feature = "cuda", feature = "cudasim"))]
pub(crate) struct CudaRing<In, Out, K> {
    pub kernel: K,
    /// This kernel as a consumer: its peer-input slot, offered on its input port.
    inbox: Arc<CudaInbox>,
    /// This kernel as a producer: its link to its forward target (from `attach` on).
    forward: Option<Forwarder<In, Out>>,
}

#[cfg(any(feature = "cuda", feature = "cudasim"))]
impl<In: Message, Out: Message, K: ResidentKernel<In, Out>> CudaRing<In, Out, K> {
    pub(crate) fn new(kernel: K, backend: BackendKind) -> Self {
        let inbox = Arc::new(CudaInbox {
            backend,
            peer: kernel.peer_input(),
        });
        CudaRing {
            kernel,
            inbox,
            forward: None,
        }
    }
}

#[cfg(any(feature = "cuda", feature = "cudasim"))]
impl<In: Message, Out: Message, K: ResidentKernel<In, Out>> DeviceRing<In, Out>
    for CudaRing<In, Out, K>
{
    fn push(&mut self, slots: &[Slot<In>]) -> usize {
        self.kernel.queues().send_batch(slots)
    }
    fn pull(&mut self, out: &mut Vec<Slot<Out>>, max: usize) -> usize {
        self.kernel.queues().receive_into(out, max)
    }
    fn set_active(&mut self, on: bool) -> Result<(), DeviceError> {
        self.kernel.set_active(on)
    }
    fn heartbeat(&mut self) {
        self.kernel.heartbeat();
    }
    fn check(&mut self) -> Result<(), DeviceError> {
        self.kernel.check()
    }
    fn counters(&self) -> RingCounters {
        let c = self.kernel.device_counters();
        RingCounters {
            processed: c.processed,
            batches: c.batches,
            lost: c.undelivered,
            forwarded: c.peer_taken,
        }
    }
    fn terminate(&mut self, timeout: Duration) -> Result<(), DeviceError> {
        let stopped = self.kernel.terminate(timeout);
        // As a consumer: once the block has ended for good, a linked producer owns its ring
        // again.
        if stopped.is_ok() {
            self.inbox.peer.close();
        }
        stopped
    }
    fn reclaim_input(&mut self) -> Vec<Slot<In>> {
        self.kernel.reclaim_input().unwrap_or_default()
    }
    fn attach(&mut self, io: &Arc<KernelIo<In, Out>>) {
        *io.device_link().lock() = Some(self.inbox.clone());
        self.forward = Some(Forwarder::new(
            io,
            self.inbox.backend,
            self.kernel.host_dilation(),
        ));
    }
    fn device_link(&self) -> Option<Arc<dyn DeviceLink>> {
        Some(self.inbox.clone())
    }
    fn forward_round(&mut self, drained: bool) -> Result<bool, DeviceError> {
        // As a consumer: link a requested peer ring once everything accepted before is in
        // the device lanes.
        self.inbox.peer.service(drained);
        match &mut self.forward {
            Some(f) => f.step(&mut self.kernel),
            None => Ok(true),
        }
    }
    fn release_output(&mut self) -> bool {
        match &mut self.forward {
            Some(f) => f.release(&mut self.kernel),
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use resident_core::runtime::bind::BufferId;

    resident_ring::device_message! {
        /// A test message.
        pub struct M { pub x: u32 }
    }

    /// Records what reached the engine.
    #[derive(Default)]
    struct Recorder(parking_lot::Mutex<Vec<(usize, usize)>>);

    impl EngineBuffers for Recorder {
        fn read(&self, index: usize, out: &mut [u8]) -> Result<(), DeviceError> {
            self.0.lock().push((index, out.len()));
            Ok(())
        }
        fn write(&self, index: usize, data: &[u8]) -> Result<(), DeviceError> {
            self.0.lock().push((index, data.len()));
            Ok(())
        }
    }

    fn binding(name: &str, len: usize) -> DeviceBinding {
        DeviceBinding {
            name: name.into(),
            id: BufferId(1),
            len,
            elem: ElemDecl::of::<f32>(),
            initial: vec![0; len * 4],
        }
    }

    #[test]
    fn wrong_sizes_and_indices_are_typed_binding_errors_that_never_reach_the_engine() {
        let rec = Arc::new(Recorder::default());
        let b = BoundBuffers::new(rec.clone(), &[binding("a", 4), binding("b", 2)]);
        let d: &dyn DeviceBuffers = &b;
        d.read(0, &mut [0; 16]).unwrap();
        d.write(1, &[0; 8]).unwrap();
        match d.write(0, &[0; 12]) {
            Err(DeviceError::Binding { name, reason }) => {
                assert_eq!(name, "a");
                assert!(reason.contains("12") && reason.contains("16"), "{reason}");
            }
            other => panic!("expected a Binding error, got {other:?}"),
        }
        assert!(matches!(
            d.read(2, &mut [0; 4]),
            Err(DeviceError::Binding { .. })
        ));
        assert_eq!(*rec.0.lock(), vec![(0, 16), (1, 8)]);
    }

    #[test]
    fn declared_buffers_must_match_the_bound_ones() {
        let h = CudaHandler::<M, M>::new("").buffer::<f32>("a");
        assert!(h.bound_decls(&[binding("a", 1)]).is_ok());
        assert!(matches!(
            h.bound_decls(&[binding("b", 1)]),
            Err(DeviceError::Binding { .. })
        ));
        assert!(matches!(
            h.bound_decls(&[binding("a", 1), binding("c", 1)]),
            Err(DeviceError::Binding { .. })
        ));
        let undeclared = CudaHandler::<M, M>::new("");
        let decls = undeclared.bound_decls(&[binding("x", 3)]).unwrap();
        assert_eq!(decls[0].c_type, "float");
        assert_eq!(decls[0].elem_size, 4);
        assert!(matches!(
            undeclared.bound_decls(&[binding("1x", 3)]),
            Err(DeviceError::Binding { .. })
        ));
    }
}
