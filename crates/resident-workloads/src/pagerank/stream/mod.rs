//! Streaming PageRank on every backend: one kernel definition ([`stream_kernel`]) whose ranks,
//! residual and (on a device) graph stay in bound buffers for the kernel's life, driven by
//! [`StreamPageRank`] on the host.
//!
//! # The protocol
//!
//! The kernel's messages ([`StreamMsg`], operations in [`op`]) are small and the work they ask
//! for is proportional to what changed, so the same definition runs on a CPU thread and on a
//! device whose parallelism is one thread per message of a batch:
//!
//! | op | what the kernel does | answer |
//! |---|---|---|
//! | `ADD` / `REMOVE` | changes the edge `a -> b` and the residual (`d (M' - M) x`), queues nodes whose residual passes `eps` | none |
//! | `SYNC` | waits until every change sent before it is applied | pending queue length, totals applied / refused |
//! | `PUSH` | pushes the queued nodes `a..b` of round `round` (Gauss-Southwell push: `x[u] += r[u]`, `d r[u] / out(u)` to each out-neighbour), queueing for round `round + 1` | pushes, edges, nodes queued |
//! | `TAKE` | takes the uniform part of the residual (mass of dangling nodes) when it is over `eps` | the value, taken or not, and the number of dangling nodes |
//! | `UNIFORM` | pushes a value from every node of `a..b`, the dangling nodes' share absorbed (the host passes `c / (1 - d D / N)`: every later round of uniform pushes at once) | nodes queued |
//! | `RESET`, `FILL`, `SCATTER`, `GATHER`, `RESIDUAL` | recompute from scratch: networkx's power iteration in two phases per iteration over node ranges, then the exact residual | L1 change, dangling mass |
//!
//! The host ([`StreamPageRank`]) sends a phase's messages, waits for all their answers, and
//! only then sends the next phase: messages of one phase may run in parallel (a device's
//! threads), messages of different phases never overlap. Edge changes of one source carry a
//! `ticket` (how many changes of that source were sent before) and a device applies them in
//! ticket order even when one batch holds several; changes of different sources apply in
//! parallel and meet only in atomics (the residual, the queue, the uniform part).
//!
//! # Each backend
//!
//! - **CPU**: the graph is the handler's state ([`StreamState`]: out- and in-lists); `PUSH`
//!   drains the whole queue in one message (sequential Gauss-Southwell with a FIFO queue and
//!   the uniform part pushed through the in-lists), so a refresh is one message; the recompute
//!   phases run over one range with rayon.
//! - **CUDA and CudaSim** ([`pagerank_stream_handler`](crate::pagerank::pagerank_stream_handler)):
//!   the graph is bound as per-node out-lists in a pool with room to grow (`out_off`,
//!   `out_len`, `out_cap`, `pool`); an add to a full list moves the list to twice the room at
//!   the pool's end. Rounds run their ranges on parallel threads with atomic adds (`f64`
//!   `atomicAdd`, sm_60 and later).
//! - **wgpu** ([`PAGERANK_STREAM_WGSL`](crate::pagerank::PAGERANK_STREAM_WGSL)):
//!   the same layout and rounds in f32. WGSL has no floating-point atomics and no fence
//!   between invocations, so `residual` and `acc` are f32 bits in atomic `u32` buffers
//!   ([`WgslHandler::atomic`]) updated by compare-exchange loops, and a node's "queued" flag is
//!   the lowest bit of its residual (one location, so no ordering between two is needed).
//!   WGSL cannot make an invocation wait for another, so there are no tickets: the host sends
//!   the changes in waves in which no source repeats, with a sync between waves.
//!
//! Adds that find the pool full are refused, counted, and reported by the next sync as
//! [`WorkloadError::Refused`]: nothing accepted is dropped silently. The pool starts with
//! room for every node's list to grow by half (at least 4) plus as many entries again, or the
//! spare given to [`StreamPageRank::launch_with_spare`].

use std::collections::VecDeque;
use std::time::Duration;

use rayon::prelude::*;
use resident::backend::{BackendKind, DeviceHandle};
use resident::memory::BufferOptions;
use resident::prelude::*;
use resident::UnifiedBuffer;

use super::{pagerank_stream_handler, PAGERANK_STREAM_WGSL};
use super::{unique, DynGraph, Params, LONG};
use crate::error::{InputError, WorkloadError};
use crate::input::EdgeList;

mod check;
mod state;

pub use check::*;
pub use state::StreamState;

resident::ring::device_message! {
    /// An edge change of a stream of updates: `op` is [`OP_ADD`] or [`OP_REMOVE`].
    pub struct EdgeUpdate {
        /// Source node.
        pub src: u32,
        /// Target node.
        pub dst: u32,
        /// `OP_ADD` or `OP_REMOVE`.
        pub op: u32,
        /// Padding (zero).
        pub _pad: u32,
    }
}

