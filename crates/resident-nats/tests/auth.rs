//! Authentication and TLS against a real `nats-server` configured per test at test time: user
//! and password, token, nkey, a credentials file (operator, account and user JWTs signed here),
//! TLS with a CA and server certificate made here (rcgen), mutual
//! TLS. For each, the right credentials are served and the wrong ones refused with a typed
//! error that names the cause and carries no secret. A worker refused on a reconnect stops
//! with the error instead of retrying forever; a worker that may not publish to the output
//! subject stops with the error, and no input is acknowledged without its output.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use resident::prelude::*;
use resident_nats::testing::NatsServer;
use resident_nats::{
    serve_jetstream, serve_requests, ConnectError, Credentials, Fault, JetStreamOptions,
    JetStreamStats, NatsOptions, PodCodec, RequestOptions, RequestStats, Secret, ServeError,
};
use tokio::sync::oneshot;

const T: Duration = Duration::from_secs(10);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn doubler(rt: &Runtime, id: &str) -> KernelHandle<f32, f32> {
    let k = rt
        .launch(
            RingKernel::<f32, f32>::new(id).handler(|_: &mut Context<()>, x: f32| Some(2.0 * x)),
        )
        .unwrap();
    k.activate().unwrap();
    k
}

fn with(url: &str, credentials: Credentials) -> NatsOptions {
    let mut o = NatsOptions::new(url);
    o.credentials = credentials;
    o
}

fn user(u: &str, p: &str) -> Credentials {
    Credentials::UserPassword {
        user: u.into(),
        password: Secret::new(p),
    }
}

