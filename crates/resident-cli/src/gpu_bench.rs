//! GPU benchmarks (need a CUDA device; say so plainly without one):
//! * `resident bench-transfer`: pinned vs pageable H2D/D2H, 1 KiB..256 MiB, against a plain
//!   `cuMemcpy` baseline in the same run -> `bench/results/transfer-<device>-<date>.json`;
//! * `resident bench-ring`: persistent ring kernel vs launch-per-batch vs CUDA graph, round
//!   trip at 1 in flight and throughput with many in flight, 16/64/256 B payloads ->
//!   `bench/results/ring-<device>-<date>.json`.

use std::path::Path;

use serde_json::json;

fn slug(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s.split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

fn write(dir: &Path, file: String, text: &str) -> Result<(), String> {
    // The folder must exist: the user names it (`--out-dir`); nothing is created for them.
    let path = dir.join(file);
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

pub fn transfer(iterations: u32, out_dir: &Path) -> Result<(), String> {
    let report = resident::cuda::bench::transfer(
        0,
        &resident::cuda::bench::default_sizes(),
        iterations,
        &command_line(),
    )
    .map_err(|e| format!("the transfer benchmark needs a CUDA device: {e}"))?;
    for r in &report.results {
        println!("{r:?}");
    }
    write(
        out_dir,
        format!("transfer-{}-{}.json", slug(&report.device), report.date),
        &report.to_json(),
    )
}

pub fn ring(iters: usize, in_flight: usize, out_dir: &Path) -> Result<(), String> {
    let device = resident::cuda::device_info(0)
        .map_err(|e| format!("the ring benchmark needs a CUDA device: {e}"))?;
    let rows =
        resident::cuda::persistent::bench_ring(0, iters, in_flight).map_err(|e| e.to_string())?;
    let date = resident::cuda::bench::utc_date(std::time::SystemTime::now());
    let results: Vec<_> = rows
        .iter()
        .map(|r| {
            println!(
                "{:<20} {:>4} B in_flight {:>6}: p50 {:>8} ns p99 {:>8} ns p99.9 {:>8} ns {:>12.0} msg/s",
                r.variant, r.payload_bytes, r.in_flight, r.p50_ns, r.p99_ns, r.p999_ns, r.msgs_per_s
            );
            json!({"variant": r.variant, "payload_bytes": r.payload_bytes, "in_flight": r.in_flight,
                   "p50_ns": r.p50_ns, "p99_ns": r.p99_ns, "p999_ns": r.p999_ns, "msgs_per_s": r.msgs_per_s,
                   "block_threads": r.block_threads, "measures": r.measures})
        })
        .collect();
    // Rows of the same in_flight measure the same quantity for every variant ("measures");
    // launch_per_batch and graph launch ceil(n / block_threads) blocks.
    let doc = json!({"device": device.name, "date": date, "command": command_line(),
                     "measures": {"latency": resident::cuda::persistent::MEASURES_MESSAGE,
                                  "batch": resident::cuda::persistent::MEASURES_BATCH,
                                  "persistent_streaming": resident::cuda::persistent::MEASURES_STREAMING},
                     "results": results});
    write(
        out_dir,
        format!("ring-{}-{}.json", slug(&device.name), date),
        &serde_json::to_string_pretty(&doc).expect("json"),
    )
}
