//! One kept line of a lambda's logs: what a handler wrote, or the start, error and report of
//! an invocation; as the API and the files show it (JSON).

use std::borrow::Cow;
use std::fmt::Write;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A request reached a sandbox.
    Start,
    /// A line the handler wrote (stdout or stderr).
    Out,
    /// A request failed: the handler raised, or no sandbox could serve it.
    Error,
    /// A request's run in a sandbox ended: its duration and memory.
    Report,
    /// Output dropped past the lambda's rate.
    Dropped,
}

/// A word of a few known values (`cold`, `http`, `ok`), borrowed; anything else, owned.
pub type Word = Cow<'static, str>;

/// `text` as a [`Word`]: borrowed when it is `ok` or an error code.
pub fn word(text: &str) -> Word {
    if text == "ok" {
        return Cow::Borrowed("ok");
    }
    match crate::errors::ErrorCode::ALL.iter().map(|c| c.as_str()).find(|c| *c == text) {
        Some(code) => Cow::Borrowed(code),
        None => Cow::Owned(text.to_string()),
    }
}

/// What an entry other than a line of output adds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Details {
    /// `cold` or `warm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Word>,
    /// `http`, `app`, `invoke` or `kafka`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Word>,
    /// The calling request's id (`invoke`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billed_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory_mb: Option<f64>,
    /// `ok` or an error code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Word>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceback: Option<String>,
    /// Lines (and bytes) of output dropped: a `dropped` entry's, or a report's for its request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// One more than the lambda's previous entry.
    pub seq: u64,
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    /// Unix seconds.
    pub ts: f64,
    pub lambda: Arc<str>,
    pub version: u64,
    pub request_id: Option<Arc<str>>,
    #[serde(default)]
    pub sandbox: Option<u64>,
    #[serde(default)]
    pub backend: Option<Arc<str>>,
    #[serde(rename = "type")]
    pub kind: Kind,
    pub message: String,
    #[serde(flatten, default)]
    pub details: Option<Box<Details>>,
}

impl Entry {
    /// An entry of now; its `seq` is set when it is kept.
    pub fn now(lambda: &Arc<str>, version: u64, kind: Kind, message: String) -> Entry {
        let at = SystemTime::now();
        let ts = at.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        Entry {
            seq: 0,
            time: humantime::format_rfc3339_millis(at).to_string(),
            ts,
            lambda: lambda.clone(),
            version,
            request_id: None,
            sandbox: None,
            backend: None,
            kind,
            message,
            details: None,
        }
    }

    pub fn details(mut self, details: Details) -> Entry {
        self.details = Some(Box::new(details));
        self
    }

    /// Roughly what it holds in memory, for the ring's bound.
    pub fn size(&self) -> usize {
        let details = self.details.as_ref().map(|d| 128 + d.traceback.as_ref().map_or(0, String::len)).unwrap_or(0);
        160 + self.message.len() + self.time.len() + details
    }

    pub fn is_request(&self, id: &str) -> bool {
        self.request_id.as_deref() == Some(id)
    }
}

/// A report's message, as AWS Lambda words it.
pub fn report_message(request_id: &str, d: &Details) -> String {
    let mut m = String::with_capacity(160);
    // Writing to a String cannot fail.
    let _ = write!(
        m,
        "REPORT RequestId: {request_id} Duration: {:.2} ms Billed Duration: {} ms",
        d.duration_ms.unwrap_or(0.0),
        d.billed_ms.unwrap_or(0)
    );
    if let Some(mb) = d.max_memory_mb {
        let _ = write!(m, " Max Memory Used: {} MB", mb.ceil() as u64);
    }
    if let Some(init) = d.init_ms {
        let _ = write!(m, " Init Duration: {init:.2} ms");
    }
    if let Some(outcome) = d.outcome.as_deref().filter(|o| *o != "ok") {
        let _ = write!(m, " Outcome: {outcome}");
    }
    if let Some(lines) = d.lines.filter(|n| *n > 0) {
        let _ = write!(m, " Output Dropped: {lines} lines");
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_go_to_json_and_back() {
        let lambda: Arc<str> = Arc::from("echo");
        let mut e = Entry::now(&lambda, 3, Kind::Report, "REPORT".into()).details(Details {
            duration_ms: Some(1.5),
            billed_ms: Some(2),
            outcome: Some("ok".into()),
            ..Details::default()
        });
        e.request_id = Some(Arc::from("abc"));
        e.sandbox = Some(7);
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["type"], "report");
        assert_eq!(json["duration_ms"], 1.5);
        assert!(json.get("traceback").is_none());
        assert!(json["time"].as_str().unwrap().ends_with('Z'));
        let back: Entry = serde_json::from_value(json).unwrap();
        assert_eq!(back, e);
        let line = Entry::now(&lambda, 1, Kind::Out, "hi".into());
        let json = serde_json::to_value(&line).unwrap();
        assert_eq!(json["request_id"], serde_json::Value::Null);
        // Read back, a line's details are empty (flattened fields cannot tell none from empty).
        assert!(serde_json::from_value::<Entry>(json).unwrap().details.is_none_or(|d| *d == Details::default()));
    }

    #[test]
    fn a_report_reads_as_aws_lambda_s() {
        let d = Details {
            duration_ms: Some(1.234),
            billed_ms: Some(2),
            max_memory_mb: Some(11.2),
            outcome: Some("timeout".into()),
            ..Details::default()
        };
        assert_eq!(
            report_message("r1", &d),
            "REPORT RequestId: r1 Duration: 1.23 ms Billed Duration: 2 ms Max Memory Used: 12 MB Outcome: timeout"
        );
    }
}
