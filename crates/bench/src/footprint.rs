//! What a back-end's sandboxes cost beside its cold and warm paths, in `sprout bench
//! sandboxes`: a new lambda's first cold start (for gVisor, its pod's start as well) and the
//! memory an idle lambda holds, as PSS of every process in the worker's cgroups (sandboxes,
//! Zygotes, spares, gVisor's Sentry and gofer), read from the host.

use std::time::Duration;

use anyhow::{bail, Result};

use crate::http::Client;
use crate::sandbox_worker::{Options, Worker};

/// Fresh lambdas whose first requests are timed, per back-end.
pub(crate) const FIRST_LAMBDAS: usize = 8;

/// Deploy [`FIRST_LAMBDAS`] no-op lambdas, each new to the worker, and time each one's first
/// request (milliseconds, in order).
pub(crate) async fn first_cold_starts(opts: &Options, worker: &Worker) -> Result<Vec<f64>> {
    let dir = opts.work_dir.join("first-noop");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("f.py"), "def f(event):\n    return None\n")?;
    let mut client = Client::connect(worker.port).await?;
    let mut times = Vec::new();
    for i in 0..FIRST_LAMBDAS {
        let name = format!("first{i}");
        worker.deploy(opts, &dir, &name)?;
        let answer = client.post(&format!("/run/{name}"), b"null").await?;
        if !answer.ok() || answer.start != "cold" {
            bail!("{name}'s first request was not a successful cold start ({}, {})", answer.status, answer.start);
        }
        times.push(answer.elapsed.as_secs_f64() * 1000.0);
    }
    Ok(times)
}

/// PSS in bytes of every process in `worker`'s cgroups (the memory hierarchy's on cgroup v1,
/// the unified one's on v2), the worker's own process aside, each address space once.
pub(crate) fn worker_pss(worker: &Worker) -> u64 {
    let prefix = format!("sprout-{}", worker.name);
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    let mut pids = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if pid == worker.pid() {
            continue;
        }
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let ours = cgroups.lines().any(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            (controllers == "memory" || controllers.is_empty()) && path.split('/').any(|c| c.starts_with(&prefix))
        });
        if ours {
            pids.push(pid as i32);
        }
    }
    sprout_sandbox::memory::pss_of_pids(&pids)
}

/// How long a worker is left still before it is weighed: what it does after a burst (a gVisor
/// pod lets its spares go after `[gvisor] spares_idle_ms`, 2 s by default) is done by then.
pub(crate) const SETTLE: Duration = Duration::from_secs(4);

/// Idle lambdas whose memory is weighed together: what one more costs in a worker holding
/// several (pages of the runtime's own binaries are shared by all of them, as on a real host).
pub(crate) const IDLE_LAMBDAS: usize = 4;

/// What an idle no-op lambda (one sandbox, kept warm) adds to the worker's PSS, in MiB: the
/// worker weighed before [`IDLE_LAMBDAS`] lambdas' first requests and after them (each once
/// it has been still for a moment), the difference shared among them.
pub(crate) async fn idle_pss_mib(opts: &Options, worker: &Worker) -> Result<f64> {
    let dir = opts.work_dir.join("idle-noop");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("f.py"), "def f(event):\n    return None\n")?;
    for i in 0..IDLE_LAMBDAS {
        worker.deploy(opts, &dir, &format!("idle{i}"))?;
    }
    tokio::time::sleep(SETTLE).await;
    let before = worker_pss(worker);
    let mut client = Client::connect(worker.port).await?;
    for i in 0..IDLE_LAMBDAS {
        let answer = client.post(&format!("/run/idle{i}"), b"null").await?;
        if !answer.ok() {
            bail!("idle{i} failed ({})", answer.status);
        }
    }
    tokio::time::sleep(SETTLE).await;
    let after = worker_pss(worker);
    Ok(after.saturating_sub(before) as f64 / IDLE_LAMBDAS as f64 / (1 << 20) as f64)
}
