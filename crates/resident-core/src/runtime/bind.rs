//! Buffers bound to a ring kernel: `UnifiedBuffer`s handed to the kernel at launch by name
//! (typed), visible to its handler as slices for the kernel's whole life, and readable by the
//! host through the buffer's state machine.
//!
//! # Who may touch a bound buffer when
//! The kernel owns its bound buffers. Its thread locks the kernel's buffer table for the batch
//! in hand (taken when the batch starts, released when the batch's outputs are queued), and a
//! handler borrows buffers from that table through [`Context::buffer`](crate::runtime::context::Context::buffer) and
//! [`Context::buffer_mut`](crate::runtime::context::Context::buffer_mut) with `RefCell`-like rules (any number of shared borrows of a buffer,
//! or one mutable borrow; a conflict is [`BindError::AlreadyBorrowed`], never a panic).
//!
//! A host read **is synchronized, not refused**: [`KernelHandle::read_buffer`](crate::runtime::handle::KernelHandle::read_buffer) waits (up to its
//! timeout) for the batch in hand to finish, then holds the table so the kernel cannot start its
//! next batch until the guard is dropped. The data read is therefore always the state between
//! two batches, never a torn one. Hold guards briefly: a kernel waits for them. A timeout gives
//! [`BindError::Busy`].
//!
//! # The state machine
//! A handler's first `buffer` in a batch is a device read (`UnifiedBuffer::device`), its first
//! `buffer_mut` a device write (`device_mut`, the buffer becomes `DeviceDirty`); the host's
//! `read_buffer` is `UnifiedBuffer::host` (copies back only when the device copy is newer) and
//! `write_buffer` is `host_mut` (`HostDirty`; the kernel's next access copies it over). On the CPU
//! backend device memory is host memory, so no bytes move, but the states are the same as on a
//! device backend.
//!
//! # Device handlers (design; the device sides are not implemented yet)
//! The same table is what device backends will bind: binding `i` (in `bind` order) becomes, in
//! a CUDA handler, a typed pointer `T* ResidentBuffers::<name>` with its length
//! `<name>_len` in a struct passed to `handle(..)` (layout generated from the Rust types as
//! `device_message!` does), and in a WGSL handler `@group(1) @binding(i) var<storage,
//! read_write> <name>: array<T>;`. The buffer's device copy is what the kernel uses; the host
//! read guard quiesces the kernel between batches exactly as here. Until then, launching a
//! kernel with bound buffers on a device engine is a typed `InvalidConfig` error.
//!
//! # Buffers by id
//! Every binding gets a process-wide [`BufferId`] (a `u64`), so a message can name a buffer:
//! [`KernelHandle::buffer_id`](crate::runtime::handle::KernelHandle::buffer_id) on the host, [`Context::buffer_by_id`](crate::runtime::context::Context::buffer_by_id) in the handler.

use std::any::TypeId;
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytemuck::Pod;
use parking_lot::{Mutex, RawMutex};
use resident_ring::message::{quoted_name, CField, WgslLayoutError};

use crate::memory::{MemoryError, UnifiedBuffer};

/// Process-wide id of a bound buffer, small enough to travel in a message (`u64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct BufferId(pub u64);

static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);

