//! Your own kernel, served over NATS: a ring kernel defined here (a running balance per
//! account, kept in the kernel's state), served on one connection, made from one set of
//! connection options, both ways at once:
//!
//! * request/reply on `ledger` in the queue group `ledger-workers` (start several processes:
//!   each request goes to one of them);
//! * JetStream: inputs stored in stream `LEDGER` on `ledger.in`, consumed by the durable
//!   consumer `ledger-workers`; each output is stored on `ledger.in.out` with the input's id
//!   as `Nats-Msg-Id` before the input is acknowledged.
//!
//! Against your server (every flag as `resident serve` spells it; a password or token better
//! from RESIDENT_NATS_PASSWORD / RESIDENT_NATS_TOKEN than from the command line):
//!
//! ```text
//! cargo run --release -p resident-nats --example serve_own_kernel -- \
//!     --nats tls://nats.example.com:4222 --tls-ca ca.pem --creds worker.creds
//! nats request ledger '{"account": 7, "amount": 12.5}'
//! nats pub ledger.in '{"account": 7, "amount": -2.5}' -H Nats-Msg-Id:tx-1
//! ```
//!
//! Without `--nats` it shows the whole path on this machine: it starts its own `nats-server`
//! on loopback with a user and password, connects with them, serves, sends requests and
//! JetStream inputs as a client, prints what came back, and exits.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytemuck::{Pod, Zeroable};
use resident::prelude::*;
use resident_nats::testing::{nats_server_binary, NatsServer};
use resident_nats::{
    serve_jetstream, serve_requests, Connection, Credentials, JetStreamOptions, JetStreamStats,
    JsonCodec, NatsOptions, RequestOptions, RequestStats, Secret,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ---- The kernel: its messages (Pod, as every ring kernel's) and its handler. ----

/// Kernel input: an amount booked to an account.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct Booking {
    amount: f64,
    account: u32,
    _pad: u32,
}

/// Kernel output: the account's balance after the booking.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct Balance {
    balance: f64,
    bookings: u64,
    account: u32,
    _pad: u32,
}

fn launch_ledger(
    rt: &Runtime,
    queue_size: usize,
) -> resident::Result<KernelHandle<Booking, Balance>> {
    let k = rt.launch(
        RingKernel::<Booking, Balance>::new("ledger")
            .queue_size(queue_size)
            // A full queue makes a sender wait up to 1 s (then `busy`), never drops.
            .backpressure(Backpressure::Block(Duration::from_secs(1)))
            .state(HashMap::<u32, (f64, u64)>::new())
            .handler(|ctx: &mut Context<HashMap<u32, (f64, u64)>>, b: Booking| {
                let e = ctx.state_mut().entry(b.account).or_default();
                e.0 += b.amount;
                e.1 += 1;
                Some(Balance {
                    balance: e.0,
                    bookings: e.1,
                    account: b.account,
                    _pad: 0,
                })
            }),
    )?;
    k.activate()?;
    Ok(k)
}

// ---- The wire: JSON in and out, validated on the way in. ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BookingRequest {
    account: u32,
    amount: f64,
}

#[derive(Serialize, Deserialize, Debug)]
struct BalanceReply {
    account: u32,
    balance: f64,
    bookings: u64,
}

/// A booking that cannot be taken: the client gets `bad_input` with this message.
#[derive(Debug, thiserror::Error)]
#[error("amount must be a finite number, got {0}")]
struct NotFinite(f64);

impl TryFrom<BookingRequest> for Booking {
    type Error = NotFinite;
    fn try_from(r: BookingRequest) -> Result<Self, NotFinite> {
        if !r.amount.is_finite() {
            return Err(NotFinite(r.amount));
        }
        Ok(Booking {
            amount: r.amount,
            account: r.account,
            _pad: 0,
        })
    }
}

impl From<Balance> for BalanceReply {
    fn from(b: Balance) -> Self {
        BalanceReply {
            account: b.account,
            balance: b.balance,
            bookings: b.bookings,
        }
    }
}

// ---- Serving. ----

/// Serves the kernel both ways on one connection until `stop` turns true.
async fn serve(
    conn: Connection,
    kernel: Arc<KernelHandle<Booking, Balance>>,
    queue_size: usize,
    stop: watch::Receiver<bool>,
) -> Result<(), BoxError> {
    let codec = Arc::new(JsonCodec::<BookingRequest, BalanceReply>::new());
    let mut rr = RequestOptions::new("ledger");
    rr.queue_group = Some("ledger-workers".into());
    rr.max_in_flight = queue_size;
    let mut js = JetStreamOptions::new("LEDGER", "ledger.in", "ledger-workers");
    js.max_in_flight = queue_size;
    // The kernel keeps state: feed it in stream order.
    js.ordered = true;
    let until = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (a, b) = tokio::join!(
        serve_requests(
            conn.clone(),
            kernel.clone(),
            codec.clone(),
            rr,
            Arc::new(RequestStats::default()),
            until(stop.clone()),
        ),
        serve_jetstream(
            conn,
            kernel,
            codec,
            js,
            Arc::new(JetStreamStats::default()),
            until(stop),
        ),
    );
    a?;
    b?;
    Ok(())
}

