//! `sprout map NAME ITEMS.jsonl`: run a lambda over many events through the worker's
//! `POST /map/<name>` (docs/offload.md), from the command line.
//!
//! Every line of the file is one event (blank lines are skipped); the file is checked whole
//! before anything is sent, so a line that is not JSON stops the map with its line number and
//! nothing run. The events go out in requests of at most [`MAX_ITEMS`] items and about
//! [`MAX_BYTES`] bytes (smaller ones when that makes about four for each request in flight),
//! `--concurrency` of them in flight (one thread each); each request the worker spreads over
//! the lambda's sandboxes. One line per outcome goes to stdout, in the
//! items' order (`--unordered`: a request's outcomes as soon as it is answered): the result's
//! JSON, or the error object (`{"error": <code>, "message": ..., "traceback": ...}`). A
//! progress line (items done of the total, the rate) is drawn on stderr when it is a terminal.
//!
//! Exit status: 0 when every item succeeded, 1 when one or more failed (their error objects
//! are printed in their places), 2 when the map could not be done: the file could not be read
//! or a line is not JSON (nothing sent), or a request failed as a whole (an unknown lambda, a
//! refused body, a worker that could not be reached after the retries). A request that could
//! not be delivered (connection refused or reset, 502, 503, 429) is sent again, up to
//! [`RETRIES`] times.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use serde_json::Value;

use crate::client;

/// Most items in one `/map` request (the SDK's bound too).
pub const MAX_ITEMS: usize = 2048;
/// Fewest items a request is cut to for the sake of concurrency (a smaller map is one request).
pub const MIN_ITEMS: usize = 64;
/// About the most bytes of one `/map` request's body (an item larger than this goes alone).
pub const MAX_BYTES: usize = 2 << 20;
/// Times a request that could not be delivered is sent again.
pub const RETRIES: u32 = 2;

#[derive(clap::Args, Debug, Clone)]
pub struct MapArgs {
    /// The lambda to run over the items.
    pub name: String,
    /// A file of JSON events, one a line (`-`: standard input).
    pub items: PathBuf,
    #[arg(long, env = "SPROUT_URL", default_value = "http://127.0.0.1:5000")]
    pub url: String,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrency: u32,
    /// Print each request's outcomes as soon as it is answered rather than in the items' order.
    #[arg(long)]
    pub unordered: bool,
    /// Items per sandbox invocation (1-1024; 1: each item an invocation of its own). Default:
    /// the worker sizes chunks itself.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub chunk: Option<u32>,
}

/// Why a map stopped short: exit status 2.
#[derive(Debug)]
pub struct Stopped(pub anyhow::Error);

/// What a finished map did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Summary {
    pub items: usize,
    pub failed: usize,
    pub requests: usize,
    /// Sandbox invocations the worker made (`x-sprout-map-chunks`, summed).
    pub chunks: u64,
    /// Items the worker ran again after a sandbox failed (`x-sprout-map-retries`, summed).
    pub rerun: u64,
    /// Requests sent again because they could not be delivered.
    pub resent: u64,
}

/// `sprout map`: the exit status.
pub fn main(args: &MapArgs) -> i32 {
    let text = match read_items(&args.items) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("sprout: {e:#}");
            return 2;
        }
    };
    let items = match parse_items(&text, &args.items.display().to_string()) {
        Ok(items) => items,
        Err(e) => {
            eprintln!("sprout: {e:#}");
            return 2;
        }
    };
    let opts = Options {
        url: args.url.trim_end_matches('/').to_string(),
        name: args.name.clone(),
        concurrency: args.concurrency.max(1) as usize,
        ordered: !args.unordered,
        chunk: args.chunk,
        backoff: Duration::from_millis(200),
    };
    let mut progress = Progress::new(items.len(), std::io::stderr().is_terminal());
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let started = Instant::now();
    let outcome = run(&opts, &items, &mut out, &mut |done, failed| progress.update(done, failed));
    let _ = out.flush();
    progress.finish();
    match outcome {
        Ok(summary) => {
            let seconds = started.elapsed().as_secs_f64();
            if !items.is_empty() {
                eprintln!("{}", summary_line(&summary, seconds));
            }
            i32::from(summary.failed > 0)
        }
        Err(Stopped(e)) => {
            eprintln!("sprout: {e:#}");
            2
        }
    }
}

