//! The CLI fails (non-zero exit) when it cannot write its results, and creates no folder the
//! user did not ask for.

use std::process::Command;

fn resident() -> Command {
    Command::new(env!("CARGO_BIN_EXE_resident"))
}

#[test]
fn bench_to_a_missing_folder_fails_and_creates_nothing() {
    let dir = std::env::temp_dir().join(format!("resident-missing-{}", std::process::id()));
    let out = dir.join("sub").join("r.json");
    let o = resident()
        .args(["bench", "--quick", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success(), "exit must be non-zero");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("does not exist"), "{err}");
    assert!(!dir.exists(), "no folder is created");
}

#[test]
fn gpu_bench_to_a_missing_folder_fails_without_creating_it() {
    let dir = std::env::temp_dir().join(format!("resident-missing-gpu-{}", std::process::id()));
    let o = resident()
        .args(["bench-ring", "--iters", "10", "--out-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    // Without a GPU this fails anyway (typed refusal); either way nothing is created.
    assert!(!o.status.success());
    assert!(!dir.exists(), "no folder is created");
}
