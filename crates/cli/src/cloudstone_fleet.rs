//! `sprout cloudstone fleet`: how many mostly idle Olio sites each deployment holds within
//! SLA-2 and a memory budget on the same confined cores, searched site count by site count
//! (deploy, drive every site with its own profile, judge, take down), priced per site-month.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use sprout_bench::fleet::{self, Bracket, FleetParams};

/// The deployments `sprout olio fleet-up` makes.
const STACKS: [&str; 5] = ["sprout", "sprout-runc", "sprout-gvisor", "conventional", "conventional-ondemand"];

#[derive(Args, Clone)]
pub struct FleetArgs {
    /// Deployments to search, in order: sprout, sprout-runc, sprout-gvisor, conventional,
    /// conventional-ondemand.
    #[arg(long, value_delimiter = ',', default_value = "sprout,sprout-runc,sprout-gvisor,conventional,conventional-ondemand")]
    pub stacks: Vec<String>,
    /// conventional-ondemand: seconds without a request before a site's uWSGI vassal stops
    /// (fleet-up's --vassal-idle; its default when not given).
    #[arg(long)]
    pub vassal_idle: Option<u32>,
    /// conventional-ondemand: processes per vassal, auto or a number (fleet-up's
    /// --vassal-processes; its default when not given).
    #[arg(long)]
    pub vassal_processes: Option<String>,
    /// Run exactly this many sites once per stack instead of searching.
    #[arg(long)]
    pub sites: Option<usize>,
    /// Sites of the first run; each next run doubles until one fails, then bisection.
    #[arg(long, default_value_t = 8)]
    pub start: usize,
    #[arg(long, default_value_t = 2048)]
    pub max: usize,
    /// Bisection stops within this share of the lower end...
    #[arg(long, default_value_t = 0.1)]
    pub resolution: f64,
    /// ...or this many sites.
    #[arg(long, default_value_t = 4)]
    pub min_step: usize,
    /// Memory of the whole deployment (PostgreSQL and the cache included), MiB.
    #[arg(long, default_value_t = 2048)]
    pub memory_mb: u64,
    /// CPUs of the deployment.
    #[arg(long, default_value = "0")]
    pub cpus: String,
    /// CPUs of the load agents.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub agent_cpus: Vec<usize>,
    #[arg(long, default_value_t = 1)]
    pub agents: u32,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Seconds of load per run.
    #[arg(long, default_value_t = 300.0)]
    pub span: f64,
    /// Mean seconds of a visitor's session.
    #[arg(long, default_value_t = 60.0)]
    pub session_mean: f64,
    /// Accounts in each site's database.
    #[arg(long, default_value_t = 100)]
    pub registered_users: u64,
    /// A site's request counts as "first after idle" after this many seconds without one.
    #[arg(long, default_value_t = 60.0)]
    pub idle_gap: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Take the sites (their first N) and the span from this fleet file instead of drawing them.
    #[arg(long)]
    pub fleet: Option<PathBuf>,
    #[arg(long, default_value = "bench/workloads/olio.toml")]
    pub workload: PathBuf,
    #[arg(long, default_value = "bench/pricing.toml")]
    pub pricing: PathBuf,
    /// Each run's fleet file and report go under OUT/<stack>/<sites>.
    #[arg(long, default_value = "bench/results/fleet")]
    pub out: PathBuf,
    /// The deployments' state (databases, logs), one at a time, under STATE/<stack>: outside
    /// the repository, and traversable by PostgreSQL's and nginx's users.
    #[arg(long, default_value = "/var/tmp/sprout-fleet")]
    pub state: PathBuf,
    /// Continue the searches of --stacks from the runs the summary recorded (an interrupted
    /// search); the other flags must be the ones they ran with.
    #[arg(long)]
    pub resume: bool,
    /// The summary (the plot and the table go beside it). Deployments not searched now keep
    /// the results it holds.
    #[arg(long, default_value = "bench/results/fleet.json")]
    pub json: PathBuf,
}

#[derive(Args, Clone)]
pub struct FleetFileArgs {
    #[arg(long)]
    pub sites: usize,
    #[arg(long, default_value_t = 300.0)]
    pub span: f64,
    #[arg(long, default_value_t = 60.0)]
    pub session_mean: f64,
    #[arg(long, default_value_t = 100)]
    pub registered_users: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to write it (- for stdout).
    #[arg(long, default_value = "-")]
    pub out: PathBuf,
}

