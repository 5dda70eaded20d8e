//! Function logs: everything a handler writes, kept per lambda and tagged with the request it
//! was written during, each invocation framed by a `start` and a `report` entry (duration,
//! billed duration, peak memory), as AWS Lambda's log streams are.
//!
//! A sandbox's output reaches [`SandboxOutput`] (its [`OutputSink`]) from the sandbox engine's
//! pipe reader; the instance manager tags it with the request under way
//! ([`SandboxOutput::begin`], [`SandboxOutput::finish`]). Each lambda's log is bounded three
//! ways, so one noisy lambda neither slows the worker nor pushes out another's logs: a rate
//! ([`bounds::Bucket`]: output past it is dropped and counted), a memory ring of its latest
//! entries ([`bounds::Ring`]), and rotated files within a size ([`files`]). Queries read the
//! ring and, for older entries, the files; followers get new entries as they come.

pub mod bounds;
pub mod entry;
pub mod files;
pub mod query;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sprout_sandbox::output::OutputSink;

use crate::config::LogsSection;
use tokio::sync::broadcast;

use bounds::{Bucket, Ring};
pub use entry::{Details, Entry, Kind};
use files::Files;
pub use query::Query;

/// `[logs]`: how much of each lambda's output is kept.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Where the files go (`DIR/logs`); None keeps logs in memory only.
    pub dir: Option<PathBuf>,
    /// Each lambda's memory ring, in bytes.
    pub memory_bytes: usize,
    /// Each lambda's files together, in bytes.
    pub max_bytes: u64,
    /// Output each lambda may write a second, in bytes, and at once.
    pub rate_bytes: u64,
    pub burst_bytes: u64,
}

impl LogConfig {
    /// The logs' settings of `[logs]` for a worker in `dir`.
    pub fn from_section(section: &LogsSection, dir: &Path) -> LogConfig {
        LogConfig {
            dir: Some(dir.join("logs")),
            memory_bytes: (section.memory_kb << 10) as usize,
            max_bytes: section.max_mb << 20,
            rate_bytes: section.rate_kb_s << 10,
            burst_bytes: section.burst_kb << 10,
        }
    }
}

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig { dir: None, memory_bytes: 256 << 10, max_bytes: 16 << 20, rate_bytes: 1 << 20, burst_bytes: 8 << 20 }
    }
}

/// How an invocation reached the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// `/run/<name>`.
    Http,
    /// The app port.
    App,
    /// `sprout.invoke` from the handler serving request `caller`.
    Invoke { caller: Arc<str> },
    /// A Kafka message.
    Kafka,
}

impl Trigger {
    pub fn label(&self) -> &'static str {
        match self {
            Trigger::Http => "http",
            Trigger::App => "app",
            Trigger::Invoke { .. } => "invoke",
            Trigger::Kafka => "kafka",
        }
    }
}

/// One request, as its log entries name it.
#[derive(Debug, Clone)]
pub struct RequestTag {
    pub id: Arc<str>,
    pub trigger: Trigger,
}

/// Bounds on output beyond each lambda's own: the group a lambda's log belongs to (the API's
/// tenants: its tenant) and the bytes a second that group's lambdas may write together (a
/// second's worth at once). None: no group bound.
pub trait LogGroups: Send + Sync {
    fn group(&self, lambda: &str) -> Option<(String, u64)>;
}

/// A group's bucket (made again when its rate changes) and its output dropped, in bytes.
struct GroupBound {
    rate: u64,
    bucket: Bucket,
    dropped_bytes: u64,
}

/// Every lambda's logs.
pub struct Logs {
    cfg: LogConfig,
    files: Option<Files>,
    lambdas: Mutex<HashMap<String, Arc<LambdaLog>>>,
    /// Recent request ids and their lambdas, so a search by id looks in one place.
    recent: Mutex<RecentRequests>,
    /// Set when the worker stops: follow streams end, and no new one starts.
    closed: std::sync::atomic::AtomicBool,
    /// Which group each lambda's output also counts against (unset: none).
    groups: std::sync::OnceLock<Arc<dyn LogGroups>>,
    group_bounds: Mutex<HashMap<String, GroupBound>>,
}

