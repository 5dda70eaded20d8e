//! `sprout bench neighbours`: how much noisy neighbours slow another lambda's warm invocations on one worker.
//!
//! One real worker (the `sock` back-end, its default configuration but for four sandboxes a
//! lambda and a timeout the neighbours' calls fit in), pinned with its sandboxes to one CPU;
//! every client runs on another, each on its own keep-alive HTTP connection. A victim lambda
//! (`def f(event): return event`) is called in a closed loop by one client, first alone, then
//! beside three closed-loop clients of one neighbour at a time:
//!
//! * `printer`: 20 MB to stdout per call (100-byte lines, written 1 MB at a time), as fast as
//!   it goes — the reproduction, where the worker's shared log path made the victim
//!   55× slower;
//! * `printer-paced`: 100 MB/s across its three callers (each call ~33 MB/s for ~1 s, 1 MB at
//!   a time, sleeping to keep the pace);
//! * `spinner`: a busy loop for 1 s of CPU per call;
//! * `churner`: allocates a 100 MiB bytearray, touches every page and frees it, per call;
//! * `tenant-flood`: another tenant's lambda spending 2 ms of CPU a call, its callers paced
//!   at 10x the tenant's quota of 50 invocations a second (issue 52: the refusals' cost and
//!   what the quota admits, run idle on the CPU while the tenant is at its quota);
//!
//! then alone again (the drift over the run), and last a victim that prints one line per call
//! against the silent one in alternating rounds. Only warm answers of the victim count
//! (`X-Sprout-Start: warm`); per phase the victim's percentiles and their ratio to the first
//! `alone`, the neighbour's calls, and for the printers the output rate they reached, the bytes
//! their logs hold under `DIR/logs/<lambda>/` (sampled through the phase and after it) and
//! `sprout_log_dropped_lines_total` from `/metrics`. Results: neighbours.json, .md and .png.

mod clients;
mod format;
mod measure;
mod metrics;
mod results;
mod setup;

use anyhow::Result;
use serde_json::Value;

use crate::report;
use crate::sandbox_worker::Options;
use crate::worker::BenchWorker;
use measure::measure;
use results::summarize;
pub use results::{markdown, summary};
use setup::{worker_config, Plan};
pub use setup::{CALLERS, NEIGHBOURS};

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
