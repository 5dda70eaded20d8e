//! `sprout`: one command line in front of the worker, its client and its benchmarks.

mod admin;
mod bench;
mod client;
mod cloudstone_fleet;
mod cpus;
mod fleet;
mod load;
mod map;
mod olio;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "sprout", version, about = "Sprout: serverless Python functions in lean sandboxes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Manage a worker directory.
    #[command(subcommand)]
    Worker(WorkerCommand),
    /// Upload a lambda directory (holding f.py) to a worker.
    Deploy {
        dir: PathBuf,
        /// Lambda name (default: the directory's name).
        #[arg(long)]
        name: Option<String>,
        /// The isolation class (back-end) to run it in, e.g. gvisor: one the worker runs
        /// (default: its previous version's, else the worker's configuration).
        #[arg(long)]
        isolation: Option<String>,
        #[arg(long, env = "SPROUT_URL", default_value = "http://127.0.0.1:5000")]
        url: String,
        /// The worker's API token (default: $SPROUT_TOKEN, else the one a worker on this
        /// machine leaves in /run/sprout/api/<address> while it runs).
        #[arg(long, env = "SPROUT_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Run a lambda with a JSON event and print its reply (/run needs no token).
    Invoke {
        name: String,
        #[arg(default_value = "null")]
        event: String,
        #[arg(long, env = "SPROUT_URL", default_value = "http://127.0.0.1:5000")]
        url: String,
    },
    /// Run a lambda over many JSON events (one a line of ITEMS, `-`: standard input) through
    /// the worker's /map, and print one line per outcome in the items' order: the result's
    /// JSON or the error object. Exit status 1 if an item failed, 2 if the map could not be
    /// done (a line that is not JSON: nothing is sent; a request that failed).
    Map(map::MapArgs),
    /// List the lambdas: name, version, upload time, sandboxes (busy/idle), invocations.
    Ls {
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// One lambda: its metadata (version, sha256, files, upload time, ol.yaml) and figures.
    Show {
        name: String,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// Delete lambdas (exit status 1 if any could not be deleted).
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// A lambda's function logs: what its handlers wrote, a START and a REPORT per request.
    Logs {
        name: String,
        /// Keep printing new entries as they come (until Ctrl-C).
        #[arg(short, long)]
        follow: bool,
        /// Only entries this recent: a duration back from now (30s, 10m, 2h, 1d), Unix
        /// seconds or RFC 3339.
        #[arg(long)]
        since: Option<String>,
        /// Only the entries of this request (its X-Sprout-Request-Id).
        #[arg(long)]
        request: Option<String>,
        /// The newest N matching entries (1-10000; the worker's default: 100).
        #[arg(long)]
        limit: Option<u32>,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// The worker's figures: invocations, starts, latency, sandboxes, memory budget, caches, errors.
    Stats {
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// The app port's sites: which lambda (and static directories) serve each host name.
    #[command(subcommand)]
    Sites(SitesCommand),
    /// Tenants: principals owning their lambdas, each reached with its own keys (the
    /// operator's token).
    #[command(subcommand)]
    Tenants(TenantsCommand),
    /// A tenant's keys: issued (shown once), listed, revoked (the operator's token).
    #[command(subcommand)]
    Keys(KeysCommand),
    /// The install cache of a worker.
    #[command(subcommand)]
    Packages(PackagesCommand),
    /// Print the tree of Zygotes (the import cache) of the worker running in DIR.
    Zygotes {
        dir: PathBuf,
        /// The worker's API token (default: $SPROUT_TOKEN, else DIR/api-token).
        #[arg(long, env = "SPROUT_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// The memcached-compatible cache server.
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Run a benchmark; results go to bench/results/.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The Olio application: its two deployments and its database loader (apps/olio).
    #[command(subcommand)]
    Olio(OlioCommand),
    /// Cloudstone's load generator: Markov-chain, closed-loop sessions against a site.
    #[command(subcommand)]
    Load(load::LoadCommand),
    /// Cloudstone: the search for the most users within the SLA, and comparisons.
    #[command(subcommand)]
    Cloudstone(load::CloudstoneCommand),
    /// Several workers on this machine, each its own host, behind HAProxy.
    #[command(subcommand)]
    Fleet(fleet::FleetCommand),
}

#[derive(Subcommand)]
enum SitesCommand {
    /// List the sites by host (`*`: the default site), with where each came from.
    Ls {
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// Serve a lambda for a host name (added, or replaced if the API made it).
    Put {
        host: String,
        /// The lambda serving the host.
        #[arg(long = "lambda", value_name = "NAME")]
        lambda: String,
        /// A URL prefix served from a directory of the worker's host, before the lambda
        /// (repeatable).
        #[arg(long = "static", value_name = "/PREFIX/=/DIR", value_parser = admin::parse_static)]
        statics: Vec<(String, String)>,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// Remove the site of a host name.
    Rm {
        host: String,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
}

#[derive(Subcommand)]
enum TenantsCommand {
    /// List the tenants, with their lambdas and live keys counted.
    Ls {
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// Make a tenant.
    Add {
        name: String,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// Remove a tenant and its keys (refused while it owns a lambda).
    Rm {
        name: String,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// One tenant: its lambdas, live keys, quotas and what it uses now.
    Show {
        name: String,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// Set a tenant's quotas, replacing them all (a quota left out: no limit).
    Quota {
        name: String,
        #[command(flatten)]
        quotas: admin::tenants::QuotaArgs,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Issue a key for a tenant and print it (shown this once).
    Add {
        tenant: String,
        /// GET and HEAD only.
        #[arg(long)]
        read_only: bool,
        /// Only this lambda of the tenant's (repeatable; default: all of them).
        #[arg(long = "lambda", value_name = "NAME")]
        lambdas: Vec<String>,
        /// Refused after this many seconds.
        #[arg(long, value_name = "SECONDS")]
        expires_in: Option<u64>,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// List a tenant's keys: id and scope, never the secret.
    Ls {
        tenant: String,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
    /// Revoke a key: refused from the next request on.
    Revoke {
        tenant: String,
        id: String,
        #[command(flatten)]
        endpoint: admin::Endpoint,
    },
}

/// Each runs the Python tool that does the work, with every argument passed through
/// (`sprout olio up --help` shows its flags).
#[derive(Subcommand)]
enum OlioCommand {
    /// Start a deployment: --stack sprout|conventional --dir STATE [--cpus 0] [--port 8080]
    /// [--cache on|off] [--users N --seed S]; prints the site's URL.
    #[command(disable_help_flag = true)]
    Up(PassThrough),
    /// Stop everything of a deployment: --dir STATE.
    #[command(disable_help_flag = true)]
    Down(PassThrough),
    /// A deployment's state as JSON: --dir STATE (exit 0 up, 3 down, 4 part of it runs).
    #[command(disable_help_flag = true)]
    Status(PassThrough),
    /// Start a fleet of Olio sites on one port, told apart by Host: --stack
    /// sprout|sprout-runc|sprout-gvisor|conventional|conventional-ondemand --dir STATE --fleet FILE
    /// [--cpus 0] [--port 8080] [--memory-mb 2048] [--vassal-idle 60 --vassal-processes auto];
    /// prints one line of JSON.
    #[command(disable_help_flag = true)]
    FleetUp(PassThrough),
    /// Stop everything of a fleet: --dir STATE.
    #[command(disable_help_flag = true)]
    FleetDown(PassThrough),
    /// A fleet's state as JSON: --dir STATE (exit 0 up, 3 down, 4 part of it runs).
    #[command(disable_help_flag = true)]
    FleetStatus(PassThrough),
    /// Fill a database with Olio's data: --users N | --concurrent C, --seed S, --db URL,
    /// --files DIR [--today YYYY-MM-DD] [--recreate] [--allow-small] [--quiet].
    #[command(disable_help_flag = true)]
    Load(PassThrough),
}

/// The arguments of an `olio` command, passed to its Python tool as they are.
#[derive(clap::Args)]
struct PassThrough {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<std::ffi::OsString>,
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Serve the memcached text, binary and meta protocols (memcached's flag names).
    Serve {
        /// TCP port (0: any free port, printed at start).
        #[arg(short = 'p', long, default_value_t = 11211)]
        port: u16,
        /// Address to listen on.
        #[arg(short = 'l', long, default_value = "127.0.0.1")]
        listen: String,
        /// Memory for items, in megabytes.
        #[arg(short = 'm', long = "memory-limit", default_value_t = 64)]
        memory_mb: usize,
        /// Cores (one pinned event loop each).
        #[arg(short = 't', long = "threads", default_value_t = 4)]
        cores: usize,
        /// Most simultaneous connections.
        #[arg(short = 'c', long = "conn-limit", default_value_t = 1024)]
        max_conns: usize,
        /// Largest item (bytes, or with k or m: 1m), counted as memcached counts it.
        #[arg(short = 'I', long = "max-item-size", default_value = "1m")]
        item_max: String,
        /// CPUs to pin the cores to, comma-separated (default: this process's CPUs).
        #[arg(long, value_delimiter = ',')]
        cpus: Option<Vec<usize>>,
        /// Let the cores' threads float over those CPUs instead of pinning one to each
        /// (fairer when a CPU is shared with other work, such as a load generator).
        #[arg(long)]
        no_pin: bool,
        /// Microseconds a core keeps polling after any request before it sleeps (EbbRT's
        /// idle polling). 0, the default, sleeps at once as memcached does; on this project's
        /// 2-vCPU VM it cost 10-35% from 4 connections up (clients' requests no longer gather
        /// while the core sleeps), so use it only on dedicated physical cores.
        #[arg(long, default_value_t = 0)]
        spin_us: u64,
        /// Microseconds a core polls for the next request of a client that alone keeps it
        /// busy (several polls in a row found work, each soon after the last reply, and no
        /// other socket was ready for 2 ms) instead of sleeping; 0 never. A second client
        /// (past --poll-clients), or a request later than this, puts the core back to sleeping.
        #[arg(long, default_value_t = sprout_cache::shared::LONE_SPIN_US)]
        lone_spin_us: u64,
        /// The most clients (sockets found ready within 2 ms) a core polls for under
        /// --lone-spin-us; past them it sleeps between requests so theirs gather. 1: a lone
        /// client only.
        #[arg(long, default_value_t = sprout_cache::shared::POLL_CLIENTS as u64, value_parser = clap::value_parser!(u64).range(1..=1024))]
        poll_clients: u64,
    },
}

#[derive(Subcommand)]
enum PackagesCommand {
    /// Install the packages a requirements file names (and their dependencies) into the
    /// install cache of the worker configured in --dir, ahead of any request.
    Preinstall {
        file: PathBuf,
        #[arg(long, default_value = "worker")]
        dir: PathBuf,
    },
    /// List what the install cache of the worker configured in --dir holds.
    List {
        #[arg(long, default_value = "worker")]
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum WorkerCommand {
    /// Write DIR/config.toml and build the sandbox base image (once per machine).
    Init { dir: PathBuf },
    /// Start the worker (in the foreground unless --detach).
    Up {
        dir: PathBuf,
        #[arg(long)]
        detach: bool,
    },
    /// Stop the worker running in DIR.
    Down {
        dir: PathBuf,
        /// Seconds to wait for in-flight requests before killing it.
        #[arg(long, default_value_t = 60)]
        grace: u64,
    },
    /// Whether a worker runs in DIR, and whether it answers.
    Status { dir: PathBuf },
    /// Remove mounts, cgroups and processes a crashed worker left behind.
    Cleanup { dir: PathBuf },
}

fn log_init(filter: &str) {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| filter.to_string());
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("sprout: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Worker(WorkerCommand::Init { dir }) => {
            let outcome = sprout_worker::init(&dir, &mut |line| eprintln!("{line}"))?;
            match outcome {
                sprout_worker::InitOutcome::Reused => eprintln!("base image ready (reused)"),
                sprout_worker::InitOutcome::Built(t) => {
                    eprintln!("base image built in {:.0} s", t.as_secs_f64())
                }
            }
            println!("initialized {}; start it with `sprout worker up {}`", dir.display(), dir.display());
        }
        Command::Worker(WorkerCommand::Up { dir, detach }) => {
            if detach {
                let pid = sprout_worker::up_detached(&dir, &std::env::current_exe()?)?;
                println!("worker running in the background (pid {pid}); log: {}", dir.join(sprout_worker::LOG).display());
            } else {
                let config = sprout_worker::Config::load(&dir)?;
                log_init(&config.worker.log);
                tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(sprout_worker::serve(&dir))?;
            }
        }
        Command::Worker(WorkerCommand::Down { dir, grace }) => {
            if sprout_worker::down(&dir, Duration::from_secs(grace))? {
                println!("worker stopped");
            } else {
                println!("no worker is running in {}", dir.display());
            }
        }
        Command::Worker(WorkerCommand::Status { dir }) => {
            let status = sprout_worker::status(&dir)?;
            println!("{}", serde_json::to_string_pretty(&status)?);
            if !status.ready {
                std::process::exit(3);
            }
        }
        Command::Worker(WorkerCommand::Cleanup { dir }) => {
            let report = sprout_worker::cleanup_dir(&dir)?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Command::Deploy { dir, name, isolation, url, token } => {
            let token = client::find_token(&url, token);
            let lambda = client::deploy(url.trim_end_matches('/'), token.as_deref(), &dir, name.as_deref(), isolation.as_deref())?;
            println!("{}", serde_json::to_string_pretty(&lambda)?);
        }
        Command::Invoke { name, event, url } => {
            println!("{}", client::invoke(url.trim_end_matches('/'), &name, &event)?);
        }
        Command::Map(args) => {
            let code = map::main(&args);
            if code != 0 {
                std::process::exit(code);
            }
        }
        Command::Ls { endpoint } => admin::ls(&endpoint)?,
        Command::Show { name, endpoint } => admin::show(&endpoint, &name)?,
        Command::Rm { names, endpoint } => admin::rm(&endpoint, &names)?,
        Command::Logs { name, follow, since, request, limit, endpoint } => {
            let query = admin::LogsQuery { follow, since: since.as_deref(), request: request.as_deref(), limit };
            admin::logs(&endpoint, &name, &query)?
        }
        Command::Stats { endpoint } => admin::stats(&endpoint)?,
        Command::Sites(SitesCommand::Ls { endpoint }) => admin::sites_ls(&endpoint)?,
        Command::Sites(SitesCommand::Put { host, lambda, statics, endpoint }) => admin::sites_put(&endpoint, &host, &lambda, &statics)?,
        Command::Sites(SitesCommand::Rm { host, endpoint }) => admin::sites_rm(&endpoint, &host)?,
        Command::Tenants(TenantsCommand::Ls { endpoint }) => admin::tenants::tenants_ls(&endpoint)?,
        Command::Tenants(TenantsCommand::Add { name, endpoint }) => admin::tenants::tenants_add(&endpoint, &name)?,
        Command::Tenants(TenantsCommand::Rm { name, endpoint }) => admin::tenants::tenants_rm(&endpoint, &name)?,
        Command::Tenants(TenantsCommand::Show { name, endpoint }) => admin::tenants::tenants_show(&endpoint, &name)?,
        Command::Tenants(TenantsCommand::Quota { name, quotas, endpoint }) => {
            admin::tenants::tenants_quota(&endpoint, &name, &serde_json::to_value(&quotas)?)?
        }
        Command::Keys(KeysCommand::Add { tenant, read_only, lambdas, expires_in, endpoint }) => {
            let new = admin::tenants::NewKey { read_only, lambdas: &lambdas, expires_in_s: expires_in };
            admin::tenants::keys_add(&endpoint, &tenant, &new)?
        }
        Command::Keys(KeysCommand::Ls { tenant, endpoint }) => admin::tenants::keys_ls(&endpoint, &tenant)?,
        Command::Keys(KeysCommand::Revoke { tenant, id, endpoint }) => admin::tenants::keys_revoke(&endpoint, &tenant, &id)?,
        Command::Packages(PackagesCommand::Preinstall { file, dir }) => {
            log_init("warn,sprout_engine::packages=info");
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let installed = rt.block_on(sprout_worker::preinstall(&dir, &file))?;
            for p in &installed {
                println!("{:<40} {:>8.1} MiB  {}", p.key, p.size_bytes as f64 / (1 << 20) as f64, p.top_level.join(" "));
            }
            println!("{} packages in the install cache", installed.len());
        }
        Command::Packages(PackagesCommand::List { dir }) => {
            let config = sprout_worker::Config::load(&dir)?;
            let cache = sprout_worker::InstallCache::open(&config.package_cache_dir(&dir))?;
            for p in cache.list() {
                println!("{:<40} {:>8.1} MiB  {}", p.key, p.size_bytes as f64 / (1 << 20) as f64, p.top_level.join(" "));
            }
        }
        Command::Cache(CacheCommand::Serve {
            port,
            listen,
            memory_mb,
            cores,
            max_conns,
            item_max,
            cpus,
            no_pin,
            spin_us,
            lone_spin_us,
            poll_clients,
        }) => {
            log_init("info");
            let item_max = sprout_cache::server::parse_size(&item_max)?;
            if item_max < 1024 {
                anyhow::bail!("-I must be at least 1k (got {item_max} bytes)");
            }
            let settings = sprout_cache::Settings {
                listen,
                port,
                limit_bytes: memory_mb.max(1) << 20,
                cores: cores.max(1),
                max_conns: max_conns.max(1),
                item_max,
                cpus,
                pin: !no_pin,
                spin_us,
                lone_spin_us,
                poll_clients: poll_clients as usize,
            };
            sprout_cache::server::serve_until_signal(settings, |server| {
                tracing::info!(
                    "sprout cache listening on {} with {} cores (CPUs {:?})",
                    server.addr(),
                    server.shared().settings.cores,
                    server.cpus()
                );
                println!("listening on {}", server.addr());
            })?;
        }
        Command::Zygotes { dir, token } => {
            let config = sprout_worker::Config::load(&dir)?;
            let url = format!("http://{}", config.worker.listen);
            let token = token.or_else(|| sprout_worker::read_token(&dir).ok().map(|t| t.as_str().to_string()));
            print!("{}", client::zygotes(&url, client::find_token(&url, token).as_deref())?);
        }
        Command::Bench(command) => bench::run(command)?,
        Command::Load(command) => load::main(command)?,
        Command::Cloudstone(command) => load::cloudstone(command)?,
        Command::Fleet(command) => fleet::run(command)?,
        Command::Olio(command) => {
            let (module, verb, args) = match command {
                OlioCommand::Up(PassThrough { args }) => ("olio_deploy", Some("up"), args),
                OlioCommand::Down(PassThrough { args }) => ("olio_deploy", Some("down"), args),
                OlioCommand::Status(PassThrough { args }) => ("olio_deploy", Some("status"), args),
                OlioCommand::FleetUp(PassThrough { args }) => ("olio_deploy", Some("fleet-up"), args),
                OlioCommand::FleetDown(PassThrough { args }) => ("olio_deploy", Some("fleet-down"), args),
                OlioCommand::FleetStatus(PassThrough { args }) => ("olio_deploy", Some("fleet-status"), args),
                OlioCommand::Load(PassThrough { args }) => ("olio.loader", None, args),
            };
            return Err(olio::exec_python(module, verb, &args));
        }
    }
    Ok(())
}
