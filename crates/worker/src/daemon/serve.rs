//! `sprout worker up`: the running worker, in its stages — claim the directory (its lock, its
//! configuration, read once, and what a dead predecessor left cleaned up), bind the
//! listeners, make the features (leases, blobs, Kafka triggers, the fleet's registry and
//! routes), start the engine with them, assemble the API, serve until SIGTERM or SIGINT, and
//! shut down, leaving nothing behind.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use sprout_sandbox::cgroup::{Layout, OwnCpuGroup};
use sprout_sandbox::{base, cleanup, network};
use tokio::net::TcpListener;

use sprout_api::auth::token;
use sprout_api::{Api, ApiParts, AppPort, Discovery, Guard, Tenants};
use sprout_engine::{Engine, Extensions, Host, LambdaWatcher};
use sprout_fleet::member::{shared_registry, FleetRoutes, SharedRegistry};
use sprout_offload::{Blobs, LeaseBook, LeaseFiles, MapCalls};
use sprout_triggers::KafkaTriggers;

use super::host::{detect_layout, LOCK, PID};
use crate::config::Config;

/// Run the worker in `dir` in the foreground until SIGTERM or SIGINT.
pub async fn serve(dir: &Path) -> Result<()> {
    // Caught from the start: a signal during start-up (or just after "ready", before the
    // listeners run) stops the worker cleanly once it is up, instead of killing it mid-way.
    let signals = ShutdownSignals::install()?;
    let claimed = Claimed::claim(dir)?;
    let listeners = Listeners::bind(&claimed).await?;
    let features = Features::make(&claimed).await?;
    let engine = Engine::start(&claimed.config.engine(), &claimed.host, features.extensions()).await?;
    features.blobs.sweep_in_background();
    let api = assemble(&claimed, engine.clone(), features, &listeners);
    api.kafka.sync_all(&engine).await;
    if let Some(shared) = &api.shared {
        let poll = Duration::from_millis(claimed.config.registry.poll_ms.max(10));
        // The fleet's lambdas are here before /status says ready (and HAProxy routes here).
        let applied = shared_registry::catch_up(&engine, shared, 0).await.unwrap_or_else(|e| {
            tracing::warn!("reading the shared registry: {e:#}; following it from the start");
            0
        });
        tokio::spawn(shared_registry::follow(engine.clone(), shared.clone(), claimed.config.registry.shared.clone(), poll, applied));
    }
    let own_cpu = join_own_cpu_group(&claimed.config, &claimed.host.layout, &claimed.host.parents[0]);
    let c = &claimed.config;
    tracing::info!(
        listen = %c.worker.listen,
        app = %c.app.listen,
        volumes = engine.volumes(),
        backends = ?engine.backend_names(),
        auth = c.worker.auth,
        lambdas = engine.registry.list().len(),
        cgroups = format!("v{}", claimed.host.layout.version()),
        "worker ready"
    );
    let served = listeners.serve(api.clone(), signals).await;
    tracing::info!("shutting down");
    api.kafka.stop_all().await; // their messages under way finish first
    api.leases.release_all();
    engine.shutdown().await;
    drop(api);
    if let Some(own) = own_cpu {
        // Back where it started, so the cleanup below can remove (and never kills) its group.
        if let Err(e) = own.leave() {
            tracing::warn!("leaving the worker's own cpu group: {e}");
        }
    }
    engine.release_networks().await;
    let host = &claimed.host;
    let report = cleanup::cleanup(&host.dir, &host.layout, &host.parents)?;
    tracing::info!(mounts = report.mounts_removed, "worker stopped");
    let _ = fs::remove_file(host.dir.join(PID));
    served
}

/// The worker directory, held for the worker's life: resolved once, with its configuration,
/// its lock, its API token and where its cgroups and network live.
struct Claimed {
    config: Config,
    token: token::Token,
    /// The tenants and their keys (`DIR/tenants.json`).
    tenants: Arc<Tenants>,
    /// The directory and what the worker owns: its cgroups, its network's names.
    host: Host,
    /// Held until the worker is gone: "is a worker running here?" never trusts a stale pid.
    _lock: nix::fcntl::Flock<fs::File>,
}

/// How long a held lock is tried again before it means a running worker: a worker killed a
/// moment ago may have left a child between its fork and its exec (a helper it was starting),
/// which holds the lock's descriptor until it execs.
const LOCK_GRACE: Duration = Duration::from_secs(1);

/// Take `dir`'s worker lock, or say which worker holds it.
fn lock_dir(dir: &Path) -> Result<nix::fcntl::Flock<fs::File>> {
    let deadline = std::time::Instant::now() + LOCK_GRACE;
    let mut lock_file = fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join(LOCK))?;
    loop {
        match nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((file, _)) if std::time::Instant::now() < deadline => {
                lock_file = file;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(_) => {
                let pid = fs::read_to_string(dir.join(PID)).unwrap_or_default();
                bail!("a worker is already running in {} (pid {})", dir.display(), pid.trim());
            }
        }
    }
}

