//! A fleet run, end to end: start the agents (`sprout load fleet-agent`, each its spec as
//! JSON on stdin and its result as JSON on stdout) pinned to their CPUs with one start time,
//! sample the system under test meanwhile, merge the agents' measurements exactly, judge
//! every site, and write fleet-run.json.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::control::{addr_of, now_ms};
use crate::drivers::olio::Olio;
use crate::fleet::Fleet;
use crate::fleet_agent::{self, FleetPlan, SitePlan};
use crate::fleet_report::{self, FleetReport, RunContext};
use crate::fleet_stats::{merge, FleetAgentResult};
use crate::utilization::{Sampler, SutProcesses};
use crate::workload::Workload;

/// Everything a fleet agent needs; the controller fills `agent`, `cpu` and `start_at_unix_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetAgentSpec {
    pub fleet: PathBuf,
    pub workload: PathBuf,
    /// The one address every site is served on: http://host:port
    pub url: String,
    pub interval_s: f64,
    pub timeout_s: f64,
    pub idle_gap_s: f64,
    pub seed: u64,
    pub agents: u32,
    pub agent: u32,
    /// CPU the agent pins itself to (None: wherever the scheduler puts it).
    pub cpu: Option<usize>,
    pub start_at_unix_ms: u64,
    pub progress: bool,
}

