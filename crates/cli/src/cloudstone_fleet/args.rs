//! The flags of `sprout cloudstone fleet`, and the fleet of a run they make: drawn, or the
//! first sites of a fleet file.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use sprout_bench::fleet::{self, FleetParams};

use super::fleet_file::read_fleet;

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
    /// the repository, and traversable by PostgreSQL's and nginx's users; each run's logs are
    /// kept under STATE/logs/<stack>/<sites>.
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
    pub(super) fn fleet_of(&self, sites: usize) -> Result<fleet::FleetFile> {
        let Some(path) = &self.fleet else { return Ok(fleet::fleet(&self.params(sites))) };
        let mut file = read_fleet(path)?;
        if file.sites.len() < sites {
            bail!("{} sites asked of {}, which holds {}", sites, path.display(), file.sites.len());
        }
        file.sites.truncate(sites);
        Ok(file)
    }

    /// The span of each run.
    pub(super) fn span_s(&self) -> Result<f64> {
        match &self.fleet {
            Some(path) => Ok(read_fleet(path)?.span_s),
            None => Ok(self.span),
        }
    }
}
