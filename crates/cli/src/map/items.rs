//! A map's items: the JSON-lines text checked whole, cut into requests of at most
//! [`MAX_ITEMS`] items and about [`MAX_BYTES`] bytes, and a request's body.

use std::ops::Range;

use anyhow::{anyhow, Result};

/// Most items in one `/map` request (the SDK's bound too).
pub const MAX_ITEMS: usize = 2048;
/// Fewest items a request is cut to for the sake of concurrency (a smaller map is one request).
pub const MIN_ITEMS: usize = 64;
/// About the most bytes of one `/map` request's body (an item larger than this goes alone).
pub const MAX_BYTES: usize = 2 << 20;

/// The events of a JSON-lines text, each checked to be one JSON value (kept as written,
/// trimmed); blank lines are skipped. A line that is not JSON is an error naming it.
pub fn parse_items<'a>(text: &'a str, source: &str) -> Result<Vec<&'a str>> {
    let mut items = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(line) {
            let column = if e.line() == 1 { format!(" at column {}", e.column()) } else { String::new() };
            return Err(anyhow!("{source} line {} is not JSON{column}: {}; nothing was sent", i + 1, describe(&e)));
        }
        items.push(line);
    }
    Ok(items)
}

/// serde_json's message without its own "at line L column C".
fn describe(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// The items cut into requests, in order: each a range of at most `max_items` items whose
/// body (`[a,b,...]`) takes at most about `max_bytes`; an item larger than that goes alone.
pub fn split<S: AsRef<str>>(items: &[S], max_items: usize, max_bytes: usize) -> Vec<Range<usize>> {
    let max_items = max_items.max(1);
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 2; // the brackets
    for (i, item) in items.iter().enumerate() {
        let size = item.as_ref().len() + 1; // and its comma
        if i > start && (i - start >= max_items || bytes + size > max_bytes) {
            out.push(start..i);
            start = i;
            bytes = 2;
        }
        bytes += size;
    }
    if start < items.len() {
        out.push(start..items.len());
    }
    out
}

/// Items per request for a map of `total` items with `concurrency` requests in flight: about
/// four requests for each, so that every one is busy and progress comes in steps, but at least
/// [`MIN_ITEMS`] (a request has a cost of its own) and at most [`MAX_ITEMS`].
pub fn request_items(total: usize, concurrency: usize) -> usize {
    total.div_ceil(4 * concurrency.max(1)).clamp(MIN_ITEMS, MAX_ITEMS)
}

/// A request's body: the items as one JSON array.
pub fn body<S: AsRef<str>>(items: &[S]) -> String {
    let mut s = String::with_capacity(2 + items.iter().map(|i| i.as_ref().len() + 1).sum::<usize>());
    s.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(item.as_ref());
    }
    s.push(']');
    s
}
