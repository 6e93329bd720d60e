//! The emulated device: a CPU thread that plays the persistent kernel's part over exactly the
//! memory the GPU would use, following the same steps as the CUDA template
//! (`kernels/persistent_ring.cu`) so the host protocol is tested without a GPU:
//!
//! 1. check the control block (every poll while not active; while active, every
//!    `control_poll`, busy or idle):
//!    run state, heartbeat (exit after `heartbeat_timeout_ns` without a change), terminate;
//! 2. gather up to `batch_size` slots, highest lane first, re-reading a lane's `tail` (Acquire)
//!    only when its cached copy shows the lane empty;
//! 3. copy the slots out, publish each touched lane's `head` (Release);
//! 4. run the handler on each; outputs compacted in gathered order;
//! 5. wait (with backoff, still obeying terminate and heartbeat) until the output ring has room
//!    for all of them, re-reading its `head` (Acquire) only when the cached copy shows it full;
//! 6. write the outputs, publish the output `tail` (Release); update the counters.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytemuck::Pod;
use core::sync::atomic::Ordering;
use resident_ring::spsc::{RingHeader, RingMemory, HEADER_BYTES};
use resident_ring::{Envelope, Slot};

use super::control::{ControlBlock, DeviceState, RunState};
use super::host::DeviceView;
use super::{PersistentError, SharedMemory};

/// Tuning of the emulated device.
#[derive(Clone, Copy, Debug)]
pub struct EmulatorOptions {
    /// Most messages per batch (the GPU's block size).
    pub batch_size: usize,
    /// Longest idle backoff.
    pub max_backoff: Duration,
    /// Longest time between control-block checks while busy.
    pub control_poll: Duration,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        EmulatorOptions {
            batch_size: 256,
            max_backoff: Duration::from_micros(50),
            control_poll: Duration::from_micros(100),
        }
    }
}

/// How the emulated device ended, with the handler handed back (its captured state included).
pub struct EmulatorExit<F> {
    /// The final state it wrote to the control block.
    pub state: DeviceState,
    /// The handler.
    pub handler: F,
}

/// A running emulated device.
pub struct EmulatedDevice<F> {
    thread: JoinHandle<EmulatorExit<F>>,
}

impl<F> EmulatedDevice<F>
where
    F: Send + 'static,
{
    /// Starts the device thread on `view` with `handler(in, out, env) -> produced`.
    /// `out` starts zeroed; returning `false` produces no output for that input.
    pub fn spawn<In, Out>(
        view: DeviceView<In, Out>,
        options: EmulatorOptions,
        handler: F,
    ) -> Result<Self, PersistentError>
    where
        In: Pod + Send,
        Out: Pod + Send,
        F: FnMut(&In, &mut Out, &Envelope) -> bool,
    {
        if options.batch_size == 0 || options.batch_size > view.config.out_capacity {
            return Err(PersistentError::Config(format!(
                "batch size {} must be in 1..=out_capacity ({})",
                options.batch_size, view.config.out_capacity
            )));
        }
        let thread = std::thread::Builder::new()
            .name("resident-emulated-device".into())
            .spawn(move || run(view, options, handler))
            .map_err(|e| PersistentError::Config(format!("cannot spawn emulator thread: {e}")))?;
        Ok(EmulatedDevice { thread })
    }

    /// Whether the device thread has exited.
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the device to exit (after terminate or a heartbeat timeout).
    pub fn join(self) -> std::thread::Result<EmulatorExit<F>> {
        self.thread.join()
    }
}

/// One ring as the device sees it: header plus slots of `T`.
struct RawRing<T> {
    mem: SharedMemory,
    mask: u64,
    _t: core::marker::PhantomData<T>,
}

impl<T: Copy> RawRing<T> {
    fn new(mem: SharedMemory, capacity: usize) -> Self {
        RawRing {
            mem,
            mask: capacity as u64 - 1,
            _t: core::marker::PhantomData,
        }
    }
    fn header(&self) -> &RingHeader {
        // SAFETY: the memory was checked by PersistentQueues to hold a ring of this capacity,
        // 128-aligned; RingHeader is atomics and padding, valid for any bit pattern.
        unsafe { &*(self.mem.as_mut_ptr() as *const RingHeader) }
    }
    fn slot(&self, index: u64) -> *mut T {
        // SAFETY: `index & mask` < capacity and the memory holds `capacity` slots after the
        // header (checked at construction); HEADER_BYTES keeps T's alignment (<= 128).
        unsafe {
            (self.mem.as_mut_ptr().add(HEADER_BYTES) as *mut T).add((index & self.mask) as usize)
        }
    }
}

