//! `resident bench-wgpu`: a ring kernel with its state on the device against the same WGSL
//! handler run stateless, on one wgpu adapter in one run (the measuring is in
//! `resident_bench::wgpu_ring`); this prints the figures as they come and writes
//! `wgpu-<adapter>-<date>.json`.

use resident_bench::provenance::slug;

/// Runs the benchmark; writes `wgpu-<adapter>-<date>.json` under `out_dir`.
pub fn run(repeats: usize, quick: bool, out_dir: &std::path::Path) -> Result<(), String> {
    let report = resident_bench::wgpu_ring::run(
        &resident_bench::wgpu_ring::Options { repeats, quick },
        &mut |line| println!("{line}"),
    )
    .map_err(|e| e.to_string())?;
    std::fs::create_dir_all(out_dir).map_err(|e| e.to_string())?;
    let slug = slug(report["adapter"]["name"].as_str().unwrap_or_default(), 2);
    let date = report["date"].as_str().unwrap_or_default();
    let path = out_dir.join(format!("wgpu-{slug}-{date}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json"))
        .map_err(|e| e.to_string())?;
    println!("wrote {}", path.display());
    Ok(())
}
