//! The wgpu backend: Vulkan, Metal or DX12 through `wgpu`, and Mesa's lavapipe (Vulkan on the
//! CPU) in CI. A buffer is either mapped for the host or usable by the GPU, never both, so
//! nothing here is persistent: memory is wgpu storage buffers, one-shot kernels are WGSL
//! compute shaders (`Kernel::wgsl`), and ring kernels keep their state in a storage buffer for
//! their whole life and are fed in pipelined batches ([`ring`]).
//!
//! Every wait on the device has a bound (`WAIT_TIMEOUT`); a lost device or a validation
//! error wgpu reports outside an error scope is recorded on the `WgpuContext` and turned
//! into a typed error by the next operation, never a panic.
//!
//! `WgslHandler` and the WGSL error types are in every build, so a kernel definition compiles
//! whichever engines are in; the engine itself (adapters, pipelines, naga) is the `wgpu`
//! feature. Applications use it through the facade `resident`.

// Without the `wgpu` feature only the handler and the errors are compiled.
#![cfg_attr(not(feature = "wgpu"), allow(dead_code, unused_imports))]

mod launch;
#[cfg(feature = "wgpu")]
pub(crate) mod oneshot;
pub mod ring;
pub mod wgsl;

use parking_lot::Mutex;
use resident_core::engine::storage::{DeviceMemory, DeviceMemoryInner, EngineMemory, HostMemory};
use resident_core::engine::{
    BackendError, BackendKind, ComputeDevice, DeviceInfo, LaunchConfig, Result, Stream,
};
use resident_core::engine::{Kernel, KernelArg};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use wgsl::WgslError;

#[cfg(feature = "wgpu")]
/// Longest wait for the device in any one operation (a copy, a launch, a map, a snapshot).
/// lavapipe runs shaders on the CPU of a shared VM, hence generous.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(60);

#[cfg(feature = "wgpu")]
/// Address tag of wgpu buffers: a [`DeviceMemory::address`] of the wgpu backend is this tag
/// plus a per-context buffer number (wgpu has no device pointers; kernels find the buffer by it).
const ADDRESS_TAG: u64 = 0x7767_7075_0000_0000; // "wgpu"

#[cfg(feature = "wgpu")]
/// What kind of adapter wgpu reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdapterKind {
    /// A discrete GPU.
    DiscreteGpu,
    /// A GPU sharing memory with the CPU.
    IntegratedGpu,
    /// A virtual GPU (VM pass-through or similar).
    VirtualGpu,
    /// A software rasterizer running on the CPU (lavapipe, SwiftShader, WARP): real shaders
    /// through a real driver stack, CPU speed.
    Software,
    /// Unknown.
    Other,
}

#[cfg(feature = "wgpu")]
impl AdapterKind {
    fn of(t: ::wgpu::DeviceType) -> Self {
        match t {
            ::wgpu::DeviceType::DiscreteGpu => AdapterKind::DiscreteGpu,
            ::wgpu::DeviceType::IntegratedGpu => AdapterKind::IntegratedGpu,
            ::wgpu::DeviceType::VirtualGpu => AdapterKind::VirtualGpu,
            ::wgpu::DeviceType::Cpu => AdapterKind::Software,
            ::wgpu::DeviceType::Other => AdapterKind::Other,
        }
    }
    /// Whether this is real GPU hardware (what `Backend::Auto` accepts).
    pub fn is_hardware(self) -> bool {
        matches!(
            self,
            AdapterKind::DiscreteGpu | AdapterKind::IntegratedGpu | AdapterKind::VirtualGpu
        )
    }
    fn rank(self) -> u8 {
        match self {
            AdapterKind::DiscreteGpu => 0,
            AdapterKind::IntegratedGpu => 1,
            AdapterKind::VirtualGpu => 2,
            AdapterKind::Other => 3,
            AdapterKind::Software => 4,
        }
    }
}

#[cfg(feature = "wgpu")]
impl std::fmt::Display for AdapterKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AdapterKind::DiscreteGpu => "discrete GPU",
            AdapterKind::IntegratedGpu => "integrated GPU",
            AdapterKind::VirtualGpu => "virtual GPU",
            AdapterKind::Software => "software",
            AdapterKind::Other => "other",
        })
    }
}

