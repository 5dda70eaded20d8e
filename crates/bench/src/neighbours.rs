//! `sprout bench neighbours`: how much noisy neighbours slow another lambda's warm invocations on one worker.
//!
//! One real worker (the `sock` back-end, its default configuration but for four sandboxes a
//! lambda and a timeout the neighbours' calls fit in), pinned with its sandboxes to one CPU;
//! every client runs on another, each on its own keep-alive HTTP connection. A victim lambda
//! (`def f(event): return event`) is called in a closed loop by one client, first alone, then
//! beside three closed-loop clients of one neighbour at a time:
//!
//! * `printer`: 20 MB to stdout per call (100-byte lines, written 1 MB at a time), as fast as
//!   it goes — the issue's reproduction, where the worker's shared log path made the victim
//!   55× slower;
//! * `printer-paced`: 100 MB/s across its three callers (each call ~33 MB/s for ~1 s, 1 MB at
//!   a time, sleeping to keep the pace);
//! * `spinner`: a busy loop for 1 s of CPU per call;
//! * `churner`: allocates a 100 MiB bytearray, touches every page and frees it, per call;
//!
//! then alone again (the drift over the run), and last a victim that prints one line per call
//! against the silent one in alternating rounds. Only warm answers of the victim count
//! (`X-Sprout-Start: warm`); per phase the victim's percentiles and their ratio to the first
//! `alone`, the neighbour's calls, and for the printers the output rate they reached, the bytes
//! their logs hold under `DIR/logs/<lambda>/` (sampled through the phase and after it) and
//! `sprout_log_dropped_lines_total` from `/metrics`. Results: neighbours.json, .md and .png.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::http::Client;
use crate::report;
use crate::sandboxes::Options;
use crate::worker::BenchWorker;

/// The neighbours, in the order their phases run.
pub const NEIGHBOURS: [&str; 4] = ["printer", "printer-paced", "spinner", "churner"];
/// Closed-loop clients calling the neighbour in its phase.
pub const CALLERS: usize = 3;
/// The issue's figures for its reproduction (the `printer` phase): victim p50 and p99 ÷ alone.
const ISSUE_P50: f64 = 55.0;
const ISSUE_P99: f64 = 60.0;
/// A request unanswered this long counts as an error (the worker's timeout is 120 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(150);
/// The victim's event (echoed back).
const EVENT: &[u8] = br#"{"hello": "world"}"#;

const VICTIM: &str = "def f(event):\n    return event\n";

const VICTIM_PRINTS: &str = "def f(event):\n    print(\"victim-prints: handled a request\")\n    return event\n";

/// 20 MB of 100-byte lines per call, 1 MB per write, as fast as the pipe takes them.
const PRINTER: &str = r#"import sys
import time

LINE = "p" * 99 + "\n"
CHUNK = LINE * 10_000  # 1 MB
CHUNKS = 20


def f(event):
    t0 = time.monotonic()
    for _ in range(CHUNKS):
        sys.stdout.write(CHUNK)
    sys.stdout.flush()
    return {"bytes": CHUNKS * len(CHUNK), "seconds": time.monotonic() - t0}
"#;

/// ~33 MB/s for ~1 s per call, 1 MB per write, sleeping to keep the pace: 100 MB/s in all
/// across three callers.
const PRINTER_PACED: &str = r#"import sys
import time

LINE = "q" * 99 + "\n"
CHUNK = LINE * 10_000  # 1 MB
RATE = 100e6 / 3  # bytes a second, per call
CHUNKS = round(RATE / len(CHUNK))  # one second's worth


def f(event):
    t0 = time.monotonic()
    for i in range(CHUNKS):
        delay = t0 + i * len(CHUNK) / RATE - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sys.stdout.write(CHUNK)
    sys.stdout.flush()
    delay = t0 + CHUNKS * len(CHUNK) / RATE - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    return {"bytes": CHUNKS * len(CHUNK), "seconds": time.monotonic() - t0}
"#;

/// A busy loop until it has used 1 s of CPU.
const SPINNER: &str = r#"import time


