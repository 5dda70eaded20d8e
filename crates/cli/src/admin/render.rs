//! How the admin verbs show the worker's answers to people: tables, labelled lines, log
//! entries as text, relative times and sizes. Pure: JSON in, text out.

use std::fmt::Write as _;

use serde_json::Value;

/// `/stats` with each lambda's invocations since the worker started (its
/// `lambda_invocations`) in its figures, which it has whether or not it has sandboxes now.
pub(super) fn with_invocations(mut stats: Value) -> Value {
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
pub(super) fn figures_of<'a>(stats: &'a Value, name: &str) -> Option<&'a Value> {
    stats["lambdas"]["per_lambda"].get(name).filter(|f| f.is_object())
}

/// `{"lambda": <GET /registry/NAME as it came>, "stats": <its /stats figures or null>}`.
pub(super) fn combined(raw: &str, figures: Option<&Value>) -> String {
    format!("{{\"lambda\":{},\"stats\":{}}}", raw.trim(), figures.map_or_else(|| "null".to_string(), Value::to_string))
}

/// JSON text re-indented (two spaces, `"key": value`), its keys and numbers left as they came.
/// For text that is not JSON, the text.
pub fn pretty(raw: &str) -> String {
    if serde_json::from_str::<serde::de::IgnoredAny>(raw).is_err() {
        return raw.to_string();
    }
    fn newline(out: &mut String, depth: usize) {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    }
    let chars: Vec<char> = raw.trim().chars().collect();
    let mut out = String::with_capacity(raw.len() * 2);
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            i += 1;
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                let next = chars[i + 1..].iter().position(|c| !c.is_whitespace()).map(|p| i + 1 + p);
                match next {
                    Some(j) if matches!(chars[j], '}' | ']') => {
                        out.push(c);
                        out.push(chars[j]);
                        i = j;
                    }
                    _ => {
                        out.push(c);
                        depth += 1;
                        newline(&mut out, depth);
                    }
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(',');
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// Columns padded to their widest cell, two spaces apart; `right`: the columns aligned right.
pub fn table(headers: &[&str], rows: &[Vec<String>], right: &[usize]) -> String {
    let width = |s: &str| s.chars().count();
    let mut widths: Vec<usize> = headers.iter().map(|h| width(h)).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(width(cell));
        }
    }
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_row).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = " ".repeat(widths[i] - width(cell));
            if right.contains(&i) {
                line.push_str(&pad);
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&pad);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// How long ago `then` was, at `now` (Unix seconds): `12s ago`, `3m ago`, `5h ago`, `2d ago`.
pub fn ago(then: u64, now: u64) -> String {
    let s = now.saturating_sub(then);
    match s {
        0 => "just now".to_string(),
        1..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86400),
    }
}

