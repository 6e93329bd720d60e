//! The control block: the one 256-byte structure, in pinned device-mapped host memory, through
//! which the host steers a persistent kernel and the kernel reports back.
//!
//! Two 128-byte lines, each written by exactly one side, so no line ever bounces between writers
//! and no read-modify-write atomic ever crosses PCIe:
//! * line 0 (offset 0): written only by the host (`run_state`, `heartbeat`, `heartbeat_timeout_ns`,
//!   the peer-input slot `peer_ring` / `peer_capacity` / `peer_seq`);
//! * line 1 (offset 128): written only by the device (`device_state`, counters, error code,
//!   `peer_ack`, `peer_taken`, `peer_call_seen`).
//!
//! The *peer-input slot* is device-side forwarding (`RingKernel::forward_to` between two kernels
//! of one CUDA-family engine): the host stores another kernel's **output** ring there and the
//! kernel consumes it as one more input (see [`super::peer`]).
//!
//! Every field is a plain 32- or 64-bit value read with an acquire load and written with a
//! release store by its one writer; [`CONTROL_BLOCK_C_DECL`] is the same layout for CUDA C.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Size of the control block in bytes.
pub const CONTROL_BLOCK_BYTES: usize = 256;

/// What the host asks the kernel to do (`ControlBlock::run_state`, host-written).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum RunState {
    /// Queues exist and the kernel may be resident, but it must not process yet.
    Launched = 0,
    /// Drain the input lanes.
    Active = 1,
    /// Stop draining (messages queue up) but stay resident.
    Inactive = 2,
    /// Finish the batch in hand and exit.
    Terminate = 3,
    /// Finish the batch in hand (never dropping its outputs) and exit with
    /// [`DeviceState::Quiesced`], leaving queues, indices, counters and state in place so a
    /// relaunch over them resumes where it left off.
    Quiesce = 4,
}

impl RunState {
    /// Every value, for generating the CUDA template's `#define`s.
    pub const ALL: [RunState; 5] = [
        RunState::Launched,
        RunState::Active,
        RunState::Inactive,
        RunState::Terminate,
        RunState::Quiesce,
    ];

    /// The suffix of its `RESIDENT_RUN_*` name in the CUDA template (an exhaustive match: a new
    /// variant does not compile until it is named here, and the template gets it).
    pub fn c_name(self) -> &'static str {
        match self {
            RunState::Launched => "LAUNCHED",
            RunState::Active => "ACTIVE",
            RunState::Inactive => "INACTIVE",
            RunState::Terminate => "TERMINATE",
            RunState::Quiesce => "QUIESCE",
        }
    }

    /// Decodes the raw value; unknown values read as `None`.
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(RunState::Launched),
            1 => Some(RunState::Active),
            2 => Some(RunState::Inactive),
            3 => Some(RunState::Terminate),
            4 => Some(RunState::Quiesce),
            _ => None,
        }
    }
}

/// What the kernel reports it is doing (`ControlBlock::device_state`, device-written).
/// Values at or above [`DeviceState::Terminated`] mean the kernel has exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum DeviceState {
    /// The kernel has not started yet (the block is zeroed at allocation).
    NotStarted = 0,
    /// Resident and draining (`RunState::Active`).
    Running = 1,
    /// Resident and parked (`Launched` or `Inactive`).
    Idle = 2,
    /// Exited because the host asked (`RunState::Terminate`).
    Terminated = 3,
    /// Exited because the heartbeat did not change for `heartbeat_timeout_ns`.
    HeartbeatTimeout = 4,
    /// Exited because of an error it detected itself; see `error_code`.
    Error = 5,
    /// Exited because the host asked for a quiesce (`RunState::Quiesce`); resumable.
    Quiesced = 6,
}

impl DeviceState {
    /// Every value, for generating the CUDA template's `#define`s.
    pub const ALL: [DeviceState; 7] = [
        DeviceState::NotStarted,
        DeviceState::Running,
        DeviceState::Idle,
        DeviceState::Terminated,
        DeviceState::HeartbeatTimeout,
        DeviceState::Error,
        DeviceState::Quiesced,
    ];

