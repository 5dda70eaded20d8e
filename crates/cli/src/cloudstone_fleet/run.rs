//! One run of the search: deploy a fleet of a stack with `sprout olio fleet-up`, drive every
//! site, judge the run ([`FleetStep`]), and take the fleet down.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::args::FleetArgs;
use super::fleet_file::describe;

/// One deployment of one fleet, run and judged.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetStep {
    pub sites: usize,
    pub passed: bool,
    /// Why it failed (empty when it passed).
    pub reason: String,
    pub sla1: Option<bool>,
    pub sla2: Option<bool>,
    pub sites_failing_sla2: usize,
    pub first_after_idle: Option<serde_json::Value>,
    /// The 99th percentile of every site's first request after an idle spell, at the load
    /// generator (for sprout-gvisor, whose pods park before the spell ends, a restore or, where
    /// the site's sandboxes were let go, a new pod from its template).
    #[serde(default)]
    pub first_after_idle_p99_ms: Option<f64>,
    /// What the worker's gVisor parking had done by the run's end (its `/stats`; None for
    /// other stacks).
    #[serde(default)]
    pub parking: Option<serde_json::Value>,
    pub requests: u64,
    pub errors: u64,
    /// PSS of every process of the deployment, MiB: right after start-up, and the run's peak and mean.
    pub resident_mb: f64,
    pub peak_mb: Option<f64>,
    pub mean_mb: Option<f64>,
    pub cpu_seconds: Option<f64>,
    /// At rest after the run: the deployment's PSS, MiB, and what its sites hold (fleet-status's
    /// `memory.sites`: the processes serving one site and the database connections, with
    /// their median PSS and private memory).
    #[serde(default)]
    pub rest_mb: Option<f64>,
    #[serde(default)]
    pub sites_at_rest: Option<serde_json::Value>,
    /// Processes the deployment's memory limit killed during the run.
    #[serde(default)]
    pub oom_kills: u64,
    pub setup_s: f64,
    /// The run's fleet-run.json, relative to the summary's `runs_dir`.
    pub run: Option<String>,
}

/// What `sprout olio fleet-up` prints.
#[derive(Debug, Deserialize)]
struct Deployed {
    url: String,
    cgroup: Option<String>,
    /// The memory group whose limit is the budget (the conventional stack's; None where the
    /// budget is kept by the worker).
    memory_cgroup: Option<String>,
    setup_s: Option<f64>,
}

