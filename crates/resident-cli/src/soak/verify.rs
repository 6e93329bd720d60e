//! The soak's end check: every input has exactly one output (ids and values against a replay
//! here, duplicates counted) and the checkpointed key states equal the replay.

use super::*;

/// A message read back from a stream.
pub(super) struct Stored {
    #[allow(dead_code)]
    pub(super) seq: u64,
    /// Its `Nats-Msg-Id`.
    pub(super) id: String,
    pub(super) payload: Vec<u8>,
    /// When the server stored it (its clock, nanoseconds since the Unix epoch).
    pub(super) published_ns: u64,
}

/// Every message of `stream` on `filter`, in stream order. Bounded: each message within 10 s.
pub(super) async fn read_all(
    js: &jetstream::Context,
    stream: &str,
    filter: &str,
) -> Result<Vec<Stored>, SoakError> {
    let err = |what: String| {
        move |e: async_nats::Error| SoakError::Io {
            what,
            source: std::io::Error::other(e),
        }
    };
    let mut s = js
        .get_stream(stream)
        .await
        .map_err(|e| err(format!("stream {stream}"))(e.into()))?;
    let info = s
        .info()
        .await
        .map_err(|e| err(format!("stream {stream} info"))(e.into()))?;
    if info.state.messages == 0 {
        return Ok(Vec::new());
    }
    let c = s
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            filter_subject: filter.into(),
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .map_err(|e| err(format!("read {stream}"))(e.into()))?;
    let mut c = c;
    let pending = c
        .info()
        .await
        .map_err(|e| err(format!("read {stream}"))(e.into()))?
        .num_pending;
    if pending == 0 {
        return Ok(Vec::new());
    }
    let mut msgs = c
        .stream()
        .max_messages_per_batch(1000)
        .messages()
        .await
        .map_err(|e| err(format!("read {stream}"))(e.into()))?;
    let mut out = Vec::new();
    loop {
        let m = match tokio::time::timeout(Duration::from_secs(10), msgs.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(err(format!("read {stream}"))(e.into())),
            Ok(None) => break,
            Err(_) => {
                return Err(SoakError::Timeout(format!(
                    "reading {stream}: no message within 10 s after {}",
                    out.len()
                )))
            }
        };
        let (seq, pending, published_ns) = m
            .info()
            .map(|i| {
                (
                    i.stream_sequence,
                    i.pending,
                    i.published.unix_timestamp_nanos().max(0) as u64,
                )
            })
            .unwrap_or((0, 0, 0));
        let id = m
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default();
        out.push(Stored {
            seq,
            id,
            payload: m.payload.to_vec(),
            published_ns,
        });
        if pending == 0 {
            break;
        }
    }
    Ok(out)
}

/// The number of messages in `stream` (None while the server is away).
pub(super) async fn count(js: &jetstream::Context, stream: &str) -> Option<u64> {
    let mut s = js.get_stream(stream).await.ok()?;
    Some(s.info().await.ok()?.state.messages)
}

// ---------------------------------------------------------------- the soak

pub(super) struct Report {
    pub(super) pass: bool,
    pub(super) inputs: u64,
    pub(super) outputs_distinct: u64,
    pub(super) output_messages: u64,
    pub(super) duplicates_stored: u64,
    pub(super) dead_letters: u64,
    pub(super) missing: u64,
    pub(super) wrong: u64,
    pub(super) unknown: u64,
    pub(super) produced_missing: u64,
    pub(super) state_mismatch: u64,
    pub(super) notes: Vec<String>,
    /// Input-to-output latency during faults and outside them.
    pub(super) latency: Value,
}