    /// The suffix of its `RESIDENT_DEV_*` name in the CUDA template (exhaustive, as
    /// [`RunState::c_name`]).
    pub fn c_name(self) -> &'static str {
        match self {
            DeviceState::NotStarted => "NOT_STARTED",
            DeviceState::Running => "RUNNING",
            DeviceState::Idle => "IDLE",
            DeviceState::Terminated => "TERMINATED",
            DeviceState::HeartbeatTimeout => "HEARTBEAT_TIMEOUT",
            DeviceState::Error => "ERROR",
            DeviceState::Quiesced => "QUIESCED",
        }
    }

    /// Decodes the raw value; unknown values read as `None`.
    pub fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(DeviceState::NotStarted),
            1 => Some(DeviceState::Running),
            2 => Some(DeviceState::Idle),
            3 => Some(DeviceState::Terminated),
            4 => Some(DeviceState::HeartbeatTimeout),
            5 => Some(DeviceState::Error),
            6 => Some(DeviceState::Quiesced),
            _ => None,
        }
    }

    /// Whether the kernel has exited (a quiesced kernel has: it is not resident).
    pub fn has_exited(self) -> bool {
        matches!(
            self,
            DeviceState::Terminated
                | DeviceState::HeartbeatTimeout
                | DeviceState::Error
                | DeviceState::Quiesced
        )
    }
}

/// `error_code` values the device sets together with [`DeviceState::Error`].
pub mod error_code {
    /// No error.
    pub const NONE: u32 = 0;
    /// The kernel was launched with a block size different from the batch size it was built for.
    pub const BAD_BLOCK_SIZE: u32 = 1;
    /// Lane count or capacities in the launch parameters are invalid.
    pub const BAD_PARAMS: u32 = 2;
}

/// The `#define`s of the run states, device states and error codes that the CUDA template (and
/// CudaSim, and the TSan driver) use, generated from [`RunState`], [`DeviceState`] and
/// [`error_code`] so the two sides cannot drift apart.
pub fn c_state_defines() -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for r in RunState::ALL {
        let _ = writeln!(s, "#define RESIDENT_RUN_{} {}u", r.c_name(), r as u32);
    }
    for d in DeviceState::ALL {
        let _ = writeln!(s, "#define RESIDENT_DEV_{} {}u", d.c_name(), d as u32);
    }
    for (name, v) in [
        ("NONE", error_code::NONE),
        ("BAD_BLOCK_SIZE", error_code::BAD_BLOCK_SIZE),
        ("BAD_PARAMS", error_code::BAD_PARAMS),
    ] {
        let _ = writeln!(s, "#define RESIDENT_ERR_{name} {v}u");
    }
    s
}

/// The shared control block. `#[repr(C)]`, 256 bytes, 128-byte aligned. Its fields are private:
/// the host reaches them only through the host-side methods below (one writer per field; the
/// device writes its own line from the kernel).
#[repr(C, align(128))]
pub struct ControlBlock {
    // ---- line 0: host-written ----
    /// A [`RunState`] value. Host: release store. Device: acquire load.
    run_state: AtomicU32,
    _host_pad0: u32,
    /// Incremented by the host while it is alive (store of its own previous value + 1; the host
    /// is the only writer). The device exits when it sees no change for `heartbeat_timeout_ns`.
    heartbeat: AtomicU64,
    /// Heartbeat timeout in nanoseconds of device time; 0 disables the timeout.
    heartbeat_timeout_ns: AtomicU64,
    /// Device address of the peer ring (a producer kernel's output ring), 0 for none. Host:
    /// relaxed store before the release store of `peer_seq`.
    peer_ring: AtomicU64,
    /// Slots in the peer ring (power of two). Host: relaxed store before `peer_seq`.
    peer_capacity: AtomicU32,
    /// Bumped by the host on every link and unlink, written last with a release store; the
    /// device adopts `peer_ring` / `peer_capacity` when it sees a new value and acknowledges it
    /// in `peer_ack`.
    peer_seq: AtomicU32,
    _host_pad1: [u8; 88],
    // ---- line 1: device-written ----
    /// A [`DeviceState`] value. Device: release store *after* the counters, so an acquire load
    /// of it here sees counters at least as new as the state.
    device_state: AtomicU32,
    /// An [`error_code`] value, meaningful with [`DeviceState::Error`].
    error_code: AtomicU32,
    /// Messages handed to the handler so far.
    processed: AtomicU64,
    /// Batches drained so far.
    batches: AtomicU64,
    /// Device clock cycles spent on batches (`clock64`; on CudaSim, nanoseconds).
    busy_cycles: AtomicU64,
    /// The last `heartbeat` value the device saw.
    last_heartbeat_seen: AtomicU64,
    /// Outputs produced but never published because the kernel was told to exit (terminate or
    /// heartbeat timeout) while the output ring stayed full. Counted, never silent.
    undelivered: AtomicU64,
    /// The `peer_seq` the device has adopted. Device: release store *after* its last release of
    /// the old peer ring's head, so a host that acquires it owns that head again.
    peer_ack: AtomicU32,
    /// The `peer_seq` at which the device met a `call` reply at the head of the peer ring and
    /// stopped taking from it (a call's reply goes back to its caller, through the host); 0
    /// when not stopped.
    peer_call_seen: AtomicU32,
    /// Messages taken from peer rings over the kernel's life (they are in `processed` too).
    peer_taken: AtomicU64,
    _dev_pad: [u8; 64],
}