/// Deploy `sites` sites of `stack`, drive and judge them, and take them down: the run's step,
/// and how its teardown went.
pub(super) fn one_run(a: &FleetArgs, exe: &Path, stack: &str, sites: usize) -> Result<(FleetStep, Result<()>)> {
    let dir = a.out.join(stack).join(format!("{sites:04}"));
    let state = a.state.join(stack);
    olio(exe, &["fleet-down", "--dir"], &state).ok();
    for old in [&dir, &state] {
        if old.exists() {
            std::fs::remove_dir_all(old).with_context(|| format!("clearing {}", old.display()))?;
        }
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::create_dir_all(&a.state)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&a.state, std::fs::Permissions::from_mode(0o755))?; // PostgreSQL's and nginx's users enter it
    let file = a.fleet_of(sites)?;
    eprintln!("    {}", describe(&file));
    let fleet_path = dir.join("fleet.json");
    std::fs::write(&fleet_path, serde_json::to_vec_pretty(&file)?)?;
    let began = Instant::now();
    let mut up = Command::new(exe)
        .args(["olio", "fleet-up", "--stack", stack, "--cpus", &a.cpus, "--port", &a.port.to_string()])
        .arg("--memory-mb")
        .arg(a.memory_mb.to_string())
        .arg("--fleet")
        .arg(&fleet_path)
        .arg("--dir")
        .arg(&state)
        .args(stack_flags(a, stack))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running sprout olio fleet-up")?;
    // Its progress is shown as it comes; its last lines say why, if it fails.
    let stderr = up.stderr.take().context("fleet-up's stderr")?;
    let relay = std::thread::spawn(move || {
        let mut last: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            eprintln!("{line}");
            if last.len() == 3 {
                last.pop_front();
            }
            last.push_back(line);
        }
        Vec::from(last).join(" / ")
    });
    let up = up.wait_with_output().context("waiting for sprout olio fleet-up")?;
    let last_lines = relay.join().unwrap_or_default();
    let mut step = FleetStep {
        sites,
        passed: false,
        reason: String::new(),
        sla1: None,
        sla2: None,
        sites_failing_sla2: 0,
        first_after_idle: None,
        first_after_idle_p99_ms: None,
        parking: None,
        requests: 0,
        errors: 0,
        resident_mb: 0.0,
        peak_mb: None,
        mean_mb: None,
        cpu_seconds: None,
        rest_mb: None,
        sites_at_rest: None,
        oom_kills: 0,
        setup_s: began.elapsed().as_secs_f64(),
        run: None,
    };
    if !up.status.success() {
        olio(exe, &["fleet-down", "--dir"], &state).ok();
        step.reason = format!("the deployment did not start ({}): {last_lines}", up.status);
        return Ok((step, Ok(())));
    }
    let deployed: Deployed = serde_json::from_slice(up.stdout.trim_ascii())
        .with_context(|| format!("sprout olio fleet-up printed {:?}", String::from_utf8_lossy(&up.stdout)))?;
    step.setup_s = deployed.setup_s.unwrap_or(step.setup_s);
    let cgroup = deployed.cgroup.map(PathBuf::from);
    step.resident_mb = cgroup.as_deref().map(sprout_load::pss_of_cgroup).unwrap_or(0) as f64 / 1048576.0;
    let budget = a.memory_mb as f64;
    if step.resident_mb > budget {
        let teardown = olio(exe, &["fleet-down", "--dir"], &state).map(|_| ());
        step.reason = format!("{:.0} MiB resident before any load, over the {budget:.0} MiB budget", step.resident_mb);
        return Ok((step, teardown));
    }
    let memory_group = deployed.memory_cgroup.map(PathBuf::from);
    let kills_before = memory_group.as_deref().map(oom_kills).unwrap_or(0);
    let run = run_load(a, exe, stack, &deployed.url, &fleet_path, cgroup, &dir);
    step.oom_kills = memory_group.as_deref().map(oom_kills).unwrap_or(0).saturating_sub(kills_before);
    if let Some(status) = at_rest(exe, &state) {
        let memory = &status["memory"];
        step.rest_mb = memory["pss_mb"].as_f64();
        step.sites_at_rest = Some(memory["sites"].clone()).filter(|s| !s.is_null());
        step.parking = Some(status["worker"]["parking"].clone()).filter(|p| p.is_object());
    }
    let down = olio(exe, &["fleet-down", "--dir"], &state);
    keep_logs(&state, &a.state.join("logs").join(stack).join(format!("{sites:04}")));
    let report = run?;
    judge(&mut step, &report, budget);
    step.run = Some(format!("{stack}/{sites:04}/fleet-run.json"));
    // The run is judged and kept even when the teardown fails (the search stops after it).
    let teardown = down.map(|_| ()).and_then(|()| {
        // A thousand sites' databases take 15 GB: each run's go when it is done.
        std::fs::remove_dir_all(&state).with_context(|| format!("removing {}", state.display()))
    });
    Ok((step, teardown))
}

/// Keep the run's logs (the worker's, the deployment's `logs/`) in `keep`, outside the
/// repository, before the state goes: where a slow request went is read there afterwards.
/// A log that cannot be kept is said and skipped; the run goes on.
fn keep_logs(state: &Path, keep: &Path) {
    let copy = |from: &Path, to: &Path| -> std::io::Result<()> {
        std::fs::create_dir_all(to.parent().unwrap_or(to))?;
        std::fs::copy(from, to).map(|_| ())
    };
    let mut logs = vec![(state.join("worker").join("worker.log"), keep.join("worker.log"))];
    if let Ok(entries) = std::fs::read_dir(state.join("logs")) {
        logs.extend(entries.flatten().filter(|e| e.path().is_file()).map(|e| (e.path(), keep.join(e.file_name()))));
    }
    for (from, to) in logs.iter().filter(|(from, _)| from.is_file()) {
        if let Err(e) = copy(from, to) {
            eprintln!("keeping {}: {e}", from.display());
        }
    }
}

/// fleet-up's flags of the stack's own settings (conventional-ondemand's vassals), as given.
fn stack_flags(a: &FleetArgs, stack: &str) -> Vec<String> {
    let mut flags = Vec::new();
    if stack == "conventional-ondemand" {
        if let Some(idle) = a.vassal_idle {
            flags.extend(["--vassal-idle".to_string(), idle.to_string()]);
        }
        if let Some(processes) = &a.vassal_processes {
            flags.extend(["--vassal-processes".to_string(), processes.clone()]);
        }
    }
    flags
}