#[cfg(feature = "wgpu")]
/// Properties of one wgpu adapter, as `resident info` shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterProperties {
    /// Position in [`adapters`] (hardware first).
    pub ordinal: usize,
    /// Adapter name (e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`).
    pub name: String,
    /// Graphics API: `vulkan`, `metal`, `dx12`, `gl`.
    pub api: String,
    /// Device type; `Software` for CPU implementations.
    pub kind: AdapterKind,
    /// Driver name and version.
    pub driver: String,
    /// Largest buffer, bytes.
    pub max_buffer_size: u64,
    /// Largest storage-buffer binding, bytes.
    pub max_storage_buffer_binding_size: u64,
    /// Most invocations in one workgroup.
    pub max_compute_invocations_per_workgroup: u32,
    /// Largest workgroup in x, y, z.
    pub max_compute_workgroup_size: (u32, u32, u32),
    /// Most workgroups per dispatch dimension.
    pub max_compute_workgroups_per_dimension: u32,
    /// Most storage buffers one shader stage binds.
    pub max_storage_buffers_per_shader_stage: u32,
}

#[cfg(feature = "wgpu")]
fn properties(ordinal: usize, a: &::wgpu::Adapter) -> AdapterProperties {
    let i = a.get_info();
    let l = a.limits();
    AdapterProperties {
        ordinal,
        name: i.name.clone(),
        api: i.backend.to_str().to_string(),
        kind: AdapterKind::of(i.device_type),
        driver: format!("{} {}", i.driver, i.driver_info).trim().to_string(),
        max_buffer_size: l.max_buffer_size,
        max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
        max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
        max_compute_workgroup_size: (
            l.max_compute_workgroup_size_x,
            l.max_compute_workgroup_size_y,
            l.max_compute_workgroup_size_z,
        ),
        max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
        max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
    }
}

#[cfg(feature = "wgpu")]
fn instance() -> ::wgpu::Instance {
    default_runtime_dir();
    let mut desc = ::wgpu::InstanceDescriptor::new_without_display_handle();
    // Compute only: the native APIs (no GL, which lacks what storage-buffer compute needs
    // on many drivers).
    desc.backends = ::wgpu::Backends::PRIMARY;
    ::wgpu::Instance::new(desc)
}

#[cfg(feature = "wgpu")]
/// On a headless Linux machine (no login session) Mesa's Vulkan drivers, through
/// libwayland-client, print "error: XDG_RUNTIME_DIR is invalid or not set in the environment."
/// each time an instance is made, also when everything works; compute needs no runtime
/// directory. When the variable is unset or empty, the process gets the temp folder as its default,
/// once, before the first instance (every instance is made here, and other threads making
/// one wait on the `Once`). A value the user set is never changed.
fn default_runtime_dir() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("XDG_RUNTIME_DIR").is_none_or(|v| v.is_empty()) {
            std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
        }
    });
}

#[cfg(feature = "wgpu")]
/// Every compute-capable adapter, hardware first (discrete, integrated, virtual, other,
/// software), with the instance that owns them.
fn sorted_adapters() -> (::wgpu::Instance, Vec<::wgpu::Adapter>) {
    let inst = instance();
    let mut list = pollster::block_on(inst.enumerate_adapters(::wgpu::Backends::PRIMARY));
    list.sort_by_key(|a| AdapterKind::of(a.get_info().device_type).rank());
    (inst, list)
}

#[cfg(feature = "wgpu")]
/// Every wgpu adapter this machine has, hardware first; empty when there is none (no
/// Vulkan/Metal/DX12 driver).
pub fn adapters() -> Vec<AdapterProperties> {
    let (_inst, list) = sorted_adapters();
    list.iter()
        .enumerate()
        .map(|(i, a)| properties(i, a))
        .collect()
}

#[cfg(feature = "wgpu")]
/// Whether a hardware (non-software) adapter exists: what `Backend::Auto` asks.
pub fn hardware_adapter_present() -> bool {
    adapters().iter().any(|a| a.kind.is_hardware())
}

#[cfg(feature = "wgpu")]
/// Errors the device reported on its own (validation outside a scope, loss), kept until read.
#[derive(Default)]
struct Faults {
    lost: Option<String>,
    uncaptured: Option<String>,
}

