//! `sprout worker up`: the running worker, in its stages — claim the directory (its lock, its
//! configuration, read once, and what a dead predecessor left cleaned up), bind the
//! listeners, build the sandbox engine, assemble the API, serve until SIGTERM or SIGINT, and
//! shut down, leaving nothing behind.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use sprout_sandbox::cgroup::{Layout, OwnCpuGroup};
use sprout_sandbox::{base, cleanup, network};
use tokio::net::TcpListener;

use super::engine::{memory_budget, Engine};
use super::{detect_layout, LOCK, PID};
use crate::api::{router, Api};
use crate::app::AppPort;
use crate::archive::Caps;
use crate::auth::{token, Discovery, Guard};
use crate::config::Config;
use crate::handler_cache::HandlerCacheConfig;
use crate::instances::{InstanceConfig, Instances, Provisioning};
use crate::invoker::{InvokeLimits, Invoker};
use crate::logs::Logs;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::syntax::Checker;

/// Run the worker in `dir` in the foreground until SIGTERM or SIGINT.
pub async fn serve(dir: &Path) -> Result<()> {
    // Caught from the start: a signal during start-up (or just after "ready", before the
    // listeners run) stops the worker cleanly once it is up, instead of killing it mid-way.
    let signals = ShutdownSignals::install()?;
    let claimed = Claimed::claim(dir)?;
    let listeners = Listeners::bind(&claimed).await?;
    let engine = Engine::build(&claimed).await?;
    let api = match assemble(&claimed, &engine, &listeners).await {
        Ok(api) => api,
        Err(e) => {
            engine.abandon(&claimed).await;
            let _ = cleanup::cleanup(&claimed.dir, &claimed.layout, &claimed.parents);
            return Err(e);
        }
    };
    api.kafka.sync_all(&api).await;
    if let Some(shared) = &api.shared {
        let poll = Duration::from_millis(claimed.config.registry.poll_ms.max(10));
        // The fleet's lambdas are here before /status says ready (and HAProxy routes here).
        let applied = crate::shared_registry::catch_up(&api, shared, 0).await.unwrap_or_else(|e| {
            tracing::warn!("reading the shared registry: {e:#}; following it from the start");
            0
        });
        tokio::spawn(crate::shared_registry::follow(api.clone(), shared.clone(), claimed.config.registry.shared.clone(), poll, applied));
    }
    let own_cpu = join_own_cpu_group(&claimed.config, &claimed.layout, &claimed.parents[0]);
    let c = &claimed.config;
    tracing::info!(
        listen = %c.worker.listen,
        app = %c.app.listen,
        volumes = engine.volumes,
        backends = ?engine.backend.names(),
        auth = c.worker.auth,
        lambdas = api.registry.list().len(),
        cgroups = format!("v{}", claimed.layout.version()),
        "worker ready"
    );
    let served = listeners.serve(api.clone(), signals).await;
    tracing::info!("shutting down");
    api.kafka.stop_all().await; // their messages under way finish first
    api.leases.release_all();
    api.instances.shutdown().await;
    let logs = api.logs.clone();
    tokio::task::spawn_blocking(move || logs.flush()).await.ok();
    drop(api);
    if let Some(own) = own_cpu {
        // Back where it started, so the cleanup below can remove (and never kills) its group.
        if let Err(e) = own.leave() {
            tracing::warn!("leaving the worker's own cpu group: {e}");
        }
    }
    engine.release_networks().await;
    let report = cleanup::cleanup(&claimed.dir, &claimed.layout, &claimed.parents)?;
    tracing::info!(mounts = report.mounts_removed, "worker stopped");
    let _ = fs::remove_file(claimed.dir.join(PID));
    served
}

/// The worker directory, held for the worker's life: resolved once, with its configuration,
/// its lock, its API token and where its cgroups and network live.
pub(super) struct Claimed {
    pub dir: PathBuf,
    pub config: Config,
    pub token: token::Token,
    pub layout: Arc<Layout>,
    /// The worker's cgroup trees (sandboxes first, then runc's).
    pub parents: Vec<String>,
    /// Names the worker's nftables table and host links; seeds its address block.
    pub tag: String,
    pub seed: u32,
    /// Held until the worker is gone: "is a worker running here?" never trusts a stale pid.
    _lock: nix::fcntl::Flock<fs::File>,
}

