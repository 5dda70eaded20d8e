//! The phases of `sprout bench neighbours` on a running worker: the victim alone, beside each
//! neighbour, alone again, then G1's alternating rounds of a silent and a printing victim.

use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};

use super::clients::{dir_bytes, phase};
use super::format::{f, fmt_ms, fmt_x, progress, ratio};
use super::metrics::{counter, lambda_counter, metrics};
use super::setup::{deploy_tenant_flood, Plan, CALLERS, LAMBDAS, NEIGHBOURS};
use crate::report;
use crate::worker::BenchWorker;

/// Every phase, then G1's rounds: (phases, G1).
pub(super) fn measure(worker: &BenchWorker, plan: &Plan, notes: &mut Vec<String>) -> Result<(Vec<Value>, Value)> {
    for (name, source) in LAMBDAS {
        worker.upload(name, &[("f.py", source.as_bytes())])?;
    }
    deploy_tenant_flood(worker)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let logs_root = worker.dir.join("logs");
    let mut phases = Vec::new();
    let mut order: Vec<(&str, Option<&str>)> = vec![("alone", None)];
    order.extend(NEIGHBOURS.iter().map(|n| (*n, Some(*n))));
    order.push(("alone-end", None));
    let mut metrics_missing = false;
    for (name, neighbour) in order {
        eprintln!(
            "  {name}: {}",
            neighbour.map(|n| format!("victim beside {CALLERS} callers of {n}")).unwrap_or_else(|| "victim alone".into())
        );
        let log_dir = neighbour.filter(|n| n.starts_with("printer")).map(|n| logs_root.join(n));
        let run = runtime.block_on(phase(worker.port, "victim", neighbour, plan.warmup, plan.seconds, log_dir.clone()));
        let mut out = json!({"name": name, "neighbour": neighbour, "seconds": plan.seconds, "victim": run.victim.json(plan.seconds)});
        if let (Some(n), Some(tally)) = (neighbour, run.neighbour.as_ref()) {
            out["neighbour_calls"] = tally.json(run.neighbour_seconds);
            if n.starts_with("printer") {
                // Let the worker take in the last of the output before looking at what it kept.
                std::thread::sleep(Duration::from_secs(1));
                let text = match metrics(worker) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        notes.push(format!("GET /metrics after {name} failed: {e:#}"));
                        None
                    }
                };
                let text = text.as_deref().unwrap_or("");
                let dropped_lines = lambda_counter(text, "sprout_log_dropped_lines_total", n);
                let dropped_bytes = lambda_counter(text, "sprout_log_dropped_bytes_total", n).map(|b| b as u64);
                metrics_missing |= dropped_lines.is_none();
                let after = log_dir.as_deref().and_then(dir_bytes);
                out["output"] = json!({
                    "bytes_written": tally.bytes,
                    "seconds": run.neighbour_seconds,
                    "mb_s": tally.bytes as f64 / 1e6 / run.neighbour_seconds,
                    "log_dir": log_dir.as_ref().map(|d| d.display().to_string()),
                    "log_bytes_after": after,
                    "log_bytes_max": run.log_bytes_max.max(after),
                    "dropped_lines": dropped_lines.map(|l| l as u64),
                    "dropped_bytes": dropped_bytes,
                    "writer_dropped_entries": counter(text, "sprout_log_writer_dropped_entries_total").map(|e| e as u64),
                });
            }
        }
        eprintln!("    {}", progress(&out));
        phases.push(out);
        std::thread::sleep(Duration::from_millis(500));
    }
    if logs_root.is_dir() {
        // The worker keeps log files: nothing to say.
    } else {
        notes.push(format!("the worker keeps no {}: log bytes are null", logs_root.display()));
    }
    if metrics_missing {
        notes.push("the worker's /metrics has no sprout_log_dropped_lines_total: dropped lines are null".into());
    }
    // G1: the silent victim against one printing a line per call, alternating which goes first.
    eprintln!("  G1: victim against victim-prints, {} rounds of {} s", plan.g1_rounds, plan.g1_seconds);
    let mut rounds = Vec::new();
    for round in 0..plan.g1_rounds {
        let mut pair = ["victim", "victim-prints"];
        if round % 2 == 1 {
            pair.reverse();
        }
        let mut r = json!({"round": round, "first": pair[0]});
        for lambda in pair {
            let run = runtime.block_on(phase(worker.port, lambda, None, plan.g1_warmup, plan.g1_seconds, None));
            r[lambda] = run.victim.json(plan.g1_seconds);
        }
        r["p50_ratio"] = json!(ratio(f(&r["victim-prints"]["p50_ms"]), f(&r["victim"]["p50_ms"])));
        eprintln!(
            "    round {round}: victim p50 {} ms, victim-prints p50 {} ms ({})",
            fmt_ms(&r["victim"]["p50_ms"]),
            fmt_ms(&r["victim-prints"]["p50_ms"]),
            fmt_x(&r["p50_ratio"])
        );
        rounds.push(r);
    }
    let text = metrics(worker).unwrap_or_default();
    let med = |lambda: &str, key: &str| report::median(rounds.iter().filter_map(|r| f(&r[lambda][key])).collect());
    let g1 = json!({
        "rounds": rounds,
        "seconds_per_round": plan.g1_seconds,
        "victim_p50_ms": med("victim", "p50_ms"),
        "victim_p99_ms": med("victim", "p99_ms"),
        "victim_prints_p50_ms": med("victim-prints", "p50_ms"),
        "victim_prints_p99_ms": med("victim-prints", "p99_ms"),
        "p50_ratio": ratio(med("victim-prints", "p50_ms"), med("victim", "p50_ms")),
        "p99_ratio": ratio(med("victim-prints", "p99_ms"), med("victim", "p99_ms")),
        "victim_prints_dropped_lines": lambda_counter(&text, "sprout_log_dropped_lines_total", "victim-prints").map(|l| l as u64),
    });
    Ok((phases, g1))
}
