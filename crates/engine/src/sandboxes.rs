//! The sandboxes' side of the engine, built from its configuration: the mount tree sandboxes
//! are stitched from, the install cache, the back-ends (with their Zygotes) and the lambdas'
//! networks; and taken down again, leaving nothing behind.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use sprout_sandbox::cgroup::{CgroupPool, Layout, Limits};
use sprout_sandbox::gvisor::{GvisorBackend, GvisorConfig};
use sprout_sandbox::import_cache::{ImportCache, ImportCacheConfig, SparePlan};
use sprout_sandbox::network::{self, Network, NetworkConfig};
use sprout_sandbox::runc::{RuncBackend, RuncConfig};
use sprout_sandbox::sock::{LeanConfig, SockBackend};
use sprout_sandbox::stage::{Stage, Volume};
use sprout_sandbox::vm::backend::{VmBackend, VmBackendConfig};
use sprout_sandbox::{cleanup, Backend};

use crate::backends::Backends;
use crate::config::{BackendKind, EngineConfig, GvisorNetwork};
use crate::isolation::Isolation;
use crate::networks::LambdaNetworks;
use crate::packages::install_cache::InstallCache;
use crate::packages::pip::{Installer, InstallerConfig};
use crate::packages::Packages;

/// The host a worker's engine runs on: its directory, and what it owns there, resolved once
/// by the worker that claimed the directory.
pub struct Host {
    pub dir: PathBuf,
    /// This worker's name (configured, or derived from its directory).
    pub name: String,
    pub layout: Arc<Layout>,
    /// The worker's cgroup trees (sandboxes first, then runc's).
    pub parents: Vec<String>,
    /// Names the worker's nftables table and host links; seeds its address block.
    pub tag: String,
    pub seed: u32,
    /// Makes the docker baseline, when this program has it: the Engine API client speaks
    /// HTTP, so it lives above the engine (crates/docker) and the worker hands it in.
    pub docker: Option<Arc<dyn MakeBackend>>,
}

/// A back-end the engine does not build itself, handed in through [`Host`].
#[async_trait]
pub trait MakeBackend: Send + Sync {
    /// Make it (checking that what it needs is there) for worker `worker_name`.
    async fn make(&self, config: &EngineConfig, worker_name: &str, stage: Arc<Stage>) -> Result<Arc<dyn Backend>>;
}

/// What sandboxes are made with.
pub struct Sandboxes {
    pub stage: Arc<Stage>,
    pub packages: Arc<Packages>,
    /// Every back-end the worker runs (one per isolation class), as one.
    pub backend: Arc<Backends>,
    pub isolation: Arc<Isolation>,
    pub networks: Arc<LambdaNetworks>,
    /// How many volumes the configuration binds (the worker's own aside).
    pub volumes: usize,
}

