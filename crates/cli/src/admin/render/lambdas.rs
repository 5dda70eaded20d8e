//! `sprout ls` and `sprout show`: the registry's lambdas joined with their `/stats` figures.

use std::fmt::Write as _;

use serde_json::Value;

use super::text::{ago, bytes, labelled, mib, number, rfc3339, span, table};

/// `/stats` with each lambda's invocations since the worker started (its
/// `lambda_invocations`) in its figures, which it has whether or not it has sandboxes now.
pub(crate) fn with_invocations(mut stats: Value) -> Value {
    if let Value::Object(counts) = stats["lambda_invocations"].take() {
        for (name, counts) in counts {
            let figures = &mut stats["lambdas"]["per_lambda"][name.as_str()];
            for key in ["invocations", "cold_starts", "errors"] {
                figures[key] = counts[key].clone();
            }
        }
    }
    stats
}

/// The figures `/stats` keeps for lambda `name` (none before its first request).
pub(crate) fn figures_of<'a>(stats: &'a Value, name: &str) -> Option<&'a Value> {
    stats["lambdas"]["per_lambda"].get(name).filter(|f| f.is_object())
}

/// `{"lambda": <GET /registry/NAME as it came>, "stats": <its /stats figures or null>}`.
pub(crate) fn combined(raw: &str, figures: Option<&Value>) -> String {
    format!("{{\"lambda\":{},\"stats\":{}}}", raw.trim(), figures.map_or_else(|| "null".to_string(), Value::to_string))
}

/// A lambda's invocations in `/stats`: its `invocations` if the worker gives them, else the
/// requests its sandboxes `served`.
pub(super) fn invocations(figures: &Value) -> u64 {
    figures["invocations"].as_u64().or_else(|| figures["served"].as_u64()).unwrap_or(0)
}

/// Busy and idle sandboxes of a lambda's figures.
pub(super) fn busy_idle(figures: &Value) -> (u64, u64) {
    let idle = figures["idle"].as_u64().unwrap_or(0);
    (figures["sandboxes"].as_u64().unwrap_or(0).saturating_sub(idle), idle)
}

/// `sprout ls`: a row per lambda (its `GET /registry/NAME` metadata and `/stats` figures).
pub fn render_ls(lambdas: &[(Value, Option<&Value>)], now: u64) -> String {
    if lambdas.is_empty() {
        return "no lambdas\n".to_string();
    }
    let none = Value::Null;
    let rows: Vec<Vec<String>> = lambdas
        .iter()
        .map(|(meta, figures)| {
            let figures = figures.unwrap_or(&none);
            let (busy, idle) = busy_idle(figures);
            vec![
                meta["name"].as_str().unwrap_or("?").to_string(),
                number(&meta["version"]),
                meta["uploaded"].as_u64().map_or_else(|| "?".to_string(), |t| ago(t, now)),
                format!("{busy}/{idle}"),
                invocations(figures).to_string(),
            ]
        })
        .collect();
    table(&["NAME", "VERSION", "UPLOADED", "BUSY/IDLE", "INVOCATIONS"], &rows, &[1, 3, 4])
}

/// `sprout show NAME`: its metadata, its `ol.yaml` as the worker keeps it, and its figures.
pub fn render_show(meta: &Value, figures: Option<&Value>, now: u64) -> String {
    let mut rows: Vec<(&str, String)> =
        vec![("name", meta["name"].as_str().unwrap_or("?").to_string()), ("version", number(&meta["version"]))];
    if let Some(backend) = meta["backend"].as_str() {
        rows.push(("backend", backend.to_string()));
    }
    if let Some(t) = meta["uploaded"].as_u64() {
        rows.push(("uploaded", format!("{} ({})", rfc3339(t), ago(t, now))));
    }
    rows.push(("sha256", meta["sha256"].as_str().unwrap_or("?").to_string()));
    rows.push((
        "files",
        format!(
            "{}, {} unpacked (archive {})",
            number(&meta["files"]),
            meta["unpacked_bytes"].as_u64().map_or_else(|| "?".into(), bytes),
            meta["archive_bytes"].as_u64().map_or_else(|| "?".into(), bytes)
        ),
    ));
    let requirements: Vec<&str> = meta["requirements"].as_array().map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    rows.push(("requirements", if requirements.is_empty() { "none".to_string() } else { requirements.join(", ") }));
    match meta["config"].as_object() {
        Some(config) if !config.is_empty() => {
            let lines: Vec<String> = config
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => format!("{k}: {s}"),
                    v => format!("{k}: {v}"),
                })
                .collect();
            rows.push(("config", lines.join("\n")));
        }
        _ => rows.push(("config", "defaults".to_string())),
    }
    match figures {
        Some(f) => {
            let (busy, idle) = busy_idle(f);
            rows.push(("sandboxes", format!("{} (busy {busy}, idle {idle}), queued {}", number(&f["sandboxes"]), number(&f["queued"]))));
            rows.push(("served", number(&f["served"])));
            if f["invocations"].is_number() {
                let line = format!("{} (cold {}, errors {})", number(&f["invocations"]), number(&f["cold_starts"]), number(&f["errors"]));
                rows.push(("invocations", line));
            }
            let k = &f["keep_alive"];
            if k.is_object() {
                let mut line = k["policy"].as_str().unwrap_or("?").to_string();
                if let Some(basis) = k["basis"].as_str() {
                    let _ = write!(line, " ({basis}, {} idle times)", number(&k["idle_times"]));
                }
                let _ = write!(line, ": keep {}", k["keep_alive_s"].as_f64().map_or_else(|| "?".into(), span));
                if let Some(prewarm) = k["prewarm_s"].as_f64().filter(|&p| p > 0.0) {
                    let _ = write!(line, ", pre-warm after {}", span(prewarm));
                }
                rows.push(("keep-alive", line));
            }
            if f["memory_estimate_mb"].is_number() {
                rows.push(("memory estimate", mib(&f["memory_estimate_mb"])));
            }
        }
        None => rows.push(("sandboxes", "none (no request since the worker started)".to_string())),
    }
    labelled(&rows)
}