fn seconds(s: f64, what: &str) -> Result<Duration> {
    if !(s.is_finite() && s > 0.0) {
        bail!("{what} must be a positive number of seconds, not {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

/// The workload a fleet runs: Olio's (its sites are Olio sites).
fn fleet_workload(path: &std::path::Path) -> Result<Workload> {
    let workload = Workload::load(path)?;
    if workload.driver != "olio" {
        bail!("{}: a fleet drives Olio sites, but this workload's driver is {:?}", path.display(), workload.driver);
    }
    Ok(workload)
}

/// Run one fleet agent (in this process): its sites, from the common start to the span's end.
pub fn run_fleet_agent(spec: &FleetAgentSpec) -> Result<FleetAgentResult> {
    if let Some(cpu) = spec.cpu {
        sprout_runtime::pin_to(cpu).with_context(|| format!("pinning the fleet agent to CPU {cpu}"))?;
    }
    let fleet = Fleet::load(&spec.fleet)?;
    let workload = fleet_workload(&spec.workload)?;
    let plan = FleetPlan {
        span: seconds(fleet.span_s, "the span")?,
        interval: seconds(spec.interval_s, "the interval")?,
        idle_gap: seconds(spec.idle_gap_s, "the idle gap")?,
        seed: spec.seed,
        agent: spec.agent,
        progress: spec.progress,
    };
    let timeout = seconds(spec.timeout_s, "the timeout")?;
    let olio = Olio::new(&workload, addr_of(&spec.url)?, fleet.registered_users, timeout)?;
    let sites = fleet
        .sites_of(spec.agent, spec.agents)
        .map(|(index, site)| {
            Ok(SitePlan {
                index,
                host: site.host.clone(),
                steps: site.steps(fleet.span_s),
                driver: olio.for_site(&site.host, site.registered_users)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::sleep(Duration::from_millis(spec.start_at_unix_ms.saturating_sub(now_ms())));
    rt.block_on(fleet_agent::run(sites, workload, plan))
}

/// `sprout load fleet-agent`: read a spec from stdin, run, write the result to stdout.
pub fn fleet_agent_main() -> Result<()> {
    crate::control::agent_io("the fleet agent's spec (JSON on stdin)", run_fleet_agent)
}

#[derive(Debug, Clone)]
pub struct FleetRunOptions {
    /// The one address every site is served on: http://127.0.0.1:PORT
    pub url: String,
    /// The fleet file (sites, hosts, profiles, span).
    pub fleet: PathBuf,
    pub workload: PathBuf,
    /// Where fleet-run.json goes.
    pub out: PathBuf,
    pub interval_s: f64,
    /// A request with no complete answer in this many seconds fails ("timeout").
    pub timeout_s: f64,
    /// Seconds without an operation after which a site is idle.
    pub idle_gap_s: f64,
    pub agents: u32,
    /// CPUs the agents are pinned to (round-robin).
    pub agent_cpus: Vec<usize>,
    /// CPUs of the system under test, whose busy time is its CPU use.
    pub sut_cpus: Vec<usize>,
    /// A cgroup listing the deployment's processes (for their memory).
    pub sut_cgroup: Option<PathBuf>,
    /// Which deployment this is, for the report.
    pub stack: String,
    /// The sessions' seed (None: the fleet file's).
    pub seed: Option<u64>,
    /// Prices for the resources the run used (None: not priced).
    pub pricing: Option<PathBuf>,
    /// Instances the deployment is provisioned as (for the always-on cost beside).
    pub instances: f64,
    /// What the report says the machine is.
    pub machine: String,
    /// The `sprout` binary (agents are `sprout load fleet-agent` processes).
    pub exe: PathBuf,
}

/// Run the fleet: agents, sampling, merge, judgement; writes OUT/fleet-run.json.
pub fn run_fleet(opts: &FleetRunOptions) -> Result<FleetReport> {
    let fleet = Fleet::load(&opts.fleet)?;
    let workload = fleet_workload(&opts.workload)?;
    addr_of(&opts.url)?;
    if opts.agents == 0 {
        bail!("a fleet run needs at least one agent");
    }
    // Agents read the same files, wherever they start.
    let absolute = |p: &PathBuf| std::path::absolute(p).with_context(|| format!("{}", p.display()));
    let spec = FleetAgentSpec {
        fleet: absolute(&opts.fleet)?,
        workload: absolute(&opts.workload)?,
        url: opts.url.clone(),
        interval_s: opts.interval_s,
        timeout_s: opts.timeout_s,
        idle_gap_s: opts.idle_gap_s,
        seed: opts.seed.unwrap_or(fleet.seed),
        agents: opts.agents,
        agent: 0,
        cpu: None,
        start_at_unix_ms: 0,
        progress: true,
    };
    seconds(spec.interval_s, "the interval")?;
    seconds(spec.idle_gap_s, "the idle gap")?;
    seconds(spec.timeout_s, "the timeout")?;
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let busy = fleet.sites.iter().filter(|s| s.busy(fleet.span_s)).count();
    eprintln!(
        "==> {} fleet against {}: {} sites ({} with users in the span), {} s, {} agents on CPUs {:?}; system under test on CPUs {:?}",
        workload.name,
        opts.url,
        fleet.sites.len(),
        busy,
        fleet.span_s,
        opts.agents,
        opts.agent_cpus,
        opts.sut_cpus
    );
    let sampler = Sampler::start(Duration::from_secs(1), opts.sut_cgroup.clone().map(SutProcesses), opts.agent_cpus.first().copied());
    let results = run_agents(opts, &spec);
    let (samples, _) = sampler.stop();
    let merged = merge(fleet.sites.len(), results?)?;
    let ctx = RunContext {
        stack: opts.stack.clone(),
        url: opts.url.clone(),
        machine: opts.machine.clone(),
        seed: spec.seed,
        agents: opts.agents,
        interval_s: opts.interval_s,
        idle_gap_s: opts.idle_gap_s,
        sut_cpus: opts.sut_cpus.clone(),
    };
    let mut report = fleet_report::build(&workload, &fleet, &merged, &ctx, samples)?;
    report.resources = resources(&report, opts)?;
    let path = opts.out.join("fleet-run.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&report)?).with_context(|| format!("writing {}", path.display()))?;
    Ok(report)
}

/// Start the agents (`exe load fleet-agent`), each pinned to `agent_cpus[i % len]`, all
/// starting two seconds from now, and collect their results.
fn run_agents(opts: &FleetRunOptions, spec: &FleetAgentSpec) -> Result<Vec<FleetAgentResult>> {
    let start_at = now_ms() + 2000;
    let mut children = Vec::new();
    for agent in 0..opts.agents {
        let mut s = spec.clone();
        s.agent = agent;
        s.start_at_unix_ms = start_at;
        s.cpu = (!opts.agent_cpus.is_empty()).then(|| opts.agent_cpus[agent as usize % opts.agent_cpus.len()]);
        let mut child = Command::new(&opts.exe)
            .args(["load", "fleet-agent"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting fleet agent {agent} ({})", opts.exe.display()))?;
        child.stdin.take().expect("piped").write_all(serde_json::to_string(&s)?.as_bytes())?;
        children.push(child);
    }
    let results: Vec<FleetAgentResult> = crate::control::collect_agents(children, "fleet agent")?;
    Ok(results)
}

/// CPU-seconds on the system under test's CPUs, its memory (GB-seconds, peak and mean PSS),
/// and what they cost per price.
fn resources(report: &FleetReport, opts: &FleetRunOptions) -> Result<serde_json::Value> {
    let samples = &report.utilization;
    let (cpu_seconds, gb_seconds) = crate::utilization::integrate(samples, &report.sut_cpus);
    let seconds = samples.last().map(|s| s.t).unwrap_or(0.0);
    let pss: Vec<u64> = samples.iter().filter_map(|s| s.sut_pss_bytes).collect();
    let peak_pss = (!pss.is_empty() && pss.len() == samples.len()).then(|| pss.iter().copied().max().unwrap_or(0));
    // Time-weighted: the GB-seconds over the seconds sampled.
    let mean_pss = gb_seconds.filter(|_| seconds > 0.0).map(|gb| gb * 1e9 / seconds);
    let costs = match &opts.pricing {
        Some(path) => crate::cost::priced(path, opts.instances, seconds, cpu_seconds, gb_seconds)?,
        None => serde_json::Map::new(),
    };
    Ok(serde_json::json!({
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "gb_seconds": gb_seconds,
        "peak_pss_bytes": peak_pss,
        "mean_pss_bytes": mean_pss,
        "instances": opts.instances,
        "costs": costs,
    }))
}
