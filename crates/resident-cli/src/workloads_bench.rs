//! `resident bench workloads`: the reference workloads at large sizes, each run checked against
//! its f64 reference, with the baselines of issue 11 measured in the same run, repeated, and
//! drawn (SVG and PNG).
//!
//! - anomaly: the actor (statistics resident in a bound buffer) vs the stateless batch
//!   (statistics uploaded, updated by a one-shot kernel and downloaded per micro-batch), on the
//!   same backend, micro-batches 100 / 500 / 1000;
//! - streaming PageRank: incremental refresh vs recompute from scratch per update batch;
//! - full PageRank on the large graph: seconds per backend.
//!
//! The measuring is `resident_bench::workloads`; here are the arguments, the progress bars,
//! the files and the pictures.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use clap::Args;
use indicatif::ProgressBar;
use plotters::coord::Shift;
use plotters::prelude::*;

use resident_bench::stats::median_or_nan as median;
use resident_bench::workloads::{AnomalyRow, BackendRun, Sizes};
use resident_workloads::anomaly;

use crate::workloads::{bar, BackendChoice, DemoError};

/// Options of `bench workloads`.
#[derive(Args, Debug)]
pub struct Options {
    /// Small sizes, about a minute on a 2-vCPU machine with CPU, CudaSim and lavapipe, every
    /// workload still checked against its reference on every backend (defaults below; a size
    /// flag you give overrides them); the committed results use the full defaults.
    #[arg(long)]
    pub quick: bool,
    /// Backends to measure (those not present are listed in the JSON with the reason).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![BackendChoice::Cpu, BackendChoice::CudaSim, BackendChoice::Wgpu, BackendChoice::Cuda])]
    pub backends: Vec<BackendChoice>,
    /// Repetitions of every measurement (the spread is reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Existing folder for the JSON and the pictures [default: bench/results in the
    /// repository, from any folder].
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// File name prefix of the JSON and the pictures [default: workloads (workloads-quick with
    /// --quick) in a folder you name with --out-dir; workloads-latest (workloads-quick-latest)
    /// in the default folder, names git ignores, so the committed results there are
    /// overwritten only when asked: --prefix workloads].
    #[arg(long)]
    pub prefix: Option<String>,
    /// PageRank graph nodes (edges: 5 per node drawn) [default: 1000000; 5000 with --quick].
    #[arg(long)]
    pub nodes: Option<usize>,
    /// PageRank's second, tight tolerance (the first is networkx's 1e-6).
    #[arg(long, default_value_t = 1e-9)]
    pub tight_tol: f64,
    /// Anomaly readings per run [default: 2000000; 20000 with --quick].
    #[arg(long)]
    pub readings: Option<usize>,
    /// Anomaly sensors [default: 10000; 1000 with --quick].
    #[arg(long)]
    pub sensors: Option<usize>,
    /// Anomaly readings per run on CudaSim (the first of the stream): CudaSim runs every CUDA
    /// thread as an OS thread with futex barriers, thousands of readings per second, so it is
    /// checked at this size; its speed says nothing about a GPU [default: 20000; 2000 with
    /// --quick].
    #[arg(long)]
    pub sim_readings: Option<usize>,
}

/// The sizes a run uses: the full defaults, or the quick ones; a flag given overrides either.
fn sizes(o: &Options) -> Sizes {
    let d = if o.quick { Sizes::QUICK } else { Sizes::FULL };
    Sizes {
        nodes: o.nodes.unwrap_or(d.nodes),
        readings: o.readings.unwrap_or(d.readings),
        sensors: o.sensors.unwrap_or(d.sensors),
        sim_readings: o.sim_readings.unwrap_or(d.sim_readings),
        sweep_sensors: d.sweep_sensors,
    }
}

/// The measuring's progress as bars on a terminal (hidden otherwise).
#[derive(Default)]
struct Bars(RefCell<Option<ProgressBar>>);

