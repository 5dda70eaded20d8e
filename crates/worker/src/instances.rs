//! Sandboxes per lambda: who serves a request, and what happens to a sandbox afterwards.
//!
//! A request takes an idle sandbox of its lambda's current version (a warm start) or, while
//! the lambda has fewer than `max_per_lambda` sandboxes and the worker fewer than
//! `max_total`, provisions a new one (a cold start); otherwise it waits in the lambda's
//! bounded queue (429 when full) until a sandbox or room for one is handed to it. Several
//! sandboxes thus serve one lambda concurrently when requests queue. After a request a healthy
//! sandbox goes to the next waiter or becomes idle (with `keep_warm`); a failed one, one of a
//! replaced version, or any with `keep_warm = false` is destroyed in the background; a
//! request whose sandbox died before answering runs once more on another when that is safe
//! ([`crate::retry`]). Idle
//! sandboxes are destroyed after `idle_timeout`, and evicted least recently used first when
//! the worker needs room for another lambda.
//!
//! Idle sandboxes are SOCK's handler cache: each is paused (cgroup freezer) as it goes idle
//! and resumed for the next request; when paused sandboxes together pass their memory limit
//! (PSS, measured when they pause and every second after) the least recently used are
//! evicted ([`crate::handler_cache`]). A cold start first awaits its lambda's packages
//! ([`crate::packages`]): resolved and installed once, or installed afresh with the install
//! cache off.
//!
//! All state sits behind one mutex, held only for bookkeeping (never across a sandbox
//! operation), which keeps the hand-offs between requests simple to reason about.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use sprout_sandbox::channel::{Reply, Request};
use sprout_sandbox::{Backend, Calls, CreateError, InvokeError, Limits, Sandbox, SandboxSpec};
use tokio::sync::oneshot;

use crate::handler_cache::{self, Eviction, HandlerCacheConfig};
use crate::metrics::{Metrics, SandboxState};
use crate::networks::LambdaNetworks;
use crate::packages::{InstallError, Packages};
use crate::registry::Lambda;
use crate::retry;

/// How often every paused sandbox's PSS is measured again.
const REMEASURE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct InstanceConfig {
    pub keep_warm: bool,
    pub idle_timeout: Duration,
    pub max_per_lambda: usize,
    pub queue_depth: usize,
    pub max_total: usize,
    /// Time limit of one request in its sandbox; also the longest a request may queue.
    pub timeout: Duration,
    pub limits: Limits,
    pub handler_cache: HandlerCacheConfig,
}

/// Why a request got no reply from its handler.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{0} requests are already waiting for this lambda")]
    QueueFull(usize),
    #[error("no sandbox became free within {0:?}")]
    QueueTimeout(Duration),
    #[error("the worker is shutting down")]
    ShuttingDown,
    #[error("the lambda failed to load: {message}")]
    Load { message: String, traceback: Option<String> },
    #[error("no sandbox could be provisioned: {0}")]
    Platform(String),
    #[error("the lambda's packages could not be installed: {0}")]
    Install(InstallError),
    #[error(transparent)]
    Sandbox(#[from] InvokeError),
}

/// A reply from a handler.
pub struct Invocation {
    pub reply: Reply,
    pub body: Bytes,
    pub cold: bool,
    pub sandbox: u64,
}

struct Idle {
    sandbox: Sandbox,
    lambda: Arc<Lambda>,
    since: Instant,
    paused: bool,
    /// PSS when last measured (0 until then).
    pss: u64,
}

enum Grant {
    /// A sandbox handed over by the request that just used it.
    Sandbox(Box<Sandbox>, Arc<Lambda>),
    /// Room to provision a new sandbox (already counted as live).
    Room,
}

#[derive(Default)]
struct Pool {
    idle: Vec<Idle>,
    /// Sandboxes of this lambda that exist or are being made.
    live: usize,
    waiters: VecDeque<oneshot::Sender<Grant>>,
    served: u64,
}

#[derive(Default)]
struct State {
    pools: HashMap<String, Pool>,
    total: usize,
}

pub struct Instances {
    backend: Arc<dyn Backend>,
    packages: Arc<Packages>,
    cfg: InstanceConfig,
    cache: handler_cache::Counters,
    state: Mutex<State>,
    metrics: Arc<Metrics>,
    destroying: Arc<AtomicUsize>,
    closed: AtomicBool,
    /// Wakes the background task to measure a newly paused sandbox.
    measure: tokio::sync::Notify,
    /// Each lambda's network namespace, and what its sandboxes are told about services.
    networks: Arc<LambdaNetworks>,
    me: std::sync::Weak<Instances>,
}

