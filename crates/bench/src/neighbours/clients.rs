//! The clients of one phase: the victim's and the neighbours' closed loops (paced, for the
//! tenant flooding its quota) on their own keep-alive connections, what they saw ([`Tally`]), and the neighbour's log directory
//! sampled meanwhile.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use super::setup::{pace_of, CALLERS};
use crate::http::Client;

/// A request unanswered this long counts as an error (the worker's timeout is 120 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(150);
/// The victim's event (echoed back).
const EVENT: &[u8] = br#"{"hello": "world"}"#;

/// What one or more closed-loop clients saw in the measured window.
pub(super) struct Tally {
    /// Latency of the calls counted, in nanoseconds.
    latency: Histogram<u64>,
    /// Calls counted: for the victim only warm ones, for a neighbour every answered one.
    ok: u64,
    /// Answers that were not warm starts (for the victim: not counted in `latency`).
    cold: u64,
    /// Calls refused by a tenant's quota (429) in the window: a flood's, not failures.
    refused: u64,
    /// Failed calls (another error status, a broken connection, no answer in time) in the
    /// window, and during the warm-up.
    errors: u64,
    warmup_errors: u64,
    first_error: Option<String>,
    /// Output the counted calls say they wrote (the printers).
    pub(super) bytes: u64,
    /// When the last counted call ended.
    last_done: Option<Instant>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram bounds"),
            ok: 0,
            cold: 0,
            refused: 0,
            errors: 0,
            warmup_errors: 0,
            first_error: None,
            bytes: 0,
            last_done: None,
        }
    }

    fn error(&mut self, counted: bool, what: String) {
        if counted {
            self.errors += 1;
        } else {
            self.warmup_errors += 1;
        }
        self.first_error.get_or_insert(what);
    }

    fn add(&mut self, other: Tally) {
        let _ = self.latency.add(&other.latency);
        self.ok += other.ok;
        self.cold += other.cold;
        self.refused += other.refused;
        self.errors += other.errors;
        self.warmup_errors += other.warmup_errors;
        self.bytes += other.bytes;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.last_done = self.last_done.max(other.last_done);
    }

    fn ms(&self, q: f64) -> Option<f64> {
        (self.ok > 0).then(|| self.latency.value_at_quantile(q) as f64 / 1e6)
    }

    /// The latency figures, and counts; `seconds` is the measured window.
    pub(super) fn json(&self, seconds: f64) -> Value {
        json!({
            "calls": self.ok,
            "per_s": self.ok as f64 / seconds,
            "not_warm": self.cold,
            "refused": self.refused,
            "refused_per_s": self.refused as f64 / seconds,
            "errors": self.errors,
            "warmup_errors": self.warmup_errors,
            "first_error": self.first_error,
            "p50_ms": self.ms(0.5),
            "p90_ms": self.ms(0.9),
            "p99_ms": self.ms(0.99),
            "mean_ms": (self.ok > 0).then(|| self.latency.mean() / 1e6),
            "max_ms": (self.ok > 0).then(|| self.latency.max() as f64 / 1e6),
        })
    }
}

