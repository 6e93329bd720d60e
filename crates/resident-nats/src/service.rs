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
}

impl<In: Message, Out: Message> Service for KernelHandle<In, Out> {
    type In = In;
    type Out = Out;
    fn call(&self, msg: In, timeout: Duration) -> resident::Result<Out> {
        KernelHandle::call(self, msg, timeout)
    }
}

impl<S: Service> Service for Arc<S> {
    type In = S::In;
    type Out = S::Out;
    fn call(&self, msg: S::In, timeout: Duration) -> resident::Result<S::Out> {
        (**self).call(msg, timeout)
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
            reason: resident::Failure::CallerTask(std::sync::Arc::new(CallPanicked(
                panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into()),
            ))),
        }),
    }
}

/// A `call` made in place on a serving thread panicked (the runtime catches handler panics,
/// so this is a bug in a `Service` implementation); the panic's text.
#[derive(Debug, thiserror::Error)]
#[error("the call panicked: {0}")]
struct CallPanicked(String);

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
