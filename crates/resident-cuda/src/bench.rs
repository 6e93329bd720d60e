//! Host <-> device transfer benchmark: pinned vs pageable memory, both directions, timed with
//! device events, against a plain synchronous `cuMemcpy` of the same memory as the baseline.
//! Results serialize to the JSON the project commits under `bench/results/`.

use crate::device::Device;
use crate::error::Result;
use crate::memory::DeviceBuffer;
use crate::pinned::PinnedMemory;
use crate::stream::{Event, Stream};
use std::sync::Arc;
use std::time::Instant;

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

/// `YYYY-MM-DD` of a time, in UTC.
pub fn utc_date(t: std::time::SystemTime) -> String {
    let days = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    // Days since 1970-01-01 to a civil date (proleptic Gregorian), by 400-year eras.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl TransferReport {
    /// The report as JSON: `device`, `date`, `command`,
    /// `results: [{direction, memory, bytes, gbps, baseline_gbps}]`.
    pub fn to_json(&self) -> String {
        let rows: Vec<String> = self
            .results
            .iter()
            .map(|r| {
                format!(
                    "    {{\"direction\": {}, \"memory\": {}, \"bytes\": {}, \"gbps\": {:.3}, \"baseline_gbps\": {:.3}}}",
                    json_str(match r.direction {
                        Direction::HostToDevice => "h2d",
                        Direction::DeviceToHost => "d2h",
                    }),
                    json_str(match r.memory {
                        HostMemoryKind::Pinned => "pinned",
                        HostMemoryKind::Pageable => "pageable",
                    }),
                    r.bytes,
                    r.gbps,
                    r.baseline_gbps
                )
            })
            .collect();
        format!(
            "{{\n  \"device\": {},\n  \"date\": {},\n  \"command\": {},\n  \"results\": [\n{}\n  ]\n}}\n",
            json_str(&self.device),
            json_str(&self.date),
            json_str(&self.command),
            rows.join(",\n")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        let at = |s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
        assert_eq!(utc_date(at(0)), "1970-01-01");
        assert_eq!(utc_date(at(951_782_400)), "2000-02-29");
        assert_eq!(utc_date(at(1_763_683_200)), "2025-11-21");
    }

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
        assert!(j.contains("\"device\": \"Test \\\"GPU\\\"\""));
        assert!(j.contains("\"direction\": \"h2d\", \"memory\": \"pinned\", \"bytes\": 1024, \"gbps\": 1.500, \"baseline_gbps\": 1.000"));
    }
}