/// Reads the input stream (the log), replays it here, and checks the outputs and checkpoints.
pub(super) async fn verify(
    js: &jetstream::Context,
    opts: &KeyedOptions,
    partitions: u32,
    acked: &[u64],
    windows: &[(u64, u64)],
) -> Result<Report, SoakError> {
    let inputs = read_all(js, "SOAK", "soak.p.*").await?;
    let outputs = read_all(js, "SOAK_OUT", "soak.out").await?;
    let dead = read_all(js, "SOAK_OUT", "soak.dead").await?;
    let mut notes = Vec::new();
    // The replay: stream order is each partition's order, so each key's order.
    let mut states = vec![FoldState::default(); KEYS as usize];
    let mut expected: HashMap<String, FoldOutput> = HashMap::with_capacity(inputs.len());
    let mut stored_at: HashMap<&str, u64> = HashMap::with_capacity(inputs.len());
    let mut ns = std::collections::HashSet::with_capacity(inputs.len());
    for Stored {
        id,
        payload,
        published_ns,
        ..
    } in &inputs
    {
        stored_at.insert(id.as_str(), *published_ns);
        if payload.len() != std::mem::size_of::<FoldInput>() {
            notes.push(format!("input {id} has {} bytes", payload.len()));
            continue;
        }
        let i: FoldInput = bytemuck::pod_read_unaligned(payload);
        let s = &mut states[(i.key % KEYS) as usize];
        fold::step(s, i.value);
        ns.insert(i.n);
        if expected
            .insert(
                id.clone(),
                FoldOutput {
                    key: i.key,
                    pad: 0,
                    n: i.n,
                    state: *s,
                },
            )
            .is_some()
        {
            notes.push(format!("input id {id} stored twice in the input stream"));
        }
    }
    let produced_missing = acked.iter().filter(|n| !ns.contains(n)).count() as u64;
    if produced_missing > 0 {
        notes.push(format!(
            "{produced_missing} inputs acknowledged to the producer are not in the stream"
        ));
    }
    let mut seen: HashMap<&str, FoldOutput> = HashMap::with_capacity(outputs.len());
    let (mut wrong, mut unknown, mut dups) = (0u64, 0u64, 0u64);
    let (mut during, mut outside) = (Vec::new(), Vec::new());
    for Stored {
        id,
        payload,
        published_ns,
        ..
    } in &outputs
    {
        let Some(want) = expected.get(id) else {
            unknown += 1;
            continue;
        };
        let got: FoldOutput = if payload.len() == std::mem::size_of::<FoldOutput>() {
            bytemuck::pod_read_unaligned(payload)
        } else {
            wrong += 1;
            continue;
        };
        if &got != want {
            wrong += 1;
            if wrong <= 5 {
                notes.push(format!("output {id}: {got:?}, replay says {want:?}"));
            }
        }
        if seen.insert(id.as_str(), got).is_some() {
            dups += 1;
        } else if let Some(&t_in) = stored_at.get(id.as_str()) {
            // The first output of each input: its latency, split by when its input came.
            let ns = published_ns.saturating_sub(t_in);
            if windows.iter().any(|&(a, b)| t_in >= a && t_in <= b) {
                during.push(ns);
            } else {
                outside.push(ns);
            }
        }
    }
    let latency = json!({"during_faults": latency_summary(&mut during),
                         "outside_faults": latency_summary(&mut outside)});
    let missing = expected
        .keys()
        .filter(|id| !seen.contains_key(id.as_str()))
        .count() as u64;
    if missing > 0 {
        notes.push(format!("{missing} inputs have no output"));
    }
    // The checkpoints against the replay.
    let store = js
        .get_key_value("SOAK_STATE")
        .await
        .map_err(|e| SoakError::Io {
            what: "checkpoint bucket".into(),
            source: std::io::Error::other(e),
        })?;
    let mut state_mismatch = 0u64;
    for p in 0..partitions {
        let cp = read_checkpoint::<FoldState>(&store, opts, p).await?;
        let want: Vec<FoldState> = opts.partition_keys(p).map(|k| states[k as usize]).collect();
        match cp {
            Some((cp, _)) => {
                for (k, (got, want)) in opts.partition_keys(p).zip(cp.states.iter().zip(&want)) {
                    if got != want {
                        state_mismatch += 1;
                        notes.push(format!(
                            "key {k}: checkpoint {got:?} (at sequence {}), replay {want:?}",
                            cp.seq
                        ));
                    }
                }
            }
            None if want.iter().all(|s| s.count == 0) => {}
            None => {
                state_mismatch += want.len() as u64;
                notes.push(format!("partition {p} has no checkpoint"));
            }
        }
    }
    let pass = missing == 0
        && wrong == 0
        && unknown == 0
        && produced_missing == 0
        && state_mismatch == 0
        && dead.is_empty()
        && !expected.is_empty();
    Ok(Report {
        pass,
        inputs: expected.len() as u64,
        outputs_distinct: seen.len() as u64,
        output_messages: outputs.len() as u64,
        duplicates_stored: dups,
        dead_letters: dead.len() as u64,
        missing,
        wrong,
        unknown,
        produced_missing,
        state_mismatch,
        notes,
        latency,
    })
}

/// `{count, p50, p99, max}` in milliseconds of `ns` (nearest-rank quantiles).
pub(super) fn latency_summary(ns: &mut [u64]) -> Value {
    ns.sort_unstable();
    let ms = |v: Option<u64>| v.map(|v| (v as f64 / 1e4).round() / 100.0);
    json!({"count": ns.len(),
           "p50": ms(resident_bench::stats::quantile(ns, 0.5)),
           "p99": ms(resident_bench::stats::quantile(ns, 0.99)),
           "max": ms(ns.last().copied())})
}