#[cfg(feature = "wgpu")]
/// One opened wgpu device and its queue, shared by every buffer, kernel and ring kernel on it.
pub struct WgpuContext {
    pub(crate) props: AdapterProperties,
    pub(crate) limits: ::wgpu::Limits,
    pub(crate) device: ::wgpu::Device,
    pub(crate) queue: ::wgpu::Queue,
    faults: Arc<Mutex<Faults>>,
    next_buffer: AtomicU64,
    /// Live buffers by address, so a `KernelArg` (an address) finds its buffer.
    buffers: Mutex<HashMap<u64, ::wgpu::Buffer>>,
    /// Compiled one-shot pipelines by (source hash, entry).
    pub(crate) pipelines: Mutex<HashMap<(u64, String), Arc<oneshot::Pipeline>>>,
    _instance: ::wgpu::Instance,
}

#[cfg(feature = "wgpu")]
impl std::fmt::Debug for WgpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuContext")
            .field("adapter", &self.props.name)
            .field("api", &self.props.api)
            .field("kind", &self.props.kind)
            .finish()
    }
}

#[cfg(feature = "wgpu")]
fn unavailable(reason: impl Into<String>) -> BackendError {
    BackendError::WgpuUnavailable {
        reason: reason.into(),
    }
}

#[cfg(feature = "wgpu")]
impl WgpuContext {
    /// Opens adapter `ordinal` of [`adapters`] with its full limits.
    pub fn open(ordinal: usize) -> Result<Arc<Self>> {
        let (inst, list) = sorted_adapters();
        let n = list.len();
        let adapter = list.into_iter().nth(ordinal).ok_or_else(|| {
            unavailable(if n == 0 {
                "no wgpu adapter (install a Vulkan driver, e.g. mesa-vulkan-drivers for lavapipe)"
                    .to_string()
            } else {
                format!("adapter {ordinal} does not exist ({n} found)")
            })
        })?;
        let props = properties(ordinal, &adapter);
        let limits = adapter.limits();
        let desc = ::wgpu::DeviceDescriptor {
            label: Some("resident"),
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| unavailable(format!("{}: request_device failed: {e}", props.name)))?;
        let faults = Arc::new(Mutex::new(Faults::default()));
        let f = faults.clone();
        device.set_device_lost_callback(move |reason, msg| {
            f.lock().lost = Some(format!("device lost ({reason:?}): {msg}"));
        });
        let f = faults.clone();
        // wgpu's default handler panics; record instead and fail the next operation.
        device.on_uncaptured_error(Arc::new(move |e: ::wgpu::Error| {
            let mut g = f.lock();
            if g.uncaptured.is_none() {
                g.uncaptured = Some(e.to_string());
            }
        }));
        Ok(Arc::new(WgpuContext {
            props,
            limits,
            device,
            queue,
            faults,
            next_buffer: AtomicU64::new(1),
            buffers: Mutex::new(HashMap::new()),
            pipelines: Mutex::new(HashMap::new()),
            _instance: inst,
        }))
    }

    /// The process-wide context on the preferred adapter (opened once; reopened after the
    /// previous one was lost). `hardware_only` refuses software adapters.
    pub fn shared(hardware_only: bool) -> Result<Arc<Self>> {
        static SHARED: OnceLock<Mutex<Option<Arc<WgpuContext>>>> = OnceLock::new();
        if hardware_only {
            // Ask before opening anything: creating a device on a software adapter only to
            // refuse it would cost a device per `Backend::Auto` request.
            let list = adapters();
            if !list.iter().any(|a| a.kind.is_hardware()) {
                return Err(unavailable(match list.first() {
                    Some(a) => format!("only a {} adapter ({}) is present", a.kind, a.name),
                    None => "no wgpu adapter".to_string(),
                }));
            }
        }
        let slot = SHARED.get_or_init(|| Mutex::new(None));
        let mut g = slot.lock();
        if let Some(c) = g.as_ref() {
            if c.check().is_ok() && (!hardware_only || c.props.kind.is_hardware()) {
                return Ok(c.clone());
            }
        }
        let c = Self::open(0)?;
        if hardware_only && !c.props.kind.is_hardware() {
            return Err(unavailable(format!(
                "only a {} adapter ({}) is present",
                c.props.kind, c.props.name
            )));
        }
        *g = Some(c.clone());
        Ok(c)
    }

    /// Destroys the device, as a driver reset or a removed GPU would: every buffer, kernel and
    /// ring kernel on it fails with a typed error, and [`WgpuContext::shared`] opens a fresh
    /// device next time. For testing fault handling.
    pub fn destroy_device(&self) {
        self.device.destroy();
        let mut f = self.faults.lock();
        if f.lost.is_none() {
            f.lost = Some("device lost (destroyed)".into());
        }
    }