impl Sandboxes {
    /// Build them for `host`, binding `own_volumes` (the worker's own: the leases' files, the
    /// blobs) beside the configured ones in every sandbox; on failure, remove what was made.
    pub async fn start(config: &EngineConfig, host: &Host, own_volumes: Vec<Volume>) -> Result<Sandboxes> {
        let (dir, layout, parents) = (host.dir.as_path(), &host.layout, &host.parents);
        let static_tree = match config.import_cache.tree.as_str() {
            "" => None,
            path => Some(crate::packages::tree::load(Path::new(path))?),
        };
        let cache_dir = config.packages.cache_dir(dir);
        let install_cache = InstallCache::open(&cache_dir).with_context(|| format!("opening the install cache {}", cache_dir.display()))?;
        if config.packages.cache_dir.is_empty() {
            install_cache.sweep(); // ours alone: remove what an interrupted install left
        }
        let mut volumes: Vec<_> = config.sandbox.volumes.iter().map(|v| v.to_volume()).collect();
        for (i, volume) in volumes.iter().enumerate() {
            sprout_sandbox::stage::mount_point_in_base(&config.base.path, &volume.path)
                .with_context(|| format!("sandbox.volumes[{i}].path = {:?}", volume.path))?;
        }
        let configured = volumes.len();
        for volume in own_volumes {
            sprout_sandbox::stage::mount_point_in_base(&config.base.path, &volume.path)
                .with_context(|| format!("making {} in the base image", volume.path))?;
            volumes.push(volume);
        }
        let stage = Stage::prepare_with_volumes(dir, &config.base.path, &install_cache.installed_dir(), &volumes);
        let stage = Arc::new(stage.map_err(|e| {
            let _ = cleanup::cleanup(dir, layout, parents);
            anyhow::anyhow!("preparing the sandboxes' mount tree: {e}")
        })?);
        if config.cgroups.favor_dynmods {
            match layout.favor_dynamic_modifications(&stage.run.join("cgroup-dynmods")) {
                Ok(done) => tracing::info!("{done}: moving sandboxes into their cgroups stays cheap"),
                Err(e) => tracing::warn!("{e}; cold starts may wait for RCU grace periods when requests are sparse"),
            }
        }
        let packages = Arc::new(make_packages(config, install_cache, stage.clone(), layout.clone(), &parents[0]));
        let isolation = Arc::new(Isolation::new(
            config.sandbox.backend,
            &config.isolation.classes,
            config.isolation.lambdas.clone().into_iter().collect(),
        ));
        let backend = match make_backends(config, host, stage.clone(), &isolation).await {
            Ok(b) => b,
            Err(e) => {
                let _ = cleanup::cleanup(dir, layout, parents);
                return Err(e);
            }
        };
        let networks = match make_networks(config, dir, &backend, &isolation, &stage, &host.tag, host.seed).await {
            Ok(n) => Arc::new(n),
            Err(e) => {
                backend.shutdown().await;
                let _ = cleanup::cleanup(dir, layout, parents);
                network::host::release(dir, &host.tag);
                return Err(e);
            }
        };
        if let Some(tree) = static_tree {
            preload_tree(tree, &backend, &packages);
        }
        Ok(Sandboxes { stage, packages, backend, isolation, networks, volumes: configured })
    }

    /// Take down what the engine holds beyond the sandboxes (those go with the instances):
    /// the lambdas' network namespaces; the caller's cleanup removes the rest.
    pub async fn release_networks(&self) {
        let networks = self.networks.clone();
        let removed = tokio::task::spawn_blocking(move || networks.shutdown()).await.unwrap_or_default();
        tracing::debug!(?removed, "network removed");
    }

    /// After a start that failed past the sandboxes: stop the back-end, remove the network.
    pub async fn abandon(&self, host: &Host) {
        self.backend.shutdown().await;
        self.release_networks().await;
        network::host::release(&host.dir, &host.tag);
    }
}