/// Errors of bound-buffer access.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// `bind` was given an empty name (refused at launch).
    #[error("a bound buffer has an empty name")]
    EmptyName,
    /// Two buffers were bound under one name (refused at launch).
    #[error("buffer name '{name}' is bound twice")]
    BoundTwice {
        /// The repeated name.
        name: String,
    },
    /// No buffer of that name is bound to the kernel.
    #[error("kernel '{qkernel}' has no bound buffer named '{name}'", qkernel = quoted_name(.kernel))]
    UnknownBuffer {
        /// Kernel id.
        kernel: String,
        /// The name asked for.
        name: String,
    },
    /// No buffer with that id is bound to the kernel.
    #[error("kernel '{qkernel}' has no bound buffer with id {id}", qkernel = quoted_name(.kernel))]
    UnknownBufferId {
        /// Kernel id.
        kernel: String,
        /// The id asked for.
        id: u64,
    },
    /// The buffer holds another element type.
    #[error("bound buffer '{name}' of kernel '{qkernel}' holds {actual}, asked for {expected}", qkernel = quoted_name(.kernel))]
    TypeMismatch {
        /// Kernel id.
        kernel: String,
        /// Buffer name.
        name: String,
        /// The type asked for.
        expected: &'static str,
        /// The type bound.
        actual: &'static str,
    },
    /// The handler already holds a conflicting borrow of the buffer in this batch.
    #[error(
        "bound buffer '{name}' of kernel '{kernel}' is already borrowed {how} in this handler"
    )]
    AlreadyBorrowed {
        /// Kernel id.
        kernel: String,
        /// Buffer name.
        name: String,
        /// `mutably` or `shared`.
        how: &'static str,
    },
    /// Accessed outside a batch (for example from the loop form, which has no batches).
    #[error("bound buffer '{name}' of kernel '{qkernel}' accessed outside a handler batch", qkernel = quoted_name(.kernel))]
    NotInBatch {
        /// Kernel id.
        kernel: String,
        /// Buffer name.
        name: String,
    },
    /// The host waited `waited` for the kernel's batch in hand and it did not finish.
    #[error("bound buffer '{name}' of kernel '{qkernel}': the kernel's batch did not finish within {waited:?}", qkernel = quoted_name(.kernel))]
    Busy {
        /// Kernel id.
        kernel: String,
        /// Buffer name.
        name: String,
        /// How long the host waited.
        waited: Duration,
    },
    /// The kernel has no bound buffers at all (launched without `bind`).
    #[error("kernel '{qkernel}' was launched without bound buffers", qkernel = quoted_name(.kernel))]
    NoBindings {
        /// Kernel id.
        kernel: String,
    },
    /// The device holding the buffer refused the read or the write.
    #[error("bound buffer '{name}' of kernel '{qkernel}': {source}", qkernel = quoted_name(.kernel))]
    Device {
        /// Kernel id.
        kernel: String,
        /// Buffer name.
        name: String,
        /// The device error.
        #[source]
        source: Box<crate::engine::error::DeviceError>,
    },
    /// The buffer's state machine failed (a copy or an allocation).
    #[error("bound buffer '{name}' of kernel '{qkernel}': {source}", qkernel = quoted_name(.kernel))]
    Memory {
        /// Kernel id.
        kernel: String,
        /// Buffer name.
        name: String,
        /// The memory error (boxed: it is large and rare).
        #[source]
        source: Box<MemoryError>,
    },
}

/// A bound buffer with its element type erased.
trait Bindable: Send {
    /// The values for the kernel; `write` marks the device copy newer. Pointer and length in
    /// elements. On a backend whose device memory is not host memory the host copy is used
    /// (the handler is a host closure), so the state machine moves the data there.
    fn kernel_view(&mut self, write: bool) -> Result<(*mut u8, usize), MemoryError>;
    /// The values for the host; `write` marks the host copy newer.
    fn host_view(&mut self, write: bool) -> Result<(*mut u8, usize), MemoryError>;
}

impl<T: Pod + Send> Bindable for UnifiedBuffer<T> {
    fn kernel_view(&mut self, write: bool) -> Result<(*mut u8, usize), MemoryError> {
        if !self.shares_host_memory() {
            return self.host_view(write);
        }
        // On a shared-memory backend the device address is the host copy's address.
        if write {
            let v = self.device_mut()?;
            Ok((v.address() as *mut u8, v.len()))
        } else {
            let v = self.device()?;
            Ok((v.address() as *mut u8, v.len()))
        }
    }
    fn host_view(&mut self, write: bool) -> Result<(*mut u8, usize), MemoryError> {
        if write {
            let s = self.host_mut()?;
            Ok((s.as_mut_ptr() as *mut u8, s.len()))
        } else {
            let s = self.host()?;
            Ok((s.as_ptr() as *mut u8, s.len()))
        }
    }
}

/// What the batch in hand has done to a buffer so far.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Untouched,
    Read,
    Write,
}

struct Entry {
    name: String,
    id: BufferId,
    elem: TypeId,
    elem_name: &'static str,
    decl: fn() -> ElemDecl,
    buf: std::cell::UnsafeCell<Box<dyn Bindable>>,
    /// This batch's view (valid while `access != Untouched`).
    ptr: Cell<*mut u8>,
    len: Cell<usize>,
    access: Cell<Access>,
    /// Borrows handed out in this batch: > 0 shared, -1 mutable, 0 none.
    borrows: Cell<isize>,
    /// Whether `buf` is being transitioned (guards the `&mut` made from `&self`).
    busy: Cell<bool>,
}