    /// Adapter properties.
    pub fn properties(&self) -> &AdapterProperties {
        &self.props
    }

    /// `Err` once the device was lost or reported an error outside an error scope.
    pub fn check(&self) -> Result<()> {
        let g = self.faults.lock();
        if let Some(l) = &g.lost {
            return Err(BackendError::DeviceLost { reason: l.clone() });
        }
        if let Some(u) = &g.uncaptured {
            return Err(BackendError::WgpuDevice {
                operation: "(earlier operation)",
                reason: u.clone(),
            });
        }
        Ok(())
    }

    /// Waits (bounded) for everything submitted so far, and runs map callbacks.
    pub(crate) fn wait_idle(&self, operation: &'static str) -> Result<()> {
        self.wait_for(None, operation)
    }

    pub(crate) fn wait_for(
        &self,
        index: Option<::wgpu::SubmissionIndex>,
        operation: &'static str,
    ) -> Result<()> {
        match self.device.poll(::wgpu::PollType::Wait {
            submission_index: index,
            timeout: Some(WAIT_TIMEOUT),
        }) {
            Ok(_) => self.check(),
            Err(::wgpu::PollError::Timeout) => {
                self.check()?;
                Err(BackendError::WgpuTimeout {
                    operation,
                    waited: WAIT_TIMEOUT,
                })
            }
            Err(e) => {
                self.check()?;
                Err(BackendError::WgpuDevice {
                    operation,
                    reason: e.to_string(),
                })
            }
        }
    }

    /// Runs `f` inside validation and out-of-memory error scopes and turns what they caught
    /// into a typed error.
    pub(crate) fn scoped<T>(&self, operation: &'static str, f: impl FnOnce() -> T) -> Result<T> {
        let oom = self
            .device
            .push_error_scope(::wgpu::ErrorFilter::OutOfMemory);
        let val = self
            .device
            .push_error_scope(::wgpu::ErrorFilter::Validation);
        let out = f();
        let v = pollster::block_on(val.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o {
            return Err(BackendError::WgpuOutOfMemory {
                operation,
                reason: e.to_string(),
            });
        }
        if let Some(e) = v {
            return Err(BackendError::WgpuDevice {
                operation,
                reason: e.to_string(),
            });
        }
        self.check()?;
        Ok(out)
    }

    /// Checks `bytes` against the buffer-size limits.
    pub(crate) fn check_buffer_size(&self, bytes: u64, storage: bool) -> Result<()> {
        if bytes > self.limits.max_buffer_size {
            return Err(BackendError::WgpuLimit {
                limit: "max_buffer_size",
                requested: bytes,
                max: self.limits.max_buffer_size,
            });
        }
        let max_binding = self.limits.max_storage_buffer_binding_size;
        if storage && bytes > max_binding {
            return Err(BackendError::WgpuLimit {
                limit: "max_storage_buffer_binding_size",
                requested: bytes,
                max: max_binding,
            });
        }
        Ok(())
    }

    /// A zeroed storage buffer of at least `bytes` (rounded up to 4, at least 4).
    pub(crate) fn storage_buffer(
        &self,
        label: &str,
        bytes: u64,
        extra: ::wgpu::BufferUsages,
    ) -> Result<::wgpu::Buffer> {
        let size = padded(bytes);
        self.check_buffer_size(size, true)?;
        self.scoped("create_buffer", || {
            self.device.create_buffer(&::wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: ::wgpu::BufferUsages::STORAGE
                    | ::wgpu::BufferUsages::COPY_SRC
                    | ::wgpu::BufferUsages::COPY_DST
                    | extra,
                mapped_at_creation: false,
            })
        })
    }

