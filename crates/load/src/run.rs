//! One measured run, end to end: sample the system under test, run the agents, merge, judge,
//! and write the run's JSON and HTML report into its directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::control::{self, Spec};
use crate::report::{self, RunReport};
use crate::utilization::{Sampler, SutProcesses};
use crate::workload::Workload;

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub spec: Spec,
    /// Which deployment this is, for the report ("sprout", "conventional", ...).
    pub stack: String,
    /// CPUs the agents are pinned to (round-robin).
    pub agent_cpus: Vec<usize>,
    /// CPUs of the system under test, whose busy time is its CPU use.
    pub sut_cpus: Vec<usize>,
    /// A cgroup listing the deployment's processes (for their memory).
    pub sut_cgroup: Option<PathBuf>,
    /// Where the run's files go: run.json, report.html and its plots.
    pub out: PathBuf,
    /// The `sprout` binary (agents are `sprout load agent` processes).
    pub exe: PathBuf,
    /// The repository (for bench/cloudstone_report.py).
    pub repo: PathBuf,
    /// Prices for the resources the run used (None: not priced).
    pub pricing: Option<PathBuf>,
    /// Instances the deployment is provisioned as (for the always-on cost beside).
    pub instances: f64,
    /// What the report says the machine is.
    pub machine: String,
    /// The Olio deployment's state directory (`sprout olio up --dir`), whose interpreter the
    /// report records.
    pub deployment: Option<PathBuf>,
}

pub fn run(opts: &RunOptions) -> Result<RunReport> {
    let workload = Workload::load(&opts.spec.workload)?;
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let plan = opts.spec.plan()?;
    let peak = plan.profile.as_ref().map(|p| p.peak()).unwrap_or(opts.spec.users);
    eprintln!(
        "==> {} against {}: {} users ({} agents on CPUs {:?}), ramp-up {} s, steady {} s, ramp-down {} s; system under test on CPUs {:?}",
        workload.name,
        opts.spec.url,
        peak,
        opts.spec.agents,
        opts.agent_cpus,
        opts.spec.ramp_up_s,
        opts.spec.steady_s,
        opts.spec.ramp_down_s,
        opts.sut_cpus
    );
    let sampler = Sampler::start(Duration::from_secs(1), opts.sut_cgroup.clone().map(SutProcesses), opts.agent_cpus.first().copied());
    let merged = control::run_agents(&opts.exe, &opts.spec, &opts.agent_cpus);
    let (samples, cpu_by_process) = sampler.stop();
    let merged = merged?;
    let mut report = report::build(&workload, &opts.spec, &opts.stack, &merged, samples, opts.sut_cpus.clone(), opts.machine.clone(), peak);
    report.resources = resources(&report, opts, cpu_by_process)?;
    if let Some(dir) = &opts.deployment {
        report.interpreter = deployment_interpreter(&opts.exe, dir);
    }
    let json_path = opts.out.join("run.json");
    std::fs::write(&json_path, serde_json::to_vec_pretty(&report)?)?;
    render_html(&opts.repo, &json_path)?;
    Ok(report)
}

/// CPU-seconds on the system under test's CPUs (and by its kinds of process) and its memory
/// GB-seconds over the run, priced per second (what was used) and as always-on instances (provisioned for the peak).
fn resources(report: &RunReport, opts: &RunOptions, cpu_by_process: std::collections::BTreeMap<String, f64>) -> Result<serde_json::Value> {
    let (cpu_seconds, gb_seconds) = crate::utilization::integrate(&report.utilization, &report.sut_cpus);
    let seconds = report.utilization.last().map(|s| s.t).unwrap_or(0.0);
    let costs = match &opts.pricing {
        Some(path) => crate::cost::priced(path, opts.instances, seconds, cpu_seconds, gb_seconds)?,
        None => serde_json::Map::new(),
    };
    Ok(
        serde_json::json!({"seconds": seconds, "cpu_seconds": cpu_seconds, "gb_seconds": gb_seconds, "instances": opts.instances, "costs": costs, "cpu_seconds_by_process": cpu_by_process}),
    )
}

/// `sprout olio status`'s `interpreter` for the deployment in `dir` (what its Python processes
/// run, read while they still run), or {"error": ...}.
pub fn deployment_interpreter(exe: &Path, dir: &Path) -> serde_json::Value {
    let status = match Command::new(exe).args(["olio", "status", "--dir"]).arg(dir).output() {
        Ok(out) => serde_json::from_slice::<serde_json::Value>(&out.stdout).map_err(|e| format!("sprout olio status: {e}")),
        Err(e) => Err(format!("running sprout olio status: {e}")),
    };
    match status {
        Ok(status) if !status["interpreter"].is_null() => status["interpreter"].clone(),
        Ok(_) => serde_json::json!({"error": format!("{} is not running", dir.display())}),
        Err(e) => serde_json::json!({ "error": e }),
    }
}

/// bench/cloudstone_report.py draws the plots and writes report.html beside the JSON.
pub fn render_html(repo: &Path, json: &Path) -> Result<()> {
    let script = repo.join("bench/cloudstone_report.py");
    let status = Command::new("python3").arg(&script).arg(json).status().with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(status.success(), "{} failed ({status})", script.display());
    Ok(())
}