impl resident_bench::workloads::Progress for Bars {
    fn start(&self, len: u64, what: &str) {
        *self.0.borrow_mut() = Some(bar(len, what));
    }
    fn advance(&self, steps: u64) {
        if let Some(b) = self.0.borrow().as_ref() {
            b.inc(steps);
        }
    }
    fn finish(&self) {
        if let Some(b) = self.0.borrow_mut().take() {
            b.finish_and_clear();
        }
    }
}

pub fn run(o: &Options) -> Result<(), DemoError> {
    let out_dir = crate::paths::output(o.out_dir.clone(), "bench/results", "--out-dir")
        .map_err(DemoError::Usage)?;
    if !out_dir.is_dir() {
        return Err(DemoError::Usage(format!(
            "--out-dir {} is not an existing folder",
            out_dir.display()
        )));
    }
    let prefix = match (&o.prefix, o.quick) {
        (Some(p), _) if p.is_empty() || p.contains(['/', '\\']) => {
            return Err(DemoError::Usage(format!(
                "--prefix {p:?} must be a plain, non-empty file name prefix"
            )))
        }
        (Some(p), _) => p.clone(),
        (None, quick) => {
            let base = if quick {
                "workloads-quick"
            } else {
                "workloads"
            };
            match o.out_dir {
                Some(_) => base.to_string(),
                None => format!("{base}-latest"),
            }
        }
    };
    let options = resident_bench::workloads::Options {
        quick: o.quick,
        sizes: sizes(o),
        repeats: o.repeats,
        tight_tol: o.tight_tol,
    };
    let report = resident_bench::workloads::run(
        &options,
        &o.backends,
        |b| format!("{b:?}").to_lowercase(),
        BackendChoice::open,
        &Bars::default(),
        &mut |line| println!("{line}"),
    )
    .map_err(|e| DemoError::Bench(Box::new(e)))?;
    let json_path = out_dir.join(format!("{prefix}.json"));
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&report.json).expect("json"),
    )
    .map_err(|source| DemoError::Write {
        path: json_path.clone(),
        source,
    })?;
    println!("wrote {}", json_path.display());
    draw_all(&out_dir, &prefix, &report.runs, report.sensors)?;
    Ok(())
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

fn font_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // DejaVu Sans ships with the CLI so PNGs render the same offline on any machine.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            include_bytes!("../assets/DejaVuSans.ttf"),
        );
    });
}

/// A log-axis tick label only at 1, 2 and 5 x 10^k (plotters offers every minor tick, whose
/// labels collide at the top of a decade); compact figures.
fn log_tick(x: f64) -> String {
    if x.is_nan() || x <= 0.0 {
        return String::new();
    }
    let e = x.log10().floor();
    let m = x / 10f64.powf(e);
    if [1.0, 2.0, 5.0, 10.0]
        .iter()
        .all(|&k| (m - k).abs() > 0.02 * k)
    {
        return String::new();
    }
    match x {
        x if x >= 1e6 => format!("{}M", x / 1e6),
        x if x >= 1e3 => format!("{}k", x / 1e3),
        x if x >= 1.0 => format!("{x:.0}"),
        x => format!("{}", (x * 1e6).round() / 1e6),
    }
}

/// Points m x 10^k within `lo..=hi` for the mantissas `ms`: a log axis's labelled (1, 2, 5) or
/// grid (1..9) points. plotters' own log axis offers none below the first power of ten in
/// range, which left data between, say, 90 and 1000 us without a label.
fn log_points(lo: f64, hi: f64, ms: &[f64]) -> Vec<f64> {
    let mut v = Vec::new();
    if !(lo > 0.0 && hi >= lo && hi.is_finite()) {
        return v;
    }
    let mut e = lo.log10().floor() as i32;
    while 10f64.powi(e) <= hi {
        for &m in ms {
            let x = m * 10f64.powi(e);
            if x >= lo && x <= hi {
                v.push(x);
            }
        }
        e += 1;
    }
    v
}