/// One lambda's log.
pub struct LambdaLog {
    name: Arc<str>,
    state: Mutex<LogState>,
    dropped_lines: AtomicU64,
    dropped_bytes: AtomicU64,
}

struct LogState {
    next_seq: u64,
    ring: Ring,
    bucket: Bucket,
    /// Output dropped since the last `dropped` entry: (lines, bytes).
    pending_drop: (u64, u64),
    /// The group whose rate dropped it, when that (not the lambda's own) did: (group, bytes/s).
    dropped_by_group: Option<(String, u64)>,
    followers: Option<broadcast::Sender<Arc<Entry>>>,
}

impl Logs {
    /// Logs with files under `cfg.dir`.
    pub fn new(cfg: LogConfig) -> std::io::Result<Arc<Logs>> {
        let files = match &cfg.dir {
            Some(dir) => Some(Files::start(dir.clone(), cfg.max_bytes, 65_536)?),
            None => None,
        };
        let recent = Mutex::new(RecentRequests::new(100_000));
        let (groups, group_bounds) = (std::sync::OnceLock::new(), Mutex::default());
        Ok(Arc::new(Logs { cfg, files, lambdas: Mutex::default(), recent, closed: Default::default(), groups, group_bounds }))
    }

    /// Logs kept in memory only (tests).
    #[cfg(test)]
    pub fn in_memory() -> Arc<Logs> {
        Logs::new(LogConfig::default()).expect("no files to open")
    }

    /// `name`'s log, opened (its numbering continued from its files) on first use.
    pub fn lambda(&self, name: &str) -> Arc<LambdaLog> {
        let mut lambdas = self.lambdas.lock().unwrap();
        if let Some(log) = lambdas.get(name) {
            return log.clone();
        }
        let next_seq = self.files.as_ref().and_then(|f| f.last_seq(name)).map_or(1, |s| s + 1);
        let log = Arc::new(LambdaLog {
            name: Arc::from(name),
            state: Mutex::new(LogState {
                next_seq,
                ring: Ring::new(self.cfg.memory_bytes),
                bucket: Bucket::new(self.cfg.rate_bytes, self.cfg.burst_bytes, Instant::now()),
                pending_drop: (0, 0),
                dropped_by_group: None,
                followers: None,
            }),
            dropped_lines: AtomicU64::new(0),
            dropped_bytes: AtomicU64::new(0),
        });
        lambdas.insert(name.to_string(), log.clone());
        log
    }

    /// Whether `name` has logs here (in memory or on disk).
    pub fn has(&self, name: &str) -> bool {
        self.lambdas.lock().unwrap().contains_key(name) || self.files.as_ref().is_some_and(|f| f.lambdas().iter().any(|l| l == name))
    }

    /// The sink for a new sandbox of version `version` of lambda `name`.
    pub fn sandbox_output(self: &Arc<Logs>, name: &str, version: u64, backend: &'static str) -> Arc<SandboxOutput> {
        let backend = Arc::from(backend);
        Arc::new(SandboxOutput { logs: self.clone(), log: self.lambda(name), version, backend, current: Mutex::new(None) })
    }

    /// Keep `entry` in `log`: numbered, in the ring, queued for the files, sent to followers.
    fn keep(&self, log: &LambdaLog, state: &mut LogState, mut entry: Entry) {
        entry.seq = state.next_seq;
        state.next_seq += 1;
        let entry = Arc::new(entry);
        if entry.kind == Kind::Start {
            if let Some(id) = &entry.request_id {
                self.recent.lock().unwrap().add(id.clone(), log.name.clone());
            }
        }
        if let Some(files) = &self.files {
            files.write(entry.clone());
        }
        if let Some(followers) = &state.followers {
            if self.closed.load(Ordering::Relaxed) || followers.send(entry.clone()).is_err() {
                state.followers = None; // nobody listens any more
            }
        }
        state.ring.push(entry);
    }

    /// Write `entry` (a request's own, not a sandbox's output) to its lambda's log.
    pub fn record(&self, entry: Entry) {
        let log = self.lambda(&entry.lambda);
        let mut state = log.state.lock().unwrap();
        self.keep(&log, &mut state, entry);
    }