def f(event):
    t0 = time.process_time()
    n = 0
    while time.process_time() - t0 < 1.0:
        for _ in range(10_000):
            n += 1
    return {"cpu_seconds": time.process_time() - t0, "loops": n}
"#;

/// 100 MiB allocated, every page touched, freed.
const CHURNER: &str = r#"import time

SIZE = 100 << 20
PAGE = 4096


def f(event):
    t0 = time.monotonic()
    b = bytearray(SIZE)
    for i in range(0, SIZE, PAGE):
        b[i] = 1
    del b
    return {"allocated": SIZE, "seconds": time.monotonic() - t0}
"#;

const LAMBDAS: [(&str, &str); 6] = [
    ("victim", VICTIM),
    ("victim-prints", VICTIM_PRINTS),
    ("printer", PRINTER),
    ("printer-paced", PRINTER_PACED),
    ("spinner", SPINNER),
    ("churner", CHURNER),
];

/// How long each part runs.
struct Plan {
    quick: bool,
    /// Measured seconds per phase, after `warmup`.
    seconds: f64,
    warmup: f64,
    /// G1: alternating rounds of the silent and the printing victim, `g1_seconds` each.
    g1_rounds: usize,
    g1_seconds: f64,
    g1_warmup: f64,
}

impl Plan {
    fn new(opts: &Options, quick: bool) -> Plan {
        if quick {
            let seconds = opts.seconds.min(4.0);
            Plan { quick, seconds, warmup: 2.0, g1_rounds: 4, g1_seconds: seconds / 2.0, g1_warmup: 0.5 }
        } else {
            Plan { quick, seconds: opts.seconds, warmup: 5.0, g1_rounds: 6, g1_seconds: opts.seconds / 4.0, g1_warmup: 1.0 }
        }
    }
}

/// The worker's configuration: its defaults but for what the neighbours need.
fn worker_config(cpu: usize) -> String {
    format!(
        "[sandbox]\nbackend = \"sock\"\ncpuset = \"{cpu}\"\nstart_timeout_ms = 60000\n\n\
         [limits]\ntimeout_ms = 120000\n\n\
         [instances]\nmax_per_lambda = {}\n",
        CALLERS + 1
    )
}

