//! Host <-> device transfer benchmark: pinned vs pageable memory, both directions, timed with
//! device events, against a plain synchronous `cuMemcpy` of the same memory as the baseline.
//! Results serialize to the JSON the project commits under `bench/results/`.

use resident_cuda::stream::{Event, Stream};
use resident_cuda::{Device, DeviceBuffer, PinnedMemory, Result};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

use crate::provenance::utc_date;

/// Copy direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Host to device.
    HostToDevice,
    /// Device to host.
    DeviceToHost,
}

/// Host memory kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostMemoryKind {
    /// `cuMemHostAlloc(DEVICEMAP | PORTABLE)`.
    Pinned,
    /// Ordinary heap memory.
    Pageable,
}

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct TransferResult {
    /// Direction.
    pub direction: Direction,
    /// Host memory kind.
    pub memory: HostMemoryKind,
    /// Bytes per copy.
    pub bytes: usize,
    /// GB/s (10^9 bytes per second) of the async copy on a stream, event-timed.
    pub gbps: f64,
    /// GB/s of the plain synchronous copy, wall-clock timed.
    pub baseline_gbps: f64,
}

/// A whole run.
#[derive(Clone, Debug, PartialEq)]
pub struct TransferReport {
    /// Device name.
    pub device: String,
    /// UTC date, `YYYY-MM-DD`.
    pub date: String,
    /// The command that produced it (filled by the caller).
    pub command: String,
    /// Measurements.
    pub results: Vec<TransferResult>,
}

/// Sizes from 1 KiB to 256 MiB in powers of four.
pub fn default_sizes() -> Vec<usize> {
    (0..=9).map(|i| 1024usize << (2 * i)).collect()
}

/// Runs the benchmark on device `ordinal`, `iterations` copies per point.
pub fn transfer(
    ordinal: usize,
    sizes: &[usize],
    iterations: u32,
    command: &str,
) -> Result<TransferReport> {
    let device = Device::open(ordinal)?;
    let stream = Stream::new(&device)?;
    let iterations = iterations.max(1);
    let mut results = Vec::new();
    for &bytes in sizes {
        let mut dev = DeviceBuffer::alloc(&device, bytes)?;
        let mut pinned = PinnedMemory::new(&device, bytes.max(1))?;
        let mut pageable = vec![0u8; bytes.max(1)];
        for direction in [Direction::HostToDevice, Direction::DeviceToHost] {
            for memory in [HostMemoryKind::Pinned, HostMemoryKind::Pageable] {
                let host: &mut [u8] = match memory {
                    HostMemoryKind::Pinned => &mut pinned.as_bytes_mut()[..bytes],
                    HostMemoryKind::Pageable => &mut pageable[..bytes],
                };
                let gbps = timed_async(&device, &stream, &mut dev, host, direction, iterations)?;
                let t = Instant::now();
                for _ in 0..iterations {
                    match direction {
                        Direction::HostToDevice => dev.copy_from_host(host)?,
                        Direction::DeviceToHost => dev.copy_to_host(host)?,
                    }
                }
                let secs = t.elapsed().as_secs_f64();
                results.push(TransferResult {
                    direction,
                    memory,
                    bytes,
                    gbps,
                    baseline_gbps: gb(bytes, iterations, secs),
                });
            }
        }
    }
    Ok(TransferReport {
        device: device.info().name.clone(),
        date: utc_date(std::time::SystemTime::now()),
        command: command.into(),
        results,
    })
}

fn gb(bytes: usize, iterations: u32, secs: f64) -> f64 {
    bytes as f64 * iterations as f64 / secs.max(1e-12) / 1e9
}

fn timed_async(
    device: &Arc<Device>,
    stream: &Stream,
    dev: &mut DeviceBuffer,
    host: &mut [u8],
    direction: Direction,
    iterations: u32,
) -> Result<f64> {
    let (a, b) = (Event::new(device)?, Event::new(device)?);
    a.record(stream)?;
    for _ in 0..iterations {
        // SAFETY: `host` is exclusively borrowed here and the stream is synchronized (through
        // `elapsed_ms`, which waits for `b`) before the borrow ends.
        unsafe {
            match direction {
                Direction::HostToDevice => dev.copy_from_host_async(host, stream)?,
                Direction::DeviceToHost => dev.copy_to_host_async(host, stream)?,
            }
        }
    }
    b.record(stream)?;
    let ms = a.elapsed_ms(&b)? as f64;
    Ok(gb(host.len(), iterations, ms / 1e3))
}

impl TransferReport {
    /// The report as JSON: `device`, `date`, `command`,
    /// `results: [{direction, memory, bytes, gbps, baseline_gbps}]`.
    pub fn to_json(&self) -> Value {
        let rows: Vec<Value> = self
            .results
            .iter()
            .map(|r| {
                json!({
                    "direction": match r.direction {
                        Direction::HostToDevice => "h2d",
                        Direction::DeviceToHost => "d2h",
                    },
                    "memory": match r.memory {
                        HostMemoryKind::Pinned => "pinned",
                        HostMemoryKind::Pageable => "pageable",
                    },
                    "bytes": r.bytes,
                    "gbps": r.gbps,
                    "baseline_gbps": r.baseline_gbps,
                })
            })
            .collect();
        json!({
            "device": self.device,
            "date": self.date,
            "command": self.command,
            "results": rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_span_1k_to_256m() {
        let s = default_sizes();
        assert_eq!(s.first(), Some(&1024));
        assert_eq!(s.last(), Some(&(256 << 20)));
    }

    #[test]
    fn json_shape() {
        let r = TransferReport {
            device: "Test \"GPU\"".into(),
            date: "2026-01-01".into(),
            command: "resident bench transfer".into(),
            results: vec![TransferResult {
                direction: Direction::HostToDevice,
                memory: HostMemoryKind::Pinned,
                bytes: 1024,
                gbps: 1.5,
                baseline_gbps: 1.0,
            }],
        };
        let j = r.to_json();
        assert_eq!(j["device"], "Test \"GPU\"");
        assert_eq!(
            j["results"][0],
            json!({"direction": "h2d", "memory": "pinned", "bytes": 1024, "gbps": 1.5, "baseline_gbps": 1.0})
        );
        // Quotes survive the round trip through text.
        let text = serde_json::to_string(&j).unwrap();
        assert!(text.contains("\"device\":\"Test \\\"GPU\\\"\""));
    }
}
