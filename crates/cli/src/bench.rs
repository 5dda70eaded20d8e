//! `sprout bench ...`: every benchmark's flags, and each one run through its driver in
//! sprout-bench with the options they make.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Routing policies compared on a fleet of workers behind HAProxy (round-robin,
    /// least-conn, consistent, package-aware), on the synthetic package workload.
    Fleet {
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        #[arg(long, default_value_t = 4)]
        workers: usize,
        #[arg(long, default_value_t = 300)]
        handlers: usize,
        #[arg(long, default_value_t = 10)]
        clients: usize,
        #[arg(long, default_value_t = 20.0)]
        warmup_s: f64,
        /// Seconds measured per policy.
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
        /// Each worker's memory budget, MiB.
        #[arg(long, default_value_t = 512)]
        worker_memory_mb: u64,
        /// Each worker's handler cache and import cache, MiB each.
        #[arg(long, default_value_t = 64)]
        cache_mb: u64,
        /// CPU of every worker.
        #[arg(long, default_value_t = 0)]
        worker_cpu: usize,
        /// CPU of HAProxy, PostgreSQL and the clients.
        #[arg(long, default_value_t = 1)]
        client_cpu: usize,
        #[arg(long, default_value = "/var/tmp/sprout-bench-fleet")]
        work_dir: PathBuf,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// The hybrid histogram keep-alive policy against a fixed 10-minute window (and keeping
    /// everything loaded), replayed over a synthetic week of Azure-like applications.
    Keepalive {
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Applications in the population.
        #[arg(long, default_value_t = 1000)]
        apps: usize,
        /// Days of arrivals.
        #[arg(long, default_value_t = 7)]
        days: u64,
        #[arg(long, default_value_t = 20)]
        seed: u64,
    },
    /// ASGI apps against WSGI ones (bare, and FastAPI against Flask), cold and warm.
    Asgi {
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Alternating rounds.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seconds measured per app, start kind and round.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// CPU for the worker and its sandboxes.
        #[arg(long, default_value_t = 0)]
        worker_cpu: usize,
        /// CPU for the load generator.
        #[arg(long, default_value_t = 1)]
        client_cpu: usize,
        #[arg(long, default_value = "/tmp/sprout-bench-asgi")]
        work_dir: PathBuf,
    },
    /// Noisy neighbours: a victim lambda's warm latency alone and beside lambdas flooding
    /// stdout, spinning the CPU or churning memory, or another tenant flooding its quota, on one worker.
    Neighbours {
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Seconds measured per phase (after a warm-up).
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
        /// Shorter phases (at most 4 s) and fewer rounds, to try it.
        #[arg(long)]
        quick: bool,
        /// CPU for the worker and its sandboxes.
        #[arg(long, default_value_t = 0)]
        worker_cpu: usize,
        /// CPU for every client.
        #[arg(long, default_value_t = 1)]
        client_cpu: usize,
        #[arg(long, default_value = "/tmp/sprout-bench-neighbours")]
        work_dir: PathBuf,
    },
    /// Cold and warm starts of every sandbox backend through the worker (SOCK figures 14-16).
    Sandboxes {
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Backends to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "sock,sock-isolated,sock-nospares,sock-nozygote,gvisor,runc,docker")]
        backends: Vec<String>,
        /// Concurrency levels of the cold-start runs, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,5,10,20")]
        concurrency: Vec<usize>,
        /// Seconds measured per point.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// CPU for the worker and its sandboxes.
        #[arg(long, default_value_t = 0)]
        worker_cpu: usize,
        /// CPU for the load generator.
        #[arg(long, default_value_t = 1)]
        client_cpu: usize,
        /// Scratch directory for the benchmark's workers.
        #[arg(long, default_value = "/tmp/sprout-bench-sandboxes")]
        work_dir: PathBuf,
        /// A worker setting over the benchmark's own, section.key=value (the value in TOML, or
        /// a bare string): `--set limits.cpu_weight_per=lambda`; repeatable.
        #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
        settings: Vec<String>,
    },
    /// Packages and the three caches (SOCK figures 17-21, and memory).
    Packages {
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Parts to run, comma-separated (others keep their results from an earlier run).
        #[arg(long, value_delimiter = ',', default_value = "cold,django,scale,resize,memory")]
        parts: Vec<String>,
        /// Fewer samples and points, for a quick look.
        #[arg(long)]
        quick: bool,
        /// Seconds each scalability point runs.
        #[arg(long, default_value_t = 60.0)]
        scale_seconds: f64,
        #[arg(long, default_value_t = 0)]
        worker_cpu: usize,
        #[arg(long, default_value_t = 1)]
        client_cpu: usize,
        #[arg(long, default_value = "/tmp/sprout-bench-packages")]
        work_dir: PathBuf,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// sprout.store against hand-written sqlite3, SQLAlchemy and Peewee (Mirage figure 3).
    Store {
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Iterations per record size and system.
        #[arg(long, default_value_t = 5000)]
        iterations: u64,
        /// Record sizes in bytes, comma-separated.
        #[arg(long, default_value = "64,1024,4096,16384,65536")]
        sizes: String,
        /// Systems to run, comma-separated.
        #[arg(long, default_value = "sprout-sqlite,sqlite3-default,sqlite3-tuned,sqlalchemy,peewee,sprout-postgres")]
        systems: String,
        /// Runs per point (the median is reported).
        #[arg(long, default_value_t = 3)]
        repeats: u64,
    },
    /// The Sprout cache against Debian's memcached under memaslap (EbbRT figures 4 and 6).
    Cache {
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Server core budgets, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        cores: Vec<usize>,
        /// Connection counts of the first sweep.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,128,256")]
        connections: Vec<usize>,
        /// Value sizes (bytes) of the second sweep.
        #[arg(long, value_delimiter = ',', default_value = "64,128,256,512,1024,2048,4096,8192,16384")]
        values: Vec<usize>,
        /// Connections during the value sweep.
        #[arg(long, default_value_t = 64)]
        value_connections: usize,
        /// Seconds per memaslap run.
        #[arg(long, default_value_t = 4)]
        seconds: u64,
        /// Runs per point and server (the median is reported).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// CPU for the load generators.
        #[arg(long, default_value_t = 1)]
        client_cpu: usize,
        /// Skip Sprout's own generator (exact latencies) and run memaslap alone.
        #[arg(long)]
        memaslap_only: bool,
        /// The `sprout` binary whose cache is measured (default: this one), for an A/B of two
        /// builds under one driver.
        #[arg(long)]
        server: Option<std::path::PathBuf>,
    },
    /// Elastic offload: sprout.map over the worker's sandboxes against Ray and
    /// multiprocessing.Pool, every peer on the same CPUs (no-op tasks per second, a task's
    /// round trip, the makespan of CPU-bound tasks).
    Offload {
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Fewer tasks (1,000 no-ops, 50 round trips, 200 CPU tasks) and one round, to try it.
        #[arg(long)]
        quick: bool,
        /// Rounds of every peer, the median reported (default 3; --quick 1).
        #[arg(long)]
        rounds: Option<usize>,
        /// CPUs of every peer (the worker and its sandboxes, the driver, Ray, the pools),
        /// comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0,1")]
        cpus: Vec<usize>,
        /// The worker's [instances] max_per_lambda (at least 2).
        #[arg(long, default_value_t = 2)]
        sandboxes: usize,
        /// Peers to run, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "sprout,sprout_unbatched,ray,multiprocessing,multiprocessing_chunked")]
        peers: Vec<String>,
        /// Parts to run: tasks ((a) no-op and (b) CPU tasks), matmul ((c) the tiled matmul and
        /// (d) the worker's memory over a Matrix's life).
        #[arg(long, value_delimiter = ',', default_value = "tasks,matmul", value_parser = ["tasks", "matmul"])]
        parts: Vec<String>,
        #[arg(long, default_value = "/tmp/sprout-bench-offload")]
        work_dir: PathBuf,
    },
    /// Linux primitives behind containers (SOCK figures 1-5).
    Primitives {
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
        /// Seconds measured per point.
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// Fewer points, for a quick look.
        #[arg(long)]
        quick: bool,
    },
}