// SAFETY: `ptr` points into `buf`, which the entry owns; an `Entry` is only reached through the
// table's mutex, so one thread at a time uses the `Cell`s and the pointer.
unsafe impl Send for Entry {}

/// The buffers of one kernel.
pub(crate) struct BoundTable {
    entries: Vec<Entry>,
    /// Set when a device engine holds the buffers (the handler runs on a device): host reads
    /// and writes go through it, and the `UnifiedBuffer`s are the host mirrors.
    device: Option<Arc<dyn DeviceBuffers>>,
}

/// A binding waiting for launch (element type erased).
pub(crate) struct PendingBinding {
    name: String,
    elem: TypeId,
    elem_name: &'static str,
    decl: fn() -> ElemDecl,
    buf: Box<dyn Bindable>,
}

impl PendingBinding {
    pub(crate) fn new<T: Pod + Send + CField>(name: String, buf: UnifiedBuffer<T>) -> Self {
        PendingBinding {
            name,
            elem: TypeId::of::<T>(),
            elem_name: std::any::type_name::<T>(),
            decl: ElemDecl::of::<T>,
            buf: Box::new(buf),
        }
    }
}

/// How a bound buffer's element type is declared on a device (from its [`CField`] impl).
#[derive(Clone, Debug)]
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub struct ElemDecl {
    /// Element size in bytes.
    pub size: usize,
    /// The C type name (`double`, `SensorStats`).
    pub c_type: String,
    /// C declarations the type needs first (nested structs, itself included), in order.
    pub c_deps: Vec<String>,
    /// The WGSL type name, or why it has none.
    pub wgsl_type: Result<String, WgslLayoutError>,
    /// WGSL declarations the type needs first.
    pub wgsl_deps: Result<Vec<String>, WgslLayoutError>,
}

impl ElemDecl {
    #[doc(hidden)] // for the engines in the crate `resident`, not the API
    pub fn of<T: Pod + CField>() -> Self {
        let mut c_deps = Vec::new();
        T::c_dependencies(&mut c_deps);
        let mut w = Vec::new();
        let wgsl_deps = T::wgsl_dependencies(&mut w).map(|()| w);
        ElemDecl {
            size: std::mem::size_of::<T>(),
            c_type: T::c_field("").trim().to_string(),
            c_deps,
            wgsl_type: T::wgsl_type(false),
            wgsl_deps,
        }
    }
}

/// What a device backend needs of one bound buffer at launch.
#[derive(Clone, Debug)]
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub struct DeviceBinding {
    /// The name the handler uses.
    pub name: String,
    /// Registry id (what a message carries to name it).
    pub id: BufferId,
    /// Elements.
    pub len: usize,
    /// Element type.
    pub elem: ElemDecl,
    /// The host values at launch (`len * elem.size` bytes): the device copy starts as these.
    pub initial: Vec<u8>,
}

/// The device side of a kernel's bound buffers, given by the engine that holds their device
/// copies. Both calls are **synchronized** with the kernel: what `read` returns is the buffer
/// between two batches (every batch started before the call has finished writing it, none
/// started after has begun), and what `write` stores is seen whole by the next batch.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub trait DeviceBuffers: Send + Sync {
    /// Copies binding `index`'s device values into `out` (exactly its byte length).
    fn read(&self, index: usize, out: &mut [u8]) -> Result<(), crate::engine::error::DeviceError>;
    /// Replaces binding `index`'s device values with `data` (exactly its byte length).
    fn write(&self, index: usize, data: &[u8]) -> Result<(), crate::engine::error::DeviceError>;
}

/// The table shared by the kernel thread and its handles.
pub(crate) type SharedTable = Arc<Mutex<BoundTable>>;

/// Builds a kernel's table at launch; `None` when nothing is bound. An empty or repeated name
/// is an error ([`BindError::EmptyName`], [`BindError::BoundTwice`] naming it).
pub(crate) fn table(pending: Vec<PendingBinding>) -> Result<Option<SharedTable>, BindError> {
    if pending.is_empty() {
        return Ok(None);
    }
    let mut entries: Vec<Entry> = Vec::with_capacity(pending.len());
    for p in pending {
        if p.name.is_empty() {
            return Err(BindError::EmptyName);
        }
        if entries.iter().any(|e| e.name == p.name) {
            return Err(BindError::BoundTwice { name: p.name });
        }
        entries.push(Entry {
            name: p.name,
            id: BufferId(NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed)),
            elem: p.elem,
            elem_name: p.elem_name,
            decl: p.decl,
            buf: std::cell::UnsafeCell::new(p.buf),
            ptr: Cell::new(std::ptr::null_mut()),
            len: Cell::new(0),
            access: Cell::new(Access::Untouched),
            borrows: Cell::new(0),
            busy: Cell::new(false),
        });
    }
    Ok(Some(Arc::new(Mutex::new(BoundTable {
        entries,
        device: None,
    }))))
}

