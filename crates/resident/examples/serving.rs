//! A ring kernel served over NATS request/reply (`resident::guide::serving`).
//! `cargo run -p resident --example serving [backend] [nats://host:port]`: without a URL it
//! starts a throwaway `nats-server` on a free loopback port (and says so if none is installed).

mod common;

use resident::prelude::*;
use resident_nats::async_nats;
use resident_nats::testing::NatsServer;
use resident_nats::{serve_requests, PodCodec, RequestOptions, RequestStats};
use std::sync::{atomic::Ordering, Arc};
use std::time::Duration;

type AnyError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), AnyError> {
    let rt = common::runtime();
    let (_server, url) = match std::env::args().nth(2) {
        Some(url) => (None, url),
        None => match NatsServer::start_or_skip("example serving") {
            Some(s) => {
                let url = s.url();
                (Some(s), url)
            }
            None => return Ok(()),
        },
    };
    let double = rt.launch(
        RingKernel::<f32, f32>::new("double").handler(|_: &mut Context<()>, x: f32| Some(2.0 * x)),
    )?;
    double.activate()?;
    let tokio = tokio::runtime::Runtime::new()?;
    tokio.block_on(async {
        let worker = async_nats::connect(&url).await?;
        let client = async_nats::connect(&url).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stats = Arc::new(RequestStats::default());
        let mut opts = RequestOptions::new("double");
        opts.queue_group = Some("workers".into());
        let serving = tokio::spawn(serve_requests(
            worker,
            Arc::new(double),
            Arc::new(PodCodec),
            opts,
            stats.clone(),
            async {
                let _ = stopped.await;
            },
        ));
        for _ in 0..500 {
            if stats.ready.load(Ordering::Acquire) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for x in [1.0f32, 21.0, 0.25] {
            let reply = client
                .request("double", x.to_ne_bytes().to_vec().into())
                .await?;
            let y = f32::from_ne_bytes(reply.payload[..4].try_into()?);
            println!("request {x} on \"double\" -> {y}");
            assert_eq!(y, 2.0 * x);
        }
        let _ = stop.send(());
        serving.await??;
        Ok::<(), AnyError>(())
    })
}
