//! The engine as one: everything a request needs once the worker's directory is claimed — the
//! registry, the instance manager, the packages, the networks, the logs, the metrics and the
//! one invocation path — started from its configuration, told of lambdas that arrive and go
//! (and telling the features built on it, its [`LambdaWatcher`]s), and shut down.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;
use sprout_sandbox::cleanup;
use sprout_sandbox::stage::Volume;

use crate::config::{EngineConfig, KeepAlive};
use crate::handler_cache::HandlerCacheConfig;
use crate::instances::{InstanceConfig, Instances, Provisioning};
use crate::invoker::{BatchCalls, InvokeLimits, Invoker};
use crate::logs::{LogConfig, Logs};
use crate::metrics::Metrics;
use crate::networks::LambdaNetworks;
use crate::packages::Packages;
use crate::registry::{Caps, Checker, Lambda, Registry};
use crate::sandboxes::{memory_budget, Host, Sandboxes};

/// Where a change of a lambda came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This worker's API: it took the upload or the deletion.
    Api,
    /// The fleet's shared registry, applied here.
    Fleet,
}

/// A feature built on the engine that keeps something per lambda (Kafka consumers, user
/// leases, a fleet's routes): told when a lambda arrives or goes, whichever way it did.
#[async_trait]
pub trait LambdaWatcher: Send + Sync {
    /// `lambda` (a new version of one) arrived. Called on the runtime: must not block (start
    /// a task for slow work).
    fn arrived(self: Arc<Self>, engine: &Arc<Engine>, lambda: &Arc<Lambda>, origin: Origin);
    /// The lambda named `name` was deleted here.
    async fn removed(&self, engine: &Arc<Engine>, name: &str, origin: Origin);
}

/// What the features built on the engine bring to it when it starts.
#[derive(Default)]
pub struct Extensions {
    /// Host directories of the worker's own that every sandbox sees (the leases' files, the
    /// blobs), beside the configured volumes.
    pub volumes: Vec<Volume>,
    /// Told of every lambda that arrives or goes.
    pub watchers: Vec<Arc<dyn LambdaWatcher>>,
    /// Runs handlers' batch calls (maps); None: refused.
    pub batches: Option<Arc<dyn BatchCalls>>,
}

/// The engine a worker serves with.
pub struct Engine {
    pub registry: Arc<Registry>,
    pub instances: Arc<Instances>,
    pub packages: Arc<Packages>,
    /// The lambdas' network namespaces (a deleted lambda's goes with its last sandbox).
    pub networks: Arc<LambdaNetworks>,
    pub metrics: Arc<Metrics>,
    /// The one path every invocation takes.
    pub invoker: Arc<Invoker>,
    /// The lambdas' logs.
    pub logs: Arc<Logs>,
    sandboxes: Sandboxes,
    watchers: Vec<Arc<dyn LambdaWatcher>>,
}

impl Engine {
    /// Start the engine on `host`: the sandboxes (mount tree, install cache, back-ends,
    /// networks), then the registry (the lambdas kept in `DIR/registry`), the logs, the
    /// instance manager, the metrics and the invoker. On failure, what was made is removed.
    pub async fn start(config: &EngineConfig, host: &Host, extensions: Extensions) -> Result<Arc<Engine>> {
        let Extensions { volumes, watchers, batches } = extensions;
        let sandboxes = Sandboxes::start(config, host, volumes).await?;
        match Engine::assemble(config, host, sandboxes, watchers, batches) {
            Ok(engine) => Ok(engine),
            Err((e, sandboxes)) => {
                sandboxes.abandon(host).await;
                let _ = cleanup::cleanup(&host.dir, &host.layout, &host.parents);
                Err(e)
            }
        }
    }

    fn assemble(
        config: &EngineConfig,
        host: &Host,
        sandboxes: Sandboxes,
        watchers: Vec<Arc<dyn LambdaWatcher>>,
        batches: Option<Arc<dyn BatchCalls>>,
    ) -> Result<Arc<Engine>, (anyhow::Error, Sandboxes)> {
        let parts = (|| -> Result<_> {
            let caps = Caps { max_bytes: config.limits.max_unpacked_mb << 20, max_files: config.limits.max_files };
            let checker = Checker::new(&config.base.path, &config.sandbox.python, config.sandbox.uid, config.sandbox.gid);
            let isolation = sandboxes.isolation.clone();
            let registry = Registry::open(&sandboxes.stage.registry, caps, checker, config.packages.allow_unpinned, isolation)?;
            let logs = Logs::new(LogConfig::from_section(&config.logs, &host.dir)).context("opening the lambdas' logs (DIR/logs)")?;
            let instance_config = instance_config(config, host, &sandboxes)?;
            Ok((Arc::new(registry), logs, instance_config))
        })();
        let (registry, logs, instance_config) = match parts {
            Ok(parts) => parts,
            Err(e) => return Err((e, sandboxes)),
        };
        let provisioning = Provisioning {
            packages: sandboxes.packages.clone(),
            networks: sandboxes.networks.clone(),
            isolation: sandboxes.isolation.clone(),
        };
        let backend = sandboxes.backend.clone();
        let instances = Instances::new(backend.clone(), Arc::new(provisioning), instance_config, logs.clone());
        let (packages, networks) = (sandboxes.packages.clone(), sandboxes.networks.clone());
        let metrics = Arc::new(Metrics::new(backend, instances.clone(), packages.clone(), networks.clone(), logs.clone()));
        let limits =
            InvokeLimits { max_body: (config.limits.max_body_mb << 20) as usize, max_invoke_depth: config.limits.max_invoke_depth };
        let invoker = Invoker::new(registry.clone(), instances.clone(), metrics.clone(), logs.clone(), limits, batches);
        Ok(Arc::new(Engine { registry, instances, packages, networks, metrics, invoker, logs, sandboxes, watchers }))
    }