    /// The entries `query` asks for of lambda `name` (not following): the newest
    /// `query.limit` that match, oldest first. Reads files: call off the async threads.
    pub fn query(&self, name: &str, query: &Query) -> Vec<Arc<Entry>> {
        let log = self.lambda(name);
        let (recent, first_seq, first_ts) = {
            let state = log.state.lock().unwrap();
            let recent: Vec<Arc<Entry>> = state.ring.iter().rev().filter(|e| query.matches(e)).take(query.limit).cloned().collect();
            let first = (state.ring.first_seq(), state.ring.iter().next().map(|e| e.ts));
            (recent, first.0, first.1)
        };
        let mut out: Vec<Arc<Entry>> = Vec::new();
        let older_wanted = recent.len() < query.limit && !query.since.is_some_and(|since| first_ts.is_some_and(|ts| ts < since));
        if let (true, Some(files)) = (older_wanted, &self.files) {
            files.flush(Duration::from_secs(2));
            let older = files.read(name, first_seq, query.since, query.limit - recent.len(), |e| query.matches(e));
            out.extend(older.into_iter().map(Arc::new));
        }
        out.extend(recent.into_iter().rev());
        out
    }

    /// Follow `name`'s log: every entry kept from now on, until the worker stops.
    pub fn follow(&self, name: &str) -> broadcast::Receiver<Arc<Entry>> {
        let log = self.lambda(name);
        let mut state = log.state.lock().unwrap();
        if self.closed.load(Ordering::Acquire) {
            return broadcast::channel(1).1; // its sender gone: the stream ends at once
        }
        match &state.followers {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = broadcast::channel(4096);
                state.followers = Some(tx);
                rx
            }
        }
    }

    /// Write what waits for the files (the worker is stopping).
    pub fn flush(&self) {
        if let Some(files) = &self.files {
            files.flush(Duration::from_secs(5));
        }
    }

    /// End every follow stream (the worker is stopping, and waits for its responses).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for log in self.lambdas.lock().unwrap().values() {
            log.state.lock().unwrap().followers = None;
        }
    }

    /// Every entry of request `id`, whatever its lambda (the recent ones' lambda is known;
    /// for older ones every lambda's log is searched). Reads files: off the async threads.
    pub fn find_request(&self, id: &str) -> Vec<Arc<Entry>> {
        let query = Query { request: Some(id.to_string()), limit: query::MAX_LIMIT, ..Query::default() };
        let known = self.recent.lock().unwrap().lambda_of(id);
        let lambdas: Vec<String> = match known {
            Some(name) => vec![name.to_string()],
            None => {
                let mut all: Vec<String> = self.lambdas.lock().unwrap().keys().cloned().collect();
                for name in self.files.as_ref().map(Files::lambdas).unwrap_or_default() {
                    if !all.contains(&name) {
                        all.push(name);
                    }
                }
                all
            }
        };
        lambdas.iter().flat_map(|name| self.query(name, &query)).collect()
    }

    /// Each lambda's dropped output since the worker started: (name, lines, bytes).
    pub fn dropped(&self) -> Vec<(String, u64, u64)> {
        let lambdas = self.lambdas.lock().unwrap();
        let mut out: Vec<_> = lambdas
            .values()
            .map(|l| (l.name.to_string(), l.dropped_lines.load(Ordering::Relaxed), l.dropped_bytes.load(Ordering::Relaxed)))
            .collect();
        out.sort();
        out
    }

    /// Set the groups lambdas' output also counts against (once; later calls are ignored).
    pub fn set_groups(&self, groups: Arc<dyn LogGroups>) {
        let _ = self.groups.set(groups);
    }

    /// Take `bytes` of `lambda`'s output from its group's bucket at `now`: Ok when it has no
    /// group or the bucket holds them; else Err with the group and its rate (bytes a second).
    fn take_group(&self, lambda: &str, bytes: usize, now: Instant) -> Result<(), (String, u64)> {
        let Some((group, rate)) = self.groups.get().and_then(|g| g.group(lambda)) else { return Ok(()) };
        let mut bounds = self.group_bounds.lock().unwrap();
        let bound =
            bounds.entry(group.clone()).or_insert_with(|| GroupBound { rate, bucket: Bucket::new(rate, rate, now), dropped_bytes: 0 });
        if bound.rate != rate {
            (bound.rate, bound.bucket) = (rate, Bucket::new(rate, rate, now));
        }
        if bound.bucket.take(bytes, now) {
            return Ok(());
        }
        bound.dropped_bytes += bytes as u64;
        Err((group, rate))
    }

    /// Each group's output dropped past its rate since the worker started, in bytes.
    pub fn group_dropped(&self) -> Vec<(String, u64)> {
        let mut out: Vec<_> = self.group_bounds.lock().unwrap().iter().map(|(g, b)| (g.clone(), b.dropped_bytes)).collect();
        out.sort();
        out
    }

    /// Entries the file writer could not take in time.
    pub fn writer_dropped(&self) -> u64 {
        self.files.as_ref().map_or(0, Files::dropped)
    }

    /// `name`'s dropped output so far: (lines, bytes).
    pub fn dropped_of(&self, name: &str) -> (u64, u64) {
        let log = self.lambda(name);
        (log.dropped_lines.load(Ordering::Relaxed), log.dropped_bytes.load(Ordering::Relaxed))
    }
}

