//! The `resident` binary end to end: workload demos with input files (good and hostile),
//! output files, backend errors, and `bench workloads --quick` writing JSON and pictures.

use std::path::PathBuf;
use std::process::{Command, Output};

fn resident(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_resident"))
        .args(args)
        .output()
        .expect("run resident")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("resident-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn pagerank_writes_every_rank_with_original_ids_equal_to_networkx() {
    let d = tmp("pr");
    let g = d.join("g.txt");
    std::fs::write(&g, "# nx.DiGraph([(1,2),(2,3),(3,1),(3,4),(5,5),(1,2)])\n10 20\n20 30\n30 10\n30 40\n50 50\n10 20\n").unwrap();
    let out = d.join("ranks.txt");
    let o = resident(&[
        "demo",
        "pagerank",
        "--graph",
        g.to_str().unwrap(),
        "--ranks-out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let nx = [
        (10, 0.1376618146958882),
        (20, 0.17041553103813492),
        (30, 0.19825629079831525),
        (40, 0.1376618146958882),
        (50, 0.3560045487717735),
    ];
    let lines: Vec<(u64, f64)> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| {
            let mut f = l.split(' ');
            (
                f.next().unwrap().parse().unwrap(),
                f.next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(lines.len(), 5);
    for ((id, r), (nid, nr)) in lines.iter().zip(nx) {
        assert_eq!(*id, nid);
        assert!((r - nr).abs() <= 1e-9 * nr, "{id}: {r} vs networkx {nr}");
    }
    // Streaming mode on a generated graph also writes ranks.
    let out2 = d.join("ranks2.txt");
    let o = resident(&[
        "demo",
        "pagerank",
        "--nodes",
        "500",
        "--edges-per-node",
        "3",
        "--seed",
        "4",
        "--stream",
        "--batches",
        "3",
        "--updates-per-batch",
        "20",
        "--ranks-out",
        out2.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&out2).unwrap().lines().count(), 500);
}

#[test]
fn anomaly_writes_alerts_with_input_positions() {
    let d = tmp("an");
    let csv = d.join("r.csv");
    let mut s = String::from("sensor,value\n");
    for i in 0..150 {
        s.push_str(&format!("9,{}\n", if i % 2 == 0 { 10.0 } else { 12.0 }));
        s.push_str(&format!("1000000,{}\n", 5.0 + (i % 3) as f64));
    }
    s.push_str("9,60\n"); // position 300: an anomaly of sensor 9
    std::fs::write(&csv, s).unwrap();
    let out = d.join("alerts.csv");
    for extra in [
        &[][..],
        &["--stateless"][..],
        &["--in-flight", "1", "--micro-batch", "7"][..],
    ] {
        let mut args = vec![
            "demo",
            "anomaly",
            "--input",
            csv.to_str().unwrap(),
            "--alerts-out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = resident(&args);
        assert!(o.status.success(), "{}", text(&o));
        let alerts = std::fs::read_to_string(&out).unwrap();
        let lines: Vec<&str> = alerts.lines().collect();
        assert_eq!(lines.len(), 1, "{alerts}");
        let f: Vec<&str> = lines[0].split(',').collect();
        assert_eq!((f[0], f[1], f[2]), ("300", "9", "60"));
        assert!(f[3].parse::<f64>().unwrap() > 4.0);
    }
}

#[test]
fn hostile_inputs_fail_with_the_line_number_and_a_non_zero_exit() {
    let d = tmp("bad");
    let g = d.join("g.txt");
    std::fs::write(&g, "1 2\n2 3\n3 x\n").unwrap();
    let o = resident(&["demo", "pagerank", "--graph", g.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("g.txt:3:"), "{}", text(&o));
    let csv = d.join("r.csv");
    std::fs::write(&csv, "1,2\n2,nan\n").unwrap();
    let o = resident(&["demo", "anomaly", "--input", csv.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("r.csv:2:"), "{}", text(&o));
    let o = resident(&[
        "demo",
        "anomaly",
        "--input",
        d.join("missing.csv").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("cannot read"), "{}", text(&o));
}

#[test]
fn unwritable_outputs_fail_and_no_directory_is_created() {
    let d = tmp("nowrite");
    let missing = d.join("not-here");
    let out = missing.join("ranks.txt");
    let o = resident(&[
        "demo",
        "pagerank",
        "--nodes",
        "50",
        "--ranks-out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("cannot write"), "{}", text(&o));
    assert!(!missing.exists());
    let out = missing.join("alerts.csv");
    let o = resident(&[
        "demo",
        "anomaly",
        "--readings",
        "2000",
        "--sensors",
        "5",
        "--alerts-out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(!missing.exists());
    let o = resident(&[
        "bench",
        "workloads",
        "--quick",
        "--out-dir",
        missing.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(!missing.exists());
}

#[test]
fn unknown_or_absent_backends_are_clear_errors() {
    let o = resident(&["demo", "vector-add", "--n", "100", "--backend", "bogus"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("possible values"), "{}", text(&o));
    // A backend runs the demo (checked against the reference) or says it is not available;
    // CI requires CudaSim and wgpu to be there.
    for (b, require) in [
        ("wgpu", "RESIDENT_REQUIRE_WGPU"),
        ("cuda-sim", "RESIDENT_REQUIRE_CUDASIM"),
        ("cuda", "RESIDENT_REQUIRE_GPU"),
    ] {
        let o = resident(&["demo", "pipeline", "--n", "100", "--backend", b]);
        if std::env::var(require).as_deref() == Ok("1") {
            assert!(o.status.success(), "{b}: {}", text(&o));
        } else if !o.status.success() {
            assert!(text(&o).contains("not available"), "{}", text(&o));
        }
    }
}

#[test]
fn small_demos_run_and_check_themselves() {
    for args in [
        &["demo", "vector-add", "--n", "100000", "--chunk", "999"][..],
        &["demo", "pipeline", "--n", "20000"][..],
        &["demo", "anomaly", "--readings", "50000", "--sensors", "20"][..],
        &[
            "demo",
            "pagerank",
            "--nodes",
            "2000",
            "--edges-per-node",
            "4",
        ][..],
        &["demo", "sensors", "--messages", "20000"][..],
        &["demo", "--messages", "20000"][..],
    ] {
        let o = resident(args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    }
}

#[test]
fn bench_workloads_quick_writes_json_and_pictures() {
    let d = tmp("bench");
    let o = resident(&[
        "bench",
        "workloads",
        "--quick",
        "--repeats",
        "1",
        "--backends",
        "cpu,wgpu",
        "--out-dir",
        d.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("workloads-quick.json")).unwrap())
            .unwrap();
    assert_eq!(j["backends"][0]["backend"], "cpu");
    assert_eq!(j["backends"][0]["anomaly"].as_array().unwrap().len(), 3);
    // The JSON says which sizes a quick run used, and the parts' times.
    assert_eq!(j["quick"], true);
    assert_eq!(j["sizes"]["nodes"], 5000);
    assert_eq!(j["sizes"]["readings"], 20_000);
    assert_eq!(j["sizes"]["cudasim_readings"], 2000);
    assert_eq!(j["pagerank_graph"]["nodes"], 5000);
    assert!(j["backends"][0]["seconds"]["anomaly"].as_f64().unwrap() > 0.0);
    assert!(text(&o).contains("(quick sizes)"), "{}", text(&o));
    // wgpu (lavapipe in CI) is measured when present, listed as absent otherwise.
    if j["backends"].as_array().unwrap().len() == 2 {
        assert_eq!(j["backends"][1]["backend"], "wgpu");
        assert_eq!(j["backends"][1]["anomaly"].as_array().unwrap().len(), 3);
    } else {
        assert!(std::env::var("RESIDENT_REQUIRE_WGPU").as_deref() != Ok("1"));
        assert_eq!(j["absent_backends"][0]["backend"], "wgpu");
    }
    for name in ["latency", "throughput", "actor-vs-stateless"] {
        for ext in ["svg", "png"] {
            let p = d.join(format!("workloads-quick-{name}.{ext}"));
            assert!(
                std::fs::metadata(&p)
                    .map(|m| m.len() > 1000)
                    .unwrap_or(false),
                "{}",
                p.display()
            );
        }
    }
}

#[test]
fn bench_deadlines_writes_json_whose_counts_add_up() {
    let d = tmp("deadlines");
    let out = d.join("deadlines.json");
    let o = resident(&[
        "bench",
        "deadlines",
        "--calls",
        "60",
        "--repeats",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(j["command"]
        .as_str()
        .unwrap()
        .contains("bench deadlines --calls 60"));
    assert_eq!(j["params"]["calls"], 60);
    let (before, after) = (&j["runs"]["before"][0], &j["runs"]["after"][0]);
    for r in [before, after] {
        let n = |k: &str| r[k].as_u64().unwrap();
        assert_eq!(n("accepted"), 61, "the storm and the fresh call: {r}");
        assert_eq!(n("handled") + n("expired"), 61, "{r}");
        assert_eq!(n("calls_served_in_time") + n("calls_timed_out"), 60, "{r}");
        assert!(r["fresh_call_s"].as_f64().unwrap() > 0.0);
    }
    // With the check off nothing expires: every timed-out call is still handled.
    assert_eq!(before["expired"], 0);
    assert!(j["summary"]["fresh_call_before_over_after_median"].is_f64());
    // A folder that does not exist fails before anything is measured.
    let missing = d.join("not-here").join("x.json");
    let o = resident(&["bench", "deadlines", "--out", missing.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("does not exist"), "{}", text(&o));
}
