//! `UnifiedBuffer<T>`: one logical array with a host copy and a device copy, and a state that
//! says which copy is current. Accessors move data only when the other side is newer. On a
//! backend whose device memory is host memory (the CPU) both views are the same bytes and no
//! copy ever happens; the state machine still runs, so code behaves the same on every backend.
//!
//! | state          | host copy  | device copy |
//! |----------------|------------|-------------|
//! | `Uninitialized`| none       | none        |
//! | `HostOnly`     | current    | none        |
//! | `DeviceOnly`   | none       | current     |
//! | `Synchronized` | current    | current     |
//! | `HostDirty`    | newer      | stale       |
//! | `DeviceDirty`  | stale      | newer       |

use super::MemoryError;
use crate::engine::{BackendError, DeviceHandle, DeviceMemory, HostMemory, KernelArg, Stream};
use bytemuck::Pod;
use std::marker::PhantomData;

/// Which copy of a [`UnifiedBuffer`] is current (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferState {
    /// Nothing written yet; nothing allocated.
    Uninitialized,
    /// Only the host copy exists.
    HostOnly,
    /// Only the device copy exists.
    DeviceOnly,
    /// Both copies exist and are equal.
    Synchronized,
    /// The host copy was written after the last sync.
    HostDirty,
    /// The device copy was written after the last sync.
    DeviceDirty,
}

impl BufferState {
    fn host_current(self) -> bool {
        matches!(
            self,
            BufferState::HostOnly | BufferState::Synchronized | BufferState::HostDirty
        )
    }
    fn device_current(self) -> bool {
        matches!(
            self,
            BufferState::DeviceOnly | BufferState::Synchronized | BufferState::DeviceDirty
        )
    }
}

/// How a buffer allocates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferOptions {
    /// Host copy in pinned, device-mapped memory (faster, truly async copies on CUDA).
    pub pinned: bool,
}

impl BufferOptions {
    /// Pinned host memory.
    pub fn pinned() -> Self {
        BufferOptions { pinned: true }
    }
}

/// Copies a buffer made between host and device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Host-to-device copies.
    pub to_device: u64,
    /// Device-to-host copies.
    pub to_host: u64,
    /// Bytes copied host to device.
    pub to_device_bytes: u64,
    /// Bytes copied device to host.
    pub to_host_bytes: u64,
}

/// `len` values of `T` on host and device; see the module docs.
pub struct UnifiedBuffer<T: Pod> {
    device: DeviceHandle,
    len: usize,
    bytes: usize,
    options: BufferOptions,
    /// The host copy; on a shared-memory backend also the device copy.
    host: Option<HostMemory>,
    /// The device copy; always `None` on a shared-memory backend.
    dev: Option<DeviceMemory>,
    state: BufferState,
    stats: TransferStats,
    /// A stream with an async copy of this buffer in flight; waited for before any access.
    pending: Option<Stream>,
    _t: PhantomData<T>,
}

/// A read-only device view, valid while the buffer is borrowed.
pub struct DeviceView<'a, T> {
    address: u64,
    len: usize,
    _b: PhantomData<&'a [T]>,
}

/// A writable device view, valid while the buffer is mutably borrowed.
pub struct DeviceViewMut<'a, T> {
    address: u64,
    len: usize,
    _b: PhantomData<&'a mut [T]>,
}

impl<'a, T: Pod> DeviceView<'a, T> {
    /// Backend address (host address on the CPU backend).
    pub fn address(&self) -> u64 {
        self.address
    }
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// As a read-only kernel argument.
    pub fn arg(&self) -> KernelArg<'_> {
        // SAFETY: the view borrows the buffer, whose device memory holds `len` values.
        unsafe { KernelArg::from_raw(self.address, self.len * std::mem::size_of::<T>(), false) }
    }
}

impl<'a, T: Pod> DeviceViewMut<'a, T> {
    /// Backend address (host address on the CPU backend).
    pub fn address(&self) -> u64 {
        self.address
    }
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// As a writable kernel argument.
    pub fn arg(&mut self) -> KernelArg<'_> {
        // SAFETY: the view exclusively borrows the buffer for the argument's life.
        unsafe { KernelArg::from_raw(self.address, self.len * std::mem::size_of::<T>(), true) }
    }
}

fn byte_len<T>(len: usize) -> Result<usize, MemoryError> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or(MemoryError::TooLarge {
            len,
            elem: std::mem::size_of::<T>(),
        })
}

impl<T: Pod> UnifiedBuffer<T> {
    /// An uninitialized buffer of `len` values; nothing is allocated until first written.
    pub fn new(
        device: &DeviceHandle,
        len: usize,
        options: BufferOptions,
    ) -> Result<Self, MemoryError> {
        Ok(UnifiedBuffer {
            device: device.clone(),
            len,
            bytes: byte_len::<T>(len)?,
            options,
            host: None,
            dev: None,
            state: BufferState::Uninitialized,
            stats: TransferStats::default(),
            pending: None,
            _t: PhantomData,
        })
    }