/// One client calling `path` back to back (or, `paced`, one call every that often, as soon
/// as the one before has answered when it is late) from now until `stop_at`, counting the
/// calls sent from `measure_from` on; the call under way at `stop_at` is finished and
/// counted. With `warm_only`, answers that were not warm starts are counted apart, not in the
/// latency. A 429 (a tenant's quota) is counted as refused.
async fn calls(
    port: u16,
    path: String,
    body: &'static [u8],
    window: (Instant, Instant),
    warm_only: bool,
    paced: Option<Duration>,
) -> Tally {
    let (measure_from, stop_at) = window;
    let mut tally = Tally::new();
    let mut client: Option<Client> = None;
    let mut due = Instant::now();
    while Instant::now() < stop_at {
        if let Some(interval) = paced {
            tokio::time::sleep_until(due.into()).await;
            due += interval;
        }
        let counted = Instant::now() >= measure_from;
        let conn = match client.as_mut() {
            Some(c) => c,
            None => match Client::connect(port).await {
                Ok(c) => client.insert(c),
                Err(e) => {
                    tally.error(counted, format!("connecting: {e:#}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, conn.post(&path, body)).await {
            Ok(Ok(answer)) if answer.ok() => {
                if !counted {
                    continue;
                }
                if answer.start != "warm" {
                    tally.cold += 1;
                    if warm_only {
                        continue;
                    }
                }
                tally.ok += 1;
                let _ = tally.latency.record((answer.elapsed.as_nanos() as u64).max(1));
                if let Ok(reply) = serde_json::from_slice::<Value>(&answer.body) {
                    tally.bytes += reply["bytes"].as_u64().unwrap_or(0);
                }
                tally.last_done = Some(Instant::now());
            }
            Ok(Ok(answer)) if answer.status == 429 => tally.refused += u64::from(counted),
            Ok(Ok(answer)) => {
                let text = String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)]).into_owned();
                tally.error(counted, format!("{}: {}", answer.status, text.trim()));
            }
            Ok(Err(e)) => {
                client = None;
                tally.error(counted, format!("{e:#}"));
            }
            Err(_) => {
                client = None;
                tally.error(counted, format!("no answer in {} s", REQUEST_TIMEOUT.as_secs()));
            }
        }
    }
    tally
}

/// What one phase measured.
pub(super) struct PhaseRun {
    pub(super) victim: Tally,
    pub(super) neighbour: Option<Tally>,
    /// From the start of the measured window to the neighbours' last answer (they finish the
    /// call under way at the end).
    pub(super) neighbour_seconds: f64,
    /// The most bytes seen under the neighbour's log directory while the phase ran.
    pub(super) log_bytes_max: Option<u64>,
}

/// The victim's client (and, with a neighbour, its `CALLERS` clients) for `warmup` and then
/// `seconds`; `log_dir`, when given, is sampled every 250 ms.
pub(super) async fn phase(
    port: u16,
    victim: &str,
    neighbour: Option<&str>,
    warmup: f64,
    seconds: f64,
    log_dir: Option<PathBuf>,
) -> PhaseRun {
    let started = Instant::now();
    let measure_from = started + Duration::from_secs_f64(warmup);
    let stop_at = measure_from + Duration::from_secs_f64(seconds);
    let window = (measure_from, stop_at);
    let victim_task = tokio::spawn(calls(port, format!("/run/{victim}"), EVENT, window, true, None));
    let neighbour_tasks: Vec<_> = neighbour
        .map(|n| (0..CALLERS).map(|_| tokio::spawn(calls(port, format!("/run/{n}"), b"null", window, false, pace_of(n)))).collect())
        .unwrap_or_default();
    let done = Arc::new(AtomicBool::new(false));
    let max_seen = Arc::new(AtomicU64::new(0));
    let sampler = log_dir.clone().map(|dir| {
        let (done, max_seen) = (done.clone(), max_seen.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                if let Some(b) = dir_bytes(&dir) {
                    max_seen.fetch_max(b, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    });
    let victim = victim_task.await.unwrap_or_else(failed_task);
    let mut neighbour_tally = neighbour.map(|_| Tally::new());
    for t in neighbour_tasks {
        let got = t.await.unwrap_or_else(failed_task);
        if let Some(n) = neighbour_tally.as_mut() {
            n.add(got);
        }
    }
    done.store(true, Ordering::Relaxed);
    if let Some(s) = sampler {
        let _ = s.await;
    }
    let neighbour_seconds = neighbour_tally
        .as_ref()
        .and_then(|n| n.last_done)
        .map(|t| t.saturating_duration_since(measure_from).as_secs_f64())
        .unwrap_or(seconds)
        .max(seconds);
    let log_bytes_max = log_dir.as_deref().and_then(dir_bytes).map(|now| now.max(max_seen.load(Ordering::Relaxed)));
    PhaseRun { victim, neighbour: neighbour_tally, neighbour_seconds, log_bytes_max }
}

fn failed_task(e: tokio::task::JoinError) -> Tally {
    let mut t = Tally::new();
    t.error(true, format!("client task failed: {e}"));
    t
}

/// Bytes of the files under `dir` (recursively); None when the worker keeps no log
/// directory at all (`dir`'s parent, DIR/logs, is missing), 0 when only `dir` is.
pub(super) fn dir_bytes(dir: &Path) -> Option<u64> {
    if !dir.parent().is_some_and(Path::is_dir) {
        return None;
    }
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    Some(total)
}
