//! The CPU ring host: the kernel's handler runs on its own host thread.
//!
//! Handler form: take a batch (highest lane first, FIFO within a lane), handle each message,
//! publish each result as soon as its handler returns. Every message is claimed in
//! [`InHand`](resident_ring::handoff::InHand) before its handler runs, so a `terminate` that gives
//! up on a handler that never returns takes exactly the messages this thread had not finished.
//! Loop form: the user's loop receives and sends itself through [`LoopContext`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use resident_ring::{Envelope, Message, Slot};

use crate::runtime::context::{Context, LoopContext, OutsideLoop};
use crate::runtime::host::{panic_text, RingHost};
use crate::runtime::io::KernelIo;
use crate::runtime::kernel::{Body, HandlerFn, LoopFn};
use crate::runtime::publisher::Publisher;
use crate::state::Failure;

/// Hosts a kernel whose handler is a Rust closure (or loop) on a host thread.
pub(crate) struct CpuHost<In, Out, S> {
    ctx: Context<S>,
    body: Body<In, Out, S>,
}

impl<In, Out, S> CpuHost<In, Out, S> {
    pub fn new(ctx: Context<S>, body: Body<In, Out, S>) -> Self {
        CpuHost { ctx, body }
    }
}

impl<In: Message, Out: Message, S: Send + 'static> RingHost<In, Out> for CpuHost<In, Out, S> {
    fn run(self: Box<Self>, io: &Arc<KernelIo<In, Out>>, out: Publisher<In, Out>) {
        let CpuHost { ctx, body } = *self;
        match body {
            Body::Handler(h) => run_handler(io, out, ctx, h),
            Body::Loop(f) => run_loop(io, out, ctx, f),
            Body::Outside(f) => f(OutsideLoop::new(LoopContext::new(ctx, out), io.clone())),
        }
    }

    fn threadless(&self) -> bool {
        matches!(self.body, Body::Outside(_))
    }
}

fn run_handler<In: Message, Out: Message, S>(
    io: &Arc<KernelIo<In, Out>>,
    mut out: Publisher<In, Out>,
    mut ctx: Context<S>,
    mut handler: HandlerFn<In, Out, S>,
) {
    let mut batch: Vec<Slot<In>> = Vec::with_capacity(io.batch_size);
    let prof = io.profile.get();
    // The batch's clock reading, if the deadline check made one (`KernelIo::take_inputs`).
    let mut taken_at: Option<u64> = None;
    loop {
        let Some((n, gate)) = io.take_host_batch(&mut batch, &mut taken_at) else {
            return;
        };
        let scope = crate::profile::batch_start(prof, &io.id, n);
        // One clock read per batch: the deadline check's, if it made one (a `call` carries its
        // timeout), else this one.
        let batch_now = taken_at.unwrap_or_else(|| io.ids.now_ns());
        // Bound buffers are the batch's for its whole length (a host read waits for its end).
        ctx.bound.begin();
        // The result of the previous message, published once the next claim (or the end of
        // the batch) confirms terminate has not taken it into its report.
        let mut done: Option<(Envelope, Option<Out>)> = None;
        for i in 0..n {
            if io.in_hand.start(i).is_err() {
                return; // abandoned: the report holds message i-1 onwards
            }
            if let Some((env, result)) = done.take() {
                io.metrics.messages_done(1);
                out.publish_one(env, result, batch_now);
            }
            let slot = batch[i];
            ctx.current = slot.env;
            match catch_unwind(AssertUnwindSafe(|| handler(&mut ctx, slot.payload))) {
                Ok(result) => done = Some((slot.env, result)),
                Err(panic) => {
                    out.flush_wakeups();
                    ctx.bound.end();
                    // Claim the rest of the batch back from the handoff (fails only if
                    // terminate abandoned us meanwhile and took it).
                    if io.in_hand.finish(i + 1).is_ok() {
                        io.metrics.batch_done(Instant::now());
                        io.fail(
                            Failure::HandlerPanicked {
                                message_id: slot.env.message_id,
                                panic: panic_text(&panic),
                            },
                            Some(slot),
                            batch[i + 1..n].to_vec(),
                        );
                    }
                    return;
                }
            }
        }
        ctx.bound.end();
        if io.in_hand.finish(n).is_err() {
            return;
        }
        // The batch goes into the profile before its last output is published: a receiver
        // that holds every output then finds every batch in the profiler's report.
        crate::profile::batch_end(prof, scope, &batch[..n]);
        if let Some((env, result)) = done.take() {
            io.metrics.messages_done(1);
            out.publish_one(env, result, batch_now);
        }
        out.flush_wakeups();
        io.metrics.batch_done(Instant::now());
        drop(gate);
    }
}

fn run_loop<In: Message, Out: Message, S>(
    io: &Arc<KernelIo<In, Out>>,
    out: Publisher<In, Out>,
    ctx: Context<S>,
    f: LoopFn<In, Out, S>,
) {
    let mut lctx = LoopContext::new(ctx, out);
    let r = catch_unwind(AssertUnwindSafe(|| {
        // Nothing is handed to the loop before activation.
        io.wait_for_control();
        f(&mut lctx)
    }));
    drop(lctx.into_parts());
    match r {
        Err(p) => io.fail(
            Failure::LoopPanicked {
                panic: panic_text(&p),
            },
            None,
            Vec::new(),
        ),
        Ok(()) if !io.terminating() => io.fail(Failure::LoopReturned, None, Vec::new()),
        Ok(()) => {}
    }
}

/// A CPU host whose handler was given before `.state(..)`: it runs with a unit context and the
/// state stays with the kernel (dropped on its host thread when it ends).
pub(crate) struct KeepState<H, S> {
    host: H,
    state: S,
}

impl<H, S> KeepState<H, S> {
    pub fn new(host: H, state: S) -> Self {
        KeepState { host, state }
    }
}

impl<In: Message, Out: Message, S: Send + 'static> RingHost<In, Out>
    for KeepState<CpuHost<In, Out, ()>, S>
{
    fn run(self: Box<Self>, io: &Arc<KernelIo<In, Out>>, out: Publisher<In, Out>) {
        let KeepState { host, state } = *self;
        Box::new(host).run(io, out);
        drop(state);
    }

    fn threadless(&self) -> bool {
        self.host.threadless()
    }
}