/// Add the edge `src -> dst`.
pub const OP_ADD: u32 = op::ADD;
/// Remove the edge `src -> dst`.
pub const OP_REMOVE: u32 = op::REMOVE;

/// The streaming kernel's operations ([`StreamMsg::op`]); see the module docs.
pub mod op {
    /// Add the edge `a -> b`.
    pub const ADD: u32 = 0;
    /// Remove the edge `a -> b`.
    pub const REMOVE: u32 = 1;
    /// Wait for the changes sent before (`ticket` = how many), answer the pending count.
    pub const SYNC: u32 = 2;
    /// Push the queued nodes `a..b` of round `round`.
    pub const PUSH: u32 = 3;
    /// Take the uniform residual when it is over `eps`.
    pub const TAKE: u32 = 4;
    /// Push `value` from every node of `a..b`; what dangling nodes would send back to the
    /// uniform residual is absorbed (the host scales `value` for it).
    pub const UNIFORM: u32 = 5;
    /// Empty the queues and the uniform residual.
    pub const RESET: u32 = 6;
    /// `x[v] = value` for `v` in `a..b`.
    pub const FILL: u32 = 7;
    /// `acc[w] += x[u] / out(u)` along the out-edges of `u` in `a..b`.
    pub const SCATTER: u32 = 8;
    /// `x[v] = value + d acc[v]`, `acc[v] = 0` for `v` in `a..b`.
    pub const GATHER: u32 = 9;
    /// `r[v] = value + d acc[v] - x[v]`, `acc[v] = 0`, queued for round `round` when over `eps`.
    pub const RESIDUAL: u32 = 10;
    /// This and every op above it: an edge change the kernel refuses (counted as rejected,
    /// never answered), so a bad op in a stream of changes loses nothing and blocks nothing.
    pub const UNKNOWN: u32 = 11;
}

resident::ring::device_message! {
    /// A message of the streaming kernel: `op` (see [`op`]) on `a..b` (an edge `a -> b` for a
    /// change), with `value`, for queue round `round`; `ticket` orders changes of one source
    /// and tells `SYNC` how many changes to wait for.
    pub struct StreamMsg {
        /// Operand of the operation.
        pub value: f64,
        /// Range start, or the edge's source.
        pub a: u32,
        /// Range end, or the edge's target.
        pub b: u32,
        /// The operation (see `op`).
        pub op: u32,
        /// Queue round.
        pub round: u32,
        /// Order among one source's changes; for `SYNC`, changes to wait for.
        pub ticket: u32,
        /// Padding (zero).
        pub _pad: u32,
    }
}

resident::ring::device_message! {
    /// The answer to every operation but `ADD` and `REMOVE`: `sum` (L1 change of a gather,
    /// residual L1 of a `RESIDUAL` range or of a CPU refresh, the uniform residual for `TAKE`
    /// and `SYNC`), `dangling` (rank of the range's dangling nodes; for `TAKE` how many
    /// dangling nodes the graph has), `work` (edges and nodes
    /// visited), `count` (nodes queued; for `SYNC` the pending queue; for `TAKE` 1 when
    /// taken), `pushes`, the totals since launch (mod 2^32) of changes `applied`, `rejected`
    /// (duplicates, absent edges, and the next two), `full` (adds refused for lack of pool
    /// room) and `stalled` (changes whose earlier change of the same source never came), and
    /// `ok` (0: the range or the buffers were invalid, or a sync gave up waiting).
    pub struct StreamAnswer {
        /// L1 change, residual L1 or uniform residual (see above).
        pub sum: f64,
        /// Rank of the range's dangling nodes (for `TAKE`: dangling nodes).
        pub dangling: f64,
        /// Edges and nodes visited.
        pub work: u64,
        /// Nodes queued (see above).
        pub count: u64,
        /// Node pushes.
        pub pushes: u64,
        /// Changes applied since launch (mod 2^32).
        pub applied: u32,
        /// Changes rejected since launch (mod 2^32).
        pub rejected: u32,
        /// Adds refused for lack of pool room since launch.
        pub full: u32,
        /// The operation answered.
        pub op: u32,
        /// 0 when the range or the buffers were invalid, or a sync gave up.
        pub ok: u32,
        /// Changes whose earlier change of the same source never came.
        pub stalled: u32,
    }
}