impl Claimed {
    /// Lock `dir`, write the pid file, read the configuration, check the base image, and
    /// remove what a worker that did not shut down left behind.
    fn claim(dir: &Path) -> Result<Claimed> {
        let dir = fs::canonicalize(dir).with_context(|| format!("{} does not exist; run `sprout worker init` first", dir.display()))?;
        let config = Config::load(&dir)?;
        let lock_file = fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join(LOCK))?;
        let lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| {
            let pid = fs::read_to_string(dir.join(PID)).unwrap_or_default();
            anyhow::anyhow!("a worker is already running in {} (pid {})", dir.display(), pid.trim())
        })?;
        // At once, so `down` never reads a pid file an earlier, killed worker left behind.
        fs::write(dir.join(PID), format!("{}\n", std::process::id()))?;
        if !base::is_ready(&config.base.path, &config.base.suite) {
            bail!("no base image at {}; run `sprout worker init {}`", config.base.path.display(), dir.display());
        }
        let (token, _) = token::ensure_token(&dir)?;
        let layout = Arc::new(detect_layout(&config)?);
        let parents = config.cgroup_parents(&dir);
        let (tag, seed) = config.network_tag(&dir);
        let mut leftovers = cleanup::cleanup(&dir, &layout, &parents)?;
        leftovers.network_removed = network::host::release(&dir, &tag);
        if !leftovers.is_empty() {
            tracing::warn!(?leftovers, "cleaned up after a worker that did not shut down");
        }
        let missing = layout.missing_controllers();
        if !missing.is_empty() {
            tracing::warn!(?missing, "cgroup v{} here lacks these controllers: their limits are not enforced", layout.version());
        }
        Ok(Claimed { dir, config, token, layout, parents, tag, seed, _lock: lock })
    }
}

/// The API's listener and the app port, bound before anything slow starts, and the token
/// published for clients on this machine.
struct Listeners {
    api: TcpListener,
    listening: SocketAddr,
    app: Option<AppPort>,
    /// Removes the published token when dropped.
    discovery: Option<Discovery>,
}

impl Listeners {
    async fn bind(claimed: &Claimed) -> Result<Listeners> {
        let config = &claimed.config;
        let api = TcpListener::bind(&config.worker.listen).await.with_context(|| format!("listening on {}", config.worker.listen))?;
        let listening = api.local_addr()?;
        // Published as soon as the port takes connections: a client that finds the port open
        // finds the token too.
        let discovery = publish_token(config.worker.auth, listening, &claimed.token);
        let app = AppPort::bind(&config.app, claimed.dir.join("sites.json")).await?;
        Ok(Listeners { api, listening, app, discovery })
    }

    /// Serve both until a signal, then finish the requests under way (follow streams end).
    async fn serve(self, api: Api, signals: ShutdownSignals) -> Result<()> {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let logs = api.logs.clone();
        tokio::spawn(async move {
            signals.recv().await;
            logs.close(); // follow streams end, so the listeners can finish
            let _ = stop.send(true);
        });
        let until_stopped = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            }
        };
        let Listeners { api: listener, app, discovery, .. } = self;
        let api_router = router(api.clone());
        let api_served = async {
            axum::serve(listener, api_router.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(until_stopped())
                .await
        };
        let app_served = async {
            match app {
                Some(port) => port.serve(api, until_stopped()).await,
                None => Ok(()),
            }
        };
        let (served, app_served) = tokio::join!(api_served, app_served);
        drop(discovery);
        app_served.context("serving the app port")?;
        served.context("serving HTTP")
    }
}

/// Everything the API serves with, on `engine`: the registry, the logs, the instance
/// manager, the metrics and the one invocation path.
async fn assemble(claimed: &Claimed, engine: &Engine, listeners: &Listeners) -> Result<Api> {
    let (config, dir) = (&claimed.config, claimed.dir.as_path());
    let caps = Caps { max_bytes: config.limits.max_unpacked_mb << 20, max_files: config.limits.max_files };
    let checker = Checker::new(&config.base.path, &config.sandbox.python, config.sandbox.uid, config.sandbox.gid);
    let registry =
        Arc::new(Registry::open(&engine.stage.registry, caps, checker, config.packages.allow_unpinned, engine.isolation.clone())?);
    let logs = Logs::new(config.logs.to_config(dir)).context("opening the lambdas' logs (DIR/logs)")?;
    let provisioning =
        Provisioning { packages: engine.packages.clone(), networks: engine.networks.clone(), isolation: engine.isolation.clone() };
    let instances = Instances::new(engine.backend.clone(), Arc::new(provisioning), instance_config(claimed, engine)?, logs.clone());
    let metrics =
        Arc::new(Metrics::new(engine.backend.clone(), instances.clone(), engine.packages.clone(), engine.networks.clone(), logs.clone()));
    let shared = match config.registry.shared.as_str() {
        "" => None,
        url => Some(Arc::new(crate::shared_registry::SharedRegistry::connect(url).await?)),
    };
    let limits = InvokeLimits { max_body: (config.limits.max_body_mb << 20) as usize, max_invoke_depth: config.limits.max_invoke_depth };
    let invoker = Invoker::new(registry.clone(), instances.clone(), metrics.clone(), logs.clone(), limits);
    Ok(Api {
        registry,
        instances,
        packages: engine.packages.clone(),
        networks: engine.networks.clone(),
        metrics,
        auth: Arc::new(Guard::new(claimed.token.clone(), config.worker.auth, listeners.listening.to_string())),
        invoker,
        leases: crate::lease_routes::LeaseBook::new(engine.leases.clone()),
        blobs: engine.blobs.clone(),
        logs,
        max_upload: (config.limits.max_upload_mb << 20) as usize,
        kafka: Arc::new(crate::kafka::KafkaTriggers::new(dir.join("kafka-failed.jsonl"), Default::default())),
        sites: listeners.app.as_ref().map(AppPort::sites),
        shared,
        routes: (!config.registry.routes_socket.is_empty()).then(|| crate::fleet_routes::FleetRoutes {
            socket: config.registry.routes_socket.clone().into(),
            map: config.registry.routes_map.clone().into(),
        }),
        worker_name: axum::http::HeaderValue::from_str(&config.worker_name(dir)).unwrap_or(axum::http::HeaderValue::from_static("worker")),
    })
}

