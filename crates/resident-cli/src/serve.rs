//! `resident serve`: a demo ring kernel on NATS with JSON payloads, so any NATS client can use
//! it. Core request/reply (optionally in a queue group), or JetStream with `--jetstream`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use resident::prelude::*;
use resident_nats::demo::{
    self, AnomalyReply, AnomalyRequest, DemoOptions, Pipeline, PipelineReply, PipelineRequest,
};
use resident_nats::{
    serve_jetstream, serve_requests, Codec, Connection, Credentials, JetStreamOptions,
    JetStreamStats, JsonCodec, NatsOptions, RequestOptions, RequestStats, Secret, Service,
    TlsOptions,
};

const EXAMPLES: &str = "\
Examples (with the `nats` command-line tool):
  resident serve --nats nats://127.0.0.1:4222 --demo pipeline
  nats --server nats://127.0.0.1:4222 request resident.pipeline '{\"value\": 42}'
    -> {\"score\":0.17639999999999997,\"class\":\"low\"}
  resident serve --nats nats://127.0.0.1:4222 --demo anomaly --queue-group workers   (start several)
  nats request resident.anomaly '{\"sensor\": 7, \"value\": 20.5}'
    -> {\"anomaly\":false,\"z\":0.0}

  JetStream (inputs stored, outputs to <subject>.out with the input's Nats-Msg-Id):
  resident serve --nats nats://127.0.0.1:4222 --demo pipeline --jetstream PIPE
  nats pub resident.pipeline '{\"value\": 80}' -H Nats-Msg-Id:reading-1
  nats stream view PIPE_OUT

Secure connections (one credential method; any TLS option makes TLS required):
  resident serve --nats tls://nats.example.com:4222 --tls-ca ca.pem --creds worker.creds --demo anomaly
  RESIDENT_NATS_PASSWORD=... resident serve --nats tls://h:4222 --user worker --demo pipeline
  resident serve --nats tls://h:4222 --tls-ca ca.pem --tls-cert me.pem --tls-key me-key.pem ...
A plaintext connection to a server that is not on loopback is refused unless --allow-plaintext.
A refused connection (credentials, certificate, permission) is an error naming the cause, exit 1;
a worker refused on a reconnect or denied a publish stops with that error, exit 1.

Bad input gets a reply with header Resident-Error: bad_input and a JSON body
{\"error\":\"bad_input\",\"message\":...}; under JetStream it goes to <subject>.dead.
SIGINT/SIGTERM: stop reading, finish what is in flight, exit 0.";

/// Which demo kernel to serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DemoKind {
    /// normalizer -> scorer: {"value": n} -> {"score": n, "class": "low"|"medium"|"high"}
    Pipeline,
    /// per-sensor EWMA: {"sensor": i, "value": n} -> {"anomaly": bool, "z": n}
    Anomaly,
}

impl DemoKind {
    fn name(self) -> &'static str {
        match self {
            DemoKind::Pipeline => "pipeline",
            DemoKind::Anomaly => "anomaly",
        }
    }
}

/// `resident serve` arguments.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct ServeArgs {
    /// NATS server URL.
    #[arg(long, value_name = "URL", default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// The demo kernel to serve.
    #[arg(long, value_enum)]
    pub demo: DemoKind,
    /// Subject requests (or JetStream inputs) arrive on [default: resident.<demo>].
    #[arg(long, value_name = "S")]
    pub subject: Option<String>,
    /// Consume inputs from this JetStream stream (created on subject S if missing) and
    /// publish outputs to S.out with the input's Nats-Msg-Id.
    #[arg(long, value_name = "STREAM")]
    pub jetstream: Option<String>,
    /// Queue group shared by workers (core NATS); with --jetstream, the durable consumer's
    /// name [default: resident-<demo>].
    #[arg(long, value_name = "G")]
    pub queue_group: Option<String>,
    /// Kernel queue size per lane; also the in-flight limit and JetStream max_ack_pending.
    #[arg(long, default_value_t = 256)]
    pub queue_size: usize,
    /// JetStream: seconds before an unacknowledged input is delivered again.
    #[arg(long, default_value_t = 30)]
    pub ack_wait: u64,
    /// Milliseconds one kernel call may take.
    #[arg(long, default_value_t = 5000)]
    pub call_timeout_ms: u64,
    /// Simulated device time per message in microseconds (a slow kernel, for trying
    /// backpressure and failover).
    #[arg(long, default_value_t = 0)]
    pub kernel_delay_us: u64,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// How to authenticate and encrypt: the NATS connection flags (shared by every command that
/// connects to NATS).
#[derive(Args, Debug)]
pub struct ConnectArgs {
    /// Credentials file (user JWT and nkey seed, as `nsc` writes it).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["nkey", "user", "token"])]
    pub creds: Option<PathBuf>,
    /// File holding a user nkey seed (SU...).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["user", "token"])]
    pub nkey: Option<PathBuf>,
    /// User name (with --password).
    #[arg(
        long,
        value_name = "USER",
        requires = "password",
        conflicts_with = "token"
    )]
    pub user: Option<String>,
    /// Password for --user; better from the environment than the command line (visible to
    /// other users in the process list). Never printed.
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "RESIDENT_NATS_PASSWORD",
        hide_env_values = true,
        requires = "user"
    )]
    pub password: Option<Secret>,
    /// Authentication token; better from the environment. Never printed.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "RESIDENT_NATS_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<Secret>,
    /// PEM file of the CA that signed the server's certificate (implies TLS required).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with --tls-key; implies TLS required).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require TLS (the system's roots verify the server unless --tls-ca).
    #[arg(long)]
    pub tls_required: bool,
    /// Allow a connection without TLS to a server that is not on loopback (refused by default:
    /// credentials and data would cross the network unencrypted).
    #[arg(long)]
    pub allow_plaintext: bool,
}