/// A sandbox lent to one request.
struct Lease {
    sandbox: Sandbox,
    lambda: Arc<Lambda>,
    cold: bool,
}

impl Instances {
    pub fn new(
        backend: Arc<dyn Backend>,
        packages: Arc<Packages>,
        cfg: InstanceConfig,
        metrics: Arc<Metrics>,
        networks: Arc<LambdaNetworks>,
    ) -> Arc<Instances> {
        let instances = Arc::new_cyclic(|me| Instances {
            me: me.clone(),
            backend,
            packages,
            cfg,
            cache: handler_cache::Counters::default(),
            state: Mutex::new(State::default()),
            metrics,
            destroying: Arc::new(AtomicUsize::new(0)),
            closed: AtomicBool::new(false),
            measure: tokio::sync::Notify::new(),
            networks,
        });
        let weak = Arc::downgrade(&instances);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut last_full = Instant::now();
            loop {
                let Some(notified) = weak.upgrade() else {
                    return;
                };
                let ticked = tokio::select! {
                    _ = tick.tick() => true,
                    _ = notified.measure.notified() => false,
                };
                drop(notified);
                let Some(i) = weak.upgrade() else { return };
                if ticked {
                    i.reap_idle();
                }
                // Newly paused sandboxes at once; all of them (their shares of pages change as
                // sharers come and go) every few seconds, since each measure walks page tables.
                let all = ticked && last_full.elapsed() >= REMEASURE;
                if all {
                    last_full = Instant::now();
                }
                i.measure_paused(all).await;
            }
        });
        instances
    }

    /// Run one request on a sandbox of `lambda`, answering its handler's calls to other
    /// lambdas with `calls`: it may queue for up to `limit` and run for up to the time limit
    /// ([`Instances::timeout`]), or, when `limit` is shorter (a call from a handler, which
    /// must end before its caller's limit does), for what is left of `limit` after queueing.
    /// When the sandbox dies before answering and the request is safe to run twice
    /// ([`retry::reason`]), it runs once more on another, within what is left of its run time.
    pub async fn invoke(
        &self,
        lambda: &Arc<Lambda>,
        request: &Request,
        body: &[u8],
        limit: Duration,
        calls: &dyn Calls,
    ) -> Result<Invocation, Failure> {
        let queued = Instant::now();
        let lease = self.acquire(lambda, limit).await?;
        let run_limit = if limit >= self.cfg.timeout { self.cfg.timeout } else { limit.saturating_sub(queued.elapsed()) };
        let began = Instant::now();
        let kind = lease.sandbox.kind;
        let error = match self.run(lease, request, body, run_limit, calls).await {
            Ok(done) => return Ok(done),
            Err(e) => e,
        };
        let Some(reason) = retry::reason(kind, &request.method, &error) else {
            return Err(error.into());
        };
        tracing::info!(lambda = %lambda.name, reason = reason.label(), "sandbox died before answering ({error}); retrying on another");
        match self.retry(lambda, request, body, began, run_limit, reason, calls).await {
            Some(result) => result,
            // No sandbox could take it in time: the request's own failure stands.
            None => Err(error.into()),
        }
    }

    /// The time limit of a request from outside.
    pub fn timeout(&self) -> Duration {
        self.cfg.timeout
    }

    /// Run a request whose time limit `limit` started at `began` once more, on another
    /// sandbox, in what is left of that limit; None when no sandbox could take it in time.
    #[allow(clippy::too_many_arguments)]
    async fn retry(
        &self,
        lambda: &Arc<Lambda>,
        request: &Request,
        body: &[u8],
        began: Instant,
        limit: Duration,
        reason: retry::Reason,
        calls: &dyn Calls,
    ) -> Option<Result<Invocation, Failure>> {
        let left = || limit.saturating_sub(began.elapsed());
        if left().is_zero() {
            return None;
        }
        let lease = match self.acquire(lambda, left()).await {
            Ok(lease) => lease,
            Err(e) => {
                tracing::warn!(lambda = %lambda.name, "no sandbox for the retry: {e}");
                return None;
            }
        };
        let remaining = left();
        if remaining.is_zero() {
            let reusable = lease.sandbox.reusable();
            self.release(lease, reusable);
            return None;
        }
        self.metrics.retry(reason);
        Some(match self.run(lease, request, body, remaining, calls).await {
            // The request as a whole ran out of its time limit.
            Err(InvokeError::Timeout(_)) => Err(InvokeError::Timeout(limit).into()),
            other => other.map_err(Failure::from),
        })
    }

    /// Send the request to the leased sandbox, waiting up to `limit`, and give the sandbox back.
    async fn run(
        &self,
        mut lease: Lease,
        request: &Request,
        body: &[u8],
        limit: Duration,
        calls: &dyn Calls,
    ) -> Result<Invocation, InvokeError> {
        let result = lease.sandbox.invoke(request, body, limit, calls).await;
        let reusable = result.is_ok() && lease.sandbox.reusable();
        let (cold, sandbox) = (lease.cold, lease.sandbox.id);
        self.release(lease, reusable);
        let (reply, body) = result?;
        Ok(Invocation { reply, body, cold, sandbox })
    }

    /// A sandbox for `lambda`: an idle one, a new one, or one handed over within `wait`.
    async fn acquire(&self, lambda: &Arc<Lambda>, wait: Duration) -> Result<Lease, Failure> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Failure::ShuttingDown);
        }
        enum Next {
            Warm(Box<Idle>),
            Create,
            Wait(oneshot::Receiver<Grant>),
        }
        let mut doomed = Vec::new();
        let next = {
            let mut st = self.state.lock().unwrap();
            let State { pools, total } = &mut *st;
            let pool = pools.entry(lambda.name.clone()).or_default();
            // Sandboxes of a replaced version are never reused.
            let (current, stale): (Vec<Idle>, Vec<Idle>) = pool.idle.drain(..).partition(|i| i.lambda.version == lambda.version);
            pool.idle = current;
            pool.live -= stale.len();
            *total -= stale.len();
            self.cache.evicted(Eviction::Replaced, stale.len());
            doomed.extend(stale.into_iter().map(|i| i.sandbox));
            if let Some(idle) = pool.idle.pop() {
                Next::Warm(Box::new(idle))
            } else if pool.live < self.cfg.max_per_lambda
                && (*total < self.cfg.max_total || evict_lru(pools, total, &mut doomed, &self.cache))
            {
                let pool = pools.get_mut(&lambda.name).unwrap();
                pool.live += 1;
                *total += 1;
                Next::Create
            } else {
                let pool = pools.get_mut(&lambda.name).unwrap();
                pool.waiters.retain(|w| !w.is_closed());
                if pool.waiters.len() >= self.cfg.queue_depth {
                    drop(st);
                    self.metrics.sandbox_state(SandboxState::Idle, -(doomed.len() as i64));
                    self.destroy_all(doomed);
                    return Err(Failure::QueueFull(self.cfg.queue_depth));
                }
                let (tx, rx) = oneshot::channel();
                pool.waiters.push_back(tx);
                Next::Wait(rx)
            }
        };
        let idle_gone = doomed.len() + matches!(next, Next::Warm(_)) as usize;
        self.metrics.sandbox_state(SandboxState::Idle, -(idle_gone as i64));
        self.destroy_all(doomed);
        match next {
            Next::Warm(idle) => {
                self.metrics.sandbox_state(SandboxState::Busy, 1);
                let Idle { sandbox, paused, .. } = *idle;
                let killed = paused && handler_cache::killed_while_paused(&sandbox);
                if paused {
                    let started = Instant::now();
                    let resumed = sandbox.resume();
                    self.cache.resumed(started.elapsed());
                    if let Err(e) = resumed {
                        tracing::warn!(sandbox = sandbox.id, "resuming a paused sandbox: {e}");
                    }
                }
                if killed || !sandbox.reusable() {
                    // It died while idle (e.g. with its Zygote): make a new one in its place.
                    self.cache.evicted(Eviction::Dead, 1);
                    self.metrics.sandbox_state(SandboxState::Busy, -1);
                    self.destroy_all(vec![sandbox]);
                    return self.create(lambda).await;
                }
                Ok(Lease { sandbox, lambda: lambda.clone(), cold: false })
            }
            Next::Create => self.create(lambda).await,
            Next::Wait(mut rx) => {
                let granted = tokio::select! {
                    grant = &mut rx => grant,
                    _ = tokio::time::sleep(wait) => {
                        // A grant may have arrived just now: never lose it.
                        rx.close();
                        match rx.try_recv() {
                            Ok(Grant::Room) => self.give_back_room(&lambda.name),
                            Ok(Grant::Sandbox(sandbox, owner)) => {
                                self.release(Lease { sandbox: *sandbox, lambda: owner, cold: false }, true)
                            }
                            Err(_) => {}
                        }
                        return Err(Failure::QueueTimeout(wait));
                    }
                };
                match granted {
                    Ok(Grant::Sandbox(sandbox, owner)) if owner.version == lambda.version => {
                        Ok(Lease { sandbox: *sandbox, lambda: owner, cold: false })
                    }
                    Ok(Grant::Sandbox(sandbox, owner)) => {
                        // A sandbox of another version: swap it for room to make a current one.
                        self.metrics.sandbox_state(SandboxState::Busy, -1);
                        self.destroy_all(vec![*sandbox]);
                        drop(owner);
                        self.create(lambda).await
                    }
                    Ok(Grant::Room) => self.create(lambda).await,
                    Err(_) => Err(Failure::ShuttingDown),
                }
            }
        }
    }

    /// Provision a sandbox for `lambda`; room for it is already counted.
    async fn create(&self, lambda: &Arc<Lambda>) -> Result<Lease, Failure> {
        self.metrics.sandbox_state(SandboxState::Starting, 1);
        let packages = match self.packages.for_sandbox(&lambda.parsed_requirements).await {
            Ok(set) => set,
            Err(e) => {
                self.metrics.sandbox_state(SandboxState::Starting, -1);
                self.give_back_room(&lambda.name);
                return Err(Failure::Install(e));
            }
        };
        let network = match self.networks.for_lambda(&lambda.name).await {
            Ok(n) => n,
            Err(e) => {
                self.metrics.sandbox_state(SandboxState::Starting, -1);
                self.give_back_room(&lambda.name);
                return Err(Failure::Platform(format!("no network namespace for the lambda: {e}")));
            }
        };
        let spec = SandboxSpec {
            lambda: lambda.name.clone(),
            code_dir: lambda.dir.clone(),
            limits: self.cfg.limits,
            env: self.networks.env_for(&lambda.name),
            network,
            packages: packages.packages.clone(),
            paths: packages.paths.clone(),
            attached: Some(packages),
        };
        let created = self.backend.create(&spec).await;
        self.metrics.sandbox_state(SandboxState::Starting, -1);
        match created {
            Ok(sandbox) => {
                self.metrics.sandbox_started(sandbox.startup);
                self.metrics.sandbox_state(SandboxState::Busy, 1);
                Ok(Lease { sandbox, lambda: lambda.clone(), cold: true })
            }
            Err(e) => {
                self.give_back_room(&lambda.name);
                Err(match e {
                    CreateError::Load { message, traceback } => Failure::Load { message, traceback },
                    CreateError::Platform(m) => Failure::Platform(m),
                })
            }
        }
    }

    /// Return a sandbox after its request.
    fn release(&self, lease: Lease, reusable: bool) {
        self.metrics.sandbox_state(SandboxState::Busy, -1);
        let Lease { sandbox, lambda, .. } = lease;
        let keep = reusable && self.cfg.keep_warm && !self.closed.load(Ordering::Acquire) && lambda.is_current();
        let mut st = self.state.lock().unwrap();
        let pool = st.pools.entry(lambda.name.clone()).or_default();
        pool.served += 1;
        if keep {
            let mut grant = Grant::Sandbox(Box::new(sandbox), lambda);
            while let Some(waiter) = pool.waiters.pop_front() {
                self.metrics.sandbox_state(SandboxState::Busy, 1);
                match waiter.send(grant) {
                    Ok(()) => return,
                    Err(returned) => {
                        self.metrics.sandbox_state(SandboxState::Busy, -1);
                        grant = returned;
                    }
                }
            }
            if let Grant::Sandbox(sandbox, lambda) = grant {
                if self.cfg.handler_cache.pause {
                    self.schedule_pause(&lambda.name, sandbox.id);
                }
                pool.idle.push(Idle { sandbox: *sandbox, lambda, since: Instant::now(), paused: false, pss: 0 });
                self.metrics.sandbox_state(SandboxState::Idle, 1);
            }
            return;
        }
        drop(st);
        self.destroy_all(vec![sandbox]);
        self.give_back_room(&lambda.name);
    }

    /// Pause sandbox `id` of lambda `name` once it has been idle for `pause_after`: off the
    /// path of the request that just used it, and never for a sandbox reused at once.
    fn schedule_pause(&self, name: &str, id: u64) {
        let (me, name, delay) = (self.me.clone(), name.to_string(), self.cfg.handler_cache.pause_after);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let Some(me) = me.upgrade() else { return };
            let mut st = me.state.lock().unwrap();
            let Some(idle) = st.pools.get_mut(&name).and_then(|p| p.idle.iter_mut().find(|i| i.sandbox.id == id)) else {
                return; // taken by a request, or gone
            };
            if idle.paused || idle.since.elapsed() < delay {
                return; // already paused, or idle again only since later (that pause is scheduled)
            }
            if pause(&idle.sandbox) {
                idle.paused = true;
                me.cache.paused();
                me.measure.notify_one();
            }
        });
    }

    /// One sandbox of `name` is gone: let a waiting request (of this lambda first) use the room.
    fn give_back_room(&self, name: &str) {
        let mut st = self.state.lock().unwrap();
        let State { pools, total } = &mut *st;
        if let Some(pool) = pools.get_mut(name) {
            pool.live -= 1;
        }
        *total -= 1;
        let mut order: Vec<String> = vec![name.to_string()];
        order.extend(pools.keys().filter(|k| k.as_str() != name).cloned());
        for key in order {
            let Some(pool) = pools.get_mut(&key) else {
                continue;
            };
            if pool.live >= self.cfg.max_per_lambda || *total >= self.cfg.max_total {
                continue;
            }
            while let Some(waiter) = pool.waiters.pop_front() {
                if waiter.send(Grant::Room).is_ok() {
                    pool.live += 1;
                    *total += 1;
                    return;
                }
            }
        }
    }

    fn destroy_all(&self, sandboxes: Vec<Sandbox>) {
        for sandbox in sandboxes {
            let backend = self.backend.clone();
            let destroying = self.destroying.clone();
            destroying.fetch_add(1, Ordering::AcqRel);
            tokio::spawn(async move {
                backend.destroy(sandbox).await;
                destroying.fetch_sub(1, Ordering::AcqRel);
            });
        }
    }

    /// Destroy sandboxes idle longer than `idle_timeout`, or whose lambda was replaced.
    fn reap_idle(&self) {
        let mut doomed = Vec::new();
        {
            let mut st = self.state.lock().unwrap();
            let State { pools, total } = &mut *st;
            for pool in pools.values_mut() {
                let before = pool.idle.len();
                let (keep, expired): (Vec<Idle>, Vec<Idle>) =
                    pool.idle.drain(..).partition(|i| i.since.elapsed() < self.cfg.idle_timeout && i.lambda.is_current());
                pool.idle = keep;
                let replaced = expired.iter().filter(|i| !i.lambda.is_current()).count();
                self.cache.evicted(Eviction::Replaced, replaced);
                self.cache.evicted(Eviction::Idle, expired.len() - replaced);
                let gone = before - pool.idle.len();
                pool.live -= gone;
                *total -= gone;
                doomed.extend(expired.into_iter().map(|i| i.sandbox));
            }
            pools.retain(|_, p| p.live > 0 || !p.waiters.is_empty());
        }
        self.metrics.sandbox_state(SandboxState::Idle, -(doomed.len() as i64));
        self.destroy_all(doomed);
    }

    /// Measure the PSS of paused sandboxes (`all`, or only those not measured yet) and evict
    /// the least recently used while they pass the handler cache's memory limit. Measuring
    /// reads /proc, so it happens outside the lock.
    async fn measure_paused(&self, all: bool) {
        let probes: Vec<(u64, Vec<i32>)> = {
            let st = self.state.lock().unwrap();
            st.pools
                .values()
                .flat_map(|p| p.idle.iter().filter(|i| i.paused && (all || i.pss == 0)))
                .map(|i| (i.sandbox.id, i.sandbox.pids()))
                .collect()
        };
        if probes.is_empty() {
            return;
        }
        let measured: Vec<(u64, u64)> = tokio::task::spawn_blocking(move || {
            probes.into_iter().map(|(id, pids)| (id, sprout_sandbox::memory::pss_of_pids(&pids))).collect()
        })
        .await
        .unwrap_or_default();
        let mut doomed = Vec::new();
        {
            let mut st = self.state.lock().unwrap();
            let State { pools, total } = &mut *st;
            for idle in pools.values_mut().flat_map(|p| p.idle.iter_mut()) {
                if let Some((_, pss)) = measured.iter().find(|(id, _)| *id == idle.sandbox.id) {
                    idle.pss = *pss;
                }
            }
            let entries: Vec<(Instant, u64, u64)> =
                pools.values().flat_map(|p| p.idle.iter().filter(|i| i.paused)).map(|i| (i.since, i.pss, i.sandbox.id)).collect();
            for id in handler_cache::over_limit(entries, self.cfg.handler_cache.memory_limit) {
                for pool in pools.values_mut() {
                    if let Some(at) = pool.idle.iter().position(|i| i.sandbox.id == id) {
                        doomed.push(pool.idle.remove(at).sandbox);
                        pool.live -= 1;
                        *total -= 1;
                    }
                }
            }
            pools.retain(|_, p| p.live > 0 || !p.waiters.is_empty());
        }
        if !doomed.is_empty() {
            self.cache.evicted(Eviction::Memory, doomed.len());
            self.metrics.sandbox_state(SandboxState::Idle, -(doomed.len() as i64));
            self.destroy_all(doomed);
        }
    }

    /// `name` was deleted: its network namespace goes once its last sandbox has.
    pub async fn lambda_deleted(&self, name: &str) {
        self.networks.forget(name).await;
    }

    /// The lambdas' network, for `/metrics` (see [`LambdaNetworks::figures`]).
    pub fn network_figures(&self) -> Option<crate::networks::NetworkFigures> {
        self.networks.figures()
    }

    /// The lambdas' network, for `/stats`.
    pub fn network_stats(&self) -> Value {
        self.networks.stats()
    }

    /// Per-lambda figures and the handler cache's, for `/stats`.
    pub fn stats(&self) -> Value {
        let st = self.state.lock().unwrap();
        let mut out = serde_json::Map::new();
        let (mut paused, mut paused_pss) = (0, 0);
        for (name, pool) in &st.pools {
            out.insert(
                name.clone(),
                json!({"sandboxes": pool.live, "idle": pool.idle.len(), "queued": pool.waiters.len(), "served": pool.served}),
            );
            for idle in pool.idle.iter().filter(|i| i.paused) {
                paused += 1;
                paused_pss += idle.pss;
            }
        }
        json!({
            "total_sandboxes": st.total,
            "per_lambda": out,
            "handler_cache": self.cache.json(&self.cfg.handler_cache, paused, paused_pss),
        })
    }

    /// Handler cache figures for /metrics: (paused sandboxes, their PSS, evictions by reason).
    pub fn cache_figures(&self) -> (usize, u64, Vec<(&'static str, u64)>) {
        let st = self.state.lock().unwrap();
        let paused: Vec<&Idle> = st.pools.values().flat_map(|p| p.idle.iter().filter(|i| i.paused)).collect();
        let evictions = Eviction::ALL.iter().map(|e| (e.label(), self.cache.evictions(*e))).collect();
        (paused.len(), paused.iter().map(|i| i.pss).sum(), evictions)
    }

    /// Stop taking requests, destroy every idle sandbox and wait for destruction to finish.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        let doomed: Vec<Sandbox> = {
            let mut st = self.state.lock().unwrap();
            let mut all = Vec::new();
            for pool in st.pools.values_mut() {
                pool.waiters.clear();
                all.extend(pool.idle.drain(..).map(|i| i.sandbox));
            }
            all
        };
        self.metrics.sandbox_state(SandboxState::Idle, -(doomed.len() as i64));
        self.destroy_all(doomed);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.destroying.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.backend.shutdown().await;
    }
}

/// Pause a sandbox going idle; false when it cannot be paused (it then idles runnable).
fn pause(sandbox: &Sandbox) -> bool {
    match sandbox.pause() {
        Ok(paused) => paused,
        Err(e) => {
            tracing::warn!(sandbox = sandbox.id, "pausing an idle sandbox: {e}");
            false
        }
    }
}

/// Make room by removing the least recently used idle sandbox of any lambda.
fn evict_lru(pools: &mut HashMap<String, Pool>, total: &mut usize, doomed: &mut Vec<Sandbox>, cache: &handler_cache::Counters) -> bool {
    let oldest = pools
        .iter()
        .flat_map(|(name, p)| p.idle.iter().enumerate().map(move |(i, idle)| (idle.since, name.clone(), i)))
        .min_by_key(|(since, _, _)| *since);
    let Some((_, name, index)) = oldest else {
        return false;
    };
    let pool = pools.get_mut(&name).unwrap();
    let idle = pool.idle.remove(index);
    pool.live -= 1;
    *total -= 1;
    doomed.push(idle.sandbox);
    cache.evicted(Eviction::Room, 1);
    true
}