impl FleetArgs {
    fn params(&self, sites: usize) -> FleetParams {
        FleetParams {
            sites,
            span_s: self.span,
            seed: self.seed,
            session_mean_s: self.session_mean,
            registered_users: self.registered_users,
            ..FleetParams::default()
        }
    }
}

impl FleetArgs {
    /// The fleet of `sites` sites: drawn, or the first of --fleet's.
    fn fleet_of(&self, sites: usize) -> Result<fleet::FleetFile> {
        let Some(path) = &self.fleet else { return Ok(fleet::fleet(&self.params(sites))) };
        let mut file = read_fleet(path)?;
        if file.sites.len() < sites {
            bail!("{} sites asked of {}, which holds {}", sites, path.display(), file.sites.len());
        }
        file.sites.truncate(sites);
        Ok(file)
    }

    /// The span of each run.
    fn span_s(&self) -> Result<f64> {
        match &self.fleet {
            Some(path) => Ok(read_fleet(path)?.span_s),
            None => Ok(self.span),
        }
    }
}

fn read_fleet(path: &Path) -> Result<fleet::FleetFile> {
    let text = std::fs::read(path).with_context(|| format!("reading the fleet file {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parsing the fleet file {}", path.display()))
}

/// `sprout cloudstone fleet-file`: one fleet file, and how busy its sites are.
pub fn write_file(a: &FleetFileArgs) -> Result<()> {
    let file = fleet::fleet(&FleetParams {
        sites: a.sites,
        span_s: a.span,
        seed: a.seed,
        session_mean_s: a.session_mean,
        registered_users: a.registered_users,
        ..FleetParams::default()
    });
    let text = serde_json::to_string_pretty(&file)?;
    if a.out == Path::new("-") {
        println!("{text}");
    } else {
        std::fs::write(&a.out, text).with_context(|| format!("writing {}", a.out.display()))?;
    }
    eprintln!("{}", describe(&file));
    Ok(())
}

fn describe(file: &fleet::FleetFile) -> String {
    let active = file.sites.iter().filter(|s| s.sessions > 0).count();
    let users: f64 = file.sites.iter().map(|s| s.mean_users).sum();
    let peak = file.sites.iter().map(|s| s.peak_users).max().unwrap_or(0);
    format!(
        "{} sites over {:.0} s: {active} with a visit, {users:.1} users on average in all, the busiest site {peak} at once",
        file.sites.len(),
        file.span_s
    )
}

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

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StackResult {
    /// The largest fleet that passed (0: none did).
    pub sites_sla2: usize,
    /// It passed at --max: the true maximum may be higher.
    pub lower_bound: bool,
    pub usd_per_site_month: Option<f64>,
    /// The same at every price in the pricing file.
    pub usd_per_site_month_by_price: std::collections::BTreeMap<String, f64>,
    /// The stack's own settings the search ran with (conventional-ondemand's vassals; null:
    /// fleet-up's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<serde_json::Value>,
    pub steps: Vec<FleetStep>,
}