/// One legend entry: a line (solid or dashed, of `width`) and its text, drawn at `(x, y)`
/// of a plain drawing area beside a chart, where it covers no data.
fn legend_entry<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    color: RGBColor,
    dashed: bool,
    width: u32,
    text: &str,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let style = color.stroke_width(width);
    if dashed {
        area.draw(&PathElement::new(vec![(x, y), (x + 9, y)], style))?;
        area.draw(&PathElement::new(vec![(x + 15, y), (x + 24, y)], style))?;
    } else {
        area.draw(&PathElement::new(vec![(x, y), (x + 24, y)], style))?;
    }
    area.draw(&Text::new(
        text.to_string(),
        (x + 32, y - 7),
        ("sans-serif", 13),
    ))?;
    Ok(())
}

fn draw_all(
    dir: &Path,
    prefix: &str,
    runs: &[BackendRun],
    sensors: usize,
) -> Result<(), DemoError> {
    font_once();
    let fail = |path: &Path, e: Box<dyn std::error::Error>| DemoError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    };
    macro_rules! picture {
        ($name:expr, $draw:ident) => {
            picture!($name, $draw, (960, 560))
        };
        ($name:expr, $draw:ident, $size:expr) => {{
            let svg_path = dir.join(format!("{prefix}-{}.svg", $name));
            let png_path = dir.join(format!("{prefix}-{}.png", $name));
            {
                let root = SVGBackend::new(&svg_path, $size).into_drawing_area();
                $draw(&root, runs, sensors).map_err(|e| fail(&svg_path, e))?;
                root.present().map_err(|e| fail(&svg_path, e.into()))?;
            }
            {
                let root = BitMapBackend::new(&png_path, $size).into_drawing_area();
                $draw(&root, runs, sensors).map_err(|e| fail(&png_path, e))?;
                root.present().map_err(|e| fail(&png_path, e.into()))?;
            }
            println!("wrote {} and .png", svg_path.display());
        }};
    }
    picture!(
        "latency",
        draw_latency,
        (960, 60 + 260 * runs.len().max(1) as u32)
    );
    picture!("throughput", draw_throughput);
    picture!("actor-vs-stateless", draw_ratios);
    Ok(())
}

