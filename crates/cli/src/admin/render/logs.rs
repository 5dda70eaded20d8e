//! Log entries as lines: a handler's output made safe to print, and what `/logs` says was
//! dropped.

use std::fmt::Write as _;

use serde_json::Value;

use super::text::{bytes, rfc3339};

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
pub(crate) fn dropped_note(dropped: &Value) -> Option<String> {
    let lines = dropped["lines"].as_u64().filter(|&n| n > 0)?;
    Some(format!(
        "({lines} lines, {} of this lambda's output dropped past its rate since the worker started)",
        bytes(dropped["bytes"].as_u64().unwrap_or(0))
    ))
}