/// Pass: every site within SLA-2, every first request after an idle spell within its
/// operation's limit, and the deployment's memory within the budget throughout (its PSS, and
/// no process killed at the memory limit where the budget is one).
fn judge(step: &mut FleetStep, report: &serde_json::Value, budget_mb: f64) {
    let mb = |v: &serde_json::Value| v.as_f64().map(|b| b / 1048576.0);
    step.sla1 = report["passed_sla1"].as_bool();
    step.sla2 = report["passed_sla2"].as_bool();
    step.sites_failing_sla2 = report["sites_failing_sla2"].as_array().map(Vec::len).unwrap_or(0);
    step.first_after_idle = Some(report["first_after_idle"].clone());
    step.first_after_idle_p99_ms = first_after_idle_p99(report);
    step.requests = report["requests"].as_u64().unwrap_or(0);
    step.errors = report["errors"].as_u64().unwrap_or(0);
    step.peak_mb = mb(&report["resources"]["peak_pss_bytes"]);
    step.mean_mb = mb(&report["resources"]["mean_pss_bytes"]);
    step.cpu_seconds = report["resources"]["cpu_seconds"].as_f64();
    let idle = &report["first_after_idle"];
    let late = idle["count"].as_u64().unwrap_or(0).saturating_sub(idle["within_limit"].as_u64().unwrap_or(0));
    let mut reasons = Vec::new();
    if step.sla2 != Some(true) {
        let hosts: Vec<&str> = report["sites_failing_sla2"].as_array().into_iter().flatten().filter_map(|h| h.as_str()).take(3).collect();
        reasons.push(format!(
            "{} site(s) miss SLA-2 ({}{})",
            step.sites_failing_sla2,
            hosts.join(", "),
            if step.sites_failing_sla2 > 3 { ", ..." } else { "" }
        ));
    }
    if late > 0 {
        reasons.push(format!(
            "{late} first request(s) after idle over their limit (worst {:.0} ms at {})",
            idle["worst_ms"].as_f64().unwrap_or(f64::NAN),
            idle["worst_host"].as_str().unwrap_or("?")
        ));
    }
    if let Some(peak) = step.peak_mb.filter(|&p| p > budget_mb) {
        reasons.push(format!("peak memory {peak:.0} MiB over the {budget_mb:.0} MiB budget"));
    }
    if step.oom_kills > 0 {
        reasons.push(format!("{} process(es) killed at the {budget_mb:.0} MiB memory limit", step.oom_kills));
    }
    if step.requests == 0 {
        reasons.push("no requests were made".into());
    }
    step.passed = reasons.is_empty();
    step.reason = reasons.join("; ");
}

/// Drive the deployed fleet; returns its fleet-run.json.
fn run_load(
    a: &FleetArgs,
    exe: &Path,
    stack: &str,
    url: &str,
    fleet_path: &Path,
    cgroup: Option<PathBuf>,
    dir: &Path,
) -> Result<serde_json::Value> {
    let opts = sprout_load::FleetRunOptions {
        url: url.to_string(),
        fleet: fleet_path.to_path_buf(),
        workload: a.workload.clone(),
        out: dir.to_path_buf(),
        interval_s: 5.0,
        timeout_s: 30.0,
        idle_gap_s: a.idle_gap,
        agents: a.agents,
        agent_cpus: a.agent_cpus.clone(),
        sut_cpus: crate::cpus::parse_cpus(&a.cpus)?,
        sut_cgroup: cgroup,
        stack: stack.to_string(),
        seed: Some(a.seed),
        pricing: Some(a.pricing.clone()),
        instances: 1.0,
        machine: sprout_bench::report::machine(),
        exe: exe.to_path_buf(),
    };
    let report = sprout_load::run_fleet(&opts)?;
    eprint!("{}", report.text());
    let path = dir.join("fleet-run.json");
    serde_json::from_slice(&std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?)
        .with_context(|| format!("parsing {}", path.display()))
}

/// fleet-status once the load has stopped (None if it cannot say).
fn at_rest(exe: &Path, state: &Path) -> Option<serde_json::Value> {
    let out = Command::new(exe).args(["olio", "fleet-status", "--dir"]).arg(state).stderr(Stdio::null()).output().ok()?;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(status).filter(|s| s["memory"].is_object())
}

/// The 99th percentile (nearest rank) of every site's first requests after idle in a
/// fleet-run.json; None when there were none.
fn first_after_idle_p99(report: &serde_json::Value) -> Option<f64> {
    let ms: Vec<f64> = report["sites"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|site| site["first_after_idle"].as_array().into_iter().flatten().filter_map(|f| f["ms"].as_f64()))
        .collect();
    (!ms.is_empty()).then(|| sprout_bench::report::percentile(&ms, 0.99))
}