/// The bindings of `table` as a device engine needs them (declarations and initial values, in
/// `bind` order); `Err` names a buffer whose host values could not be read. A buffer never
/// written starts as zeros on the device (as `UnifiedBuffer::host_mut` starts it); from here on
/// the `UnifiedBuffer` is the host mirror of the engine's device copy.
pub(crate) fn device_bindings(
    kernel: &str,
    table: &SharedTable,
) -> Result<Vec<DeviceBinding>, BindError> {
    let mut t = table.lock();
    let mut out = Vec::with_capacity(t.entries.len());
    for e in t.entries.iter_mut() {
        let (p, n) = e
            .buf
            .get_mut()
            .host_view(true)
            .map_err(|source| BindError::Memory {
                kernel: kernel.to_string(),
                name: e.name.clone(),
                source: Box::new(source),
            })?;
        let elem = (e.decl)();
        // SAFETY: `host_view` returned the host copy, `n` elements of `elem.size` bytes, and
        // the table lock keeps every other user out while it is copied.
        let initial = unsafe { std::slice::from_raw_parts(p as *const u8, n * elem.size) }.to_vec();
        out.push(DeviceBinding {
            name: e.name.clone(),
            id: e.id,
            len: n,
            elem,
            initial,
        });
    }
    Ok(out)
}

/// Hands `table`'s buffers to a device engine: from now on host reads and writes go through
/// `device`.
pub(crate) fn attach_device(table: &SharedTable, device: Arc<dyn DeviceBuffers>) {
    table.lock().device = Some(device);
}

/// A kernel context's hold on its table: the table, and the lock for the batch in hand.
#[derive(Default)]
pub(crate) struct BatchBinding {
    table: Option<SharedTable>,
    guard: Option<parking_lot::lock_api::ArcMutexGuard<RawMutex, BoundTable>>,
}

impl BatchBinding {
    pub(crate) fn new(table: Option<SharedTable>) -> Self {
        BatchBinding { table, guard: None }
    }

    /// Locks the table for a batch (waits for a host guard to be dropped).
    pub(crate) fn begin(&mut self) {
        if let Some(t) = &self.table {
            if self.guard.is_none() {
                self.guard = Some(t.lock_arc());
            }
        }
    }

    /// Ends the batch: forgets this batch's views and lets the host in.
    pub(crate) fn end(&mut self) {
        if let Some(g) = self.guard.take() {
            for e in &g.entries {
                e.access.set(Access::Untouched);
                e.borrows.set(0);
            }
        }
    }
}

fn elem_check<T: 'static>(kernel: &str, e: &Entry) -> Result<(), BindError> {
    if e.elem != TypeId::of::<T>() {
        return Err(BindError::TypeMismatch {
            kernel: kernel.to_string(),
            name: e.name.clone(),
            expected: std::any::type_name::<T>(),
            actual: e.elem_name,
        });
    }
    Ok(())
}

/// Makes `e` ready for a kernel access of kind `want` in this batch.
fn prepare(kernel: &str, e: &Entry, want: Access) -> Result<(), BindError> {
    let have = e.access.get();
    let needed = !matches!(
        (have, want),
        (Access::Write, _) | (Access::Read, Access::Read)
    );
    if needed {
        if e.busy.replace(true) {
            // Unreachable through the public API (one thread, no re-entry), kept as an error.
            return Err(BindError::AlreadyBorrowed {
                kernel: kernel.to_string(),
                name: e.name.clone(),
                how: "mutably",
            });
        }
        // SAFETY: the table is locked by this thread for the batch; `busy` makes this the only
        // `&mut` to the buffer object; no slice handed out this batch is alive when the view
        // changes kind (checked by the callers through `borrows`), and a transition keeps the
        // allocation where it is (both sides are allocated once, on first use).
        let r = unsafe { (*e.buf.get()).kernel_view(want == Access::Write) };
        e.busy.set(false);
        let (ptr, len) = r.map_err(|source| BindError::Memory {
            kernel: kernel.to_string(),
            name: e.name.clone(),
            source: Box::new(source),
        })?;
        e.ptr.set(ptr);
        e.len.set(len);
        e.access.set(want);
    }
    Ok(())
}

