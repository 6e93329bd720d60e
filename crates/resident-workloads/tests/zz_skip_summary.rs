//! The skip summary: one line per optional capability this machine lacks, naming the reason and
//! the fix, written straight to the terminal so that `cargo test --workspace` shows it without
//! `--nocapture`.
//!
//! Tests that need a GPU, NVRTC, g++ (CudaSim), libtsan, a wgpu adapter or nats-server print
//! `SKIP: ...` and pass when it is missing; that output is captured by the test harness and
//! invisible in a passing run. Those tests run in many binaries of several crates, so instead of
//! collecting their lines this test probes the same capabilities the way they do and reports each
//! missing one. It lives in the crate the workspace tests last (`resident-workloads`) under the
//! name that sorts last, so its lines come after every crate's unit and integration tests (only
//! the doc-tests follow). Under `RESIDENT_REQUIRE_<CAP>=1`, as CI sets them, a missing capability
//! fails this test as it fails the tests that need it.

use std::io::Write;
use std::process::Command;

use resident::backend::{probe, BackendKind};

struct Missing {
    capability: &'static str,
    require: &'static str,
    reason: String,
    fix: &'static str,
}

fn nats_server() -> bool {
    let mut dirs: Vec<std::path::PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/usr/local/bin"].map(Into::into));
    dirs.iter().any(|d| d.join("nats-server").is_file())
}

/// Whether the host compiler links a ThreadSanitizer program (what the TSan tests build).
fn tsan() -> Result<(), String> {
    let (cxx, _) = resident::cuda::sim::compiler().map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!("resident-skip-summary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("probe.cpp");
    std::fs::write(&src, "int main() { return 0; }\n").map_err(|e| e.to_string())?;
    let out = Command::new(&cxx)
        .args(["-fsanitize=thread", "-o"])
        .arg(dir.join("probe"))
        .arg(&src)
        .output()
        .map_err(|e| e.to_string());
    let _ = std::fs::remove_dir_all(&dir);
    let out = out?;
    if out.status.success() {
        Ok(())
    } else {
        let log = String::from_utf8_lossy(&out.stderr);
        Err(log
            .lines()
            .find(|l| l.contains("tsan"))
            .unwrap_or("link failed")
            .trim()
            .to_string())
    }
}

fn missing() -> Vec<Missing> {
    let mut m = Vec::new();
    let reports = probe();
    let of = |k: BackendKind| reports.iter().find(|r| r.backend == k);
    if let Some(reason) = of(BackendKind::Cuda).and_then(|r| r.unavailable.clone()) {
        m.push(Missing {
            capability: "CUDA GPU",
            require: "RESIDENT_REQUIRE_GPU",
            reason,
            fix:
                "an NVIDIA GPU and driver; scripts/gpu-run.sh runs the GPU suite on such a machine",
        });
    }
    if !resident::cuda::nvrtc_present() {
        m.push(Missing {
            capability: "NVRTC",
            require: "RESIDENT_REQUIRE_NVRTC",
            reason: "libnvrtc cannot be loaded".into(),
            fix: "eval \"$(bash scripts/setup-nvrtc.sh --env)\" (NVRTC from PyPI) or scripts/setup.sh",
        });
    }
    match resident::cuda::sim::compiler() {
        Err(e) => m.push(Missing {
            capability: "CudaSim",
            require: "RESIDENT_REQUIRE_CUDASIM",
            reason: e.to_string(),
            fix: "apt-get install g++ (or set RESIDENT_SIM_CXX), or scripts/setup.sh",
        }),
        Ok(_) => {
            if let Err(reason) = tsan() {
                m.push(Missing {
                    capability: "ThreadSanitizer",
                    require: "RESIDENT_REQUIRE_TSAN",
                    reason,
                    fix: "apt-get install libtsan2, or scripts/setup.sh",
                });
            }
        }
    }
    if let Some(reason) = of(BackendKind::Wgpu).and_then(|r| r.unavailable.clone()) {
        m.push(Missing {
            capability: "wgpu adapter",
            require: "RESIDENT_REQUIRE_WGPU",
            reason,
            fix: "apt-get install mesa-vulkan-drivers libvulkan1 (lavapipe), or scripts/setup.sh",
        });
    }
    if !nats_server() {
        m.push(Missing {
            capability: "nats-server",
            require: "RESIDENT_REQUIRE_NATS",
            reason: "not found on PATH or in /usr/sbin".into(),
            fix: "apt-get install nats-server, or scripts/setup.sh",
        });
    }
    m
}

#[test]
fn skip_summary() {
    let missing = missing();
    // Straight to the terminal: the harness captures print!, not writes to the stderr handle.
    let mut out = std::io::stderr().lock();
    if missing.is_empty() {
        let _ = writeln!(
            out,
            "\nskip summary: every optional capability is present; no test skipped for want of one"
        );
    } else {
        let _ = writeln!(
            out,
            "\nskip summary: {} optional {} missing; the tests that need {} printed SKIP: and passed",
            missing.len(),
            if missing.len() == 1 { "capability" } else { "capabilities" },
            if missing.len() == 1 { "it" } else { "them" }
        );
        for m in &missing {
            let reason: String = m.reason.chars().take(160).collect();
            let _ = writeln!(
                out,
                "  SKIPPED {}: {reason}\n      fix: {}",
                m.capability, m.fix
            );
        }
    }
    let _ = out.flush();
    let required: Vec<_> = missing
        .iter()
        .filter(|m| std::env::var(m.require).as_deref() == Ok("1"))
        .map(|m| format!("{} (={} but {})", m.capability, m.require, m.reason))
        .collect();
    assert!(
        required.is_empty(),
        "required capabilities missing: {required:?}"
    );
}
