//! The `Envelope`: the fixed 32-byte header every message carries on the wire, and `Slot<T>`,
//! the unit a ring stores (header + payload). Both are `#[repr(C)]` and identical on host and
//! device; `ENVELOPE_C_DECL` is the matching C declaration used by the CUDA templates.

use bytemuck::{Pod, Zeroable};

/// Identifier the runtime assigns to every accepted message (unique per runtime, never 0).
pub type MessageId = u64;

/// Default priority of a message sent without one (the middle of 0-255).
pub const DEFAULT_PRIORITY: u8 = 128;

/// Envelope flag: the sender waits for the reply through `call()`; the reply must be routed
/// back to that caller by `correlation_id` instead of to the output queue.
pub const FLAG_CALL: u8 = 0b0000_0001;

/// Header of every message on the wire. 32 bytes, 8-byte aligned, no padding.
///
/// Responses carry the request's `message_id` as their `correlation_id` (0 = none).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Envelope {
    /// Runtime-unique id of this message (0 only for unsent values).
    pub message_id: u64,
    /// For a response: the `message_id` of the request it answers; 0 = none.
    pub correlation_id: u64,
    /// Send time in nanoseconds since the runtime's epoch (monotonic clock).
    pub timestamp_ns: u64,
    /// Priority 0-255; higher drains first.
    pub priority: u8,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Reserved, zero.
    pub reserved0: u16,
    /// Reserved, zero.
    pub reserved1: u32,
}

const _: () = assert!(core::mem::size_of::<Envelope>() == 32);
const _: () = assert!(core::mem::align_of::<Envelope>() == 8);

impl Envelope {
    /// A fresh envelope with the given id, priority and timestamp and no correlation.
    pub fn new(message_id: u64, priority: u8, timestamp_ns: u64) -> Self {
        Envelope {
            message_id,
            priority,
            timestamp_ns,
            ..Default::default()
        }
    }

    /// Whether the sender waits for the reply through `call()`.
    pub fn is_call(&self) -> bool {
        self.flags & FLAG_CALL != 0
    }
}

/// The C declaration of [`Envelope`], field for field.
pub const ENVELOPE_C_DECL: &str = "typedef struct __attribute__((aligned(8))) {\n    unsigned long long message_id;\n    unsigned long long correlation_id;\n    unsigned long long timestamp_ns;\n    unsigned char priority;\n    unsigned char flags;\n    unsigned short reserved0;\n    unsigned int reserved1;\n} Envelope;\n";

/// What a ring stores: an envelope followed by the payload, `#[repr(C)]`.
///
/// The C side declares it as `struct { Envelope env; T payload; }`; with `T`'s alignment at
/// most 8 (every Pod message built from primitives) the two layouts are identical.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slot<T> {
    /// The header.
    pub env: Envelope,
    /// The message.
    pub payload: T,
}

impl<T> Slot<T> {
    /// Bundles a header and a payload.
    pub fn new(env: Envelope, payload: T) -> Self {
        Slot { env, payload }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_layout_matches_c_offsets() {
        assert_eq!(core::mem::offset_of!(Envelope, message_id), 0);
        assert_eq!(core::mem::offset_of!(Envelope, correlation_id), 8);
        assert_eq!(core::mem::offset_of!(Envelope, timestamp_ns), 16);
        assert_eq!(core::mem::offset_of!(Envelope, priority), 24);
        assert_eq!(core::mem::offset_of!(Envelope, flags), 25);
        assert_eq!(core::mem::offset_of!(Slot<[u8; 64]>, payload), 32);
        assert_eq!(core::mem::size_of::<Slot<[u8; 64]>>(), 96);
    }
}
