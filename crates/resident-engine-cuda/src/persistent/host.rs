//! The host's half of the persistent-kernel protocol: one [`LaneWriter`] per input lane, the
//! [`Consumer`] of the output ring and the [`ControlBlock`], all over caller-provided
//! [`RingMemory`] (heap memory in tests, pinned device-mapped memory on a GPU).
//!
//! The device's halves of the rings (the lanes' consumers and the output's producer) are not
//! kept: the device plays them directly on the shared memory, see [`DeviceView`].

use core::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;
use resident_ring::spsc::{ring_bytes, Consumer, HeapMemory, Ring, RingMemory};
use resident_ring::{Envelope, Slot};

use super::bulk::{choose, BulkLanes, BulkStats, Path, BULK_LINE_BYTES};
use super::control::{ControlBlock, DeviceCounters, RunState, CONTROL_BLOCK_BYTES};
use super::lane::{lane_bytes, LaneWriter};
use super::{lane_for_priority, PersistentError, SharedMemory, MAX_LANES};

/// Queue geometry of one persistent kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// Input lanes, `1 ..= 8`.
    pub lanes: usize,
    /// Slots per input lane (power of two).
    pub lane_capacity: usize,
    /// Slots in the output ring (power of two, at least the batch size of the kernel).
    pub out_capacity: usize,
}

impl QueueConfig {
    /// Checks the ranges the device code relies on.
    pub fn validate(&self) -> Result<(), PersistentError> {
        if self.lanes == 0 || self.lanes > MAX_LANES {
            return Err(PersistentError::config(format!(
                "lanes = {} is not in 1..={MAX_LANES}",
                self.lanes
            )));
        }
        for (what, c) in [
            ("lane_capacity", self.lane_capacity),
            ("out_capacity", self.out_capacity),
        ] {
            if c == 0 || !c.is_power_of_two() || c > (1 << 30) {
                return Err(PersistentError::config(format!(
                    "{what} = {c} is not a power of two in 1..=2^30"
                )));
            }
        }
        Ok(())
    }
}

/// A message the lane had no room for, handed back.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("priority lane {lane} is full")]
pub struct Full<T> {
    /// The lane that was full.
    pub lane: usize,
    /// The message, unchanged.
    pub slot: Slot<T>,
}

/// The memory regions of one kernel's queues, for whoever plays the device side.
pub struct DeviceView<In, Out> {
    /// Input lane rings (header + slots), lane 0 first.
    pub lanes: Vec<SharedMemory>,
    /// The output ring.
    pub out: SharedMemory,
    /// The control block.
    pub control: SharedMemory,
    /// The geometry.
    pub config: QueueConfig,
    _t: PhantomData<fn(In) -> Out>,
}

impl<In, Out> Clone for DeviceView<In, Out> {
    fn clone(&self) -> Self {
        DeviceView {
            lanes: self.lanes.clone(),
            out: self.out.clone(),
            control: self.control.clone(),
            config: self.config,
            _t: PhantomData,
        }
    }
}

impl<In, Out> DeviceView<In, Out> {
    /// The control block.
    pub fn control(&self) -> &ControlBlock {
        control_ref(&self.control)
    }
}

fn control_ref(mem: &SharedMemory) -> &ControlBlock {
    // SAFETY: checked at construction that the memory is at least CONTROL_BLOCK_BYTES and
    // 128-aligned; ControlBlock is atomics and padding, valid for any bit pattern (the memory
    // was zeroed), and it lives as long as `mem`, which the returned borrow is tied to.
    unsafe { &*(mem.as_mut_ptr() as *const ControlBlock) }
}

/// The host side of one persistent kernel's queues.
pub struct PersistentQueues<In: Pod + Send, Out: Pod + Send> {
    lanes: Vec<LaneWriter<In>>,
    out: Consumer<Slot<Out>>,
    view: DeviceView<In, Out>,
    /// Messages accepted per lane, for telemetry.
    sent: [u64; MAX_LANES],
    /// The lanes' bulk paths (see [`super::bulk`]); `None`: LL lanes only.
    bulk: Option<BulkLanes<In>>,
}