/// The install cache and the installer that fills it.
pub fn make_packages(config: &EngineConfig, cache: InstallCache, stage: Arc<Stage>, layout: Arc<Layout>, cgroup_parent: &str) -> Packages {
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
fn preload_tree(tree: crate::packages::tree::TreeNode, backend: &Arc<Backends>, packages: &Arc<Packages>) {
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

/// The lambdas' networks: with `network.isolate` (and back-ends that can join a lambda's
/// namespace: the lean ones, runc by the namespace's path, gVisor's pods), claim the
/// worker's block, make its table and start the pool of namespaces; then give every sandbox
/// an /etc/hosts naming the services.
async fn make_networks(
    config: &EngineConfig,
    dir: &Path,
    backend: &Arc<Backends>,
    isolation: &Isolation,
    stage: &Arc<Stage>,
    tag: &str,
    seed: u32,
) -> Result<LambdaNetworks> {
    let joins = isolation
        .available()
        .iter()
        .all(|kind| matches!(kind, BackendKind::Sock | BackendKind::SockNoZygote | BackendKind::Runc | BackendKind::Gvisor));
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
                "the {} backend does not isolate lambdas' networks (network.isolate applies to sock, sock-nozygote, runc and gvisor)",
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
pub(crate) fn memory_budget(config: &EngineConfig, backend: &dyn Backend) -> Result<Option<crate::budget::Budget>> {
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

/// A back-end for each isolation class the worker runs, the default first; those started
/// are shut down again if a later one fails.
async fn make_backends(config: &EngineConfig, host: &Host, stage: Arc<Stage>, isolation: &Isolation) -> Result<Arc<Backends>> {
    let mut made: Vec<Arc<dyn Backend>> = Vec::new();
    for kind in isolation.available() {
        match make_backend(config, *kind, host, stage.clone()).await {
            Ok(backend) => made.push(backend),
            Err(e) => {
                for backend in made {
                    backend.shutdown().await;
                }
                return Err(e.context(format!("starting the {} back-end", kind.name())));
            }
        }
    }
    let default = made.remove(0);
    Ok(Arc::new(Backends::new(default, made)))
}

async fn make_backend(config: &EngineConfig, kind: BackendKind, host: &Host, stage: Arc<Stage>) -> Result<Arc<dyn Backend>> {
    let (layout, parents) = (host.layout.clone(), &host.parents);
    let limits = config.limits.sandbox_limits();
    match kind {
        BackendKind::Sock | BackendKind::SockNoZygote => {
            let pool =
                Arc::new(CgroupPool::new(layout.clone(), &parents[0], limits, config.sandbox.cgroup_pool, config.sandbox.cgroup_pool * 4)?);
            let zygote_limits = Limits { memory_bytes: config.sandbox.zygote_memory_mb << 20, pids: 1024, cpus: 0.0 };
            let zygotes = (kind == BackendKind::Sock).then(|| {
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
                        start_timeout: config.sandbox.start_timeout(),
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
                    start_timeout: config.sandbox.start_timeout(),
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
                start_timeout: config.sandbox.start_timeout(),
                max_response: (config.limits.max_response_mb << 20) as u32,
                cgroup_parent: parents[1].clone(),
                cpuset: config.sandbox.cpuset(),
            },
            stage,
        ))),
        BackendKind::Docker => match &host.docker {
            Some(docker) => docker.make(config, &host.name, stage).await,
            None => bail!("this program was built without the docker back-end (crates/docker)"),
        },
        BackendKind::Vm => Ok(Arc::new(VmBackend::new(vm_config(config, &stage).await?, stage))),
        BackendKind::Gvisor => {
            let runsc = match config.gvisor.runsc.as_str() {
                "" => sprout_sandbox::gvisor::runsc::default_binary(),
                path => PathBuf::from(path),
            };
            let backend = GvisorBackend::new(
                GvisorConfig {
                    runsc,
                    uid: config.sandbox.uid,
                    gid: config.sandbox.gid,
                    python: config.sandbox.python.clone(),
                    start_timeout: config.sandbox.start_timeout(),
                    max_response: (config.limits.max_response_mb << 20) as u32,
                    cgroup_parent: parents[1].clone(),
                    cpuset: config.sandbox.cpuset(),
                    spares: config.gvisor.spares,
                    spares_idle: Duration::from_millis(config.gvisor.spares_idle_ms),
                    pod_memory_bytes: config.gvisor.pod_memory_mb << 20,
                    pod_idle: Duration::from_millis(config.gvisor.pod_idle_ms),
                    park_after: (config.gvisor.park_after_ms > 0).then(|| Duration::from_millis(config.gvisor.park_after_ms)),
                    park_disk_bytes: config.gvisor.park_disk_mb << 20,
                    resident_bytes: (config.gvisor.resident_mb > 0).then_some(config.gvisor.resident_mb << 20),
                    background_restore: config.gvisor.background_restore,
                    templates: config.gvisor.templates,
                    created_ahead: config.gvisor.created_ahead,
                    seccomp: config.sandbox.seccomp,
                    host_network: config.gvisor.network == GvisorNetwork::Host,
                },
                stage,
            );
            let version = backend.check().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            tracing::info!(runsc = %version, "gVisor back-end ready");
            Ok(Arc::new(backend))
        }
    }
}

/// The vm back-end's settings, building its guest kernel and root disk first if this
/// machine has none for this version (the kernel takes minutes; `sprout worker init` builds
/// it ahead).
async fn vm_config(config: &EngineConfig, stage: &Stage) -> Result<VmBackendConfig> {
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
        start_timeout: config.sandbox.start_timeout(),
        max_response: (config.limits.max_response_mb << 20) as u32,
    })
}