resident::ring::device_message! {
    /// A device's state (CUDA, CudaSim): the parameters, the uniform residual, the pool's top,
    /// the change counters (mod 2^32) and the three queue counters (round `k`'s is `len[k % 3]`).
    #[derive(Default)]
    pub struct StreamCounters {
        /// Damping factor.
        pub damping: f64,
        /// Push threshold.
        pub eps: f64,
        /// Uniform residual (the dangling mass not yet pushed).
        pub uniform: f64,
        /// First free slot of the edge pool.
        pub pool_top: u32,
        /// Changes received (mod 2^32).
        pub updates: u32,
        /// Changes applied (mod 2^32).
        pub applied: u32,
        /// Changes rejected (mod 2^32).
        pub rejected: u32,
        /// Adds refused for lack of pool room.
        pub full: u32,
        /// Changes whose earlier change never came.
        pub stalled: u32,
        /// Queue lengths of the three rounds (round `k`'s is `len[k % 3]`).
        pub len: [u32; 3],
        /// Nodes without out-edges (set by `FILL`, kept by edge changes).
        pub dangling: u32,
    }
}

resident::ring::device_message! {
    /// The wgpu handler's state: the parameters in f32, the uniform residual as f32 bits, and
    /// the counters of [`StreamCounters`] (every `u32` atomic in WGSL).
    #[derive(Default)]
    pub struct WgslStreamCounters {
        /// Damping factor (f32).
        pub damping: f32,
        /// Push threshold (f32).
        pub eps: f32,
        /// Uniform residual as f32 bits.
        pub uniform_bits: u32,
        /// First free slot of the edge pool.
        pub pool_top: u32,
        /// Changes received.
        pub updates: u32,
        /// Changes applied.
        pub applied: u32,
        /// Changes rejected.
        pub rejected: u32,
        /// Adds refused for lack of pool room.
        pub full: u32,
        /// Changes whose earlier change never came.
        pub stalled: u32,
        /// Queue lengths of the three rounds.
        pub len: [u32; 3],
        /// Nodes without out-edges.
        pub dangling: u32,
    }
}

impl StreamMsg {
    fn new(op: u32, a: u32, b: u32, value: f64, round: u32, ticket: u32) -> Self {
        StreamMsg {
            value,
            a,
            b,
            op,
            round,
            ticket,
            _pad: 0,
        }
    }
}

/// Pool room per node's out-list at launch: half again its degree, at least 4.
fn room(deg: usize) -> usize {
    (deg + deg / 2).max(4)
}

/// The device layout of a graph: out-lists in a pool with room to grow.
struct DeviceGraph {
    out_off: Vec<u32>,
    out_len: Vec<u32>,
    out_cap: Vec<u32>,
    pool: Vec<u32>,
    top: u32,
}

impl DeviceGraph {
    fn new(g: &DynGraph, spare: Option<usize>) -> Result<Self, WorkloadError> {
        let n = g.nodes();
        let used: usize = g.out.iter().map(|l| room(l.len())).sum();
        // As much again for lists that outgrow their room (each move doubles it).
        let total = used.saturating_add(spare.unwrap_or(used)).max(1024);
        if total > u32::MAX as usize {
            return Err(InputError::BadParameter {
                name: "edges",
                value: total.to_string(),
                reason: "a device's edge pool holds at most 2^32 entries",
            }
            .into());
        }
        let mut d = DeviceGraph {
            out_off: Vec::with_capacity(n),
            out_len: Vec::with_capacity(n),
            out_cap: Vec::with_capacity(n),
            pool: vec![0; total],
            top: 0,
        };
        let mut at = 0usize;
        for l in &g.out {
            d.out_off.push(at as u32);
            d.out_len.push(l.len() as u32);
            d.out_cap.push(room(l.len()) as u32);
            d.pool[at..at + l.len()].copy_from_slice(l);
            at += room(l.len());
        }
        d.top = at as u32;
        Ok(d)
    }
}

/// Streaming mode: one ring kernel whose ranks (`ranks`), residual (`residual`) and
/// accumulator (`acc`) are bound buffers, and whose graph is its state on the CPU and bound
/// buffers on a device (see the module docs). Drive it with [`StreamPageRank`].
pub fn stream_kernel(
    id: &str,
    device: &DeviceHandle,
    g: &EdgeList,
    p: Params,
) -> Result<RingKernel<StreamMsg, StreamAnswer, StreamState>, WorkloadError> {
    stream_kernel_with_spare(id, device, g, p, None)
}