/// A worker connected with `opts` serves a doubling kernel on `subject`, and a client
/// connected with the same options gets 2x back.
async fn serves(kernels: &Runtime, opts: &NatsOptions, subject: &str) {
    let conn = tokio::time::timeout(T, opts.connect())
        .await
        .expect("connect within 10 s")
        .unwrap_or_else(|e| panic!("the right credentials connect: {e}"));
    let stats = Arc::new(RequestStats::default());
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_requests(
        conn,
        Arc::new(doubler(kernels, subject)),
        Arc::new(PodCodec),
        RequestOptions::new(subject),
        stats.clone(),
        async {
            let _ = rx.await;
        },
    ));
    let deadline = Instant::now() + T;
    while !stats.ready.load(Ordering::Acquire) {
        assert!(Instant::now() < deadline, "worker not subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let client = opts.connect().await.unwrap().client;
    for x in [1.5f32, -4.0, 21.0] {
        let m = tokio::time::timeout(
            T,
            client.request(subject.to_string(), bytemuck::bytes_of(&x).to_vec().into()),
        )
        .await
        .expect("reply within 10 s")
        .expect("request");
        assert!(m.headers.is_none(), "error reply {:?}", m.payload);
        assert_eq!(bytemuck::pod_read_unaligned::<f32>(&m.payload), 2.0 * x);
    }
    tx.send(()).unwrap();
    tokio::time::timeout(T, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(stats.replies.load(Ordering::Relaxed), 3);
}

/// Connecting with `opts` is refused; returns the error (checked to carry no `secret`).
async fn refused(opts: &NatsOptions, secret: &str) -> ConnectError {
    let started = Instant::now();
    let e = match tokio::time::timeout(Duration::from_secs(20), opts.connect()).await {
        Ok(Ok(_)) => panic!("wrong credentials were accepted"),
        Ok(Err(e)) => e,
        Err(_) => panic!("a refused connection must not hang"),
    };
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "refused at once, not after retries"
    );
    println!("refused as expected: {e}");
    let text = format!("{e} {e:?}");
    assert!(!secret.is_empty() && !text.contains(secret), "{text}");
    e
}

#[test]
fn user_and_password_right_served_wrong_refused() {
    let Some(server) = NatsServer::start_or_skip_with_config(
        "auth_user_password",
        r#"authorization { users = [ { user: worker, password: "pw-right-1" } ] }"#,
    ) else {
        return;
    };
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let url = server.url();
    rt().block_on(async {
        serves(&kernels, &with(&url, user("worker", "pw-right-1")), "t.up").await;
        for (u, p) in [("worker", "pw-wrong-2"), ("nobody", "pw-right-1")] {
            let e = refused(&with(&url, user(u, p)), p).await;
            assert!(matches!(e, ConnectError::Unauthorized { .. }), "{e}");
            assert!(e.to_string().contains("refused the credentials"), "{e}");
        }
        let e = refused(&with(&url, Credentials::None), "pw-right-1").await;
        assert!(matches!(e, ConnectError::Unauthorized { .. }), "{e}");
    });
}

#[test]
fn token_right_served_wrong_refused() {
    let Some(server) = NatsServer::start_or_skip_with_config(
        "auth_token",
        r#"authorization { token: "tok-right-1" }"#,
    ) else {
        return;
    };
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let url = server.url();
    rt().block_on(async {
        let right = Credentials::Token(Secret::new("tok-right-1"));
        serves(&kernels, &with(&url, right), "t.tok").await;
        let wrong = Credentials::Token(Secret::new("tok-wrong-2"));
        let e = refused(&with(&url, wrong), "tok-wrong-2").await;
        assert!(matches!(e, ConnectError::Unauthorized { .. }), "{e}");
    });
}

#[test]
fn nkey_right_served_wrong_refused() {
    let kp = nkeys::KeyPair::new_user();
    let Some(server) = NatsServer::start_or_skip_with_config(
        "auth_nkey",
        &format!(
            "authorization {{ users = [ {{ nkey: {} }} ] }}",
            kp.public_key()
        ),
    ) else {
        return;
    };
    let right = server.dir().join("right.nk");
    std::fs::write(&right, format!("{}\n", kp.seed().unwrap())).unwrap();
    let other = nkeys::KeyPair::new_user();
    let wrong = server.dir().join("wrong.nk");
    std::fs::write(&wrong, other.seed().unwrap()).unwrap();
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let url = server.url();
    rt().block_on(async {
        serves(&kernels, &with(&url, Credentials::NkeyFile(right)), "t.nk").await;
        let e = refused(
            &with(&url, Credentials::NkeyFile(wrong)),
            &other.seed().unwrap(),
        )
        .await;
        assert!(matches!(e, ConnectError::Unauthorized { .. }), "{e}");
        // A missing seed file is named before anything is sent.
        let missing = server.dir().join("missing.nk");
        let e = refused(&with(&url, Credentials::NkeyFile(missing)), "SU").await;
        assert!(
            matches!(
                e,
                ConnectError::ReadFile {
                    what: "nkey seed file",
                    ..
                }
            ),
            "{e}"
        );
    });
}

/// A CA, and certificates it signs, written as PEM files.
struct Pki {
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = p.self_signed(&ca_key).unwrap();
        Pki { ca, ca_key }
    }

    fn write_ca(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.ca.pem()).unwrap();
        path
    }

    /// Writes `<name>.pem` and `<name>-key.pem`; a server certificate for localhost and
    /// 127.0.0.1, or a client certificate.
    fn issue(&self, dir: &Path, name: &str, server: bool) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let sans = if server {
            vec!["localhost".to_string(), "127.0.0.1".to_string()]
        } else {
            vec![]
        };
        let mut p = rcgen::CertificateParams::new(sans).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = p.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}-key.pem")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