const _: () = assert!(core::mem::size_of::<ControlBlock>() == CONTROL_BLOCK_BYTES);
const _: () = assert!(core::mem::align_of::<ControlBlock>() == 128);

/// The C declaration of [`ControlBlock`], field for field (checked by a test).
pub const CONTROL_BLOCK_C_DECL: &str = "typedef struct __attribute__((aligned(128))) {
    unsigned int run_state;
    unsigned int _host_pad0;
    unsigned long long heartbeat;
    unsigned long long heartbeat_timeout_ns;
    unsigned long long peer_ring;
    unsigned int peer_capacity;
    unsigned int peer_seq;
    unsigned char _host_pad1[88];
    unsigned int device_state;
    unsigned int error_code;
    unsigned long long processed;
    unsigned long long batches;
    unsigned long long busy_cycles;
    unsigned long long last_heartbeat_seen;
    unsigned long long undelivered;
    unsigned int peer_ack;
    unsigned int peer_call_seen;
    unsigned long long peer_taken;
    unsigned char _dev_pad[64];
} ControlBlock;
";

/// A snapshot of the device-written line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Decoded `device_state` (`None` for a value this build does not know).
    pub state: Option<DeviceState>,
    /// `error_code`.
    pub error_code: u32,
    /// Messages handed to the handler.
    pub processed: u64,
    /// Batches drained.
    pub batches: u64,
    /// Busy device cycles.
    pub busy_cycles: u64,
    /// Last heartbeat value the device saw.
    pub last_heartbeat_seen: u64,
    /// Outputs lost because the kernel had to exit with a full output ring.
    pub undelivered: u64,
    /// Messages taken from peer rings (device-side forwarding), included in `processed`.
    pub peer_taken: u64,
}

impl ControlBlock {
    /// Reads the device line. The acquire load of `device_state` comes first and pairs with the
    /// device's release store of it, which follows its counter stores.
    pub fn device_counters(&self) -> DeviceCounters {
        let state = self.device_state.load(Ordering::Acquire);
        DeviceCounters {
            state: DeviceState::from_raw(state),
            // Acquire on each: pairs with the device's stores; each is a standalone snapshot.
            error_code: self.error_code.load(Ordering::Acquire),
            processed: self.processed.load(Ordering::Acquire),
            batches: self.batches.load(Ordering::Acquire),
            busy_cycles: self.busy_cycles.load(Ordering::Acquire),
            last_heartbeat_seen: self.last_heartbeat_seen.load(Ordering::Acquire),
            undelivered: self.undelivered.load(Ordering::Acquire),
            peer_taken: self.peer_taken.load(Ordering::Acquire),
        }
    }

    /// Host side: stores a new peer-input slot (`ring` = 0 for none) under sequence number
    /// `seq`. The caller is the slot's one writer (the kernel's [`super::peer::PeerInput`]).
    pub(crate) fn set_peer(&self, ring: u64, capacity: u32, seq: u32) {
        // Relaxed: published by the release store of `peer_seq` below.
        self.peer_ring.store(ring, Ordering::Relaxed);
        self.peer_capacity.store(capacity, Ordering::Relaxed);
        // Release: pairs with the device's acquire load of `peer_seq`; the ring address, its
        // capacity and everything the host did to the ring before (its last release of the
        // ring's head when it popped from it) are visible to the device once it sees `seq`.
        self.peer_seq.store(seq, Ordering::Release);
    }

    /// Host side: the peer ring the slot names now (0 for none). The host is its only writer.
    pub fn peer_ring(&self) -> u64 {
        // Relaxed: the host reads what a host thread wrote; used only to order quiesces.
        self.peer_ring.load(Ordering::Relaxed)
    }

    /// Host side: the `peer_seq` the device has adopted. Acquire: pairs with the device's release
    /// store, which follows its last release of the old ring's head.
    pub fn peer_ack(&self) -> u32 {
        self.peer_ack.load(Ordering::Acquire)
    }

    /// Host side: the `peer_seq` at which the device stopped at a `call` reply (0: not stopped).
    pub fn peer_call_seen(&self) -> u32 {
        self.peer_call_seen.load(Ordering::Acquire)
    }

    /// Host side: sets the run state. Release pairs with the device's acquire load, so anything
    /// the host wrote before (messages, timeout) is visible when the device sees the new state.
    pub fn set_run_state(&self, s: RunState) {
        self.run_state.store(s as u32, Ordering::Release);
    }