/// [`stream_kernel`] with `spare` pool entries (beyond each node's starting room) for lists
/// that outgrow their room on a device; `None`: as many as the starting room. An add that
/// finds the pool full is refused and reported ([`WorkloadError::Refused`]); size the spare
/// for the additions you expect (each move of a list to more room takes twice its room).
pub fn stream_kernel_with_spare(
    id: &str,
    device: &DeviceHandle,
    g: &EdgeList,
    p: Params,
    spare: Option<usize>,
) -> Result<RingKernel<StreamMsg, StreamAnswer, StreamState>, WorkloadError> {
    let n = g.nodes();
    if n > u32::MAX as usize / 2 {
        return Err(InputError::BadParameter {
            name: "nodes",
            value: n.to_string(),
            reason: "streaming PageRank indexes nodes with 32 bits",
        }
        .into());
    }
    let o = BufferOptions::default();
    let graph = DynGraph::new(g);
    let k = RingKernel::<StreamMsg, StreamAnswer>::new(id)
        .queue_size(4096)
        .batch_size(crate::batch_size(device.kind(), 1024))
        .backpressure(Backpressure::Block(Duration::from_secs(60)));
    let f64s = |len: usize| UnifiedBuffer::<f64>::new(device, len, o);
    let u32s = |v: &[u32]| UnifiedBuffer::from_slice(device, v, o);
    let zeros32 = |len: usize| UnifiedBuffer::<u32>::new(device, len, o);
    let k = match device.kind() {
        BackendKind::Cpu => k
            .bind("ranks", f64s(n)?)
            .bind("residual", f64s(n)?)
            .bind("acc", f64s(n)?),
        BackendKind::Wgpu => {
            let dg = DeviceGraph::new(&graph, spare)?;
            k.bind("ranks", UnifiedBuffer::<f32>::new(device, n, o)?)
                .bind("residual", zeros32(n)?)
                .bind("acc", zeros32(n)?)
                .bind("out_off", u32s(&dg.out_off)?)
                .bind("out_len", u32s(&dg.out_len)?)
                .bind("out_cap", u32s(&dg.out_cap)?)
                .bind("pool", u32s(&dg.pool)?)
                .bind("frontier", zeros32(2 * n)?)
                .wgsl(
                    WgslHandler::new(PAGERANK_STREAM_WGSL)
                        .function("pagerank_stream")
                        .atomic("residual")
                        .atomic("acc")
                        .state(WgslStreamCounters {
                            damping: p.damping as f32,
                            eps: (p.damping * p.tol) as f32,
                            pool_top: dg.top,
                            ..WgslStreamCounters::default()
                        }),
                )
        }
        _ => {
            let dg = DeviceGraph::new(&graph, spare)?;
            k.bind("ranks", f64s(n)?)
                .bind("residual", f64s(n)?)
                .bind("acc", f64s(n)?)
                .bind("out_off", u32s(&dg.out_off)?)
                .bind("out_len", u32s(&dg.out_len)?)
                .bind("out_cap", u32s(&dg.out_cap)?)
                .bind("pool", u32s(&dg.pool)?)
                .bind("flags", zeros32(n)?)
                .bind("frontier", zeros32(2 * n)?)
                .bind("src_seq", zeros32(n)?)
                .cuda(pagerank_stream_handler(StreamCounters {
                    damping: p.damping,
                    eps: p.damping * p.tol,
                    pool_top: dg.top,
                    ..StreamCounters::default()
                }))
        }
    };
    let state = StreamState {
        graph,
        params: p,
        uniform: 0.0,
        queue: VecDeque::new(),
        queued: vec![false; n],
        applied: 0,
        rejected: 0,
    };
    Ok(k.state(state)
        .handler(|ctx: &mut Context<StreamState>, m: StreamMsg| {
            let (s, b) = ctx.state_and_buffers();
            let bufs = (
                b.buffer_mut::<f64>("ranks"),
                b.buffer_mut::<f64>("residual"),
                b.buffer_mut::<f64>("acc"),
            );
            let (Ok(mut x), Ok(mut r), Ok(mut acc)) = bufs else {
                s.rejected = s.rejected.wrapping_add(1);
                return None;
            };
            s.handle(&mut x, &mut r, &mut acc, &m)
        }))
}

/// What a refresh did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Refresh {
    /// Nodes pushed.
    pub pushes: u64,
    /// Edges and nodes visited.
    pub work: u64,
    /// Push rounds (1 on the CPU, whose one message drains the queue).
    pub rounds: u32,
    /// Times the uniform residual was pushed to every node.
    pub uniform_pushes: u32,
    /// Edge changes applied / refused (duplicates, absent edges) since the last sync.
    pub applied: u64,
    /// See `applied`.
    pub rejected: u64,
}

/// What a recompute did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Recompute {
    /// Power iterations.
    pub iterations: u32,
    /// Last L1 change.
    pub err: f64,
    /// Edges and nodes visited.
    pub work: u64,
    /// Edge changes applied / refused since the last sync.
    pub applied: u64,
    /// See `applied`.
    pub rejected: u64,
}

