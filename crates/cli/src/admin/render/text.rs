//! Text for people, from the worker's JSON: JSON re-indented, tables, labelled lines,
//! relative times and spans, dates, sizes and numbers.

use std::fmt::Write as _;

use serde_json::Value;

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