/// Request ids and their lambdas, the latest `capacity` of them.
struct RecentRequests {
    order: VecDeque<Arc<str>>,
    lambdas: HashMap<Arc<str>, Arc<str>>,
    capacity: usize,
}

impl RecentRequests {
    fn new(capacity: usize) -> RecentRequests {
        RecentRequests { order: VecDeque::new(), lambdas: HashMap::new(), capacity }
    }

    fn add(&mut self, id: Arc<str>, lambda: Arc<str>) {
        if self.lambdas.insert(id.clone(), lambda).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.lambdas.remove(&old);
            }
        }
    }

    fn lambda_of(&self, id: &str) -> Option<Arc<str>> {
        self.lambdas.get(id).cloned()
    }
}

/// A sandbox's output sink: its lines go to its lambda's log, tagged with the request under
/// way ([`SandboxOutput::begin`] to [`SandboxOutput::finish`]).
pub struct SandboxOutput {
    logs: Arc<Logs>,
    log: Arc<LambdaLog>,
    version: u64,
    /// The back-end that made its sandbox.
    backend: Arc<str>,
    current: Mutex<Option<Current>>,
}

/// The request a sandbox serves, and the output it has had dropped.
struct Current {
    id: Arc<str>,
    dropped_lines: u64,
}

/// How a request's run in a sandbox ended, for its report.
pub struct RunReport<'a> {
    pub sandbox: u64,
    pub duration: Duration,
    pub init: Option<Duration>,
    pub peak_memory: Option<u64>,
    pub cold: bool,
    /// `ok` or the error code.
    pub outcome: &'a str,
    /// The handler's error message and traceback, when it raised.
    pub error: Option<(&'a str, Option<&'a str>)>,
}

impl SandboxOutput {
    fn entry(&self, kind: Kind, message: String, request: Option<Arc<str>>, sandbox: u64) -> Entry {
        let mut e = Entry::now(&self.log.name, self.version, kind, message);
        e.request_id = request;
        e.sandbox = Some(sandbox);
        e.backend = Some(self.backend.clone());
        e
    }

    /// Request `tag` starts on sandbox `sandbox`: its `start` entry; the output that follows
    /// is the request's.
    pub fn begin(&self, tag: &RequestTag, sandbox: u64, cold: bool) {
        *self.current.lock().unwrap() = Some(Current { id: tag.id.clone(), dropped_lines: 0 });
        let message = format!("START RequestId: {} Version: {}", tag.id, self.version);
        let caller = match &tag.trigger {
            Trigger::Invoke { caller } => Some(caller.to_string()),
            _ => None,
        };
        let details = Details {
            start: Some(if cold { "cold" } else { "warm" }.into()),
            trigger: Some(tag.trigger.label().into()),
            caller,
            ..Details::default()
        };
        self.logs.record(self.entry(Kind::Start, message, Some(tag.id.clone()), sandbox).details(details));
    }

