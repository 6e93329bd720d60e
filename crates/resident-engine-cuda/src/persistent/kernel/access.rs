//! The host's reads and writes of a GPU kernel's memory (bound buffers, state), each one
//! under the residency rule, spaced so the kernels run between two of them.

use super::*;

/// A GPU kernel's bound buffers: device memory the kernel reads and writes through its
/// `ResidentBuffers` table.
///
/// # Synchronization
/// The host copies only under the residency rule ([`Device::with_quiesced`]): every resident
/// kernel of the device, this one included, finishes the batch in hand and exits (its stream
/// drains), the synchronous copy runs, and the kernels are relaunched where they left off. The
/// kernel's writes are complete when its stream has drained (kernel completion orders them
/// before the copy), and the copy completes before the relaunch. Once the kernel has ended the
/// copy still runs (nothing resident to park) and sees its last values; after a device fault
/// the driver's error comes back. Freed (under the residency rule) when the kernel and every
/// other holder have dropped it.
pub struct GpuBuffers {
    pub(super) name: String,
    pub(super) access: Arc<GpuAccess>,
    /// Byte length of each buffer.
    pub(super) lens: Vec<usize>,
    /// The buffers and the table; `None` only while dropping.
    pub(super) memory: std::sync::Mutex<Option<(Vec<DeviceBuffer>, DeviceBuffer)>>,
}

/// A kernel's parked host access on a GPU (bound buffers, state): the copy runs under the
/// residency rule, and accesses are spaced so the kernels run between two of them.
pub(super) struct GpuAccess {
    pub(super) device: Arc<Device>,
    /// The kernel whose memory this is (set once it launched; gone once it ended).
    pub(super) kernel: std::sync::Mutex<Option<std::sync::Weak<GpuResident>>>,
    /// When the last access relaunched the kernels: the next one lets them run
    /// [`crate::persistent::sim::MIN_RUN_BETWEEN_ACCESSES`] first, so back-to-back reads do not starve them.
    pub(super) last_access: std::sync::Mutex<Option<Instant>>,
}

impl GpuAccess {
    pub(super) fn set_kernel(&self, k: std::sync::Weak<GpuResident>) {
        *self.kernel.lock().unwrap_or_else(|p| p.into_inner()) = Some(k);
    }

    /// Runs `op` with the kernel parked between two batches (or gone), waiting up to
    /// `timeout` for it to park. The copy runs on the side stream, which waits for no other
    /// kernel, so only this one parks; without memory pools the copy is a synchronous one and
    /// every resident kernel of the device parks (the residency rule).
    pub(super) fn with_quiesced<R>(
        &self,
        timeout: Duration,
        op: impl FnOnce() -> Result<R, CudaError>,
    ) -> Result<R, PersistentError> {
        let last = *self.last_access.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = last {
            let until = at + crate::persistent::sim::MIN_RUN_BETWEEN_ACCESSES;
            let now = Instant::now();
            if now < until {
                std::thread::sleep(until - now);
            }
        }
        let kernel = self
            .kernel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|w| w.upgrade());
        let r = match kernel {
            Some(k) if self.device.has_memory_pools() => self
                .device
                .with_parked(&*k, timeout, op)
                .map_err(cuda_error)?
                .map_err(cuda_error),
            Some(_) => self
                .device
                .with_quiesced(timeout, op)
                .map_err(cuda_error)?
                .map_err(cuda_error),
            // Ended: nothing runs that could write the memory.
            None => op().map_err(cuda_error),
        };
        *self.last_access.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        r
    }
}

/// A GPU kernel's device state, readable by the host between two batches (see
/// [`PersistentKernel::state`]).
///
/// # Synchronization
/// As for [`GpuBuffers`] (and sharing their spacing between accesses): the copy runs under the
/// residency rule, after the kernel's stream drained at a batch boundary and before its
/// relaunch, so it never sees a batch half done. After the kernel ended, its final state.
/// Freed (under the residency rule) when the kernel and every other holder have dropped it.
pub struct GpuState {
    pub(super) access: Arc<GpuAccess>,
    /// The state type's size (the allocation holds at least one byte).
    pub(super) len: usize,
    /// `None` only while dropping.
    pub(super) memory: std::sync::Mutex<Option<DeviceBuffer>>,
}

impl GpuState {
    /// The state's byte length (the state type's size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the state has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of the state as of the end of the last batch; waits up to `timeout` for the
    /// resident kernels to park ([`CudaError::QuiesceTimeout`], inside
    /// [`PersistentError::Cuda`], past it).
    pub fn read(&self, timeout: Duration) -> Result<Vec<u8>, PersistentError> {
        if self.len == 0 {
            return Ok(Vec::new());
        }
        self.access.with_quiesced(timeout, || {
            let m = self.memory.lock().unwrap_or_else(|p| p.into_inner());
            let Some(b) = m.as_ref() else {
                return Err(CudaError::invalid("kernel state", "freed".to_string()));
            };
            let mut out = vec![0u8; b.len()];
            b.copy_to_host(&mut out)?;
            out.truncate(self.len);
            Ok(out)
        })
    }
}

impl GpuBuffers {
    pub(super) fn table_ptr(&self) -> u64 {
        let m = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        m.as_ref().map_or(0, |(_, t)| t.device_ptr())
    }

    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.lens.len()
    }

    /// Byte length of buffer `index`.
    pub fn byte_len(&self, index: usize) -> Option<usize> {
        self.lens.get(index).copied()
    }

    pub(super) fn check(&self, index: usize, bytes: usize) -> Result<(), PersistentError> {
        match self.lens.get(index) {
            Some(n) if *n == bytes => Ok(()),
            n => Err(PersistentError::BoundBuffer {
                name: self.name.clone(),
                index,
                device_bytes: n.copied(),
                host_bytes: bytes,
            }),
        }
    }

    pub(super) fn with_buffer<R>(
        &self,
        index: usize,
        timeout: Duration,
        op: impl FnOnce(&mut DeviceBuffer) -> Result<R, CudaError>,
    ) -> Result<R, PersistentError> {
        self.access.with_quiesced(timeout, || {
            let mut m = self.memory.lock().unwrap_or_else(|p| p.into_inner());
            match m.as_mut() {
                Some((bufs, _)) => op(&mut bufs[index]),
                None => Err(CudaError::invalid("bound buffer", "freed".to_string())),
            }
        })
    }

    /// Copies buffer `index` (exactly its byte length) into `out`, between two batches of
    /// every resident kernel; waits up to `timeout` for them to park.
    pub fn read(
        &self,
        index: usize,
        out: &mut [u8],
        timeout: Duration,
    ) -> Result<(), PersistentError> {
        self.check(index, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        self.with_buffer(index, timeout, |b| {
            let n = out.len();
            let mut tmp;
            // The allocation may be larger (a length-0 buffer holds 1 byte).
            let dst: &mut [u8] = if b.len() == n {
                out
            } else {
                tmp = vec![0u8; b.len()];
                &mut tmp
            };
            b.copy_to_host(dst)
        })
    }

    /// Replaces buffer `index` (exactly its byte length) with `data`, between two batches: the
    /// next batch sees all of it.
    pub fn write(
        &self,
        index: usize,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(), PersistentError> {
        self.check(index, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.with_buffer(index, timeout, |b| b.copy_from_host(data))
    }
}
