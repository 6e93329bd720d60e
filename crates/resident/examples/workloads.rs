//! The four reference workloads on the backend named on the command line, each checked against
//! its sequential f64 reference at the backend's precision (`resident::guide::workloads`).
//! Sizes are small so that CudaSim (a simulator) finishes in seconds.

mod common;

use resident::backend;
use resident_workloads::{anomaly, input, pagerank, pipeline, vector_add, Precision};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = common::runtime();
    let device = backend::open(rt.backend())?;
    let precision = Precision::of(device.kind());
    let t = std::time::Instant::now();

    let (a, b) = vector_add::inputs(20_000, 7);
    let sum = vector_add::run(&rt, &device, &a, &b, 4_096)?;
    vector_add::check(&a, &b, &sum.c)?;
    println!("vector add, 20 000 elements: checked ({:?})", sum.elapsed);

    let graph = input::generate_graph(500, 4, 1)?;
    let params = pagerank::Params::default();
    let ranks = pagerank::run_full(&rt, &device, &graph, params)?;
    pagerank::check_full_with(&ranks, &pagerank::reference(&graph, params)?, precision)?;
    println!(
        "PageRank, 500 nodes: {} iterations, checked",
        ranks.iterations
    );

    let values: Vec<f64> = (0..500).map(|i| i as f64 * 0.37).collect();
    let scored = pipeline::run(&rt, &values, |_| {})?;
    pipeline::check_with(&scored.scored, &values, precision)?;
    println!("pipeline, 500 readings: checked");

    let (readings, _) = input::generate_readings(3_000, 10, 251, 3)?;
    let slotted = anomaly::slot(&readings);
    let report = anomaly::run_actor(&rt, &device, &slotted, 100, 4, |_| {})?;
    anomaly::check_with(&report, &slotted, precision)?;
    println!(
        "anomaly, 3 000 readings: {} alerts, checked",
        report.alerts.len()
    );
    println!("all four in {:.1?}", t.elapsed());
    Ok(())
}
