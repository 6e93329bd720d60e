//! What a keyed worker keeps in JetStream besides the streams: each partition's checkpoint
//! ([`Checkpoint`], one KV value: the key states and the sequence of the last input they
//! include) and lease ([`Lease`], renewed by compare-and-set), and the streams and bucket made
//! once ([`ensure_keyed`]).

use super::*;

/// A partition's checkpoint: the states of its keys (in [`KeyedOptions::partition_keys`]
/// order) and the stream sequence of the last input they include.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint<S> {
    /// Stream sequence of the last input included (0: none).
    pub seq: u64,
    /// States of the partition's keys.
    pub states: Vec<S>,
}

impl<S: bytemuck::Pod> Checkpoint<S> {
    /// The stored form: `RKC1`, sequence (u64 LE), state count and state size (u32 LE), states.
    pub fn encode(&self) -> Vec<u8> {
        let body: &[u8] = bytemuck::cast_slice(&self.states);
        let mut v = Vec::with_capacity(HEADER + body.len());
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&self.seq.to_le_bytes());
        v.extend_from_slice(&(self.states.len() as u32).to_le_bytes());
        v.extend_from_slice(&(std::mem::size_of::<S>() as u32).to_le_bytes());
        v.extend_from_slice(body);
        v
    }

    /// Reads a stored checkpoint of exactly `keys` states of type `S`.
    pub fn decode(bytes: &[u8], keys: u32) -> Result<Self, CheckpointError> {
        if bytes.len() < HEADER || &bytes[..4] != MAGIC {
            return Err(CheckpointError::Format);
        }
        let u32_at =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&bytes[4..12]);
        let (n, size) = (u32_at(12), u32_at(16));
        let want = std::mem::size_of::<S>() as u32;
        if n != keys || size != want {
            return Err(CheckpointError::Shape {
                keys: n,
                size,
                expected_keys: keys,
                expected_size: want,
            });
        }
        let expected = HEADER + n as usize * size as usize;
        if bytes.len() != expected {
            return Err(CheckpointError::Length {
                expected,
                actual: bytes.len(),
            });
        }
        // The body may not be aligned for S: copy state by state.
        let states = bytes[HEADER..]
            .chunks_exact(size.max(1) as usize)
            .take(n as usize)
            .map(bytemuck::pod_read_unaligned::<S>)
            .collect();
        Ok(Checkpoint {
            seq: u64::from_le_bytes(seq),
            states,
        })
    }
}

/// Reads partition `p`'s checkpoint from `store` (`None`: there is none yet).
pub async fn read_checkpoint<S: bytemuck::Pod>(
    store: &Store,
    opts: &KeyedOptions,
    p: u32,
) -> Result<Option<(Checkpoint<S>, u64)>, ServeError> {
    let entry = store
        .entry(opts.checkpoint_key(p))
        .await
        .map_err(|e| js_err(format!("read checkpoint {p}"))(e.into()))?;
    let Some(entry) = entry else { return Ok(None) };
    if entry.operation != kv::Operation::Put {
        return Ok(None);
    }
    let keys = opts.partition_keys(p).count() as u32;
    let cp = Checkpoint::decode(&entry.value, keys).map_err(|e| ServeError::Checkpoint {
        partition: p,
        source: e,
    })?;
    Ok(Some((cp, entry.revision)))
}

pub(super) fn js_err(op: impl Into<String>) -> impl FnOnce(async_nats::Error) -> ServeError {
    let op = op.into();
    move |source| ServeError::JetStream { op, source }
}

/// Creates the input stream (`<subject>.p.*`), the output stream and the KV bucket unless they
/// exist. Idempotent.
pub async fn ensure_keyed(js: &Context, opts: &KeyedOptions) -> Result<Store, ServeError> {
    js.get_or_create_stream(StreamConfig {
        name: opts.stream.clone(),
        subjects: vec![format!("{}.p.*", opts.subject)],
        storage: StorageType::File,
        duplicate_window: opts.duplicate_window,
        ..Default::default()
    })
    .await
    .map_err(|e| js_err(format!("create stream '{}'", opts.stream))(e.into()))?;
    js.get_or_create_stream(StreamConfig {
        name: opts.output_stream.clone(),
        subjects: vec![
            opts.output_subject.clone(),
            opts.dead_letter_subject.clone(),
        ],
        storage: StorageType::File,
        duplicate_window: opts.duplicate_window,
        ..Default::default()
    })
    .await
    .map_err(|e| js_err(format!("create stream '{}'", opts.output_stream))(e.into()))?;
    if let Ok(s) = js.get_key_value(opts.bucket.clone()).await {
        return Ok(s);
    }
    // The bucket's stream made here, as a KV bucket of history 1 is made: `create_key_value`
    // of this client sends fields that nats-server 2.9 answers in a form the client cannot read.
    js.get_or_create_stream(StreamConfig {
        name: format!("KV_{}", opts.bucket),
        subjects: vec![format!("$KV.{}.>", opts.bucket)],
        max_messages_per_subject: 1,
        storage: StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: async_nats::jetstream::stream::DiscardPolicy::New,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .map_err(|e| js_err(format!("create bucket '{}'", opts.bucket))(e.into()))?;
    js.get_key_value(opts.bucket.clone())
        .await
        .map_err(|e| js_err(format!("open bucket '{}'", opts.bucket))(e.into()))
}

/// What a lease entry holds.
#[derive(Serialize, Deserialize)]
pub(super) struct LeaseValue {
    pub(super) owner: String,
    /// Wall-clock milliseconds since the Unix epoch.
    pub(super) until_ms: u64,
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A lease held: its KV revision, renewed in a task of its own.
pub(super) struct Lease {
    /// Deadline by this process's clock (ms since `epoch`); past it the lease is not ours.
    pub(super) valid_until: Arc<AtomicU64>,
    pub(super) lost: Arc<AtomicBool>,
    /// The KV revision of the lease as last written by us.
    pub(super) rev: Arc<AtomicU64>,
    pub(super) epoch: Instant,
    pub(super) renewer: tokio::task::JoinHandle<()>,
}

impl Lease {
    pub(super) fn valid(&self) -> bool {
        !self.lost.load(Ordering::Acquire)
            && (self.epoch.elapsed().as_millis() as u64) < self.valid_until.load(Ordering::Acquire)
    }
}
