//! JetStream: a durable pull consumer feeds the kernel. An input is acknowledged only after its
//! output is stored in the output stream, published with the input's id as `Nats-Msg-Id`, so
//! the output of a redelivered input is dropped by the stream's duplicate window.
//!
//! Flow control: a worker pulls at most as many messages as it has free in-flight slots
//! (`max_in_flight`, the kernel's queue size), and the consumer's `max_ack_pending` is set to
//! the same figure, so a slow kernel slows the consumer instead of dropping anything.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::Message as JsMessage;
use async_nats::jetstream::stream::{Config as StreamConfig, StorageType};
use async_nats::jetstream::{AckKind, Context};
use async_nats::HeaderMap;
use futures_util::future::join_all;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::codec::Codec;
use crate::connect::{Connection, Fault};
use crate::error::{ErrorKind, ErrorReply, ServeError, ERROR_HEADER};
use crate::service::{call_batch_off_executor, Service};

/// Header naming the input's stream sequence on an output or dead letter.
pub const INPUT_SEQ_HEADER: &str = "Resident-Input-Seq";

/// Options of [`serve_jetstream`].
#[derive(Clone, Debug)]
pub struct JetStreamOptions {
    /// Input stream (created with `subject` if missing).
    pub stream: String,
    /// Input subject.
    pub subject: String,
    /// Outputs go here (default `<subject>.out`).
    pub output_subject: String,
    /// Undecodable inputs, and inputs that failed `max_deliver` times, go here with the
    /// `Resident-Error` header (default `<subject>.dead`).
    pub dead_letter_subject: String,
    /// Stream created for the output and dead-letter subjects when no stream holds the
    /// output subject (default `<stream>_OUT`).
    pub output_stream: String,
    /// Durable consumer name; every worker with the same name shares the work.
    pub durable: String,
    /// In-flight limit of this worker and the consumer's `max_ack_pending`.
    pub max_in_flight: usize,
    /// Unacknowledged inputs are redelivered after this long (e.g. when a worker died).
    pub ack_wait: Duration,
    /// Deliveries of one input before it is dead-lettered.
    pub max_deliver: i64,
    /// Duplicate window of the output stream created here.
    pub duplicate_window: Duration,
    /// How long one `call` may take (keep it well under `ack_wait`). Inputs that arrive
    /// together are called as one batch (`Service::call_batch`); for a kernel the whole batch
    /// is bounded by this, from the moment it is sent.
    pub call_timeout: Duration,
    /// Feed the kernel in stream order through one caller (for stateful kernels); otherwise up
    /// to `max_in_flight` inputs are in calls at once (several batches side by side) and order
    /// is not kept.
    pub ordered: bool,
    /// How long one pull request waits for messages.
    pub fetch_expires: Duration,
    /// How long shutdown waits for inputs in flight.
    pub drain_timeout: Duration,
}