    /// A buffer holding a copy of `data` on the host (`HostOnly`).
    pub fn from_slice(
        device: &DeviceHandle,
        data: &[T],
        options: BufferOptions,
    ) -> Result<Self, MemoryError> {
        let mut b = Self::new(device, data.len(), options)?;
        b.host_mut()?.copy_from_slice(data);
        Ok(b)
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Which copy is current.
    pub fn state(&self) -> BufferState {
        self.state
    }
    /// Copies made so far.
    pub fn transfers(&self) -> TransferStats {
        self.stats
    }
    /// Whether the host copy is pinned memory.
    pub fn is_pinned(&self) -> bool {
        self.host.as_ref().is_some_and(|h| h.is_pinned())
    }

    fn shared(&self) -> bool {
        self.device.shares_host_memory()
    }

    /// Whether the device copy is the host copy (CPU backend): device views are host memory.
    pub(crate) fn shares_host_memory(&self) -> bool {
        self.shared()
    }

    fn wait_pending(&mut self) -> Result<(), MemoryError> {
        if let Some(s) = self.pending.take() {
            self.device
                .synchronize(&s)
                .map_err(|source| MemoryError::SyncFailed {
                    direction: "(waiting for an async copy)",
                    state: self.state,
                    source,
                })?;
        }
        Ok(())
    }

    fn ensure_host(&mut self) -> Result<(), MemoryError> {
        if self.host.is_none() {
            let h = self
                .device
                .alloc_host(self.bytes, self.options.pinned)
                .map_err(|source| MemoryError::AllocFailed {
                    bytes: self.bytes,
                    source,
                })?;
            self.host = Some(h);
        }
        Ok(())
    }

    fn ensure_device(&mut self) -> Result<(), MemoryError> {
        if self.shared() {
            return self.ensure_host();
        }
        if self.dev.is_none() {
            let d = self
                .device
                .alloc(self.bytes)
                .map_err(|source| MemoryError::AllocFailed {
                    bytes: self.bytes,
                    source,
                })?;
            self.dev = Some(d);
        }
        Ok(())
    }

    /// Makes the device copy current; `stream` makes the copy async.
    fn push(&mut self, stream: Option<&Stream>) -> Result<(), MemoryError> {
        self.wait_pending()?;
        self.ensure_device()?;
        if self.shared() {
            return Ok(());
        }
        let state = self.state;
        let fail = |source: BackendError| MemoryError::SyncFailed {
            direction: "to device",
            state,
            source,
        };
        let (Some(host), Some(dev)) = (self.host.as_ref(), self.dev.as_mut()) else {
            return Err(MemoryError::NothingToSync {
                direction: "to device",
                state,
            });
        };
        match stream {
            None => self
                .device
                .copy_to_device(dev, host.as_bytes())
                .map_err(fail)?,
            Some(s) => {
                // SAFETY: the host copy is owned by `self` and is not touched again before
                // `pending` is waited for (every accessor and `Drop` call `wait_pending`).
                unsafe { self.device.copy_to_device_async(dev, host.as_bytes(), s) }
                    .map_err(fail)?;
                self.pending = Some(s.clone());
            }
        }
        self.stats.to_device += 1;
        self.stats.to_device_bytes += self.bytes as u64;
        Ok(())
    }

    /// Makes the host copy current; `stream` makes the copy async.
    fn pull(&mut self, stream: Option<&Stream>) -> Result<(), MemoryError> {
        self.wait_pending()?;
        self.ensure_host()?;
        if self.shared() {
            return Ok(());
        }
        let state = self.state;
        let fail = |source: BackendError| MemoryError::SyncFailed {
            direction: "to host",
            state,
            source,
        };
        let (Some(host), Some(dev)) = (self.host.as_mut(), self.dev.as_ref()) else {
            return Err(MemoryError::NothingToSync {
                direction: "to host",
                state,
            });
        };
        match stream {
            None => self
                .device
                .copy_to_host(host.as_bytes_mut(), dev)
                .map_err(fail)?,
            Some(s) => {
                // SAFETY: as in `push`: the host copy is not accessed until `pending` is waited.
                unsafe { self.device.copy_to_host_async(host.as_bytes_mut(), dev, s) }
                    .map_err(fail)?;
                self.pending = Some(s.clone());
            }
        }
        self.stats.to_host += 1;
        self.stats.to_host_bytes += self.bytes as u64;
        Ok(())
    }

    fn host_slice(&self) -> &[T] {
        match &self.host {
            Some(h) => bytemuck::cast_slice(h.as_bytes()),
            None => &[],
        }
    }

    /// The values on the host, copied back first when the device copy is newer.
    pub fn host(&mut self) -> Result<&[T], MemoryError> {
        self.wait_pending()?;
        match self.state {
            BufferState::Uninitialized => return Err(MemoryError::Uninitialized { len: self.len }),
            BufferState::DeviceOnly | BufferState::DeviceDirty => {
                self.pull(None)?;
                self.state = BufferState::Synchronized;
            }
            _ => {}
        }
        Ok(self.host_slice())
    }

    /// The values on the host for writing (copied back first when the device copy is newer);
    /// marks the host copy newer. An uninitialized buffer starts zeroed.
    pub fn host_mut(&mut self) -> Result<&mut [T], MemoryError> {
        self.wait_pending()?;
        self.state = match self.state {
            BufferState::Uninitialized => {
                self.ensure_host()?;
                BufferState::HostOnly
            }
            BufferState::HostOnly => BufferState::HostOnly,
            BufferState::DeviceOnly | BufferState::DeviceDirty => {
                self.pull(None)?;
                BufferState::HostDirty
            }
            BufferState::Synchronized | BufferState::HostDirty => BufferState::HostDirty,
        };
        let h = self.host.as_mut().expect("host copy allocated above");
        Ok(bytemuck::cast_slice_mut(h.as_bytes_mut()))
    }

    fn device_address(&self) -> u64 {
        match (&self.dev, &self.host) {
            (Some(d), _) => d.address(),
            (None, Some(h)) if self.shared() => h.as_bytes().as_ptr() as u64,
            _ => 0,
        }
    }

    /// A read-only device view, copied over first when the host copy is newer.
    pub fn device(&mut self) -> Result<DeviceView<'_, T>, MemoryError> {
        self.wait_pending()?;
        match self.state {
            BufferState::Uninitialized => return Err(MemoryError::Uninitialized { len: self.len }),
            BufferState::HostOnly | BufferState::HostDirty => {
                self.push(None)?;
                self.state = BufferState::Synchronized;
            }
            _ => {}
        }
        Ok(DeviceView {
            address: self.device_address(),
            len: self.len,
            _b: PhantomData,
        })
    }

