//! # resident-nats
//!
//! Serve resident ring kernels over NATS.
//!
//! * **Request/reply** ([`serve_requests`]): each request on a subject becomes one `call` on
//!   the kernel and the output goes to the request's reply subject. Workers in one queue
//!   group share the subject. Bad input gets a typed error reply (header `Resident-Error`,
//!   JSON [`ErrorReply`]); the worker keeps serving.
//! * **JetStream** ([`serve_jetstream`]): a durable pull consumer feeds the kernel; an input
//!   is acknowledged only after its output is stored in the output stream with the input's id
//!   as `Nats-Msg-Id`, so a redelivered input's second output is dropped by the stream's
//!   duplicate window. A worker pulls only as many inputs as it has free slots, and the
//!   consumer's `max_ack_pending` is the same figure: a slow kernel slows the consumer.
//!   Undecodable inputs go to a dead-letter subject and are terminated.
//! * **Keyed state that survives its worker** ([`serve_keyed_jetstream`]): a keyed kernel's
//!   partitions are served under leases, their key states checkpointed with the stream
//!   sequence they include (a KV bucket); a new owner restores the checkpoint and replays the
//!   rest, so every input changes state exactly once and outputs are de-duplicated by id.
//! * **Encoding** ([`Codec`]): the message's bytes ([`PodCodec`]) or JSON ([`JsonCodec`]).
//!
//! Any `KernelHandle<In, Out>` is a [`Service`]; `call` blocks, so it never holds up the
//! executor: request/reply calls it in place under `block_in_place` (multi-thread runtime;
//! the worker's other tasks move to another thread); JetStream hands the inputs of a pull
//! that arrived together to [`Service::call_batch`] in one such blocking section (a kernel
//! sends them all, then collects the replies), not one call and hand-off per input.
//!
//! ```no_run
//! use std::sync::Arc;
//! use resident::prelude::*;
//! use resident_nats::{
//!     serve_requests, Credentials, NatsOptions, PodCodec, RequestOptions, RequestStats,
//! };
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let rt = Runtime::builder().backend(Backend::Auto).build()?;
//! let k = rt.launch(RingKernel::<f32, f32>::new("double")
//!     .handler(|_: &mut Context<()>, x: f32| Some(2.0 * x)))?;
//! k.activate()?;
//! // TLS with your CA and a credentials file; a refused connection is a typed error.
//! let mut nats = NatsOptions::new("tls://nats.example.com:4222");
//! nats.tls.ca = Some("ca.pem".into());
//! nats.credentials = Credentials::CredsFile("worker.creds".into());
//! let client = nats.connect().await?;
//! let mut opts = RequestOptions::new("double");
//! opts.queue_group = Some("workers".into());
//! serve_requests(client, Arc::new(k), Arc::new(PodCodec), opts,
//!     Arc::new(RequestStats::default()), async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod codec;
pub mod connect;
pub mod core;
pub mod demo;
pub mod error;
pub mod jetstream;
pub mod keyed;
pub mod service;
pub mod testing;

pub use crate::codec::{Codec, JsonCodec, PodCodec};
pub use crate::connect::{
    ConnectError, Connection, Credentials, Fault, NatsOptions, Secret, TlsOptions,
};
pub use crate::core::{parse_reply, serve_requests, Reply, RequestOptions, RequestStats};
pub use crate::error::{
    DecodeError, EncodeError, ErrorKind, ErrorReply, ServeError, ERROR_HEADER, MAX_QUOTED,
};
pub use crate::jetstream::{
    ensure_consumer, ensure_streams, serve_jetstream, JetStreamOptions, JetStreamStats,
};
pub use crate::keyed::{
    ensure_keyed, read_checkpoint, serve_keyed_jetstream, Checkpoint, CheckpointError, KeyedLaunch,
    KeyedOptions, KeyedStats,
};
pub use crate::service::Service;
pub use async_nats;
/// The nkeys crate (make a user nkey pair, read a seed), as the client uses it.
pub use nkeys;
