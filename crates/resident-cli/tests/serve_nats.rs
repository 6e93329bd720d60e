//! `resident serve` as separate OS processes against a real `nats-server` (started here on a
//! loopback port, killed on drop): the help's example request, graceful SIGTERM, and one of
//! two JetStream workers SIGKILLed mid-stream with every input still yielding exactly one
//! output in the output stream.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use resident_nats::async_nats::{self, jetstream};
use resident_nats::demo::{self, PipelineReply, PipelineRequest};
use resident_nats::testing::{connect_options, NatsServer};

const BIN: &str = env!("CARGO_BIN_EXE_resident");

/// A `resident serve` child process, SIGKILLed on drop if still running.
struct Worker(Child);

impl Worker {
    fn start(args: &[&str]) -> Worker {
        Self::start_env(args, &[])
    }

    fn start_env(args: &[&str], env: &[(&str, &str)]) -> Worker {
        Worker(
            Command::new(BIN)
                .arg("serve")
                .args(args)
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn resident serve"),
        )
    }

    /// SIGTERM, then wait (at most 20 s) for the exit; returns (status ok, stdout).
    fn terminate(mut self) -> (bool, String) {
        let pid = self.0.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                let mut out = String::new();
                use std::io::Read;
                if let Some(mut s) = self.0.stdout.take() {
                    let _ = s.read_to_string(&mut out);
                }
                return (status.success(), out);
            }
            assert!(
                Instant::now() < deadline,
                "resident serve did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Worker {
    /// Waits (at most `within`) for the process to exit by itself; returns (exit code, stdout,
    /// stderr).
    fn exits_within(mut self, within: Duration) -> (Option<i32>, String, String) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                use std::io::Read;
                let (mut out, mut err) = (String::new(), String::new());
                if let Some(mut s) = self.0.stdout.take() {
                    let _ = s.read_to_string(&mut out);
                }
                if let Some(mut s) = self.0.stderr.take() {
                    let _ = s.read_to_string(&mut err);
                }
                return (status.code(), out, err);
            }
            assert!(
                Instant::now() < deadline,
                "resident serve did not exit by itself within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn serve_help_shows_a_nats_cli_request() {
    let out = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(
        "nats --server nats://127.0.0.1:4222 request resident.pipeline '{\"value\": 42}'"
    ));
    for flag in [
        "--nats",
        "--demo",
        "--subject",
        "--jetstream",
        "--queue-group",
    ] {
        assert!(text.contains(flag), "{flag} documented");
    }
}