fn run<In, Out, F>(
    view: DeviceView<In, Out>,
    opt: EmulatorOptions,
    mut handler: F,
) -> EmulatorExit<F>
where
    In: Pod + Send,
    Out: Pod + Send,
    F: FnMut(&In, &mut Out, &Envelope) -> bool,
{
    let cfg = view.config;
    let lanes: Vec<RawRing<Slot<In>>> = view
        .lanes
        .iter()
        .map(|m| RawRing::new(m.clone(), cfg.lane_capacity))
        .collect();
    let out_ring: RawRing<Slot<Out>> = RawRing::new(view.out.clone(), cfg.out_capacity);
    let ctl: &ControlBlock = view.control();

    // Own indices are exact (we are their only writer); cached foreign indices may be stale,
    // which only makes a lane look emptier or the output fuller. Relaxed for our own indices
    // (nobody else writes them); Acquire for the foreign ones, pairing with the host's Release.
    let mut head: Vec<u64> = lanes
        .iter()
        .map(|r| r.header().head.load(Ordering::Relaxed))
        .collect();
    let mut cached_tail: Vec<u64> = lanes
        .iter()
        .map(|r| r.header().tail.load(Ordering::Acquire))
        .collect();
    let mut out_tail = out_ring.header().tail.load(Ordering::Relaxed);
    let mut out_cached_head = out_ring.header().head.load(Ordering::Acquire);

    let mut processed = 0u64;
    let mut batches = 0u64;
    let mut busy_ns = 0u64;
    let mut undelivered = 0u64;
    // Acquire: pairs with the host's Release store of heartbeat.
    let mut hb_value = ctl.heartbeat.load(Ordering::Acquire);
    let mut hb_time = Instant::now();
    let mut last_check: Option<Instant> = None;
    let mut run_state = RunState::Launched;
    let mut shown_state = DeviceState::NotStarted;
    let mut backoff = Duration::from_nanos(64);
    let mut batch: Vec<Slot<In>> = Vec::with_capacity(opt.batch_size);
    let mut outputs: Vec<Slot<Out>> = Vec::with_capacity(opt.batch_size);

    let publish_counters = |processed: u64, batches: u64, busy: u64, undelivered: u64| {
        // Release: pairs with the host's Acquire loads in `device_counters`.
        ctl.processed.store(processed, Ordering::Release);
        ctl.batches.store(batches, Ordering::Release);
        ctl.busy_cycles.store(busy, Ordering::Release);
        ctl.undelivered.store(undelivered, Ordering::Release);
    };
    // The control check: Some(exit state) when the device must exit.
    let mut check_control = |run_state: &mut RunState, now: Instant| -> Option<DeviceState> {
        // Acquire: pairs with the host's Release stores of its line.
        let hb = ctl.heartbeat.load(Ordering::Acquire);
        if hb != hb_value {
            hb_value = hb;
            hb_time = now;
            // Release: pairs with the host's Acquire load of last_heartbeat_seen.
            ctl.last_heartbeat_seen.store(hb, Ordering::Release);
        }
        let timeout = ctl.heartbeat_timeout_ns.load(Ordering::Acquire);
        if timeout != 0 && now.duration_since(hb_time) > Duration::from_nanos(timeout) {
            return Some(DeviceState::HeartbeatTimeout);
        }
        // Unknown values are treated as Inactive: never process on a state we cannot read.
        *run_state =
            RunState::from_raw(ctl.run_state.load(Ordering::Acquire)).unwrap_or(RunState::Inactive);
        if *run_state == RunState::Terminate {
            return Some(DeviceState::Terminated);
        }
        None
    };
    let idle_wait = |backoff: &mut Duration, max: Duration| {
        if *backoff < Duration::from_micros(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(*backoff);
        }
        *backoff = (*backoff * 2).min(max);
    };

    let exit_state = 'outer: loop {
        let now = Instant::now();
        let due = last_check.is_none_or(|t| now.duration_since(t) >= opt.control_poll);
        if due || run_state != RunState::Active {
            last_check = Some(now);
            if let Some(s) = check_control(&mut run_state, now) {
                break 'outer s;
            }
            let want = if run_state == RunState::Active {
                DeviceState::Running
            } else {
                DeviceState::Idle
            };
            publish_counters(processed, batches, busy_ns, undelivered);
            if want != shown_state {
                shown_state = want;
                // Release: after the counters, pairs with the host's Acquire load.
                ctl.device_state.store(want as u32, Ordering::Release);
            }
        }
        if run_state != RunState::Active {
            idle_wait(&mut backoff, opt.max_backoff);
            continue;
        }

        // Gather, highest lane first.
        batch.clear();
        let mut taken = [0u64; super::MAX_LANES];
        for l in (0..lanes.len()).rev() {
            let room = (opt.batch_size - batch.len()) as u64;
            if room == 0 {
                break;
            }
            if cached_tail[l] == head[l] {
                // Acquire: pairs with the host's Release store of tail; the slots' bytes are
                // visible once we see the new tail.
                cached_tail[l] = lanes[l].header().tail.load(Ordering::Acquire);
            }
            let take = (cached_tail[l] - head[l]).min(room);
            for i in 0..take {
                // SAFETY: head <= index < tail: published by the host and not reusable by it
                // until we advance head.
                batch.push(unsafe { lanes[l].slot(head[l] + i).read() });
            }
            taken[l] = take;
        }
        if batch.is_empty() {
            // Idle: the counters are already current (published after every batch and at every
            // control check), and the control block waits for its `control_poll` turn, so an
            // idle poll reads one index per lane and writes nothing, as on the GPU.
            idle_wait(&mut backoff, opt.max_backoff);
            continue;
        }
        backoff = Duration::from_nanos(64);
        let t0 = Instant::now();
        for l in 0..lanes.len() {
            if taken[l] > 0 {
                head[l] += taken[l];
                // Release: our reads of those slots happen before the host may reuse them.
                lanes[l].header().head.store(head[l], Ordering::Release);
            }
        }

        outputs.clear();
        for s in &batch {
            let mut out = Out::zeroed();
            if handler(&s.payload, &mut out, &s.env) {
                let env = Envelope {
                    message_id: s.env.message_id,
                    correlation_id: s.env.message_id,
                    timestamp_ns: s.env.timestamp_ns,
                    priority: s.env.priority,
                    flags: s.env.flags,
                    ..Envelope::default()
                };
                outputs.push(Slot::new(env, out));
            }
        }

        // Wait for room for the whole batch's outputs; never drop.
        let k = outputs.len() as u64;
        let cap = cfg.out_capacity as u64;
        let mut wait = Duration::from_nanos(64);
        while out_tail + k - out_cached_head > cap {
            // Acquire: pairs with the host's Release store of head; its reads of the slots
            // happen before our writes.
            out_cached_head = out_ring.header().head.load(Ordering::Acquire);
            if out_tail + k - out_cached_head <= cap {
                break;
            }
            if wait == Duration::from_nanos(64) {
                // Blocked on a full output: make the counters current for whoever watches.
                publish_counters(processed, batches, busy_ns, undelivered);
            }
            if let Some(s) = check_control(&mut run_state, Instant::now()) {
                undelivered += k;
                processed += batch.len() as u64;
                batches += 1;
                break 'outer s;
            }
            idle_wait(&mut wait, opt.max_backoff);
        }
        for (i, o) in outputs.iter().enumerate() {
            // SAFETY: tail + i < head + capacity (checked above): the slot is ours to write and
            // the host will not read it before our Release store of tail.
            unsafe { out_ring.slot(out_tail + i as u64).write(*o) };
        }
        // Count and publish before the outputs (as the CUDA kernel does): whoever sees an
        // output also sees it counted.
        processed += batch.len() as u64;
        batches += 1;
        busy_ns += t0.elapsed().as_nanos() as u64;
        publish_counters(processed, batches, busy_ns, undelivered);
        if k > 0 {
            out_tail += k;
            // Release: publishes the output slots' bytes (and the counters) to the host's
            // Acquire load of tail.
            out_ring.header().tail.store(out_tail, Ordering::Release);
        }
    };
    publish_counters(processed, batches, busy_ns, undelivered);
    // Release: the counters above are visible to whoever sees the exit state.
    ctl.device_state.store(exit_state as u32, Ordering::Release);
    EmulatorExit {
        state: exit_state,
        handler,
    }
}
