//! A run's result: merged statistics per operation (steady state, per SLA window, per
//! interval), the checks with their verdicts, utilization and cost inputs, as one JSON
//! document that the HTML report, the search and `compare` read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::checks::{self, Check};
use crate::control::{Merged, Spec};
use crate::stats::Summary;
use crate::utilization::Sample;
use crate::workload::Workload;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpReport {
    #[serde(flatten)]
    pub summary: Summary,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub max90_s: f64,
    /// Share of all operations, and the mix's stationary share (percent).
    pub share_pct: f64,
    pub target_pct: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    pub workload: String,
    pub url: String,
    pub stack: String,
    pub users: usize,
    pub peak_users: usize,
    pub registered_users: u64,
    /// Cloudstone's size: log10 of the user accounts.
    pub u: f64,
    pub spec: Spec,
    pub steady_seconds: f64,
    pub ops_per_s: f64,
    pub operations: BTreeMap<String, OpReport>,
    /// Per SLA window: start (s into the steady state) and each operation's summary.
    pub windows: Vec<Value>,
    /// Per interval from the run's start: t, ops/s, and each operation's p90/p99.
    pub series: Vec<Value>,
    pub active_users: Vec<(f64, usize)>,
    pub counters: BTreeMap<String, u64>,
    pub mean_cycle_ms: f64,
    pub checks: Vec<Check>,
    pub sla1_passed: bool,
    pub sla2_passed: bool,
    pub utilization: Vec<Sample>,
    pub sut_cpus: Vec<usize>,
    pub machine: String,
    /// What the system under test used over the whole run, and what that costs per price:
    /// {"seconds", "cpu_seconds", "gb_seconds", "costs": {price: {"used_usd", "provisioned_usd"}}}
    #[serde(default)]
    pub resources: Value,
    /// The interpreter build the deployment's Python processes ran (`sprout olio status`'s
    /// `interpreter`), when the run was told its deployment; null otherwise.
    #[serde(default)]
    pub interpreter: Value,
}

/// Olio's load-level bound (Faban's users / ops-per-second check).
pub const MAX_USERS_PER_OPS: f64 = 5.25;
/// Olio's attend rule: attends on at least this share of EventDetails.
pub const MIN_ATTEND_SHARE: f64 = 0.06;