/// A shared borrow of a bound buffer in a handler: derefs to `&[T]`.
pub struct BufRef<'a, T> {
    entry: &'a Entry,
    _t: PhantomData<&'a [T]>,
}

/// A mutable borrow of a bound buffer in a handler: derefs to `&mut [T]`.
pub struct BufMut<'a, T> {
    entry: &'a Entry,
    _t: PhantomData<&'a mut [T]>,
}

impl<T: Pod> std::ops::Deref for BufRef<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        let (p, n) = (self.entry.ptr.get(), self.entry.len.get());
        if n == 0 {
            return &[];
        }
        // SAFETY: `p` is the buffer's view for this batch, `n` elements of `T` (type checked);
        // the shared borrow count keeps any mutable borrow out while this guard lives.
        unsafe { std::slice::from_raw_parts(p as *const T, n) }
    }
}

impl<T: Pod> std::ops::Deref for BufMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        let (p, n) = (self.entry.ptr.get(), self.entry.len.get());
        if n == 0 {
            return &[];
        }
        // SAFETY: as for `BufRef`; this guard is the only borrow of the buffer.
        unsafe { std::slice::from_raw_parts(p as *const T, n) }
    }
}

impl<T: Pod> std::ops::DerefMut for BufMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let (p, n) = (self.entry.ptr.get(), self.entry.len.get());
        if n == 0 {
            return &mut [];
        }
        // SAFETY: this guard holds the buffer's only borrow (count -1) and `&mut self` makes
        // the slice unique; the view was made by a device write, so the state says so.
        unsafe { std::slice::from_raw_parts_mut(p as *mut T, n) }
    }
}

impl<T> Drop for BufRef<'_, T> {
    fn drop(&mut self) {
        self.entry.borrows.set(self.entry.borrows.get() - 1);
    }
}

impl<T> Drop for BufMut<'_, T> {
    fn drop(&mut self) {
        self.entry.borrows.set(0);
    }
}

enum Key<'k> {
    Name(&'k str),
    Id(BufferId),
}

/// The bound buffers of the batch in hand, detached from the context so a handler can hold
/// buffers and its state at once ([`Context::state_and_buffers`](crate::runtime::context::Context::state_and_buffers)).
pub struct Bindings<'a> {
    kernel: &'a str,
    bound: &'a BatchBinding,
}

impl<'a> Bindings<'a> {
    pub(crate) fn new(kernel: &'a str, bound: &'a BatchBinding) -> Self {
        Bindings { kernel, bound }
    }