/// `sprout cloudstone fleet`.
pub fn search(a: &FleetArgs) -> Result<()> {
    let repo = crate::olio::repo_root()?;
    let exe = std::env::current_exe()?;
    let pricing = sprout_load::Pricing::load(&a.pricing)?;
    let price = pricing.prices.iter().find(|p| p.name == pricing.default).context("the pricing file's default price is missing")?.clone();
    if let Some(bad) = a.stacks.iter().find(|s| !STACKS.contains(&s.as_str())) {
        bail!("--stacks: {bad:?} is not a deployment (choose from {})", STACKS.join(", "));
    }
    // The vassals' settings are fleet-up's to check too; these would fail every run.
    if a.vassal_idle == Some(0) {
        bail!("--vassal-idle 0: give the seconds (at least 1) without a request after which a vassal stops");
    }
    if let Some(p) = a.vassal_processes.as_deref().filter(|p| *p != "auto") {
        if !matches!(p.parse::<u32>(), Ok(1..=32)) {
            bail!("--vassal-processes {p:?}: give auto or a number from 1 to 32");
        }
    }
    // A bad --fleet file is refused before anything starts; its size caps the search.
    let max = match &a.fleet {
        Some(path) => a.max.min(read_fleet(path)?.sites.len()),
        None => a.max,
    };
    std::fs::create_dir_all(&a.out)?;
    // The summary keeps the last search of every deployment: those not searched now stay;
    // with --resume, those searched now continue from the runs they recorded.
    let mut stacks = previous_stacks(a);
    for stack in &a.stacks {
        let mut bracket = Bracket::new(a.start, max, a.resolution, a.min_step);
        let mut steps: Vec<FleetStep> = match stacks.get(stack) {
            Some(old) if a.resume => serde_json::from_value::<StackResult>(old.clone()).map(|r| r.steps).unwrap_or_default(),
            _ => Vec::new(),
        };
        for step in &steps {
            eprintln!("==> {stack}: {} sites {} (recorded)", step.sites, if step.passed { "held" } else { "failed" });
            bracket.record(step.sites, step.passed);
        }
        stacks.remove(stack);
        loop {
            let n = match a.sites {
                Some(n) if steps.is_empty() => n,
                Some(_) => break,
                None => match bracket.next() {
                    Some(n) => n,
                    None => break,
                },
            };
            eprintln!("==> {stack}: {n} sites");
            let (step, teardown) = one_run(a, &exe, stack, n)?;
            eprintln!("==> {stack}: {n} sites {} {}", if step.passed { "held" } else { "failed:" }, step.reason);
            bracket.record(n, step.passed);
            steps.push(step);
            let partial = stack_result(stack, &steps, &bracket, &pricing, &price, a);
            stacks.insert(stack.clone(), serde_json::to_value(&partial)?);
            write_summary(a, &stacks, &price)?;
            teardown.context("taking the fleet down after its run (recorded; continue with --resume once it is down)")?;
        }
        if !steps.is_empty() {
            // A resumed search that was already complete keeps its result.
            stacks.insert(stack.clone(), serde_json::to_value(stack_result(stack, &steps, &bracket, &pricing, &price, a))?);
        }
    }
    let summary = write_summary(a, &stacks, &price)?;
    println!("{}", summary_text(&summary));
    let status = Command::new("python3").arg(repo.join("bench/plot_fleet.py")).arg(&a.json).status();
    match status {
        Ok(s) if s.success() => {}
        other => eprintln!("warning: bench/plot_fleet.py did not draw the plot ({other:?})"),
    }
    Ok(())
}

/// One instance for a month (upfront costs over a year), per site held.
fn per_site_month(price: &sprout_load::Price, sites: usize) -> f64 {
    (price.usd_per_instance_hour * sprout_load::HOURS_PER_MONTH + price.upfront_usd / 12.0) / sites as f64
}

fn stack_result(
    stack: &str,
    steps: &[FleetStep],
    bracket: &Bracket,
    pricing: &sprout_load::Pricing,
    price: &sprout_load::Price,
    a: &FleetArgs,
) -> StackResult {
    let best = steps.iter().filter(|s| s.passed).map(|s| s.sites).max().unwrap_or(0);
    StackResult {
        sites_sla2: best,
        lower_bound: a.sites.is_none() && bracket.failed.is_none() && best > 0,
        usd_per_site_month: (best > 0).then(|| per_site_month(price, best)),
        usd_per_site_month_by_price: if best > 0 {
            pricing.prices.iter().map(|p| (p.name.clone(), per_site_month(p, best))).collect()
        } else {
            Default::default()
        },
        settings: (stack == "conventional-ondemand")
            .then(|| serde_json::json!({"vassal_idle_s": a.vassal_idle, "vassal_processes": a.vassal_processes})),
        steps: steps.to_vec(),
    }
}