    /// A host-readable staging buffer of `bytes` (padded).
    pub(crate) fn readback_buffer(&self, label: &str, bytes: u64) -> Result<::wgpu::Buffer> {
        let size = padded(bytes);
        self.check_buffer_size(size, false)?;
        self.scoped("create_buffer", || {
            self.device.create_buffer(&::wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: ::wgpu::BufferUsages::MAP_READ | ::wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })
    }

    /// Writes `data` at offset 0 of `dst` (queued; later submissions see it).
    pub(crate) fn write(&self, dst: &::wgpu::Buffer, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let whole = data.len() / 4 * 4;
        if whole > 0 {
            self.queue.write_buffer(dst, 0, &data[..whole]);
        }
        if whole < data.len() {
            // Copies are in 4-byte units: pad the tail with zeros (the buffer is padded too).
            let mut tail = [0u8; 4];
            tail[..data.len() - whole].copy_from_slice(&data[whole..]);
            self.queue.write_buffer(dst, whole as u64, &tail);
        }
    }

    /// Copies the first `dst.len()` bytes of `src` to the host and waits (bounded).
    pub(crate) fn read(&self, dst: &mut [u8], src: &::wgpu::Buffer) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let size = padded(dst.len() as u64);
        let staging = self.readback_buffer("resident readback", size)?;
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, 0, &staging, 0, size);
        let index = self.queue.submit([enc.finish()]);
        let done = Arc::new(Mutex::new(None));
        let d = done.clone();
        staging.map_async(::wgpu::MapMode::Read, .., move |r| *d.lock() = Some(r));
        self.wait_for(Some(index), "read buffer")?;
        // The submission is complete, so the map callback has run or runs on this poll.
        let deadline = std::time::Instant::now() + WAIT_TIMEOUT;
        loop {
            if let Some(r) = done.lock().take() {
                r.map_err(|e| BackendError::WgpuDevice {
                    operation: "map buffer",
                    reason: e.to_string(),
                })?;
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(BackendError::WgpuTimeout {
                    operation: "map buffer",
                    waited: WAIT_TIMEOUT,
                });
            }
            self.wait_idle("map buffer")?;
        }
        {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| BackendError::WgpuDevice {
                    operation: "map buffer",
                    reason: e.to_string(),
                })?;
            dst.copy_from_slice(&view[..dst.len()]);
        }
        staging.unmap();
        Ok(())
    }

    fn register(&self, buffer: ::wgpu::Buffer) -> u64 {
        let address = ADDRESS_TAG | self.next_buffer.fetch_add(1, Ordering::Relaxed);
        self.buffers.lock().insert(address, buffer);
        address
    }

    pub(crate) fn buffer_at(&self, address: u64) -> Option<::wgpu::Buffer> {
        self.buffers.lock().get(&address).cloned()
    }
}

#[cfg(feature = "wgpu")]
/// Buffer sizes: copies and bindings are in 4-byte units.
pub(crate) fn padded(bytes: u64) -> u64 {
    bytes.max(4).div_ceil(4) * 4
}

#[cfg(feature = "wgpu")]
/// Device memory of the wgpu backend: a storage buffer registered by address.
pub(crate) struct WgpuMemory {
    pub(crate) ctx: Arc<WgpuContext>,
    pub(crate) buffer: ::wgpu::Buffer,
    pub(crate) address: u64,
    pub(crate) len: usize,
}

#[cfg(feature = "wgpu")]
impl EngineMemory for WgpuMemory {
    fn len(&self) -> usize {
        self.len
    }
    fn backend(&self) -> BackendKind {
        BackendKind::Wgpu
    }
    fn address(&self) -> u64 {
        self.address
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(feature = "wgpu")]
impl Drop for WgpuMemory {
    fn drop(&mut self) {
        self.ctx.buffers.lock().remove(&self.address);
    }
}

#[cfg(feature = "wgpu")]
/// A wgpu adapter as a [`ComputeDevice`].
#[derive(Debug)]
pub struct WgpuDevice {
    ctx: Arc<WgpuContext>,
}

#[cfg(feature = "wgpu")]
impl WgpuDevice {
    /// The process-wide device on the preferred adapter (hardware first, else software).
    pub fn open() -> Result<Self> {
        Ok(WgpuDevice {
            ctx: WgpuContext::shared(false)?,
        })
    }
    /// The device on a hardware adapter only (what `Backend::Auto` uses).
    pub fn open_hardware() -> Result<Self> {
        Ok(WgpuDevice {
            ctx: WgpuContext::shared(true)?,
        })
    }
    /// A device on a context of your own (e.g. [`WgpuContext::open`] of a given adapter).
    pub fn with_context(ctx: Arc<WgpuContext>) -> Self {
        WgpuDevice { ctx }
    }
    /// Its context.
    pub fn context(&self) -> &Arc<WgpuContext> {
        &self.ctx
    }
    fn mem<'a>(&self, m: &'a DeviceMemory, what: &'static str) -> Result<&'a WgpuMemory> {
        match &m.inner {
            DeviceMemoryInner::Engine(e) => match e.as_any().downcast_ref::<WgpuMemory>() {
                Some(w) if Arc::ptr_eq(&w.ctx, &self.ctx) => Ok(w),
                _ => Err(BackendError::WrongBackend {
                    what,
                    memory: m.backend(),
                    device: BackendKind::Wgpu,
                }),
            },
            _ => Err(BackendError::WrongBackend {
                what,
                memory: m.backend(),
                device: BackendKind::Wgpu,
            }),
        }
    }
}

#[cfg(feature = "wgpu")]
/// Properties of one adapter in backend-neutral terms.
pub fn info_of(p: &AdapterProperties) -> DeviceInfo {
    DeviceInfo {
        backend: BackendKind::Wgpu,
        ordinal: p.ordinal,
        name: format!("{} [{}, {}]", p.name, p.api, p.kind),
        compute_units: 0,
        total_memory: 0,
        max_threads_per_block: p.max_compute_invocations_per_workgroup,
        compute_capability: None,
        shared_memory_per_block: 0,
        shared_memory_per_sm: 0,
        can_map_host_memory: false,
        driver_version: None,
    }
}

#[cfg(feature = "wgpu")]
fn same_len(what: &'static str, host: usize, device: usize) -> Result<()> {
    if host != device {
        return Err(BackendError::SizeMismatch { what, host, device });
    }
    Ok(())
}

#[cfg(feature = "wgpu")]
impl ComputeDevice for WgpuDevice {
    fn kind(&self) -> BackendKind {
        BackendKind::Wgpu
    }

