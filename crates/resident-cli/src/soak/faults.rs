//! The soak's faults, drawn from its seed ([`schedule`]), and the fleet of worker processes they
//! are played on ([`Fleet`]): kills, restarts, pauses past the lease.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FaultKind {
    KillWorker,
    RestartServer,
    PauseWorker,
}

impl FaultKind {
    pub(super) fn name(self) -> &'static str {
        match self {
            FaultKind::KillWorker => "sigkill_worker",
            FaultKind::RestartServer => "restart_nats_server",
            FaultKind::PauseWorker => "sigstop_worker",
        }
    }
}

/// xorshift64*.
pub(super) struct Rng(u64);
impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub(super) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One fault per 15 s (at least 4): a fifth server restarts, a quarter pauses, the rest kills,
/// in an order and at times (between 8% and 85% of the run) drawn from the seed.
pub(super) fn schedule(seed: u64, secs: u64, workers: u32) -> Vec<(Duration, FaultKind, u32)> {
    let mut rng = Rng::new(seed ^ 0xFA17);
    let n = (secs / 15).max(4) as usize;
    let restarts = (n / 5).max(1);
    let pauses = (n / 4).max(1);
    let mut kinds: Vec<FaultKind> = std::iter::repeat_n(FaultKind::RestartServer, restarts)
        .chain(std::iter::repeat_n(FaultKind::PauseWorker, pauses))
        .chain(std::iter::repeat_n(
            FaultKind::KillWorker,
            n - restarts - pauses,
        ))
        .collect();
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let (from, to) = (secs as f64 * 0.08, secs as f64 * 0.85);
    let slot = (to - from) / n as f64;
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            let t = from + slot * (i as f64 + 0.2 + 0.6 * rng.unit());
            (
                Duration::from_secs_f64(t),
                k,
                rng.below(workers as u64) as u32,
            )
        })
        .collect()
}

// ---------------------------------------------------------------- the fleet of workers

/// The worker processes; every one is killed when this is dropped (any way out).
pub(super) struct Fleet {
    pub(super) exe: PathBuf,
    pub(super) url: String,
    pub(super) dir: PathBuf,
    pub(super) workers: u32,
    pub(super) partitions: u32,
    pub(super) slots: Vec<Option<Child>>,
    pub(super) started: u32,
}

impl Fleet {
    pub(super) fn stats_path(&self, slot: u32, generation: u32) -> PathBuf {
        self.dir.join(format!("worker-{slot}-{generation}.json"))
    }

    pub(super) fn spawn(&mut self, slot: u32) -> Result<u32, SoakError> {
        let generation = self.started;
        self.started += 1;
        let log = std::fs::File::create(self.dir.join(format!("worker-{slot}-{generation}.log")))
            .map_err(io("worker log"))?;
        let child = Command::new(&self.exe)
            .args(["bench", "soak-worker", "--url", &self.url])
            .args(["--slot", &slot.to_string()])
            .args(["--workers", &self.workers.to_string()])
            .args(["--partitions", &self.partitions.to_string()])
            .arg("--stats")
            .arg(self.stats_path(slot, generation))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(io("start a worker"))?;
        let pid = child.id();
        self.slots[slot as usize] = Some(child);
        Ok(pid)
    }

    pub(super) fn pid(&self, slot: u32) -> Option<u32> {
        self.slots[slot as usize].as_ref().map(|c| c.id())
    }

    /// SIGKILL and reap.
    pub(super) fn kill(&mut self, slot: u32) -> Option<u32> {
        let mut c = self.slots[slot as usize].take()?;
        let pid = c.id();
        let _ = c.kill();
        let _ = c.wait();
        Some(pid)
    }

    /// SIGTERM every worker, wait up to `within` for them to exit (final checkpoints), then
    /// SIGKILL what is left.
    pub(super) fn stop_all(&mut self, within: Duration) {
        for c in self.slots.iter().flatten() {
            sig::send(c.id(), sig::CONT);
            sig::send(c.id(), sig::TERM);
        }
        let deadline = Instant::now() + within;
        for slot in self.slots.iter_mut() {
            if let Some(c) = slot.as_mut() {
                while Instant::now() < deadline {
                    if matches!(c.try_wait(), Ok(Some(_))) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = c.kill();
                let _ = c.wait();
            }
            *slot = None;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in self.slots.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// ---------------------------------------------------------------- reading streams
