//! Agents and their controller. An agent is one process driving its share of the users
//! (`sprout load agent`, its spec as JSON on stdin, its result as JSON on stdout); the
//! controller starts the agents (here, or anywhere a command can start them), gives them one
//! start time, waits, and merges their histograms exactly.

use std::io::{Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::drivers::http::Http;
use crate::drivers::olio::Olio;
use crate::engine::{self, AgentResult, Plan};
use crate::profile::Profile;
use crate::stats::Windows;
use crate::workload::Workload;

/// Everything an agent needs; the controller fills `agent` and `start_at_unix_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    pub workload: PathBuf,
    /// The site: http://host:port
    pub url: String,
    /// Accounts in the loaded database (the driver logs in as them).
    pub registered_users: u64,
    /// Concurrent users in all (when there is no profile).
    pub users: usize,
    pub profile: Option<PathBuf>,
    pub ramp_up_s: f64,
    pub steady_s: f64,
    pub ramp_down_s: f64,
    pub window_s: f64,
    pub interval_s: f64,
    pub start_delay_ms: f64,
    pub timeout_s: f64,
    pub seed: u64,
    pub agents: u32,
    pub agent: u32,
    /// CPU the agent pins itself to (None: wherever the scheduler puts it).
    pub cpu: Option<usize>,
    pub start_at_unix_ms: u64,
    pub progress: bool,
}

impl Spec {
    pub fn plan(&self) -> Result<Plan> {
        let secs = |s: f64, what: &str| -> Result<Duration> {
            if !(s.is_finite() && s >= 0.0) {
                bail!("{what} must be a non-negative number of seconds, not {s}");
            }
            Ok(Duration::from_secs_f64(s))
        };
        let window = secs(self.window_s, "the window")?;
        let interval = secs(self.interval_s, "the interval")?;
        if window.is_zero() || interval.is_zero() {
            bail!("the SLA window and the interval must be longer than zero");
        }
        Ok(Plan {
            users: self.users,
            ramp_up: secs(self.ramp_up_s, "the ramp-up")?,
            steady: secs(self.steady_s, "the steady state")?,
            ramp_down: secs(self.ramp_down_s, "the ramp-down")?,
            window,
            interval,
            start_delay: Duration::from_secs_f64(self.start_delay_ms.max(0.0) / 1000.0),
            profile: self.profile.as_deref().map(Profile::load).transpose()?,
            seed: self.seed,
            agent: self.agent,
            agents: self.agents.max(1),
            progress: self.progress,
        })
    }

    pub fn addr(&self) -> Result<SocketAddr> {
        addr_of(&self.url)
    }
}

/// The address an http:// URL names (port 80 unless it says another).
pub fn addr_of(url: &str) -> Result<SocketAddr> {
    let rest = url.strip_prefix("http://").with_context(|| format!("{url:?}: the site must be an http:// URL"))?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let hostport = if hostport.contains(':') { hostport.to_string() } else { format!("{hostport}:80") };
    hostport
        .to_socket_addrs()
        .with_context(|| format!("resolving {hostport}"))?
        .next()
        .with_context(|| format!("{hostport} has no address"))
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// Run one agent to the end of its plan (in this process).
pub fn run_agent(spec: &Spec) -> Result<AgentResult> {
    if let Some(cpu) = spec.cpu {
        sprout_runtime::pin_to(cpu).with_context(|| format!("pinning the agent to CPU {cpu}"))?;
    }
    let workload = Workload::load(&spec.workload)?;
    let plan = spec.plan()?;
    let addr = spec.addr()?;
    let timeout = Duration::from_secs_f64(spec.timeout_s.max(0.1));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let start = || std::thread::sleep(Duration::from_millis(spec.start_at_unix_ms.saturating_sub(now_ms())));
    match workload.driver.as_str() {
        "olio" => {
            let driver = Olio::new(&workload, addr, spec.registered_users, timeout)?;
            start();
            rt.block_on(engine::run(driver, workload, plan))
        }
        "http" => {
            let driver = Http::new(&workload, addr, timeout)?;
            start();
            rt.block_on(engine::run(driver, workload, plan))
        }
        other => bail!("no driver named {other:?} (built in: olio, http)"),
    }
}

/// `sprout load agent`: read a spec from stdin, run, write the result to stdout.
pub fn agent_main() -> Result<()> {
    agent_io("the agent's spec (JSON on stdin)", run_agent)
}

/// An agent process's life: its spec (`what`) as JSON from stdin, `run` on it, the result as
/// one line of JSON on stdout.
pub fn agent_io<S: serde::de::DeserializeOwned, R: serde::Serialize>(what: &str, run: impl FnOnce(&S) -> Result<R>) -> Result<()> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let spec: S = serde_json::from_str(&input).context(what.to_string())?;
    let result = run(&spec)?;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &result)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// The merged measurements of all agents.