    fn info(&self) -> DeviceInfo {
        info_of(&self.ctx.props)
    }

    fn shares_host_memory(&self) -> bool {
        false
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceMemory> {
        let buffer = self.ctx.storage_buffer(
            "resident memory",
            bytes as u64,
            ::wgpu::BufferUsages::empty(),
        )?;
        let address = self.ctx.register(buffer.clone());
        Ok(DeviceMemory {
            inner: DeviceMemoryInner::Engine(Box::new(WgpuMemory {
                ctx: self.ctx.clone(),
                buffer,
                address,
                len: bytes,
            })),
        })
    }

    fn alloc_host(&self, bytes: usize, _pinned: bool) -> Result<HostMemory> {
        // wgpu stages every transfer through its own mapped buffers: nothing to pin.
        HostMemory::heap(bytes)
    }

    fn copy_to_device(&self, dst: &mut DeviceMemory, src: &[u8]) -> Result<()> {
        same_len("copy_to_device", src.len(), dst.len())?;
        let m = self.mem(dst, "copy_to_device")?;
        self.ctx.write(&m.buffer, src);
        let index = self.ctx.queue.submit([]);
        self.ctx.wait_for(Some(index), "copy_to_device")
    }

    fn copy_to_host(&self, dst: &mut [u8], src: &DeviceMemory) -> Result<()> {
        same_len("copy_to_host", dst.len(), src.len())?;
        let m = self.mem(src, "copy_to_host")?;
        self.ctx.read(dst, &m.buffer)
    }

    unsafe fn copy_to_device_async(
        &self,
        dst: &mut DeviceMemory,
        src: &[u8],
        _stream: &Stream,
    ) -> Result<()> {
        // `write_buffer` copies `src` into wgpu's staging memory before returning and orders
        // the upload before every later submission, so this is asynchronous as it stands.
        same_len("copy_to_device_async", src.len(), dst.len())?;
        let m = self.mem(dst, "copy_to_device_async")?;
        self.ctx.write(&m.buffer, src);
        self.ctx.queue.submit([]);
        self.ctx.check()
    }

    unsafe fn copy_to_host_async(
        &self,
        dst: &mut [u8],
        src: &DeviceMemory,
        _stream: &Stream,
    ) -> Result<()> {
        // A readback completes through map_async + poll: done here, before returning.
        self.copy_to_host(dst, src)
    }

    fn create_stream(&self) -> Result<Stream> {
        // One wgpu queue per device runs submissions in order: a stream is a token.
        Ok(Stream::default())
    }

    fn synchronize(&self, _stream: &Stream) -> Result<()> {
        self.ctx.wait_idle("synchronize")
    }

    fn launch(
        &self,
        kernel: &Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg<'_>],
        _stream: Option<&Stream>,
    ) -> Result<()> {
        oneshot::launch(&self.ctx, kernel, cfg, args)
    }
}
