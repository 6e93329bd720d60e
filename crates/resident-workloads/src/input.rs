//! Input files and generated inputs.
//!
//! - Edge lists (`--graph FILE`): one `src dst` pair per line (whitespace separated), `#` starts
//!   a comment (whole line or the rest of a line), blank lines are fine. Ids are non-negative
//!   integers (`u64`), any sparse set; they are remapped to dense `0..N` in ascending id order.
//!   Duplicate edges count once, self-loops are kept. Anything else is
//!   [`InputError::BadLine`] with the 1-based line number.
//! - Readings (`--input FILE`): `sensor,value` per line, sensor a non-negative integer, value a
//!   finite number; an optional first line `sensor,value` is a header; blank lines and `#`
//!   lines are skipped. A reading's index is its position among the readings (0-based).

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

use crate::error::{excerpt, InputError, LineError};
use crate::rng::SplitMix64;

/// A directed graph's edge set over dense node ids, with the original ids.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EdgeList {
    /// Original id of each dense node (ascending).
    pub ids: Vec<u64>,
    /// Distinct edges `(src, dst)` over dense ids, sorted.
    pub edges: Vec<(u32, u32)>,
}

impl EdgeList {
    /// The graph of the edges `(src, dst)` over original ids (as an edge-list file would
    /// give them): dense ids in ascending original order, duplicate edges once.
    pub fn from_pairs(raw: Vec<(u64, u64)>) -> Self {
        dense(raw)
    }

    /// Nodes.
    pub fn nodes(&self) -> usize {
        self.ids.len()
    }
}

fn open(path: &Path) -> Result<std::io::BufReader<std::fs::File>, InputError> {
    std::fs::File::open(path)
        .map(std::io::BufReader::new)
        .map_err(|source| InputError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Reads lines as bytes so that a non-UTF-8 line is a typed error with its number.
fn for_each_line(
    path: &Path,
    mut r: impl BufRead,
    mut f: impl FnMut(usize, &str) -> Result<(), LineError>,
) -> Result<(), InputError> {
    let mut buf = Vec::new();
    let mut line = 0usize;
    loop {
        buf.clear();
        let n = r
            .read_until(b'\n', &mut buf)
            .map_err(|source| InputError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        if n == 0 {
            return Ok(());
        }
        line += 1;
        let bad = |reason: LineError| InputError::BadLine {
            path: path.to_path_buf(),
            line,
            reason,
        };
        let text = std::str::from_utf8(&buf).map_err(|_| bad(LineError::NotUtf8))?;
        f(line, text.trim_end_matches(['\n', '\r'])).map_err(bad)?;
    }
}

fn parse_id(field: &str, what: &'static str) -> Result<u64, LineError> {
    field.parse::<u64>().map_err(|_| LineError::BadId {
        what,
        field: excerpt(field),
    })
}

/// Parses an edge list from `r` (`path` names it in errors).
pub fn parse_edge_list(path: &Path, r: impl BufRead) -> Result<EdgeList, InputError> {
    let mut raw: Vec<(u64, u64)> = Vec::new();
    for_each_line(path, r, |_, line| {
        let content = line.split('#').next().unwrap_or("");
        let mut f = content.split_whitespace();
        let (Some(a), Some(b)) = (f.next(), f.next()) else {
            return match content.trim().is_empty() {
                true => Ok(()),
                false => Err(LineError::Fields {
                    expected: "src dst",
                    got: excerpt(content.trim()),
                }),
            };
        };
        if let Some(extra) = f.next() {
            return Err(LineError::ExtraField {
                expected: "src dst",
                extra: excerpt(extra),
            });
        }
        raw.push((parse_id(a, "src")?, parse_id(b, "dst")?));
        Ok(())
    })?;
    Ok(dense(raw))
}

/// Dense ids in ascending original order; duplicate edges once.
fn dense(raw: Vec<(u64, u64)>) -> EdgeList {
    let mut ids: Vec<u64> = raw.iter().flat_map(|&(a, b)| [a, b]).collect();
    ids.sort_unstable();
    ids.dedup();
    let index: HashMap<u64, u32> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, i as u32))
        .collect();
    let mut edges: Vec<(u32, u32)> = raw.iter().map(|(a, b)| (index[a], index[b])).collect();
    edges.sort_unstable();
    edges.dedup();
    EdgeList { ids, edges }
}

/// Reads an edge-list file.
pub fn read_edge_list(path: &Path) -> Result<EdgeList, InputError> {
    parse_edge_list(path, open(path)?)
}

/// A generated graph: each of `nodes` nodes draws `edges_per_node` targets uniformly (seeded,
/// deterministic); duplicates count once, drawn self-loops are kept. Ids are `0..nodes`.
pub fn generate_graph(
    nodes: usize,
    edges_per_node: usize,
    seed: u64,
) -> Result<EdgeList, InputError> {
    if nodes == 0 || nodes > u32::MAX as usize {
        return Err(InputError::BadParameter {
            name: "--nodes",
            value: nodes.to_string(),
            reason: "must be 1 ..= 4294967295",
        });
    }
    if edges_per_node > 1024 {
        return Err(InputError::BadParameter {
            name: "--edges-per-node",
            value: edges_per_node.to_string(),
            reason: "must be at most 1024",
        });
    }
    let mut rng = SplitMix64::new(seed);
    let mut edges = Vec::with_capacity(nodes * edges_per_node);
    for u in 0..nodes as u32 {
        for _ in 0..edges_per_node {
            edges.push((u, rng.below(nodes as u64) as u32));
        }
    }
    edges.sort_unstable();
    edges.dedup();
    Ok(EdgeList {
        ids: (0..nodes as u64).collect(),
        edges,
    })
}

/// One sensor reading in input order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SensorReading {
    /// Sensor id as given.
    pub sensor: u64,
    /// The value.
    pub value: f64,
}

