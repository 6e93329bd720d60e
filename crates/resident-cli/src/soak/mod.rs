//! `resident bench soak`: a keyed kernel served over JetStream (file storage) by worker
//! processes, a producer at a fixed rate, and faults drawn from a seed: a worker SIGKILLed
//! (and a new one started), nats-server SIGKILLed and restarted on the same store, a worker
//! SIGSTOPped past its lease and then SIGCONTed. At the end: every input has exactly one output
//! (ids and values checked against a replay here; duplicates counted), and the checkpointed
//! key states equal the replay. Writes `soak-<date>.json`; exit status 1 on any loss or
//! mismatch.
//!
//! The workers are this binary (`resident bench soak-worker`, hidden), children of this
//! process: killed on every way out of it, and (Linux) by the kernel if this process dies.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;
use resident::prelude::*;
use resident_nats::testing::fold::{self, FoldInput, FoldOutput, FoldState};
use resident_nats::testing::{connect_options, nats_server_binary, NatsServer};
use resident_nats::{
    ensure_keyed, read_checkpoint, serve_keyed_jetstream, KeyedOptions, KeyedStats, PodCodec,
};
use serde_json::{json, Value};

mod faults;
mod verify;
mod worker;

use faults::{schedule, FaultKind, Fleet, Rng};
use verify::{count, verify};
pub use worker::worker;

const KEYS: u32 = 64;
const LEASE: Duration = Duration::from_secs(2);
/// A paused worker stays stopped this long: past its lease and the standby delay, so another
/// worker takes its partitions.
const PAUSE: Duration = Duration::from_secs(6);

/// `resident bench soak`.
#[derive(clap::Args, Debug)]
pub struct Options {
    /// Minutes of producing (faults included).
    #[arg(long, conflicts_with = "seconds")]
    pub minutes: Option<u64>,
    /// Seconds of producing, for short runs (default 60 when --minutes is not given).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Seed of the fault schedule, the keys and the values.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Worker processes (at least 2).
    #[arg(long, default_value_t = 3)]
    pub workers: u32,
    /// Inputs per second.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    /// Publishes the producer keeps waiting for their acknowledgement at once (1: one at a
    /// time, as before; a single publish's round trip then bounds the rate).
    #[arg(long, default_value_t = 256)]
    pub in_flight: u32,
    /// Find the highest rate sustained with faults on: trials of `--seconds` (default 30) from
    /// `--rate` up, doubling while a trial keeps up (verdict pass, at least 95% of the rate
    /// produced, every output within 15 s of the producer's end), then halving the step between
    /// the last rate kept up with and the first not -> soak-rate-<date>.json.
    #[arg(long)]
    pub find_rate: bool,
    /// Folder for soak-<date>.json.
    #[arg(long, default_value = "bench/results")]
    pub out_dir: PathBuf,
}

/// `resident bench soak-worker` (started by the soak).
#[derive(clap::Args, Debug)]
pub struct WorkerOptions {
    #[arg(long)]
    url: String,
    #[arg(long)]
    slot: u32,
    #[arg(long)]
    workers: u32,
    #[arg(long)]
    partitions: u32,
    /// Where the worker's counters are written (every 250 ms).
    #[arg(long)]
    stats: PathBuf,
}