    /// A writable device view (copied over first when the host copy is newer); marks the device
    /// copy newer. An uninitialized buffer starts zeroed.
    pub fn device_mut(&mut self) -> Result<DeviceViewMut<'_, T>, MemoryError> {
        self.wait_pending()?;
        self.state = match self.state {
            BufferState::Uninitialized => {
                self.ensure_device()?;
                BufferState::DeviceOnly
            }
            BufferState::DeviceOnly => BufferState::DeviceOnly,
            BufferState::HostOnly | BufferState::HostDirty => {
                self.push(None)?;
                BufferState::DeviceDirty
            }
            BufferState::Synchronized | BufferState::DeviceDirty => BufferState::DeviceDirty,
        };
        Ok(DeviceViewMut {
            address: self.device_address(),
            len: self.len,
            _b: PhantomData,
        })
    }

    fn sync_to_device_on(&mut self, stream: Option<&Stream>) -> Result<(), MemoryError> {
        match self.state {
            BufferState::Uninitialized => Err(MemoryError::NothingToSync {
                direction: "to device",
                state: self.state,
            }),
            s if s.device_current() => Ok(()),
            _ => {
                self.push(stream)?;
                self.state = BufferState::Synchronized;
                Ok(())
            }
        }
    }

    fn sync_to_host_on(&mut self, stream: Option<&Stream>) -> Result<(), MemoryError> {
        match self.state {
            BufferState::Uninitialized => Err(MemoryError::NothingToSync {
                direction: "to host",
                state: self.state,
            }),
            s if s.host_current() => Ok(()),
            _ => {
                self.pull(stream)?;
                self.state = BufferState::Synchronized;
                Ok(())
            }
        }
    }

    /// Copies the host copy to the device when it is newer (no-op when the device is current).
    pub fn sync_to_device(&mut self) -> Result<(), MemoryError> {
        self.sync_to_device_on(None)
    }

    /// Copies the device copy to the host when it is newer (no-op when the host is current).
    pub fn sync_to_host(&mut self) -> Result<(), MemoryError> {
        self.sync_to_host_on(None)
    }

    /// As [`sync_to_device`](Self::sync_to_device), queued on `stream`. The buffer waits for
    /// the stream before its next access.
    pub fn sync_to_device_async(&mut self, stream: &Stream) -> Result<(), MemoryError> {
        self.sync_to_device_on(Some(stream))
    }

    /// As [`sync_to_host`](Self::sync_to_host), queued on `stream`. The buffer waits for the
    /// stream before its next access.
    pub fn sync_to_host_async(&mut self, stream: &Stream) -> Result<(), MemoryError> {
        self.sync_to_host_on(Some(stream))
    }
}

impl<T: Pod> Drop for UnifiedBuffer<T> {
    fn drop(&mut self) {
        // An async copy may still read or write the host copy: let it finish first.
        let _ = self.wait_pending();
    }
}

impl<T: Pod> std::fmt::Debug for UnifiedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnifiedBuffer")
            .field("len", &self.len)
            .field("state", &self.state)
            .field("transfers", &self.stats)
            .finish()
    }
}