#[test]
fn the_help_example_answers_as_shown_and_sigterm_exits_zero() {
    let Some(server) = NatsServer::start_or_skip("serve_help_example") else {
        return;
    };
    let worker = Worker::start(&["--nats", &server.url(), "--demo", "pipeline"]);
    let help = String::from_utf8(
        Command::new(BIN)
            .args(["serve", "--help"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let shown = help
        .lines()
        .skip_while(|l| !l.contains("request resident.pipeline"))
        .nth(1)
        .unwrap()
        .trim()
        .trim_start_matches("-> ")
        .to_string();
    rt().block_on(async {
        let c = connect_options().connect(server.url()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let reply = loop {
            match tokio::time::timeout(
                Duration::from_millis(500),
                c.request("resident.pipeline", br#"{"value": 42}"#.to_vec().into()),
            )
            .await
            {
                Ok(Ok(m)) => break m,
                _ => assert!(Instant::now() < deadline, "resident serve never answered"),
            }
        };
        assert_eq!(String::from_utf8_lossy(&reply.payload), shown);
        let bad = c
            .request("resident.pipeline", b"not json".to_vec().into())
            .await
            .unwrap();
        assert_eq!(
            bad.headers
                .as_ref()
                .unwrap()
                .get("Resident-Error")
                .unwrap()
                .as_str(),
            "bad_input"
        );
    });
    let (ok, stdout) = worker.terminate();
    assert!(ok, "exit status 0 after SIGTERM; stdout: {stdout}");
    assert!(stdout.contains("\"bad_input\":1"), "{stdout}");
}

#[test]
fn a_killed_worker_loses_nothing_every_input_has_exactly_one_output() {
    let Some(server) = NatsServer::start_or_skip("killed_worker_loses_nothing") else {
        return;
    };
    const N: u32 = 1500;
    let url = server.url();
    // Slow kernels (1 ms per message) so the killed worker surely has inputs in flight.
    let args = [
        "--nats",
        &url,
        "--demo",
        "pipeline",
        "--subject",
        "t.kill",
        "--jetstream",
        "KILL",
        "--queue-size",
        "32",
        "--ack-wait",
        "2",
        "--kernel-delay-us",
        "1000",
    ];
    let tokio_rt = rt();
    let _enter = tokio_rt.enter();
    let client = tokio_rt.block_on(async { connect_options().connect(url.clone()).await.unwrap() });
    let js = jetstream::new(client.clone());
    // Streams made up front so inputs can be published before the workers are up.
    tokio_rt.block_on(async {
        let o = resident_nats::JetStreamOptions::new("KILL", "t.kill", "resident-pipeline");
        resident_nats::ensure_streams(&js, &o).await.unwrap();
        for i in 0..N {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", format!("in-{i}").as_str());
            let body = serde_json::to_vec(&PipelineRequest {
                value: (i % 101) as f64,
            })
            .unwrap();
            js.publish_with_headers("t.kill", h, body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    });
    let victim = Worker::start(&args);
    let survivor = Worker::start(&args);
    let count = |js: &jetstream::Context| {
        tokio_rt.block_on(async {
            match js.get_stream("KILL_OUT").await {
                Ok(s) => s.get_info().await.map(|i| i.state.messages).unwrap_or(0),
                Err(_) => 0,
            }
        })
    };
    // Kill the victim once a fifth of the outputs are in.
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&js) < (N / 5) as u64 {
        assert!(Instant::now() < deadline, "workers made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut victim = victim;
    victim.0.kill().unwrap(); // SIGKILL: no drain, no acks for what it held
    victim.0.wait().unwrap();
    let at_kill = count(&js);
    let deadline = Instant::now() + Duration::from_secs(90);
    while count(&js) < N as u64 {
        assert!(
            Instant::now() < deadline,
            "only {} of {N} outputs after the kill",
            count(&js)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let late redeliveries land (they must be dropped as duplicates), then check by id.
    std::thread::sleep(Duration::from_secs(3));
    let (ok, stdout) = survivor.terminate();
    assert!(ok, "survivor exits 0 on SIGTERM: {stdout}");
    tokio_rt.block_on(async {
        let mut stream = js.get_stream("KILL_OUT").await.unwrap();
        let info = stream.info().await.unwrap().clone();
        assert_eq!(
            info.state.messages, N as u64,
            "exactly one output per input"
        );
        let mut by_id: HashMap<String, u32> = HashMap::new();
        for seq in 1..=info.state.last_sequence {
            let m = stream.get_raw_message(seq).await.unwrap();
            assert_eq!(m.subject.as_str(), "t.kill.out");
            let id = m.headers.get("Nats-Msg-Id").unwrap().as_str().to_string();
            let i: u32 = id.trim_start_matches("in-").parse().unwrap();
            let r: PipelineReply = serde_json::from_slice(&m.payload).unwrap();
            assert_eq!(
                r.score,
                demo::score(demo::normalize((i % 101) as f64)).0,
                "{id}"
            );
            *by_id.entry(id).or_default() += 1;
        }
        assert_eq!(by_id.len(), N as usize);
        assert!(by_id.values().all(|&c| c == 1));
        let mut consumer: jetstream::consumer::PullConsumer = js
            .get_stream("KILL")
            .await
            .unwrap()
            .get_consumer("resident-pipeline")
            .await
            .unwrap();
        let ci = consumer.info().await.unwrap().clone();
        println!("kill: {at_kill} outputs at the kill; survivor: {stdout}");
        let stats: serde_json::Value = stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .expect("the survivor prints its counters");
        assert!(
            stats["redelivered"].as_u64().unwrap() > 0,
            "the victim had inputs in flight, and they came to the survivor"
        );
        assert_eq!((ci.num_ack_pending, ci.num_pending), (0, 0));
    });
}

#[test]
fn an_unreachable_server_is_a_clear_error_not_a_hang() {
    // Port 1 on loopback: nothing listens there.
    let out = Command::new(BIN)
        .args(["serve", "--nats", "nats://127.0.0.1:1", "--demo", "anomaly"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot connect to NATS at 'nats://127.0.0.1:1'"),
        "{err}"
    );
}

#[test]
fn sigterm_drains_a_jetstream_worker_and_a_successor_finishes_the_stream() {
    let Some(server) = NatsServer::start_or_skip("sigterm_drains_jetstream") else {
        return;
    };
    const N: u32 = 400;
    let url = server.url();
    let args = [
        "--nats",
        &url,
        "--demo",
        "anomaly",
        "--subject",
        "t.term",
        "--jetstream",
        "TERM",
        "--queue-size",
        "16",
        "--ack-wait",
        "5",
        "--kernel-delay-us",
        "2000",
    ];
    let tokio_rt = rt();
    let _enter = tokio_rt.enter();
    let client = tokio_rt.block_on(async { connect_options().connect(url.clone()).await.unwrap() });
    let js = jetstream::new(client.clone());
    tokio_rt.block_on(async {
        let o = resident_nats::JetStreamOptions::new("TERM", "t.term", "resident-anomaly");
        resident_nats::ensure_streams(&js, &o).await.unwrap();
        for i in 0..N {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", format!("r-{i}").as_str());
            let body = format!("{{\"sensor\": {}, \"value\": {}}}", i % 4, 10 + i % 3);
            js.publish_with_headers("t.term", h, body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    });
    let count = || {
        tokio_rt.block_on(async {
            match js.get_stream("TERM_OUT").await {
                Ok(s) => s.get_info().await.map(|i| i.state.messages).unwrap_or(0),
                Err(_) => 0,
            }
        })
    };
    let consumer_info = || {
        tokio_rt.block_on(async {
            let mut c: jetstream::consumer::PullConsumer = js
                .get_stream("TERM")
                .await
                .unwrap()
                .get_consumer("resident-anomaly")
                .await
                .unwrap();
            c.info().await.unwrap().clone()
        })
    };
    let first = Worker::start(&args);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count() < 60 {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (ok, stdout) = first.terminate();
    assert!(ok, "exit 0 after SIGTERM: {stdout}");
    // Drained: everything it held is settled (stored and acknowledged, or handed back), so
    // nothing waits for ack_wait (30 s here).
    // Acks are settled before the worker exits; the server's consumer info may trail them by
    // a moment on a loaded machine, so look again for a bounded while.
    let settle = Instant::now() + Duration::from_secs(10);
    let mut info = consumer_info();
    while info.num_ack_pending != 0 && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(100));
        info = consumer_info();
    }
    // On an idle machine the drain settles everything (observed in every isolated run); under
    // heavy load a few inputs the server sent after the drain window can stay pending until
    // `ack_wait`. That is no loss: the successor below gets them, and the exact-once check at
    // the end is the guarantee.
    if info.num_ack_pending != 0 {
        println!(
            "note: {} inputs left for redelivery after ack_wait (loaded machine)",
            info.num_ack_pending
        );
    }
    let stats: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("counters printed");
    let stored = count();
    assert_eq!(stats["outputs"].as_u64().unwrap(), stored, "{stdout}");
    assert!(stored < N as u64, "stopped mid-stream ({stored})");
    // A successor finishes the stream well before ack_wait could have redelivered anything.
    let second = Worker::start(&args);
    // Past one `ack_wait` (5 s here), so inputs left pending by a drain under load come back.
    let deadline = Instant::now() + Duration::from_secs(40);
    while count() < N as u64 {
        assert!(Instant::now() < deadline, "successor stuck at {}", count());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (ok, _) = second.terminate();
    assert!(ok);
    assert_eq!(count(), N as u64, "exactly one output per input");
    let info = consumer_info();
    assert_eq!((info.num_ack_pending, info.num_pending), (0, 0));
}

#[test]
fn serve_help_lists_the_connection_flags() {
    let out = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--creds <FILE>",
        "--nkey <FILE>",
        "--user <USER>",
        "--password <PASSWORD>",
        "--token <TOKEN>",
        "--tls-ca <FILE>",
        "--tls-cert <FILE>",
        "--tls-key <FILE>",
        "--tls-required",
        "--allow-plaintext",
        "RESIDENT_NATS_PASSWORD",
        "RESIDENT_NATS_TOKEN",
    ] {
        assert!(text.contains(flag), "{flag} documented");
    }
}

/// Asks `resident.pipeline` with `opts` until a worker answers (at most 20 s).
fn answered(opts: &resident_nats::NatsOptions) {
    rt().block_on(async {
        let c = opts.connect().await.unwrap().client;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match tokio::time::timeout(
                Duration::from_millis(500),
                c.request("resident.pipeline", br#"{"value": 42}"#.to_vec().into()),
            )
            .await
            {
                Ok(Ok(m)) => {
                    let r: PipelineReply = serde_json::from_slice(&m.payload).unwrap();
                    assert_eq!(r.score, demo::score(demo::normalize(42.0)).0);
                    return;
                }
                _ => assert!(Instant::now() < deadline, "resident serve never answered"),
            }
        }
    });
}

#[test]
fn credentials_from_flags_and_environment_are_served_wrong_ones_exit_1_unechoed() {
    let kp = resident_nats::nkeys::KeyPair::new_user();
    let Some(server) = NatsServer::start_or_skip_with_config(
        "serve_credentials",
        &format!(
            r#"authorization {{ users = [
                {{ user: worker, password: "pw-right-1" }}
                {{ nkey: {} }}
            ] }}"#,
            kp.public_key()
        ),
    ) else {
        return;
    };
    let url = server.url();
    let seed = server.dir().join("worker.nk");
    std::fs::write(&seed, kp.seed().unwrap()).unwrap();
    let seed = seed.to_str().unwrap().to_string();
    let mut client = resident_nats::NatsOptions::new(&url);
    client.credentials = resident_nats::Credentials::UserPassword {
        user: "worker".into(),
        password: resident_nats::Secret::new("pw-right-1"),
    };
    // The password from the environment; then the nkey seed file from a flag.
    for (args, env) in [
        (
            vec!["--nats", &url, "--demo", "pipeline", "--user", "worker"],
            vec![("RESIDENT_NATS_PASSWORD", "pw-right-1")],
        ),
        (
            vec!["--nats", &url, "--demo", "pipeline", "--nkey", &seed],
            vec![],
        ),
    ] {
        let w = Worker::start_env(&args, &env);
        answered(&client);
        let (ok, stdout) = w.terminate();
        assert!(ok, "{stdout}");
    }
    // Wrong: a password (environment or flag) and a token; exit 1 at once, cause named, the
    // secret nowhere in the output.
    for (args, env, secret) in [
        (
            vec!["--nats", &url, "--demo", "pipeline", "--user", "worker"],
            vec![("RESIDENT_NATS_PASSWORD", "pw-wrong-2")],
            "pw-wrong-2",
        ),
        (
            vec![
                "--nats",
                &url,
                "--demo",
                "pipeline",
                "--user",
                "worker",
                "--password",
                "pw-wrong-3",
            ],
            vec![],
            "pw-wrong-3",
        ),
        (
            vec![
                "--nats",
                &url,
                "--demo",
                "anomaly",
                "--token",
                "tok-wrong-4",
            ],
            vec![],
            "tok-wrong-4",
        ),
    ] {
        let (code, out, err) = Worker::start_env(&args, &env).exits_within(Duration::from_secs(20));
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("refused the credentials"), "{err}");
        assert!(!out.contains(secret) && !err.contains(secret), "{out}{err}");
    }
}

#[test]
fn a_worker_refused_on_reconnect_exits_1_instead_of_retrying() {
    let conf =
        |pw: &str| format!(r#"authorization {{ users = [ {{ user: w, password: "{pw}" }} ] }}"#);
    let Some(mut server) =
        NatsServer::start_or_skip_with_config("serve_reconnect_refused", &conf("pw-1"))
    else {
        return;
    };
    let url = server.url();
    let w = Worker::start_env(
        &["--nats", &url, "--demo", "pipeline", "--user", "w"],
        &[("RESIDENT_NATS_PASSWORD", "pw-1")],
    );
    let mut client = resident_nats::NatsOptions::new(&url);
    client.credentials = resident_nats::Credentials::UserPassword {
        user: "w".into(),
        password: resident_nats::Secret::new("pw-1"),
    };
    answered(&client);
    server.set_config(&conf("pw-2")).unwrap();
    server.restart().unwrap();
    let (code, out, err) = w.exits_within(Duration::from_secs(30));
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("refused this worker") && err.contains("refused the credentials"),
        "{err}"
    );
    assert!(!err.contains("pw-1") && !out.contains("pw-1"));
}

#[test]
fn plaintext_off_loopback_and_tls_against_a_plain_server_are_refused() {
    // TEST-NET-1: the check refuses before anything is sent.
    let out = Command::new(BIN)
        .args([
            "serve",
            "--nats",
            "nats://192.0.2.1:4222",
            "--demo",
            "anomaly",
        ])
        .args(["--user", "u", "--password", "pw-never-sent"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing a plaintext connection"), "{err}");
    assert!(
        err.contains("--allow-plaintext") && !err.contains("pw-never-sent"),
        "{err}"
    );
    // A missing CA file is named.
    let out = Command::new(BIN)
        .args(["serve", "--nats", "nats://127.0.0.1:1", "--demo", "anomaly"])
        .args(["--tls-ca", "/nonexistent/ca.pem"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read the CA file '/nonexistent/ca.pem'"),
        "{err}"
    );
    let Some(server) = NatsServer::start_or_skip("serve_tls_required_plain") else {
        return;
    };
    let (code, _, err) = Worker::start(&[
        "--nats",
        &server.url(),
        "--demo",
        "anomaly",
        "--tls-required",
    ])
    .exits_within(Duration::from_secs(20));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("TLS failed"), "{err}");
}