/// The host side of a streaming kernel: sends edge changes with their tickets, and runs
/// refreshes and recomputes as phases of range messages (see the module docs).
pub struct StreamPageRank {
    k: KernelHandle<StreamMsg, StreamAnswer>,
    n: usize,
    p: Params,
    chunk: usize,
    round: u32,
    sent: u32,
    seq: Vec<u32>,
    totals: (u32, u32, u32, u32),
    computed: bool,
    kind: BackendKind,
    /// Since the last recompute (whose residual is exact): edge changes applied, node pushes,
    /// edges and nodes visited by refreshes, uniform pushes (the rounding allowance of
    /// `verify` grows with them).
    since: [u64; 4],
}

/// Round numbers wrap here, a multiple of 6, so a round's queue half (`k & 1`) and counter
/// (`k % 3`) never jump at the wrap, and `k + 2` (the counter a round clears) never overflows.
const ROUND_WRAP: u32 = u32::MAX / 6 * 6;

/// Sends `msgs` and waits for an answer to each (every operation but a change answers once).
fn exchange(
    k: &KernelHandle<StreamMsg, StreamAnswer>,
    msgs: &[StreamMsg],
) -> Result<Vec<StreamAnswer>, WorkloadError> {
    let mut answers = Vec::with_capacity(msgs.len());
    super::round_trip(k, msgs, &mut answers)?;
    if let Some(a) = answers.iter().find(|a| a.ok == 0) {
        return Err(WorkloadError::OutOfRange {
            workload: "pagerank-stream",
            detail: format!("the kernel refused an operation: {a:?}"),
        });
    }
    Ok(answers)
}

impl StreamPageRank {
    /// Launches [`stream_kernel`] for `g` on `rt` (the device of `device`) and activates it.
    /// Ranks are computed by the first [`refresh`](Self::refresh) or
    /// [`recompute`](Self::recompute).
    pub fn launch(
        rt: &Runtime,
        device: &DeviceHandle,
        g: &EdgeList,
        p: Params,
        id: &str,
    ) -> Result<Self, WorkloadError> {
        Self::launch_with_spare(rt, device, g, p, id, None)
    }

    /// [`launch`](Self::launch) with `spare` pool entries on a device (see
    /// [`stream_kernel_with_spare`]).
    pub fn launch_with_spare(
        rt: &Runtime,
        device: &DeviceHandle,
        g: &EdgeList,
        p: Params,
        id: &str,
        spare: Option<usize>,
    ) -> Result<Self, WorkloadError> {
        let n = g.nodes();
        let k = rt.launch(stream_kernel_with_spare(id, device, g, p, spare)?)?;
        k.activate()?;
        Ok(StreamPageRank {
            k,
            n,
            p,
            chunk: super::default_chunk(device.kind(), n),
            round: 0,
            sent: 0,
            seq: vec![0; n],
            totals: (0, 0, 0, 0),
            computed: false,
            kind: device.kind(),
            since: [0; 4],
        })
    }

    /// The kernel.
    pub fn handle(&self) -> &KernelHandle<StreamMsg, StreamAnswer> {
        &self.k
    }

    fn ranges(&self, len: usize, op: u32, value: f64) -> Vec<StreamMsg> {
        (0..len)
            .step_by(self.chunk.max(1))
            .map(|lo| {
                let hi = (lo + self.chunk).min(len);
                StreamMsg::new(op, lo as u32, hi as u32, value, self.round, 0)
            })
            .collect()
    }

    /// Sends edge changes (blocking while the kernel's queue is full); they apply in order
    /// per source. On wgpu a source's changes go in separate waves (see the module docs).
    pub fn update(&mut self, ups: &[EdgeUpdate]) -> Result<(), WorkloadError> {
        let msgs: Vec<StreamMsg> = ups
            .iter()
            .map(|u| {
                let ticket = match self.seq.get_mut(u.src as usize) {
                    Some(s) => std::mem::replace(s, s.wrapping_add(1)),
                    None => 0, // refused by the kernel (out of range), counted there
                };
                self.sent = self.sent.wrapping_add(1);
                StreamMsg::new(u.op, u.src, u.dst, 0.0, self.round, ticket)
            })
            .collect();
        if self.kind != BackendKind::Wgpu {
            return self.send_wave(&msgs);
        }
        // Waves: a change goes in the wave after its source's previous change, so a source's
        // changes keep their order and changes of different sources (which commute: they
        // touch different lists and only add to the residual) share waves.
        let mut last = std::collections::HashMap::<u32, usize>::new();
        let mut waves: Vec<Vec<StreamMsg>> = Vec::new();
        for m in msgs {
            let w = last.get(&m.a).map_or(0, |&w| w + 1);
            last.insert(m.a, w);
            if waves.len() <= w {
                waves.push(Vec::new());
            }
            waves[w].push(m);
        }
        for (i, wave) in waves.iter().enumerate() {
            if i > 0 {
                // The previous wave is applied once a sync sent after it is answered.
                self.sync_call()?;
            }
            self.send_wave(wave)?;
        }
        Ok(())
    }

