//! `resident info [--json]`: the engines compiled into this build (cargo features of
//! `resident`), the backends this machine has, their devices, and, for a missing backend, why
//! it is missing. Always exits 0: an absent GPU is information, not failure.

use resident::backend::{self, BackendReport, DeviceInfo};
use serde_json::{json, Value};
use std::process::ExitCode;

fn device_json(d: &DeviceInfo) -> Value {
    json!({
        "ordinal": d.ordinal,
        "name": d.name,
        "compute_units": d.compute_units,
        "total_memory": d.total_memory,
        "max_threads_per_block": d.max_threads_per_block,
        "compute_capability": d.compute_capability.map(|(a, b)| format!("{a}.{b}")),
        "shared_memory_per_block": d.shared_memory_per_block,
        "shared_memory_per_sm": d.shared_memory_per_sm,
        "can_map_host_memory": d.can_map_host_memory,
        "driver_version": d.driver_version.map(|(a, b)| format!("{a}.{b}")),
    })
}

fn adapter_json(a: &backend::wgpu::AdapterProperties) -> Value {
    json!({
        "ordinal": a.ordinal,
        "name": a.name,
        "api": a.api,
        "device_type": a.kind.to_string(),
        "software": !a.kind.is_hardware(),
        "driver": a.driver,
        "max_buffer_size": a.max_buffer_size,
        "max_storage_buffer_binding_size": a.max_storage_buffer_binding_size,
        "max_compute_invocations_per_workgroup": a.max_compute_invocations_per_workgroup,
        "max_compute_workgroup_size": [a.max_compute_workgroup_size.0, a.max_compute_workgroup_size.1, a.max_compute_workgroup_size.2],
        "max_compute_workgroups_per_dimension": a.max_compute_workgroups_per_dimension,
        "max_storage_buffers_per_shader_stage": a.max_storage_buffers_per_shader_stage,
    })
}

fn report_json(r: &BackendReport) -> Value {
    if r.backend == backend::BackendKind::Wgpu {
        return json!({
            "backend": r.backend.to_string(),
            "available": r.unavailable.is_none(),
            "reason": r.unavailable,
            "adapters": backend::wgpu::adapters().iter().map(adapter_json).collect::<Vec<_>>(),
        });
    }
    json!({
        "backend": r.backend.to_string(),
        "available": r.unavailable.is_none(),
        "reason": r.unavailable,
        "nvrtc": r.nvrtc,
        "devices": r.devices.iter().map(device_json).collect::<Vec<_>>(),
    })
}

