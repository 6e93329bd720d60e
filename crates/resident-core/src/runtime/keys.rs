//! What the runtime below the keyed host knows of keys: the `Keyed` trait, the key-range check
//! every send runs, read access to a keyed kernel's states, and why a keyed kernel could not
//! be built. The keyed host and the builder are in `keyed.rs`.

use std::any::Any;
use std::ops::Range;

use crate::memory::MemoryError;
use crate::state::Result;

/// A message that names the key it is for.
///
/// ```
/// use resident::prelude::*;
/// #[repr(C)]
/// #[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
/// struct Reading { sensor: u32, value: f32 }
/// impl Keyed for Reading {
///     fn key(&self) -> u32 { self.sensor }
/// }
/// assert_eq!(Reading { sensor: 7, value: 1.0 }.key(), 7);
/// ```
pub trait Keyed {
    /// The key this message is for (`0..keys` of the kernel it is sent to).
    fn key(&self) -> u32;
}

/// The most keys one [`KernelHandle::snapshot_keys`](crate::runtime::handle::KernelHandle::snapshot_keys)
/// reads (it holds the kernel's batch gate while it copies them): 2^20.
pub const MAX_SNAPSHOT_KEYS: u32 = 1 << 20;

/// Default batch of a keyed kernel (split over its workers).
pub const KEYED_BATCH: usize = 4096;

/// A keyed kernel's key range and how to read a message's key, checked at every send.
pub(crate) struct KeyCheck<In> {
    pub keys: u32,
    pub key_of: fn(&In) -> u32,
}

impl<In> Clone for KeyCheck<In> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<In> Copy for KeyCheck<In> {}

impl<In> KeyCheck<In> {
    /// `Err(key)` when `msg` names a key outside `0..keys`.
    #[inline]
    pub fn check(&self, msg: &In) -> std::result::Result<(), u32> {
        let k = (self.key_of)(msg);
        if k < self.keys {
            Ok(())
        } else {
            Err(k)
        }
    }
}

/// Read access to a keyed kernel's states for `KernelHandle::snapshot_key(s)`.
pub(crate) trait KeyStates: Send + Sync {
    /// How many keys.
    fn keys(&self) -> u32;
    /// The state type, for errors.
    fn type_name(&self) -> &'static str;
    /// Whether reads must hold the kernel's batch gate (host states); a device's states
    /// synchronize with the kernel themselves.
    fn needs_gate(&self) -> bool;
    /// Appends clones of the states of keys `range` to `out` (a `Vec<S>`), waiting at most
    /// `timeout` for a device; `Ok(false)` when `out` is not a `Vec` of the state type.
    ///
    /// # Safety
    /// `range` is within `0..keys`, and when `needs_gate` the caller holds the batch gate.
    unsafe fn read(
        &self,
        range: Range<u32>,
        out: &mut dyn Any,
        timeout: std::time::Duration,
    ) -> Result<bool>;
}

/// Why a keyed kernel's host or its device states could not be built at launch (reported as
/// `Error::InvalidConfig` with this text).
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyedError {
    /// No keys, or more than a `u32` key names.
    #[error("a keyed kernel needs 1 to {max} keys, not {0}", max = u32::MAX)]
    KeyCount(usize),
    /// `.workers(0)`.
    #[error("workers must be at least 1")]
    ZeroWorkers,
    /// The device buffer for the states could not be made.
    #[error("the key states ({keys} keys): {source}")]
    KeyStates {
        /// Keys.
        keys: usize,
        /// The memory error.
        #[source]
        source: MemoryError,
    },
}

/// The bound buffer a device keyed kernel keeps its states in.
#[doc(hidden)] // for the engines in the crate `resident`, not the API
pub const KEYS_BUFFER: &str = "keys";