    fn send_wave(&self, msgs: &[StreamMsg]) -> Result<(), WorkloadError> {
        let mut sent = 0;
        while sent < msgs.len() {
            sent += self.k.send_batch(&msgs[sent..])?;
        }
        Ok(())
    }

    fn sync_call(&self) -> Result<StreamAnswer, WorkloadError> {
        Ok(self.k.call(
            StreamMsg::new(op::SYNC, 0, 0, 0.0, self.round, self.sent),
            LONG,
        )?)
    }

    /// Waits until every change sent is applied; returns the pending queue length and the
    /// changes applied / refused since the last sync. Adds refused for lack of pool room, or
    /// changes given up after a stall, are an error.
    fn sync(&mut self) -> Result<(u64, u64, u64), WorkloadError> {
        let mut a = self.sync_call()?;
        if self.kind == BackendKind::Wgpu {
            // WGSL's sync does not wait: the first may share a batch with the last changes;
            // the second runs in a later batch, after all of them.
            a = self.sync_call()?;
        }
        if a.ok == 0 {
            return Err(WorkloadError::Timeout {
                workload: "pagerank-stream",
                waited: Duration::from_secs(1),
            });
        }
        let (applied, rejected, full, stalled) = self.totals;
        self.totals = (a.applied, a.rejected, a.full, a.stalled);
        let full = a.full.wrapping_sub(full) as u64;
        if full > 0 {
            return Err(WorkloadError::Refused {
                workload: "pagerank-stream",
                count: full,
                reason: "edge additions: the device's edge pool is full (launch with more \
                         spare room: StreamPageRank::launch_with_spare)"
                    .into(),
            });
        }
        let stalled = a.stalled.wrapping_sub(stalled) as u64;
        if stalled > 0 {
            return Err(WorkloadError::Refused {
                workload: "pagerank-stream",
                count: stalled,
                reason: "edge changes: an earlier change of the same source never arrived".into(),
            });
        }
        Ok((
            a.count,
            a.applied.wrapping_sub(applied) as u64,
            a.rejected.wrapping_sub(rejected) as u64,
        ))
    }

    /// Refreshes the ranks incrementally after the changes sent so far (a recompute when
    /// there are no ranks yet).
    pub fn refresh(&mut self) -> Result<Refresh, WorkloadError> {
        if !self.computed {
            let c = self.recompute()?;
            return Ok(Refresh {
                work: c.work,
                applied: c.applied,
                rejected: c.rejected,
                ..Refresh::default()
            });
        }
        let (mut pending, applied, rejected) = self.sync()?;
        let mut out = Refresh {
            applied,
            rejected,
            ..Refresh::default()
        };
        loop {
            while pending > 0 {
                let msgs = self.ranges(pending as usize, op::PUSH, 0.0);
                let answers = exchange(&self.k, &msgs)?;
                pending = answers.iter().map(|a| a.count).sum();
                out.pushes += answers.iter().map(|a| a.pushes).sum::<u64>();
                out.work += answers.iter().map(|a| a.work).sum::<u64>();
                out.rounds += 1;
                self.round = (self.round + 1) % ROUND_WRAP;
            }
            let t = self
                .k
                .call(StreamMsg::new(op::TAKE, 0, 0, 0.0, 0, 0), LONG)?;
            if t.count == 0 {
                break;
            }
            out.uniform_pushes += 1;
            // Every later uniform push at once: dangling nodes send back d D / N of each.
            let c = t.sum / (1.0 - self.p.damping * t.dangling / self.n as f64);
            let answers = exchange(&self.k, &self.ranges(self.n, op::UNIFORM, c))?;
            pending = answers.iter().map(|a| a.count).sum();
            out.work += answers.iter().map(|a| a.work).sum::<u64>() + self.n as u64;
        }
        self.since[0] += out.applied;
        self.since[1] += out.pushes;
        self.since[2] += out.work;
        self.since[3] += out.uniform_pushes as u64;
        Ok(out)
    }