/// The instance manager's settings from `[instances]`, `[limits]` and `[handler_cache]`.
fn instance_config(claimed: &Claimed, engine: &Engine) -> Result<InstanceConfig> {
    let config = &claimed.config;
    let i = &config.instances;
    Ok(InstanceConfig {
        keep_warm: i.keep_warm,
        idle_timeout: Duration::from_secs(i.idle_timeout_s),
        keep_alive: (i.keep_alive == crate::config::KeepAlive::Histogram)
            .then(|| crate::keepalive::Policy { fixed_keep_alive: Duration::from_secs(i.idle_timeout_s), ..Default::default() }),
        max_per_lambda: i.max_per_lambda,
        queue_depth: i.queue_depth,
        max_total: i.max_total,
        timeout: config.timeout(),
        limits: config.sandbox_limits(),
        handler_cache: HandlerCacheConfig {
            pause: config.handler_cache.pause,
            pause_after: Duration::from_millis(config.handler_cache.pause_after_ms),
            memory_limit: config.handler_cache.memory_mb << 20,
        },
        budget: memory_budget(config, engine.backend.as_ref())?,
        sandbox_estimate: i.sandbox_estimate_mb << 20,
        lambda_cpu_weight: config.limits.cpu_weight,
        long_request: (config.limits.long_request_ms > 0).then(|| Duration::from_millis(config.limits.long_request_ms)),
        preempt_tick: (config.limits.preempt_tick_us > 0).then(|| Duration::from_micros(config.limits.preempt_tick_us)),
        rt_home: claimed.layout.cpu_root_tasks(),
    })
}

/// Weigh the worker's own threads above the lambdas' (`worker.cpu_weight`): on cgroup v1, a
/// group of its own in the cpu hierarchy beside the sandboxes' (its memory stays outside
/// the memory budget). Failing, it stays where it was started, and says so.
fn join_own_cpu_group(config: &Config, layout: &Layout, parent: &str) -> Option<OwnCpuGroup> {
    if config.worker.cpu_weight == 0 {
        return None;
    }
    match layout.join_cpu_group(&format!("{parent}/worker"), config.worker.cpu_weight) {
        Ok(Some(own)) => {
            tracing::info!(
                weight = config.worker.cpu_weight,
                lambda_weight = config.limits.cpu_weight,
                "the worker's threads weigh above any lambda's"
            );
            Some(own)
        }
        Ok(None) => {
            tracing::info!("cgroup v2: the worker stays in its own cgroup (worker.cpu_weight applies on v1)");
            None
        }
        Err(e) => {
            tracing::warn!("the worker could not join a cpu group of its own ({e}); it competes with the sandboxes as started");
            None
        }
    }
}

/// Leave the token where this machine's clients look for it (`/run/sprout/api/<listen>`),
/// when the API needs one; the returned guard removes it again. Without the file, clients
/// still work given `DIR/api-token`, so a failure here only warns.
fn publish_token(required: bool, listening: SocketAddr, api_token: &token::Token) -> Option<Discovery> {
    if !required {
        return None;
    }
    match Discovery::publish(listening, api_token) {
        Ok(published) => Some(published),
        Err(e) => {
            tracing::warn!("{e:#}: clients must be given the token (--token, $SPROUT_TOKEN or DIR/api-token)");
            None
        }
    }
}

/// SIGTERM and SIGINT, caught from when they are installed (one that arrives before
/// [`ShutdownSignals::recv`] is asked for is kept).
struct ShutdownSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> Result<ShutdownSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate()).context("catching SIGTERM")?;
        let int = signal(SignalKind::interrupt()).context("catching SIGINT")?;
        Ok(ShutdownSignals { term, int })
    }

    async fn recv(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