/// A span of seconds in its two largest units: `45s`, `3m 12s`, `2h 3m`, `4d 1h`.
pub fn span(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86399 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

/// Unix seconds as RFC 3339 UTC: `2026-11-27T07:32:21Z`.
pub fn rfc3339(secs: u64) -> String {
    // Howard Hinnant's days-to-civil, for the proleptic Gregorian calendar.
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Bytes for people: `148 B`, `1.2 KiB`, `3.4 MiB`, `1.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 3] = ["KiB", "MiB", "GiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A line a handler wrote, safe to print: control characters (a terminal's escapes) shown as
/// `\x1b`, tabs kept.
pub fn clean(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for c in message.chars() {
        if c.is_control() && c != '\t' {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// One log entry as a line: `TIME MESSAGE`, a handler's line (`out`) with the first 8 digits
/// of its request id between them when it has one.
pub fn render_entry(entry: &Value) -> String {
    let time = match (entry["time"].as_str(), entry["ts"].as_f64()) {
        (Some(time), _) => time.to_string(),
        (None, Some(ts)) => rfc3339(ts.max(0.0) as u64),
        (None, None) => "?".to_string(),
    };
    let message = clean(entry["message"].as_str().unwrap_or(""));
    match (entry["type"].as_str(), entry["request_id"].as_str()) {
        (Some("out"), Some(id)) if !id.is_empty() => format!("{time} {} {message}", id.chars().take(8).collect::<String>()),
        _ => format!("{time} {message}"),
    }
}

/// What a `/logs` reply's `dropped` says, when something was.
pub(super) fn dropped_note(dropped: &Value) -> Option<String> {
    let lines = dropped["lines"].as_u64().filter(|&n| n > 0)?;
    Some(format!(
        "({lines} lines, {} of this lambda's output dropped past its rate since the worker started)",
        bytes(dropped["bytes"].as_u64().unwrap_or(0))
    ))
}

/// A JSON number as an integer if it is one, else with up to two decimals; `?` if absent.
pub(super) fn number(v: &Value) -> String {
    if let Some(n) = v.as_u64() {
        n.to_string()
    } else if let Some(n) = v.as_i64() {
        n.to_string()
    } else if let Some(f) = v.as_f64() {
        format!("{f:.2}").trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        "?".to_string()
    }
}

pub(super) fn ms(v: &Value) -> String {
    v.as_f64().map_or_else(|| "?".to_string(), |f| format!("{f:.2} ms"))
}

pub(super) fn mib(v: &Value) -> String {
    v.as_f64().map_or_else(|| "?".to_string(), |f| format!("{f:.1} MiB"))
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

/// `label  value` lines, the values aligned; a value's further lines indented under it.
pub(super) fn labelled(rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(l, _)| l.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (label, value) in rows {
        for (i, line) in value.lines().enumerate() {
            let label = if i == 0 { *label } else { "" };
            let _ = writeln!(out, "{label:width$}  {line}");
        }
    }
    out
}

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

/// `lambda echo, static /s/ → /srv/s` of a site.
pub(super) fn describe_site(site: &Value) -> String {
    let mut out = site["lambda"].as_str().unwrap_or("?").to_string();
    let statics = static_list(&site["static"]);
    if statics != "-" {
        let _ = write!(out, ", static {statics}");
    }
    out
}

pub(super) fn static_list(statics: &Value) -> String {
    let parts: Vec<String> =
        statics.as_object().map(|o| o.iter().map(|(p, d)| format!("{p} → {}", d.as_str().unwrap_or("?"))).collect()).unwrap_or_default();
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(", ")
    }
}

/// `sprout sites ls`: a row per host (`*`: the default site).
pub fn render_sites(sites: &Value) -> String {
    let Some(sites) = sites.as_object().filter(|s| !s.is_empty()) else { return "no sites\n".to_string() };
    let rows: Vec<Vec<String>> = sites
        .iter()
        .map(|(host, s)| {
            vec![
                host.clone(),
                s["site"]["lambda"].as_str().unwrap_or("?").to_string(),
                s["source"].as_str().unwrap_or("?").to_string(),
                static_list(&s["site"]["static"]),
            ]
        })
        .collect();
    table(&["HOST", "LAMBDA", "SOURCE", "STATIC"], &rows, &[])
}

#[cfg(test)]
mod tests {
    use super::super::{parse_static, segment};
    use super::*;
    use serde_json::json;

    #[test]
    fn a_lambdas_invocations_join_its_figures_with_or_without_sandboxes() {
        let stats = json!({
            "lambdas": {"per_lambda": {"busy": {"sandboxes": 1, "idle": 0, "served": 2}}},
            "lambda_invocations": {"busy": {"invocations": 7, "cold_starts": 1, "errors": 0},
                                   "gone": {"invocations": 3, "cold_starts": 1, "errors": 1}},
        });
        let stats = with_invocations(stats);
        assert_eq!(invocations(figures_of(&stats, "busy").unwrap()), 7);
        assert_eq!(invocations(figures_of(&stats, "gone").unwrap()), 3);
        assert_eq!(figures_of(&stats, "busy").unwrap()["sandboxes"], 1);
        assert!(figures_of(&stats, "never").is_none());
        assert!(stats.get("lambda_invocations").is_none_or(Value::is_null));
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![vec!["echo".to_string(), "12".to_string(), "x".to_string()], vec!["a-long-name".into(), "3".into(), "".into()]];
        assert_eq!(table(&["NAME", "N", "NOTE"], &rows, &[1]), "NAME          N  NOTE\necho         12  x\na-long-name   3\n");
        assert_eq!(table(&["A", "B"], &[], &[]), "A  B\n");
    }

    #[test]
    fn times_read_as_people_say_them() {
        assert_eq!(ago(100, 100), "just now");
        assert_eq!(ago(100, 90), "just now");
        assert_eq!(ago(100, 159), "59s ago");
        assert_eq!(ago(100, 100 + 180), "3m ago");
        assert_eq!(ago(0, 7200), "2h ago");
        assert_eq!(ago(0, 3 * 86400 + 5), "3d ago");
        assert_eq!(span(45.7), "45s");
        assert_eq!(span(192.0), "3m 12s");
        assert_eq!(span(7380.0), "2h 3m");
        assert_eq!(span(90000.0), "1d 1h");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_764_741), "2026-11-27T07:32:21Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
        assert_eq!(bytes(148), "148 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(bytes(5 << 30), "5.0 GiB");
    }

    #[test]
    fn log_entries_print_as_lines() {
        let out = json!({"seq": 812, "time": "2026-11-27T10:02:03.456Z", "ts": 1795779723.456, "lambda": "echo", "version": 3,
                         "request_id": "9f3a0c1d2b4e5f60", "sandbox": 17, "backend": "sock", "type": "out", "message": "hello"});
        assert_eq!(render_entry(&out), "2026-11-27T10:02:03.456Z 9f3a0c1d hello");
        let report = json!({"time": "2026-11-27T10:02:03.457Z", "type": "report", "request_id": "9f3a0c1d2b4e5f60", "duration_ms": 1.23,
                            "message": "REPORT RequestId: 9f3a0c1d2b4e5f60 Duration: 1.23 ms Billed Duration: 2 ms Max Memory Used: 12 MB"});
        assert_eq!(
            render_entry(&report),
            "2026-11-27T10:02:03.457Z REPORT RequestId: 9f3a0c1d2b4e5f60 Duration: 1.23 ms Billed Duration: 2 ms Max Memory Used: 12 MB"
        );
        let outside = json!({"time": "2026-11-27T10:02:03.000Z", "type": "out", "request_id": null, "message": "loading"});
        assert_eq!(render_entry(&outside), "2026-11-27T10:02:03.000Z loading");
        let hostile = json!({"time": "T", "type": "out", "request_id": "abc", "message": "\u{1b}[2Jgone\tok\r"});
        assert_eq!(render_entry(&hostile), "T abc \\x1b[2Jgone\tok\\x0d");
        assert_eq!(
            render_entry(&json!({"ts": 0.5, "type": "dropped", "message": "dropped 3 lines"})),
            "1970-01-01T00:00:00Z dropped 3 lines"
        );
        assert_eq!(dropped_note(&json!({"lines": 0, "bytes": 0})), None);
        assert!(dropped_note(&json!({"lines": 3, "bytes": 2048})).unwrap().contains("3 lines, 2.0 KiB"));
    }

    #[test]
    fn pretty_keeps_the_order_and_text_of_the_json() {
        let raw = r#"{"z":1,"a":{"s":"x, y: {[\"q\"]}","e":[],"o":{}},"n":[1.50,2]}"#;
        let out = pretty(raw);
        assert_eq!(
            out,
            "{\n  \"z\": 1,\n  \"a\": {\n    \"s\": \"x, y: {[\\\"q\\\"]}\",\n    \"e\": [],\n    \"o\": {}\n  },\n  \"n\": [\n    1.50,\n    2\n  ]\n}"
        );
        assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), serde_json::from_str::<Value>(raw).unwrap());
        assert_eq!(pretty("[]"), "[]");
        assert_eq!(pretty("not json"), "not json");
        let value = json!({"b": [1, {"c": null}], "a": "é\\"});
        assert_eq!(pretty(&value.to_string()), serde_json::to_string_pretty(&value).unwrap());
    }

    #[test]
    fn ls_and_show_render_the_registry_and_the_figures() {
        let meta = json!({"archive_bytes": 148, "config": {"reuse_sandbox": true, "environment": {"GREETING": "hello"}}, "files": 1,
                          "name": "echo", "requirements": ["jinja2==3.1.4"], "sha256": "acd5", "unpacked_bytes": 2048,
                          "uploaded": 1_795_764_741u64, "version": 3});
        let figures = json!({"idle": 1, "queued": 0, "sandboxes": 3, "served": 42,
                             "keep_alive": {"basis": "young", "idle_times": 2, "keep_alive_s": 300.0, "policy": "histogram", "prewarm_s": 0.0}});
        let other = json!({"name": "a", "version": 12, "uploaded": 1_795_764_741u64 - 7200});
        let now = 1_795_764_741 + 180;
        assert_eq!(
            render_ls(&[(other, None), (meta.clone(), Some(&figures))], now),
            "NAME  VERSION  UPLOADED  BUSY/IDLE  INVOCATIONS\n\
             a          12  2h ago          0/0            0\n\
             echo        3  3m ago          2/1           42\n"
        );
        assert_eq!(render_ls(&[], now), "no lambdas\n");
        let shown = render_show(&meta, Some(&figures), now);
        assert_eq!(
            shown,
            "name          echo\n\
             version       3\n\
             uploaded      2026-11-27T07:32:21Z (3m ago)\n\
             sha256        acd5\n\
             files         1, 2.0 KiB unpacked (archive 148 B)\n\
             requirements  jinja2==3.1.4\n\
             config        environment: {\"GREETING\":\"hello\"}\n\
             \x20             reuse_sandbox: true\n\
             sandboxes     3 (busy 2, idle 1), queued 0\n\
             served        42\n\
             keep-alive    histogram (young, 2 idle times): keep 5m 0s\n"
        );
        assert!(render_show(&json!({"name": "x", "config": {}}), None, now).contains("sandboxes     none (no request"));
    }

    #[test]
    fn stats_read_as_one_liners() {
        let stats = json!({
            "backend": "sock", "uptime_s": 7380.0, "invocations": 3, "cold_starts": 1, "warm_starts": 2,
            "latency": {"cold": {"count": 1, "p50_ms": 3.449, "p99_ms": 3.449}, "warm": {"count": 0, "p50_ms": 0.0, "p99_ms": 0.0}},
            "sandbox_start": {"count": 1, "p50_ms": 2.989, "p99_ms": 2.989},
            "sandboxes": {"starting": 0, "busy": 1, "idle": 2},
            "errors": {"timeout": 2, "handler_exception": 1}, "retries": {"no_reply": 0, "send_failed": 0},
            "handler_cache": {"pause": true, "paused": 1, "paused_pss_mb": 4.25, "memory_limit_mb": 1024, "pauses": 5, "resumes": 4,
                              "evictions": {"idle": 1, "budget": 0}},
            "install_cache": {"enabled": true, "installed_packages": 2, "hits": 3, "misses": 1, "installs": 1, "install_seconds": 2.5,
                              "install_failures": 0, "resolution_failures": 1},
            "import_cache": null,
            "lambdas": {"per_lambda": {"echo": {"queued": 2}}, "memory_budget": {"limit_mb": 2048.0, "used_mb": 100.0, "pending_mb": 0.0,
                        "waits": 1, "evictions": 0, "queued_instead": 0}},
        });
        let out = render_stats(&stats);
        for line in [
            "worker         sock backend, up 2h 3m",
            "invocations    3 (cold 1, warm 2)",
            "latency        cold p50 3.45 ms, p99 3.45 ms; warm none",
            "sandbox start  p50 2.99 ms, p99 2.99 ms (1 started)",
            "sandboxes      starting 0, busy 1, idle 2 (paused 1)",
            "lambdas        1 with sandboxes or requests, 2 requests queued",
            "memory budget  100.0 MiB of 2048.0 MiB used, 0.0 MiB pending; 1 waits, 0 evictions, 0 queued instead",
            "handler cache  1 paused, 4.2 MiB PSS of 1024 MiB; 5 pauses, 4 resumes; evictions: idle 1",
            "install cache  2 packages; 3 hits, 1 misses, 1 installs (2.5 s), 1 failures",
            "import cache   none (this backend has no Zygotes)",
            "errors         handler_exception 1, timeout 2",
            "retries        none",
        ] {
            assert!(out.lines().any(|l| l == line), "{line:?} not in\n{out}");
        }
        // A worker with fewer figures still renders.
        assert!(render_stats(&json!({})).contains("errors         none"));
    }

    #[test]
    fn sites_render_and_static_args_parse() {
        let sites = json!({"*": {"site": {"lambda": "olio"}, "source": "config"},
                           "a.example": {"site": {"lambda": "echo", "static": {"/s/": "/tmp"}}, "source": "api"}});
        assert_eq!(
            render_sites(&sites),
            "HOST       LAMBDA  SOURCE  STATIC\n*          olio    config  -\na.example  echo    api     /s/ → /tmp\n"
        );
        assert_eq!(render_sites(&json!({})), "no sites\n");
        assert_eq!(parse_static("/static/=/srv/a=b"), Ok(("/static/".into(), "/srv/a=b".into())));
        assert!(parse_static("/static/").is_err() && parse_static("=/x").is_err());
        assert_eq!(describe_site(&json!({"lambda": "echo", "static": {}})), "echo");
    }

    #[test]
    fn names_are_encoded_as_path_segments() {
        assert_eq!(segment("echo_1.2-x"), "echo_1.2-x");
        assert_eq!(segment("a b/c?"), "a%20b%2Fc%3F");
    }
}
