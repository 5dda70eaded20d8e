//! The worker's life cycle: `init` (config, API token and base image), `serve` (the running
//! worker), `up --detach`, `down`, `status` and `cleanup`.
//!
//! A running worker holds an exclusive lock on `DIR/worker.lock` for its whole life. The lock
//! dies with the process however it ends, so "is a worker running here?" never trusts a stale
//! pid file, and `serve` can always clean up what a killed predecessor left before starting.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sprout_sandbox::cgroup::{CgroupPool, Layout, Limits};
use sprout_sandbox::docker::{DockerBackend, DockerConfig};
use sprout_sandbox::import_cache::{ImportCache, ImportCacheConfig, SparePlan};
use sprout_sandbox::network::{self, Network, NetworkConfig};
use sprout_sandbox::runc::{RuncBackend, RuncConfig};
use sprout_sandbox::sock::{LeanConfig, SockBackend};
use sprout_sandbox::stage::Stage;
use sprout_sandbox::vm::backend::{VmBackend, VmBackendConfig};
use sprout_sandbox::{base, cleanup, Backend};

use crate::api::{router, Api};
use crate::app::AppPort;
use crate::archive::Caps;
use crate::auth::{token, Discovery, Guard};
use crate::config::{BackendKind, Config, TEMPLATE};
use crate::handler_cache::HandlerCacheConfig;
use crate::instances::{InstanceConfig, Instances, Provisioning};
use crate::metrics::Metrics;
use crate::networks::LambdaNetworks;
use crate::packages::install_cache::InstallCache;
use crate::packages::pip::{Installer, InstallerConfig};
use crate::packages::Packages;
use crate::registry::Registry;
use crate::syntax::Checker;

pub use sprout_sandbox::base::Outcome as InitOutcome;

const LOCK: &str = "worker.lock";
const PID: &str = "worker.pid";
pub const LOG: &str = "worker.log";

/// Write `DIR/config.toml` and `DIR/api-token` (unless present) and make sure the base image
/// exists.
pub fn init(dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<InitOutcome> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let config_path = dir.join("config.toml");
    if !config_path.exists() {
        fs::write(&config_path, TEMPLATE)?;
        progress(&format!("wrote {}", config_path.display()));
    } else {
        progress(&format!("keeping {}", config_path.display()));
    }
    let config = Config::load(dir)?;
    if token::ensure_token(dir)?.1 {
        progress(&format!("wrote {} (the API token)", token::token_path(dir).display()));
    }
    for sub in ["registry", "packages"] {
        fs::create_dir_all(dir.join(sub))?;
    }
    let mirror = (!config.base.mirror.is_empty()).then_some(config.base.mirror.as_str());
    let outcome = base::ensure(&config.base.path, &config.base.suite, mirror, progress)?;
    // The microVMs' kernel, on machines that can run them (or configured to).
    if Path::new("/dev/kvm").exists() || config.sandbox.backend == BackendKind::Vm {
        match sprout_sandbox::vm::kernel::ensure(&config.vm.dir, progress)? {
            (kernel, sprout_sandbox::vm::kernel::Outcome::Built(t)) => {
                progress(&format!("guest kernel built in {:.0} s: {}", t.as_secs_f64(), kernel.vmlinux.display()))
            }
            (kernel, _) => progress(&format!("guest kernel ready (reused): {}", kernel.vmlinux.display())),
        }
    }
    Ok(outcome)
}

/// Whether a worker holds `dir`'s lock; returns its pid when it does.
pub fn running_pid(dir: &Path) -> Option<u32> {
    let file = fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join(LOCK)).ok()?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(_unlocked_on_drop) => None,
        Err(_) => Some(fs::read_to_string(dir.join(PID)).ok()?.trim().parse().unwrap_or(0)),
    }
}

/// What `status` reports.
#[derive(Debug, Serialize)]
pub struct Status {
    pub running: bool,
    pub pid: Option<u32>,
    pub listen: String,
    pub backend: &'static str,
    pub ready: bool,
}

pub fn status(dir: &Path) -> Result<Status> {
    let config = Config::load(dir)?;
    let pid = running_pid(dir);
    let ready = pid.is_some() && http_ready(&config.worker.listen);
    Ok(Status { running: pid.is_some(), pid, listen: config.worker.listen, backend: config.sandbox.backend.name(), ready })
}

fn http_ready(listen: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(addr) = listen.parse::<SocketAddr>() else {
        return false;
    };
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /status HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200") && out.ends_with("ready\n")
}