/// Parses readings (`sensor,value` per line) from `r`.
pub fn parse_readings(path: &Path, r: impl BufRead) -> Result<Vec<SensorReading>, InputError> {
    let mut out = Vec::new();
    for_each_line(path, r, |line_no, line| {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            return Ok(());
        }
        if line_no == 1 && t.replace(' ', "").eq_ignore_ascii_case("sensor,value") {
            return Ok(());
        }
        let mut f = t.split(',');
        let (Some(s), Some(v), None) = (f.next(), f.next(), f.next()) else {
            return Err(LineError::Fields {
                expected: "sensor,value",
                got: excerpt(t),
            });
        };
        let sensor = parse_id(s.trim(), "sensor")?;
        let value: f64 = v.trim().parse().map_err(|_| LineError::NotANumber {
            value: excerpt(v.trim()),
        })?;
        if !value.is_finite() {
            return Err(LineError::NotFinite {
                value: excerpt(v.trim()),
            });
        }
        out.push(SensorReading { sensor, value });
        Ok(())
    })?;
    Ok(out)
}

/// Reads a readings CSV file.
pub fn read_readings(path: &Path) -> Result<Vec<SensorReading>, InputError> {
    parse_readings(path, open(path)?)
}

/// A generated stream: `count` readings round-robin-free (sensor drawn uniformly from
/// `0..sensors`), each sensor normal around its own base (mean `50 + 10 * k`, sd 1..3); every
/// `spike_every`-th reading (once its sensor has 200 readings) is a spike of +25 sd. Returns the
/// readings and the indices of the injected spikes.
pub fn generate_readings(
    count: usize,
    sensors: usize,
    spike_every: usize,
    seed: u64,
) -> Result<(Vec<SensorReading>, Vec<usize>), InputError> {
    if count == 0 {
        return Err(InputError::BadParameter {
            name: "--readings",
            value: count.to_string(),
            reason: "must be at least 1",
        });
    }
    if sensors == 0 || sensors > u32::MAX as usize {
        return Err(InputError::BadParameter {
            name: "--sensors",
            value: sensors.to_string(),
            reason: "must be 1 ..= 4294967295",
        });
    }
    let mut rng = SplitMix64::new(seed);
    let base: Vec<(f64, f64)> = (0..sensors)
        .map(|_| (50.0 + 10.0 * rng.normal(), 1.0 + 2.0 * rng.unit()))
        .collect();
    let mut seen = vec![0u32; sensors];
    let mut out = Vec::with_capacity(count);
    let mut spikes = Vec::new();
    for i in 0..count {
        let s = rng.below(sensors as u64) as usize;
        let (m, sd) = base[s];
        let mut value = m + sd * rng.normal();
        if spike_every > 0 && i % spike_every == spike_every - 1 && seen[s] >= 200 {
            value = m + 25.0 * sd;
            spikes.push(i);
        }
        seen[s] += 1;
        out.push(SensorReading {
            sensor: s as u64,
            value,
        });
    }
    Ok((out, spikes))
}