impl JetStreamOptions {
    /// Options with the defaults above: `max_in_flight` 64, `ack_wait` 30 s, `max_deliver` 10,
    /// duplicate window 2 min, call timeout 5 s, ordered, 1 s pulls, 10 s drain.
    pub fn new(
        stream: impl Into<String>,
        subject: impl Into<String>,
        durable: impl Into<String>,
    ) -> Self {
        let (stream, subject) = (stream.into(), subject.into());
        JetStreamOptions {
            output_subject: format!("{subject}.out"),
            dead_letter_subject: format!("{subject}.dead"),
            output_stream: format!("{stream}_OUT"),
            stream,
            subject,
            durable: durable.into(),
            max_in_flight: 64,
            ack_wait: Duration::from_secs(30),
            max_deliver: 10,
            duplicate_window: Duration::from_secs(120),
            call_timeout: Duration::from_secs(5),
            ordered: true,
            fetch_expires: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// Counters of a JetStream worker.
#[derive(Debug, Default)]
pub struct JetStreamStats {
    /// Set once the streams and the durable consumer exist and the worker starts pulling.
    pub ready: std::sync::atomic::AtomicBool,
    /// Inputs pulled from the consumer (redeliveries included).
    pub received: AtomicU64,
    /// Of those, redeliveries (delivered before, to this or another worker, and not
    /// acknowledged in time: a worker died, a publish failed, the kernel was busy).
    pub redelivered: AtomicU64,
    /// Outputs stored and their inputs acknowledged.
    pub outputs: AtomicU64,
    /// Of those, outputs the stream reported as duplicates (a redelivered input whose output
    /// was already stored).
    pub duplicates: AtomicU64,
    /// Inputs dead-lettered and terminated.
    pub dead_letters: AtomicU64,
    /// Inputs handed back for redelivery (kernel busy or failed, publish failed).
    pub naks: AtomicU64,
    /// Pull requests that failed (server gone, reconnecting).
    pub pull_errors: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn js_err(op: impl Into<String>) -> impl FnOnce(async_nats::Error) -> ServeError {
    let op = op.into();
    move |source| ServeError::JetStream { op, source }
}

/// Creates the input stream (`stream` on `subject`, file storage) unless it exists, and an
/// output stream for the output and dead-letter subjects unless a stream already holds the
/// output subject. Idempotent; several workers may run it at once.
pub async fn ensure_streams(js: &Context, opts: &JetStreamOptions) -> Result<(), ServeError> {
    js.get_or_create_stream(StreamConfig {
        name: opts.stream.clone(),
        subjects: vec![opts.subject.clone()],
        storage: StorageType::File,
        duplicate_window: opts.duplicate_window,
        ..Default::default()
    })
    .await
    .map_err(|e| js_err(format!("create stream '{}'", opts.stream))(e.into()))?;
    if js
        .stream_by_subject(opts.output_subject.clone())
        .await
        .is_ok()
    {
        return Ok(());
    }
    let created = js
        .get_or_create_stream(StreamConfig {
            name: opts.output_stream.clone(),
            subjects: vec![
                opts.output_subject.clone(),
                opts.dead_letter_subject.clone(),
            ],
            storage: StorageType::File,
            duplicate_window: opts.duplicate_window,
            ..Default::default()
        })
        .await;
    match created {
        Ok(_) => Ok(()),
        // Another worker created it between our look-up and the create.
        Err(_)
            if js
                .stream_by_subject(opts.output_subject.clone())
                .await
                .is_ok() =>
        {
            Ok(())
        }
        Err(e) => Err(js_err(format!("create stream '{}'", opts.output_stream))(
            e.into(),
        )),
    }
}

/// Gets or creates the durable pull consumer `opts.durable` on `opts.stream` the way
/// [`serve_jetstream`] uses it: explicit acks, `ack_wait`, `max_deliver`, and
/// `max_ack_pending` = `max_in_flight`. Idempotent.
pub async fn ensure_consumer(
    js: &Context,
    opts: &JetStreamOptions,
) -> Result<PullConsumer, ServeError> {
    let stream = js
        .get_stream(opts.stream.clone())
        .await
        .map_err(|e| js_err(format!("get stream '{}'", opts.stream))(e.into()))?;
    stream
        .get_or_create_consumer(
            &opts.durable,
            PullConfig {
                durable_name: Some(opts.durable.clone()),
                deliver_policy: DeliverPolicy::All,
                ack_policy: AckPolicy::Explicit,
                ack_wait: opts.ack_wait,
                max_deliver: opts.max_deliver,
                filter_subject: opts.subject.clone(),
                max_ack_pending: opts.max_in_flight as i64,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| js_err(format!("create consumer '{}'", opts.durable))(e.into()))
}

/// One input on its way through the kernel.
struct Job<In> {
    msg: JsMessage,
    input: In,
    permit: OwnedSemaphorePermit,
}

struct Worker<S: Service, C> {
    js: Context,
    service: Arc<S>,
    codec: Arc<C>,
    opts: JetStreamOptions,
    stats: Arc<JetStreamStats>,
}

/// Serves `service` from the durable consumer `opts.durable` on `opts.stream` until `shutdown`
/// completes, then drains: stops pulling, waits up to `drain_timeout` for inputs in flight to
/// be published and acknowledged (anything left is redelivered after `ack_wait`), flushes.
///
/// Reconnects are the client's: while the server is away pulls fail and are retried (every
/// 250 ms, bounded by `shutdown`), and inputs whose output could not be stored are not
/// acknowledged, so the server delivers them again.
///
/// `connection` is an `async_nats::Client` or a [`Connection`] from
/// [`NatsOptions::connect`](crate::NatsOptions::connect); with the latter, a server that
/// refuses the worker (credentials on a reconnect, a publish to the output subject not
/// permitted) stops it like `shutdown` does, and it returns [`ServeError::Refused`]. Inputs
/// whose outputs were not stored are never acknowledged.
pub async fn serve_jetstream<S, C, F>(
    connection: impl Into<Connection>,
    service: Arc<S>,
    codec: Arc<C>,
    opts: JetStreamOptions,
    stats: Arc<JetStreamStats>,
    shutdown: F,
) -> Result<(), ServeError>
where
    S: Service,
    C: Codec<S::In, S::Out>,
    F: Future<Output = ()>,
{
    if opts.max_in_flight == 0 {
        return Err(ServeError::Options("max_in_flight must be at least 1"));
    }
    let connection = connection.into();
    let faults = connection.fault_watch();
    let client = connection.client;
    // A refused permission makes a JetStream API call time out; the fault is the real cause.
    let refused = |e: ServeError| match faults.current() {
        Some(f) => ServeError::Refused(f),
        None => e,
    };
    let js = async_nats::jetstream::new(client.clone());
    ensure_streams(&js, &opts).await.map_err(refused)?;
    let consumer = ensure_consumer(&js, &opts).await.map_err(refused)?;
    stats.ready.store(true, Ordering::Release);
    let max = opts.max_in_flight;
    let worker = Arc::new(Worker {
        js,
        service,
        codec,
        opts,
        stats,
    });
    let permits = Arc::new(Semaphore::new(max));
    // Inputs go to the kernel in groups: the messages of a pull that have already arrived
    // when one is taken (see `dispatch`). One group is one `call_batch` in one blocking
    // section, instead of a task and two thread hand-offs per input; bench_nats measured
    // those as most of what the served path cost over a plain relay.
    // The ordered path: one task calls the kernel group after group, in delivery order.
    let (tx, mut rx) = mpsc::channel::<Vec<Job<S::In>>>(max);
    let caller = {
        let worker = worker.clone();
        tokio::spawn(async move {
            while let Some(group) = rx.recv().await {
                worker.run_group(group).await;
            }
        })
    };
    // Stop on `shutdown` (None) or on a fault from the server (Some).
    let stop = {
        let mut faults = faults.clone();
        async move {
            tokio::select! {
                _ = shutdown => None,
                f = faults.wait() => Some(f),
            }
        }
    };
    tokio::pin!(stop);
    let mut fault: Option<Fault> = None;
    'pull: loop {
        // Wait for at least one free slot, then ask for as many messages as there are.
        let first = tokio::select! {
            f = &mut stop => { fault = f; break 'pull }
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break 'pull },
        };
        let want = permits.available_permits() + 1;
        drop(first);
        let batch = consumer
            .batch()
            .max_messages(want)
            .expires(worker.opts.fetch_expires)
            .messages()
            .await;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                bump(&worker.stats.pull_errors);
                tracing::debug!(error = %e, "pull failed; retrying");
                tokio::select! {
                    f = &mut stop => { fault = f; break 'pull }
                    _ = tokio::time::sleep(Duration::from_millis(250)) => continue 'pull,
                }
            }
        };
        // The batch ends after `want` messages or `fetch_expires`.
        loop {
            let next = tokio::select! {
                f = &mut stop => {
                    fault = f;
                    // Inputs of this pull that the server already sent us are handed back at
                    // once (not left to `ack_wait`), so another worker gets them promptly.
                    let until = tokio::time::Instant::now() + worker.opts.fetch_expires
                        + Duration::from_secs(1);
                    while let Ok(Some(m)) = tokio::time::timeout_at(until, batch.next()).await {
                        if let Ok(m) = m {
                            bump(&worker.stats.naks);
                            let _ = m.ack_with(AckKind::Nak(None)).await;
                        }
                    }
                    break 'pull;
                }
                n = batch.next() => n,
            };
            let msg = match next {
                None => break,
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    bump(&worker.stats.pull_errors);
                    tracing::debug!(error = %e, "pull batch error");
                    break;
                }
            };
            // This message and every other one of the pull already here (taken without
            // waiting) form one group; it is handed on before the next wait.
            let mut group: Vec<Job<S::In>> = Vec::new();
            let mut next = Some(msg);
            let mut batch_done = false;
            while let Some(msg) = next.take() {
                bump(&worker.stats.received);
                if msg.info().map(|i| i.delivered > 1).unwrap_or(false) {
                    bump(&worker.stats.redelivered);
                }
                // We asked for no more than the free slots, so a slot is free; should one
                // not be, the group in hand goes first (its slots must not wait on ours).
                let permit = match permits.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(TryAcquireError::Closed) => break 'pull,
                    Err(TryAcquireError::NoPermits) => {
                        if !worker.dispatch(std::mem::take(&mut group), &tx).await {
                            break 'pull;
                        }
                        let Ok(p) = permits.clone().acquire_owned().await else {
                            break 'pull;
                        };
                        p
                    }
                };
                match worker.codec.decode(&msg.payload) {
                    Err(e) => {
                        let w = worker.clone();
                        tokio::spawn(async move {
                            w.dead_letter(&msg, ErrorKind::BadInput, e.to_string())
                                .await;
                            drop(permit);
                        });
                    }
                    Ok(input) => group.push(Job { msg, input, permit }),
                }
                match batch.next().now_or_never() {
                    Some(Some(Ok(m))) => next = Some(m),
                    Some(Some(Err(e))) => {
                        bump(&worker.stats.pull_errors);
                        tracing::debug!(error = %e, "pull batch error");
                        batch_done = true;
                    }
                    Some(None) => batch_done = true,
                    None => {}
                }
            }
            if !worker.dispatch(group, &tx).await {
                break 'pull;
            }
            if batch_done {
                break;
            }
        }
    }
    // Drain: no more pulls; wait until every slot is back (every input in flight is settled).
    drop(tx);
    let drained =
        tokio::time::timeout(worker.opts.drain_timeout, permits.acquire_many(max as u32)).await;
    if drained.is_err() {
        tracing::warn!("drain timed out; unsettled inputs will be redelivered after ack_wait");
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), caller).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), client.flush()).await;
    if let Some(f) = fault.or_else(|| faults.current()) {
        tracing::error!(error = %f, "the server refused this worker; stopped");
        return Err(ServeError::Refused(f));
    }
    Ok(())
}