#[allow(clippy::too_many_arguments)] // what a report is made of, each once
pub fn build(
    workload: &Workload,
    spec: &Spec,
    stack: &str,
    merged: &Merged,
    utilization: Vec<Sample>,
    sut_cpus: Vec<usize>,
    machine: String,
    peak_users: usize,
) -> RunReport {
    let total = merged.steady.total();
    let pi = workload.chain.stationary();
    let all: u64 = total.iter().map(|s| s.hist.len() + s.error_count()).sum();
    let mut operations = BTreeMap::new();
    for (i, op) in workload.operations.iter().enumerate() {
        let n = total[i].hist.len() + total[i].error_count();
        operations.insert(
            op.name.clone(),
            OpReport {
                summary: total[i].summary(),
                errors_by_kind: total[i].errors.clone(),
                max90_s: op.max90_s,
                share_pct: if all > 0 { n as f64 / all as f64 * 100.0 } else { 0.0 },
                target_pct: pi[i] * 100.0,
            },
        );
    }
    let window_s = merged.steady.window_us as f64 / 1e6;
    let window_name =
        |w: usize| format!("window {} ({:.0}-{:.0} s of the steady state)", w + 1, w as f64 * window_s, (w + 1) as f64 * window_s);
    let per_window = |ops: &Vec<crate::stats::OpStats>| -> Value {
        Value::Object(workload.operations.iter().zip(ops).map(|(op, s)| (op.name.clone(), json!(s.summary()))).collect())
    };
    let windows = merged
        .steady
        .windows
        .iter()
        .enumerate()
        .map(|(w, ops)| json!({"start_s": w as f64 * window_s, "operations": per_window(ops)}))
        .collect();
    let interval_s = merged.series.window_us as f64 / 1e6;
    let series = merged
        .series
        .windows
        .iter()
        .enumerate()
        .map(|(w, ops)| {
            let count: u64 = ops.iter().map(|s| s.hist.len()).sum();
            let errors: u64 = ops.iter().map(|s| s.error_count()).sum();
            json!({"t": w as f64 * interval_s, "ops_per_s": count as f64 / interval_s, "errors": errors, "operations": per_window(ops)})
        })
        .collect();
    let steady_seconds = spec.steady_s;
    let ops_per_s = if steady_seconds > 0.0 { all as f64 / steady_seconds } else { 0.0 };
    let mean_cycle_ms = if merged.cycles > 0 { merged.cycle_ms_sum / merged.cycles as f64 } else { 0.0 };
    let sla1 = checks::sla(workload, &merged.steady, 90.0, &window_name);
    let sla2 = checks::sla(workload, &merged.steady, 99.0, &window_name);
    let mut common = vec![checks::mix(workload, &total), checks::cycle_time(workload, mean_cycle_ms, merged.cycles)];
    if workload.driver == "olio" {
        let details = workload.index_of("EventDetail").map(|i| total[i].hist.len()).unwrap_or(0);
        common.push(checks::ratio(
            "attends on EventDetail",
            merged.counters.get("attend").copied().unwrap_or(0),
            details,
            MIN_ATTEND_SHARE,
        ));
        // Under a profile, the users the steady state had on average.
        let profile = spec.profile.as_deref().and_then(|p| crate::profile::Profile::load(p).ok());
        let users = match profile {
            Some(p) if spec.steady_s > 0.0 => {
                (p.user_seconds(spec.ramp_up_s + spec.steady_s) - p.user_seconds(spec.ramp_up_s)) / spec.steady_s
            }
            _ => spec.users as f64,
        };
        common.push(checks::users_per_ops(users, ops_per_s, MAX_USERS_PER_OPS));
    }
    let errors: u64 = total.iter().map(|s| s.error_count()).sum();
    common.push(Check {
        name: "errors".into(),
        passed: errors as f64 <= 0.01 * all.max(1) as f64,
        detail: format!("{errors} of {all} operations failed (at most 1% allowed; every failure also counts against the SLAs)"),
    });
    let common_ok = common.iter().all(|c| c.passed);
    let sla1_passed = sla1.passed && common_ok;
    let sla2_passed = sla2.passed && common_ok;
    let mut checks = vec![sla1, sla2];
    checks.extend(common);
    RunReport {
        workload: workload.name.clone(),
        url: spec.url.clone(),
        stack: stack.to_string(),
        users: spec.users,
        peak_users,
        registered_users: spec.registered_users,
        u: (spec.registered_users.max(1) as f64).log10(),
        spec: spec.clone(),
        steady_seconds,
        ops_per_s,
        operations,
        windows,
        series,
        active_users: merged.active_users.clone(),
        counters: merged.counters.clone(),
        mean_cycle_ms,
        checks,
        sla1_passed,
        sla2_passed,
        utilization,
        sut_cpus,
        machine,
        resources: Value::Null,
        interpreter: Value::Null,
    }
}

impl RunReport {
    /// One line per operation and per check, for the terminal.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{} against {} ({}): {} users, U = {:.2}, {:.0} s steady, {:.2} ops/s, mean cycle {:.0} ms\n",
            self.workload, self.url, self.stack, self.peak_users, self.u, self.steady_seconds, self.ops_per_s, self.mean_cycle_ms
        );
        out += &format!(
            "{:<14} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}\n",
            "operation", "count", "errors", "mean ms", "p90 ms", "p99 ms", "max ms", "share", "target"
        );
        for (name, op) in &self.operations {
            let s = &op.summary;
            out += &format!(
                "{:<14} {:>7} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6.2}% {:>6.2}%\n",
                name, s.count, s.errors, s.mean_ms, s.p90_ms, s.p99_ms, s.max_ms, op.share_pct, op.target_pct
            );
        }
        for c in &self.checks {
            out += &format!("{} {}: {}\n", if c.passed { "PASS" } else { "FAIL" }, c.name, c.detail);
        }
        out += &format!("SLA-1 (90th): {}   SLA-2 (99th): {}\n", verdict(self.sla1_passed), verdict(self.sla2_passed));
        out
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "FAIL"
    }
}