    /// The names of the back-ends it runs, the default first.
    pub fn backend_names(&self) -> Vec<&'static str> {
        self.sandboxes.backend.names()
    }

    /// How many volumes the configuration binds in every sandbox.
    pub fn volumes(&self) -> usize {
        self.sandboxes.volumes
    }

    /// What follows a lambda's (new version's) arrival, from an upload or the shared registry:
    /// its packages installed ahead of its first request, a sandbox started for it (with
    /// `start_on_deploy`), and the watchers told.
    pub fn arrived(self: &Arc<Self>, lambda: &Arc<Lambda>, origin: Origin) {
        if !lambda.parsed_requirements.is_empty() {
            let (packages, reqs, name) = (self.packages.clone(), lambda.parsed_requirements.clone(), lambda.name.clone());
            tokio::spawn(async move {
                if let Err(e) = packages.prefetch(&reqs).await {
                    // Reported to requests.
                    tracing::warn!(lambda = %name, "installing the lambda's packages failed: {e}");
                }
            });
        }
        self.instances.arrived(lambda.clone());
        for watcher in &self.watchers {
            watcher.clone().arrived(self, lambda, origin);
        }
    }

    /// Delete a lambda here, with its network namespace, and tell the watchers; false when
    /// there was none.
    pub async fn delete(self: &Arc<Self>, name: &str, origin: Origin) -> bool {
        if !self.registry.delete(name) {
            return false;
        }
        self.networks.forget(name).await;
        self.instances.forget(name);
        for watcher in &self.watchers {
            watcher.removed(self, name, origin).await;
        }
        tracing::info!(lambda = %name, "lambda deleted");
        true
    }

    /// Stop taking requests: destroy every sandbox, and flush the logs.
    pub async fn shutdown(&self) {
        self.instances.shutdown().await;
        let logs = self.logs.clone();
        tokio::task::spawn_blocking(move || logs.flush()).await.ok();
    }

    /// Take down what the engine holds beyond the sandboxes: the lambdas' network namespaces;
    /// the worker's cleanup removes the rest.
    pub async fn release_networks(&self) {
        self.sandboxes.release_networks().await;
    }
}

/// The instance manager's settings from `[instances]`, `[limits]` and `[handler_cache]`.
fn instance_config(config: &EngineConfig, host: &Host, sandboxes: &Sandboxes) -> Result<InstanceConfig> {
    let i = &config.instances;
    Ok(InstanceConfig {
        keep_warm: i.keep_warm,
        start_on_deploy: i.start_on_deploy,
        idle_timeout: Duration::from_secs(i.idle_timeout_s),
        keep_alive: (i.keep_alive == KeepAlive::Histogram)
            .then(|| crate::keepalive::Policy { fixed_keep_alive: Duration::from_secs(i.idle_timeout_s), ..Default::default() }),
        max_per_lambda: i.max_per_lambda,
        queue_depth: i.queue_depth,
        max_total: i.max_total,
        timeout: config.limits.timeout(),
        limits: config.limits.sandbox_limits(),
        handler_cache: HandlerCacheConfig {
            pause: config.handler_cache.pause,
            pause_after: Duration::from_millis(config.handler_cache.pause_after_ms),
            memory_limit: config.handler_cache.memory_mb << 20,
        },
        budget: memory_budget(config, sandboxes.backend.as_ref())?,
        sandbox_estimate: i.sandbox_estimate_mb << 20,
        lambda_cpu_weight: config.limits.cpu_weight,
        cpu_weight_split: config.limits.cpu_weight_per == crate::config::CpuWeightPer::Lambda,
        long_request: (config.limits.long_request_ms > 0).then(|| Duration::from_millis(config.limits.long_request_ms)),
        preempt_tick: (config.limits.preempt_tick_us > 0).then(|| Duration::from_micros(config.limits.preempt_tick_us)),
        rt_home: host.layout.cpu_root_tasks(),
    })
}