/// `--flag value` and `--flag` from the command line, spelled as `resident serve` spells them.
fn options_from_args() -> Result<Option<NatsOptions>, BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let flag = |name: &str| args.iter().any(|a| a == name);
    let Some(url) = value("--nats") else {
        return Ok(None);
    };
    let mut o = NatsOptions::new(url);
    let password = value("--password").or_else(|| std::env::var("RESIDENT_NATS_PASSWORD").ok());
    let token = value("--token").or_else(|| std::env::var("RESIDENT_NATS_TOKEN").ok());
    o.credentials = match (value("--creds"), value("--nkey"), value("--user"), token) {
        (Some(f), None, None, None) => Credentials::CredsFile(f.into()),
        (None, Some(f), None, None) => Credentials::NkeyFile(f.into()),
        (None, None, Some(user), None) => Credentials::UserPassword {
            user,
            password: Secret::new(
                password.ok_or("--user needs --password or RESIDENT_NATS_PASSWORD")?,
            ),
        },
        (None, None, None, Some(t)) => Credentials::Token(Secret::new(t)),
        (None, None, None, None) => Credentials::None,
        _ => return Err("give one of --creds, --nkey, --user, --token".into()),
    };
    o.tls.ca = value("--tls-ca").map(PathBuf::from);
    o.tls.cert = value("--tls-cert").map(PathBuf::from);
    o.tls.key = value("--tls-key").map(PathBuf::from);
    o.tls.required = flag("--tls-required");
    o.allow_plaintext = flag("--allow-plaintext");
    o.name = Some("ledger worker".into());
    Ok(Some(o))
}

fn main() -> Result<(), BoxError> {
    let kernels = Runtime::builder().backend(Backend::Auto).build()?;
    let queue_size = 256;
    let kernel = Arc::new(launch_ledger(&kernels, queue_size)?);
    let tokio_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (stop_tx, stop_rx) = watch::channel(false);

    if let Some(opts) = options_from_args()? {
        return tokio_rt.block_on(async {
            // A refused connection is a typed error naming the cause; `?` prints it.
            let conn = opts.connect().await?;
            println!("serving the ledger kernel on 'ledger' and JetStream 'LEDGER' (Ctrl-C stops)");
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                let _ = stop_tx.send(true);
            });
            serve(conn, kernel, queue_size, stop_rx).await
        });
    }

    // The whole path on this machine: our own server, with a user and password.
    let bin = nats_server_binary().ok_or("nats-server is not installed and no --nats URL given")?;
    let server = NatsServer::start_with(
        bin,
        Some(r#"authorization { users = [ { user: ledger, password: "example-only" } ] }"#),
    )?;
    let mut opts = NatsOptions::new(server.url());
    opts.credentials = Credentials::UserPassword {
        user: "ledger".into(),
        password: Secret::new("example-only"),
    };
    println!(
        "started nats-server at {} (user 'ledger'); options: {opts:?}",
        server.url()
    );
    tokio_rt.block_on(async {
        let worker = tokio::spawn(serve(opts.connect().await?, kernel, queue_size, stop_rx));
        let client = opts.connect().await?.client;
        // Request/reply: answers come back at once (wait for the subscription first).
        let deadline = Instant::now() + Duration::from_secs(10);
        for (account, amount) in [(7, 12.5), (7, -2.5), (8, 100.0)] {
            let body = format!(r#"{{"account": {account}, "amount": {amount}}}"#);
            let reply = loop {
                match tokio::time::timeout(
                    Duration::from_millis(500),
                    client.request("ledger", body.clone().into()),
                )
                .await
                {
                    Ok(Ok(m)) => break m,
                    _ if Instant::now() < deadline => continue,
                    _ => return Err::<(), BoxError>("no worker answered within 10 s".into()),
                }
            };
            println!(
                "request {body} -> {}",
                String::from_utf8_lossy(&reply.payload)
            );
        }
        let bad = client
            .request("ledger", r#"{"account": 7, "amount": "lots"}"#.into())
            .await?;
        println!(
            "a bad request -> {} {}",
            bad.headers
                .as_ref()
                .and_then(|h| h.get("Resident-Error"))
                .map(|v| v.as_str().to_string())
                .unwrap_or_default(),
            String::from_utf8_lossy(&bad.payload)
        );
        // JetStream: inputs stored with their ids; outputs stored under the same ids.
        let js = jetstream::new(client.clone());
        for (i, (account, amount)) in [(7, 1.0), (9, 5.0), (7, 1.0)].into_iter().enumerate() {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", format!("tx-{i}").as_str());
            let body = format!(r#"{{"account": {account}, "amount": {amount}}}"#);
            js.publish_with_headers("ledger.in", h, body.into())
                .await?
                .await?;
        }
        let out = loop {
            if let Ok(mut s) = js.get_stream("LEDGER_OUT").await {
                if s.info().await?.state.messages >= 3 {
                    break s;
                }
            }
            if Instant::now() > deadline + Duration::from_secs(10) {
                return Err("the JetStream outputs did not arrive".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        for seq in 1..=3 {
            let m = out.get_raw_message(seq).await?;
            println!(
                "JetStream output {} -> {}",
                m.headers
                    .get("Nats-Msg-Id")
                    .map(|v| v.as_str())
                    .unwrap_or("?"),
                String::from_utf8_lossy(&m.payload)
            );
        }
        stop_tx.send(true)?;
        worker.await??;
        println!("stopped cleanly");
        Ok(())
    })
}