impl Claimed {
    /// Lock `dir`, write the pid file, read the configuration, check the base image, and
    /// remove what a worker that did not shut down left behind.
    fn claim(dir: &Path) -> Result<Claimed> {
        let dir = fs::canonicalize(dir).with_context(|| format!("{} does not exist; run `sprout worker init` first", dir.display()))?;
        let config = Config::load(&dir)?;
        let lock = lock_dir(&dir)?;
        // At once, so `down` never reads a pid file an earlier, killed worker left behind.
        fs::write(dir.join(PID), format!("{}\n", std::process::id()))?;
        if !base::is_ready(&config.base.path, &config.base.suite) {
            bail!("no base image at {}; run `sprout worker init {}`", config.base.path.display(), dir.display());
        }
        let (token, _) = token::ensure_token(&dir)?;
        let tenants = Arc::new(Tenants::open(&dir)?);
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
        let name = config.worker_name(&dir);
        Ok(Claimed {
            config,
            token,
            tenants,
            host: Host { dir, name, layout, parents, tag, seed, docker: Some(Arc::new(super::docker::Docker)) },
            _lock: lock,
        })
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
        let app = AppPort::bind(&config.app, claimed.host.dir.join("sites.json")).await?;
        Ok(Listeners { api, listening, app, discovery })
    }

    /// Serve both until a signal, then finish the requests under way (follow streams end).
    async fn serve(self, api: Api, signals: ShutdownSignals) -> Result<()> {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let logs = api.engine.logs.clone();
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
        let api_served = sprout_api::serve(listener, api.clone(), until_stopped());
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

/// The features built on the engine, made before it starts: they bring it volumes (the
/// leases' files, the blobs), watchers of its lambdas and the runner of handlers' maps.
struct Features {
    leases: Arc<LeaseBook>,
    blobs: Arc<Blobs>,
    lease_files: Arc<LeaseFiles>,
    kafka: Arc<KafkaTriggers>,
    shared: Option<Arc<SharedRegistry>>,
    routes: Option<Arc<FleetRoutes>>,
}

impl Features {
    async fn make(claimed: &Claimed) -> Result<Features> {
        let (config, dir) = (&claimed.config, claimed.host.dir.as_path());
        let shared = match config.registry.shared.as_str() {
            "" => None,
            url => Some(Arc::new(SharedRegistry::connect(url).await?)),
        };
        // The leases' directories and the blobs: volumes of the worker's own.
        let lease_files = Arc::new(LeaseFiles::prepare(dir, config.sandbox.uid, config.sandbox.gid)?);
        let blobs = Arc::new(Blobs::prepare(dir)?);
        let routes = (!config.registry.routes_socket.is_empty()).then(|| {
            Arc::new(FleetRoutes { socket: config.registry.routes_socket.clone().into(), map: config.registry.routes_map.clone().into() })
        });
        Ok(Features {
            leases: LeaseBook::new(lease_files.clone()),
            blobs,
            lease_files,
            kafka: Arc::new(KafkaTriggers::new(dir.join("kafka-failed.jsonl"), Default::default())),
            shared,
            routes,
        })
    }

    /// What the engine is given of them.
    fn extensions(&self) -> Extensions {
        let mut watchers: Vec<Arc<dyn LambdaWatcher>> = vec![self.leases.clone(), self.kafka.clone()];
        watchers.extend(self.routes.clone().map(|r| r as Arc<dyn LambdaWatcher>));
        Extensions { volumes: vec![self.lease_files.volume(), self.blobs.volume()], watchers, batches: Some(Arc::new(MapCalls)) }
    }
}

/// The API, on the engine and the features.
fn assemble(claimed: &Claimed, engine: Arc<Engine>, features: Features, listeners: &Listeners) -> Api {
    let config = &claimed.config;
    let worker_name = claimed.host.name.as_str();
    engine.invoker.set_call_policy(claimed.tenants.clone());
    engine.logs.set_groups(claimed.tenants.clone());
    let usage = Arc::new(sprout_api::quotas::Usage::new(config.limits.memory_mb));
    engine
        .instances
        .set_cpu_yield(Arc::new(sprout_api::tenant_policies::QuotaYield { tenants: claimed.tenants.clone(), usage: usage.clone() }));
    Api::new(ApiParts {
        engine,
        auth: Arc::new(Guard::new(claimed.token.clone(), config.worker.auth, listeners.listening.to_string(), claimed.tenants.clone())),
        audit: Arc::new(sprout_api::audit::AuditLog::open(&claimed.host.dir)),
        usage,
        leases: features.leases,
        blobs: features.blobs,
        blob_owners: Default::default(),
        max_upload: (config.limits.max_upload_mb << 20) as usize,
        kafka: features.kafka,
        sites: listeners.app.as_ref().map(AppPort::sites),
        shared: features.shared,
        worker_name: sprout_api::http::worker_name_header(worker_name),
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
            idle_output_threads(layout, parent);
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

/// The threads that read the sandboxes' output and write the logs run on CPU time no other
/// group wants (an idle group beside the worker's), so a lambda flooding its output slows
/// itself, its pipe filling, rather than its neighbours. A request's own output is still taken
/// at its end by the thread serving it. They go back with the worker when it leaves its group.
fn idle_output_threads(layout: &Layout, parent: &str) {
    if let Err(e) = sprout_sandbox::output::start_poller() {
        tracing::warn!("starting the sandboxes' output reader: {e}");
        return;
    }
    const THREADS: [&str; 2] = ["sprout-output", "sprout-logs"];
    let group = format!("{parent}/worker-output");
    // A thread names itself once it runs: one just started may not be found at once.
    for _ in 0..50 {
        match layout.idle_threads(&group, &THREADS) {
            Ok(moved) if moved < THREADS.len() => std::thread::sleep(Duration::from_millis(2)),
            Ok(moved) => return tracing::info!(threads = moved, "the output reader and the log writer run on idle CPU time"),
            Err(e) => return tracing::warn!("the output reader and the log writer stay in the worker's group: {e}"),
        }
    }
    tracing::warn!("the output reader or the log writer was not found; it stays in the worker's group");
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
