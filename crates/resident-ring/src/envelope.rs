//! The `Envelope`: the fixed 32-byte header every message carries on the wire, and `Slot<T>`,
//! the unit a ring stores (header + payload). Both are `#[repr(C)]` and identical on host and
//! device; `ENVELOPE_C_DECL` is the matching C declaration used by the CUDA templates.

use core::time::Duration;

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
    /// The high 16 bits of the message's time to live in microseconds (see
    /// [`Envelope::set_ttl`]); zero with `reserved1` = no deadline. Devices ignore it.
    pub reserved0: u16,
    /// The low 32 bits of the message's time to live in microseconds (see
    /// [`Envelope::set_ttl`]). Devices ignore it.
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

    /// Gives the message a time to live counted from its send time (`timestamp_ns`): a kernel
    /// that takes it after `timestamp_ns + ttl` does not handle it (it counts it as expired).
    ///
    /// The TTL lives in the 48 bits `reserved0:reserved1` as whole microseconds, rounded up
    /// (so a message never expires before its TTL), at least 1 us and at most [`MAX_TTL`]
    /// (longer TTLs are capped there). The wire layout does not change; only the host reads
    /// these bits.
    pub fn set_ttl(&mut self, ttl: Duration) {
        // In u64 (no 128-bit division on every `call`): whole seconds are whole microseconds,
        // so only the sub-second part rounds up; saturation then the cap as before.
        let us = ttl
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add((ttl.subsec_nanos() as u64).div_ceil(1000))
            .clamp(1, MAX_TTL_US);
        self.reserved0 = (us >> 32) as u16;
        self.reserved1 = us as u32;
    }

    /// The time to live set by [`Envelope::set_ttl`], if any.
    pub fn ttl(&self) -> Option<Duration> {
        self.has_deadline()
            .then(|| Duration::from_micros(self.ttl_us()))
    }

    /// Whether the message carries a deadline (a TTL was set).
    #[inline]
    pub fn has_deadline(&self) -> bool {
        self.reserved0 != 0 || self.reserved1 != 0
    }

    /// The deadline in nanoseconds on the clock of `timestamp_ns`, if the message has one.
    #[inline]
    pub fn deadline_ns(&self) -> Option<u64> {
        self.has_deadline()
            .then(|| self.timestamp_ns.saturating_add(self.ttl_us() * 1000))
    }

    /// Whether the message's deadline has passed at `now_ns` (on the clock of `timestamp_ns`);
    /// `false` for a message without one.
    #[inline]
    pub fn expired_at(&self, now_ns: u64) -> bool {
        self.deadline_ns().is_some_and(|d| now_ns > d)
    }

    #[inline]
    fn ttl_us(&self) -> u64 {
        (self.reserved0 as u64) << 32 | self.reserved1 as u64
    }
}

/// The longest time to live an envelope carries: 2^48 - 1 microseconds (about 8.9 years).
pub const MAX_TTL: Duration = Duration::from_micros(MAX_TTL_US);
const MAX_TTL_US: u64 = (1 << 48) - 1;

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

    #[test]
    fn ttl_round_trips_rounds_up_and_expires_after_its_deadline() {
        let mut e = Envelope::new(7, 128, 1_000_000);
        assert_eq!(e.ttl(), None);
        assert!(!e.has_deadline());
        assert!(!e.expired_at(u64::MAX), "no deadline, never expired");

        e.set_ttl(Duration::from_millis(2));
        assert_eq!(e.ttl(), Some(Duration::from_millis(2)));
        assert_eq!(e.deadline_ns(), Some(3_000_000));
        assert!(!e.expired_at(2_999_999));
        assert!(!e.expired_at(3_000_000), "due at the deadline, not expired");
        assert!(e.expired_at(3_000_001));

        // Rounded up to whole microseconds, never zero (zero would mean "none").
        e.set_ttl(Duration::from_nanos(1));
        assert_eq!(e.ttl(), Some(Duration::from_micros(1)));
        e.set_ttl(Duration::ZERO);
        assert_eq!(e.ttl(), Some(Duration::from_micros(1)));
        e.set_ttl(Duration::from_nanos(1_500));
        assert_eq!(e.ttl(), Some(Duration::from_micros(2)));
        // Seconds and the sub-second part together, as the exact ceil(nanoseconds / 1000).
        for d in [
            Duration::new(1, 1),
            Duration::new(1, 999_999_999),
            Duration::new(59, 1_000),
            Duration::new(86_400, 123_456_789),
            Duration::new(u64::MAX / 1_000_000, 999_999_001),
        ] {
            e.set_ttl(d);
            let want = d.as_nanos().div_ceil(1000).clamp(1, MAX_TTL_US as u128) as u64;
            assert_eq!(e.ttl(), Some(Duration::from_micros(want)), "{d:?}");
        }

        // Both reserved words carry it; longer TTLs are capped, and a late clock saturates.
        e.set_ttl(Duration::from_secs(3 * 86_400 * 365));
        assert!(e.reserved0 != 0 && e.reserved1 != 0, "{e:?}");
        assert_eq!(e.ttl(), Some(Duration::from_secs(3 * 86_400 * 365)));
        e.set_ttl(Duration::MAX);
        assert_eq!(e.ttl(), Some(MAX_TTL));
        e.timestamp_ns = u64::MAX - 5;
        assert_eq!(e.deadline_ns(), Some(u64::MAX));
        assert!(!e.expired_at(u64::MAX));

        // The other fields are untouched.
        assert_eq!((e.message_id, e.priority, e.flags), (7, 128, 0));
    }
}