    fn entry(&self, key: Key<'_>) -> Result<&'a Entry, BindError> {
        let kernel = self.kernel;
        let Some(guard) = self.bound.guard.as_ref() else {
            return Err(match (&self.bound.table, key) {
                (None, _) => BindError::NoBindings {
                    kernel: kernel.to_string(),
                },
                (Some(_), Key::Name(n)) => BindError::NotInBatch {
                    kernel: kernel.to_string(),
                    name: n.to_string(),
                },
                (Some(_), Key::Id(id)) => BindError::NotInBatch {
                    kernel: kernel.to_string(),
                    name: format!("#{}", id.0),
                },
            });
        };
        let table: &'a BoundTable = guard;
        table
            .entries
            .iter()
            .find(|e| match key {
                Key::Name(n) => e.name == n,
                Key::Id(id) => e.id == id,
            })
            .ok_or_else(|| match key {
                Key::Name(n) => BindError::UnknownBuffer {
                    kernel: kernel.to_string(),
                    name: n.to_string(),
                },
                Key::Id(id) => BindError::UnknownBufferId {
                    kernel: kernel.to_string(),
                    id: id.0,
                },
            })
    }

    fn borrow_ref<T: Pod>(&self, key: Key<'_>) -> Result<BufRef<'a, T>, BindError> {
        let e = self.entry(key)?;
        elem_check::<T>(self.kernel, e)?;
        if e.borrows.get() < 0 {
            return Err(BindError::AlreadyBorrowed {
                kernel: self.kernel.to_string(),
                name: e.name.clone(),
                how: "mutably",
            });
        }
        prepare(self.kernel, e, Access::Read)?;
        e.borrows.set(e.borrows.get() + 1);
        Ok(BufRef {
            entry: e,
            _t: PhantomData,
        })
    }

    fn borrow_mut<T: Pod>(&self, key: Key<'_>) -> Result<BufMut<'a, T>, BindError> {
        let e = self.entry(key)?;
        elem_check::<T>(self.kernel, e)?;
        match e.borrows.get() {
            0 => {}
            n => {
                return Err(BindError::AlreadyBorrowed {
                    kernel: self.kernel.to_string(),
                    name: e.name.clone(),
                    how: if n < 0 { "mutably" } else { "shared" },
                })
            }
        }
        prepare(self.kernel, e, Access::Write)?;
        e.borrows.set(-1);
        Ok(BufMut {
            entry: e,
            _t: PhantomData,
        })
    }

    /// The bound buffer `name` as `&[T]` (a device read). Several buffers, or several shared
    /// borrows of one, may be held at once.
    pub fn buffer<T: Pod>(&self, name: &str) -> Result<BufRef<'a, T>, BindError> {
        self.borrow_ref(Key::Name(name))
    }

    /// The bound buffer `name` as `&mut [T]` (a device write: the buffer becomes
    /// `DeviceDirty`). A second borrow of the same buffer is [`BindError::AlreadyBorrowed`].
    pub fn buffer_mut<T: Pod>(&self, name: &str) -> Result<BufMut<'a, T>, BindError> {
        self.borrow_mut(Key::Name(name))
    }

    /// [`Bindings::buffer`] by registry id (as carried in a message).
    pub fn buffer_by_id<T: Pod>(&self, id: BufferId) -> Result<BufRef<'a, T>, BindError> {
        self.borrow_ref(Key::Id(id))
    }

    /// [`Bindings::buffer_mut`] by registry id (as carried in a message).
    pub fn buffer_mut_by_id<T: Pod>(&self, id: BufferId) -> Result<BufMut<'a, T>, BindError> {
        self.borrow_mut(Key::Id(id))
    }
}

/// The host's view of a bound buffer: the kernel cannot start a batch while it lives.
pub struct BufferReadGuard<'a, T> {
    _lock: parking_lot::MutexGuard<'a, BoundTable>,
    ptr: *const T,
    len: usize,
}

/// The host's writable view of a bound buffer (marks the host copy newer; the kernel's next
/// access copies it over). The kernel cannot start a batch while it lives.
pub struct BufferWriteGuard<'a, T> {
    ptr: *mut T,
    len: usize,
    /// The engine holding the device copy and the binding's index (device kernels only).
    device: Option<(Arc<dyn DeviceBuffers>, usize)>,
    kernel: String,
    name: String,
    _lock: parking_lot::MutexGuard<'a, BoundTable>,
}

impl<T> BufferWriteGuard<'_, T> {
    /// Stores the values to the kernel now and reports whether the device took them (on the
    /// CPU backend there is nothing to store: the kernel uses this memory).
    pub fn commit(mut self) -> Result<(), BindError> {
        self.store()
    }

    fn store(&mut self) -> Result<(), BindError> {
        let Some((d, index)) = self.device.take() else {
            return Ok(());
        };
        // SAFETY: the host mirror, `len` elements of `T`, under the table lock this guard holds.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.ptr as *const u8, self.len * std::mem::size_of::<T>())
        };
        d.write(index, bytes).map_err(|source| BindError::Device {
            kernel: self.kernel.clone(),
            name: self.name.clone(),
            source: Box::new(source),
        })
    }
}

impl<T> Drop for BufferWriteGuard<'_, T> {
    fn drop(&mut self) {
        if let Err(e) = self.store() {
            tracing::error!(error = %e,
                "a bound buffer written on the host could not be stored to the device (commit() returns this error)");
        }
    }
}

impl<T: Pod> std::ops::Deref for BufferReadGuard<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the host view of the buffer, `len` elements of `T` (type checked); the table
        // lock held by this guard keeps the kernel (the only other user) out.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: Pod> std::ops::Deref for BufferWriteGuard<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: as for `BufferReadGuard`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: Pod> std::ops::DerefMut for BufferWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as for `BufferReadGuard`, and `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// The host side of a kernel's bound buffers (what `KernelHandle::buffer_id`, `read_buffer`
