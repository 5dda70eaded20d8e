//! What `GET /logs/<name>` asks for — since when, how many, which request, whether to follow —
//! parsed from its query string, with the reason when a value is malformed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::entry::Entry;

/// Most entries one answer holds.
pub const MAX_LIMIT: usize = 10_000;
const DEFAULT_LIMIT: usize = 100;

#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// Unix seconds: only entries from then on.
    pub since: Option<f64>,
    /// The newest this many matching entries.
    pub limit: usize,
    pub request: Option<String>,
    pub follow: bool,
}

impl Default for Query {
    fn default() -> Query {
        Query { since: None, limit: DEFAULT_LIMIT, request: None, follow: false }
    }
}

impl Query {
    /// Parse `since`, `limit`, `request` and `follow` from a query string (other keys are
    /// ignored); `now` is when a relative `since` counts back from.
    pub fn parse(query: &str, now: SystemTime) -> Result<Query, String> {
        let mut q = Query::default();
        for (key, value) in url_pairs(query) {
            match key.as_str() {
                "since" => q.since = Some(parse_since(&value, now)?),
                "limit" => {
                    q.limit = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| format!("limit must be a whole number from 1 to {MAX_LIMIT}, not {value:?}"))?
                }
                "request" => {
                    if !is_request_id(&value) {
                        return Err(format!("request must be a request id (1-64 letters, digits, - or _), not {value:?}"));
                    }
                    q.request = Some(value);
                }
                "follow" => {
                    q.follow = match value.as_str() {
                        "" | "1" | "true" | "yes" => true,
                        "0" | "false" | "no" => false,
                        _ => return Err(format!("follow must be 1 or 0, not {value:?}")),
                    }
                }
                _ => {}
            }
        }
        Ok(q)
    }

    pub fn matches(&self, entry: &Entry) -> bool {
        self.since.is_none_or(|since| entry.ts >= since) && self.request.as_deref().is_none_or(|id| entry.is_request(id))
    }
}

/// Whether `id` could be a request id (the worker's, or one a client chose).
pub fn is_request_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `30s`, `10m`, `2h`, `1d` back from `now`; Unix seconds; or an RFC 3339 time.
fn parse_since(value: &str, now: SystemTime) -> Result<f64, String> {
    let bad = || format!("since must be a duration back from now (30s, 10m, 2h, 1d), Unix seconds or an RFC 3339 time, not {value:?}");
    let unix = |t: SystemTime| t.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    if let Ok(seconds) = value.parse::<f64>() {
        return if seconds.is_finite() && seconds >= 0.0 { Ok(seconds) } else { Err(bad()) };
    }
    if let Ok(at) = humantime::parse_rfc3339_weak(value) {
        return Ok(unix(at));
    }
    let (number, unit) = value.split_at(value.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(bad()),
    };
    Ok(unix(now.checked_sub(Duration::from_secs(seconds)).unwrap_or(UNIX_EPOCH)))
}

/// The decoded `key=value` pairs of a query string.
fn url_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    let decode = |s: &str| percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
    query.split('&').filter(|p| !p.is_empty()).map(move |pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (decode(k), decode(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn since_takes_durations_unix_seconds_and_rfc3339() {
        let now = at(1_800_000_000);
        let since = |v: &str| Query::parse(&format!("since={v}"), now).map(|q| q.since.unwrap());
        assert_eq!(since("10m"), Ok(1_800_000_000.0 - 600.0));
        assert_eq!(since("30s"), Ok(1_800_000_000.0 - 30.0));
        assert_eq!(since("2h"), Ok(1_800_000_000.0 - 7200.0));
        assert_eq!(since("1d"), Ok(1_800_000_000.0 - 86_400.0));
        assert_eq!(since("1700000000.5"), Ok(1_700_000_000.5));
        assert_eq!(since("2027-01-15T08:00:00Z"), Ok(1_800_000_000.0));
        assert_eq!(since("2027-01-15T08%3A00%3A00Z"), Ok(1_800_000_000.0));
        for bad in ["", "10", "10x", "m", "-5", "yesterday", "10mm", "nan"] {
            if bad == "10" {
                continue; // Unix seconds
            }
            assert!(since(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn limit_request_and_follow_are_checked() {
        let now = at(1000);
        assert_eq!(Query::parse("", now).unwrap(), Query::default());
        let q = Query::parse("limit=5&request=abc-1_2&follow=1&other=x", now).unwrap();
        assert_eq!((q.limit, q.request.as_deref(), q.follow), (5, Some("abc-1_2"), true));
        assert!(Query::parse("follow", now).unwrap().follow);
        for bad in ["limit=0", "limit=10001", "limit=x", "request=", "request=a%20b", "request=a/b", "follow=maybe"] {
            assert!(Query::parse(bad, now).is_err(), "{bad}");
        }
        let err = Query::parse("limit=0", now).unwrap_err();
        assert!(err.contains("limit"), "{err}");
    }
}