impl<In: Pod + Send, Out: Pod + Send> PersistentQueues<In, Out> {
    /// Queues on the heap (for CudaSim and tests).
    ///
    /// ```
    /// use resident_engine_cuda::persistent::{PersistentQueues, QueueConfig};
    /// use resident_ring::Envelope;
    /// let cfg = QueueConfig { lanes: 2, lane_capacity: 4, out_capacity: 4 };
    /// let mut q = PersistentQueues::<u64, u64>::on_heap(cfg).unwrap();
    /// q.send(Envelope::new(1, 200, 0), 7).unwrap();
    /// assert_eq!(q.pending_input(), 1);
    /// assert!(q.try_receive().is_none());
    /// ```
    pub fn on_heap(config: QueueConfig) -> Result<Self, PersistentError> {
        Self::with_allocator(config, &mut |len| {
            Ok(Arc::new(HeapMemory::new(len)?) as Arc<dyn RingMemory>)
        })
    }

    /// The allocations [`with_allocator`](Self::with_allocator) asks for, in its order
    /// (control block, lanes 0.., output ring): what a launcher reserves up front.
    pub fn allocation_sizes(config: QueueConfig) -> Vec<usize> {
        let mut v = vec![CONTROL_BLOCK_BYTES];
        v.extend(std::iter::repeat_n(
            lane_bytes::<In>(config.lane_capacity),
            config.lanes,
        ));
        v.push(ring_bytes::<Slot<Out>>(config.out_capacity));
        v
    }

    /// The pinned allocations a kernel's bulk lanes take (staging rings, lane 0 first, then
    /// the heads line), beside [`allocation_sizes`](Self::allocation_sizes); their device rings
    /// and tails line are device memory ([`bulk_device_sizes`](Self::bulk_device_sizes)).
    pub fn bulk_allocation_sizes(config: QueueConfig) -> Vec<usize> {
        let mut v = vec![
            config
                .lane_capacity
                .saturating_mul(core::mem::size_of::<Slot<In>>());
            config.lanes
        ];
        v.push(BULK_LINE_BYTES);
        v
    }

    /// The device allocations of the bulk lanes: the device rings, lane 0 first, then the
    /// tails line.
    pub fn bulk_device_sizes(config: QueueConfig) -> Vec<usize> {
        let mut v = Self::bulk_allocation_sizes(config);
        v.pop();
        v.push(BULK_LINE_BYTES);
        v
    }

    /// Queues in pieces of `arena` (no driver call: the caller made sure it has room, see
    /// [`resident_cuda::arena`]); [`PersistentError::Memory`] when it has none.
    pub fn in_arena(
        config: QueueConfig,
        arena: &resident_cuda::arena::Arena,
    ) -> Result<Self, PersistentError> {
        Self::with_allocator(config, &mut |len| match arena.take(len) {
            Some(l) => Ok(Arc::new(l) as Arc<dyn RingMemory>),
            None => Err(PersistentError::Memory {
                what: "queues (the pinned arena has no room)",
                need: len,
                got: 0,
            }),
        })
    }