/// and `write_buffer` do): `table` is the kernel's, `None` when it binds no buffers.
pub(crate) struct HostAccess<'a> {
    pub table: Option<&'a SharedTable>,
    pub kernel: &'a str,
}

impl<'a> HostAccess<'a> {
    fn bound_table(&self) -> Result<&'a SharedTable, BindError> {
        self.table.ok_or_else(|| BindError::NoBindings {
            kernel: self.kernel.to_string(),
        })
    }

    /// The registry id of the bound buffer `name` (to put in messages).
    pub fn buffer_id(&self, name: &str) -> Result<BufferId, BindError> {
        let t = self.bound_table()?.lock();
        t.entries
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.id)
            .ok_or_else(|| BindError::UnknownBuffer {
                kernel: self.kernel.to_string(),
                name: name.to_string(),
            })
    }

    fn host_view<T: Pod>(
        &self,
        name: &str,
        timeout: Duration,
        write: bool,
    ) -> Result<HostView<'a>, BindError> {
        let kernel = self.kernel.to_string();
        let mut t = self
            .bound_table()?
            .try_lock_for(timeout)
            .ok_or_else(|| BindError::Busy {
                kernel: kernel.clone(),
                name: name.to_string(),
                waited: timeout,
            })?;
        let device = t.device.clone();
        let (index, e) = t
            .entries
            .iter_mut()
            .enumerate()
            .find(|(_, e)| e.name == name)
            .ok_or_else(|| BindError::UnknownBuffer {
                kernel: kernel.clone(),
                name: name.to_string(),
            })?;
        elem_check::<T>(&kernel, e)?;
        // On a device kernel the `UnifiedBuffer` is the host mirror: it is refreshed from the
        // device copy (synchronized with the kernel by the engine) on every host access.
        let (p, n) = e
            .buf
            .get_mut()
            .host_view(write || device.is_some())
            .map_err(|source| BindError::Memory {
                kernel: kernel.clone(),
                name: name.to_string(),
                source: Box::new(source),
            })?;
        if let Some(d) = &device {
            // SAFETY: the host mirror, `n` elements of `T` (type checked), reached only under
            // the table lock held here.
            let bytes = unsafe { std::slice::from_raw_parts_mut(p, n * std::mem::size_of::<T>()) };
            d.read(index, bytes).map_err(|source| BindError::Device {
                kernel: kernel.clone(),
                name: name.to_string(),
                source: Box::new(source),
            })?;
        }
        Ok(HostView {
            lock: t,
            ptr: p,
            len: n,
            device: device.map(|d| (d, index)),
            kernel,
            name: name.to_string(),
        })
    }

    /// Reads the bound buffer `name` on the host. **Synchronized, not refused:** on the CPU
    /// backend it waits up to `timeout` for the kernel's batch in hand, then copies back if the
    /// device copy is newer, and while the guard lives the kernel does not start another batch.
    /// On a device backend the device copy is fetched as it stands between two batches (the
    /// engine synchronizes with the kernel, see `runtime::bind`) and the guard holds that copy.
    pub fn read_buffer<T: Pod>(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<BufferReadGuard<'a, T>, BindError> {
        let v = self.host_view::<T>(name, timeout, false)?;
        Ok(BufferReadGuard {
            _lock: v.lock,
            ptr: v.ptr as *const T,
            len: v.len,
        })
    }

    /// Writes the bound buffer `name` on the host (same waiting rules as
    /// `KernelHandle::read_buffer`); the kernel sees the values from its next batch on. On a
    /// device backend the guard starts as the device's values and is stored back to the device
    /// by [`BufferWriteGuard::commit`] (or, with errors only traced, when it is dropped).
    pub fn write_buffer<T: Pod>(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<BufferWriteGuard<'a, T>, BindError> {
        let v = self.host_view::<T>(name, timeout, true)?;
        Ok(BufferWriteGuard {
            ptr: v.ptr as *mut T,
            len: v.len,
            device: v.device,
            kernel: v.kernel,
            name: v.name,
            _lock: v.lock,
        })
    }
}

struct HostView<'a> {
    lock: parking_lot::MutexGuard<'a, BoundTable>,
    ptr: *mut u8,
    len: usize,
    device: Option<(Arc<dyn DeviceBuffers>, usize)>,
    kernel: String,
    name: String,
}