#[derive(Debug, Clone)]
pub struct Merged {
    pub steady: Windows,
    pub series: Windows,
    pub cycles: u64,
    pub cycle_ms_sum: f64,
    pub counters: std::collections::BTreeMap<String, u64>,
    pub active_users: Vec<(f64, usize)>,
}

pub fn merge(results: &[AgentResult]) -> Result<Merged> {
    let mut merged: Option<Merged> = None;
    for r in results {
        let steady = Windows::from_wire(r.steady.as_ref().context("an agent sent no steady-state windows")?)?;
        let series = Windows::from_wire(r.series.as_ref().context("an agent sent no series")?)?;
        match &mut merged {
            None => {
                merged = Some(Merged {
                    steady,
                    series,
                    cycles: r.cycles,
                    cycle_ms_sum: r.cycle_ms_sum,
                    counters: r.counters.clone(),
                    active_users: r.active_users.clone(),
                })
            }
            Some(m) => {
                m.steady.merge(&steady);
                m.series.merge(&series);
                m.cycles += r.cycles;
                m.cycle_ms_sum += r.cycle_ms_sum;
                for (k, v) in &r.counters {
                    *m.counters.entry(k.clone()).or_default() += v;
                }
                // Agents report at the same intervals: add users position by position.
                for (i, (t, u)) in r.active_users.iter().enumerate() {
                    match m.active_users.get_mut(i) {
                        Some(p) => p.1 += u,
                        None => m.active_users.push((*t, *u)),
                    }
                }
            }
        }
    }
    merged.context("no agent results")
}

/// Start `spec.agents` agent processes (`exe load agent`), each pinned to `cpus[i % len]`,
/// all starting two seconds from now, and merge what they measured.
pub fn run_agents(exe: &std::path::Path, spec: &Spec, cpus: &[usize]) -> Result<Merged> {
    let start_at = now_ms() + 2000;
    let mut children = Vec::new();
    for agent in 0..spec.agents.max(1) {
        let mut s = spec.clone();
        s.agent = agent;
        s.start_at_unix_ms = start_at;
        s.cpu = (!cpus.is_empty()).then(|| cpus[agent as usize % cpus.len()]);
        let mut child = Command::new(exe)
            .args(["load", "agent"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting agent {agent} ({})", exe.display()))?;
        child.stdin.take().expect("piped").write_all(serde_json::to_string(&s)?.as_bytes())?;
        children.push(child);
    }
    let results: Vec<AgentResult> = collect_agents(children, "agent")?;
    merge(&results)
}

/// Wait for every agent process and read its result from its stdout; every agent that failed
/// or sent no result is named in one error.
pub fn collect_agents<T: serde::de::DeserializeOwned>(children: Vec<std::process::Child>, what: &str) -> Result<Vec<T>> {
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            failures.push(format!("{what} {i} failed ({})", out.status));
            continue;
        }
        match serde_json::from_slice::<T>(&out.stdout) {
            Ok(r) => results.push(r),
            Err(e) => failures.push(format!("{what} {i} sent no result: {e}")),
        }
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(results)
}
