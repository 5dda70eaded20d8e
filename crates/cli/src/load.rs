//! `sprout load ...`: Cloudstone's generator — `run` a measured run (agents, checks, report),
//! `fleet` a run of many sites on one address, and `agent` and `fleet-agent`, the processes
//! their agents run.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use sprout_load::RunOptions;
use sprout_load::Spec;
use sprout_load::{run_fleet, FleetRunOptions};

use crate::cpus::parse_cpus;

#[derive(Subcommand)]
pub enum LoadCommand {
    /// Drive a site with a workload's Markov mix; judge the run (SLA-1, SLA-2, mix, cycle
    /// time, application checks) and write run.json and report.html into --out.
    Run(Box<RunArgs>),
    /// One agent (started by `run`): its spec as JSON on stdin, its result as JSON on stdout.
    Agent,
    /// Drive a fleet of Olio sites served on one address (told apart by their Host header),
    /// each with its own users following its own load profile from the fleet file; judge every
    /// site (SLA-1, SLA-2 over the whole span) and write fleet-run.json into --out.
    Fleet(Box<FleetArgs>),
    /// One fleet agent (started by `fleet`): its spec as JSON on stdin, its result as JSON on
    /// stdout.
    #[command(hide = true)]
    FleetAgent,
}

#[derive(Args, Clone)]
pub struct FleetArgs {
    /// The one address every site is served on, e.g. http://127.0.0.1:8080
    #[arg(long)]
    pub url: String,
    /// The fleet file (JSON: span, accounts, and each site's name, host and profile).
    #[arg(long)]
    pub fleet: PathBuf,
    /// Where fleet-run.json goes.
    #[arg(long)]
    pub out: PathBuf,
    /// The workload file (operations, limits, mix, cycle times); its driver must be olio.
    #[arg(long, default_value = "bench/workloads/olio.toml")]
    pub workload: PathBuf,
    /// Seconds between progress lines and time-series points.
    #[arg(long, default_value_t = 10.0)]
    pub interval: f64,
    /// A request with no complete answer in this many seconds fails ("timeout").
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Seconds without an operation after which a site is idle (its next operation is a
    /// "first after idle").
    #[arg(long, default_value_t = 60.0)]
    pub idle_gap: f64,
    /// Agent processes; site i goes to agent i % agents.
    #[arg(long, default_value_t = 1)]
    pub agents: u32,
    /// CPUs the agents are pinned to (round-robin), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub agent_cpus: Vec<usize>,
    /// CPUs of the system under test (their busy time is its CPU use).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub sut_cpus: Vec<usize>,
    /// A cgroup directory listing the deployment's processes (for their memory).
    #[arg(long)]
    pub sut_cgroup: Option<PathBuf>,
    /// The deployment's name in the report.
    #[arg(long, default_value = "fleet")]
    pub stack: String,
    /// The sessions' seed (default: the fleet file's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Prices for the resources the run used.
    #[arg(long, default_value = "bench/pricing.toml")]
    pub pricing: PathBuf,
    /// Instances the deployment is provisioned as, for the always-on cost beside.
    #[arg(long, default_value_t = 1.0)]
    pub instances: f64,
}

#[derive(Args, Clone)]
pub struct RunArgs {
    /// The site, e.g. http://127.0.0.1:8080
    #[arg(long)]
    pub url: String,
    /// Concurrent users (ignored with --profile, which sets them over time).
    #[arg(long, default_value_t = 25)]
    pub users: usize,
    /// User accounts in the loaded database (the driver logs in as user1..userN).
    #[arg(long)]
    pub registered_users: u64,
    /// The workload file (operations, mix, cycle times).
    #[arg(long, default_value = "bench/workloads/olio.toml")]
    pub workload: PathBuf,
    /// A load profile: lines of `seconds users`.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    #[arg(long, default_value_t = 30.0)]
    pub ramp_up: f64,
    #[arg(long, default_value_t = 300.0)]
    pub steady: f64,
    #[arg(long, default_value_t = 10.0)]
    pub ramp_down: f64,
    /// SLA window in seconds (default: 300, or the whole steady state when shorter).
    #[arg(long)]
    pub window: Option<f64>,
    /// Seconds between progress lines and time-series points.
    #[arg(long, default_value_t = 10.0)]
    pub interval: f64,
    /// Most milliseconds between starting two users.
    #[arg(long, default_value_t = 100.0)]
    pub start_delay_ms: f64,
    /// A request with no complete answer in this many seconds fails ("timeout").
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Agent processes, each driving its share of the users.
    #[arg(long, default_value_t = 1)]
    pub agents: u32,
    /// CPUs the agents are pinned to (round-robin), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub agent_cpus: Vec<usize>,
    /// CPUs of the system under test (their busy time is its CPU use).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub sut_cpus: Vec<usize>,
    /// A cgroup directory listing the deployment's processes (for their memory).
    #[arg(long)]
    pub sut_cgroup: Option<PathBuf>,
    /// The deployment's name in the report.
    #[arg(long, default_value = "site")]
    pub stack: String,
    /// The Olio deployment's state directory (`sprout olio up --dir`): the report records
    /// which interpreter build its Python processes ran.
    #[arg(long)]
    pub deployment: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where run.json, report.html and the plots go.
    #[arg(long)]
    pub out: PathBuf,
    /// Prices for the resources the run used.
    #[arg(long, default_value = "bench/pricing.toml")]
    pub pricing: PathBuf,
    /// Instances the deployment is provisioned as, for the always-on cost beside.
    #[arg(long, default_value_t = 1.0)]
    pub instances: f64,
}

impl RunArgs {
    pub fn spec(&self) -> Result<Spec> {
        if self.agents == 0 {
            bail!("--agents must be at least 1");
        }
        Ok(Spec {
            workload: self.workload.clone(),
            url: self.url.clone(),
            registered_users: self.registered_users,
            users: self.users,
            profile: self.profile.clone(),
            ramp_up_s: self.ramp_up,
            steady_s: self.steady,
            ramp_down_s: self.ramp_down,
            window_s: self.window.unwrap_or(self.steady.clamp(1.0, 300.0)),
            interval_s: self.interval,
            start_delay_ms: self.start_delay_ms,
            timeout_s: self.timeout,
            seed: self.seed,
            agents: self.agents,
            agent: 0,
            cpu: None,
            start_at_unix_ms: 0,
            progress: true,
        })
    }
}

pub fn main(cmd: LoadCommand) -> Result<()> {
    match cmd {
        LoadCommand::Agent => sprout_load::agent_main(),
        LoadCommand::FleetAgent => sprout_load::fleet_agent_main(),
        LoadCommand::Fleet(args) => {
            let opts = FleetRunOptions {
                url: args.url.clone(),
                fleet: args.fleet.clone(),
                workload: args.workload.clone(),
                out: args.out.clone(),
                interval_s: args.interval,
                timeout_s: args.timeout,
                idle_gap_s: args.idle_gap,
                agents: args.agents,
                agent_cpus: args.agent_cpus.clone(),
                sut_cpus: args.sut_cpus.clone(),
                sut_cgroup: args.sut_cgroup.clone(),
                stack: args.stack.clone(),
                seed: args.seed,
                pricing: Some(args.pricing.clone()),
                instances: args.instances,
                machine: sprout_bench::report::machine(),
                exe: std::env::current_exe()?,
            };
            let report = run_fleet(&opts)?;
            print!("{}", report.text());
            println!("report: {}", opts.out.join("fleet-run.json").display());
            Ok(())
        }
        LoadCommand::Run(args) => {
            let opts = RunOptions {
                spec: args.spec()?,
                stack: args.stack.clone(),
                agent_cpus: args.agent_cpus.clone(),
                sut_cpus: args.sut_cpus.clone(),
                sut_cgroup: args.sut_cgroup.clone(),
                out: args.out.clone(),
                exe: std::env::current_exe()?,
                repo: crate::olio::repo_root()?,
                pricing: Some(args.pricing.clone()),
                instances: args.instances,
                machine: sprout_bench::report::machine(),
                deployment: args.deployment.clone(),
            };
            let report = sprout_load::run(&opts)?;
            print!("{}", report.text());
            println!("report: {}", opts.out.join("report.html").display());
            Ok(())
        }
    }
}

#[derive(Subcommand)]
pub enum CloudstoneCommand {
    /// Find the most concurrent users a deployment serves within SLA-1 and SLA-2 (runs at
    /// growing user counts, then bisection; each run on a fresh deployment loaded at scale),
    /// and its dollars per user per month; writes search.json and search.html into --out.
    Search(SearchArgs),
    /// Put searches side by side: compare.html and compare.md in --out, and the summary JSON.
    Compare {
        /// search.json files (e.g. of the sprout and conventional searches).
        searches: Vec<PathBuf>,
        #[arg(long, default_value = "bench/results/cloudstone")]
        out: PathBuf,
        #[arg(long, default_value = "bench/results/cloudstone.json")]
        json: PathBuf,
    },
    /// Cloudstone for a fleet: the most mostly idle Olio sites (each its own database, host
    /// name and Azure-drawn load) each deployment holds within SLA-2 and a memory budget on the
    /// same cores, and dollars per site per month; writes --json, its plot and its table.
    Fleet(Box<crate::cloudstone_fleet::FleetArgs>),
    /// Write one fleet file (the sites, their hosts and load profiles) and say how busy it is.
    FleetFile(crate::cloudstone_fleet::FleetFileArgs),
}

#[derive(Args, Clone)]
pub struct SearchArgs {
    /// The deployment: sprout or conventional (`sprout olio up --stack`).
    #[arg(long)]
    pub stack: String,
    /// CPUs the deployment is confined to.
    #[arg(long, default_value = "0")]
    pub cpus: String,
    /// CPUs the load agents run on.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub agent_cpus: Vec<usize>,
    #[arg(long, default_value_t = 1)]
    pub agents: u32,
    /// The site's port during the search.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Caching in the deployment (`sprout olio up --cache`).
    #[arg(long, default_value = "on")]
    pub cache: String,
    /// Users of the first run; each next run doubles until SLA-1 fails.
    #[arg(long, default_value_t = 25)]
    pub start: usize,
    #[arg(long, default_value_t = 5000)]
    pub max: usize,
    /// Bisection stops when the bracket is within this share of the lower bound...
    #[arg(long, default_value_t = 0.05)]
    pub resolution: f64,
    /// ...or this many users.
    #[arg(long, default_value_t = 5)]
    pub min_step: usize,
    /// Registered accounts per concurrent user (Olio's loader: 100), at least 1,000 in all.
    #[arg(long, default_value_t = 100)]
    pub accounts_per_user: u64,
    /// Steady state of each run (Cloudstone: at least 300 s for a reportable result).
    #[arg(long, default_value_t = 300.0)]
    pub steady: f64,
    #[arg(long, default_value_t = 30.0)]
    pub ramp_up: f64,
    #[arg(long, default_value_t = 10.0)]
    pub ramp_down: f64,
    #[arg(long, default_value_t = 10.0)]
    pub interval: f64,
    #[arg(long, default_value = "bench/workloads/olio.toml")]
    pub workload: PathBuf,
    #[arg(long, default_value = "bench/pricing.toml")]
    pub pricing: PathBuf,
    /// Instances the deployment is billed as.
    #[arg(long, default_value_t = 1.0)]
    pub instances: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where search.json, search.html and each run's report go.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep the runs an interrupted search recorded (OUT/search-trace.json) instead of running
    /// them again; the other flags must be the ones it ran with.
    #[arg(long)]
    pub resume: bool,
    /// Runs at each end of the final brackets (the highest pass and the lowest failure of
    /// each SLA): a maximum is taken when they agree, else reported with its spread.
    #[arg(long, default_value_t = 2)]
    pub repeats: usize,
}

pub fn cloudstone(cmd: CloudstoneCommand) -> Result<()> {
    let repo = crate::olio::repo_root()?;
    match cmd {
        CloudstoneCommand::Search(a) => {
            if a.steady < 300.0 {
                eprintln!("note: runs of {} s are a smoke test; Cloudstone reports need at least 300 s of steady state", a.steady);
            }
            let out = a.out.clone().unwrap_or_else(|| PathBuf::from(format!("bench/results/cloudstone/{}", a.stack)));
            let run_args = RunArgs {
                url: String::new(),
                users: a.start,
                registered_users: 1000,
                workload: a.workload.clone(),
                profile: None,
                deployment: None,
                ramp_up: a.ramp_up,
                steady: a.steady,
                ramp_down: a.ramp_down,
                window: None,
                interval: a.interval,
                start_delay_ms: 100.0,
                timeout: 30.0,
                agents: a.agents,
                agent_cpus: a.agent_cpus.clone(),
                sut_cpus: parse_cpus(&a.cpus)?,
                sut_cgroup: None,
                stack: a.stack.clone(),
                seed: a.seed,
                out: out.clone(),
                pricing: a.pricing.clone(),
                instances: a.instances,
            };
            let opts = sprout_load::SearchOptions {
                run: RunOptions {
                    spec: run_args.spec()?,
                    stack: a.stack.clone(),
                    agent_cpus: a.agent_cpus.clone(),
                    sut_cpus: run_args.sut_cpus.clone(),
                    sut_cgroup: None,
                    out: out.clone(),
                    exe: std::env::current_exe()?,
                    repo,
                    pricing: Some(a.pricing.clone()),
                    instances: a.instances,
                    machine: sprout_bench::report::machine(),
                    deployment: None,
                },
                stack: a.stack.clone(),
                cpus: a.cpus.clone(),
                up_args: vec!["--cache".into(), a.cache.clone()],
                port: a.port,
                start_users: a.start,
                max_users: a.max,
                resolution: a.resolution,
                min_step: a.min_step,
                resume: a.resume,
                repeats: a.repeats.max(1),
                accounts_per_user: a.accounts_per_user,
                pricing: a.pricing.clone(),
                instances: a.instances,
            };
            let r = sprout_load::search(&opts)?;
            let spread = |m: &sprout_load::Maximum| {
                if m.agreed {
                    String::new()
                } else {
                    format!(" (repeats disagreed: up to {})", m.high)
                }
            };
            println!(
                "{}: {} users at SLA-1{}, {} at SLA-2{}; {}",
                r.stack,
                r.sla1_users,
                spread(&r.sla1),
                r.sla2_users,
                spread(&r.sla2),
                out.join("search.html").display()
            );
            Ok(())
        }
        CloudstoneCommand::Fleet(a) => crate::cloudstone_fleet::search(&a),
        CloudstoneCommand::FleetFile(a) => crate::cloudstone_fleet::write_file(&a),
        CloudstoneCommand::Compare { searches, out, json } => {
            if searches.len() < 2 {
                bail!("compare needs two or more search.json files");
            }
            let status = std::process::Command::new("python3")
                .arg(repo.join("bench/cloudstone_search.py"))
                .arg("--compare")
                .arg(&out)
                .args(&searches)
                .arg("--json")
                .arg(&json)
                .status()?;
            anyhow::ensure!(status.success(), "bench/cloudstone_search.py failed ({status})");
            Ok(())
        }
    }
}