/// Start `exe worker up DIR` in the background, logging to DIR/worker.log; returns once it
/// answers /status, or with the log's tail if it died.
pub fn up_detached(dir: &Path, exe: &Path) -> Result<u32> {
    if let Some(pid) = running_pid(dir) {
        bail!("a worker is already running in {} (pid {pid})", dir.display());
    }
    let config = Config::load(dir)?;
    let log = fs::OpenOptions::new().create(true).append(true).open(dir.join(LOG))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["worker", "up"]).arg(dir).stdin(std::process::Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // SAFETY: the pre_exec closure runs in the forked child before exec and only calls setsid,
    // which is async-signal-safe; it captures nothing and allocates nothing.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait()? {
            let log = fs::read_to_string(dir.join(LOG)).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("the worker exited during start-up ({status}):\n{}", tail.join("\n"));
        }
        if http_ready(&config.worker.listen) {
            return Ok(child.id());
        }
        if Instant::now() > deadline {
            bail!("the worker did not become ready within 120 s; see {}", dir.join(LOG).display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stop the worker in `dir`: SIGTERM, then SIGKILL and a cleanup if it does not finish.
/// Returns false when no worker was running.
pub fn down(dir: &Path, grace: Duration) -> Result<bool> {
    let Some(pid) = running_pid(dir) else {
        return Ok(false);
    };
    let Some(pid) = i32::try_from(pid).ok().filter(|p| *p > 0) else {
        bail!("a worker holds {} but its pid file holds no process id ({pid})", dir.join(LOCK).display());
    };
    // SAFETY: kill takes two integers and touches no memory of ours; `pid` is the locked
    // worker's, read from its pid file and checked positive above (never a process group).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while running_pid(dir).is_some() {
        if Instant::now() > deadline {
            tracing::warn!("the worker did not stop within {grace:?}; killing it");
            // SAFETY: as above, kill takes only integers; `pid` is the same non-zero worker pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            std::thread::sleep(Duration::from_millis(200));
            cleanup_dir(dir)?;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(true)
}

/// Remove what a dead worker left in `dir`; refuses while a worker is running there.
pub fn cleanup_dir(dir: &Path) -> Result<cleanup::Report> {
    if let Some(pid) = running_pid(dir) {
        bail!("a worker is running in {} (pid {pid}); stop it with `sprout worker down`", dir.display());
    }
    let config = Config::load(dir)?;
    let layout = detect_layout(&config)?;
    let mut report = cleanup::cleanup(dir, &layout, &config.cgroup_parents(dir))?;
    report.network_removed = network::host::release(dir, &config.network_tag(dir).0);
    if config.sandbox.backend == BackendKind::Docker && config.docker.socket.exists() {
        let docker = DockerBackend::new(docker_config(&config, dir), Arc::new(Stage::paths(dir)));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        report.processes_killed += rt.block_on(docker.remove_leftovers());
    }
    let _ = fs::remove_file(dir.join(PID));
    if let (Ok(listen), Ok(token)) = (config.worker.listen.parse(), token::read_token(dir)) {
        token::withdraw(listen, &token);
    }
    Ok(report)
}

fn detect_layout(config: &Config) -> Result<Layout> {
    let v2_root = (!config.cgroups.v2_root.is_empty()).then(|| PathBuf::from(&config.cgroups.v2_root));
    Ok(Layout::detect(config.cgroups.version, v2_root.as_deref())?)
}

/// Run the worker in the foreground until SIGTERM or SIGINT.
pub async fn serve(dir: &Path) -> Result<()> {
    let dir = fs::canonicalize(dir).with_context(|| format!("{} does not exist; run `sprout worker init` first", dir.display()))?;
    let config = Config::load(&dir)?;
    let lock_file = fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join(LOCK))?;
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| {
        let pid = fs::read_to_string(dir.join(PID)).unwrap_or_default();
        anyhow::anyhow!("a worker is already running in {} (pid {})", dir.display(), pid.trim())
    })?;
    // At once, so `down` never reads a pid file an earlier, killed worker left behind.
    fs::write(dir.join(PID), format!("{}\n", std::process::id()))?;
    if !base::is_ready(&config.base.path, &config.base.suite) {
        bail!("no base image at {}; run `sprout worker init {}`", config.base.path.display(), dir.display());
    }
    let (api_token, _) = token::ensure_token(&dir)?;
    let static_tree = match config.import_cache.tree.as_str() {
        "" => None,
        path => Some(crate::packages::tree::load(Path::new(path))?),
    };
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
    let listener =
        tokio::net::TcpListener::bind(&config.worker.listen).await.with_context(|| format!("listening on {}", config.worker.listen))?;
    let listening = listener.local_addr()?;
    // Published as soon as the port takes connections: a client that finds the port open
    // finds the token too.
    let discovery = publish_token(config.worker.auth, listening, &api_token);
    let app_port = AppPort::bind(&config.app, dir.join("sites.json")).await?;
    let install_cache = InstallCache::open(&config.package_cache_dir(&dir))
        .with_context(|| format!("opening the install cache {}", config.package_cache_dir(&dir).display()))?;
    if config.packages.cache_dir.is_empty() {
        install_cache.sweep(); // ours alone: remove what an interrupted install left
    }
    let volumes: Vec<_> = config.sandbox.volumes.iter().map(|v| v.to_volume()).collect();
    for (i, volume) in volumes.iter().enumerate() {
        sprout_sandbox::stage::mount_point_in_base(&config.base.path, &volume.path)
            .with_context(|| format!("sandbox.volumes[{i}].path = {:?}", volume.path))?;
    }
    let stage = Stage::prepare_with_volumes(&dir, &config.base.path, &install_cache.installed_dir(), &volumes);
    let stage = Arc::new(stage.map_err(|e| {
        let _ = cleanup::cleanup(&dir, &layout, &parents);
        anyhow::anyhow!("preparing the sandboxes' mount tree: {e}")
    })?);
    if config.cgroups.favor_dynmods {
        match layout.favor_dynamic_modifications(&stage.run.join("cgroup-dynmods")) {
            Ok(done) => tracing::info!("{done}: moving sandboxes into their cgroups stays cheap"),
            Err(e) => tracing::warn!("{e}; cold starts may wait for RCU grace periods when requests are sparse"),
        }
    }
    let packages = Arc::new(make_packages(&config, install_cache, stage.clone(), layout.clone(), &parents[0]));
    let backend = match make_backend(&config, &dir, layout.clone(), &parents, stage.clone()).await {
        Ok(b) => b,
        Err(e) => {
            let _ = cleanup::cleanup(&dir, &layout, &parents);
            return Err(e);
        }
    };
    let networks = match make_networks(&config, &dir, &backend, &stage, &tag, seed).await {
        Ok(n) => Arc::new(n),
        Err(e) => {
            backend.shutdown().await;
            let _ = cleanup::cleanup(&dir, &layout, &parents);
            network::host::release(&dir, &tag);
            return Err(e);
        }
    };
    if let Some(tree) = static_tree {
        preload_tree(tree, &backend, &packages);
    }
    let caps = Caps { max_bytes: config.limits.max_unpacked_mb << 20, max_files: config.limits.max_files };
    let checker = Checker::new(&config.base.path, &config.sandbox.python, config.sandbox.uid, config.sandbox.gid);
    let registry = Arc::new(Registry::open(&stage.registry, caps, checker, config.packages.allow_unpinned)?);
    let provisioning = Provisioning { packages: packages.clone(), networks: networks.clone() };
    let instances = Instances::new(
        backend.clone(),
        Arc::new(provisioning),
        InstanceConfig {
            keep_warm: config.instances.keep_warm,
            idle_timeout: Duration::from_secs(config.instances.idle_timeout_s),
            keep_alive: (config.instances.keep_alive == crate::config::KeepAlive::Histogram).then(|| crate::keepalive::Policy {
                fixed_keep_alive: Duration::from_secs(config.instances.idle_timeout_s),
                ..Default::default()
            }),
            max_per_lambda: config.instances.max_per_lambda,
            queue_depth: config.instances.queue_depth,
            max_total: config.instances.max_total,
            timeout: config.timeout(),
            limits: config.sandbox_limits(),
            handler_cache: HandlerCacheConfig {
                pause: config.handler_cache.pause,
                pause_after: Duration::from_millis(config.handler_cache.pause_after_ms),
                memory_limit: config.handler_cache.memory_mb << 20,
            },
            budget: memory_budget(&config, backend.as_ref())?,
            sandbox_estimate: config.instances.sandbox_estimate_mb << 20,
        },
    );
    let metrics = Arc::new(Metrics::new(backend.clone(), instances.clone(), packages.clone(), networks.clone()));
    let shared = match config.registry.shared.as_str() {
        "" => None,
        url => Some(Arc::new(crate::shared_registry::SharedRegistry::connect(url).await?)),
    };
    let api = Api {
        registry: registry.clone(),
        instances: instances.clone(),
        packages,
        networks: networks.clone(),
        metrics,
        auth: Arc::new(Guard::new(api_token.clone(), config.worker.auth, listening.to_string())),
        max_body: (config.limits.max_body_mb << 20) as usize,
        max_upload: (config.limits.max_upload_mb << 20) as usize,
        max_invoke_depth: config.limits.max_invoke_depth,
        kafka: Arc::new(crate::kafka::KafkaTriggers::new(dir.join("kafka-failed.jsonl"), Default::default())),
        sites: app_port.as_ref().map(AppPort::sites),
        shared: shared.clone(),
        routes: (!config.registry.routes_socket.is_empty()).then(|| crate::fleet_routes::FleetRoutes {
            socket: config.registry.routes_socket.clone().into(),
            map: config.registry.routes_map.clone().into(),
        }),
        worker_name: axum::http::HeaderValue::from_str(&config.worker_name(&dir)).unwrap_or(axum::http::HeaderValue::from_static("worker")),
    };
    api.kafka.sync_all(&api).await;
    if let Some(shared) = &shared {
        let poll = Duration::from_millis(config.registry.poll_ms.max(10));
        tokio::spawn(crate::shared_registry::follow(api.clone(), shared.clone(), config.registry.shared.clone(), poll));
    }
    tracing::info!(
        listen = %config.worker.listen,
        app = %config.app.listen,
        volumes = volumes.len(),
        backend = backend.name(),
        auth = config.worker.auth,
        lambdas = registry.list().len(),
        cgroups = format!("v{}", layout.version()),
        "worker ready"
    );
    // One signal stops both listeners.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let until_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let api_router = router(api.clone());
    let kafka = api.kafka.clone();
    let api_served = async {
        axum::serve(listener, api_router.into_make_service_with_connect_info::<SocketAddr>()).with_graceful_shutdown(until_stopped()).await
    };
    let app_served = async {
        match app_port {
            Some(port) => port.serve(api, until_stopped()).await,
            None => Ok(()),
        }
    };
    let (served, app_served) = tokio::join!(api_served, app_served);
    drop(discovery);
    tracing::info!("shutting down");
    kafka.stop_all().await; // their messages under way finish first
    instances.shutdown().await;
    drop(registry);
    let removed = tokio::task::spawn_blocking(move || networks.shutdown()).await.unwrap_or_default();
    tracing::debug!(?removed, "network removed");
    let report = cleanup::cleanup(&dir, &layout, &parents)?;
    tracing::info!(mounts = report.mounts_removed, "worker stopped");
    let _ = fs::remove_file(dir.join(PID));
    app_served.context("serving the app port")?;
    served.context("serving HTTP")
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

/// The install cache and the installer that fills it.
pub fn make_packages(config: &Config, cache: InstallCache, stage: Arc<Stage>, layout: Arc<Layout>, cgroup_parent: &str) -> Packages {
    let p = &config.packages;
    let installer = Installer::new(
        stage,
        layout,
        cgroup_parent.to_string(),
        InstallerConfig {
            python: config.sandbox.python.clone(),
            uid: config.sandbox.uid,
            gid: config.sandbox.gid,
            index_url: p.index_url.clone(),
            extra_index_url: p.extra_index_url.clone(),
            wheel_dir: (!p.wheel_dir.is_empty()).then(|| PathBuf::from(&p.wheel_dir)),
            offline: p.offline,
            timeout: Duration::from_secs(p.install_timeout_s),
            limits: Limits { memory_bytes: p.install_memory_mb << 20, pids: p.install_pids, cpus: 0.0 },
        },
    );
    Packages::new(cache, installer, p.install_cache, p.allow_unpinned, config.sandbox.uid, config.sandbox.gid)
}

/// Make the configured static Zygote tree in the background (its packages may take a while
/// to install). The file was checked before the worker started anything.
fn preload_tree(tree: crate::packages::tree::TreeNode, backend: &Arc<dyn Backend>, packages: &Arc<Packages>) {
    let Some(cache) = backend.import_cache() else {
        tracing::warn!("import_cache.tree is set but the {} backend has no Zygotes", backend.name());
        return;
    };
    let packages = packages.clone();
    tokio::spawn(async move {
        match crate::packages::tree::resolve(&tree, &packages).await {
            Ok(nodes) => {
                cache.preload(&nodes).await;
                tracing::info!("static Zygote tree made");
            }
            Err(e) => tracing::error!("the static Zygote tree could not be made: {e:#}"),
        }
    });
}

/// The lambdas' networks: with `network.isolate` (and a back-end that can join a lambda's
/// namespace: the lean ones, and runc by the namespace's path), claim the worker's
/// block, make its table and start the pool of namespaces; then give every sandbox an
/// /etc/hosts naming the services.
async fn make_networks(
    config: &Config,
    dir: &Path,
    backend: &Arc<dyn Backend>,
    stage: &Arc<Stage>,
    tag: &str,
    seed: u32,
) -> Result<LambdaNetworks> {
    let joins = matches!(config.sandbox.backend, BackendKind::Sock | BackendKind::SockNoZygote | BackendKind::Runc);
    let specs = config.network.services();
    let networks = if config.network.isolate && joins {
        let cfg = NetworkConfig {
            tag: tag.to_string(),
            subnet: config.network.block(),
            seed,
            services: specs,
            pool: config.network.pool,
            max_namespaces: config.network.max_namespaces,
            max_connections: config.network.max_connections,
        };
        let owner = backend.import_cache().and_then(|c| c.package_userns());
        let dir = dir.to_path_buf();
        let network = tokio::task::spawn_blocking(move || Network::start(&dir, cfg, owner))
            .await?
            .context("isolating the sandboxes' network (network.isolate = false turns it off)")?;
        tracing::info!(block = %network.block, services = network.services().len(), "each lambda gets a network namespace of its own");
        LambdaNetworks::new(Some(network), Vec::new(), config.network.max_namespaces - config.network.pool)
    } else {
        if config.network.isolate {
            tracing::warn!(
                "the {} backend does not isolate lambdas' networks (network.isolate applies to sock, sock-nozygote and runc)",
                config.sandbox.backend.name()
            );
        } else {
            tracing::warn!(
                "network.isolate = false: sandboxes share the host's network and can reach the worker's API and every host service"
            );
        }
        let services = specs.iter().map(|s| s.at(*s.target.ip())).collect();
        LambdaNetworks::new(None, services, config.network.max_namespaces)
    };
    let hosts = dir.join("sandbox-hosts");
    std::fs::write(&hosts, network::hosts_file(&networks.services()))?;
    stage.bind_file_in_base(&config.base.path, &hosts, "/etc/hosts").context("binding /etc/hosts for the sandboxes")?;
    Ok(networks)
}

/// The whole worker's memory budget, when one is set, enforced as the memory limit of the
/// cgroup holding everything the back-end runs.
fn memory_budget(config: &Config, backend: &dyn Backend) -> Result<Option<crate::budget::Budget>> {
    let mb = config.instances.memory_budget_mb;
    if mb == 0 {
        return Ok(None);
    }
    let Some((layout, group)) = backend.memory_group() else {
        tracing::warn!(backend = backend.name(), "instances.memory_budget_mb applies to the sock back-ends only; ignored");
        return Ok(None);
    };
    layout.set_memory_limit(&group, mb << 20).with_context(|| format!("limiting the memory of cgroup {group} to {mb} MiB"))?;
    tracing::info!(budget_mb = mb, cgroup = %group, "memory budget in force");
    Ok(Some(crate::budget::Budget::new(mb << 20)))
}

async fn make_backend(config: &Config, dir: &Path, layout: Arc<Layout>, parents: &[String], stage: Arc<Stage>) -> Result<Arc<dyn Backend>> {
    let limits = config.sandbox_limits();
    match config.sandbox.backend {
        BackendKind::Sock | BackendKind::SockNoZygote => {
            let pool =
                Arc::new(CgroupPool::new(layout.clone(), &parents[0], limits, config.sandbox.cgroup_pool, config.sandbox.cgroup_pool * 4)?);
            let zygote_limits = Limits { memory_bytes: config.sandbox.zygote_memory_mb << 20, pids: 1024, cpus: 0.0 };
            let zygotes = (config.sandbox.backend == BackendKind::Sock).then(|| {
                let ic = &config.import_cache;
                ImportCache::new(
                    ImportCacheConfig {
                        enabled: ic.enabled,
                        memory_limit: ic.memory_mb << 20,
                        window: Duration::from_secs(ic.window_s),
                        max_depth: ic.max_depth,
                        learn: ic.learn_imports,
                        zygote_uid: ic.zygote_uid,
                        zygote_gid: ic.zygote_gid,
                        uid: config.sandbox.uid,
                        gid: config.sandbox.gid,
                        python: config.sandbox.python.clone(),
                        start_timeout: config.start_timeout(),
                        import_timeout: Duration::from_millis(ic.import_timeout_ms),
                        zygote_limits,
                        spares: SparePlan::new(config.sandbox.spares),
                        isolate_network: config.network.isolate,
                        seccomp: config.sandbox.seccomp,
                    },
                    stage.clone(),
                    layout,
                    &parents[0],
                )
            });
            let backend = SockBackend::new(
                LeanConfig {
                    uid: config.sandbox.uid,
                    gid: config.sandbox.gid,
                    mount_proc: config.sandbox.mount_proc,
                    scratch_mb: config.sandbox.scratch_mb,
                    python: config.sandbox.python.clone(),
                    start_timeout: config.start_timeout(),
                    max_response: (config.limits.max_response_mb << 20) as u32,
                    zygote_limits,
                    seccomp: config.sandbox.seccomp,
                },
                stage,
                pool,
                zygotes,
            );
            backend.start().await.map_err(|e| anyhow::anyhow!("starting the root Zygote: {e}"))?;
            Ok(Arc::new(backend))
        }
        BackendKind::Runc => Ok(Arc::new(RuncBackend::new(
            RuncConfig {
                binary: config.runc.binary.clone(),
                uid: config.sandbox.uid,
                gid: config.sandbox.gid,
                python: config.sandbox.python.clone(),
                start_timeout: config.start_timeout(),
                max_response: (config.limits.max_response_mb << 20) as u32,
                cgroup_parent: parents[1].clone(),
                cpuset: config.cpuset(),
            },
            stage,
        ))),
        BackendKind::Docker => {
            let backend = DockerBackend::new(docker_config(config, dir), stage);
            backend.prepare().await?;
            Ok(Arc::new(backend))
        }
        BackendKind::Vm => Ok(Arc::new(VmBackend::new(vm_config(config, &stage).await?, stage))),
    }
}

/// The vm back-end's settings, building its guest kernel and root disk first if this
/// machine has none for this version (the kernel takes minutes; `sprout worker init` builds
/// it ahead).
async fn vm_config(config: &Config, stage: &Stage) -> Result<VmBackendConfig> {
    use sprout_sandbox::vm::KvmHost;
    match sprout_sandbox::vm::kvm_host() {
        KvmHost::Hardware => {}
        KvmHost::Missing => {
            bail!("the vm back-end needs KVM, and /dev/kvm cannot be opened here (no hardware virtualization, or no permission)")
        }
        KvmHost::Pvm => bail!(
            "the vm back-end needs hardware virtualization (VT-x or AMD-V); this host's KVM is PVM (the kvm_pvm module), \
             which runs only guest kernels built for PVM, not the stock Linux guest this back-end boots (docs/vm.md)"
        ),
    }
    let (dir, base, runtime) = (config.vm.dir.clone(), config.base.path.clone(), stage.runtime.clone());
    let (kernel, root_disk) = tokio::task::spawn_blocking(move || -> Result<(PathBuf, PathBuf)> {
        let mut say = |line: &str| tracing::info!("{line}");
        let (kernel, _) = sprout_sandbox::vm::kernel::ensure(&dir, &mut say)?;
        let (disk, _) = sprout_sandbox::vm::rootfs::ensure(&dir, &base, Some(&runtime), &mut say)?;
        Ok((kernel.vmlinux, disk))
    })
    .await??;
    let vmm = match config.vm.vmm.as_str() {
        "" => std::env::current_exe()?.with_file_name("sprout-vmm"),
        path => PathBuf::from(path),
    };
    Ok(VmBackendConfig {
        vmm,
        kernel,
        root_disk,
        python: config.sandbox.python.clone(),
        start_timeout: config.start_timeout(),
        max_response: (config.limits.max_response_mb << 20) as u32,
    })
}

fn docker_config(config: &Config, dir: &Path) -> DockerConfig {
    DockerConfig {
        socket: config.docker.socket.clone(),
        image: config.docker.image.clone(),
        base_image: config.base.path.clone(),
        worker_label: config.worker_name(dir),
        uid: config.sandbox.uid,
        gid: config.sandbox.gid,
        python: config.sandbox.python.clone(),
        start_timeout: config.start_timeout(),
        max_response: (config.limits.max_response_mb << 20) as u32,
        cpuset: config.cpuset(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