impl ConnectArgs {
    /// The library's connection options for `url`.
    pub fn options(&self, url: &str) -> NatsOptions {
        let mut o = NatsOptions::new(url);
        o.credentials = if let Some(f) = &self.creds {
            Credentials::CredsFile(f.clone())
        } else if let Some(f) = &self.nkey {
            Credentials::NkeyFile(f.clone())
        } else if let (Some(user), Some(password)) = (&self.user, &self.password) {
            Credentials::UserPassword {
                user: user.clone(),
                password: password.clone(),
            }
        } else if let Some(t) = &self.token {
            Credentials::Token(t.clone())
        } else {
            Credentials::None
        };
        o.tls = TlsOptions {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            required: self.tls_required,
        };
        o.allow_plaintext = self.allow_plaintext;
        o
    }
}

pub fn run(args: ServeArgs) -> ExitCode {
    let tokio_rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match tokio_rt.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The messages name their causes.
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Completes on the first SIGINT or SIGTERM.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers, serve until killed.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    eprintln!("resident serve: signal received, draining");
}

async fn serve(args: ServeArgs) -> Result<(), BoxError> {
    if args.queue_size == 0 {
        return Err("--queue-size must be at least 1".into());
    }
    let rt = Runtime::builder().backend(Backend::Auto).build()?;
    let opts = DemoOptions {
        queue_size: args.queue_size,
        delay: Duration::from_micros(args.kernel_delay_us),
    };
    // The first connect must succeed (a wrong URL, refused credentials or certificate are
    // errors at once); after that the client reconnects with a short backoff (100 ms steps,
    // at most 1 s) until the server refuses the credentials.
    let mut nats = args.connect.options(&args.nats);
    nats.name = Some("resident serve".into());
    if nats.allow_plaintext && !nats.tls.enabled() {
        eprintln!(
            "resident serve: warning: --allow-plaintext: credentials and data may cross the \
             network unencrypted"
        );
    }
    let client = nats.connect().await?;
    let subject = args
        .subject
        .clone()
        .unwrap_or_else(|| format!("resident.{}", args.demo.name()));
    match args.demo {
        DemoKind::Pipeline => {
            let p = Arc::new(Pipeline::launch(&rt, "pipeline", opts)?);
            let codec = Arc::new(JsonCodec::<PipelineRequest, PipelineReply>::new());
            run_worker(client, p, codec, &args, subject, false).await
        }
        DemoKind::Anomaly => {
            let k = Arc::new(demo::launch_anomaly(&rt, "anomaly", opts)?);
            let codec = Arc::new(JsonCodec::<AnomalyRequest, AnomalyReply>::new());
            // Stateful: feed the kernel in stream order.
            run_worker(client, k, codec, &args, subject, true).await
        }
    }
    // Dropping `rt` drains and terminates the kernels.
}