/// What one or more closed-loop clients saw in the measured window.
struct Tally {
    /// Latency of the calls counted, in nanoseconds.
    latency: Histogram<u64>,
    /// Calls counted: for the victim only warm ones, for a neighbour every answered one.
    ok: u64,
    /// Answers that were not warm starts (for the victim: not counted in `latency`).
    cold: u64,
    /// Failed calls (an error status, a broken connection, no answer in time) in the window,
    /// and during the warm-up.
    errors: u64,
    warmup_errors: u64,
    first_error: Option<String>,
    /// Output the counted calls say they wrote (the printers).
    bytes: u64,
    /// When the last counted call ended.
    last_done: Option<Instant>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram bounds"),
            ok: 0,
            cold: 0,
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
    fn json(&self, seconds: f64) -> Value {
        json!({
            "calls": self.ok,
            "per_s": self.ok as f64 / seconds,
            "not_warm": self.cold,
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

/// One client calling `path` back to back from now until `stop_at`, counting the calls sent
/// from `measure_from` on; the call under way at `stop_at` is finished and counted. With
/// `warm_only`, answers that were not warm starts are counted apart, not in the latency.
async fn calls(port: u16, path: String, body: &'static [u8], measure_from: Instant, stop_at: Instant, warm_only: bool) -> Tally {
    let mut tally = Tally::new();
    let mut client: Option<Client> = None;
    while Instant::now() < stop_at {
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
struct PhaseRun {
    victim: Tally,
    neighbour: Option<Tally>,
    /// From the start of the measured window to the neighbours' last answer (they finish the
    /// call under way at the end).
    neighbour_seconds: f64,
    /// The most bytes seen under the neighbour's log directory while the phase ran.
    log_bytes_max: Option<u64>,
}

/// The victim's client (and, with a neighbour, its `CALLERS` clients) for `warmup` and then
/// `seconds`; `log_dir`, when given, is sampled every 250 ms.
async fn phase(port: u16, victim: &str, neighbour: Option<&str>, warmup: f64, seconds: f64, log_dir: Option<PathBuf>) -> PhaseRun {
    let started = Instant::now();
    let measure_from = started + Duration::from_secs_f64(warmup);
    let stop_at = measure_from + Duration::from_secs_f64(seconds);
    let victim_task = tokio::spawn(calls(port, format!("/run/{victim}"), EVENT, measure_from, stop_at, true));
    let neighbour_tasks: Vec<_> = neighbour
        .map(|n| (0..CALLERS).map(|_| tokio::spawn(calls(port, format!("/run/{n}"), b"null", measure_from, stop_at, false))).collect())
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
fn dir_bytes(dir: &Path) -> Option<u64> {
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

/// The worker's /metrics text, with its token.
fn metrics(worker: &BenchWorker) -> Result<String> {
    let token = std::fs::read_to_string(worker.dir.join("api-token")).context("reading the worker's API token")?;
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(20)).build();
    let text =
        agent.get(&format!("{}/metrics", worker.url())).set("Authorization", &format!("Bearer {}", token.trim())).call()?.into_string()?;
    Ok(text)
}

/// The sample of `family` (a counter, `_total` included) labelled `lambda="<lambda>"`: None when
/// the worker does not expose the family, 0 when it has no sample of the lambda yet.
fn lambda_counter(text: &str, family: &str, lambda: &str) -> Option<f64> {
    let mut exposed = false;
    for line in text.lines() {
        if line.starts_with('#') {
            exposed |= line.split_whitespace().nth(2) == Some(family);
            continue;
        }
        let Some(rest) = line.strip_prefix(family).and_then(|r| r.strip_prefix('{')) else { continue };
        exposed = true;
        let Some((labels, value)) = rest.split_once('}') else { continue };
        if labels.split(',').any(|l| l.trim() == format!("lambda=\"{lambda}\"")) {
            return value.split_whitespace().next().and_then(|v| v.parse().ok());
        }
    }
    exposed.then_some(0.0)
}

/// A counter without labels, None when absent.
fn counter(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// One line of the command's output.
fn shell(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program).args(args).current_dir(report::bench_dir()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A free TCP port on the loopback.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// Run every phase (`quick`: 4 s each, G1 in 4 rounds); writes neighbours.json, .md, .png
/// under `opts.out_dir`.
pub fn run(opts: &Options, quick: bool) -> Result<Value> {
    let plan = Plan::new(opts, quick);
    // SAFETY: sysconf takes an integer name and touches no memory of ours.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let mut notes: Vec<String> = Vec::new();
    let pinned = opts.worker_cpu != opts.client_cpu && opts.worker_cpu.max(opts.client_cpu) < cpus;
    if pinned {
        crate::worker::pin_to(opts.client_cpu)?;
    } else {
        notes.push("the worker and the clients could not be put on separate CPUs: nothing is pinned".into());
        eprintln!("warning: cannot put the worker and the clients on separate CPUs here; nothing pinned");
    }
    std::fs::create_dir_all(&opts.work_dir)?;
    let config = worker_config(opts.worker_cpu);
    let dir = opts.work_dir.join("worker");
    let port = free_port()?;
    eprintln!(
        "neighbours: a worker in {} on CPU {}, clients on CPU {}; phases of {} s after {} s of warm-up",
        dir.display(),
        opts.worker_cpu,
        opts.client_cpu,
        plan.seconds,
        plan.warmup
    );
    let worker = BenchWorker::start(&opts.sprout, &dir, port, pinned.then_some(opts.worker_cpu), &config)?;
    // The limit the worker holds each lambda's log files to: its [logs] max_mb, as it reads it.
    let log_limit = match sprout_worker::Config::load(&dir) {
        Ok(c) => c.logs.max_mb << 20,
        Err(e) => {
            notes.push(format!("could not read the worker's [logs] max_mb ({e:#}); took 16 MiB"));
            16 << 20
        }
    };
    let measured = measure(&worker, &plan, &mut notes);
    let log_tail = worker.log_tail(400);
    let _ = worker.stop();
    let (phases, g1) = measured?;
    let worker_log: Vec<&str> = log_tail.lines().filter(|l| l.contains("ERROR") || l.contains("WARN")).collect();
    let results = summarize(opts, &plan, &config, log_limit, phases, g1, notes, &worker_log);
    report::write(&opts.out_dir, "neighbours", &results, &markdown(&results), "plot_neighbours.py")?;
    Ok(results)
}

/// Every phase, then G1's rounds: (phases, G1).
fn measure(worker: &BenchWorker, plan: &Plan, notes: &mut Vec<String>) -> Result<(Vec<Value>, Value)> {
    for (name, source) in LAMBDAS {
        worker.upload(name, &[("f.py", source.as_bytes())])?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let logs_root = worker.dir.join("logs");
    let mut phases = Vec::new();
    let mut order: Vec<(&str, Option<&str>)> = vec![("alone", None)];
    order.extend(NEIGHBOURS.iter().map(|n| (*n, Some(*n))));
    order.push(("alone-end", None));
    let mut metrics_missing = false;
    for (name, neighbour) in order {
        eprintln!(
            "  {name}: {}",
            neighbour.map(|n| format!("victim beside {CALLERS} callers of {n}")).unwrap_or_else(|| "victim alone".into())
        );
        let log_dir = neighbour.filter(|n| n.starts_with("printer")).map(|n| logs_root.join(n));
        let run = runtime.block_on(phase(worker.port, "victim", neighbour, plan.warmup, plan.seconds, log_dir.clone()));
        let mut out = json!({"name": name, "neighbour": neighbour, "seconds": plan.seconds, "victim": run.victim.json(plan.seconds)});
        if let (Some(n), Some(tally)) = (neighbour, run.neighbour.as_ref()) {
            out["neighbour_calls"] = tally.json(run.neighbour_seconds);
            if n.starts_with("printer") {
                // Let the worker take in the last of the output before looking at what it kept.
                std::thread::sleep(Duration::from_secs(1));
                let text = match metrics(worker) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        notes.push(format!("GET /metrics after {name} failed: {e:#}"));
                        None
                    }
                };
                let text = text.as_deref().unwrap_or("");
                let dropped_lines = lambda_counter(text, "sprout_log_dropped_lines_total", n);
                let dropped_bytes = lambda_counter(text, "sprout_log_dropped_bytes_total", n).map(|b| b as u64);
                metrics_missing |= dropped_lines.is_none();
                let after = log_dir.as_deref().and_then(dir_bytes);
                out["output"] = json!({
                    "bytes_written": tally.bytes,
                    "seconds": run.neighbour_seconds,
                    "mb_s": tally.bytes as f64 / 1e6 / run.neighbour_seconds,
                    "log_dir": log_dir.as_ref().map(|d| d.display().to_string()),
                    "log_bytes_after": after,
                    "log_bytes_max": run.log_bytes_max.max(after),
                    "dropped_lines": dropped_lines.map(|l| l as u64),
                    "dropped_bytes": dropped_bytes,
                    "writer_dropped_entries": counter(text, "sprout_log_writer_dropped_entries_total").map(|e| e as u64),
                });
            }
        }
        eprintln!("    {}", progress(&out));
        phases.push(out);
        std::thread::sleep(Duration::from_millis(500));
    }
    if logs_root.is_dir() {
        // The worker keeps log files: nothing to say.
    } else {
        notes.push(format!("the worker keeps no {}: log bytes are null", logs_root.display()));
    }
    if metrics_missing {
        notes.push("the worker's /metrics has no sprout_log_dropped_lines_total: dropped lines are null".into());
    }
    // G1: the silent victim against one printing a line per call, alternating which goes first.
    eprintln!("  G1: victim against victim-prints, {} rounds of {} s", plan.g1_rounds, plan.g1_seconds);
    let mut rounds = Vec::new();
    for round in 0..plan.g1_rounds {
        let mut pair = ["victim", "victim-prints"];
        if round % 2 == 1 {
            pair.reverse();
        }
        let mut r = json!({"round": round, "first": pair[0]});
        for lambda in pair {
            let run = runtime.block_on(phase(worker.port, lambda, None, plan.g1_warmup, plan.g1_seconds, None));
            r[lambda] = run.victim.json(plan.g1_seconds);
        }
        r["p50_ratio"] = json!(ratio(f(&r["victim-prints"]["p50_ms"]), f(&r["victim"]["p50_ms"])));
        eprintln!(
            "    round {round}: victim p50 {} ms, victim-prints p50 {} ms ({})",
            fmt_ms(&r["victim"]["p50_ms"]),
            fmt_ms(&r["victim-prints"]["p50_ms"]),
            fmt_x(&r["p50_ratio"])
        );
        rounds.push(r);
    }
    let text = metrics(worker).unwrap_or_default();
    let med = |lambda: &str, key: &str| report::median(rounds.iter().filter_map(|r| f(&r[lambda][key])).collect());
    let g1 = json!({
        "rounds": rounds,
        "seconds_per_round": plan.g1_seconds,
        "victim_p50_ms": med("victim", "p50_ms"),
        "victim_p99_ms": med("victim", "p99_ms"),
        "victim_prints_p50_ms": med("victim-prints", "p50_ms"),
        "victim_prints_p99_ms": med("victim-prints", "p99_ms"),
        "p50_ratio": ratio(med("victim-prints", "p50_ms"), med("victim", "p50_ms")),
        "p99_ratio": ratio(med("victim-prints", "p99_ms"), med("victim", "p99_ms")),
        "victim_prints_dropped_lines": lambda_counter(&text, "sprout_log_dropped_lines_total", "victim-prints").map(|l| l as u64),
    });
    Ok((phases, g1))
}

fn fmt_ms(v: &Value) -> String {
    f(v).map(|x| format!("{x:.3}")).unwrap_or_else(|| "—".into())
}

fn fmt_x(v: &Value) -> String {
    f(v).map(|x| format!("{x:.2}×")).unwrap_or_else(|| "—".into())
}

fn fmt_mib(v: &Value) -> String {
    f(v).map(|x| format!("{:.1}", x / (1u64 << 20) as f64)).unwrap_or_else(|| "—".into())
}

/// A phase's progress line.
fn progress(p: &Value) -> String {
    let v = &p["victim"];
    let mut line = format!(
        "victim: {} warm calls, p50 {} ms, p99 {} ms, {} errors, {} not warm",
        v["calls"],
        fmt_ms(&v["p50_ms"]),
        fmt_ms(&v["p99_ms"]),
        v["errors"],
        v["not_warm"]
    );
    let n = &p["neighbour_calls"];
    if !n.is_null() {
        line += &format!(" | neighbour: {} calls, p50 {} ms, {} errors", n["calls"], fmt_ms(&n["p50_ms"]), n["errors"]);
    }
    let o = &p["output"];
    if !o.is_null() {
        line += &format!(
            " | {:.1} MB/s, logs {} MiB (most {}), {} lines dropped",
            f(&o["mb_s"]).unwrap_or(f64::NAN),
            fmt_mib(&o["log_bytes_after"]),
            fmt_mib(&o["log_bytes_max"]),
            o["dropped_lines"]
        );
    }
    line
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    opts: &Options,
    plan: &Plan,
    config: &str,
    log_limit: u64,
    mut phases: Vec<Value>,
    g1: Value,
    mut notes: Vec<String>,
    worker_log: &[&str],
) -> Value {
    let alone_of = |name: &str| phases.iter().find(|p| p["name"] == name).map(|p| p["victim"].clone()).unwrap_or(Value::Null);
    let (alone, end) = (alone_of("alone"), alone_of("alone-end"));
    for p in phases.iter_mut() {
        let against = |base: &Value| {
            json!({
                "p50": ratio(f(&p["victim"]["p50_ms"]), f(&base["p50_ms"])),
                "p99": ratio(f(&p["victim"]["p99_ms"]), f(&base["p99_ms"])),
            })
        };
        let (r, r_end) = (against(&alone), against(&end));
        p["ratio"] = r;
        p["ratio_end"] = r_end;
        let v = &p["victim"];
        if v["errors"].as_u64().unwrap_or(0) > 0 || v["not_warm"].as_u64().unwrap_or(0) > 0 {
            notes.push(format!(
                "{}: the victim had {} errors and {} answers that were not warm (left out){}",
                p["name"].as_str().unwrap_or(""),
                v["errors"],
                v["not_warm"],
                v["first_error"].as_str().map(|e| format!("; first error: {e}")).unwrap_or_default()
            ));
        }
        let n = &p["neighbour_calls"];
        if n["errors"].as_u64().unwrap_or(0) + n["warmup_errors"].as_u64().unwrap_or(0) > 0 {
            notes.push(format!(
                "{}: the neighbour had {} errors ({} in the warm-up); first: {}",
                p["name"].as_str().unwrap_or(""),
                n["errors"],
                n["warmup_errors"],
                n["first_error"].as_str().unwrap_or("")
            ));
        }
    }
    let drift = json!({
        "p50": ratio(f(&end["p50_ms"]), f(&alone["p50_ms"])),
        "p99": ratio(f(&end["p99_ms"]), f(&alone["p99_ms"])),
    });
    for key in ["p50", "p99"] {
        if let Some(d) = f(&drift[key]).filter(|d| !(0.8..=1.25).contains(d)) {
            notes.push(format!(
                "the victim alone moved between the first and the last phase: {key} {} against {} ms ({d:.2}×); the machine was \
                 not quiet, and ratios to one run alone are not to be trusted (the p99 goals are judged against both)",
                fmt_ms(&end[format!("{key}_ms")]),
                fmt_ms(&alone[format!("{key}_ms")])
            ));
        }
    }
    let by_name = |name: &str| phases.iter().find(|p| p["name"] == name).cloned().unwrap_or(Value::Null);
    let paced = by_name("printer-paced");
    let printer = by_name("printer");
    let g1_ratio = f(&g1["p50_ratio"]);
    let g2_logs = f(&paced["output"]["log_bytes_max"]);
    let goal = |id: &str, target: String, measured: Option<f64>, limit: f64, figure: String| json!({"id": id, "target": target, "limit": limit, "measured": measured, "figure": figure, "met": measured.map(|m| m <= limit)});
    let x = |m: Option<f64>| m.map(|m| format!("{m:.2}×")).unwrap_or_else(|| "not measured".into());
    // A p99 goal is met only against both runs alone: the larger of the two ratios.
    let p99_goal = |id: &str, target: String, phase: &str, limit: f64, extra: String| {
        let p = by_name(phase);
        let (first, last) = (f(&p["ratio"]["p99"]), f(&p["ratio_end"]["p99"]));
        let worse = match (first, last) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let figure = format!(
            "{} alone's, {} alone-end's ({} against {} / {} ms{extra})",
            x(first),
            x(last),
            fmt_ms(&p["victim"]["p99_ms"]),
            fmt_ms(&alone["p99_ms"]),
            fmt_ms(&end["p99_ms"])
        );
        goal(id, target, worse, limit, figure)
    };
    let goals = vec![
        goal(
            "G1",
            "a handler printing one line per call: warm p50 ≤ 1.03× a silent handler's".into(),
            g1_ratio,
            1.03,
            format!(
                "{} ({} against {} ms, medians of {} alternating rounds)",
                x(g1_ratio),
                fmt_ms(&g1["victim_prints_p50_ms"]),
                fmt_ms(&g1["victim_p50_ms"]),
                plan.g1_rounds
            ),
        ),
        p99_goal(
            "G2",
            format!("beside a lambda printing 100 MB/s ({CALLERS} callers): another's warm p99 ≤ 1.10× alone"),
            "printer-paced",
            1.10,
            format!("; the printer reached {:.1} MB/s", f(&paced["output"]["mb_s"]).unwrap_or(f64::NAN)),
        ),
        goal(
            "G2-logs",
            format!("that lambda's stored logs (DIR/logs/printer-paced/) within [logs] max_mb ({} MiB)", log_limit >> 20),
            g2_logs,
            log_limit as f64,
            match g2_logs {
                Some(b) => format!("{:.2} MiB at most ({} lines dropped)", b / (1u64 << 20) as f64, paced["output"]["dropped_lines"]),
                None => "not measured: the worker keeps no log files".into(),
            },
        ),
        p99_goal(
            "G3-spinner",
            format!("beside {CALLERS} sandboxes spinning the CPU (1 s a call): a victim's warm p99 ≤ 2× alone"),
            "spinner",
            2.0,
            String::new(),
        ),
        p99_goal(
            "G3-churner",
            format!("beside {CALLERS} sandboxes churning memory (100 MiB a call): a victim's warm p99 ≤ 2× alone"),
            "churner",
            2.0,
            String::new(),
        ),
    ];
    // Online CPUs of the machine, not this (pinned) process's affinity.
    // SAFETY: sysconf takes an integer name and touches no memory of ours.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1);
    let kernel = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    json!({
        "machine": report::machine(),
        "kernel": kernel,
        "cpus": cpus,
        "date": shell("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        "commit": shell("git", &["describe", "--always", "--dirty"]),
        "method": format!(
            "one sprout worker (sock back-end, its defaults but [instances] max_per_lambda = {} and [limits] timeout_ms = 120000) pinned \
             to CPU {} with its sandboxes, every client on CPU {}, each on its own keep-alive HTTP/1.1 connection; the victim \
             (`return event`) in a closed loop, alone and then beside {CALLERS} closed-loop callers of each neighbour; {} s measured \
             per phase after {} s of warm-up; only the victim's warm answers counted; ratios against the first `alone` (and `alone-end`: a p99 goal is met \
             only against both)",
            CALLERS + 1,
            opts.worker_cpu,
            opts.client_cpu,
            plan.seconds,
            plan.warmup
        ),
        "options": {
            "seconds": plan.seconds, "warmup_s": plan.warmup, "quick": plan.quick, "worker_cpu": opts.worker_cpu,
            "client_cpu": opts.client_cpu, "callers": CALLERS, "g1_rounds": plan.g1_rounds, "g1_seconds": plan.g1_seconds,
            "g1_warmup_s": plan.g1_warmup, "work_dir": opts.work_dir.display().to_string(), "worker_config": config,
            "log_limit_bytes": log_limit,
        },
        "phases": phases,
        "drift": drift,
        "g1": g1,
        "issue": {
            "what": "a neighbour writing 20 MB to stdout per call, 3 callers (the issue: p50 55×, p99 60×)",
            "issue_p50_ratio": ISSUE_P50, "issue_p99_ratio": ISSUE_P99,
            "p50_ratio": printer["ratio"]["p50"], "p99_ratio": printer["ratio"]["p99"],
        },
        "goals": goals,
        "notes": notes,
        "worker_log_warnings": worker_log.iter().rev().take(20).rev().collect::<Vec<_>>(),
    })
}

pub fn markdown(r: &Value) -> String {
    let mut md = format!(
        "# Noisy neighbours: a victim's warm latency alone and beside noisy lambdas\n\n{} — {}, commit {}\n\n{}.\n\n\
         | phase | victim warm calls | p50 ms | p90 ms | p99 ms | max ms | p50 ÷ alone | p99 ÷ alone | p99 ÷ alone-end | errors | neighbour calls | neighbour p50 ms | output MB/s | logs MiB (most) | lines dropped |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        r["machine"].as_str().unwrap_or(""),
        r["date"].as_str().unwrap_or(""),
        r["commit"].as_str().unwrap_or(""),
        r["method"].as_str().unwrap_or("")
    );
    for p in r["phases"].as_array().into_iter().flatten() {
        let (v, n, o) = (&p["victim"], &p["neighbour_calls"], &p["output"]);
        let or_dash = |v: &Value| if v.is_null() { "—".to_string() } else { v.to_string() };
        md += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            p["name"].as_str().unwrap_or(""),
            v["calls"],
            fmt_ms(&v["p50_ms"]),
            fmt_ms(&v["p90_ms"]),
            fmt_ms(&v["p99_ms"]),
            fmt_ms(&v["max_ms"]),
            fmt_x(&p["ratio"]["p50"]),
            fmt_x(&p["ratio"]["p99"]),
            fmt_x(&p["ratio_end"]["p99"]),
            v["errors"],
            or_dash(&n["calls"]),
            fmt_ms(&n["p50_ms"]),
            f(&o["mb_s"]).map(|x| format!("{x:.1}")).unwrap_or_else(|| "—".into()),
            if o.is_null() { "—".into() } else { format!("{} ({})", fmt_mib(&o["log_bytes_after"]), fmt_mib(&o["log_bytes_max"])) },
            or_dash(&o["dropped_lines"]),
        );
    }
    let g1 = &r["g1"];
    md += &format!(
        "\nG1, {} alternating rounds of {} s: victim p50 {} ms, p99 {} ms; victim-prints p50 {} ms, p99 {} ms; p50 {}, p99 {}.\n",
        g1["rounds"].as_array().map(Vec::len).unwrap_or(0),
        g1["seconds_per_round"],
        fmt_ms(&g1["victim_p50_ms"]),
        fmt_ms(&g1["victim_p99_ms"]),
        fmt_ms(&g1["victim_prints_p50_ms"]),
        fmt_ms(&g1["victim_prints_p99_ms"]),
        fmt_x(&g1["p50_ratio"]),
        fmt_x(&g1["p99_ratio"]),
    );
    md += &format!("Drift (alone-end ÷ alone): p50 {}, p99 {}.\n", fmt_x(&r["drift"]["p50"]), fmt_x(&r["drift"]["p99"]));
    md += "\n| goal | target | measured | met |\n|---|---|---|---|\n";
    for g in r["goals"].as_array().into_iter().flatten() {
        let met = match g["met"].as_bool() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        md += &format!(
            "| {} | {} | {} | {met} |\n",
            g["id"].as_str().unwrap_or(""),
            g["target"].as_str().unwrap_or(""),
            g["figure"].as_str().unwrap_or("")
        );
    }
    let notes: Vec<&str> = r["notes"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if !notes.is_empty() {
        md += "\nNotes:\n\n";
        for n in notes {
            md += &format!("- {n}\n");
        }
    }
    md
}

/// The goals, one line each, for the command's output.
pub fn summary(r: &Value) -> String {
    let mut s = String::new();
    for g in r["goals"].as_array().into_iter().flatten() {
        let met = crate::report::verdict(g["met"].as_bool());
        s += &format!(
            "{:<10} {:<12} {} — {}\n",
            g["id"].as_str().unwrap_or(""),
            met,
            g["figure"].as_str().unwrap_or(""),
            g["target"].as_str().unwrap_or("")
        );
    }
    s += &format!(
        "issue      printer (20 MB a call, {CALLERS} callers): victim p50 {}, p99 {} alone's (the issue: {ISSUE_P50}×, {ISSUE_P99}×)\n",
        fmt_x(&r["issue"]["p50_ratio"]),
        fmt_x(&r["issue"]["p99_ratio"])
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_lambdas_counter() {
        let text = "# HELP sprout_log_dropped_lines_total Lines dropped.\n# TYPE sprout_log_dropped_lines_total counter\n\
                    sprout_log_dropped_lines_total{lambda=\"printer-paced\"} 12\nsprout_log_dropped_lines_total{lambda=\"printer\"} 7\n\
                    sprout_log_writer_dropped_entries_total 3\n";
        assert_eq!(lambda_counter(text, "sprout_log_dropped_lines_total", "printer"), Some(7.0));
        assert_eq!(lambda_counter(text, "sprout_log_dropped_lines_total", "printer-paced"), Some(12.0));
        assert_eq!(lambda_counter(text, "sprout_log_dropped_lines_total", "victim"), Some(0.0));
        assert_eq!(lambda_counter(text, "sprout_log_dropped_bytes_total", "printer"), None);
        assert_eq!(counter(text, "sprout_log_writer_dropped_entries_total"), Some(3.0));
    }
}