fn tls_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("resident-tls-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn tls_with_the_right_ca_is_served_an_unknown_server_certificate_is_refused() {
    let dir = tls_dir("server");
    let pki = Pki::new("right");
    let ca = pki.write_ca(&dir, "ca.pem");
    let (cert, key) = pki.issue(&dir, "server", true);
    let other_ca = Pki::new("other").write_ca(&dir, "other-ca.pem");
    let Some(server) = NatsServer::start_or_skip_with_config(
        "tls_server",
        &format!("tls {{ cert_file: {cert:?}, key_file: {key:?}, timeout: 5 }}",),
    ) else {
        return;
    };
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let url = server.url();
    rt().block_on(async {
        let mut right = NatsOptions::new(&url);
        right.tls.ca = Some(ca.clone());
        serves(&kernels, &right, "t.tls").await;
        // Also with tls:// and the host name the certificate names.
        let mut by_name = NatsOptions::new(format!("tls://localhost:{}", server.port()));
        by_name.tls.ca = Some(ca.clone());
        serves(&kernels, &by_name, "t.tls2").await;
        for wrong in [
            // A CA that did not sign the server's certificate.
            {
                let mut o = NatsOptions::new(&url);
                o.tls.ca = Some(other_ca.clone());
                o
            },
            // The system's roots only.
            {
                let mut o = NatsOptions::new(&url);
                o.tls.required = true;
                o
            },
        ] {
            let e = refused(&wrong, "-----BEGIN").await;
            assert!(matches!(e, ConnectError::Tls { .. }), "{e}");
            assert!(e.to_string().contains("TLS failed"), "{e}");
        }
    });
    // A client that requires TLS is refused by a server without it, never sent in plaintext.
    let Some(plain) = NatsServer::start_or_skip("tls_required_plain_server") else {
        return;
    };
    rt().block_on(async {
        let mut o = NatsOptions::new(plain.url());
        o.tls.ca = Some(ca.clone());
        let e = refused(&o, "-----BEGIN").await;
        assert!(matches!(e, ConnectError::Tls { .. }), "{e}");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mutual_tls_with_a_client_certificate_is_served_without_one_refused() {
    let dir = tls_dir("mutual");
    let pki = Pki::new("right");
    let ca = pki.write_ca(&dir, "ca.pem");
    let (cert, key) = pki.issue(&dir, "server", true);
    let (client_cert, client_key) = pki.issue(&dir, "worker", false);
    let stranger = Pki::new("stranger");
    let (bad_cert, bad_key) = stranger.issue(&dir, "intruder", false);
    let Some(server) = NatsServer::start_or_skip_with_config(
        "tls_mutual",
        &format!(
            "tls {{ cert_file: {cert:?}, key_file: {key:?}, ca_file: {ca:?}, verify: true, \
             timeout: 5 }}"
        ),
    ) else {
        return;
    };
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let url = server.url();
    rt().block_on(async {
        let mut right = NatsOptions::new(&url);
        right.tls.ca = Some(ca.clone());
        right.tls.cert = Some(client_cert.clone());
        right.tls.key = Some(client_key.clone());
        serves(&kernels, &right, "t.mtls").await;
        let mut none = NatsOptions::new(&url);
        none.tls.ca = Some(ca.clone());
        let mut stranger = none.clone();
        stranger.tls.cert = Some(bad_cert.clone());
        stranger.tls.key = Some(bad_key.clone());
        for wrong in [none, stranger] {
            let e = refused(&wrong, "PRIVATE KEY").await;
            // The server ends the handshake (or the connection right after it): either way
            // the error says TLS or names the connection, and nothing is served.
            assert!(
                matches!(
                    e,
                    ConnectError::Tls { .. } | ConnectError::Unreachable { .. }
                ),
                "{e}"
            );
        }
        // A certificate without its key is refused before connecting.
        let mut half = NatsOptions::new(&url);
        half.tls.cert = Some(client_cert.clone());
        let e = refused(&half, "PRIVATE KEY").await;
        assert!(matches!(e, ConnectError::Options(_)), "{e}");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_refused_on_reconnect_stops_with_the_error() {
    let conf =
        |pw: &str| format!(r#"authorization {{ users = [ {{ user: w, password: "{pw}" }} ] }}"#);
    let Some(mut server) =
        NatsServer::start_or_skip_with_config("auth_reconnect_refused", &conf("pw-1"))
    else {
        return;
    };
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let opts = with(&server.url(), user("w", "pw-1"));
    let tokio_rt = rt();
    let (stats, task) = tokio_rt.block_on(async {
        let conn = opts.connect().await.unwrap();
        let stats = Arc::new(RequestStats::default());
        let task = tokio::spawn(serve_requests(
            conn,
            Arc::new(doubler(&kernels, "re")),
            Arc::new(PodCodec),
            RequestOptions::new("t.re"),
            stats.clone(),
            std::future::pending::<()>(),
        ));
        (stats, task)
    });
    let deadline = Instant::now() + T;
    while !stats.ready.load(Ordering::Acquire) {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    // The password changes while the worker serves: every reconnect is refused.
    server.set_config(&conf("pw-2")).unwrap();
    server.restart().unwrap();
    tokio_rt.block_on(async {
        let r = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("the refused worker stops instead of retrying forever")
            .unwrap();
        match r {
            Err(ServeError::Refused(Fault::Unauthorized)) => {}
            other => panic!("expected Refused(Unauthorized), got {other:?}"),
        }
    });
}

#[test]
fn a_denied_output_subject_stops_the_worker_and_acknowledges_nothing() {
    const N: usize = 50;
    let conf = |deny: &str| {
        format!(
            r#"authorization {{ users = [
                {{ user: admin, password: "admin-pw" }}
                {{ user: worker, password: "worker-pw", permissions: {{ publish: {{ deny: [{deny}] }} }} }}
            ] }}"#
        )
    };
    let Some(mut server) =
        NatsServer::start_or_skip_with_config("auth_denied_output", &conf(r#""t.perm.out""#))
    else {
        return;
    };
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let url = server.url();
    let tokio_rt = rt();
    let mut jo = JetStreamOptions::new("PERM", "t.perm", "perm-workers");
    jo.max_in_flight = 8;
    jo.ack_wait = Duration::from_secs(30);
    jo.drain_timeout = Duration::from_secs(10);
    let admin = with(&url, user("admin", "admin-pw"));
    let js_admin = |tokio_rt: &tokio::runtime::Runtime| {
        tokio_rt.block_on(async { jetstream::new(admin.connect().await.unwrap().client) })
    };
    let js = js_admin(&tokio_rt);
    tokio_rt.block_on(async {
        resident_nats::ensure_streams(&js, &jo).await.unwrap();
        for i in 0..N {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", format!("in-{i}").as_str());
            js.publish_with_headers("t.perm", h, bytemuck::bytes_of(&(i as f32)).to_vec().into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let conn = with(&url, user("worker", "worker-pw"))
            .connect()
            .await
            .unwrap();
        let stats = Arc::new(JetStreamStats::default());
        let r = tokio::time::timeout(
            Duration::from_secs(40),
            serve_jetstream(
                conn,
                Arc::new(doubler(&kernels, "perm")),
                Arc::new(PodCodec),
                jo.clone(),
                stats.clone(),
                std::future::pending::<()>(),
            ),
        )
        .await
        .expect("the denied worker stops by itself");
        match r {
            Err(ServeError::Refused(Fault::PermissionDenied(text))) => {
                assert!(text.contains("t.perm.out"), "{text}");
                let shown = ServeError::Refused(Fault::PermissionDenied(text)).to_string();
                assert!(shown.contains("permission denied"), "{shown}");
            }
            other => panic!("expected Refused(PermissionDenied), got {other:?}"),
        }
        assert_eq!(stats.outputs.load(Ordering::Relaxed), 0);
        let out = js
            .get_stream("PERM_OUT")
            .await
            .unwrap()
            .get_info()
            .await
            .unwrap();
        assert_eq!(out.state.messages, 0, "no output was stored");
        let mut c: jetstream::consumer::PullConsumer = js
            .get_stream("PERM")
            .await
            .unwrap()
            .get_consumer("perm-workers")
            .await
            .unwrap();
        let ci = c.info().await.unwrap().clone();
        assert_eq!(
            ci.ack_floor.stream_sequence, 0,
            "no input acknowledged without its output"
        );
    });
    // Permission granted: a new worker gives every input exactly one output; nothing was lost.
    drop(js);
    server.set_config(&conf(r#""nothing.denied""#)).unwrap();
    server.restart().unwrap();
    let js = js_admin(&tokio_rt);
    tokio_rt.block_on(async {
        let conn = with(&url, user("worker", "worker-pw"))
            .connect()
            .await
            .unwrap();
        let stats = Arc::new(JetStreamStats::default());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_jetstream(
            conn,
            Arc::new(doubler(&kernels, "perm2")),
            Arc::new(PodCodec),
            jo.clone(),
            stats.clone(),
            async {
                let _ = rx.await;
            },
        ));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let n = js
                .get_stream("PERM_OUT")
                .await
                .unwrap()
                .get_info()
                .await
                .unwrap()
                .state
                .messages;
            if n >= N as u64 {
                break;
            }
            assert!(Instant::now() < deadline, "{n} of {N} outputs");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tx.send(()).unwrap();
        tokio::time::timeout(T, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let mut out = js.get_stream("PERM_OUT").await.unwrap();
        let info = out.info().await.unwrap().clone();
        assert_eq!(
            info.state.messages, N as u64,
            "exactly one output per input"
        );
        let mut seen = std::collections::HashSet::new();
        for seq in 1..=info.state.last_sequence {
            let m = out.get_raw_message(seq).await.unwrap();
            let id = m.headers.get("Nats-Msg-Id").unwrap().as_str().to_string();
            let i: usize = id.trim_start_matches("in-").parse().unwrap();
            assert_eq!(
                bytemuck::pod_read_unaligned::<f32>(&m.payload),
                2.0 * i as f32
            );
            assert!(seen.insert(i));
        }
    });
}

#[test]
fn plaintext_off_loopback_is_refused_before_anything_is_sent() {
    let rt = rt();
    rt.block_on(async {
        // 192.0.2.1 is TEST-NET-1: nothing is ever sent there, the check comes first.
        let o = with("nats://192.0.2.1:4222", user("u", "pw-never-sent"));
        let e = refused(&o, "pw-never-sent").await;
        assert!(matches!(e, ConnectError::Plaintext { .. }), "{e}");
        assert!(e.to_string().contains("--allow-plaintext"), "{e}");
    });
}

/// Base64url without padding (the JWT encoding).
fn b64url(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..chunk.len() + 1 {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// A NATS JWT (v2): `sub`'s claims of `kind`, signed by `issuer`.
fn jwt(issuer: &nkeys::KeyPair, sub: &str, name: &str, nats: serde_json::Value) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let header = b64url(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": format!("JTI{}{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)),
        "iat": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
        "iss": issuer.public_key(),
        "name": name,
        "sub": sub,
        "nats": nats,
    });
    let body = b64url(claims.to_string().as_bytes());
    let signed = format!("{header}.{body}");
    let sig = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", b64url(&sig))
}

fn creds_file(path: &Path, user_jwt: &str, seed: &str) {
    std::fs::write(
        path,
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
        ),
    )
    .unwrap();
}

#[test]
fn a_credentials_file_right_served_wrong_refused() {
    // Decentralized auth: an operator signs an account, the account signs a user; the server
    // trusts the operator and knows the account (memory resolver).
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    // JetStream (the test server runs with -js) needs a system account.
    let system = nkeys::KeyPair::new_account();
    let op_jwt = jwt(
        &operator,
        &operator.public_key(),
        "test-operator",
        serde_json::json!({"type": "operator", "version": 2,
            "system_account": system.public_key()}),
    );
    let unlimited = serde_json::json!({"subs": -1, "data": -1, "payload": -1, "imports": -1,
        "exports": -1, "wildcards": true, "conn": -1, "leaf": -1});
    let account_jwt = |kp: &nkeys::KeyPair, name: &str| {
        jwt(
            &operator,
            &kp.public_key(),
            name,
            serde_json::json!({"type": "account", "version": 2, "limits": unlimited}),
        )
    };
    let user_claims = serde_json::json!({"type": "user", "version": 2, "pub": {}, "sub": {},
        "subs": -1, "data": -1, "payload": -1});
    let Some(server) = NatsServer::start_or_skip_with_config(
        "auth_creds",
        &format!(
            "operator: {op_jwt}\nsystem_account: {}\nresolver: MEMORY\n\
             resolver_preload: {{ {}: {}, {}: {} }}\n",
            system.public_key(),
            account.public_key(),
            account_jwt(&account, "test-account"),
            system.public_key(),
            account_jwt(&system, "SYS"),
        ),
    ) else {
        return;
    };
    let user = nkeys::KeyPair::new_user();
    let right = server.dir().join("worker.creds");
    creds_file(
        &right,
        &jwt(&account, &user.public_key(), "worker", user_claims.clone()),
        &user.seed().unwrap(),
    );
    // Signed by an account the server does not know.
    let stranger = nkeys::KeyPair::new_account();
    let intruder = nkeys::KeyPair::new_user();
    let wrong = server.dir().join("intruder.creds");
    creds_file(
        &wrong,
        &jwt(&stranger, &intruder.public_key(), "intruder", user_claims),
        &intruder.seed().unwrap(),
    );
    let kernels = Runtime::builder().backend(Backend::Cpu).build().unwrap();
    let url = server.url();
    rt().block_on(async {
        serves(
            &kernels,
            &with(&url, Credentials::CredsFile(right)),
            "t.creds",
        )
        .await;
        let e = refused(
            &with(&url, Credentials::CredsFile(wrong)),
            &intruder.seed().unwrap(),
        )
        .await;
        assert!(matches!(e, ConnectError::Unauthorized { .. }), "{e}");
    });
}