    /// Host side: the run state last set.
    pub fn run_state(&self) -> Option<RunState> {
        // Relaxed: the host is the only writer and reads back its own value.
        RunState::from_raw(self.run_state.load(Ordering::Relaxed))
    }

    /// Host side: bumps the heartbeat. Not a read-modify-write atomic: the host is the only
    /// writer, so a relaxed load of its own value plus a release store is exact.
    pub fn bump_heartbeat(&self) -> u64 {
        let next = self.heartbeat.load(Ordering::Relaxed).wrapping_add(1);
        // Release: pairs with the device's acquire load of heartbeat.
        self.heartbeat.store(next, Ordering::Release);
        next
    }

    /// Host side: sets the heartbeat timeout (0 disables it). Release pairs with the device's
    /// acquire load.
    pub fn set_heartbeat_timeout_ns(&self, ns: u64) {
        self.heartbeat_timeout_ns.store(ns, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    /// Offsets the C declaration implies, written out by hand from `CONTROL_BLOCK_C_DECL`.
    #[test]
    fn offsets_match_c_declaration() {
        assert_eq!(offset_of!(ControlBlock, run_state), 0);
        assert_eq!(offset_of!(ControlBlock, heartbeat), 8);
        assert_eq!(offset_of!(ControlBlock, heartbeat_timeout_ns), 16);
        assert_eq!(offset_of!(ControlBlock, device_state), 128);
        assert_eq!(offset_of!(ControlBlock, error_code), 132);
        assert_eq!(offset_of!(ControlBlock, processed), 136);
        assert_eq!(offset_of!(ControlBlock, batches), 144);
        assert_eq!(offset_of!(ControlBlock, busy_cycles), 152);
        assert_eq!(offset_of!(ControlBlock, last_heartbeat_seen), 160);
        assert_eq!(offset_of!(ControlBlock, undelivered), 168);
        assert_eq!(offset_of!(ControlBlock, peer_ring), 24);
        assert_eq!(offset_of!(ControlBlock, peer_capacity), 32);
        assert_eq!(offset_of!(ControlBlock, peer_seq), 36);
        assert_eq!(offset_of!(ControlBlock, peer_ack), 176);
        assert_eq!(offset_of!(ControlBlock, peer_call_seen), 180);
        assert_eq!(offset_of!(ControlBlock, peer_taken), 184);
        // The C declaration's byte sizes add up to the same total, line for line.
        let host_line = 4 + 4 + 8 + 8 + 8 + 4 + 4 + 88;
        let dev_line = 4 + 4 + 8 * 5 + 4 + 4 + 8 + 64;
        assert_eq!(host_line, 128);
        assert_eq!(dev_line, 128);
        assert!(CONTROL_BLOCK_C_DECL.contains("unsigned char _host_pad1[88];"));
        assert!(CONTROL_BLOCK_C_DECL.contains("unsigned char _dev_pad[64];"));
    }

    #[test]
    fn states_round_trip() {
        for s in [
            RunState::Launched,
            RunState::Active,
            RunState::Inactive,
            RunState::Terminate,
            RunState::Quiesce,
        ] {
            assert_eq!(RunState::from_raw(s as u32), Some(s));
        }
        assert_eq!(RunState::from_raw(9), None);
        for v in 0..7 {
            assert_eq!(DeviceState::from_raw(v).map(|s| s as u32), Some(v));
        }
        assert!(DeviceState::HeartbeatTimeout.has_exited());
        assert!(!DeviceState::Idle.has_exited());
    }
}

#[cfg(test)]
mod define_tests {
    use super::*;

    #[test]
    fn template_defines_come_from_the_enums() {
        for r in RunState::ALL {
            assert_eq!(RunState::from_raw(r as u32), Some(r));
        }
        for d in DeviceState::ALL {
            assert_eq!(DeviceState::from_raw(d as u32), Some(d));
        }
        let d = c_state_defines();
        assert!(d.contains("#define RESIDENT_RUN_QUIESCE 4u"), "{d}");
        assert!(d.contains("#define RESIDENT_DEV_TERMINATED 3u"), "{d}");
        assert!(d.contains("#define RESIDENT_ERR_BAD_PARAMS 2u"), "{d}");
        // The template itself no longer spells these out.
        for line in super::super::template::TEMPLATE_BODY.lines() {
            let l = line.trim_start();
            assert!(
                !(l.starts_with("#define RESIDENT_RUN_")
                    || l.starts_with("#define RESIDENT_DEV_")
                    || l.starts_with("#define RESIDENT_ERR_")),
                "copied in the template: {line}"
            );
        }
    }
}
