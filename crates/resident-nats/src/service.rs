//! `Service`: what a worker serves — something with a blocking, correlated `call`. Every
//! `KernelHandle<In, Out>` is one; a chain of kernels connected kernel to kernel can be one too
//! (see `demo::Pipeline`).

use std::sync::Arc;
use std::time::Duration;

use resident::prelude::{KernelHandle, Message};

/// A ring kernel (or a chain of them) seen as request/response. `call` blocks the calling
/// thread; the serving layer never runs it where it would hold up the executor (in place under
/// `block_in_place`, or on tokio's blocking pool).
pub trait Service: Send + Sync + 'static {
    /// Input message.
    type In: Message;
    /// Output message.
    type Out: Message;
    /// Sends `msg` and waits up to `timeout` for its output.
    fn call(&self, msg: Self::In, timeout: Duration) -> resident::Result<Self::Out>;

    /// Calls every message of `msgs` and returns exactly one result per message, in the same
    /// order. The JetStream worker feeds a pull batch through this in one blocking section
    /// instead of one `call` (and one thread hand-off) per input.
    ///
    /// The default calls them one after another, each with its own `timeout` (so it may take
    /// up to `msgs.len()` times `timeout`). A kernel overrides it to send them all first and
    /// then collect the replies (see the `KernelHandle` implementation).
    fn call_batch(
        &self,
        msgs: Vec<Self::In>,
        timeout: Duration,
    ) -> Vec<resident::Result<Self::Out>> {
        msgs.into_iter().map(|m| self.call(m, timeout)).collect()
    }
}

impl<In: Message, Out: Message> Service for KernelHandle<In, Out> {
    type In = In;
    type Out = Out;
    fn call(&self, msg: In, timeout: Duration) -> resident::Result<Out> {
        KernelHandle::call(self, msg, timeout)
    }

    /// Sends every message as a call first (the kernel can take them as one batch), then
    /// collects the replies in order; every reply is waited for until `timeout` after the
    /// start, so the whole batch takes at most `timeout`. A message refused at send (queue
    /// full under `Reject`, dropped by policy) gets its own error; the others are unaffected.
    fn call_batch(&self, msgs: Vec<In>, timeout: Duration) -> Vec<resident::Result<Out>> {
        let deadline = std::time::Instant::now() + timeout;
        let pending: Vec<_> = msgs
            .into_iter()
            .map(|m| self.call_start(m, DEFAULT_PRIORITY))
            .collect();
        pending
            .into_iter()
            .map(|p| {
                let mut p = p?;
                // A zero wait only looks, so a batch past its deadline still takes the
                // replies that are already there.
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                p.wait(left).unwrap_or_else(|| {
                    Err(resident::Error::Timeout {
                        id: self.id().to_string(),
                        op: resident::Op::Call,
                        timeout,
                        message: None,
                    })
                })
            })
            .collect()
    }
}

/// `KernelHandle::send`'s priority (the runtime's default).
const DEFAULT_PRIORITY: u8 = 128;

impl<S: Service> Service for Arc<S> {
    type In = S::In;
    type Out = S::Out;
    fn call(&self, msg: S::In, timeout: Duration) -> resident::Result<S::Out> {
        (**self).call(msg, timeout)
    }
    fn call_batch(&self, msgs: Vec<S::In>, timeout: Duration) -> Vec<resident::Result<S::Out>> {
        (**self).call_batch(msgs, timeout)
    }
}

/// Runs a blocking `call` on tokio's blocking pool. A panic inside (there should be none: the
/// runtime catches handler panics) becomes a typed `KernelFailed`.
pub(crate) async fn call_blocking<S: Service>(
    service: Arc<S>,
    msg: S::In,
    timeout: Duration,
    kernel: &str,
) -> resident::Result<S::Out> {
    match tokio::task::spawn_blocking(move || service.call(msg, timeout)).await {
        Ok(r) => r,
        Err(e) => Err(resident::Error::KernelFailed {
            id: kernel.to_string(),
            reason: resident::Failure::CallerTask(std::sync::Arc::new(e)),
        }),
    }
}

/// Runs a blocking `call` on the current thread (inside `block_in_place`). A panic inside
/// becomes a typed `KernelFailed`, as in [`call_blocking`].
pub(crate) fn call_in_place<S: Service>(
    service: &S,
    msg: S::In,
    timeout: Duration,
    kernel: &str,
) -> resident::Result<S::Out> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| service.call(msg, timeout))) {
        Ok(r) => r,
        Err(panic) => Err(resident::Error::KernelFailed {
            id: kernel.to_string(),
            reason: resident::Failure::CallerTask(std::sync::Arc::new(CallPanicked(panic_text(
                &*panic,
            )))),
        }),
    }
}

/// The message of a panic caught around a call.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// A `call` made in place on a serving thread panicked (the runtime catches handler panics,
/// so this is a bug in a `Service` implementation); the panic's text.
#[derive(Debug, thiserror::Error)]
#[error("the call panicked: {0}")]
struct CallPanicked(String);

/// A `call_batch` that gave no usable results (it panicked, or returned the wrong number).
#[derive(Debug, thiserror::Error)]
enum BatchFailed {
    /// The batch call panicked; the panic's text.
    #[error("the call panicked: {0}")]
    Panicked(String),
    /// The blocking-pool task running it failed.
    #[error("the blocking call task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    /// `call_batch` broke its contract of one result per input.
    #[error("call_batch returned {got} results for {inputs} inputs")]
    Count {
        /// Results returned.
        got: usize,
        /// Inputs given.
        inputs: usize,
    },
}

