//! `sprout fleet`: several workers on this machine, each its own host, behind HAProxy
//! (crates/fleet).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use sprout_fleet::control::{self, UpOptions};
use sprout_fleet::haproxy::Policy;

#[derive(Subcommand)]
pub enum FleetCommand {
    /// Start N workers (each in its own network namespace, on its CPU, with its memory
    /// budget) and HAProxy in front of them; prints the entry point.
    Up {
        dir: PathBuf,
        #[arg(long, default_value_t = 3)]
        workers: usize,
        /// CPUs dealt to the workers in turn, one each.
        #[arg(long, value_delimiter = ',', default_value = "0")]
        cpus: Vec<usize>,
        /// Each worker's memory budget (its sandboxes), MiB.
        #[arg(long, default_value_t = 512)]
        memory_mb: u64,
        /// How /run/<lambda> is routed: round-robin, least-conn, consistent, package-aware.
        #[arg(long, default_value = "consistent")]
        policy: String,
        /// HAProxy's API entry point.
        #[arg(long, default_value = "127.0.0.1:7000")]
        listen: SocketAddr,
        /// HAProxy's app-port entry point (the sites), if any.
        #[arg(long)]
        app_listen: Option<SocketAddr>,
        /// A file of TOML every worker's config.toml starts from (the fleet's own settings are
        /// merged in; setting one of them is an error).
        #[arg(long)]
        worker_config: Option<PathBuf>,
        /// A service the sandboxes may reach by name, NAME=[ADDR:]PORT[@LAMBDA,...]; without
        /// ADDR it listens on the fleet's services address (`status` shows it). Repeatable.
        #[arg(long = "service")]
        services: Vec<String>,
        /// The port of the fleet's PostgreSQL (on the services address; default: a free one).
        #[arg(long)]
        postgres_port: Option<u16>,
    },
    /// Start one more worker and route requests to it.
    Add { dir: PathBuf },
    /// Stop routing new requests to a worker, let those under way finish, then stop it.
    Drain {
        dir: PathBuf,
        /// The worker, e.g. w2.
        name: String,
        /// Seconds to wait for requests under way.
        #[arg(long, default_value_t = 60)]
        grace: u64,
    },
    /// Stop HAProxy and every worker, and remove their namespaces.
    Down { dir: PathBuf },
    /// Each part of the fleet and whether it is up (JSON).
    Status { dir: PathBuf },
    /// Upload a lambda directory through the fleet and wait until every worker has it.
    Deploy {
        dir: PathBuf,
        lambda: PathBuf,
        #[arg(long)]
        name: Option<String>,
    },
}

pub fn run(command: FleetCommand) -> Result<()> {
    let mut say = |line: &str| eprintln!("{line}");
    match command {
        FleetCommand::Up { dir, workers, cpus, memory_mb, policy, listen, app_listen, worker_config, services, postgres_port } => {
            let extra_config = match worker_config {
                Some(path) => std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
                None => String::new(),
            };
            let services = services.iter().map(|s| s.parse()).collect::<Result<Vec<_>>>()?;
            let opts = UpOptions {
                workers,
                cpus,
                memory_mb,
                policy: Policy::parse(&policy)?,
                api: listen,
                app: app_listen,
                extra_config,
                services,
                pg_port: postgres_port,
            };
            control::up(&dir, &opts, &mut say)?;
            println!("http://{listen}");
        }
        FleetCommand::Add { dir } => {
            let member = sprout_fleet::membership::add(&dir, &mut say)?;
            println!("{} {}", member.name, member.addr);
        }
        FleetCommand::Drain { dir, name, grace } => {
            sprout_fleet::membership::drain(&dir, &name, std::time::Duration::from_secs(grace), &mut say)?
        }
        FleetCommand::Down { dir } => {
            if !control::down(&dir, &mut say)? {
                eprintln!("no fleet is up in {}", dir.display());
            }
        }
        FleetCommand::Status { dir } => println!("{}", serde_json::to_string_pretty(&control::status(&dir)?)?),
        FleetCommand::Deploy { dir, lambda, name } => {
            let took = control::deploy(&dir, &lambda, name.as_deref())?;
            eprintln!("every worker has it {:.0} ms after the upload began", took.as_secs_f64() * 1000.0);
        }
    }
    Ok(())
}
