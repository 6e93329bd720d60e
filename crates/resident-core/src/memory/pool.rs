//! `MemoryPool`: buffers recycled by power-of-two size class, handed out as RAII guards.
//!
//! A request of `n` bytes takes a buffer of the smallest class `>= n` (at least
//! [`MIN_CLASS`]). Dropping the guard puts the buffer back in its class; `trim` frees every
//! idle buffer. An optional byte limit bounds everything the pool holds (in use + idle): idle
//! buffers are freed to make room, and when that is not enough `acquire` fails with
//! [`MemoryError::PoolLimitExceeded`]. The driver's stream-ordered pools would serve the
//! device kind on CUDA as well; this one works the same on every backend.

use super::MemoryError;
use crate::engine::{DeviceHandle, DeviceMemory, HostMemory};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Smallest size class, bytes.
pub const MIN_CLASS: usize = 256;

/// What a pool hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// Device memory (host memory on the CPU backend).
    Device,
    /// Pinned, device-mapped host memory (plain host memory on the CPU backend).
    PinnedHost,
}

/// Counters of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Requests served from an idle buffer.
    pub hits: u64,
    /// Requests that allocated.
    pub misses: u64,
    /// Bytes (by size class) handed out now.
    pub live_bytes: usize,
    /// Bytes (by size class) idle in the pool.
    pub pooled_bytes: usize,
    /// Highest `live_bytes + pooled_bytes` seen.
    pub high_water_bytes: usize,
}

enum Block {
    Device(DeviceMemory),
    Host(HostMemory),
}

struct PoolState {
    idle: BTreeMap<usize, Vec<Block>>,
    stats: PoolStats,
}

struct PoolInner {
    device: DeviceHandle,
    kind: PoolKind,
    limit: Option<usize>,
    state: Mutex<PoolState>,
}

/// A pool of buffers of one kind on one device. Cheap to clone (shared).
#[derive(Clone)]
pub struct MemoryPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPool")
            .field("kind", &self.inner.kind)
            .field("limit", &self.inner.limit)
            .field("stats", &self.stats())
            .finish()
    }
}

/// The size class of a request, or `None` when it overflows.
pub fn size_class(bytes: usize) -> Option<usize> {
    bytes.max(MIN_CLASS).checked_next_power_of_two()
}

impl MemoryPool {
    /// A pool of `kind` buffers on `device`, holding at most `limit` bytes when given.
    pub fn new(device: &DeviceHandle, kind: PoolKind, limit: Option<usize>) -> Self {
        MemoryPool {
            inner: Arc::new(PoolInner {
                device: device.clone(),
                kind,
                limit,
                state: Mutex::new(PoolState {
                    idle: BTreeMap::new(),
                    stats: PoolStats::default(),
                }),
            }),
        }
    }

    /// What it hands out.
    pub fn kind(&self) -> PoolKind {
        self.inner.kind
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        self.inner.state.lock().stats
    }

    /// A buffer of at least `bytes`. Its contents are whatever its last user left (zero when
    /// freshly allocated).
    pub fn acquire(&self, bytes: usize) -> Result<PooledBuffer, MemoryError> {
        let class = size_class(bytes).ok_or(MemoryError::TooLarge {
            len: bytes,
            elem: 1,
        })?;
        let mut st = self.inner.state.lock();
        if let Some(block) = st.idle.get_mut(&class).and_then(|v| v.pop()) {
            st.stats.hits += 1;
            st.stats.pooled_bytes -= class;
            st.stats.live_bytes += class;
            return Ok(self.guard(block, class, bytes));
        }
        if let Some(limit) = self.inner.limit {
            // Free idle buffers, largest first, until the new class fits.
            while st.stats.live_bytes + st.stats.pooled_bytes + class > limit {
                let Some((&c, _)) = st.idle.iter().rev().find(|(_, v)| !v.is_empty()) else {
                    break;
                };
                st.idle.get_mut(&c).and_then(|v| v.pop());
                st.stats.pooled_bytes -= c;
            }
            if st.stats.live_bytes + st.stats.pooled_bytes + class > limit {
                return Err(MemoryError::PoolLimitExceeded {
                    limit,
                    in_use: st.stats.live_bytes,
                    requested: class,
                });
            }
        }
        let block = match self.inner.kind {
            PoolKind::Device => self.inner.device.alloc(class).map(Block::Device),
            PoolKind::PinnedHost => self.inner.device.alloc_host(class, true).map(Block::Host),
        }
        .map_err(|source| MemoryError::AllocFailed {
            bytes: class,
            source,
        })?;
        st.stats.misses += 1;
        st.stats.live_bytes += class;
        st.stats.high_water_bytes = st
            .stats
            .high_water_bytes
            .max(st.stats.live_bytes + st.stats.pooled_bytes);
        Ok(self.guard(block, class, bytes))
    }

    fn guard(&self, block: Block, class: usize, requested: usize) -> PooledBuffer {
        PooledBuffer {
            block: Some(block),
            class,
            requested,
            pool: self.inner.clone(),
        }
    }

    /// Frees every idle buffer; returns the bytes freed.
    pub fn trim(&self) -> usize {
        let mut st = self.inner.state.lock();
        let freed = st.stats.pooled_bytes;
        st.idle.clear();
        st.stats.pooled_bytes = 0;
        freed
    }
}

/// A buffer from a [`MemoryPool`]; goes back to the pool on drop.
pub struct PooledBuffer {
    /// Always `Some` until drop.
    block: Option<Block>,
    class: usize,
    requested: usize,
    pool: Arc<PoolInner>,
}

impl std::fmt::Debug for PooledBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBuffer")
            .field("requested", &self.requested)
            .field("class", &self.class)
            .finish()
    }
}

impl PooledBuffer {
    /// Bytes asked for.
    pub fn len(&self) -> usize {
        self.requested
    }
    /// Whether zero bytes were asked for.
    pub fn is_empty(&self) -> bool {
        self.requested == 0
    }
    /// Bytes actually held (the size class).
    pub fn capacity(&self) -> usize {
        self.class
    }
    /// The device memory (whole size class), for a `Device` pool.
    pub fn device_memory(&self) -> Option<&DeviceMemory> {
        match self.block.as_ref()? {
            Block::Device(d) => Some(d),
            Block::Host(_) => None,
        }
    }
    /// The device memory mutably, for a `Device` pool.
    pub fn device_memory_mut(&mut self) -> Option<&mut DeviceMemory> {
        match self.block.as_mut()? {
            Block::Device(d) => Some(d),
            Block::Host(_) => None,
        }
    }
    /// The first `len()` host bytes, for a `PinnedHost` pool.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match self.block.as_ref()? {
            Block::Host(h) => Some(&h.as_bytes()[..self.requested]),
            Block::Device(_) => None,
        }
    }
    /// The first `len()` host bytes mutably, for a `PinnedHost` pool.
    pub fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        let n = self.requested;
        match self.block.as_mut()? {
            Block::Host(h) => Some(&mut h.as_bytes_mut()[..n]),
            Block::Device(_) => None,
        }
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            let mut st = self.pool.state.lock();
            st.stats.live_bytes -= self.class;
            st.stats.pooled_bytes += self.class;
            st.idle.entry(self.class).or_default().push(block);
        }
    }
}