async fn run_worker<S: Service, C: Codec<S::In, S::Out>>(
    client: Connection,
    service: Arc<S>,
    codec: Arc<C>,
    args: &ServeArgs,
    subject: String,
    ordered: bool,
) -> Result<(), BoxError> {
    let call_timeout = Duration::from_millis(args.call_timeout_ms);
    if let Some(stream) = &args.jetstream {
        let durable = args
            .queue_group
            .clone()
            .unwrap_or_else(|| format!("resident-{}", args.demo.name()));
        let mut o = JetStreamOptions::new(stream.clone(), subject.clone(), durable.clone());
        o.max_in_flight = args.queue_size;
        o.ack_wait = Duration::from_secs(args.ack_wait.max(1));
        o.call_timeout = call_timeout;
        o.ordered = ordered;
        println!(
            "resident serve: demo {} on JetStream stream {stream} subject {subject} (durable {durable}), \
             outputs to {} (stream {} unless one exists), dead letters to {}",
            args.demo.name(),
            o.output_subject,
            o.output_stream,
            o.dead_letter_subject
        );
        let stats = Arc::new(JetStreamStats::default());
        let served = serve_jetstream(client, service, codec, o, stats.clone(), stop_signal()).await;
        // The counters are printed whether the worker stopped on a signal or was refused.
        println!(
            "{}",
            serde_json::json!({
                "received": stats.received.load(Ordering::Relaxed),
                "redelivered": stats.redelivered.load(Ordering::Relaxed),
                "outputs": stats.outputs.load(Ordering::Relaxed),
                "duplicates": stats.duplicates.load(Ordering::Relaxed),
                "dead_letters": stats.dead_letters.load(Ordering::Relaxed),
                "naks": stats.naks.load(Ordering::Relaxed),
            })
        );
        served?;
    } else {
        let mut o = RequestOptions::new(subject.clone());
        o.queue_group = args.queue_group.clone();
        o.max_in_flight = args.queue_size;
        o.call_timeout = call_timeout;
        println!(
            "resident serve: demo {} on subject {subject}{}",
            args.demo.name(),
            o.queue_group
                .as_deref()
                .map(|g| format!(" (queue group {g})"))
                .unwrap_or_default()
        );
        let stats = Arc::new(RequestStats::default());
        let served = serve_requests(client, service, codec, o, stats.clone(), stop_signal()).await;
        println!(
            "{}",
            serde_json::json!({
                "requests": stats.requests.load(Ordering::Relaxed),
                "replies": stats.replies.load(Ordering::Relaxed),
                "error_replies": stats.error_replies.load(Ordering::Relaxed),
                "bad_input": stats.bad_input.load(Ordering::Relaxed),
            })
        );
        served?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        Cli::try_parse_from([&["resident", "--demo", "pipeline"], args].concat()).map(|c| c.serve)
    }

    #[test]
    fn every_flag_reaches_the_library_options_and_no_secret_is_printed() {
        let a = parse(&[
            "--nats",
            "tls://h:4222",
            "--user",
            "w",
            "--password",
            "pw-s3cret",
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--tls-required",
        ])
        .unwrap();
        let o = a.connect.options(&a.nats);
        assert_eq!(o.url, "tls://h:4222");
        assert_eq!(
            o.credentials,
            Credentials::UserPassword {
                user: "w".into(),
                password: Secret::new("pw-s3cret")
            }
        );
        assert_eq!(
            o.tls,
            TlsOptions {
                ca: Some("ca.pem".into()),
                cert: Some("c.pem".into()),
                key: Some("k.pem".into()),
                required: true
            }
        );
        assert!(!o.allow_plaintext);
        for shown in [format!("{a:?}"), format!("{o:?}")] {
            assert!(!shown.contains("pw-s3cret"), "{shown}");
        }
        let a = parse(&["--creds", "w.creds", "--allow-plaintext"]).unwrap();
        let o = a.connect.options(&a.nats);
        assert_eq!(o.credentials, Credentials::CredsFile("w.creds".into()));
        assert!(o.allow_plaintext);
        let a = parse(&["--nkey", "w.nk"]).unwrap();
        assert_eq!(
            a.connect.options(&a.nats).credentials,
            Credentials::NkeyFile("w.nk".into())
        );
        let a = parse(&["--token", "tok-s3cret"]).unwrap();
        assert_eq!(
            a.connect.options(&a.nats).credentials,
            Credentials::Token(Secret::new("tok-s3cret"))
        );
        assert!(!format!("{a:?}").contains("tok-s3cret"));
        // One credential method; certificate and key together; a password needs a user.
        for bad in [
            &["--creds", "a", "--token", "t"][..],
            &["--nkey", "a", "--user", "u", "--password", "p"],
            &["--tls-cert", "c.pem"],
            &["--tls-key", "k.pem"],
            &["--password", "p"],
            &["--user", "u"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