/// Why the soak could not run (a verdict of loss is not an error: it is in the JSON).
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    /// nats-server is not installed.
    #[error("nats-server is not installed (apt-get install nats-server)")]
    NoServer,
    /// A process, file or folder operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was attempted.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Serving set-up failed.
    #[error(transparent)]
    Serve(#[from] resident_nats::ServeError),
    /// The runtime could not be built.
    #[error(transparent)]
    Runtime(#[from] resident::Error),
    /// A bounded wait ran out.
    #[error("{0}")]
    Timeout(String),
    /// The options are not usable.
    #[error("{0}")]
    Options(&'static str),
    /// The result file.
    #[error(transparent)]
    Write(#[from] resident_bench::provenance::WriteError),
    /// Interrupted (Ctrl-C); every child was stopped.
    #[error("interrupted")]
    Interrupted,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SoakError {
    let what = what.into();
    move |source| SoakError::Io { what, source }
}

/// The keyed service as this soak runs it.
fn keyed_options(partitions: u32) -> KeyedOptions {
    let mut o = KeyedOptions::new("SOAK", "soak", "soak", KEYS, partitions);
    o.lease = LEASE;
    o.standby_delay = LEASE;
    o.checkpoint_interval = Duration::from_millis(500);
    o.checkpoint_every = 2000;
    o
}

// ---------------------------------------------------------------- signals (no libc crate)

#[cfg(unix)]
mod sig {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    pub const STOP: i32 = 19;
    pub const CONT: i32 = 18;
    pub const TERM: i32 = 15;
    /// Sends `sig` to `pid`; false when it could not be sent.
    pub fn send(pid: u32, sig: i32) -> bool {
        // SAFETY: kill(2) with a pid of our own child and a valid signal number.
        unsafe { kill(pid as i32, sig) == 0 }
    }

    #[cfg(target_os = "linux")]
    pub fn die_with_parent() {
        extern "C" {
            fn prctl(option: i32, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> i32;
        }
        const PR_SET_PDEATHSIG: i32 = 1;
        const SIGKILL: u64 = 9;
        // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag of this process.
        unsafe {
            prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        }
    }
    #[cfg(not(target_os = "linux"))]
    pub fn die_with_parent() {}
}

// ---------------------------------------------------------------- the worker process

/// Runs the soak (or, with `--find-rate`, its trials); the exit status is 1 when the verdict
/// is not "pass" (for `--find-rate`: when no rate kept up).
pub fn run(o: &Options) -> std::process::ExitCode {
    let r = if o.find_rate {
        find_rate(o)
    } else {
        run_inner(o)
    };
    match r {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(SoakError::Interrupted) => {
            eprintln!("soak: interrupted; every worker and the server were stopped");
            std::process::ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run_inner(o: &Options) -> Result<bool, SoakError> {
    let secs = match (o.minutes, o.seconds) {
        (Some(m), _) => m * 60,
        (None, Some(s)) => s,
        (None, None) => 60,
    };
    check_out_dir(o)?;
    let out_path = o
        .out_dir
        .join(format!("soak-{}.json", resident_bench::provenance::today()));
    let t = trial(o, o.rate, secs)?;
    resident_bench::provenance::write_json(&out_path, &t.doc)?;
    println!("soak: -> {}", out_path.display());
    Ok(t.pass)
}

fn check_out_dir(o: &Options) -> Result<(), SoakError> {
    if !o.out_dir.is_dir() {
        return Err(SoakError::Io {
            what: format!("--out-dir {}", o.out_dir.display()),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a folder"),
        });
    }
    Ok(())
}

/// `--find-rate`: trials at rising rates; the highest kept up with, and every trial's figures.
fn find_rate(o: &Options) -> Result<bool, SoakError> {
    check_out_dir(o)?;
    let secs = o.seconds.unwrap_or(30);
    let out_path = o.out_dir.join(format!(
        "soak-rate-{}.json",
        resident_bench::provenance::today()
    ));
    let mut trials: Vec<Value> = Vec::new();
    let (mut kept, mut failed): (Option<u32>, Option<u32>) = (None, None);
    let mut rate = o.rate.max(1);
    // Doubling, then bisecting between the last rate kept up with and the first not, until
    // the step is under a tenth of the rate; at most 8 trials.
    for _ in 0..8 {
        let t = trial(o, rate, secs)?;
        println!(
            "soak: rate {rate}/s: produced {:.0}/s, outputs {:.1} s after the producer's end, verdict {} -> {}",
            t.achieved_rate,
            t.settle_s,
            if t.pass { "pass" } else { "fail" },
            if t.kept_up { "kept up" } else { "did not keep up" }
        );
        trials.push(json!({"rate_per_s": rate, "kept_up": t.kept_up, "achieved_per_s": t.achieved_rate,
                           "settle_s": t.settle_s, "verdict": if t.pass { "pass" } else { "fail" },
                           "latency_ms": t.doc["latency_ms"].clone(), "faults": t.doc["faults"].clone(),
                           "counts": t.doc["counts"].clone(), "load_after": t.doc["load_after"].clone()}));
        if t.kept_up {
            kept = Some(kept.map_or(rate, |k| k.max(rate)));
        } else {
            failed = Some(failed.map_or(rate, |f| f.min(rate)));
        }
        rate = match (kept, failed) {
            (Some(k), None) => k.saturating_mul(2).min(100_000),
            (None, Some(f)) => (f / 2).max(1),
            (Some(k), Some(f)) if f > k && f - k > k / 10 => k + (f - k) / 2,
            _ => break,
        };
        if trials
            .iter()
            .any(|t| t["rate_per_s"].as_u64() == Some(rate as u64))
        {
            break;
        }
    }
    let doc = json!({
        "command": resident_bench::provenance::command(),
        "reproduce": resident_bench::provenance::cargo_command("resident-cli"),
        "date": resident_bench::provenance::today(),
        "machine": resident_bench::provenance::machine(),
        "what": "the highest input rate the JetStream soak keeps up with, faults on: each trial a soak of `seconds` at `rate_per_s` (SIGKILLed workers, nats-server restarts, SIGSTOPped workers, drawn from the seed); kept up = verdict pass, at least 95% of the rate produced, every output stored within 15 s of the producer's end. latency_ms: input stored to output stored (the server's clock), during faults (an input stored within 10 s after a fault began, or after a pause ended) and outside them",
        "seconds_per_trial": secs, "seed": o.seed, "workers": o.workers, "in_flight": o.in_flight,
        "highest_kept_up_per_s": kept,
        "lowest_not_kept_up_per_s": failed,
        "trials": trials,
    });
    resident_bench::provenance::write_json(&out_path, &doc)?;
    println!(
        "soak: highest rate kept up with: {} inputs/s -> {}",
        kept.map_or("none".to_string(), |k| k.to_string()),
        out_path.display()
    );
    Ok(kept.is_some())
}

/// One soak's outcome.
struct Trial {
    pass: bool,
    kept_up: bool,
    achieved_rate: f64,
    settle_s: f64,
    doc: Value,
}

/// One soak at `rate` inputs/s for `secs` seconds.
fn trial(o: &Options, rate: u32, secs: u64) -> Result<Trial, SoakError> {
    if secs < 10 {
        return Err(SoakError::Options("the soak needs at least 10 seconds"));
    }
    if o.workers < 2 {
        return Err(SoakError::Options("--workers must be at least 2"));
    }
    if rate == 0 || rate > 100_000 {
        return Err(SoakError::Options("--rate must be 1 to 100000"));
    }
    if o.in_flight == 0 || o.in_flight > 65_536 {
        return Err(SoakError::Options("--in-flight must be 1 to 65536"));
    }
    let load_before = resident_bench::provenance::load();
    let binary = nats_server_binary().ok_or(SoakError::NoServer)?;
    let mut server = NatsServer::start(binary).map_err(io("start nats-server"))?;
    let url = server.url();
    let partitions = o.workers * 2;
    let opts = keyed_options(partitions);
    let dir = server.dir().join("soak");
    std::fs::create_dir_all(&dir).map_err(io("work folder"))?;
    let mut fleet = Fleet {
        exe: std::env::current_exe().map_err(io("this program's path"))?,
        url: url.clone(),
        dir: dir.clone(),
        workers: o.workers,
        partitions,
        slots: (0..o.workers).map(|_| None).collect(),
        started: 0,
    };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(io("tokio runtime"))?;
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let i = interrupted.clone();
        // Ctrl-C or SIGTERM (a CI timeout): stop, kill every child, remove the store.
        tokio.spawn(async move {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{signal, SignalKind};
                if let Ok(mut term) = signal(SignalKind::terminate()) {
                    tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
                } else {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
            i.store(true, Ordering::Release);
        });
    }
    let client = tokio.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(10),
            connect_options().connect(url.clone()),
        )
        .await
        .map_err(|_| SoakError::Timeout("connect within 10 s".into()))?
        .map_err(|e| SoakError::Io {
            what: "connect".into(),
            source: std::io::Error::other(e),
        })
    })?;
    let js = {
        let _in_runtime = tokio.enter();
        jetstream::new(client.clone())
    };
    tokio.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), ensure_keyed(&js, &opts))
            .await
            .map_err(|_| SoakError::Timeout("streams made within 20 s".into()))?
            .map_err(SoakError::from)
    })?;
    for slot in 0..o.workers {
        fleet.spawn(slot)?;
    }
    // Every worker ready (its first counters written) within 30 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    while (0..o.workers).any(|s| !fleet.stats_path(s, s).exists()) {
        if Instant::now() > deadline {
            return Err(SoakError::Timeout("workers not up within 30 s".into()));
        }
        if interrupted.load(Ordering::Acquire) {
            return Err(SoakError::Interrupted);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "soak: {secs} s, {} workers, {partitions} partitions of {KEYS} keys, {} inputs/s, seed {}, nats-server at {url}",
        o.workers, rate, o.seed
    );

    // The producer: a fixed rate, each input retried (same Nats-Msg-Id) until stored, with up
    // to `in_flight` publishes awaiting their acknowledgement at once (one at a time, a
    // publish's round trip would bound the rate). Inputs of one key may be stored out of their
    // production order; the replay follows the stream's order, as the workers do.
    let produced = Arc::new(AtomicU64::new(0));
    let acked: Arc<std::sync::Mutex<Vec<u64>>> = Arc::new(std::sync::Mutex::new(Vec::new()));
    let last_seq: Arc<seqs::Seqs> = Arc::new(seqs::Seqs::new(partitions));
    let start = Instant::now();
    let start_unix_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let end = start + Duration::from_secs(secs);
    let producer = {
        let (js, opts, produced, acked, last_seq, interrupted) = (
            js.clone(),
            opts.clone(),
            produced.clone(),
            acked.clone(),
            last_seq.clone(),
            interrupted.clone(),
        );
        let (seed, in_flight) = (o.seed, o.in_flight as usize);
        tokio.spawn(async move {
            let mut rng = Rng::new(seed);
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let window = Arc::new(tokio::sync::Semaphore::new(in_flight));
            let mut tasks = tokio::task::JoinSet::new();
            let mut n = 0u64;
            let mut failed_publishes = 0u64;
            while Instant::now() < end && !interrupted.load(Ordering::Acquire) {
                tick.tick().await;
                let input = FoldInput {
                    key: rng.below(KEYS as u64) as u32,
                    pad: 0,
                    n,
                    value: rng.next(),
                };
                let Ok(permit) = window.clone().acquire_owned().await else {
                    break;
                };
                let (js, produced, acked, last_seq, interrupted) = (
                    js.clone(),
                    produced.clone(),
                    acked.clone(),
                    last_seq.clone(),
                    interrupted.clone(),
                );
                let subject = opts.subject_for_key(input.key);
                let partition = opts.partition_of(input.key);
                tasks.spawn(async move {
                    let _permit = permit;
                    let mut h = async_nats::HeaderMap::new();
                    h.insert("Nats-Msg-Id", format!("in-{}", input.n).as_str());
                    let give_up = Instant::now() + Duration::from_secs(60);
                    let mut failed = 0u64;
                    loop {
                        let sent = js
                            .publish_with_headers(
                                subject.clone(),
                                h.clone(),
                                bytemuck::bytes_of(&input).to_vec().into(),
                            )
                            .await;
                        let ack = match sent {
                            Ok(f) => tokio::time::timeout(Duration::from_secs(2), f)
                                .await
                                .ok()
                                .and_then(|r| r.ok()),
                            Err(_) => None,
                        };
                        if let Some(a) = ack {
                            last_seq.raise(partition, a.sequence);
                            acked
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(input.n);
                            produced.fetch_add(1, Ordering::AcqRel);
                            return failed;
                        }
                        failed += 1;
                        if Instant::now() > give_up || interrupted.load(Ordering::Acquire) {
                            // Not known to be stored: not counted as produced; the check
                            // below finds it in the stream if it was.
                            return failed;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                });
                n += 1;
                while let Some(r) = tasks.try_join_next() {
                    failed_publishes += r.unwrap_or(0);
                }
            }
            while let Some(r) = tasks.join_next().await {
                failed_publishes += r.unwrap_or(0);
            }
            failed_publishes
        })
    };

    // The faults, on this thread.
    let plan = schedule(o.seed, secs, o.workers);
    let mut log: Vec<Value> = Vec::new();
    let mut paused: Vec<(Instant, u32, u32)> = Vec::new(); // (resume at, slot, pid)
    let mut counts: HashMap<&'static str, u64> = HashMap::new();
    // When each fault's effect may show (the server's clock, ns): from the fault to 10 s after
    // it (a pause: after its end), for the latency split.
    let mut windows: Vec<(u64, u64)> = Vec::new();
    let since_start_ns = |start: Instant| start_unix_ns + start.elapsed().as_nanos() as u64;
    const AFTER: u64 = 10_000_000_000;
    let mut next = 0usize;
    let stamp = |start: Instant| (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    while Instant::now() < end || !paused.is_empty() {
        if interrupted.load(Ordering::Acquire) {
            return Err(SoakError::Interrupted);
        }
        let now = Instant::now();
        // Resume paused workers whose time is up.
        paused.retain(|&(at, slot, pid)| {
            if now < at {
                return true;
            }
            if fleet.pid(slot) == Some(pid) {
                sig::send(pid, sig::CONT);
                log.push(json!({"t_s": stamp(start), "kind": "sigcont_worker",
                    "target": format!("worker {slot} (pid {pid})")}));
            }
            false
        });
        if next < plan.len() && start.elapsed() >= plan[next].0 {
            let (_, kind, slot) = plan[next];
            next += 1;
            *counts.entry(kind.name()).or_default() += 1;
            match kind {
                FaultKind::KillWorker => {
                    let old = fleet.kill(slot);
                    paused.retain(|p| p.1 != slot);
                    let new = fleet.spawn(slot)?;
                    let at = since_start_ns(start);
                    windows.push((at, at + AFTER));
                    log.push(json!({"t_s": stamp(start), "kind": kind.name(),
                        "target": format!("worker {slot} (pid {})", old.unwrap_or(0)),
                        "replacement_pid": new}));
                }
                FaultKind::RestartServer => {
                    let t0 = Instant::now();
                    let at = since_start_ns(start);
                    server.restart().map_err(io("restart nats-server"))?;
                    windows.push((at, since_start_ns(start) + AFTER));
                    log.push(json!({"t_s": stamp(start), "kind": kind.name(),
                        "target": format!("nats-server ({url})"),
                        "down_s": (t0.elapsed().as_secs_f64() * 1000.0).round() / 1000.0}));
                }
                FaultKind::PauseWorker => match fleet.pid(slot) {
                    Some(pid) if !paused.iter().any(|p| p.1 == slot) => {
                        sig::send(pid, sig::STOP);
                        paused.push((Instant::now() + PAUSE, slot, pid));
                        let at = since_start_ns(start);
                        windows.push((at, at + PAUSE.as_nanos() as u64 + AFTER));
                        log.push(json!({"t_s": stamp(start), "kind": kind.name(),
                            "target": format!("worker {slot} (pid {pid})"),
                            "for_s": PAUSE.as_secs_f64()}));
                    }
                    _ => {
                        log.push(json!({"t_s": stamp(start), "kind": "skipped",
                            "target": format!("worker {slot} already paused")}));
                    }
                },
            }
            println!(
                "soak: {:>6.1} s  {}",
                start.elapsed().as_secs_f64(),
                log.last().map(|v| v.to_string()).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let failed_publishes = tokio
        .block_on(async { tokio::time::timeout(Duration::from_secs(90), producer).await })
        .map_err(|_| SoakError::Timeout("the producer did not finish within 90 s".into()))?
        .unwrap_or(0);
    let produced = produced.load(Ordering::Acquire);
    let acked = std::mem::take(&mut *acked.lock().unwrap_or_else(|p| p.into_inner()));
    let produce_s = start.elapsed().as_secs_f64();
    println!("soak: produced {produced} inputs in {produce_s:.1} s; waiting for the outputs");

    // Every output stored (bounded), then every checkpoint at its partition's last input.
    let drained = tokio.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if interrupted.load(Ordering::Acquire) {
                return Err(SoakError::Interrupted);
            }
            let n = count(&js, "SOAK_OUT").await.unwrap_or(0);
            if n >= produced || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let store = js
            .get_key_value("SOAK_STATE")
            .await
            .map_err(|e| SoakError::Io {
                what: "checkpoint bucket".into(),
                source: std::io::Error::other(e),
            })?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut behind = 0;
            for p in 0..partitions {
                let want = last_seq.get(p);
                let at = read_checkpoint::<FoldState>(&store, &opts, p)
                    .await
                    .ok()
                    .flatten()
                    .map(|(c, _)| c.seq)
                    .unwrap_or(0);
                if at < want {
                    behind += 1;
                }
            }
            if behind == 0 {
                return Ok(true);
            }
            if interrupted.load(Ordering::Acquire) {
                return Err(SoakError::Interrupted);
            }
            if Instant::now() > deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })?;
    let settle_s = start.elapsed().as_secs_f64() - produce_s;
    fleet.stop_all(Duration::from_secs(15));

    // The verdict.
    let report = tokio.block_on(verify(&js, &opts, partitions, &acked, &windows))?;
    let mut workers_sum: HashMap<String, u64> = HashMap::new();
    let mut generations = 0;
    for entry in std::fs::read_dir(&dir)
        .map_err(io("work folder"))?
        .flatten()
    {
        let p = entry.path();
        if p.extension().is_some_and(|e| e == "json") {
            generations += 1;
            if let Ok(v) = std::fs::read_to_string(&p)
                .map_err(|_| ())
                .and_then(|t| serde_json::from_str::<Value>(&t).map_err(|_| ()))
            {
                for (k, v) in v.as_object().into_iter().flatten() {
                    if let Some(n) = v.as_u64() {
                        *workers_sum.entry(k.clone()).or_default() += n;
                    }
                }
            }
        }
    }
    let applied = workers_sum.get("applied").copied().unwrap_or(0);
    let pass = report.pass && drained;
    let achieved_rate = produced as f64 / produce_s.max(1e-9);
    let kept_up = pass && achieved_rate >= 0.95 * rate as f64 && settle_s <= 15.0;
    let doc = json!({
        "command": resident_bench::provenance::command(),
        "reproduce": resident_bench::provenance::cargo_command("resident-cli"),
        "date": resident_bench::provenance::today(),
        "machine": resident_bench::provenance::machine(),
        "load_before": load_before,
        "load_after": resident_bench::provenance::load(),
        "nats_server": nats_version(),
        "setup": {
            "seconds": secs, "seed": o.seed, "workers": o.workers, "rate_per_s": rate,
            "producer_in_flight": o.in_flight,
            "keys": KEYS, "partitions": partitions, "storage": "file",
            "lease_s": LEASE.as_secs_f64(), "pause_s": PAUSE.as_secs_f64(),
            "checkpoint_interval_s": opts.checkpoint_interval.as_secs_f64(),
            "duplicate_window_s": opts.duplicate_window.as_secs_f64(),
            "kernel": "resident_nats::testing::fold (keyed, order-sensitive hash per key), CPU",
        },
        "faults": {
            "sigkill_worker": counts.get("sigkill_worker").copied().unwrap_or(0),
            "restart_nats_server": counts.get("restart_nats_server").copied().unwrap_or(0),
            "sigstop_worker": counts.get("sigstop_worker").copied().unwrap_or(0),
            "log": log,
        },
        "counts": {
            "inputs": report.inputs,
            "inputs_acknowledged_to_producer": produced,
            "outputs_distinct": report.outputs_distinct,
            "output_messages_stored": report.output_messages,
            "duplicates_stored_and_deduplicated_by_id": report.duplicates_stored,
            "duplicates_dropped_by_stream_window": workers_sum.get("duplicates").copied().unwrap_or(0),
            "redeliveries": applied.saturating_sub(report.inputs),
            "inputs_applied_by_workers": applied,
            "checkpoint_restores": workers_sum.get("restores").copied().unwrap_or(0),
            "leases_taken": workers_sum.get("acquired").copied().unwrap_or(0),
            "leases_lost": workers_sum.get("lost").copied().unwrap_or(0),
            "checkpoints_written": workers_sum.get("checkpoints").copied().unwrap_or(0),
            "worker_processes": generations,
            "producer_publish_retries": failed_publishes,
            "dead_letters": report.dead_letters,
        },
        "counts_note": "redeliveries = inputs applied again after a checkpoint restore (sum of the workers' last counters, so a worker killed between two counter writes undercounts by up to 250 ms of its work)",
        "checks": {
            "missing_outputs": report.missing,
            "wrong_values": report.wrong,
            "unknown_outputs": report.unknown,
            "produced_not_in_stream": report.produced_missing,
            "state_mismatches": report.state_mismatch,
            "checkpoints_caught_up": drained,
        },
        "seconds": {"producing": produce_s, "settling": settle_s, "total": start.elapsed().as_secs_f64()},
        "achieved_rate_per_s": achieved_rate,
        "kept_up": kept_up,
        "latency_ms": report.latency,
        "latency_note": "input stored to its output stored, by the server's clock; during_faults: inputs stored from a fault's start to 10 s after it (a pause: after its end), outside: the rest",
        "verdict": if pass { "pass" } else { "fail" },
        "notes": report.notes,
    });
    println!(
        "soak: {} inputs, {} outputs ({} duplicates deduplicated by id), faults: {} kills, {} server restarts, {} pauses; verdict {}; latency {}",
        report.inputs,
        report.outputs_distinct,
        report.duplicates_stored,
        counts.get("sigkill_worker").copied().unwrap_or(0),
        counts.get("restart_nats_server").copied().unwrap_or(0),
        counts.get("sigstop_worker").copied().unwrap_or(0),
        if pass { "PASS" } else { "FAIL" },
        report.latency
    );
    for n in &report.notes {
        println!("soak: {n}");
    }
    drop(fleet);
    drop(server);
    Ok(Trial {
        pass,
        kept_up,
        achieved_rate,
        settle_s,
        doc,
    })
}

fn nats_version() -> String {
    nats_server_binary()
        .and_then(|b| Command::new(b).arg("--version").output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The last stream sequence stored per partition (the producer raises them).
mod seqs {
    use std::sync::atomic::{AtomicU64, Ordering};
    pub struct Seqs(Vec<AtomicU64>);
    impl Seqs {
        pub fn new(n: u32) -> Seqs {
            Seqs((0..n).map(|_| AtomicU64::new(0)).collect())
        }
        pub fn raise(&self, p: u32, seq: u64) {
            if let Some(a) = self.0.get(p as usize) {
                a.fetch_max(seq, Ordering::AcqRel);
            }
        }
        pub fn get(&self, p: u32) -> u64 {
            self.0
                .get(p as usize)
                .map_or(0, |a| a.load(Ordering::Acquire))
        }
    }
}
