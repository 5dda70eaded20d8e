//! The search's summary (`--json`): each deployment's largest fleet within SLA-2 and its
//! price per site-month, the ratios between deployments, and an earlier summary to resume
//! from.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use sprout_bench::fleet::Bracket;

use super::args::FleetArgs;
use super::run::FleetStep;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StackResult {
    /// The largest fleet that passed (0: none did).
    pub sites_sla2: usize,
    /// It passed at --max: the true maximum may be higher.
    pub lower_bound: bool,
    pub usd_per_site_month: Option<f64>,
    /// The largest passing fleet's p99 of first requests after an idle spell (sprout-gvisor:
    /// after its pod was parked; conventional-ondemand: after its vassal stopped), ms.
    #[serde(default)]
    pub first_after_idle_p99_ms: Option<f64>,
    /// The largest passing fleet's p99 of parked handlers' first requests, timed in the worker
    /// from the request to its reply, the pod's restore included (sprout-gvisor only; its
    /// `parking` has the p50, the count and the longest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_request_after_park_p99_ms: Option<f64>,
    /// The largest passing fleet's gVisor parking figures at its end (sprout-gvisor only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parking: Option<serde_json::Value>,
    /// The same at every price in the pricing file.
    pub usd_per_site_month_by_price: std::collections::BTreeMap<String, f64>,
    /// The stack's own settings the search ran with (conventional-ondemand's vassals; null:
    /// fleet-up's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<serde_json::Value>,
    pub steps: Vec<FleetStep>,
    /// When and where this deployment was searched: a summary keeps the deployments it did
    /// not search again, so its own `date` and `machine` are only the newest search's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
}

/// One instance for a month (upfront costs over a year), per site held.
fn per_site_month(price: &sprout_load::Price, sites: usize) -> f64 {
    (price.usd_per_instance_hour * sprout_load::HOURS_PER_MONTH + price.upfront_usd / 12.0) / sites as f64
}

pub(super) fn stack_result(
    stack: &str,
    steps: &[FleetStep],
    bracket: &Bracket,
    pricing: &sprout_load::Pricing,
    price: &sprout_load::Price,
    a: &FleetArgs,
) -> StackResult {
    let best = steps.iter().filter(|s| s.passed).map(|s| s.sites).max().unwrap_or(0);
    let best_step = steps.iter().rfind(|s| s.passed && s.sites == best);
    StackResult {
        sites_sla2: best,
        first_after_idle_p99_ms: best_step.and_then(|s| s.first_after_idle_p99_ms),
        parking: best_step.and_then(|s| s.parking.clone()),
        first_request_after_park_p99_ms: best_step
            .and_then(|s| s.parking.as_ref())
            .filter(|p| p["first_requests_after_park"].as_u64().unwrap_or(0) > 0)
            .and_then(|p| p["first_request_after_park_p99_ms"].as_f64()),
        lower_bound: a.sites.is_none() && bracket.failed.is_none() && best > 0,
        usd_per_site_month: (best > 0).then(|| per_site_month(price, best)),
        usd_per_site_month_by_price: if best > 0 {
            pricing.prices.iter().map(|p| (p.name.clone(), per_site_month(p, best))).collect()
        } else {
            Default::default()
        },
        settings: (stack == "conventional-ondemand")
            .then(|| serde_json::json!({"vassal_idle_s": a.vassal_idle, "vassal_processes": a.vassal_processes})),
        steps: steps.to_vec(),
        date: Some(chrono_free_date()),
        machine: Some(sprout_bench::report::machine()),
    }
}

pub(super) fn write_summary(
    a: &FleetArgs,
    stacks: &serde_json::Map<String, serde_json::Value>,
    price: &sprout_load::Price,
) -> Result<serde_json::Value> {
    let held = |name: &str| stacks.get(name).and_then(|s| s["sites_sla2"].as_u64()).filter(|&n| n > 0);
    let ratio = |x: &str, y: &str| match (held(x), held(y)) {
        (Some(x), Some(y)) => serde_json::json!(x as f64 / y as f64),
        _ => serde_json::Value::Null,
    };
    let summary = serde_json::json!({
        "machine": sprout_bench::report::machine(),
        "date": chrono_free_date(),
        "memory_budget_mb": a.memory_mb,
        "sut_cpus": a.cpus,
        "agent_cpus": a.agent_cpus,
        "span_s": a.span_s().unwrap_or(a.span),
        "session_mean_s": a.session_mean,
        "registered_users_per_site": a.registered_users,
        "seed": a.seed,
        "fleet_file": a.fleet.as_ref().map(|p| p.display().to_string()),
        "price": {"name": price.name, "usd_per_instance_hour": price.usd_per_instance_hour, "description": price.description},
        "runs_dir": runs_dir(a),
        "stacks": stacks,
        "ratios": {
            "sprout_vs_conventional": ratio("sprout", "conventional"),
            "sprout_vs_sprout_runc": ratio("sprout", "sprout-runc"),
            "sprout_vs_sprout_gvisor": ratio("sprout", "sprout-gvisor"),
            "sprout_gvisor_vs_conventional": ratio("sprout-gvisor", "conventional"),
            "sprout_vs_conventional_ondemand": ratio("sprout", "conventional-ondemand"),
            "sprout_gvisor_vs_conventional_ondemand": ratio("sprout-gvisor", "conventional-ondemand"),
        },
    });
    let text = serde_json::to_vec_pretty(&summary)?;
    std::fs::create_dir_all(json_dir(&a.json))?;
    std::fs::write(&a.json, &text)?;
    Ok(summary)
}

/// The deployments' results in an earlier summary at --json, if it ran with the same budget,
/// span, sessions, seed and sites (none if it is absent, unreadable or different).
pub(super) fn previous_stacks(a: &FleetArgs) -> serde_json::Map<String, serde_json::Value> {
    let Some(old) = std::fs::read(&a.json).ok().and_then(|text| serde_json::from_slice::<serde_json::Value>(&text).ok()) else {
        return Default::default();
    };
    let same = old["memory_budget_mb"].as_u64() == Some(a.memory_mb)
        && old["span_s"].as_f64() == a.span_s().ok()
        && old["session_mean_s"].as_f64() == Some(a.session_mean)
        && old["seed"].as_u64() == Some(a.seed)
        && old["fleet_file"].as_str().map(PathBuf::from) == a.fleet.clone();
    if !same {
        eprintln!("note: {} ran with other settings; its results are replaced", a.json.display());
        return Default::default();
    }
    old["stacks"].as_object().cloned().unwrap_or_default()
}

fn json_dir(json: &Path) -> &Path {
    json.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Where the runs are, as the summary's reader finds them: relative to the summary when
/// they are below it (the default), else absolute.
fn runs_dir(a: &FleetArgs) -> String {
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (out, base) = (absolute(&a.out), absolute(json_dir(&a.json)));
    out.strip_prefix(&base).map(Path::to_path_buf).unwrap_or(out).display().to_string()
}

pub(super) fn summary_text(summary: &serde_json::Value) -> String {
    let mut lines = Vec::new();
    if let Some(stacks) = summary["stacks"].as_object() {
        for (name, s) in stacks {
            lines.push(format!(
                "{name}: {} sites within SLA-2 in {} MiB{}; ${} per site-month",
                s["sites_sla2"],
                summary["memory_budget_mb"],
                if s["lower_bound"].as_bool() == Some(true) { " (at --max: a lower bound)" } else { "" },
                s["usd_per_site_month"].as_f64().map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into())
            ));
        }
    }
    lines.join("\n")
}

/// Today's date (UTC) as YYYY-MM-DD, from `date`.
fn chrono_free_date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