/// Processes killed in a memory cgroup by its limit so far (v1 memory.oom_control, v2
/// memory.events); 0 when it cannot be read.
fn oom_kills(group: &Path) -> u64 {
    ["memory.oom_control", "memory.events"]
        .iter()
        .filter_map(|name| std::fs::read_to_string(group.join(name)).ok())
        .flat_map(|text| text.lines().filter_map(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse().ok())).collect::<Vec<u64>>())
        .next()
        .unwrap_or(0)
}

fn olio(exe: &Path, args: &[&str], state: &Path) -> Result<()> {
    let status =
        Command::new(exe).arg("olio").args(args).arg(state).status().with_context(|| format!("running sprout olio {}", args.join(" ")))?;
    if !status.success() {
        bail!("sprout olio {} {} failed ({status})", args.join(" "), state.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step() -> FleetStep {
        FleetStep {
            sites: 8,
            passed: false,
            reason: String::new(),
            sla1: None,
            sla2: None,
            sites_failing_sla2: 0,
            first_after_idle: None,
            first_after_idle_p99_ms: None,
            parking: None,
            requests: 0,
            errors: 0,
            resident_mb: 100.0,
            peak_mb: None,
            mean_mb: None,
            cpu_seconds: None,
            rest_mb: None,
            sites_at_rest: None,
            oom_kills: 0,
            setup_s: 1.0,
            run: None,
        }
    }

    #[test]
    fn only_the_on_demand_stack_is_given_the_vassals_settings() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            fleet: FleetArgs,
        }
        let cli = Cli::parse_from(["fleet", "--vassal-idle", "30", "--vassal-processes", "2"]);
        assert_eq!(stack_flags(&cli.fleet, "conventional-ondemand"), ["--vassal-idle", "30", "--vassal-processes", "2"]);
        assert!(stack_flags(&cli.fleet, "conventional").is_empty() && stack_flags(&cli.fleet, "sprout").is_empty());
        let defaults = Cli::parse_from(["fleet"]);
        assert!(stack_flags(&defaults.fleet, "conventional-ondemand").is_empty(), "fleet-up's defaults");
        assert!(defaults.fleet.stacks.iter().any(|s| s == "conventional-ondemand"));
    }

    #[test]
    fn the_first_requests_after_idle_p99_is_over_every_site() {
        let site =
            |ms: &[f64]| serde_json::json!({"first_after_idle": ms.iter().map(|m| serde_json::json!({"ms": m})).collect::<Vec<_>>()});
        let many: Vec<f64> = (1..=200).map(f64::from).collect();
        let report = serde_json::json!({"sites": [site(&many[..100]), site(&many[100..]), site(&[])]});
        assert_eq!(first_after_idle_p99(&report), Some(198.0));
        assert_eq!(first_after_idle_p99(&serde_json::json!({"sites": [site(&[700.0])]})), Some(700.0));
        assert_eq!(first_after_idle_p99(&serde_json::json!({"sites": [site(&[])]})), None);
    }

    #[test]
    fn a_run_passes_only_within_sla_idle_limits_and_memory() {
        let report = |sla2: bool, within: u64, peak: f64| {
            serde_json::json!({"passed_sla1": true, "passed_sla2": sla2, "sites_failing_sla2": if sla2 { vec![] } else { vec!["site0001.fleet.test"] },
                "first_after_idle": {"count": 5, "within_limit": within, "worst_ms": 1500.0, "worst_host": "site0002.fleet.test"},
                "requests": 100, "errors": 0, "resources": {"peak_pss_bytes": peak * 1048576.0, "mean_pss_bytes": 1.0, "cpu_seconds": 3.0}})
        };
        let mut s = step();
        judge(&mut s, &report(true, 5, 1000.0), 2048.0);
        assert!(s.passed, "{}", s.reason);
        judge(&mut s, &report(false, 5, 1000.0), 2048.0);
        assert!(!s.passed && s.reason.contains("site0001"), "{}", s.reason);
        judge(&mut s, &report(true, 4, 1000.0), 2048.0);
        assert!(!s.passed && s.reason.contains("1 first request"), "{}", s.reason);
        judge(&mut s, &report(true, 5, 3000.0), 2048.0);
        assert!(!s.passed && s.reason.contains("3000 MiB"), "{}", s.reason);
        s.oom_kills = 1;
        judge(&mut s, &report(true, 5, 1000.0), 2048.0);
        assert!(!s.passed && s.reason.contains("killed at the 2048 MiB memory limit"), "{}", s.reason);
    }
}