impl<S: Service, C: Codec<S::In, S::Out>> Worker<S, C> {
    /// The id that de-duplicates this input's output: the input's own `Nats-Msg-Id` if it had
    /// one, else `<stream>:<stream sequence>`.
    fn input_id(&self, msg: &JsMessage) -> (String, u64) {
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        let own = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.as_str().to_string())
            .filter(|s| !s.is_empty());
        (
            own.unwrap_or_else(|| format!("{}:{seq}", self.opts.stream)),
            seq,
        )
    }

    fn delivered(msg: &JsMessage) -> i64 {
        msg.info().map(|i| i.delivered).unwrap_or(1)
    }

    /// Hands a group on: to the ordered caller, or to a task of its own. Does not wait long
    /// (the channel holds `max_in_flight` groups, and every group holds at least one of the
    /// `max_in_flight` slots). False when the ordered caller is gone (shutting down).
    async fn dispatch(
        self: &Arc<Self>,
        group: Vec<Job<S::In>>,
        tx: &mpsc::Sender<Vec<Job<S::In>>>,
    ) -> bool {
        if group.is_empty() {
            return true;
        }
        if self.opts.ordered {
            return tx.send(group).await.is_ok();
        }
        let w = self.clone();
        tokio::spawn(async move { w.run_group(group).await });
        true
    }

    /// Calls the kernel on a group in one blocking section, sends the outputs in input order
    /// (one connection keeps order, so the output stream stores this worker's outputs in
    /// input order), then, in a task of its own, waits for the stream to store each one and
    /// only then acknowledges its input. An input whose call failed gets its nak or dead
    /// letter as before; each input's slot is freed once it is settled.
    async fn run_group(self: &Arc<Self>, group: Vec<Job<S::In>>) {
        let mut held = Vec::with_capacity(group.len());
        let mut inputs = Vec::with_capacity(group.len());
        for job in group {
            held.push((job.msg, job.permit));
            inputs.push(job.input);
        }
        let outs = call_batch_off_executor(
            &self.service,
            inputs,
            self.opts.call_timeout,
            &self.opts.durable,
        )
        .await;
        let mut settling = Vec::with_capacity(held.len());
        for ((msg, permit), out) in held.into_iter().zip(outs) {
            if let Some((msg, stored)) = self.publish_output(msg, out).await {
                settling.push((msg, stored, permit));
            }
        }
        if settling.is_empty() {
            return;
        }
        let w = self.clone();
        tokio::spawn(async move {
            join_all(settling.into_iter().map(|(msg, stored, permit)| {
                let w = &w;
                async move {
                    w.settle(msg, stored).await;
                    drop(permit);
                }
            }))
            .await;
        });
    }

    /// Sends the output (or settles the input at once on an error). Returns the input and the
    /// stream's pending acknowledgement of its output.
    async fn publish_output(
        &self,
        msg: JsMessage,
        out: resident::Result<S::Out>,
    ) -> Option<(JsMessage, PublishAckFuture)> {
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                let kind = ErrorKind::of(&e);
                if kind.is_transient() && Self::delivered(&msg) < self.opts.max_deliver {
                    bump(&self.stats.naks);
                    let _ = msg
                        .ack_with(AckKind::Nak(Some(Duration::from_millis(500))))
                        .await;
                } else {
                    self.dead_letter(&msg, kind, e.to_string()).await;
                }
                return None;
            }
        };
        let payload = match self.codec.encode(&out) {
            Ok(p) => p,
            Err(e) => {
                self.dead_letter(&msg, ErrorKind::Internal, e.to_string())
                    .await;
                return None;
            }
        };
        let (id, seq) = self.input_id(&msg);
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", id.as_str());
        headers.insert(INPUT_SEQ_HEADER, seq.to_string().as_str());
        match self
            .js
            .publish_with_headers(self.opts.output_subject.clone(), headers, payload.into())
            .await
        {
            Ok(stored) => Some((msg, stored)),
            Err(e) => {
                tracing::debug!(error = %e, "output not sent; input left for redelivery");
                bump(&self.stats.naks);
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_millis(500))))
                    .await;
                None
            }
        }
    }

    /// Waits for the stream to store the output, then acknowledges the input.
    async fn settle(&self, msg: JsMessage, stored: PublishAckFuture) {
        let stored = match tokio::time::timeout(Duration::from_secs(5), stored).await {
            Ok(Ok(ack)) => Ok(ack.duplicate),
            Ok(Err(e)) => Err(async_nats::Error::from(e)),
            Err(_) => Err("timed out waiting for the stream's acknowledgement".into()),
        };
        match stored {
            Ok(duplicate) => {
                if duplicate {
                    bump(&self.stats.duplicates);
                }
                // Only now is the input acknowledged. If this ack is lost the input comes
                // back, and its second output is dropped by the duplicate window.
                let _ = msg.ack().await;
                bump(&self.stats.outputs);
            }
            Err(e) => {
                tracing::debug!(error = %e, "output not stored; input left for redelivery");
                bump(&self.stats.naks);
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_millis(500))))
                    .await;
            }
        }
    }

    /// Publishes to a stream and waits for the stream's acknowledgement. Returns whether the
    /// stream found it a duplicate.
    async fn store(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Vec<u8>,
    ) -> Result<bool, async_nats::Error> {
        let ack = self
            .js
            .publish_with_headers(subject.to_string(), headers, payload.into())
            .await?;
        let ack = tokio::time::timeout(Duration::from_secs(5), ack)
            .await
            .map_err(|_| "timed out waiting for the stream's acknowledgement")??;
        Ok(ack.duplicate)
    }

    /// Stores a dead letter (the input's payload, `Resident-Error`, the reason in
    /// `Resident-Error-Message`) and terminates the input; if the dead letter cannot be stored
    /// the input is left for redelivery instead.
    async fn dead_letter(&self, msg: &JsMessage, kind: ErrorKind, message: String) {
        let (id, seq) = self.input_id(msg);
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("dead:{id}").as_str());
        headers.insert(ERROR_HEADER, kind.as_str());
        headers.insert(INPUT_SEQ_HEADER, seq.to_string().as_str());
        let reason = serde_json::to_string(&ErrorReply {
            error: kind,
            message,
        })
        .unwrap_or_default();
        headers.insert(
            "Resident-Error-Message",
            reason.replace(['\r', '\n'], " ").as_str(),
        );
        match self
            .store(
                &self.opts.dead_letter_subject,
                headers,
                msg.payload.to_vec(),
            )
            .await
        {
            Ok(_) => {
                bump(&self.stats.dead_letters);
                let _ = msg.ack_with(AckKind::Term).await;
            }
            Err(e) => {
                tracing::debug!(error = %e, "dead letter not stored; input left for redelivery");
                bump(&self.stats.naks);
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_millis(500))))
                    .await;
            }
        }
    }
}