fn read_items(path: &std::path::Path) -> Result<String> {
    let mut text = String::new();
    if path.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut text).context("reading the items from standard input")?;
    } else {
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_string(&mut text))
            .with_context(|| format!("reading the items from {}", path.display()))?;
    }
    Ok(text)
}

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

/// One item's outcome, as the line printed for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The result's JSON.
    Ok(String),
    /// The error object's JSON.
    Failed(String),
}

impl Outcome {
    pub fn line(&self) -> &str {
        match self {
            Outcome::Ok(s) | Outcome::Failed(s) => s,
        }
    }
}

/// A `/map` reply's outcomes, which must be one for each of the `expected` items sent.
pub fn outcomes(reply: &str, expected: usize) -> Result<Vec<Outcome>> {
    let values: Vec<Value> = serde_json::from_str(reply).map_err(|e| anyhow!("the worker's reply is not a JSON array of outcomes: {e}"))?;
    if values.len() != expected {
        return Err(anyhow!("the worker answered {} outcomes for {expected} items", values.len()));
    }
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::Object(mut o) if o.contains_key("result") => Ok(Outcome::Ok(o.remove("result").unwrap_or(Value::Null).to_string())),
            Value::Object(o) if o.contains_key("error") => Ok(Outcome::Failed(Value::Object(o).to_string())),
            other => Err(anyhow!("the worker's outcome {i} is neither a result nor an error: {}", truncate(&other.to_string(), 200))),
        })
        .collect()
}

fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

/// Puts the requests' answers back in order: what [`Reorder::push`] returns is every answer
/// whose turn has come, in order.
#[derive(Debug)]
pub struct Reorder<T> {
    next: usize,
    waiting: BTreeMap<usize, T>,
}

impl<T> Default for Reorder<T> {
    fn default() -> Self {
        Reorder { next: 0, waiting: BTreeMap::new() }
    }
}

impl<T> Reorder<T> {
    pub fn push(&mut self, index: usize, value: T) -> Vec<T> {
        self.waiting.insert(index, value);
        let mut ready = Vec::new();
        while let Some(v) = self.waiting.remove(&self.next) {
            ready.push(v);
            self.next += 1;
        }
        ready
    }