    /// The request's run ended (its output all handed over): an `error` entry if the handler
    /// raised, then its `report`; output after this belongs to no request.
    pub fn finish(&self, report: &RunReport) {
        let Some(current) = self.current.lock().unwrap().take() else { return };
        let id = current.id;
        let mut state = self.log.state.lock().unwrap();
        self.flush_dropped(&mut state, report.sandbox, Some(id.clone()));
        if let Some((message, traceback)) = report.error {
            let details =
                Details { outcome: Some(entry::word(report.outcome)), traceback: traceback.map(str::to_string), ..Details::default() };
            let text = format!("ERROR RequestId: {id} {}: {message}", report.outcome);
            self.logs.keep(&self.log, &mut state, self.entry(Kind::Error, text, Some(id.clone()), report.sandbox).details(details));
        }
        let duration_ms = report.duration.as_secs_f64() * 1000.0;
        let details = Details {
            start: Some(if report.cold { "cold" } else { "warm" }.into()),
            duration_ms: Some((duration_ms * 1000.0).round() / 1000.0),
            billed_ms: Some(duration_ms.ceil().max(1.0) as u64),
            init_ms: report.init.map(|d| (d.as_secs_f64() * 1e6).round() / 1000.0),
            max_memory_mb: report.peak_memory.map(|b| (b as f64 / (1 << 20) as f64 * 100.0).round() / 100.0),
            outcome: Some(entry::word(report.outcome)),
            lines: (current.dropped_lines > 0).then_some(current.dropped_lines),
            ..Details::default()
        };
        let message = entry::report_message(&id, &details);
        self.logs.keep(&self.log, &mut state, self.entry(Kind::Report, message, Some(id), report.sandbox).details(details));
    }

    /// A `dropped` entry for output dropped since the last one.
    fn flush_dropped(&self, state: &mut LogState, sandbox: u64, request: Option<Arc<str>>) {
        let (lines, bytes) = std::mem::take(&mut state.pending_drop);
        if lines == 0 {
            return;
        }
        let past = match state.dropped_by_group.take() {
            Some((group, rate)) => {
                format!("past the rate of {} KB/s of tenant {group:?}'s lambdas together (its log_kb_s quota)", rate >> 10)
            }
            None => format!("past the lambda's rate of {} KB/s (logs.rate_kb_s)", self.logs.cfg.rate_bytes >> 10),
        };
        let message = format!("[sprout] {lines} lines ({bytes} bytes) of output dropped: {past}");
        let details = Details { lines: Some(lines), bytes: Some(bytes), ..Details::default() };
        self.logs.keep(&self.log, state, self.entry(Kind::Dropped, message, request, sandbox).details(details));
    }
}

impl OutputSink for SandboxOutput {
    fn flooded(&self) -> bool {
        // Output has been dropped since the last line kept: the lambda writes past its rate.
        self.log.state.lock().unwrap().pending_drop.0 > 0
    }

    fn write(&self, sandbox: u64, lines: &[u8]) {
        let mut current = self.current.lock().unwrap();
        let mut state = self.log.state.lock().unwrap();
        let now = Instant::now();
        // The lambda's own rate, then its group's (what the lambda's bucket gave for output
        // its group then drops is spent: the group is past its rate anyway).
        let kept = state.bucket.take(lines.len(), now)
            && match self.logs.take_group(&self.log.name, lines.len(), now) {
                Ok(()) => true,
                Err(group) => {
                    state.dropped_by_group = Some(group);
                    false
                }
            };
        if !kept {
            let n = memchr::memchr_iter(b'\n', lines).count() as u64;
            state.pending_drop.0 += n;
            state.pending_drop.1 += lines.len() as u64;
            self.log.dropped_lines.fetch_add(n, Ordering::Relaxed);
            self.log.dropped_bytes.fetch_add(lines.len() as u64, Ordering::Relaxed);
            if let Some(c) = current.as_mut() {
                c.dropped_lines += n;
            }
            return;
        }
        let request = current.as_ref().map(|c| c.id.clone());
        drop(current);
        self.flush_dropped(&mut state, sandbox, request.clone());
        for line in lines.strip_suffix(b"\n").unwrap_or(lines).split(|b| *b == b'\n') {
            let text = String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(line)).into_owned();
            let entry = self.entry(Kind::Out, text, request.clone(), sandbox);
            self.logs.keep(&self.log, &mut state, entry);
        }
    }
}

#[cfg(test)]
mod tests;
