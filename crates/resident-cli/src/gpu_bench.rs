//! GPU benchmarks (need a CUDA device; say so plainly without one):
//! * `resident bench-transfer`: pinned vs pageable H2D/D2H, 1 KiB..256 MiB, against a plain
//!   `cuMemcpy` baseline in the same run -> `bench/results/transfer-<device>-<date>.json`;
//! * `resident bench-ring`: persistent ring kernel vs launch-per-batch vs CUDA graph, round
//!   trip at 1 in flight and throughput with many in flight, 16/64/256 B payloads, with
//!   CudaSim's bus figures of the same kernel beside them ->
//!   `bench/results/ring-<device>-<date>.json`; `--model` runs the bus model alone (no GPU) ->
//!   `bench/results/ring-bus-model-<date>.json`.

use std::path::Path;

use resident_bench::provenance::{command, slug, today};

fn write(dir: &Path, file: String, text: &str) -> Result<(), String> {
    // The folder must exist: the user names it (`--out-dir`); nothing is created for them.
    let path = dir.join(file);
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

pub fn transfer(iterations: u32, out_dir: &Path) -> Result<(), String> {
    let report = resident_bench::transfer::transfer(
        0,
        &resident_bench::transfer::default_sizes(),
        iterations,
        &command(),
    )
    .map_err(|e| format!("the transfer benchmark needs a CUDA device: {e}"))?;
    for r in &report.results {
        println!("{r:?}");
    }
    write(
        out_dir,
        format!("transfer-{}-{}.json", slug(&report.device, 8), report.date),
        &serde_json::to_string_pretty(&report.to_json()).expect("json"),
    )
}

pub fn ring(iters: usize, in_flight: &[usize], model: bool, out_dir: &Path) -> Result<(), String> {
    let device = resident::cuda::device_info(0)
        .map_err(|e| format!("the ring benchmark needs a CUDA device: {e}"))?;
    let rows =
        resident_bench::ring_gpu::bench_ring(0, iters, in_flight).map_err(|e| e.to_string())?;
    for r in &rows {
        let send = r
            .host_send_ns_per_msg
            .map(|ns| format!("  host send {ns:.1} ns/msg"))
            .unwrap_or_default();
        println!(
            "{:<20} {:>4} B in_flight {:>6}: p50 {:>8} ns p99 {:>8} ns p99.9 {:>8} ns {:>12.0} msg/s{send}",
            r.variant, r.payload_bytes, r.in_flight, r.p50_ns, r.p99_ns, r.p999_ns, r.msgs_per_s
        );
    }
    let date = today();
    let mut doc = resident_bench::ring_gpu::to_json(&device.name, &date, &command(), &rows);
    // The bus model of the same kernel beside the times (CudaSim: needs g++; its absence is
    // said in the file, not fatal).
    if model {
        doc["bus_model"] = match model_rows() {
            Ok(rows) => {
                // Each measured row gets the model's estimate of it beside it.
                resident_bench::ring_bus::attach_estimates(&mut doc["results"], &rows);
                serde_json::json!({"means": resident_bench::ring_bus::MODEL_MEANS,
                                   "rows": resident_bench::ring_bus::rows_json(&rows)})
            }
            Err(e) => serde_json::json!({"error": e}),
        };
    }
    write(
        out_dir,
        format!("ring-{}-{}.json", slug(&device.name, 8), date),
        &serde_json::to_string_pretty(&doc).expect("json"),
    )
}

fn model_rows() -> Result<Vec<resident_bench::ring_bus::BusRow>, String> {
    let rows = resident_bench::ring_bus::bus_model(&Default::default())
        .map_err(|e| format!("CudaSim's bus model did not run: {e}"))?;
    for r in &rows {
        println!("{}", resident_bench::ring_bus::row_line(r));
    }
    Ok(rows)
}

/// `resident bench-ring --model`: CudaSim's bus figures alone (no GPU) ->
/// `bench/results/ring-bus-model-<date>.json`.
pub fn ring_model(out_dir: &Path) -> Result<(), String> {
    let rows = model_rows()?;
    // The figures the model must show (CI runs this): fail when one is missed.
    let missed = resident_bench::ring_bus::missed_targets(&rows);
    if !missed.is_empty() {
        return Err(format!(
            "the bus model misses its targets: {}",
            missed.join("; ")
        ));
    }
    println!("model targets met: at 4096 in flight the auto path reads at most 8 B per message over the bus and copies the payload; at 1 in flight one dependent read, nothing copied");
    let date = today();
    let doc = serde_json::json!({"device": "CudaSim bus model", "date": date, "command": command(),
                                 "means": resident_bench::ring_bus::MODEL_MEANS,
                                 "rows": resident_bench::ring_bus::rows_json(&rows)});
    write(
        out_dir,
        format!("ring-bus-model-{date}.json"),
        &serde_json::to_string_pretty(&doc).expect("json"),
    )
}

/// `resident bench-ring --sweep`: the persistent kernel's round trip at one message in flight by
/// block size and idle backoff -> `bench/results/ring-sweep-<device>-<date>.json`.
pub fn ring_sweep(iters: usize, out_dir: &Path) -> Result<(), String> {
    let device = resident::cuda::device_info(0)
        .map_err(|e| format!("the ring benchmark needs a CUDA device: {e}"))?;
    let rows = resident_bench::ring_gpu::latency_sweep(0, iters).map_err(|e| e.to_string())?;
    for r in &rows {
        println!(
            "persistent 64 B in_flight 1, block {:>4}, max backoff {:>5} ns: p50 {:>7} ns p99 {:>7} ns min {:>7} ns",
            r.block_threads, r.max_backoff_ns, r.p50_ns, r.p99_ns, r.min_ns
        );
    }
    let date = today();
    write(
        out_dir,
        format!("ring-sweep-{}-{}.json", slug(&device.name, 8), date),
        &serde_json::to_string_pretty(&resident_bench::ring_gpu::sweep_json(
            &device.name,
            &date,
            &command(),
            &rows,
        ))
        .expect("json"),
    )
}
