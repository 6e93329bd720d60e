//! # resident-ring
//!
//! The queues of resident's ring kernels and the wire layout they share with GPU code.
//!
//! * [`envelope`]: the 32-byte [`Envelope`] header and the [`Slot`] a ring stores.
//! * [`spsc`]: a wait-free bounded single-producer single-consumer ring whose memory can be
//!   pinned, device-mapped host memory read by a persistent GPU kernel.
//!
//! No allocation happens after a ring is built; a full ring hands the value back, an empty
//! one returns `None`.
#![deny(missing_docs)]

pub mod envelope;
pub mod spsc;
mod sync;

pub use envelope::{Envelope, MessageId, Slot, DEFAULT_PRIORITY, FLAG_CALL};