    /// Recomputes the ranks from scratch (networkx's power iteration from `1/N`) after the
    /// changes sent so far, then sets the residual exactly: the baseline a refresh is
    /// measured against, and how the ranks are first computed.
    pub fn recompute(&mut self) -> Result<Recompute, WorkloadError> {
        let (_, applied, rejected) = self.sync()?;
        let (n, p) = (self.n, self.p);
        let mut out = Recompute {
            applied,
            rejected,
            ..Recompute::default()
        };
        if n == 0 {
            self.computed = true;
            return Ok(out);
        }
        let nf = n as f64;
        self.k
            .call(StreamMsg::new(op::RESET, 0, 0, 0.0, 0, 0), LONG)?;
        self.round = 0;
        let sum = |a: &[StreamAnswer], f: fn(&StreamAnswer) -> f64| a.iter().map(f).sum::<f64>();
        let work = |a: &[StreamAnswer]| a.iter().map(|a| a.work).sum::<u64>();
        let fill = exchange(&self.k, &self.ranges(n, op::FILL, 1.0 / nf))?;
        let mut dangling = sum(&fill, |a| a.dangling);
        let mut converged = false;
        for it in 1..=p.max_iter {
            let s = exchange(&self.k, &self.ranges(n, op::SCATTER, 0.0))?;
            let base = p.damping * dangling / nf + (1.0 - p.damping) / nf;
            let g = exchange(&self.k, &self.ranges(n, op::GATHER, base))?;
            out.work += work(&s) + work(&g);
            out.err = sum(&g, |a| a.sum);
            dangling = sum(&g, |a| a.dangling);
            out.iterations = it;
            if out.err < nf * p.tol {
                converged = true;
                break;
            }
        }
        if !converged {
            return Err(WorkloadError::NotConverged {
                iterations: out.iterations,
                err: out.err,
                threshold: nf * p.tol,
            });
        }
        // The exact residual r = b + d M x - x of the ranks reached, and its queue.
        let s = exchange(&self.k, &self.ranges(n, op::SCATTER, 0.0))?;
        let base = p.damping * dangling / nf + (1.0 - p.damping) / nf;
        let r = exchange(&self.k, &self.ranges(n, op::RESIDUAL, base))?;
        out.work += work(&s) + work(&r);
        self.computed = true;
        self.since = [0; 4];
        Ok(out)
    }

    /// The kernel's residual: per node (`residual`, f32 bits with the queued flag in the
    /// lowest bit on wgpu) and the uniform part owed to every node (a sync's answer).
    fn residual(&self) -> Result<(Vec<f64>, f64), WorkloadError> {
        let uniform = self.sync_call()?.sum;
        let r = match self.kind {
            BackendKind::Wgpu => self
                .k
                .read_buffer::<u32>("residual", LONG)?
                .iter()
                .map(|&b| f32::from_bits(b & 0xffff_fffe) as f64)
                .collect(),
            _ => self.k.read_buffer::<f64>("residual", LONG)?.to_vec(),
        };
        Ok((r, uniform))
    }

    /// Checks the kernel against `expected`, the graph it should hold (the launch graph with
    /// every change sent so far applied, e.g. by [`apply_updates`]); call it after a
    /// [`refresh`](Self::refresh) or [`recompute`](Self::recompute).
    ///
    /// The kernel keeps, beside its ranks `x`, the residual `r = b + d M x - x` of the
    /// PageRank system (per node, plus a uniform part); every edge change, push and uniform
    /// push updates both so that this stays true for the graph it holds. The host recomputes
    /// the residual of the kernel's ranks on `expected` in f64 and compares: the L1 distance
    /// must be within rounding ([`StreamCheck::mismatch_bound`]). A change the kernel dropped,
    /// applied twice, or applied to the wrong edge moves the two apart by `d (M' - M) x`,
    /// at least `2 d x[u] / out(u) >= 2 d (1 - d) / (N out(u))` in L1 for a change of `u`'s
    /// list (every rank is at least `(1 - d) / N`), which the bound stays under (f64: by
    /// many orders of magnitude at any size here; f32 on wgpu: see the bound's terms). With
    /// the residual confirmed, `||x - x*||_1 <= ||r||_1 / (1 - d)` for the exact ranks `x*`
    /// of `expected` (`M` is column-stochastic, so `(I - d M)^-1` has L1 norm `1 / (1 - d)`):
    /// [`StreamCheck::error_bound`], a bound from the residual actually left, not from the
    /// worst case.
    pub fn verify(&self, expected: &DynGraph) -> Result<StreamCheck, WorkloadError> {
        let bad = |detail: String| WorkloadError::Mismatch {
            workload: "pagerank-stream",
            detail,
        };
        if expected.nodes() != self.n {
            return Err(bad(format!(
                "expected graph has {} nodes, the kernel {}",
                expected.nodes(),
                self.n
            )));
        }
        let x = self.ranks()?;
        let (r, uniform) = self.residual()?;
        let (p, n) = (self.p, self.n);
        let host = residual_of(expected, &x, p);
        let mismatch: f64 = host
            .par_iter()
            .zip(&r)
            .map(|(h, k)| (h - (k + uniform)).abs())
            .sum();
        let residual_l1: f64 = host.par_iter().map(|h| h.abs()).sum();
        let kernel_max = r
            .par_iter()
            .map(|v| v.abs())
            .reduce(|| 0.0, f64::max)
            .max(uniform.abs());
        // Rounding allowance, u the handler's unit roundoff (a bound on the sum of every
        // rounding error behind the two residuals; ranks sum to 1, so |x|_1 = 1):
        // - computing a residual from ranks (the host's, and the kernel's exact one after a
        //   recompute): (D + 3) u per node times the terms' sum, 2 (D + 3) u in L1 each, D the
        //   largest in- or out-degree;
        // - a node push rounds x[u] (<= x_max): (1 + d) u x_max through I - d M;
        // - a uniform push rounds every rank: (1 + d) u |x|_1 <= 2 u;
        // - residual additions (bumps) round r[w] + share; the mass they move is at most the
        //   threshold per edge visited (2 eps W) plus what edge changes start, a change of u's
        //   list moving d x[u] <= x_max to at most D + 1 nodes, each cascading at most
        //   1 / (1 - d) times that.
        // Four times that (wgpu also drops the residual's lowest mantissa bit, its queued
        // flag). A wrong change moves the residual by >= 2 d (1 - d) / (N out(u)).
        let unit = match crate::Precision::of(self.kind) {
            crate::Precision::F64 => f64::EPSILON / 2.0,
            crate::Precision::F32 => f32::EPSILON as f64 / 2.0,
        };
        let degree = expected
            .out
            .iter()
            .chain(&expected.inn)
            .map(|l| l.len())
            .max()
            .unwrap_or(0) as f64;
        let x_max = x.iter().fold(0.0f64, |a, &v| a.max(v.abs()));
        let eps = p.damping * p.tol;
        let [applied, pushes, work, uniform_pushes] = self.since.map(|c| c as f64);
        let mismatch_bound = 4.0
            * unit
            * (4.0 * (degree + 3.0)
                + 2.0 * uniform_pushes
                + 2.0 * pushes * x_max
                + applied * x_max * (degree + 1.0) * 2.0 / (1.0 - p.damping)
                + 2.0 * eps * work);
        let check = StreamCheck {
            mismatch,
            mismatch_bound,
            residual_l1,
            kernel_residual_max: kernel_max,
            error_bound: residual_l1 / (1.0 - p.damping),
        };
        if mismatch.is_nan() || mismatch > mismatch_bound {
            return Err(bad(format!(
                "the kernel's residual is not the residual of its ranks on the expected graph \
                 ({n} nodes): L1 distance {mismatch:e} > {mismatch_bound:e} (a change \
                 dropped, repeated or misapplied)"
            )));
        }
        Ok(check)
    }