/// Run the benchmark `command` names.
pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Fleet {
            out,
            workers,
            handlers,
            clients,
            warmup_s,
            seconds,
            worker_memory_mb,
            cache_mb,
            worker_cpu,
            client_cpu,
            work_dir,
            seed,
        } => {
            let opts = sprout_bench::fleet_routing::Options {
                sprout: std::env::current_exe()?,
                out: out.clone(),
                work_dir,
                workers,
                handlers,
                clients,
                warmup_s,
                seconds,
                worker_memory_mb,
                cache_mb,
                worker_cpu,
                client_cpu,
                seed,
            };
            let results = sprout_bench::fleet_routing::run(&opts)?;
            let md = sprout_bench::fleet_routing::markdown(&results);
            sprout_bench::report::write(&out, "fleet-routing", &results, &md, "plot_fleet_routing.py")?;
            println!("{md}");
        }
        BenchCommand::Keepalive { out, apps, days, seed } => {
            let results = sprout_bench::keepalive::run(&sprout_bench::keepalive::Options { apps, days, seed, out_dir: out })?;
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({"ratios": results["ratios"], "targets": results["targets"]}))?);
        }
        BenchCommand::Asgi { out, rounds, seconds, worker_cpu, client_cpu, work_dir } => {
            let opts = sprout_bench::sandboxes::Options {
                concurrency: vec![1],
                seconds,
                worker_cpu,
                client_cpu,
                work_dir,
                out_dir: out,
                ..Default::default()
            };
            let results = sprout_bench::asgi::run(&opts, rounds)?;
            println!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({"asgi_over_wsgi": results["asgi_over_wsgi"], "fastapi_over_flask": results["fastapi_over_flask"]})
                )?
            );
        }
        BenchCommand::Neighbours { out, seconds, quick, worker_cpu, client_cpu, work_dir } => {
            let opts = sprout_bench::sandboxes::Options { seconds, worker_cpu, client_cpu, work_dir, out_dir: out, ..Default::default() };
            let results = sprout_bench::neighbours::run(&opts, quick)?;
            print!("{}", sprout_bench::neighbours::summary(&results));
        }
        BenchCommand::Sandboxes { out, backends, concurrency, seconds, worker_cpu, client_cpu, work_dir, settings } => {
            let opts = sprout_bench::sandboxes::Options {
                backends,
                concurrency,
                seconds,
                worker_cpu,
                client_cpu,
                work_dir,
                out_dir: out,
                settings,
                ..Default::default()
            };
            let results = sprout_bench::sandboxes::run(&opts)?;
            println!("{}", serde_json::to_string_pretty(&results["targets"])?);
        }
        BenchCommand::Packages { out, parts, quick, scale_seconds, worker_cpu, client_cpu, work_dir, seed } => {
            for p in &parts {
                if !sprout_bench::packages::PARTS.contains(&p.as_str()) {
                    anyhow::bail!("unknown part {p:?}; the parts are {}", sprout_bench::packages::PARTS.join(", "));
                }
            }
            let opts = sprout_bench::packages::Options {
                parts,
                quick,
                scale_seconds,
                worker_cpu,
                client_cpu,
                work_dir,
                out_dir: out,
                seed,
                ..Default::default()
            };
            let results = sprout_bench::packages::run(&opts)?;
            println!("{}", serde_json::to_string_pretty(&results["targets"])?);
        }
        BenchCommand::Store { out, iterations, sizes, systems, repeats } => {
            sprout_bench::store::run(&out, iterations, &sizes, &systems, repeats)?;
        }
        BenchCommand::Cache { out, cores, connections, values, value_connections, seconds, repeats, client_cpu, memaslap_only, server } => {
            let opts = sprout_bench::cache::Options {
                out_dir: out,
                sprout: match server {
                    Some(path) => path,
                    None => std::env::current_exe()?,
                },
                cores,
                connections,
                value_sizes: values,
                value_connections,
                small_value: 64,
                seconds,
                repeats: repeats.max(1),
                client_cpu,
                exact: !memaslap_only,
            };
            sprout_bench::cache::run(&opts)?;
        }
        BenchCommand::Offload { out, quick, rounds, cpus, sandboxes, peers, parts, work_dir } => {
            let opts = sprout_bench::offload::Options {
                out_dir: out,
                work_dir,
                sprout: std::env::current_exe()?,
                cpus,
                quick,
                rounds,
                sandboxes,
                peers,
                parts,
            };
            let results = sprout_bench::offload::run(&opts)?;
            print!("{}", sprout_bench::offload::summary(&results));
        }
        BenchCommand::Primitives { out, seconds, quick } => {
            let opts = sprout_bench::primitives::Options { out_dir: out, seconds_per_point: seconds, quick, ..Default::default() };
            sprout_bench::primitives::run(&opts)?;
        }
    }
    Ok(())
}
