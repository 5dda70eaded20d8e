//! `sprout map NAME ITEMS.jsonl`: run a lambda over many events through the worker's
//! `POST /map/<name>` (docs/offload.md), from the command line.
//!
//! Every line of the file is one event (blank lines are skipped); the file is checked whole
//! before anything is sent, so a line that is not JSON stops the map with its line number and
//! nothing run. The events go out in requests of at most [`MAX_ITEMS`](items::MAX_ITEMS)
//! items and about [`MAX_BYTES`](items::MAX_BYTES) bytes (smaller ones when that makes about
//! four for each request in flight), `--concurrency` of them in flight (one thread each); each
//! request the worker spreads over the lambda's sandboxes. One line per outcome goes to stdout, in the
//! items' order (`--unordered`: a request's outcomes as soon as it is answered): the result's
//! JSON, or the error object (`{"error": <code>, "message": ..., "traceback": ...}`). A
//! progress line (items done of the total, the rate) is drawn on stderr when it is a terminal.
//!
//! Exit status: 0 when every item succeeded, 1 when one or more failed (their error objects
//! are printed in their places), 2 when the map could not be done: the file could not be read
//! or a line is not JSON (nothing sent), or a request failed as a whole (an unknown lambda, a
//! refused body, a worker that could not be reached after the retries). A request that could
//! not be delivered (connection refused or reset, 502, 503, 429) is sent again, up to
//! [`RETRIES`](run::RETRIES) times.

mod items;
mod outcomes;
mod progress;
mod run;

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use items::parse_items;
use progress::{summary_line, Progress};
use run::{run, Options, Stopped};

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

#[cfg(test)]
mod tests;
