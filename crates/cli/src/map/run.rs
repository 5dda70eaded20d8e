//! Running a map: its requests sent `concurrency` at a time (one thread each), a request that
//! could not be delivered sent again, every outcome written as its turn comes.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result};

use super::items::{body, request_items, split, MAX_BYTES};
use super::outcomes::{outcomes, Outcome, Reorder};
use crate::client;

/// Times a request that could not be delivered is sent again.
pub const RETRIES: u32 = 2;

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
