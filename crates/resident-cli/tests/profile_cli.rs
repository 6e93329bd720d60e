//! `resident profile` end to end: each constructed case is named correctly on the CPU backend,
//! the report's fractions sum to 1, the trace file is valid Chrome trace JSON, and `--tune`
//! recommends a setting and says no device was measured when none is present.

use std::process::Command;

fn resident(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_resident"))
        .args(args)
        .output()
        .expect("run resident");
    assert!(
        out.status.success(),
        "resident {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "resident {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn check_case(demo: &str, want: &str) {
    let v = resident(&["profile", demo, "--json"]);
    let sum: f64 = v["fractions"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap())
        .sum();
    assert!((sum - 1.0).abs() < 1e-9, "{demo}: fractions sum to {sum}");
    assert_eq!(
        v["bottleneck"], want,
        "{demo} named {} with fractions {}",
        v["bottleneck"], v["fractions"]
    );
    assert!(v["remedy"].as_str().unwrap().len() > 40);
    assert!(v["figures"]["messages"].as_u64().unwrap() > 0);
}

// One test runs the cases one after another, so they do not compete for the CPU.
#[test]
fn constructed_cases_are_named_correctly() {
    check_case("launch-bound", "launch");
    check_case("transfer-bound", "transfer");
    check_case("handler-bound", "handler");
    check_case("queue-bound", "queue");
    check_case("utilization-bound", "utilization");
}

#[test]
fn pipeline_writes_a_trace_with_its_three_kernels() {
    let path = std::env::temp_dir().join(format!("resident-cli-trace-{}.json", std::process::id()));
    let v = resident(&[
        "profile",
        "pipeline",
        "--json",
        "--messages",
        "20000",
        "--trace",
        path.to_str().unwrap(),
    ]);
    assert!(v["figures"]["messages"].as_u64().unwrap() >= 20_000);
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let names: Vec<&str> = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    for k in ["kernel ingest", "kernel detect", "kernel alert"] {
        assert!(names.contains(&k), "{k} missing from {names:?}");
    }
}

#[test]
fn tune_recommends_and_says_what_was_compared() {
    let v = resident(&[
        "profile",
        "utilization-bound",
        "--tune",
        "--p99-target",
        "1s",
        "--messages",
        "2000",
        "--json",
    ]);
    let points = v["points"].as_array().unwrap();
    assert_eq!(
        points.len(),
        16 * v["backends_measured"].as_array().unwrap().len()
    );
    let rec = &v["recommended"];
    assert!(rec.is_object(), "a 1 s target is met by some setting");
    let best = points
        .iter()
        .filter(|p| p["meets_target"] == true && p["backend"] == rec["backend"])
        .map(|p| p["throughput_per_s"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(rec["throughput_per_s"].as_f64().unwrap(), best);
    let verdict = v["verdict"].as_str().unwrap();
    if v["backends_measured"].as_array().unwrap().len() == 1 {
        assert!(
            verdict.contains("No device backend was present"),
            "{verdict}"
        );
    }
    // A malformed target is a clear error, not a panic.
    let out = Command::new(env!("CARGO_BIN_EXE_resident"))
        .args(["profile", "queue-bound", "--tune", "--p99-target", "fast"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--p99-target"));
}