/// Latency distribution (CDF) of anomaly micro-batches, actor and stateless, per backend and
/// micro-batch size.
fn draw_latency<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[BackendRun],
    sensors: usize,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "Anomaly detection, {sensors} sensors: latency per micro-batch (CDF, one in flight)"
        ),
        ("sans-serif", 22),
    )?;
    // One panel per backend (their latencies are decades apart), one color per micro-batch
    // size, the actor solid and the stateless batch dashed; the legend beside the panels.
    let (plots, legend) = root.split_horizontally(root.dim_in_pixel().0 as i32 - 200);
    let batches: Vec<usize> = runs
        .iter()
        .flat_map(|r| r.anomaly.iter().map(|a| a.batch))
        .fold(Vec::new(), |mut v, b| {
            if !v.contains(&b) {
                v.push(b);
            }
            v
        });
    legend.draw(&Text::new(
        "colour: micro-batch",
        (8, 40),
        ("sans-serif", 14),
    ))?;
    let mut y = 64;
    for (k, b) in batches.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        legend_entry(
            &legend,
            (8, y),
            color,
            false,
            3,
            &format!("actor, batch {b}"),
        )?;
        legend_entry(
            &legend,
            (8, y + 20),
            color,
            true,
            2,
            &format!("stateless, batch {b}"),
        )?;
        y += 48;
    }
    for (i, line) in [
        "solid: the actor keeps",
        "the statistics resident",
        "dashed: stateless, they",
        "are uploaded and read",
        "back per micro-batch",
    ]
    .iter()
    .enumerate()
    {
        legend.draw(&Text::new(
            *line,
            (8, y + 10 + 17 * i as i32),
            ("sans-serif", 12),
        ))?;
    }
    let panels = plots.split_evenly((runs.len().max(1), 1));
    for (r, panel) in runs.iter().zip(&panels) {
        let all: Vec<f64> = r
            .anomaly
            .iter()
            .flat_map(|a| a.actor_lat.iter().chain(&a.stateless_lat).copied())
            .collect();
        let lo = all.iter().copied().fold(f64::INFINITY, f64::min).max(0.1);
        let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
        let mut chart = ChartBuilder::on(panel)
            .caption(&r.name, ("sans-serif", 17))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(
                (lo * 0.8..hi * 1.25)
                    .log_scale()
                    .with_key_points(log_points(lo * 0.8, hi * 1.25, &[1.0, 2.0, 5.0]))
                    .with_light_points(log_points(
                        lo * 0.8,
                        hi * 1.25,
                        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
                    )),
                0f64..1f64,
            )?;
        chart
            .configure_mesh()
            .x_label_formatter(&|x| log_tick(*x))
            .x_desc("micro-batch latency, microseconds (log scale)")
            .y_desc("fraction")
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .draw()?;
        for (k, a) in r.anomaly.iter().enumerate() {
            let color =
                COLORS[batches.iter().position(|&b| b == a.batch).unwrap_or(k) % COLORS.len()];
            for (lat, dashed) in [(&a.actor_lat, false), (&a.stateless_lat, true)] {
                let n = lat.len().max(1) as f64;
                let pts: Vec<(f64, f64)> = lat
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| (x, (i + 1) as f64 / n))
                    .collect();
                if dashed {
                    chart.draw_series(DashedLineSeries::new(pts, 8, 5, color.stroke_width(2)))?;
                } else {
                    chart.draw_series(LineSeries::new(pts, color.stroke_width(3)))?;
                }
            }
        }
    }
    Ok(())
}