/// Runs a blocking `call` without holding up the executor, with the fewest thread hand-offs:
/// in place under `block_in_place` on a multi-thread runtime (this worker's other tasks move
/// to another thread meanwhile, off the call's path), on the blocking pool on a
/// current-thread runtime (which cannot block in place). Handing every call to the blocking
/// pool costs a thread wake-up there and another one back; bench_nats measured that as most
/// of what the serving layer adds (its `no_kernel` responder).
pub(crate) async fn call_off_executor<S: Service>(
    service: &Arc<S>,
    msg: S::In,
    timeout: Duration,
    kernel: &str,
) -> resident::Result<S::Out> {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| call_in_place(&**service, msg, timeout, kernel))
        }
        _ => call_blocking(service.clone(), msg, timeout, kernel).await,
    }
}

/// `call_batch` off the executor, like [`call_off_executor`]: in place under `block_in_place`
/// on a multi-thread runtime, on the blocking pool otherwise; one hand-off for the whole batch
/// instead of one per input. Always returns one result per input, in order: a panic inside,
/// or a `Service` that returned the wrong number of results, fails every input of the batch
/// with a typed `KernelFailed` (nothing is matched to the wrong input).
pub(crate) async fn call_batch_off_executor<S: Service>(
    service: &Arc<S>,
    msgs: Vec<S::In>,
    timeout: Duration,
    kernel: &str,
) -> Vec<resident::Result<S::Out>> {
    let n = msgs.len();
    let run = {
        let service = service.clone();
        move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                service.call_batch(msgs, timeout)
            }))
            .map_err(|panic| BatchFailed::Panicked(panic_text(&*panic)))
        }
    };
    let outcome = match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(run),
        _ => tokio::task::spawn_blocking(run)
            .await
            .unwrap_or_else(|e| Err(BatchFailed::Task(e))),
    };
    let reason = Arc::new(match outcome {
        Ok(outs) if outs.len() == n => return outs,
        Ok(outs) => BatchFailed::Count {
            got: outs.len(),
            inputs: n,
        },
        Err(reason) => reason,
    });
    (0..n)
        .map(|_| {
            Err(resident::Error::KernelFailed {
                id: kernel.to_string(),
                reason: resident::Failure::CallerTask(reason.clone()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Doubles its input; its `call_batch` is the trait's default (one `call` after another).
    struct Double;
    impl Service for Double {
        type In = u64;
        type Out = u64;
        fn call(&self, msg: u64, _timeout: Duration) -> resident::Result<u64> {
            if msg == 7 {
                return Err(resident::Error::NoReply {
                    id: "double".into(),
                    message_id: 7,
                });
            }
            Ok(msg * 2)
        }
    }

    /// A broken `call_batch`: panics on a batch holding 0, else answers one input short.
    struct Broken;
    impl Service for Broken {
        type In = u64;
        type Out = u64;
        fn call(&self, msg: u64, _timeout: Duration) -> resident::Result<u64> {
            Ok(msg)
        }
        fn call_batch(&self, msgs: Vec<u64>, _t: Duration) -> Vec<resident::Result<u64>> {
            assert!(!msgs.contains(&0), "zero in the batch");
            msgs.into_iter().skip(1).map(Ok).collect()
        }
    }

    #[test]
    fn default_call_batch_is_one_call_per_input_in_order() {
        let outs = Double.call_batch(vec![1, 7, 3], Duration::from_secs(1));
        assert_eq!(outs.len(), 3);
        assert_eq!(*outs[0].as_ref().unwrap(), 2);
        assert!(matches!(outs[1], Err(resident::Error::NoReply { .. })));
        assert_eq!(*outs[2].as_ref().unwrap(), 6);
        // Through an Arc too.
        let outs = Arc::new(Double).call_batch(vec![4], Duration::from_secs(1));
        assert_eq!(*outs[0].as_ref().unwrap(), 8);
    }

    fn check_off_executor(rt: tokio::runtime::Runtime) {
        rt.block_on(async {
            let t = Duration::from_secs(1);
            let ok = call_batch_off_executor(&Arc::new(Double), vec![1, 2], t, "k").await;
            assert_eq!(
                ok.iter().map(|r| *r.as_ref().unwrap()).collect::<Vec<_>>(),
                [2, 4]
            );
            // A panic fails every input of the batch, typed, each naming the kernel.
            let panicked = call_batch_off_executor(&Arc::new(Broken), vec![3, 0], t, "k").await;
            assert_eq!(panicked.len(), 2);
            for r in &panicked {
                match r {
                    Err(resident::Error::KernelFailed { id, reason }) => {
                        assert_eq!(id, "k");
                        assert!(reason.to_string().contains("zero in the batch"), "{reason}");
                    }
                    other => panic!("{other:?}"),
                }
            }
            // The wrong number of results is never matched to inputs: all fail.
            let short = call_batch_off_executor(&Arc::new(Broken), vec![1, 2, 3], t, "k").await;
            assert_eq!(short.len(), 3);
            for r in &short {
                match r {
                    Err(resident::Error::KernelFailed { reason, .. }) => {
                        assert!(reason.to_string().contains("2 results for 3"), "{reason}");
                    }
                    other => panic!("{other:?}"),
                }
            }
        });
    }

    #[test]
    fn call_batch_off_executor_on_both_runtime_flavours() {
        check_off_executor(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .build()
                .unwrap(),
        );
        check_off_executor(
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap(),
        );
    }
}