/// The engines compiled into this build, CPU first (`cpu`, `cuda`, `wgpu`, `cuda-sim`).
fn engines() -> Vec<String> {
    backend::compiled_in()
        .iter()
        .map(|k| k.to_string())
        .collect()
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

fn print_text(
    reports: &[BackendReport],
    telemetry: &Result<Vec<backend::DeviceTelemetry>, String>,
) {
    for r in reports {
        match &r.unavailable {
            None => println!("{}: available", r.backend),
            Some(why) => println!("{}: unavailable: {why}", r.backend),
        }
        if let Some(nvrtc) = r.nvrtc {
            println!(
                "  nvrtc: {}",
                if nvrtc {
                    "found"
                } else {
                    "not found (kernels cannot be compiled)"
                }
            );
        }
        if r.backend == backend::BackendKind::Wgpu {
            for a in backend::wgpu::adapters() {
                println!(
                    "  [{}] {} ({}, {}{})",
                    a.ordinal,
                    a.name,
                    a.api,
                    a.kind,
                    if a.kind.is_hardware() {
                        ""
                    } else {
                        ": runs on the CPU, never picked by Auto"
                    }
                );
                println!("      driver {}", a.driver);
                println!(
                    "      max buffer {}, max storage binding {}, {} storage buffers/stage",
                    mib(a.max_buffer_size),
                    mib(a.max_storage_buffer_binding_size),
                    a.max_storage_buffers_per_shader_stage
                );
                let (x, y, z) = a.max_compute_workgroup_size;
                println!(
                    "      workgroup up to {x}x{y}x{z}, {} invocations; {} workgroups/dimension",
                    a.max_compute_invocations_per_workgroup, a.max_compute_workgroups_per_dimension
                );
            }
            continue;
        }
        for d in &r.devices {
            println!("  [{}] {}", d.ordinal, d.name);
            if let Some((a, b)) = d.compute_capability {
                println!("      compute capability {a}.{b}, {} SMs", d.compute_units);
                println!("      memory {}", mib(d.total_memory));
                println!(
                    "      max threads/block {}, shared memory {} B/block, {} B/SM",
                    d.max_threads_per_block, d.shared_memory_per_block, d.shared_memory_per_sm
                );
                println!("      can map host memory: {}", d.can_map_host_memory);
            } else {
                println!("      {} worker threads", d.compute_units);
            }
            if let Some((a, b)) = d.driver_version {
                println!("      driver CUDA version {a}.{b}");
            }
        }
    }
    match telemetry {
        Ok(list) => {
            for t in list {
                let opt = |v: Option<u32>, unit: &str| {
                    v.map(|v| format!("{v}{unit}"))
                        .unwrap_or_else(|| "n/a".into())
                };
                println!(
                    "telemetry [{}]: gpu {} mem {} used {} of {}, {} , {}, sm {} mem {}",
                    t.index,
                    opt(t.gpu_utilization_pct, "%"),
                    opt(t.memory_utilization_pct, "%"),
                    t.memory_used.map(mib).unwrap_or_else(|| "n/a".into()),
                    t.memory_total.map(mib).unwrap_or_else(|| "n/a".into()),
                    opt(t.temperature_c, " C"),
                    opt(t.power_mw.map(|p| p / 1000), " W"),
                    opt(t.sm_clock_mhz, " MHz"),
                    opt(t.memory_clock_mhz, " MHz"),
                );
            }
        }
        Err(why) => println!("telemetry: unavailable: {why}"),
    }
}

/// Prints backends, devices and telemetry, as text or as one JSON object. Exit code 0.
#[allow(dead_code)] // wired to `resident info [--json]` in main.rs by the lead
pub fn run(json: bool) -> ExitCode {
    let reports = backend::probe();
    let telemetry = backend::device_telemetry().map_err(|e| e.to_string());
    if json {
        let tel = match &telemetry {
            Ok(list) => json!({
                "available": true,
                "devices": list.iter().map(|t| json!({
                    "index": t.index,
                    "name": t.name,
                    "gpu_utilization_pct": t.gpu_utilization_pct,
                    "memory_utilization_pct": t.memory_utilization_pct,
                    "memory_used": t.memory_used,
                    "memory_total": t.memory_total,
                    "temperature_c": t.temperature_c,
                    "power_mw": t.power_mw,
                    "sm_clock_mhz": t.sm_clock_mhz,
                    "memory_clock_mhz": t.memory_clock_mhz,
                })).collect::<Vec<_>>(),
            }),
            Err(why) => json!({ "available": false, "reason": why }),
        };
        let out = json!({
            "version": env!("CARGO_PKG_VERSION"),
            "engines": engines(),
            "backends": reports.iter().map(report_json).collect::<Vec<_>>(),
            "telemetry": tel,
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        println!("engines compiled in: {}", engines().join(", "));
        print_text(&reports, &telemetry);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_names_every_backend_and_why() {
        let reports = backend::probe();
        let v: Vec<Value> = reports.iter().map(report_json).collect();
        assert_eq!(v[0]["backend"], "cpu");
        assert_eq!(v[0]["available"], true);
        assert_eq!(v[1]["backend"], "cuda");
        let available = v[1]["available"].as_bool().unwrap();
        assert_eq!(available, v[1]["reason"].is_null());
        // The CLI builds `resident` with its default features: every engine is compiled in.
        assert_eq!(engines(), ["cpu", "cuda", "wgpu", "cuda-sim"]);
        assert_eq!(run(true), ExitCode::SUCCESS);
        assert_eq!(run(false), ExitCode::SUCCESS);
    }
}
