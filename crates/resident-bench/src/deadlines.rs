//! The call storm of `resident bench deadlines`: issue 21 of issue 21 before and after call deadlines.
//!
//! A CPU kernel whose handler takes `--handler-ms`; one caller makes `--calls` calls one after
//! the other, each with a `--timeout-ms` timeout (almost all time out, their requests still
//! queued); then a fresh call with a long timeout, and the time until it is served. "before"
//! is the same kernel with the deadline check turned off (every timed-out request is still
//! handled, as before deadlines existed), "after" with it on; the two alternate in one run,
//! `--repeats` times each. Results go to JSON with the command, the machine and its load.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use resident::prelude::*;

use crate::error::BenchError;
use crate::provenance::{cargo_command, load, machine, today};
use crate::stats::{quantile, sorted};

/// The storm's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Calls in the storm.
    pub calls: u32,
    /// Timeout of each storm call, in milliseconds.
    pub timeout_ms: u64,
    /// Time the handler takes per message, in milliseconds.
    pub handler_ms: u64,
    /// Storms per variant (before, after alternate).
    pub repeats: usize,
}

/// One storm, then the fresh call.
fn storm(
    o: &Options,
    check: bool,
    round: usize,
    say: &mut dyn FnMut(String),
) -> Result<Value, BenchError> {
    let rt = Runtime::builder()
        .backend(Backend::Cpu)
        .enable_telemetry(true)
        .build()?;
    let handler = Duration::from_millis(o.handler_ms);
    let id = format!("storm-{}-{round}", if check { "after" } else { "before" });
    // Room for the whole storm: no call is refused by backpressure.
    let k = RingKernel::<u64, u64>::new(id)
        .queue_size(o.calls as usize + 16)
        .handler(move |_ctx: &mut Context<()>, x: u64| {
            std::thread::sleep(handler);
            Some(x + 1)
        });
    let h = rt.launch(k)?;
    h.set_expire_late_inputs(check);
    h.activate()?;
    let timeout = Duration::from_millis(o.timeout_ms);
    let (mut served, mut timed_out) = (0u64, 0u64);
    let start = Instant::now();
    for i in 0..o.calls as u64 {
        match h.call(i, timeout) {
            Ok(_) => served += 1,
            Err(Error::Timeout { .. }) => timed_out += 1,
            Err(e) => return Err(e.into()),
        }
    }
    let storm_s = start.elapsed().as_secs_f64();
    let queued = h.telemetry().queue_depth;
    let t = Instant::now();
    let fresh = h.call(u64::MAX - 1, Duration::from_secs(600))?;
    let fresh_s = t.elapsed().as_secs_f64();
    if fresh != u64::MAX {
        return Err(BenchError::WrongOutput {
            index: u64::MAX - 1,
            got: fresh,
            want: u64::MAX,
        });
    }
    h.drain(Duration::from_secs(600))?;
    let tm = h.telemetry();
    let r = h.terminate()?;
    let accepted = tm.messages_received;
    let reported = r.processed + r.expired + r.returned() as u64;
    if reported != accepted {
        return Err(BenchError::Accounting { accepted, reported });
    }
    say(format!(
        "{:>6} round {round}: fresh call served after {:>9.3} ms; storm {:.2} s, {} queued \
         when it ended, {} handled, {} expired, {} served in time",
        if check { "after" } else { "before" },
        fresh_s * 1e3,
        storm_s,
        queued,
        r.processed,
        r.expired,
        served
    ));
    Ok(json!({
        "fresh_call_s": fresh_s,
        "storm_s": storm_s,
        "queued_when_storm_ended": queued,
        "calls_served_in_time": served,
        "calls_timed_out": timed_out,
        "handled": r.processed,
        "expired": r.expired,
        "late_replies_dropped": r.dropped,
        "accepted": accepted,
    }))
}

fn summary(runs: &[Value]) -> Value {
    let v: Vec<f64> = runs
        .iter()
        .filter_map(|r| r["fresh_call_s"].as_f64())
        .collect();
    let v = sorted(&v);
    json!({"fresh_call_s_median": quantile(&v, 0.5), "fresh_call_s_min": v.first(), "fresh_call_s_max": v.last()})
}

/// Runs the storms, `before` and `after` alternated, and returns the report. `say` gets one
/// line per storm and the summary.
pub fn run(o: &Options, say: &mut dyn FnMut(String)) -> Result<Value, BenchError> {
    let load_before = load();
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for round in 0..o.repeats.max(1) {
        before.push(storm(o, false, round, say)?);
        after.push(storm(o, true, round, say)?);
    }
    let (b, a) = (summary(&before), summary(&after));
    let median = |v: &Value| v["fresh_call_s_median"].as_f64().unwrap_or(f64::NAN);
    let ratio = median(&b) / median(&a);
    say(format!(
        "fresh call after the storm: before {:.3} ms, after {:.3} ms (medians, x{ratio:.1})",
        median(&b) * 1e3,
        median(&a) * 1e3,
    ));
    Ok(json!({
        "what": "issue 21's call storm: a CPU kernel whose handler sleeps handler_ms, one caller making `calls` sequential calls with timeout_ms timeouts, then a fresh call: the time until it is served. before = the deadline check turned off (timed-out requests still handled), after = on; alternated in one run",
        "command": cargo_command("resident-cli"),
        "build": if cfg!(debug_assertions) { "debug (the effect is milliseconds of handler time per queued call)" } else { "release" },
        "date": today(),
        "machine": machine(),
        "load_before": load_before,
        "load_after": load(),
        "params": {"calls": o.calls, "timeout_ms": o.timeout_ms, "handler_ms": o.handler_ms, "repeats": o.repeats},
        "runs": {"before": before, "after": after},
        "summary": {"before": b, "after": a, "fresh_call_before_over_after_median": ratio},
    }))
}
