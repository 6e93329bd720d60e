//! Core NATS request/reply: every request on the subject becomes one `call`; the output goes to
//! the request's reply subject. Workers that share a queue group share the subject.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, HeaderMap, Message as NatsMessage};
use futures_util::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::codec::Codec;
use crate::connect::{Connection, Fault};
use crate::error::{ErrorKind, ErrorReply, ServeError, ERROR_HEADER};
use crate::service::{call_off_executor, Service};

/// Options of [`serve_requests`].
#[derive(Clone, Debug)]
pub struct RequestOptions {
    /// Subject requests arrive on.
    pub subject: String,
    /// Queue group: workers in one group share the subject (each request goes to one).
    pub queue_group: Option<String>,
    /// How long one `call` may take.
    pub call_timeout: Duration,
    /// Most calls in flight at once (set it to the kernel's queue size): while that many are
    /// in flight the worker reads no further requests.
    pub max_in_flight: usize,
    /// How long shutdown waits for calls in flight.
    pub drain_timeout: Duration,
}

impl RequestOptions {
    /// Defaults: no queue group, 5 s call timeout, 64 in flight, 10 s drain.
    pub fn new(subject: impl Into<String>) -> Self {
        RequestOptions {
            subject: subject.into(),
            queue_group: None,
            call_timeout: Duration::from_secs(5),
            max_in_flight: 64,
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// Counters of a request/reply worker.
#[derive(Debug, Default)]
pub struct RequestStats {
    /// Set once the subscription is known to the server (subscribed and flushed): requests
    /// sent from then on reach this worker (or its queue group).
    pub ready: std::sync::atomic::AtomicBool,
    /// Requests read from the subject.
    pub requests: AtomicU64,
    /// Outputs sent as replies.
    pub replies: AtomicU64,
    /// Typed error replies sent (bad input, busy, timeout, ...).
    pub error_replies: AtomicU64,
    /// Of those, bad input.
    pub bad_input: AtomicU64,
    /// Requests without a reply subject (served, but nowhere to answer).
    pub no_reply_subject: AtomicU64,
    /// Replies that could not be published (connection lost).
    pub publish_failures: AtomicU64,
}

impl RequestStats {
    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Serves `service` on `opts.subject` until `shutdown` completes, then drains: stops reading
/// requests (messages already buffered are still answered), waits up to `drain_timeout` for
/// calls in flight, and flushes.
///
/// `connection` is an `async_nats::Client` or a [`Connection`] from
/// [`NatsOptions::connect`](crate::NatsOptions::connect); with the latter, a server that
/// refuses the worker while it serves (credentials on a reconnect, a permission) stops it
/// with [`ServeError::Refused`] after the calls in flight end (bounded by `drain_timeout`).
pub async fn serve_requests<S, C, F>(
    connection: impl Into<Connection>,
    service: Arc<S>,
    codec: Arc<C>,
    opts: RequestOptions,
    stats: Arc<RequestStats>,
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
    let mut faults = connection.fault_watch();
    let client = connection.client;
    let mut fault: Option<Fault> = None;
    let subscribe = match &opts.queue_group {
        Some(g) => {
            client
                .queue_subscribe(opts.subject.clone(), g.clone())
                .await
        }
        None => client.subscribe(opts.subject.clone()).await,
    };
    let mut sub = subscribe.map_err(|source| ServeError::Subscribe {
        subject: opts.subject.clone(),
        source,
    })?;
    // A flush is a round trip: after it the server has the subscription. Bounded, but long
    // enough for a loaded machine (CI saw 5 s pass under a load average above 20).
    if tokio::time::timeout(Duration::from_secs(30), client.flush())
        .await
        .is_ok_and(|r| r.is_ok())
    {
        stats.ready.store(true, Ordering::Release);
    }
    let permits = Arc::new(Semaphore::new(opts.max_in_flight));
    let mut tasks = JoinSet::new();
    let kernel: Arc<str> = Arc::from(opts.subject.as_str());
    tokio::pin!(shutdown);
    let mut draining: Option<tokio::time::Instant> = None;
    loop {
        let next = if let Some(deadline) = draining {
            // After `drain` the subscription yields what the client buffered, then ends.
            tokio::time::timeout_at(deadline, sub.next())
                .await
                .unwrap_or_default()
        } else {
            tokio::select! {
                f = faults.wait() => {
                    // Nothing more can be answered; stop reading at once.
                    tracing::error!(error = %f, "the server refused this worker; stopping");
                    fault = Some(f);
                    draining = Some(tokio::time::Instant::now() + opts.drain_timeout);
                    break;
                }
                _ = &mut shutdown => {
                    draining = Some(tokio::time::Instant::now() + opts.drain_timeout);
                    if let Err(e) = sub.drain().await {
                        tracing::warn!(error = %e, "unsubscribing failed");
                    }
                    continue;
                }
                m = sub.next() => m,
            }
        };
        let Some(msg) = next else { break };
        while tasks.try_join_next().is_some() {}
        // Backpressure: a full kernel stops this worker from reading more requests. Calls
        // end within `call_timeout`, so this wait is bounded.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        RequestStats::bump(&stats.requests);
        let (client, service, codec, stats, kernel) = (
            client.clone(),
            service.clone(),
            codec.clone(),
            stats.clone(),
            kernel.clone(),
        );
        let timeout = opts.call_timeout;
        tasks.spawn(async move {
            handle_request(&client, &service, &*codec, &stats, msg, timeout, &kernel).await;
            drop(permit);
        });
    }
    let deadline = draining.unwrap_or_else(|| tokio::time::Instant::now() + opts.drain_timeout);
    let _ = tokio::time::timeout_at(deadline, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
    let _ = tokio::time::timeout(Duration::from_secs(2), client.flush()).await;
    // A fault seen while draining is still the reason the replies may be missing.
    match fault.or_else(|| faults.current()) {
        Some(f) => Err(ServeError::Refused(f)),
        None => Ok(()),
    }
}

async fn handle_request<S: Service, C: Codec<S::In, S::Out>>(
    client: &Client,
    service: &Arc<S>,
    codec: &C,
    stats: &RequestStats,
    msg: NatsMessage,
    timeout: Duration,
    kernel: &str,
) {
    let input = match codec.decode(&msg.payload) {
        Ok(i) => i,
        Err(e) => {
            RequestStats::bump(&stats.bad_input);
            return reply_error(client, stats, &msg, ErrorKind::BadInput, e.to_string()).await;
        }
    };
    let result = call_off_executor(service, input, timeout, kernel).await;
    let Some(reply) = msg.reply.clone() else {
        RequestStats::bump(&stats.no_reply_subject);
        return;
    };
    match result {
        Ok(out) => match codec.encode(&out) {
            Ok(bytes) => {
                if client.publish(reply, bytes.into()).await.is_ok() {
                    RequestStats::bump(&stats.replies);
                } else {
                    RequestStats::bump(&stats.publish_failures);
                }
            }
            Err(e) => reply_error(client, stats, &msg, ErrorKind::Internal, e.to_string()).await,
        },
        Err(e) => reply_error(client, stats, &msg, ErrorKind::of(&e), e.to_string()).await,
    }
}

async fn reply_error(
    client: &Client,
    stats: &RequestStats,
    msg: &NatsMessage,
    kind: ErrorKind,
    message: String,
) {
    let Some(reply) = msg.reply.clone() else {
        RequestStats::bump(&stats.no_reply_subject);
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(ERROR_HEADER, kind.as_str());
    let body = serde_json::to_vec(&ErrorReply {
        error: kind,
        message,
    })
    .unwrap_or_default();
    if client
        .publish_with_headers(reply, headers, body.into())
        .await
        .is_ok()
    {
        RequestStats::bump(&stats.error_replies);
    } else {
        RequestStats::bump(&stats.publish_failures);
    }
}

/// The reply to a request, as a client sees it: the output payload, or the typed error.
#[derive(Debug)]
pub enum Reply {
    /// The output's payload.
    Output(bytes::Bytes),
    /// A typed error reply.
    Error(ErrorReply),
}

/// Classifies a reply message: an error reply has the `Resident-Error` header. An error reply
/// whose body is not an [`ErrorReply`] keeps the header's kind, and its message is the body's
/// first [`MAX_QUOTED`](crate::error::MAX_QUOTED) bytes (as UTF-8, lossy), then `... (N bytes)`.
pub fn parse_reply(msg: &NatsMessage) -> Reply {
    if let Some(kind) = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(ERROR_HEADER))
        .and_then(|v| ErrorKind::parse(v.as_str()))
    {
        let reply = serde_json::from_slice::<ErrorReply>(&msg.payload).unwrap_or(ErrorReply {
            error: kind,
            message: body_excerpt(&msg.payload),
        });
        return Reply::Error(reply);
    }
    Reply::Output(msg.payload.clone())
}

/// At most [`MAX_QUOTED`](crate::error::MAX_QUOTED) bytes of a body as text (UTF-8, lossy),
/// then `... (N bytes)` when that is not all of it.
fn body_excerpt(body: &[u8]) -> String {
    let max = crate::error::MAX_QUOTED;
    let mut text = String::from_utf8_lossy(&body[..body.len().min(max)]).into_owned();
    // A replaced byte is three bytes of text.
    let cut = body.len() > max || text.len() > max;
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    if cut {
        text.push_str(&format!("... ({} bytes)", body.len()));
    }
    text
}