/// Throughput against micro-batch size, actor and stateless, per backend.
fn draw_throughput<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[BackendRun],
    sensors: usize,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let hi = runs
        .iter()
        .flat_map(|r| {
            r.anomaly
                .iter()
                .flat_map(|a| a.actor_rps.iter().chain(&a.stateless_rps).copied())
        })
        .fold(1.0, f64::max)
        / 1e6;
    let lo = runs
        .iter()
        .flat_map(|r| {
            r.anomaly.iter().flat_map(|a| {
                a.actor_rps
                    .iter()
                    .chain(&a.stateless_rps)
                    .chain(&a.actor_sync_rps)
                    .copied()
            })
        })
        .fold(f64::INFINITY, f64::min)
        / 1e6;
    let root = root.titled(
        &format!("Anomaly detection, {sensors} sensors: throughput vs micro-batch size"),
        ("sans-serif", 22),
    )?;
    // The legend beside the chart (it covers no data); the axis fitted to the data.
    let (plot, legend) = root.split_horizontally(root.dim_in_pixel().0 as i32 - 250);
    legend.draw(&Text::new("colour: backend", (8, 30), ("sans-serif", 14)))?;
    for (i, r) in runs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        legend_entry(&legend, (8, 56 + 22 * i as i32), color, false, 3, &r.name)?;
    }
    let y0 = 56 + 22 * runs.len() as i32 + 16;
    legend.draw(&Text::new("line: mode", (8, y0), ("sans-serif", 14)))?;
    let grey = RGBColor(90, 90, 90);
    legend_entry(
        &legend,
        (8, y0 + 26),
        grey,
        false,
        3,
        "actor, statistics resident",
    )?;
    legend.draw(&Text::new(
        format!("({} micro-batches in flight)", anomaly::IN_FLIGHT),
        (40, y0 + 36),
        ("sans-serif", 12),
    ))?;
    legend_entry(
        &legend,
        (8, y0 + 64),
        grey,
        true,
        2,
        "stateless: upload, update,",
    )?;
    legend.draw(&Text::new(
        "download per micro-batch",
        (40, y0 + 74),
        ("sans-serif", 12),
    ))?;
    legend_entry(
        &legend,
        (8, y0 + 102),
        grey,
        false,
        1,
        "actor, one micro-batch",
    )?;
    legend.draw(&Text::new(
        "in flight (hollow points)",
        (40, y0 + 112),
        ("sans-serif", 12),
    ))?;
    legend.draw(&Text::new(
        "bars: min..max of repeats",
        (8, y0 + 142),
        ("sans-serif", 12),
    ))?;
    let mut chart = ChartBuilder::on(&plot)
        .margin(18)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            (80f64..1250f64).log_scale(),
            (lo.max(1e-4) * 0.6..hi * 1.6).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_labels(4)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| log_tick(*y))
        .x_desc("readings per micro-batch (log scale)")
        .y_desc("million readings / s (log scale)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()?;
    for (i, r) in runs.iter().enumerate() {
        // j: actor (resident statistics), stateless, actor with one micro-batch in flight.
        for j in 0..3 {
            // One color per backend; the line says which mode: solid (actor), dashed
            // (stateless), thin with hollow points (actor, one micro-batch in flight).
            let color = COLORS[i % COLORS.len()];
            let pick = |a: &AnomalyRow| -> Vec<f64> {
                match j {
                    0 => a.actor_rps.clone(),
                    1 => a.stateless_rps.clone(),
                    _ => a.actor_sync_rps.clone(),
                }
            };
            let pts: Vec<(f64, f64)> = r
                .anomaly
                .iter()
                .map(|a| (a.batch as f64, median(&pick(a)) / 1e6))
                .collect();
            // Spread: min..max of the repetitions as a vertical bar.
            for a in &r.anomaly {
                let v = &pick(a);
                let (mn, mx) = (
                    v.iter().copied().fold(f64::INFINITY, f64::min) / 1e6,
                    v.iter().copied().fold(0.0, f64::max) / 1e6,
                );
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(a.batch as f64, mn), (a.batch as f64, mx)],
                    color.stroke_width(2),
                )))?;
            }
            match j {
                0 => chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))?,
                1 => chart.draw_series(DashedLineSeries::new(
                    pts.clone(),
                    10,
                    6,
                    color.stroke_width(2),
                ))?,
                _ => chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(1)))?,
            };
            chart.draw_series(pts.iter().map(|&(x, y)| {
                let style = if j == 2 {
                    color.stroke_width(2)
                } else {
                    color.filled()
                };
                Circle::new((x, y), 5, style)
            }))?;
        }
    }
    Ok(())
}