    /// Answers held back for one that has not come.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

/// Whether a failed request is worth sending again: it was not delivered or the worker (or
/// a proxy) could not take it now.
pub fn retryable_status(code: u16) -> bool {
    matches!(code, 429 | 502 | 503)
}

pub struct Options {
    pub url: String,
    pub name: String,
    pub concurrency: usize,
    pub ordered: bool,
    pub chunk: Option<u32>,
    /// The wait before the first resend (doubled for the next).
    pub backoff: Duration,
}

/// One request's answer.
struct Answer {
    outcomes: Vec<Outcome>,
    chunks: u64,
    rerun: u64,
    resent: u64,
}

/// Send `items` as one request, again up to [`RETRIES`] times if it could not be delivered.
fn send(agent: &ureq::Agent, opts: &Options, items: &[&str]) -> Result<Answer> {
    let url = format!("{}/map/{}", opts.url, opts.name);
    let payload = body(items);
    let mut resent = 0;
    loop {
        let mut request = agent.post(&url).set("Content-Type", "application/json");
        if let Some(chunk) = opts.chunk {
            request = request.query("chunk", &chunk.to_string());
        }
        let wait = match request.send_string(&payload) {
            Ok(response) => {
                let header = |name: &str| response.header(name).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
                let (chunks, rerun) = (header("x-sprout-map-chunks"), header("x-sprout-map-retries"));
                let mut reply = String::new();
                response.into_reader().read_to_string(&mut reply).context("reading the worker's reply")?;
                let outcomes = outcomes(&reply, items.len())?;
                return Ok(Answer { outcomes, chunks, rerun, resent });
            }
            Err(ureq::Error::Status(code, response)) if retryable_status(code) && resent < RETRIES as u64 => {
                let after = response.header("retry-after").and_then(|v| v.trim().parse::<f64>().ok());
                after.map(|s| Duration::from_secs_f64(s.clamp(0.0, 30.0)))
            }
            Err(ureq::Error::Transport(_)) if resent < RETRIES as u64 => None,
            Err(e) => return Err(client::explain(e)),
        };
        let wait = wait.unwrap_or(opts.backoff * 2u32.pow(resent as u32));
        std::thread::sleep(wait);
        resent += 1;
    }
}

/// Run the map: every item's outcome written to `out`, one line each; `progress` told the
/// items done and failed as answers come. A request that failed as a whole stops the map
/// (no more requests are sent; the outcomes already in order are written).
pub fn run(opts: &Options, items: &[&str], out: &mut dyn Write, progress: &mut dyn FnMut(usize, usize)) -> Result<Summary, Stopped> {
    let batches = split(items, request_items(items.len(), opts.concurrency), MAX_BYTES);
    let mut summary = Summary { items: items.len(), requests: batches.len(), ..Summary::default() };
    if batches.is_empty() {
        return Ok(summary);
    }
    let agent = ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(10)).max_idle_connections_per_host(opts.concurrency).build();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<(usize, Result<Answer>)>();
    let mut failure: Option<anyhow::Error> = None;
    let mut done = 0;
    std::thread::scope(|scope| {
        for _ in 0..opts.concurrency.min(batches.len()) {
            let (tx, agent, next, stop, batches) = (tx.clone(), &agent, &next, &stop, &batches);
            scope.spawn(move || loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let b = next.fetch_add(1, Ordering::Relaxed);
                let Some(range) = batches.get(b) else { break };
                let answer = send(agent, opts, &items[range.clone()]);
                if answer.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
                if tx.send((b, answer)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        let mut reorder = Reorder::default();
        let mut write = |outcomes: Vec<Outcome>| -> Result<()> {
            for o in &outcomes {
                writeln!(out, "{}", o.line())?;
            }
            out.flush()?;
            Ok(())
        };
        loop {
            let (b, answer) = match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(got) => got,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    progress(done, summary.failed);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            match answer {
                Ok(answer) => {
                    done += answer.outcomes.len();
                    summary.failed += answer.outcomes.iter().filter(|o| matches!(o, Outcome::Failed(_))).count();
                    summary.chunks += answer.chunks;
                    summary.rerun += answer.rerun;
                    summary.resent += answer.resent;
                    let ready = if opts.ordered { reorder.push(b, answer.outcomes) } else { vec![answer.outcomes] };
                    for outcomes in ready {
                        if let Err(e) = write(outcomes) {
                            // stdout closed (a pipe into `head`, say): nothing more to do.
                            stop.store(true, Ordering::Relaxed);
                            failure.get_or_insert(e.context("writing the outcomes"));
                        }
                    }
                }
                Err(e) => {
                    let range = &batches[b];
                    failure.get_or_insert(e.context(format!("the request of items {}-{} failed", range.start + 1, range.end)));
                }
            }
            progress(done, summary.failed);
        }
    });
    match failure {
        Some(e) => Err(Stopped(e)),
        None => Ok(summary),
    }
}

/// The line of stderr after a map.
pub fn summary_line(s: &Summary, seconds: f64) -> String {
    let mut line = format!(
        "{} items in {:.2} s ({:.0}/s): {} failed; {} requests, {} sandbox invocations",
        s.items,
        seconds,
        s.items as f64 / seconds.max(1e-9),
        s.failed,
        s.requests,
        s.chunks
    );
    if s.rerun > 0 {
        line += &format!(", {} items run again", s.rerun);
    }
    if s.resent > 0 {
        line += &format!(", {} requests sent again", s.resent);
    }
    line
}

/// A progress line on stderr, redrawn in place (only on a terminal).
pub struct Progress {
    total: usize,
    started: Instant,
    drawn: Option<Instant>,
    enabled: bool,
}

impl Progress {
    pub fn new(total: usize, enabled: bool) -> Progress {
        Progress { total, started: Instant::now(), drawn: None, enabled: enabled && total > 0 }
    }

    fn update(&mut self, done: usize, failed: usize) {
        if !self.enabled || self.drawn.is_some_and(|t| t.elapsed() < Duration::from_millis(100) && done < self.total) {
            return;
        }
        self.drawn = Some(Instant::now());
        let line = progress_line(done, self.total, failed, self.started.elapsed().as_secs_f64(), 30);
        eprint!("\r{line}\x1b[K");
    }

    fn finish(&mut self) {
        if self.enabled && self.drawn.is_some() {
            eprintln!();
        }
    }
}

/// `[##########----------]  1024/2048 items  3512/s  1 failed`.
pub fn progress_line(done: usize, total: usize, failed: usize, seconds: f64, width: usize) -> String {
    let filled = (done.min(total) * width).checked_div(total).unwrap_or(width);
    let rate = if seconds > 0.0 { done as f64 / seconds } else { 0.0 };
    let mut line = format!("[{}{}] {done}/{total} items  {rate:.0}/s", "#".repeat(filled), "-".repeat(width - filled));
    if failed > 0 {
        line += &format!("  {failed} failed");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    #[test]
    fn items_are_checked_whole_and_a_bad_line_is_named() {
        let text = "{\"a\": 1}\n\n  2  \n\"x\"\n[1, 2]\nnull\n";
        assert_eq!(parse_items(text, "in.jsonl").unwrap(), ["{\"a\": 1}", "2", "\"x\"", "[1, 2]", "null"]);
        let e = parse_items("1\n2\n{\"a\": }\n4\n", "in.jsonl").unwrap_err().to_string();
        assert!(e.starts_with("in.jsonl line 3 is not JSON at column 7:"), "{e}");
        assert!(e.ends_with("nothing was sent"), "{e}");
        // Two values on one line are not one event.
        assert!(parse_items("1 2\n", "x").unwrap_err().to_string().contains("line 1"));
        assert!(parse_items("{\"a\": 1}{\"b\": 2}\n", "x").is_err());
        assert!(parse_items("", "x").unwrap().is_empty());
        assert!(parse_items("\n \n", "x").unwrap().is_empty());
        // CRLF files.
        assert_eq!(parse_items("1\r\n2\r\n", "x").unwrap(), ["1", "2"]);
    }

    #[test]
    fn requests_hold_at_most_max_items_and_about_max_bytes() {
        let items: Vec<String> = (0..5000).map(|i| i.to_string()).collect();
        let batches = split(&items, MAX_ITEMS, MAX_BYTES);
        assert_eq!(batches, [0..2048, 2048..4096, 4096..5000]);
        // By bytes: each item "xxxxxxxx" (8 bytes + a comma); a body of at most 30 bytes takes 3.
        let items = vec!["xxxxxxxx"; 7];
        assert_eq!(split(&items, 100, 30), [0..3, 3..6, 6..7]);
        for r in split(&items, 100, 30) {
            assert!(body(&items[r]).len() <= 30);
        }
        // An item larger than the bound goes alone, and does not drag its neighbours along.
        let big = "y".repeat(100);
        let items = vec!["1", big.as_str(), "2", "3"];
        assert_eq!(split(&items, 100, 30), [0..1, 1..2, 2..4]);
        assert!(split::<&str>(&[], 10, 10).is_empty());
        // Every item lands in exactly one request, in order.
        let items: Vec<String> = (0..10_000).map(|i| "z".repeat(i % 700)).collect();
        let batches = split(&items, MAX_ITEMS, 1 << 20);
        assert_eq!(batches.first().unwrap().start, 0);
        assert_eq!(batches.last().unwrap().end, items.len());
        assert!(batches.windows(2).all(|w| w[0].end == w[1].start));
        assert!(batches.iter().all(|r| r.len() <= MAX_ITEMS && body(&items[r.clone()]).len() <= 1 << 20));
    }

    #[test]
    fn a_map_is_spread_over_several_requests_in_flight() {
        assert_eq!(request_items(3000, 4), 188); // 16 requests, four for each in flight
        assert_eq!(request_items(10, 4), MIN_ITEMS); // one request
        assert_eq!(request_items(1_000_000, 4), MAX_ITEMS);
        assert_eq!(request_items(0, 0), MIN_ITEMS);
        assert_eq!(split(&vec!["1"; 3000], request_items(3000, 4), MAX_BYTES).len(), 16);
    }

    #[test]
    fn a_body_is_a_json_array_of_the_items_as_written() {
        assert_eq!(body(&["1", "{\"a\": [2]}", "\"s\""]), "[1,{\"a\": [2]},\"s\"]");
        assert_eq!(body::<&str>(&[]), "[]");
        let v: Value = serde_json::from_str(&body(&["1.50", "null"])).unwrap();
        assert_eq!(v, serde_json::json!([1.5, null]));
    }

    #[test]
    fn answers_come_out_in_order() {
        let mut r = Reorder::default();
        assert!(r.push(2, "c").is_empty());
        assert!(r.push(1, "b").is_empty());
        assert_eq!(r.waiting(), 2);
        assert_eq!(r.push(0, "a"), ["a", "b", "c"]);
        assert_eq!(r.push(3, "d"), ["d"]);
        assert!(r.push(5, "f").is_empty());
        assert_eq!(r.push(4, "e"), ["e", "f"]);
        assert_eq!(r.waiting(), 0);
    }

    #[test]
    fn outcomes_are_results_or_error_objects() {
        let reply = r#"[{"result": {"n": 1}}, {"error": "handler_exception", "message": "boom", "traceback": "T"}, {"result": null}]"#;
        let o = outcomes(reply, 3).unwrap();
        assert_eq!(o[0], Outcome::Ok(r#"{"n":1}"#.into()));
        assert!(matches!(&o[1], Outcome::Failed(s) if serde_json::from_str::<Value>(s).unwrap()["error"] == "handler_exception"));
        assert_eq!(o[2], Outcome::Ok("null".into()));
        assert!(outcomes(reply, 2).unwrap_err().to_string().contains("3 outcomes for 2 items"));
        assert!(outcomes("[1]", 1).is_err());
        assert!(outcomes(r#"{"error": "x"}"#, 1).is_err());
    }

    #[test]
    fn only_undelivered_requests_are_retried() {
        for code in [429, 502, 503] {
            assert!(retryable_status(code));
        }
        for code in [400, 404, 413, 500, 504] {
            assert!(!retryable_status(code));
        }
    }

    #[test]
    fn the_progress_line() {
        assert_eq!(progress_line(5, 10, 0, 2.0, 10), "[#####-----] 5/10 items  2/s");
        assert_eq!(progress_line(10, 10, 1, 1.0, 4), "[####] 10/10 items  10/s  1 failed");
        assert_eq!(progress_line(0, 0, 0, 0.0, 3), "[###] 0/0 items  0/s");
    }

    /// A worker's `/map` on a local port: each request's items are numbers, an item's result
    /// is its double and a negative one fails; the first `unavailable` requests are answered
    /// 503, and later answers are slower for earlier items (so they come back out of order).
    fn fake_worker(unavailable: usize, status: u16) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let refused = Arc::new(AtomicUsize::new(0));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let (log, refused) = (log.clone(), refused.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    loop {
                        let mut first = String::new();
                        if reader.read_line(&mut first).unwrap_or(0) == 0 {
                            return;
                        }
                        let mut length = 0;
                        loop {
                            let mut h = String::new();
                            reader.read_line(&mut h).unwrap();
                            if h.trim().is_empty() {
                                break;
                            }
                            if let Some((k, v)) = h.split_once(':') {
                                if k.eq_ignore_ascii_case("content-length") {
                                    length = v.trim().parse().unwrap();
                                }
                            }
                        }
                        let mut body = vec![0; length];
                        reader.read_exact(&mut body).unwrap();
                        log.lock().unwrap().push(first.split_whitespace().nth(1).unwrap_or("").to_string());
                        let mut stream = &stream;
                        if refused.fetch_add(1, Ordering::SeqCst) < unavailable {
                            let _ = write!(stream, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n");
                            continue;
                        }
                        if status != 200 {
                            let err = r#"{"error": "lambda_not_found", "message": "no lambda named \"nope\""}"#;
                            let _ = write!(
                                stream,
                                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{err}",
                                err.len()
                            );
                            continue;
                        }
                        let items: Vec<i64> = serde_json::from_slice(&body).unwrap();
                        std::thread::sleep(Duration::from_millis(((100 - items[0].clamp(0, 100)) / 10) as u64));
                        let reply: Vec<Value> = items
                            .iter()
                            .map(|n| {
                                if *n < 0 {
                                    serde_json::json!({"error": "handler_exception", "message": "negative"})
                                } else {
                                    serde_json::json!({"result": n * 2})
                                }
                            })
                            .collect();
                        let reply = serde_json::to_string(&reply).unwrap();
                        let _ = write!(
                            stream,
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nx-sprout-map-chunks: 1\r\nContent-Length: {}\r\n\r\n{reply}",
                            reply.len()
                        );
                    }
                });
            }
        });
        (url, seen)
    }

    fn options(url: &str, ordered: bool, chunk: Option<u32>) -> Options {
        Options { url: url.into(), name: "double".into(), concurrency: 4, ordered, chunk, backoff: Duration::from_millis(5) }
    }

    #[test]
    fn a_map_prints_every_outcome_in_order_and_counts_failures() {
        let (url, seen) = fake_worker(1, 200);
        let lines: Vec<String> = (0..5000).map(|i| if i == 77 { "-1".to_string() } else { i.to_string() }).collect();
        let items: Vec<&str> = lines.iter().map(String::as_str).collect();
        let mut out = Vec::new();
        let mut updates = 0;
        let summary = run(&options(&url, true, Some(8)), &items, &mut out, &mut |_, _| updates += 1).unwrap();
        let printed: Vec<String> = String::from_utf8(out).unwrap().lines().map(str::to_string).collect();
        assert_eq!(printed.len(), 5000);
        for (i, line) in printed.iter().enumerate() {
            if i == 77 {
                assert!(line.contains("handler_exception"), "{line}");
            } else {
                assert_eq!(line, &(i * 2).to_string());
            }
        }
        assert_eq!(summary, Summary { items: 5000, failed: 1, requests: 16, chunks: 16, rerun: 0, resent: 1 });
        assert!(updates >= 16);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 17); // one 503, sent again
        assert!(seen.iter().all(|path| path == "/map/double?chunk=8"), "{seen:?}");
    }

    #[test]
    fn unordered_still_prints_every_outcome_once() {
        let (url, _) = fake_worker(0, 200);
        let lines: Vec<String> = (0..4100).map(|i| i.to_string()).collect();
        let items: Vec<&str> = lines.iter().map(String::as_str).collect();
        let mut out = Vec::new();
        run(&options(&url, false, None), &items, &mut out, &mut |_, _| {}).unwrap();
        let mut got: Vec<i64> = String::from_utf8(out).unwrap().lines().map(|l| l.parse().unwrap()).collect();
        got.sort();
        assert_eq!(got, (0..4100).map(|i| i * 2).collect::<Vec<i64>>());
    }

    #[test]
    fn a_request_error_stops_the_map() {
        let (url, seen) = fake_worker(0, 404);
        let mut out = Vec::new();
        let Stopped(e) = run(&options(&url, true, None), &["1", "2"], &mut out, &mut |_, _| {}).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains("404 lambda_not_found"), "{e}");
        assert!(out.is_empty());
        assert_eq!(seen.lock().unwrap().len(), 1); // a 404 is not sent again
                                                   // Still unavailable after the retries.
        let (url, seen) = fake_worker(usize::MAX, 200);
        let Stopped(e) = run(&options(&url, true, None), &["1"], &mut Vec::new(), &mut |_, _| {}).unwrap_err();
        assert!(format!("{e:#}").contains("503"), "{e:#}");
        assert_eq!(seen.lock().unwrap().len(), 1 + RETRIES as usize);
        // Nobody listening: connection refused, retried, then an error naming the worker.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let Stopped(e) =
            run(&options(&format!("http://127.0.0.1:{port}"), true, None), &["1"], &mut Vec::new(), &mut |_, _| {}).unwrap_err();
        assert!(format!("{e:#}").contains("cannot reach the worker"), "{e:#}");
    }

    #[test]
    fn nothing_to_map_sends_nothing() {
        let summary = run(&options("http://127.0.0.1:1", true, None), &[], &mut Vec::new(), &mut |_, _| {}).unwrap();
        assert_eq!(summary.requests, 0);
    }
}