    /// The ranks (a synchronized read of the bound buffer; f32 on wgpu, widened).
    pub fn ranks(&self) -> Result<Vec<f64>, WorkloadError> {
        if self.kind == BackendKind::Wgpu {
            let x = self.k.read_buffer::<f32>("ranks", LONG)?;
            return Ok(x.iter().map(|&v| v as f64).collect());
        }
        Ok(self.k.read_buffer::<f64>("ranks", LONG)?.to_vec())
    }

    /// Terminates the kernel.
    pub fn terminate(self) -> Result<(), WorkloadError> {
        self.k.terminate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refreshes that run through the round-number wrap keep every queue half and counter
    /// consistent (the ranks still match the reference).
    #[test]
    fn refresh_rounds_run_through_the_wrap() {
        let g = crate::input::generate_graph(800, 3, 4).unwrap();
        let p = Params {
            tol: 1e-9,
            ..Default::default()
        };
        let ups = generate_updates(&g, 3, 60, 8);
        for b in [Backend::CudaSim, Backend::Wgpu] {
            let (Ok(rt), Ok(d)) = (
                Runtime::builder().backend(b).build(),
                resident::backend::open(b),
            ) else {
                println!("SKIP: refresh_rounds_run_through_the_wrap: {b:?} unavailable");
                continue;
            };
            let mut s = StreamPageRank::launch(&rt, &d, &g, p, "wrap").unwrap();
            s.recompute().unwrap();
            // The residual's queue is round 0's; round ROUND_WRAP - 6 uses the same half
            // and counter, and the refreshes below take more than 6 rounds each.
            s.round = ROUND_WRAP - 6;
            for batch in &ups {
                s.update(batch).unwrap();
                let r = s.refresh().unwrap();
                assert!(r.rounds > 6, "{b:?}: {r:?}");
            }
            assert!(
                s.round < 1000,
                "{b:?}: the round number wrapped to {}",
                s.round
            );
            let want = super::super::reference(&apply_updates(&g, &ups), p).unwrap();
            let x = s.ranks().unwrap();
            let l1: f64 = x.iter().zip(&want.ranks).map(|(a, b)| (a - b).abs()).sum();
            let tol = stream_tolerance_with(g.nodes(), p, crate::Precision::of(d.kind()));
            assert!(l1 <= tol, "{b:?}: {l1:e} > {tol:e}");
            s.terminate().unwrap();
        }
    }
}