    /// Queues in memory from `alloc(bytes)`, which must return memory of at least `bytes`
    /// bytes, 128-aligned, that nobody else uses yet (it is zeroed here).
    pub fn with_allocator(
        config: QueueConfig,
        alloc: &mut dyn FnMut(usize) -> Result<Arc<dyn RingMemory>, PersistentError>,
    ) -> Result<Self, PersistentError> {
        config.validate()?;
        let mut get = |what: &'static str, need: usize| -> Result<SharedMemory, PersistentError> {
            let mem = alloc(need)?;
            let got = mem.len();
            if got < need || !(mem.as_mut_ptr() as usize).is_multiple_of(128) {
                return Err(PersistentError::Memory { what, need, got });
            }
            // SAFETY: the memory is ours alone until the device side is started (contract of
            // `alloc`), valid for `got` bytes; zero makes empty rings and a fresh control block.
            unsafe { core::ptr::write_bytes(mem.as_mut_ptr(), 0, got) };
            Ok(SharedMemory(mem))
        };
        let control = get("control block", CONTROL_BLOCK_BYTES)?;
        let mut lane_mems = Vec::with_capacity(config.lanes);
        let mut lanes = Vec::with_capacity(config.lanes);
        for _ in 0..config.lanes {
            let mem = get("input lane", lane_bytes::<In>(config.lane_capacity))?;
            // SAFETY: fresh memory (just zeroed, contract of `alloc`): this writer is the
            // host's only writer of the lane; the device plays the reader.
            lanes.push(unsafe { LaneWriter::new(mem.clone(), config.lane_capacity)? });
            lane_mems.push(mem);
        }
        let out_mem = get("output ring", ring_bytes::<Slot<Out>>(config.out_capacity))?;
        // SAFETY: fresh memory: this consumer is the host's only reader of the output ring;
        // the device plays the producer.
        let (_device_half, out) = unsafe {
            Ring::<Slot<Out>>::with_memory(config.out_capacity, Box::new(out_mem.clone()))?
        };
        Ok(PersistentQueues {
            lanes,
            out,
            view: DeviceView {
                lanes: lane_mems,
                out: out_mem,
                control,
                config,
                _t: PhantomData,
            },
            sent: [0; MAX_LANES],
            bulk: None,
        })
    }

    /// Gives the lanes their bulk paths (before the kernel starts).
    pub fn attach_bulk(&mut self, bulk: BulkLanes<In>) {
        self.bulk = Some(bulk);
    }

    /// The bulk paths' counters (`None`: LL lanes only).
    pub fn bulk_stats(&self) -> Option<Arc<BulkStats>> {
        self.bulk.as_ref().map(|b| b.stats())
    }

    /// The first copy engine error of a bulk submit, if one failed (then nothing more is
    /// accepted on the bulk paths; the messages stay with the caller).
    pub fn bulk_error(&self) -> Option<&str> {
        self.bulk.as_ref().and_then(|b| b.error())
    }

    /// Waits up to `timeout` until every bulk submit so far has landed on the device (`true`
    /// at once without bulk lanes): for benchmarks and tests that want a queued batch whole
    /// before the kernel looks.
    pub fn wait_bulk_copies(&mut self, timeout: std::time::Duration) -> bool {
        self.bulk.as_mut().is_none_or(|b| b.wait_copies(timeout))
    }

    /// Puts the leading run of `slots` (all of lane `lane`) on the path [`choose`] gives;
    /// returns how many were accepted (0 while the run waits for the LL path to drain).
    fn push_run(&mut self, lane: usize, slots: &[Slot<In>]) -> usize {
        let path = match &self.bulk {
            None => Some(Path::Ll),
            Some(b) => choose(
                &b.config(),
                self.lanes[lane].len(),
                b.pending(lane),
                slots.len(),
            ),
        };
        let n = match (path, &mut self.bulk) {
            (Some(Path::Bulk), Some(b)) => b.push(lane, slots),
            (Some(_), _) => self.lanes[lane].push_slice(slots),
            (None, _) => 0,
        };
        self.sent[lane] += n as u64;
        n
    }

    /// The geometry.
    pub fn config(&self) -> QueueConfig {
        self.view.config
    }

    /// The memory regions, for the device side.
    /// Crate-internal: one device side per queue set (the kernel launchers in this crate).
    pub(crate) fn device_view(&self) -> DeviceView<In, Out> {
        self.view.clone()
    }

    /// The control block.
    pub fn control(&self) -> &ControlBlock {
        self.view.control()
    }

    /// The lane `priority` maps to.
    pub fn lane_of(&self, priority: u8) -> usize {
        lane_for_priority(priority, self.lanes.len())
    }

    /// Enqueues one message on its priority's lane; hands it back when that lane is full.
    pub fn send(&mut self, env: Envelope, payload: In) -> Result<(), Full<In>> {
        let lane = self.lane_of(env.priority);
        let slot = Slot::new(env, payload);
        if self.push_run(lane, core::slice::from_ref(&slot)) == 1 {
            Ok(())
        } else {
            Err(Full { lane, slot })
        }
    }

    /// Enqueues the longest prefix of `slots` that fits, publishing each lane's tail once per
    /// run of consecutive same-lane messages (on the lane's LL or bulk path, see
    /// [`super::bulk`]). Returns how many were accepted; the rest were not touched (so order
    /// within a lane is kept when the caller retries them).
    pub fn send_batch(&mut self, slots: &[Slot<In>]) -> usize {
        let mut done = 0;
        while done < slots.len() {
            let lane = self.lane_of(slots[done].env.priority);
            let run = slots[done..]
                .iter()
                .take_while(|s| self.lane_of(s.env.priority) == lane)
                .count();
            let n = self.push_run(lane, &slots[done..done + run]);
            done += n;
            if n < run {
                break;
            }
        }
        done
    }

    /// Takes the oldest output, if any.
    pub fn try_receive(&mut self) -> Option<Slot<Out>> {
        self.out.pop()
    }

    /// Moves up to `max` outputs to `out`; returns how many.
    pub fn receive_into(&mut self, out: &mut Vec<Slot<Out>>, max: usize) -> usize {
        self.out.pop_into(out, max)
    }

    /// The output ring's memory and capacity, for device-side forwarding
    /// ([`super::peer::PeerRing`]).
    pub fn output_memory(&self) -> (SharedMemory, usize) {
        (self.view.out.clone(), self.view.config.out_capacity)
    }

    /// Takes the output ring's consumer index back after another consumer (a kernel it was
    /// forwarded to) popped it: the host's consumer restarts at the index as published.
    ///
    /// # Safety
    /// Nobody else may pop the output ring from now on (the other consumer acknowledged the
    /// unlink, or has exited for good).
    pub unsafe fn resync_output(&mut self) -> Result<(), PersistentError> {
        // SAFETY: this function's contract: the host is again the ring's only consumer; the
        // producer half of this view is dropped unused (the device is the producer).
        let (_device_half, out) = unsafe {
            Ring::<Slot<Out>>::with_memory(
                self.view.config.out_capacity,
                Box::new(self.view.out.clone()),
            )?
        };
        self.out = out;
        Ok(())
    }

    /// Messages sent but not yet taken by the device, over all lanes and both paths.
    pub fn pending_input(&self) -> usize {
        let bulk = self
            .bulk
            .as_ref()
            .map_or(0, |b| (0..self.lanes.len()).map(|l| b.pending(l)).sum());
        self.lanes.iter().map(|l| l.len()).sum::<usize>() + bulk
    }

    /// Messages accepted per lane since creation (lanes beyond `config.lanes` are 0).
    pub fn sent_per_lane(&self) -> [u64; MAX_LANES] {
        self.sent
    }

    /// Starts (or resumes) processing.
    pub fn activate(&self) {
        self.control().set_run_state(RunState::Active);
    }

    /// Pauses processing; messages queue up.
    pub fn deactivate(&self) {
        self.control().set_run_state(RunState::Inactive);
    }

    /// Asks the device to finish its batch and exit. Returns the messages still queued, which
    /// will not be processed (the device may still be finishing the batch it holds).
    pub fn terminate(&self) -> usize {
        self.control().set_run_state(RunState::Terminate);
        self.pending_input()
    }

    /// Takes back every input the device side did not consume, highest lane first, FIFO
    /// within a lane, so a terminate can return them instead of losing them.
    ///
    /// # Safety
    /// The device side must have stopped reading the lanes for good (it exited after
    /// terminate or a heartbeat timeout, or its thread or kernel is gone): the host then plays
    /// the consumer's part on memory nobody else reads.
    pub unsafe fn reclaim_input(&mut self) -> Vec<Slot<In>> {
        let mut out = Vec::new();
        for (l, lane) in self.lanes.iter_mut().enumerate().rev() {
            // SAFETY: this function's contract: the device side stopped reading the lane for
            // good, and `&mut self` keeps the host from pushing meanwhile.
            out.extend(unsafe { lane.reclaim() });
            // At most one of a lane's paths holds messages (super::bulk), so this keeps FIFO.
            if let Some(b) = &mut self.bulk {
                // SAFETY: as above.
                out.extend(unsafe { b.reclaim(l) });
            }
        }
        out
    }

    /// Bumps the heartbeat; returns the new value.
    pub fn heartbeat(&self) -> u64 {
        self.control().bump_heartbeat()
    }

    /// Sets the heartbeat timeout (`None` disables it).
    pub fn set_heartbeat_timeout(&self, timeout: Option<std::time::Duration>) {
        let ns = timeout.map_or(0, |d| d.as_nanos().clamp(1, u64::MAX as u128) as u64);
        self.control().set_heartbeat_timeout_ns(ns);
    }

    /// The device-written counters.
    pub fn device_counters(&self) -> DeviceCounters {
        self.control().device_counters()
    }
}
