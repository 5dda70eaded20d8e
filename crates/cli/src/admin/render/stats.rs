//! `sprout stats`: the worker's `/stats` as a page of one-liners.

use std::fmt::Write as _;

use serde_json::Value;

use super::text::{labelled, mib, ms, number, span};

/// `a 1, b 2` of an object's non-zero numbers, or `none`.
pub(super) fn counts(v: &Value) -> String {
    let parts: Vec<String> = v
        .as_object()
        .map(|o| o.iter().filter(|(_, n)| n.as_f64().is_some_and(|n| n != 0.0)).map(|(k, n)| format!("{k} {}", number(n))).collect())
        .unwrap_or_default();
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(", ")
    }
}

/// `p50 1.23 ms, p99 4.56 ms` of a latency summary, or `none` without samples.
pub(super) fn percentiles(summary: &Value) -> String {
    if summary["count"].as_u64() == Some(0) {
        return "none".to_string();
    }
    format!("p50 {}, p99 {}", ms(&summary["p50_ms"]), ms(&summary["p99_ms"]))
}

/// `sprout stats`: the worker's `/stats` as a page of one-liners.
pub fn render_stats(s: &Value) -> String {
    let mut rows: Vec<(&str, String)> = Vec::new();
    let mut worker = s["backend"].as_str().unwrap_or("?").to_string();
    if let Some(up) = s["uptime_s"].as_f64() {
        let _ = write!(worker, " backend, up {}", span(up));
    }
    rows.push(("worker", worker));
    rows.push((
        "invocations",
        format!("{} (cold {}, warm {})", number(&s["invocations"]), number(&s["cold_starts"]), number(&s["warm_starts"])),
    ));
    let latency = &s["latency"];
    rows.push(("latency", format!("cold {}; warm {}", percentiles(&latency["cold"]), percentiles(&latency["warm"]))));
    if s["sandbox_start"].is_object() {
        let start = &s["sandbox_start"];
        rows.push(("sandbox start", format!("{} ({} started)", percentiles(start), number(&start["count"]))));
    }
    let sb = &s["sandboxes"];
    let mut sandboxes = format!("starting {}, busy {}, idle {}", number(&sb["starting"]), number(&sb["busy"]), number(&sb["idle"]));
    if let Some(paused) = s["handler_cache"]["paused"].as_u64() {
        let _ = write!(sandboxes, " (paused {paused})");
    }
    rows.push(("sandboxes", sandboxes));
    // A worker with more than one isolation class: each back-end's sandboxes.
    if let Some(backends) = s["backends"].as_object().filter(|b| b.len() > 1) {
        for (name, b) in backends {
            let sb = &b["sandboxes"];
            let line = format!(
                "{name}: starting {}, busy {}, idle {}; {} made",
                number(&sb["starting"]),
                number(&sb["busy"]),
                number(&sb["idle"]),
                number(&b["counters"]["created"])
            );
            rows.push(("  by back-end", line));
        }
    }
    let lambdas = &s["lambdas"];
    if let Some(per) = lambdas["per_lambda"].as_object() {
        let queued: u64 = per.values().filter_map(|f| f["queued"].as_u64()).sum();
        rows.push(("lambdas", format!("{} with sandboxes or requests, {queued} requests queued", per.len())));
    }
    let budget = &lambdas["memory_budget"];
    rows.push((
        "memory budget",
        if budget.is_object() {
            format!(
                "{} of {} used, {} pending; {} waits, {} evictions, {} queued instead",
                mib(&budget["used_mb"]),
                mib(&budget["limit_mb"]),
                mib(&budget["pending_mb"]),
                number(&budget["waits"]),
                number(&budget["evictions"]),
                number(&budget["queued_instead"])
            )
        } else {
            "none".to_string()
        },
    ));
    let h = &s["handler_cache"];
    if h.is_object() {
        rows.push((
            "handler cache",
            format!(
                "{}{} paused, {} PSS of {} MiB; {} pauses, {} resumes; evictions: {}",
                if h["pause"].as_bool() == Some(false) { "off; " } else { "" },
                number(&h["paused"]),
                mib(&h["paused_pss_mb"]),
                number(&h["memory_limit_mb"]),
                number(&h["pauses"]),
                number(&h["resumes"]),
                counts(&h["evictions"])
            ),
        ));
    }
    let i = &s["install_cache"];
    if i.is_object() {
        rows.push((
            "install cache",
            format!(
                "{}{} packages; {} hits, {} misses, {} installs ({} s), {} failures",
                if i["enabled"].as_bool() == Some(false) { "off; " } else { "" },
                number(&i["installed_packages"]),
                number(&i["hits"]),
                number(&i["misses"]),
                number(&i["installs"]),
                number(&i["install_seconds"]),
                i["install_failures"].as_u64().unwrap_or(0) + i["resolution_failures"].as_u64().unwrap_or(0)
            ),
        ));
    }
    let z = &s["import_cache"];
    rows.push((
        "import cache",
        if z.is_object() {
            format!(
                "{}{} Zygotes, {} PSS of {} MiB; {} hits, {} misses, {} fallbacks; {} spares ready",
                if z["enabled"].as_bool() == Some(false) { "off; " } else { "" },
                number(&z["zygotes"]),
                mib(&z["package_zygotes_pss_mb"]),
                number(&z["memory_limit_mb"]),
                number(&z["import_cache_hits"]),
                number(&z["import_cache_misses"]),
                number(&z["import_cache_fallbacks"]),
                number(&z["spares_ready"])
            )
        } else {
            "none (this backend has no Zygotes)".to_string()
        },
    ));
    rows.push(("errors", counts(&s["errors"])));
    if s["retries"].is_object() {
        rows.push(("retries", counts(&s["retries"])));
    }
    labelled(&rows)
}
