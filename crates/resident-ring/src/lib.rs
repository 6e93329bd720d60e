//! # resident-ring
//!
//! The queues of resident's ring kernels and the wire layout they share with GPU code.
//!
//! * [`envelope`]: the 32-byte [`Envelope`] header and the [`Slot`] a ring stores.
//! * [`message`]: the [`Message`] bound (any `bytemuck::Pod`) and [`DeviceMessage`], a message
//!   that also yields its C declaration ([`device_message!`]).
//! * [`spsc`]: a wait-free bounded single-producer single-consumer ring whose memory can be
//!   pinned, device-mapped host memory read by a persistent GPU kernel.
//! * [`mailbox`]: priority lanes of SPSC rings behind a multi-producer front, with
//!   [`Backpressure`] policies, blocking waits and close.
//! * [`wait`]: [`WaitStrategy`] (spin, then park) and the lost-wake-up-free [`wait::Signal`].
//! * [`call`]: [`CallSlot`], where the reply of a waiting request/response call lands.
//! * [`handoff`]: [`handoff::InHand`], who owns each message of the batch in hand when a
//!   `terminate` gives up on a handler that never returns.
//! * [`launch`]: the launch geometry ([`LaunchConfig`]) every engine and the CUDA driver layer
//!   share: an explicit grid and block, or a block size chosen for `n` elements.
//!
//! Under `--cfg loom` the SPSC ring, the signal, the call slot and the handoff are built on
//! loom's primitives for the model checks in `tests/loom_*.rs`; the mailbox is left out of that build.
//!
//! No allocation happens after a ring is built; a full ring hands the value back, an empty
//! one returns `None`.
#![deny(missing_docs)]

pub mod call;
pub mod envelope;
pub mod handoff;
pub mod launch;
// The loom build (`--cfg loom`) models the SPSC ring, the signal and the call slot; the
// mailbox, built on them with parking_lot locks, is checked by its own model-based and
// stress tests instead and left out of that build.
#[cfg(not(loom))]
pub mod mailbox;
pub mod message;
pub mod spsc;
mod sync;
pub mod wait;

pub use call::CallSlot;
pub use envelope::{Envelope, MessageId, Slot, DEFAULT_PRIORITY, FLAG_CALL};
pub use launch::LaunchConfig;
#[cfg(not(loom))]
pub use mailbox::{lane_of, Backpressure, Mailbox, MailboxConfig, Writer};
pub use message::{DeviceMessage, Message, WgslLayoutError};
pub use wait::WaitStrategy;

#[doc(hidden)]
pub use bytemuck as __bytemuck;