fn write_summary(
    a: &FleetArgs,
    stacks: &serde_json::Map<String, serde_json::Value>,
    price: &sprout_load::Price,
) -> Result<serde_json::Value> {
    let held = |name: &str| stacks.get(name).and_then(|s| s["sites_sla2"].as_u64()).filter(|&n| n > 0);
    let ratio = |x: &str, y: &str| match (held(x), held(y)) {
        (Some(x), Some(y)) => serde_json::json!(x as f64 / y as f64),
        _ => serde_json::Value::Null,
    };
    let summary = serde_json::json!({
        "machine": sprout_bench::report::machine(),
        "date": chrono_free_date(),
        "memory_budget_mb": a.memory_mb,
        "sut_cpus": a.cpus,
        "agent_cpus": a.agent_cpus,
        "span_s": a.span_s().unwrap_or(a.span),
        "session_mean_s": a.session_mean,
        "registered_users_per_site": a.registered_users,
        "seed": a.seed,
        "fleet_file": a.fleet.as_ref().map(|p| p.display().to_string()),
        "price": {"name": price.name, "usd_per_instance_hour": price.usd_per_instance_hour, "description": price.description},
        "runs_dir": runs_dir(a),
        "stacks": stacks,
        "ratios": {
            "sprout_vs_conventional": ratio("sprout", "conventional"),
            "sprout_vs_sprout_runc": ratio("sprout", "sprout-runc"),
            "sprout_vs_sprout_gvisor": ratio("sprout", "sprout-gvisor"),
            "sprout_gvisor_vs_conventional": ratio("sprout-gvisor", "conventional"),
            "sprout_vs_conventional_ondemand": ratio("sprout", "conventional-ondemand"),
        },
    });
    let text = serde_json::to_vec_pretty(&summary)?;
    std::fs::create_dir_all(json_dir(&a.json))?;
    std::fs::write(&a.json, &text)?;
    Ok(summary)
}

/// The deployments' results in an earlier summary at --json, if it ran with the same budget,
/// span, sessions, seed and sites (none if it is absent, unreadable or different).
fn previous_stacks(a: &FleetArgs) -> serde_json::Map<String, serde_json::Value> {
    let Some(old) = std::fs::read(&a.json).ok().and_then(|text| serde_json::from_slice::<serde_json::Value>(&text).ok()) else {
        return Default::default();
    };
    let same = old["memory_budget_mb"].as_u64() == Some(a.memory_mb)
        && old["span_s"].as_f64() == a.span_s().ok()
        && old["session_mean_s"].as_f64() == Some(a.session_mean)
        && old["seed"].as_u64() == Some(a.seed)
        && old["fleet_file"].as_str().map(PathBuf::from) == a.fleet.clone();
    if !same {
        eprintln!("note: {} ran with other settings; its results are replaced", a.json.display());
        return Default::default();
    }
    old["stacks"].as_object().cloned().unwrap_or_default()
}

fn json_dir(json: &Path) -> &Path {
    json.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Where the runs are, as the summary's reader finds them: relative to the summary when
/// they are below it (the default), else absolute.
fn runs_dir(a: &FleetArgs) -> String {
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (out, base) = (absolute(&a.out), absolute(json_dir(&a.json)));
    out.strip_prefix(&base).map(Path::to_path_buf).unwrap_or(out).display().to_string()
}

fn summary_text(summary: &serde_json::Value) -> String {
    let mut lines = Vec::new();
    if let Some(stacks) = summary["stacks"].as_object() {
        for (name, s) in stacks {
            lines.push(format!(
                "{name}: {} sites within SLA-2 in {} MiB{}; ${} per site-month",
                s["sites_sla2"],
                summary["memory_budget_mb"],
                if s["lower_bound"].as_bool() == Some(true) { " (at --max: a lower bound)" } else { "" },
                s["usd_per_site_month"].as_f64().map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into())
            ));
        }
    }
    lines.join("\n")
}

/// Today's date (UTC) as YYYY-MM-DD, from `date`.
fn chrono_free_date() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
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
fn one_run(a: &FleetArgs, exe: &Path, stack: &str, sites: usize) -> Result<(FleetStep, Result<()>)> {
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
    if let Some(memory) = at_rest(exe, &state) {
        step.rest_mb = memory["pss_mb"].as_f64();
        step.sites_at_rest = Some(memory["sites"].clone());
    }
    let down = olio(exe, &["fleet-down", "--dir"], &state);
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

/// fleet-status's `memory` once the load has stopped (None if it cannot say).
fn at_rest(exe: &Path, state: &Path) -> Option<serde_json::Value> {
    let out = Command::new(exe).args(["olio", "fleet-status", "--dir"]).arg(state).stderr(Stdio::null()).output().ok()?;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(status["memory"].clone()).filter(|m| m.is_object())
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
