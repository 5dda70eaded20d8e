//! A fleet run's verdict and its record: each site judged on its one window (SLA-1, SLA-2),
//! the fleet passing an SLA when every site does, the first operations after idle, the
//! fleet-wide series and operations, as fleet-run.json and a short text.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checks::{self, Check};
use crate::fleet::Fleet;
use crate::fleet_stats::{self, FirstAfterIdle, MergedFleet};
use crate::stats::{self, OpStats, Summary, Windows, WireStats};
use crate::utilization::Sample;
use crate::workload::Workload;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetReport {
    pub stack: String,
    pub url: String,
    pub workload: String,
    pub sites_total: usize,
    pub span_s: f64,
    pub machine: String,
    pub seed: u64,
    pub agents: u32,
    pub interval_s: f64,
    pub idle_gap_s: f64,
    pub registered_users: u64,
    pub passed_sla1: bool,
    pub passed_sla2: bool,
    pub sites_failing_sla1: Vec<String>,
    pub sites_failing_sla2: Vec<String>,
    /// Operations attempted (each a page with its assets), and those that failed.
    pub requests: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Each operation over all sites.
    pub operations: BTreeMap<String, FleetOpReport>,
    pub first_after_idle: FirstAfterIdleSummary,
    pub sites: Vec<SiteReport>,
    pub series: Vec<SeriesPoint>,
    /// What the driver counted over the run (HTTP requests, 304s, attends...).
    pub counters: BTreeMap<String, u64>,
    pub mean_cycle_ms: f64,
    /// Times sites' supervisors woke over the run (profile changes of busy sites).
    pub supervisor_wakeups: u64,
    pub utilization: Vec<Sample>,
    pub sut_cpus: Vec<usize>,
    /// {"seconds", "cpu_seconds", "gb_seconds", "peak_pss_bytes", "mean_pss_bytes",
    /// "instances", "costs": {price: {"used_usd", "provisioned_usd"}}}
    #[serde(default)]
    pub resources: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetOpReport {
    #[serde(flatten)]
    pub summary: Summary,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub max90_s: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FirstAfterIdleSummary {
    pub count: u64,
    pub within_limit: u64,
    pub worst_ms: Option<f64>,
    pub worst_host: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SiteReport {
    pub name: String,
    pub host: String,
    /// Operations attempted.
    pub requests: u64,
    pub errors: BTreeMap<String, u64>,
    pub sla1: bool,
    pub sla2: bool,
    pub detail: String,
    pub sessions: u64,
    /// The operations the site received.
    pub ops: BTreeMap<String, SiteOpReport>,
    pub first_after_idle: Vec<FirstAfterIdle>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SiteOpReport {
    /// Operations that succeeded (their times are the percentiles'), and those that failed.
    pub count: u64,
    pub errors: u64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// One interval of the run, over all sites: from `t` seconds, the operations that started in
/// it (succeeded per second, failed, percentiles of the successes), and the sessions and sites
/// active at its end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeriesPoint {
    pub t: f64,
    pub ops_per_s: f64,
    pub errors: u64,
    pub active_users: usize,
    pub active_sites: usize,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// What the report says about the run besides its measurements.
#[derive(Debug, Clone)]
pub struct RunContext {
    pub stack: String,
    pub url: String,
    pub machine: String,
    pub seed: u64,
    pub agents: u32,
    pub interval_s: f64,
    pub idle_gap_s: f64,
    pub sut_cpus: Vec<usize>,
}

/// A site's operations from the wire (none: the site received none).
pub fn site_ops(ops: &[WireStats]) -> Result<Vec<OpStats>> {
    ops.iter()
        .enumerate()
        .map(|(i, w)| {
            Ok(OpStats { hist: stats::decode_histogram(&w.hist).with_context(|| format!("operation {i}"))?, errors: w.errors.clone() })
        })
        .collect()
}

/// SLA-1 and SLA-2 on a site's one window. A site whose profile had no users in the span and
/// received nothing passes; one that should have had users and received nothing fails.
pub fn judge_site(workload: &Workload, ops: Vec<OpStats>, busy: bool) -> (Check, Check) {
    let attempts: u64 = ops.iter().map(|s| s.hist.len() + s.error_count()).sum();
    if attempts == 0 {
        let (passed, detail) =
            if busy { (false, "users were due in the span but no operation ran") } else { (true, "no users in the span") };
        let check = |name: &str| Check { name: name.into(), passed, detail: detail.into() };
        return (check("SLA-1 (90th percentile)"), check("SLA-2 (99th percentile)"));
    }
    // One window, the whole span (the checks read only the windows' contents).
    let windows = Windows { window_us: u64::MAX, ops: ops.len(), windows: vec![ops] };
    let name = |_: usize| "the span".to_string();
    (checks::sla(workload, &windows, 90.0, &name), checks::sla(workload, &windows, 99.0, &name))
}

pub fn build(workload: &Workload, fleet: &Fleet, merged: &MergedFleet, ctx: &RunContext, utilization: Vec<Sample>) -> Result<FleetReport> {
    let mut operations: Vec<OpStats> =
        workload.operations.iter().map(|_| OpStats { hist: fleet_stats::histogram(), errors: BTreeMap::new() }).collect();
    let mut sites = Vec::with_capacity(fleet.sites.len());
    let (mut failing1, mut failing2) = (Vec::new(), Vec::new());
    let mut idle = FirstAfterIdleSummary::default();
    for (site, result) in fleet.sites.iter().zip(&merged.sites) {
        let ops = site_ops(&result.ops).with_context(|| format!("site {} ({})", result.index, site.host))?;
        anyhow::ensure!(
            ops.is_empty() || ops.len() == workload.operations.len(),
            "site {} sent {} operations; the workload has {}",
            site.host,
            ops.len(),
            workload.operations.len()
        );
        let mut errors = BTreeMap::new();
        let mut per_op = BTreeMap::new();
        for (i, s) in ops.iter().enumerate() {
            operations[i].add(s);
            for (k, v) in &s.errors {
                *errors.entry(k.clone()).or_default() += v;
            }
            if s.hist.len() + s.error_count() > 0 {
                let sum = s.summary();
                per_op.insert(
                    workload.operations[i].name.clone(),
                    SiteOpReport { count: sum.count, errors: sum.errors, p90_ms: sum.p90_ms, p99_ms: sum.p99_ms, max_ms: sum.max_ms },
                );
            }
        }
        let requests = ops.iter().map(|s| s.hist.len() + s.error_count()).sum();
        let (sla1, sla2) = judge_site(workload, ops, site.busy(fleet.span_s));
        if !sla1.passed {
            failing1.push(site.host.clone());
        }
        if !sla2.passed {
            failing2.push(site.host.clone());
        }
        for f in &result.first_after_idle {
            idle.count += 1;
            idle.within_limit += f.ok as u64;
            if idle.worst_ms.is_none_or(|w| f.ms > w) {
                idle.worst_ms = Some(f.ms);
                idle.worst_host = Some(site.host.clone());
            }
        }
        let detail =
            if sla1.detail == sla2.detail { sla1.detail.clone() } else { format!("SLA-1: {}; SLA-2: {}", sla1.detail, sla2.detail) };
        sites.push(SiteReport {
            name: site.name.clone(),
            host: site.host.clone(),
            requests,
            errors,
            sla1: sla1.passed,
            sla2: sla2.passed,
            detail,
            sessions: result.sessions,
            ops: per_op,
            first_after_idle: result.first_after_idle.clone(),
        });
    }
    let mut errors_by_kind = BTreeMap::new();
    for s in &operations {
        for (k, v) in &s.errors {
            *errors_by_kind.entry(k.clone()).or_default() += v;
        }
    }
    let series = merged
        .series
        .iter()
        .enumerate()
        .map(|(k, i)| {
            let t = k as f64 * ctx.interval_s;
            let seconds = (fleet.span_s - t).min(ctx.interval_s).max(1e-9);
            let quantile = |q: f64| i.hist.as_ref().filter(|h| !h.is_empty()).map(|h| h.value_at_quantile(q) as f64 / 1000.0);
            SeriesPoint {
                t,
                ops_per_s: i.hist.as_ref().map_or(0, |h| h.len()) as f64 / seconds,
                errors: i.errors,
                active_users: i.active_users,
                active_sites: i.active_sites,
                p90_ms: quantile(0.90),
                p99_ms: quantile(0.99),
            }
        })
        .collect();
    Ok(FleetReport {
        stack: ctx.stack.clone(),
        url: ctx.url.clone(),
        workload: workload.name.clone(),
        sites_total: fleet.sites.len(),
        span_s: fleet.span_s,
        machine: ctx.machine.clone(),
        seed: ctx.seed,
        agents: ctx.agents,
        interval_s: ctx.interval_s,
        idle_gap_s: ctx.idle_gap_s,
        registered_users: fleet.registered_users,
        passed_sla1: failing1.is_empty(),
        passed_sla2: failing2.is_empty(),
        sites_failing_sla1: failing1,
        sites_failing_sla2: failing2,
        requests: sites.iter().map(|s| s.requests).sum(),
        errors: errors_by_kind.values().sum(),
        errors_by_kind,
        operations: workload
            .operations
            .iter()
            .zip(&operations)
            .map(|(op, s)| (op.name.clone(), FleetOpReport { summary: s.summary(), errors_by_kind: s.errors.clone(), max90_s: op.max90_s }))
            .collect(),
        first_after_idle: idle,
        sites,
        series,
        counters: merged.counters.clone(),
        mean_cycle_ms: if merged.cycles > 0 { merged.cycle_ms_sum / merged.cycles as f64 } else { 0.0 },
        supervisor_wakeups: merged.supervisor_wakeups,
        utilization,
        sut_cpus: ctx.sut_cpus.clone(),
        resources: Value::Null,
    })
}

impl FleetReport {
    /// A few lines for the terminal: the verdicts, the first operations after idle, each
    /// operation over the fleet, and the resources used.
    pub fn text(&self) -> String {
        let busy = self.sites.iter().filter(|s| s.requests > 0).count();
        let mut out = format!(
            "{} fleet against {} ({}): {} sites ({} received operations), {:.0} s, {} operations, {} failed, {:.2} ops/s\n",
            self.workload,
            self.url,
            self.stack,
            self.sites_total,
            busy,
            self.span_s,
            self.requests,
            self.errors,
            self.requests as f64 / self.span_s
        );
        let failing = |hosts: &[String]| match hosts.len() {
            0 => "every site within".to_string(),
            n => format!(
                "{n} site(s) over: {}{}",
                hosts.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
                if n > 5 { ", ..." } else { "" }
            ),
        };
        out += &format!("{} SLA-1 (90th): {}\n", verdict(self.passed_sla1), failing(&self.sites_failing_sla1));
        out += &format!("{} SLA-2 (99th): {}\n", verdict(self.passed_sla2), failing(&self.sites_failing_sla2));
        let f = &self.first_after_idle;
        out += &format!("first operation after {:.0} s idle: {} of them, {} within their limit", self.idle_gap_s, f.count, f.within_limit);
        if let (Some(ms), Some(host)) = (f.worst_ms, &f.worst_host) {
            out += &format!("; worst {ms:.0} ms ({host})");
        }
        out += "\n";
        out += &format!("{:<14} {:>7} {:>6} {:>9} {:>9} {:>9}\n", "operation", "count", "errors", "p90 ms", "p99 ms", "max ms");
        for (name, op) in &self.operations {
            let s = &op.summary;
            out += &format!("{:<14} {:>7} {:>6} {:>9.1} {:>9.1} {:>9.1}\n", name, s.count, s.errors, s.p90_ms, s.p99_ms, s.max_ms);
        }
        if !self.errors_by_kind.is_empty() {
            let kinds: Vec<String> = self.errors_by_kind.iter().map(|(k, v)| format!("{k} {v}")).collect();
            out += &format!("errors: {}\n", kinds.join(", "));
        }
        let r = &self.resources;
        if let Some(cpu) = r["cpu_seconds"].as_f64() {
            out += &format!("resources: {cpu:.1} CPU-seconds on CPUs {:?}", self.sut_cpus);
            if let (Some(gb), Some(peak), Some(mean)) =
                (r["gb_seconds"].as_f64(), r["peak_pss_bytes"].as_f64(), r["mean_pss_bytes"].as_f64())
            {
                out += &format!(", {gb:.1} GB-seconds (PSS peak {:.0} MB, mean {:.0} MB)", peak / 1e6, mean / 1e6);
            }
            out += "\n";
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet_agent;
    use crate::fleet_agent::tests::{fleet, olio, plan, sites};
    use crate::fleet_stats::merge;
    use std::time::Duration;

    fn ops(workload: &Workload) -> Vec<OpStats> {
        workload.operations.iter().map(|_| OpStats { hist: fleet_stats::histogram(), errors: BTreeMap::new() }).collect()
    }

    #[test]
    fn a_site_is_judged_on_its_one_window() {
        let w = olio();
        // HomePage (limit 1 s): 95 fast and 5 slow pass SLA-1 and fail SLA-2.
        let mut site = ops(&w);
        for i in 0..100 {
            site[0].record(if i < 95 { 200_000 } else { 1_500_000 });
        }
        let (sla1, sla2) = judge_site(&w, site.clone(), true);
        assert!(sla1.passed && !sla2.passed, "{sla1:?} {sla2:?}");
        assert!(sla2.detail.contains("HomePage in the span: 95.0% within 1 s"), "{}", sla2.detail);
        // Errors count as not within the limit: 6 failed EventDetails of 50 fail SLA-1.
        for _ in 0..44 {
            site[3].record(100_000);
        }
        for _ in 0..6 {
            site[3].error("http 500");
        }
        let (sla1, _) = judge_site(&w, site, true);
        assert!(!sla1.passed && sla1.detail.contains("EventDetail in the span: 88.0% within 2 s"), "{}", sla1.detail);
        // A site with nothing to do passes; one that should have had users and saw nothing fails.
        assert!(judge_site(&w, Vec::new(), false).0.passed);
        let (sla1, sla2) = judge_site(&w, ops(&w), true);
        assert!(!sla1.passed && !sla2.passed && sla1.detail.contains("no operation ran"));
    }

    fn context() -> RunContext {
        RunContext {
            stack: "test".into(),
            url: "http://127.0.0.1:1".into(),
            machine: "m".into(),
            seed: 5,
            agents: 2,
            interval_s: 10.0,
            idle_gap_s: 60.0,
            sut_cpus: vec![0],
        }
    }

    #[tokio::test(start_paused = true)]
    async fn two_agents_shares_make_one_report() {
        // Sites 0 and 2 go to agent 0, site 1 to agent 1; site 1 is slow (1.5 s for every
        // operation: HomePage and Login are over their 1 s limit), site 3 is idle.
        let fleet = fleet(120, &["[[0, 2], [60.5, 0]]", "[[0, 1]]", "[[0, 0], [30.5, 1]]"], 1);
        let w = olio();
        let (share0, _, _) = sites(&fleet, Some(Duration::from_millis(30)), 2);
        let r0 = fleet_agent::run(share0, w.clone(), plan(120, 60)).await.unwrap();
        let (share1, _, _) = {
            let (mut all, log, users) = sites(&fleet, Some(Duration::from_millis(1500)), 1);
            all.retain(|s| s.index % 2 == 1);
            (all, log, users)
        };
        let mut agent1 = plan(120, 60);
        agent1.agent = 1;
        let r1 = fleet_agent::run(share1, w.clone(), agent1).await.unwrap();
        let wire: Vec<fleet_stats::FleetAgentResult> = serde_json::from_str(&serde_json::to_string(&[r0, r1]).unwrap()).unwrap();
        let merged = merge(4, wire).unwrap();
        let report = build(&w, &fleet, &merged, &context(), Vec::new()).unwrap();
        assert_eq!(report.sites_failing_sla1, vec!["b1.test"]);
        assert!(!report.passed_sla1 && !report.passed_sla2);
        assert!(report.sites[0].sla1 && report.sites[2].sla1 && report.sites[3].sla1);
        assert_eq!(report.sites[3].detail, "no users in the span");
        assert_eq!(report.requests, report.sites.iter().map(|s| s.requests).sum::<u64>());
        assert_eq!(report.requests, report.operations.values().map(|o| o.summary.count + o.summary.errors).sum::<u64>());
        // The first operation of each busy site is the first after idle; b1's (1.5 s) is the worst.
        let idle = &report.first_after_idle;
        assert_eq!((idle.count, idle.within_limit), (3, 2));
        assert_eq!((idle.worst_ms, idle.worst_host.as_deref()), (Some(1500.0), Some("b1.test")));
        // Both agents' users, interval by interval.
        let users: Vec<usize> = report.series.iter().map(|p| p.active_users).collect();
        assert_eq!(users, vec![3, 3, 3, 4, 4, 4, 2, 2, 2, 2, 2, 2]);
        assert_eq!(report.series[7].active_sites, 2);
        assert!(report.series[0].p90_ms.unwrap() >= 1500.0 && report.series[11].p90_ms.unwrap() >= 1500.0);
        // The keys other tools read.
        let json = serde_json::to_value(&report).unwrap();
        for key in [
            "stack",
            "url",
            "sites_total",
            "span_s",
            "machine",
            "seed",
            "passed_sla1",
            "passed_sla2",
            "sites_failing_sla1",
            "sites_failing_sla2",
            "requests",
            "errors",
            "first_after_idle",
            "sites",
            "series",
            "utilization",
            "resources",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
        let site = &json["sites"][1];
        for key in ["name", "host", "requests", "errors", "sla1", "sla2", "detail", "ops", "first_after_idle"] {
            assert!(site.get(key).is_some(), "sites[]: {key}");
        }
        for key in ["count", "errors", "p90_ms", "p99_ms", "max_ms"] {
            assert!(site["ops"]["HomePage"].get(key).is_some(), "ops: {key}");
        }
        for key in ["t", "op", "ms", "ok"] {
            assert!(site["first_after_idle"][0].get(key).is_some(), "first_after_idle[]: {key}");
        }
        for key in ["t", "ops_per_s", "errors", "active_users", "active_sites", "p90_ms", "p99_ms"] {
            assert!(json["series"][0].get(key).is_some(), "series[]: {key}");
        }
        assert!(report.text().contains("FAIL SLA-1 (90th): 1 site(s) over: b1.test"), "{}", report.text());
    }
}
