//! The results of `sprout bench neighbours`: the JSON (phases against the victim alone, the
//! goals judged, the method and the machine), its markdown, and the command's summary.

use serde_json::{json, Value};

use super::format::{f, fmt_mib, fmt_ms, fmt_x, ratio};
use super::setup::{Plan, CALLERS, FLOOD_CALL_CPU_S, FLOOD_QUOTA, FLOOD_TIMES, TENANT_FLOOD};
use crate::report;
use crate::sandbox_worker::Options;

/// The issue's figures for its reproduction (the `printer` phase): victim p50 and p99 ÷ alone.
const ISSUE_P50: f64 = 55.0;
const ISSUE_P99: f64 = 60.0;

/// One line of the command's output.
fn shell(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program).args(args).current_dir(report::bench_dir()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[allow(clippy::too_many_arguments)]
pub(super) fn summarize(
    opts: &Options,
    plan: &Plan,
    config: &str,
    log_limit: u64,
    mut phases: Vec<Value>,
    g1: Value,
    mut notes: Vec<String>,
    worker_log: &[&str],
) -> Value {
    let alone_of = |name: &str| phases.iter().find(|p| p["name"] == name).map(|p| p["victim"].clone()).unwrap_or(Value::Null);
    let (alone, end) = (alone_of("alone"), alone_of("alone-end"));
    for p in phases.iter_mut() {
        let against = |base: &Value| {
            json!({
                "p50": ratio(f(&p["victim"]["p50_ms"]), f(&base["p50_ms"])),
                "p99": ratio(f(&p["victim"]["p99_ms"]), f(&base["p99_ms"])),
            })
        };
        let (r, r_end) = (against(&alone), against(&end));
        p["ratio"] = r;
        p["ratio_end"] = r_end;
        let v = &p["victim"];
        if v["errors"].as_u64().unwrap_or(0) > 0 || v["not_warm"].as_u64().unwrap_or(0) > 0 {
            notes.push(format!(
                "{}: the victim had {} errors and {} answers that were not warm (left out){}",
                p["name"].as_str().unwrap_or(""),
                v["errors"],
                v["not_warm"],
                v["first_error"].as_str().map(|e| format!("; first error: {e}")).unwrap_or_default()
            ));
        }
        let n = &p["neighbour_calls"];
        if n["errors"].as_u64().unwrap_or(0) + n["warmup_errors"].as_u64().unwrap_or(0) > 0 {
            notes.push(format!(
                "{}: the neighbour had {} errors ({} in the warm-up); first: {}",
                p["name"].as_str().unwrap_or(""),
                n["errors"],
                n["warmup_errors"],
                n["first_error"].as_str().unwrap_or("")
            ));
        }
    }
    let drift = json!({
        "p50": ratio(f(&end["p50_ms"]), f(&alone["p50_ms"])),
        "p99": ratio(f(&end["p99_ms"]), f(&alone["p99_ms"])),
    });
    for key in ["p50", "p99"] {
        if let Some(d) = f(&drift[key]).filter(|d| !(0.8..=1.25).contains(d)) {
            notes.push(format!(
                "the victim alone moved between the first and the last phase: {key} {} against {} ms ({d:.2}×); the machine was \
                 not quiet, and ratios to one run alone are not to be trusted (the p99 goals are judged against both)",
                fmt_ms(&end[format!("{key}_ms")]),
                fmt_ms(&alone[format!("{key}_ms")])
            ));
        }
    }
    let by_name = |name: &str| phases.iter().find(|p| p["name"] == name).cloned().unwrap_or(Value::Null);
    let paced = by_name("printer-paced");
    let printer = by_name("printer");
    let flood = by_name(TENANT_FLOOD);
    let g1_ratio = f(&g1["p50_ratio"]);
    let g2_logs = f(&paced["output"]["log_bytes_max"]);
    let goal = |id: &str, target: String, measured: Option<f64>, limit: f64, figure: String| json!({"id": id, "target": target, "limit": limit, "measured": measured, "figure": figure, "met": measured.map(|m| m <= limit)});
    let x = |m: Option<f64>| m.map(|m| format!("{m:.2}×")).unwrap_or_else(|| "not measured".into());
    // A p99 goal is met only against both runs alone: the larger of the two ratios.
    let p99_goal = |id: &str, target: String, phase: &str, limit: f64, extra: String| {
        let p = by_name(phase);
        let (first, last) = (f(&p["ratio"]["p99"]), f(&p["ratio_end"]["p99"]));
        let worse = match (first, last) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let figure = format!(
            "{} alone's, {} alone-end's ({} against {} / {} ms{extra})",
            x(first),
            x(last),
            fmt_ms(&p["victim"]["p99_ms"]),
            fmt_ms(&alone["p99_ms"]),
            fmt_ms(&end["p99_ms"])
        );
        goal(id, target, worse, limit, figure)
    };
    let goals = vec![
        goal(
            "G1",
            "a handler printing one line per call: warm p50 ≤ 1.03× a silent handler's".into(),
            g1_ratio,
            1.03,
            format!(
                "{} ({} against {} ms, medians of {} alternating rounds)",
                x(g1_ratio),
                fmt_ms(&g1["victim_prints_p50_ms"]),
                fmt_ms(&g1["victim_p50_ms"]),
                plan.g1_rounds
            ),
        ),
        p99_goal(
            "G2",
            format!("beside a lambda printing 100 MB/s ({CALLERS} callers): another's warm p99 ≤ 1.10× alone"),
            "printer-paced",
            1.10,
            format!("; the printer reached {:.1} MB/s", f(&paced["output"]["mb_s"]).unwrap_or(f64::NAN)),
        ),
        goal(
            "G2-logs",
            format!("that lambda's stored logs (DIR/logs/printer-paced/) within [logs] max_mb ({} MiB)", log_limit >> 20),
            g2_logs,
            log_limit as f64,
            match g2_logs {
                Some(b) => format!("{:.2} MiB at most ({} lines dropped)", b / (1u64 << 20) as f64, paced["output"]["dropped_lines"]),
                None => "not measured: the worker keeps no log files".into(),
            },
        ),
        p99_goal(
            "G3-spinner",
            format!("beside {CALLERS} sandboxes spinning the CPU (1 s a call): a victim's warm p99 ≤ 2× alone"),
            "spinner",
            2.0,
            String::new(),
        ),
        p99_goal(
            "G3-churner",
            format!("beside {CALLERS} sandboxes churning memory (100 MiB a call): a victim's warm p99 ≤ 2× alone"),
            "churner",
            2.0,
            String::new(),
        ),
        p99_goal(
            "G4-tenant-flood",
            format!(
                "beside another tenant calling its lambda ({} ms of CPU a call) at {FLOOD_TIMES}× its quota of {FLOOD_QUOTA} invocations a \
                 second: a victim's warm p99 ≤ 1.2× alone (issue 52)",
                FLOOD_CALL_CPU_S * 1000.0
            ),
            TENANT_FLOOD,
            1.2,
            format!(
                "; the flood: {:.0}/s admitted, {:.0}/s refused",
                f(&flood["neighbour_calls"]["per_s"]).unwrap_or(f64::NAN),
                f(&flood["neighbour_calls"]["refused_per_s"]).unwrap_or(f64::NAN)
            ),
        ),
    ];
    // Online CPUs of the machine, not this (pinned) process's affinity.
    // SAFETY: sysconf takes an integer name and touches no memory of ours.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1);
    let kernel = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    json!({
        "machine": report::machine(),
        "kernel": kernel,
        "cpus": cpus,
        "date": shell("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        "commit": shell("git", &["describe", "--always", "--dirty"]),
        "method": format!(
            "one sprout worker (sock back-end, its defaults but [instances] max_per_lambda = {} and [limits] timeout_ms = 120000) pinned \
             to CPU {} with its sandboxes, every client on CPU {}, each on its own keep-alive HTTP/1.1 connection; the victim \
             (`return event`) in a closed loop, alone and then beside {CALLERS} closed-loop callers of each neighbour (paced for the tenant flood: {} calls a second together); {} s measured \
             per phase after {} s of warm-up; only the victim's warm answers counted; ratios against the first `alone` (and `alone-end`: a p99 goal is met \
             only against both)",
            CALLERS + 1,
            opts.worker_cpu,
            opts.client_cpu,
            FLOOD_TIMES * FLOOD_QUOTA,
            plan.seconds,
            plan.warmup
        ),
        "options": {
            "seconds": plan.seconds, "warmup_s": plan.warmup, "quick": plan.quick, "worker_cpu": opts.worker_cpu,
            "client_cpu": opts.client_cpu, "callers": CALLERS, "g1_rounds": plan.g1_rounds, "g1_seconds": plan.g1_seconds,
            "g1_warmup_s": plan.g1_warmup, "work_dir": opts.work_dir.display().to_string(), "worker_config": config,
            "log_limit_bytes": log_limit,
        },
        "phases": phases,
        "drift": drift,
        "g1": g1,
        "issue": {
            "what": "a neighbour writing 20 MB to stdout per call, 3 callers (the issue: p50 55×, p99 60×)",
            "issue_p50_ratio": ISSUE_P50, "issue_p99_ratio": ISSUE_P99,
            "p50_ratio": printer["ratio"]["p50"], "p99_ratio": printer["ratio"]["p99"],
        },
        "goals": goals,
        "notes": notes,
        "worker_log_warnings": worker_log.iter().rev().take(20).rev().collect::<Vec<_>>(),
    })
}

pub fn markdown(r: &Value) -> String {
    let mut md = format!(
        "# Noisy neighbours: a victim's warm latency alone and beside noisy lambdas\n\n{} — {}, commit {}\n\n{}.\n\n\
         | phase | victim warm calls | p50 ms | p90 ms | p99 ms | max ms | p50 ÷ alone | p99 ÷ alone | p99 ÷ alone-end | errors | neighbour calls | neighbour p50 ms | output MB/s | logs MiB (most) | lines dropped |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        r["machine"].as_str().unwrap_or(""),
        r["date"].as_str().unwrap_or(""),
        r["commit"].as_str().unwrap_or(""),
        r["method"].as_str().unwrap_or("")
    );
    for p in r["phases"].as_array().into_iter().flatten() {
        let (v, n, o) = (&p["victim"], &p["neighbour_calls"], &p["output"]);
        let or_dash = |v: &Value| if v.is_null() { "—".to_string() } else { v.to_string() };
        md += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            p["name"].as_str().unwrap_or(""),
            v["calls"],
            fmt_ms(&v["p50_ms"]),
            fmt_ms(&v["p90_ms"]),
            fmt_ms(&v["p99_ms"]),
            fmt_ms(&v["max_ms"]),
            fmt_x(&p["ratio"]["p50"]),
            fmt_x(&p["ratio"]["p99"]),
            fmt_x(&p["ratio_end"]["p99"]),
            v["errors"],
            or_dash(&n["calls"]),
            fmt_ms(&n["p50_ms"]),
            f(&o["mb_s"]).map(|x| format!("{x:.1}")).unwrap_or_else(|| "—".into()),
            if o.is_null() { "—".into() } else { format!("{} ({})", fmt_mib(&o["log_bytes_after"]), fmt_mib(&o["log_bytes_max"])) },
            or_dash(&o["dropped_lines"]),
        );
    }
    let g1 = &r["g1"];
    md += &format!(
        "\nG1, {} alternating rounds of {} s: victim p50 {} ms, p99 {} ms; victim-prints p50 {} ms, p99 {} ms; p50 {}, p99 {}.\n",
        g1["rounds"].as_array().map(Vec::len).unwrap_or(0),
        g1["seconds_per_round"],
        fmt_ms(&g1["victim_p50_ms"]),
        fmt_ms(&g1["victim_p99_ms"]),
        fmt_ms(&g1["victim_prints_p50_ms"]),
        fmt_ms(&g1["victim_prints_p99_ms"]),
        fmt_x(&g1["p50_ratio"]),
        fmt_x(&g1["p99_ratio"]),
    );
    md += &format!("Drift (alone-end ÷ alone): p50 {}, p99 {}.\n", fmt_x(&r["drift"]["p50"]), fmt_x(&r["drift"]["p99"]));
    md += "\n| goal | target | measured | met |\n|---|---|---|---|\n";
    for g in r["goals"].as_array().into_iter().flatten() {
        let met = match g["met"].as_bool() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        md += &format!(
            "| {} | {} | {} | {met} |\n",
            g["id"].as_str().unwrap_or(""),
            g["target"].as_str().unwrap_or(""),
            g["figure"].as_str().unwrap_or("")
        );
    }
    let notes: Vec<&str> = r["notes"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if !notes.is_empty() {
        md += "\nNotes:\n\n";
        for n in notes {
            md += &format!("- {n}\n");
        }
    }
    md
}

/// The goals, one line each, for the command's output.
pub fn summary(r: &Value) -> String {
    let mut s = String::new();
    for g in r["goals"].as_array().into_iter().flatten() {
        let met = crate::report::verdict(g["met"].as_bool());
        s += &format!(
            "{:<10} {:<12} {} — {}\n",
            g["id"].as_str().unwrap_or(""),
            met,
            g["figure"].as_str().unwrap_or(""),
            g["target"].as_str().unwrap_or("")
        );
    }
    s += &format!(
        "issue      printer (20 MB a call, {CALLERS} callers): victim p50 {}, p99 {} alone's (the issue: {ISSUE_P50}×, {ISSUE_P99}×)\n",
        fmt_x(&r["issue"]["p50_ratio"]),
        fmt_x(&r["issue"]["p99_ratio"])
    );
    s
}