/// Actor vs stateless batch: speed-up per workload and backend, with the targets.
fn draw_ratios<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[BackendRun],
    sensors: usize,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let mut bars: Vec<(String, Vec<f64>, f64)> = Vec::new();
    for r in runs {
        for a in &r.anomaly {
            bars.push((
                format!(
                    "{}: anomaly, batch {}, {} sensors",
                    r.name, a.batch, sensors
                ),
                a.ratios(),
                if a.batch == 100 { 5.0 } else { 0.0 },
            ));
        }
        for p in &r.sweep {
            bars.push((
                format!("{}: anomaly, batch 100, {} sensors", r.name, p.sensors),
                p.ratios(),
                5.0,
            ));
        }
        for pr in r.pr.iter().filter(|pr| !pr.stream_ratio.is_empty()) {
            bars.push((
                format!("{}: streaming PageRank, tol {:e}", r.name, pr.tol),
                pr.stream_ratio.clone(),
                10.0,
            ));
        }
    }
    let hi = bars
        .iter()
        .flat_map(|b| b.1.iter().copied())
        .fold(10.0, f64::max)
        * 1.6;
    let lo = bars
        .iter()
        .flat_map(|b| b.1.iter().copied())
        .fold(0.5, f64::min)
        * 0.6;
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut chart = ChartBuilder::on(root)
        .caption(
            "Resident actor vs stateless batch: speed-up (same run, same backend)",
            ("sans-serif", 22),
        )
        .margin(18)
        .margin_bottom(44) // room for the colour key
        .x_label_area_size(40)
        .y_label_area_size(330)
        .build_cartesian_2d(
            (lo..hi)
                .log_scale()
                .with_key_points(log_points(lo, hi, &[1.0, 2.0, 5.0]))
                .with_light_points(log_points(
                    lo,
                    hi,
                    &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
                )),
            -0.5f64..(bars.len() as f64 - 0.5),
        )?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len())
        .y_label_formatter(&|y| {
            let i = y.round();
            if (y - i).abs() < 1e-6 && i >= 0.0 { names.get(i as usize).cloned().unwrap_or_default() } else { String::new() }
        })
        .x_label_formatter(&|x| log_tick(*x))
        .x_desc("times faster than stateless (log scale; bar = median, whisker = min..max of the repeats)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    for (i, (_, v, target)) in bars.iter().enumerate() {
        let y = i as f64;
        let (m, mn, mx) = (
            median(v),
            v.iter().copied().fold(f64::INFINITY, f64::min),
            v.iter().copied().fold(0.0, f64::max),
        );
        let color = if *target > 0.0 && m < *target {
            COLORS[1]
        } else {
            COLORS[0]
        };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(lo, y - 0.3), (m.max(lo), y + 0.3)],
            color.mix(0.8).filled(),
        )))?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(mn.max(lo), y), (mx.max(lo), y)],
            BLACK.stroke_width(2),
        )))?;
        // The figure right of the whisker and the target mark, so nothing covers it.
        let right = mx.max(m).max(*target).max(lo) * 1.08;
        chart.draw_series(std::iter::once(Text::new(
            if m < 0.95 {
                format!("x{m:.2}")
            } else {
                format!("x{m:.1}")
            },
            (right, y + 0.25),
            ("sans-serif", 15),
        )))?;
        if *target > 0.0 {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(*target, y - 0.42), (*target, y + 0.42)],
                COLORS[1].stroke_width(3),
            )))?;
        }
    }
    // What the colours mean, in the empty band below the bars' labels.
    let (w, h) = root.dim_in_pixel();
    let key = [
        (COLORS[0], "blue bar: meets its target (or has none)"),
        (COLORS[1], "red bar: misses its target"),
    ];
    for (i, (c, t)) in key.iter().enumerate() {
        let x = 20 + 300 * i as i32;
        let y = h as i32 - 22;
        root.draw(&Rectangle::new(
            [(x, y - 6), (x + 18, y + 6)],
            c.mix(0.8).filled(),
        ))?;
        root.draw(&Text::new(*t, (x + 24, y - 7), ("sans-serif", 13)))?;
    }
    let x = (w as i32 - 300).max(620);
    root.draw(&PathElement::new(
        vec![(x, h as i32 - 30), (x, h as i32 - 14)],
        COLORS[1].stroke_width(3),
    ))?;
    root.draw(&Text::new(
        "red tick: the target (x5 anomaly, x10 PageRank)",
        (x + 8, h as i32 - 29),
        ("sans-serif", 13),
    ))?;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(1.0, -0.5), (1.0, bars.len() as f64 - 0.5)],
        BLACK.stroke_width(1),
    )))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::log_points;

    #[test]
    fn log_axis_points_cover_the_range_below_the_first_decade() {
        // 88..2900 us: plotters alone labels only 1000 and 2000 here.
        assert_eq!(
            log_points(88.0, 2900.0, &[1.0, 2.0, 5.0]),
            vec![100.0, 200.0, 500.0, 1000.0, 2000.0]
        );
        assert_eq!(log_points(3.0, 9.0, &[1.0, 2.0, 5.0]), vec![5.0]);
        assert!(log_points(0.0, 10.0, &[1.0]).is_empty());
        assert!(log_points(10.0, 1.0, &[1.0]).is_empty());
    }
}
