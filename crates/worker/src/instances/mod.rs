//! Sandboxes per lambda: who serves a request, and what happens to a sandbox afterwards.
//!
//! A request takes an idle sandbox of its lambda's current version (a warm start) or, while
//! the lambda has fewer than `max_per_lambda` sandboxes and the worker fewer than
//! `max_total`, provisions a new one (a cold start); otherwise it waits in the lambda's
//! bounded queue (429 when full) until a sandbox or room for one is handed to it. After a
//! request a healthy sandbox goes to the next waiter or becomes idle (with `keep_warm`); a
//! failed one, one of a replaced version, one of a lambda whose `ol.yaml` says
//! `reuse-sandbox: false`, or any with `keep_warm = false` is destroyed in the background; a request whose sandbox died before answering runs once more on another when
//! that is safe ([`crate::retry`]). Idle sandboxes are destroyed after their lambda's
//! keep-alive window (from its idle times, [`crate::keepalive`], or `idle_timeout`), and
//! evicted least recently used first when the worker needs room for another lambda. Under a
//! memory budget a cold start is admitted first ([`admission`]): it evicts idle sandboxes,
//! waits for memory, or waits for a sandbox its lambda already has.
//!
//! Idle sandboxes are SOCK's handler cache: each is paused as it goes idle and resumed for
//! the next request; when paused sandboxes together pass their memory limit (PSS, measured
//! when they pause and every few seconds after) the least recently used are evicted
//! ([`crate::handler_cache`]).
//!
//! Every decision is made by [`pools::Pools`], a pure state machine behind one mutex; this
//! module carries its decisions out against a [`Backend`], never holding the mutex across a
//! sandbox operation other than pausing.

mod admission;
mod cpu;
#[cfg(test)]
pub(crate) mod fake;
mod figures;
pub mod pools;
mod prepare;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use sprout_sandbox::channel::{Reply, Request};
use sprout_sandbox::{Backend, Calls, CreateError, InvokeError, Limits, Sandbox};
use tokio::sync::oneshot;

pub use figures::{InstanceFigures, SandboxState};
pub use prepare::{Prepare, Provisioning};

use crate::budget::Budget;
use crate::cpu_shares::{CpuShares, LongRequests};
use crate::handler_cache::{self, Eviction, HandlerCacheConfig};
use crate::keepalive::Tracker;
use crate::logs::{Logs, RequestTag, RunReport, SandboxOutput};
use crate::packages::InstallError;
use crate::registry::Lambda;
use crate::retry;
use admission::{Admitted, MemoryAccounts};
use cpu::{write_cpu_weights, yield_when_long};
use pools::{Acquired, Bounds, Grant, Idle, Occupant, Pools, Released, Waiter};
use sprout_sandbox::cgroup::CpuControl;

/// How often every paused sandbox's PSS is measured again.
const REMEASURE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct InstanceConfig {
    pub keep_warm: bool,
    pub idle_timeout: Duration,
    /// Keep each lambda's idle sandboxes for the windows its idle times give
    /// ([`crate::keepalive`]); None: `idle_timeout` for every lambda.
    pub keep_alive: Option<crate::keepalive::Policy>,
    pub max_per_lambda: usize,
    pub queue_depth: usize,
    pub max_total: usize,
    /// Time limit of one request in its sandbox; also the longest a request may queue.
    pub timeout: Duration,
    pub limits: Limits,
    pub handler_cache: HandlerCacheConfig,
    /// The whole worker's memory budget ([`crate::budget`]); None: no budget.
    pub budget: Option<Budget>,
    /// Memory a lambda's sandbox is assumed to need until one has been measured.
    pub sandbox_estimate: u64,
    /// Each lambda's CPU weight, split among its sandboxes ([`crate::cpu_shares`]); 0 leaves
    /// every sandbox at its cgroup's default.
    pub lambda_cpu_weight: u64,
    /// A request running longer idles its sandbox's cgroup for the rest of its run, so
    /// shorter requests take a contended CPU at once; None: never.
    pub long_request: Option<Duration>,
    /// While long requests run, wake every CPU this often ([`crate::ticker`]); None: never.
    pub preempt_tick: Option<Duration>,
    /// Where the tick threads may run as real-time ones: the cpu hierarchy's root `tasks`.
    pub rt_home: Option<std::path::PathBuf>,
}

/// Why a request got no reply from its handler.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{0} requests are already waiting for this lambda")]
    QueueFull(usize),
    #[error("no sandbox became free within {0:?}")]
    QueueTimeout(Duration),
    #[error("no memory became free for a new sandbox within {0:?} (the worker's memory budget)")]
    NoMemory(Duration),
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
    /// How long it ran in its sandbox (queueing and a cold start left out).
    pub ran: Duration,
}

/// A sandbox and the version of the lambda it serves: what the pools keep.
struct Kept {
    sandbox: Box<dyn Sandbox>,
    lambda: Arc<Lambda>,
    /// The back-end that made it.
    backend: &'static str,
    /// Where its output goes: its lambda's log.
    output: Arc<SandboxOutput>,
    /// Counts it among its lambda's sandboxes while it exists.
    _made: admission::Made,
}

impl Occupant for Kept {
    fn id(&self) -> u64 {
        self.sandbox.id()
    }
    fn version(&self) -> u64 {
        self.lambda.version
    }
    fn is_current(&self) -> bool {
        self.lambda.is_current()
    }
}

/// A queued request's end of its hand-off.
type Handoff = oneshot::Sender<Grant<Kept>>;

impl Waiter<Kept> for Handoff {
    fn grant(self, grant: Grant<Kept>) -> Result<(), Grant<Kept>> {
        self.send(grant)
    }
    fn is_gone(&self) -> bool {
        self.is_closed()
    }
}

/// An invocation under way, for the idle times: its end is recorded however it ends.
struct Running<'a> {
    idle_times: &'a Mutex<Tracker>,
    name: &'a str,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.idle_times.lock().unwrap().ended(self.name, Instant::now());
    }
}

/// How a request is to get its sandbox next ([`Instances::obtain`]).
enum Step {
    Warm(Idle<Kept>),
    Create,
    Wait(oneshot::Receiver<Grant<Kept>>),
}

/// A sandbox lent to one request.
struct Lease {
    kept: Kept,
    cold: bool,
}

/// A sandbox held beyond one request ([`Instances::hold`]): destroyed when dropped, never
/// returned to the idle pool (it holds a client's state).
pub struct Held {
    /// None once its sandbox died.
    lease: Option<Lease>,
    owner: std::sync::Weak<Instances>,
}

impl Held {
    /// Its sandbox died (or failed a request): it holds nothing.
    pub fn is_lost(&self) -> bool {
        self.lease.is_none()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let (Some(lease), Some(owner)) = (self.lease.take(), self.owner.upgrade()) {
            owner.release(lease, false);
        }
    }
}

pub struct Instances {
    backend: Arc<dyn Backend>,
    prepare: Arc<dyn Prepare>,
    cfg: InstanceConfig,
    pools: Mutex<Pools<Kept, Handoff>>,
    cache: handler_cache::Counters,
    /// Each lambda's idle times, for its keep-alive window (only under the histogram policy:
    /// with a fixed window, the request path takes no lock for them).
    idle_times: Option<Mutex<Tracker>>,
    figures: InstanceFigures,
    destroying: Arc<AtomicUsize>,
    closed: AtomicBool,
    /// Wakes the background task to measure a newly paused sandbox.
    measure: tokio::sync::Notify,
    me: std::sync::Weak<Instances>,
    /// Where the memory budget is enforced and measured: the back-end's cgroup.
    memory_group: Option<(Arc<sprout_sandbox::cgroup::Layout>, String)>,
    memory: MemoryAccounts,
    prewarms: Prewarms,
    /// The lambdas' logs, where each sandbox's output and each request's report go.
    logs: Arc<Logs>,
    /// Each lambda's CPU weight, split among its live sandboxes.
    cpu: Option<Mutex<CpuShares<CpuControl>>>,
    /// Which lambdas' requests run long (and yield the CPU from their start).
    long_requests: Mutex<LongRequests>,
    /// Preemption ticks while long requests run.
    ticker: Option<crate::ticker::Ticker>,
}

/// Pre-warms under the histogram policy: sandboxes started ahead of a lambda's expected next
/// request, and those skipped for want of room.
#[derive(Default)]
struct Prewarms {
    made: AtomicU64,
    skipped: AtomicU64,
}

/// One lambda's figures for `/metrics`.
pub struct LambdaFigures {
    pub name: String,
    /// Sandboxes serving a request or starting.
    pub busy: usize,
    pub idle: usize,
    pub queued: usize,
    pub prewarm: Duration,
    pub keep_alive: Duration,
    pub memory_estimate: Option<u64>,
}

impl Instances {
    pub fn new(backend: Arc<dyn Backend>, prepare: Arc<dyn Prepare>, cfg: InstanceConfig, logs: Arc<Logs>) -> Arc<Instances> {
        let bounds = Bounds { max_per_lambda: cfg.max_per_lambda, max_total: cfg.max_total, queue_depth: cfg.queue_depth };
        let idle_times = cfg.keep_alive.map(|policy| Mutex::new(Tracker::new(policy)));
        let memory_group = cfg.budget.and(backend.memory_group());
        let (cfg_cpu_weight, cfg_long) = (cfg.lambda_cpu_weight, cfg.long_request);
        let ticker = match (cfg.long_request, cfg.preempt_tick) {
            (Some(_), Some(period)) => crate::ticker::Ticker::start(period, cfg.rt_home.clone())
                .inspect_err(|e| tracing::warn!("no preemption ticks ({e}): requests beside long ones may wait a scheduler tick"))
                .ok(),
            _ => None,
        };
        let figures = InstanceFigures::new(backend.name());
        let instances = Arc::new_cyclic(|me| Instances {
            memory_group,
            memory: MemoryAccounts::default(),
            prewarms: Prewarms::default(),
            me: me.clone(),
            backend,
            prepare,
            cfg,
            pools: Mutex::new(Pools::new(bounds)),
            cache: handler_cache::Counters::default(),
            idle_times,
            figures,
            destroying: Arc::new(AtomicUsize::new(0)),
            closed: AtomicBool::new(false),
            measure: tokio::sync::Notify::new(),
            logs,
            cpu: (cfg_cpu_weight > 0).then(|| Mutex::new(CpuShares::new(cfg_cpu_weight))),
            long_requests: Mutex::new(LongRequests::new(cfg_long.unwrap_or(Duration::MAX))),
            ticker,
        });
        tokio::spawn(Self::housekeeping(Arc::downgrade(&instances)));
        instances
    }

    /// Every second: reap idle sandboxes; measure newly paused ones at once and all of them
    /// every few seconds (their shares of pages change as sharers come and go; each measure
    /// walks page tables). Ends with the instances.
    async fn housekeeping(weak: std::sync::Weak<Instances>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut last_full = Instant::now();
        loop {
            let Some(me) = weak.upgrade() else { return };
            let ticked = tokio::select! {
                _ = tick.tick() => true,
                _ = me.measure.notified() => false,
            };
            if ticked {
                let doomed = me.pools.lock().unwrap().reap(Instant::now(), |name| me.keep_for(name));
                me.evict(doomed);
            }
            let all = ticked && last_full.elapsed() >= REMEASURE;
            if all {
                last_full = Instant::now();
            }
            me.measure_paused(all).await;
        }
    }

    /// How long `name`'s idle sandboxes are kept.
    fn keep_for(&self, name: &str) -> Duration {
        match &self.idle_times {
            Some(tracker) => tracker.lock().unwrap().keep_for(name),
            None => self.cfg.idle_timeout,
        }
    }

    /// What the instances count, for `/metrics` and `/stats`.
    pub fn figures(&self) -> &InstanceFigures {
        &self.figures
    }

    /// The time limit of a request from outside.
    pub fn timeout(&self) -> Duration {
        self.cfg.timeout
    }

    /// How many sandboxes one lambda may have at once.
    pub fn max_per_lambda(&self) -> usize {
        self.cfg.max_per_lambda
    }

    /// Run one request on a sandbox of `lambda`, answering its handler's calls to other
    /// lambdas with `calls`: it may queue for up to `limit` and run for up to the time limit
    /// ([`Instances::timeout`]), or, when `limit` is shorter (a call from a handler, which
    /// must end before its caller's limit does), for what is left of `limit` after queueing.
    /// When the sandbox dies before answering and the request is safe to run twice
    /// ([`retry::reason`]), it runs once more on another, within what is left of its run time.
    /// Each run in a sandbox is logged as request `tag`'s: a start, the handler's output, a
    /// report.
    pub async fn invoke(
        &self,
        lambda: &Arc<Lambda>,
        request: &Request,
        body: &[u8],
        limit: Duration,
        calls: &dyn Calls,
        tag: &RequestTag,
    ) -> Result<Invocation, Failure> {
        let queued = Instant::now();
        let _running = self.idle_times.as_ref().map(|tracker| {
            tracker.lock().unwrap().started(&lambda.name, queued);
            Running { idle_times: tracker, name: &lambda.name }
        });
        let lease = self.acquire(lambda, limit).await?;
        let run_limit = if limit >= self.cfg.timeout { self.cfg.timeout } else { limit.saturating_sub(queued.elapsed()) };
        let began = Instant::now();
        let kind = lease.kept.sandbox.kind();
        let error = match self.run(lease, request, body, run_limit, calls, tag).await {
            Ok(done) => return Ok(done),
            Err(e) => e,
        };
        let Some(reason) = retry::reason(kind, &request.method, &error) else {
            return Err(error.into());
        };
        tracing::info!(lambda = %lambda.name, reason = reason.label(), "sandbox died before answering ({error}); retrying on another");
        let left = || run_limit.saturating_sub(began.elapsed());
        if left().is_zero() {
            return Err(error.into());
        }
        let lease = match self.acquire(lambda, left()).await {
            Ok(lease) => lease,
            Err(e) => {
                // No sandbox could take it in time: the request's own failure stands.
                tracing::warn!(lambda = %lambda.name, "no sandbox for the retry: {e}");
                return Err(error.into());
            }
        };
        let remaining = left();
        if remaining.is_zero() {
            let reusable = lease.kept.sandbox.reusable();
            self.release(lease, reusable);
            return Err(error.into());
        }
        self.figures.retried(reason);
        match self.run(lease, request, body, remaining, calls, tag).await {
            // The request as a whole ran out of its time limit.
            Err(InvokeError::Timeout(_)) => Err(InvokeError::Timeout(run_limit).into()),
            other => other.map_err(Failure::from),
        }
    }

    /// Send the request to the leased sandbox, waiting up to `limit`, log the run, and give
    /// the sandbox back.
    async fn run(
        &self,
        mut lease: Lease,
        request: &Request,
        body: &[u8],
        limit: Duration,
        calls: &dyn Calls,
        tag: &RequestTag,
    ) -> Result<Invocation, InvokeError> {
        let (result, ran) = self.run_on(&mut lease, request, body, limit, calls, tag).await;
        let (cold, sandbox) = (lease.cold, lease.kept.sandbox.id());
        let reusable = result.is_ok() && lease.kept.sandbox.reusable();
        self.release(lease, reusable);
        let (reply, body) = result?;
        Ok(Invocation { reply, body, cold, sandbox, ran })
    }

    /// Hold a sandbox of `lambda` (an idle one, or a new one within `wait`, through the usual
    /// admission) until the [`Held`] is dropped: busy to the pools all along, so never paused,
    /// reaped or evicted. A user lease's part ([`crate::lease_routes`]).
    pub async fn hold(&self, lambda: &Arc<Lambda>, wait: Duration) -> Result<Held, Failure> {
        let lease = self.acquire(lambda, wait).await?;
        Ok(Held { lease: Some(lease), owner: self.me.clone() })
    }

    /// Run a request on a held sandbox, as [`Instances::invoke`] runs one (logged the same
    /// way, within `limit`), keeping the sandbox afterwards; never retried. A sandbox that
    /// failed (crashed, ran out of memory or time) or cannot serve again is destroyed, and the
    /// [`Held`] holds nothing from then on ([`Held::is_lost`]).
    pub async fn run_held(
        &self,
        held: &mut Held,
        request: &Request,
        body: &[u8],
        limit: Duration,
        calls: &dyn Calls,
        tag: &RequestTag,
    ) -> Result<Invocation, Failure> {
        let Some(lease) = held.lease.as_mut() else {
            return Err(Failure::Platform("the held sandbox is gone".into()));
        };
        let (result, ran) = self.run_on(lease, request, body, limit, calls, tag).await;
        let (cold, sandbox) = (lease.cold, lease.kept.sandbox.id());
        lease.cold = false;
        if result.is_err() || !lease.kept.sandbox.reusable() {
            if let Some(lease) = held.lease.take() {
                self.release(lease, false);
            }
        }
        let (reply, body) = result?;
        Ok(Invocation { reply, body, cold, sandbox, ran })
    }

    /// Run a request on a sandbox lent to it, and log the run; the sandbox stays lent.
    async fn run_on(
        &self,
        lease: &mut Lease,
        request: &Request,
        body: &[u8],
        limit: Duration,
        calls: &dyn Calls,
        tag: &RequestTag,
    ) -> (Result<(Reply, Bytes), InvokeError>, Duration) {
        let (cold, sandbox) = (lease.cold, lease.kept.sandbox.id());
        let output = lease.kept.output.clone();
        output.begin(tag, sandbox, cold);
        let began = Instant::now();
        let cpu = self.cfg.long_request.and_then(|after| Some((after, lease.kept.sandbox.cpu_control()?)));
        let invoke = lease.kept.sandbox.invoke(request, body, limit, calls);
        let result = match &cpu {
            None => invoke.await,
            Some((after, cpu)) => {
                // A lambda whose requests run long yields from the start; any other once it has.
                let after = if self.long_requests.lock().unwrap().expected_long(&lease.kept.lambda.name) { Duration::ZERO } else { *after };
                let (done, idled) = yield_when_long(invoke, after, cpu, self.ticker.as_ref()).await;
                // Back from idling its group weighs as a default one: its lambda's share again.
                if let (true, Some(shares)) = (idled, &self.cpu) {
                    if let Some(weight) = shares.lock().unwrap().weight_of(sandbox) {
                        write_cpu_weights(vec![(cpu.clone(), weight)]);
                    }
                }
                done
            }
        };
        let duration = began.elapsed();
        if cpu.is_some() {
            self.long_requests.lock().unwrap().ran(&lease.kept.lambda.name, duration);
        }
        let (outcome, error) = match &result {
            Ok((reply, _)) => match reply.error.as_deref() {
                Some(code) => (code, Some((reply.message.as_deref().unwrap_or(""), reply.traceback.as_deref()))),
                None => ("ok", None),
            },
            Err(e) => (crate::errors::ErrorCode::of_invoke_error(e).as_str(), None),
        };
        let sandboxed = &lease.kept.sandbox;
        output.finish(&RunReport {
            sandbox,
            duration,
            init: cold.then(|| sandboxed.startup()),
            peak_memory: sandboxed.peak_memory(),
            cold,
            outcome,
            error,
        });
        (result, duration)
    }

    /// A sandbox for `lambda`: an idle one, a new one, or one handed over within `wait`.
    async fn acquire(&self, lambda: &Arc<Lambda>, wait: Duration) -> Result<Lease, Failure> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Failure::ShuttingDown);
        }
        let mut doomed = Vec::new();
        let mut handoff = None;
        let acquired = self.pools.lock().unwrap().acquire(
            &lambda.name,
            lambda.version,
            || {
                let (tx, rx) = oneshot::channel();
                handoff = Some(rx);
                tx
            },
            &mut doomed,
        );
        self.evict(doomed);
        let step = match acquired {
            Acquired::Warm(idle) => {
                self.figures.state(idle.occupant.backend, SandboxState::Idle, -1);
                self.figures.state(idle.occupant.backend, SandboxState::Busy, 1);
                Step::Warm(idle)
            }
            Acquired::Create => Step::Create,
            Acquired::Full => return Err(Failure::QueueFull(self.cfg.queue_depth)),
            Acquired::Queued => Step::Wait(handoff.expect("queued with a hand-off")),
        };
        self.obtain(lambda, step, wait).await
    }

    /// Follow a request's steps to a sandbox: an idle one resumed, a new one made, or one (or
    /// room for one) handed over within `wait`. A loop, not recursion: under a full memory
    /// budget a request may go from making a sandbox to waiting for one and back.
    async fn obtain(&self, lambda: &Arc<Lambda>, mut step: Step, wait: Duration) -> Result<Lease, Failure> {
        let deadline = Instant::now() + wait;
        loop {
            step = match step {
                Step::Warm(idle) => match self.warm(idle) {
                    Some(lease) => return Ok(lease),
                    None => Step::Create,
                },
                Step::Create => match self.admit(lambda).await {
                    Ok(Admitted::Granted { bytes, made }) => {
                        let lease = self.create_admitted(lambda, made).await;
                        self.memory.pending.fetch_sub(bytes, Ordering::AcqRel);
                        return lease;
                    }
                    Ok(Admitted::Queued(rx)) => Step::Wait(rx),
                    Ok(Admitted::Warm(idle)) => {
                        self.figures.state(idle.occupant.backend, SandboxState::Idle, -1);
                        self.figures.state(idle.occupant.backend, SandboxState::Busy, 1);
                        Step::Warm(idle)
                    }
                    Err(failure) => {
                        self.pools.lock().unwrap().give_back_room(&lambda.name);
                        return Err(failure);
                    }
                },
                Step::Wait(rx) => match self.wait(rx, lambda, deadline, wait).await? {
                    Grant::Sandbox(kept) if kept.lambda.version == lambda.version => return Ok(Lease { kept, cold: false }),
                    Grant::Sandbox(kept) => {
                        // A sandbox of another version: swap it for room to make a current one.
                        self.figures.state(kept.backend, SandboxState::Busy, -1);
                        self.destroy(kept.sandbox);
                        Step::Create
                    }
                    Grant::Room => Step::Create,
                },
            };
        }
    }

    /// Resume an idle sandbox for a request; None when it died while idle (e.g. with its
    /// Zygote): it is destroyed and its room kept for a new one.
    fn warm(&self, idle: Idle<Kept>) -> Option<Lease> {
        let Idle { occupant: kept, paused, .. } = idle;
        let killed = paused && kept.sandbox.killed_while_paused();
        if paused {
            let started = Instant::now();
            let resumed = kept.sandbox.resume();
            self.cache.resumed(started.elapsed());
            if let Err(e) = resumed {
                tracing::warn!(sandbox = kept.sandbox.id(), "resuming a paused sandbox: {e}");
            }
        }
        if killed || !kept.sandbox.reusable() {
            self.cache.evicted(Eviction::Dead, 1);
            self.figures.state(kept.backend, SandboxState::Busy, -1);
            self.destroy(kept.sandbox);
            return None;
        }
        Some(Lease { kept, cold: false })
    }

    /// Wait until `deadline` (`wait` after the request came) for a sandbox or room to be
    /// handed over.
    async fn wait(
        &self,
        mut rx: oneshot::Receiver<Grant<Kept>>,
        lambda: &Arc<Lambda>,
        deadline: Instant,
        wait: Duration,
    ) -> Result<Grant<Kept>, Failure> {
        tokio::select! {
            grant = &mut rx => grant.map_err(|_| Failure::ShuttingDown),
            _ = tokio::time::sleep_until(deadline.into()) => {
                // A grant may have arrived just now: never lose it.
                rx.close();
                match rx.try_recv() {
                    Ok(Grant::Room) => self.pools.lock().unwrap().sandbox_gone(&lambda.name),
                    Ok(Grant::Sandbox(kept)) => self.release(Lease { kept, cold: false }, true),
                    Err(_) => {}
                }
                Err(Failure::QueueTimeout(wait))
            }
        }
    }

    /// Provision a sandbox for `lambda` once admitted; room for it is already counted.
    async fn create_admitted(&self, lambda: &Arc<Lambda>, made: admission::Made) -> Result<Lease, Failure> {
        let mut backend = self.backend.name();
        let created = match self.prepare.spec(lambda, self.cfg.limits).await {
            Ok(mut spec) => {
                backend = spec.backend.unwrap_or(backend);
                let output = self.logs.sandbox_output(&lambda.name, lambda.version, backend);
                spec.output = Some(output.clone());
                self.figures.starting_with(backend);
                self.figures.state(backend, SandboxState::Starting, 1);
                let created = self.backend.create(&spec).await;
                self.figures.state(backend, SandboxState::Starting, -1);
                created.map(|sandbox| (sandbox, output)).map_err(|e| match e {
                    CreateError::Load { message, traceback } => Failure::Load { message, traceback },
                    CreateError::Platform(e) => Failure::Platform(e.to_string()),
                })
            }
            Err(failure) => Err(failure),
        };
        match created {
            Ok((sandbox, output)) => {
                if let (Some(cpu), Some(handle)) = (&self.cpu, sandbox.cpu_control()) {
                    let writes = cpu.lock().unwrap().added(&lambda.name, sandbox.id(), handle);
                    write_cpu_weights(writes);
                }
                self.figures.started(sandbox.startup());
                self.figures.state(backend, SandboxState::Busy, 1);
                Ok(Lease { kept: Kept { sandbox, lambda: lambda.clone(), backend, output, _made: made }, cold: true })
            }
            Err(failure) => {
                // Requests waiting for this one get its room instead.
                drop(made);
                self.pools.lock().unwrap().sandbox_gone(&lambda.name);
                Err(failure)
            }
        }
    }

    /// Return a sandbox after its request: to a waiter, to the idle set, or to be destroyed.
    /// Under the histogram policy, a lambda with a pre-warm window has its sandbox go instead
    /// of idling, and a new one started that long after ([`Instances::schedule_prewarm`]).
    fn release(&self, lease: Lease, reusable: bool) {
        let lambda = lease.kept.lambda.clone();
        let prewarm = match &self.idle_times {
            Some(tracker) if reusable => tracker.lock().unwrap().prewarm_after(&lambda.name),
            _ => None,
        };
        self.release_to(lease, reusable, prewarm);
    }

    fn release_to(&self, lease: Lease, reusable: bool, prewarm: Option<Duration>) {
        let lambda = lease.kept.lambda.clone();
        if self.memory_group.is_some() {
            self.memory.estimates.lock().unwrap().observe(&lambda.name, lease.kept.sandbox.memory_bytes());
        }
        let keep =
            reusable && self.cfg.keep_warm && lambda.config.reuse_sandbox && !self.closed.load(Ordering::Acquire) && lambda.is_current();
        let (id, backend) = (lease.kept.sandbox.id(), lease.kept.backend);
        let released = {
            let mut pools = self.pools.lock().unwrap();
            let released = pools.release(&lambda.name, lease.kept, keep, Instant::now());
            match (released, prewarm) {
                // Idle, with nobody waiting: under a pre-warm window it goes now instead.
                (Released::Idle, Some(after)) => {
                    let unloaded = pools.evict_ids(&[id], Eviction::Prewarm);
                    drop(pools);
                    self.figures.state(backend, SandboxState::Busy, -1);
                    self.figures.state(backend, SandboxState::Idle, 1);
                    self.evict(unloaded);
                    self.schedule_prewarm(lambda, after);
                    return;
                }
                (released, _) => released,
            }
        };
        match released {
            Released::Handed => {}
            Released::Idle => {
                self.figures.state(backend, SandboxState::Busy, -1);
                self.figures.state(backend, SandboxState::Idle, 1);
                if self.cfg.handler_cache.pause {
                    self.schedule_pause(lambda.name.clone(), id);
                }
            }
            Released::Destroy(kept) => {
                self.figures.state(kept.backend, SandboxState::Busy, -1);
                self.destroy(kept.sandbox);
            }
        }
    }

    /// Pause sandbox `id` of lambda `name` once it has been idle for `pause_after`: off the
    /// path of the request that just used it, and never for a sandbox reused at once.
    fn schedule_pause(&self, name: String, id: u64) {
        let (me, after) = (self.me.clone(), self.cfg.handler_cache.pause_after);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let Some(me) = me.upgrade() else { return };
            let mut pools = me.pools.lock().unwrap();
            let Some(idle) = pools.due_for_pause(&name, id, Instant::now(), after) else {
                return; // taken, gone, paused already, or idle again only since later
            };
            match idle.occupant.sandbox.pause() {
                Ok(true) => {
                    idle.paused = true;
                    me.cache.paused();
                    me.measure.notify_one();
                }
                Ok(false) => {} // this back-end's sandboxes idle runnable
                Err(e) => tracing::warn!(sandbox = id, "pausing an idle sandbox: {e}"),
            }
        });
    }

    /// Destroy evicted idle sandboxes, counting why they went.
    /// What a sandbox evicted for the memory budget holds is counted as being freed until it
    /// is gone, so the next admission does not evict for it again.
    fn evict(&self, doomed: Vec<(Kept, Eviction)>) {
        for (kept, why) in doomed {
            self.figures.state(kept.backend, SandboxState::Idle, -1);
            self.cache.evicted(why, 1);
            let freeing = if matches!(why, Eviction::Budget) { kept.sandbox.memory_bytes() } else { 0 };
            self.destroy_freeing(kept.sandbox, freeing);
        }
    }

    /// Start a sandbox of `lambda` `after` from now and keep it idle for its keep-alive
    /// window, unless the lambda was invoked meanwhile (its own request made or found one)
    /// or has no room: a pre-warm takes no room from another lambda and never queues.
    fn schedule_prewarm(&self, lambda: Arc<Lambda>, after: Duration) {
        let Some(tracker) = &self.idle_times else { return };
        let seen = tracker.lock().unwrap().invocations(&lambda.name).0;
        let me = self.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let Some(me) = me.upgrade() else { return };
            let Some(tracker) = &me.idle_times else { return };
            if me.closed.load(Ordering::Acquire)
                || !lambda.is_current()
                || tracker.lock().unwrap().invocations(&lambda.name) != (seen, false)
            {
                return;
            }
            if !me.pools.lock().unwrap().acquire_room(&lambda.name) {
                me.prewarms.skipped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            match me.obtain(&lambda, Step::Create, me.cfg.timeout).await {
                Ok(lease) => {
                    me.prewarms.made.fetch_add(1, Ordering::Relaxed);
                    me.release_to(lease, true, None);
                }
                Err(e) => tracing::warn!(lambda = %lambda.name, "pre-warming a sandbox: {e}"),
            }
        });
    }

    /// Destroy a sandbox in the background.
    fn destroy(&self, sandbox: Box<dyn Sandbox>) {
        self.destroy_freeing(sandbox, 0);
    }

    /// Destroy a sandbox in the background, counting `freeing` bytes as being freed meanwhile.
    fn destroy_freeing(&self, sandbox: Box<dyn Sandbox>, freeing: u64) {
        if let Some(cpu) = &self.cpu {
            let writes = cpu.lock().unwrap().removed(sandbox.id());
            write_cpu_weights(writes);
        }
        let (destroying, being_freed) = (self.destroying.clone(), self.memory.freeing.clone());
        destroying.fetch_add(1, Ordering::AcqRel);
        being_freed.fetch_add(freeing, Ordering::AcqRel);
        tokio::spawn(async move {
            sandbox.destroy().await;
            being_freed.fetch_sub(freeing, Ordering::AcqRel);
            destroying.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// Measure the PSS of paused sandboxes (`all`, or only those not measured yet) and evict
    /// the least recently used while they pass the handler cache's memory limit. Measuring
    /// reads /proc, so it happens outside the lock.
    async fn measure_paused(&self, all: bool) {
        let probes: Vec<(u64, Vec<i32>)> =
            self.pools.lock().unwrap().paused(!all).map(|kept| (kept.sandbox.id(), kept.sandbox.pids())).collect();
        if probes.is_empty() {
            return;
        }
        let measured: Vec<(u64, u64)> = tokio::task::spawn_blocking(move || {
            probes.into_iter().map(|(id, pids)| (id, sprout_sandbox::memory::pss_of_pids(&pids))).collect()
        })
        .await
        .unwrap_or_default();
        let doomed = self.pools.lock().unwrap().measured(&measured, self.cfg.handler_cache.memory_limit);
        self.evict(doomed);
    }

    /// Per-lambda figures and the handler cache's, for `/stats`.
    pub fn stats(&self) -> Value {
        let pools = self.pools.lock().unwrap();
        let idle_times = self.idle_times.as_ref().map(|t| t.lock().unwrap());
        let keep_alive = |name: &str| match &idle_times {
            Some(idle_times) => {
                let w = idle_times.windows(name);
                json!({"policy": "histogram", "basis": w.basis.as_str(), "prewarm_s": w.prewarm.as_secs_f64(),
                       "keep_alive_s": w.keep_alive.as_secs_f64(), "idle_times": idle_times.samples(name)})
            }
            None => json!({"policy": "fixed", "keep_alive_s": self.cfg.idle_timeout.as_secs_f64()}),
        };
        let estimates = self.memory.estimates.lock().unwrap();
        let mb = |bytes: u64| bytes as f64 / (1 << 20) as f64;
        let per_lambda: serde_json::Map<String, Value> = pools
            .figures()
            .map(|(name, f)| {
                let mut figures = json!({"sandboxes": f.sandboxes, "idle": f.idle, "queued": f.queued, "served": f.served, "keep_alive": keep_alive(name)});
                if self.memory_group.is_some() {
                    figures["memory_estimate_mb"] = json!(mb(estimates.of(name, self.cfg.sandbox_estimate)));
                }
                (name.to_string(), figures)
            })
            .collect();
        let (paused, paused_pss) = pools.paused_figures();
        let budget = match (self.cfg.budget, self.budget_figures()) {
            (Some(budget), Some(f)) => json!({
                "limit_mb": mb(budget.limit), "reserve_mb": mb(budget.reserve), "used_mb": mb(f.used),
                "charged_mb": mb(self.memory_group.as_ref().map(|(layout, group)| layout.memory_usage_of(group)).unwrap_or(0)),
                "pending_mb": mb(f.pending),
                "freeing_mb": mb(f.freeing), "waits": f.waits, "evictions": self.cache.evictions(Eviction::Budget),
                "queued_instead": f.queued_instead,
                "sandbox_estimate_mb": mb(self.cfg.sandbox_estimate),
            }),
            _ => Value::Null,
        };
        json!({
            "total_sandboxes": pools.total(),
            "per_lambda": per_lambda,
            "handler_cache": self.cache.json(&self.cfg.handler_cache, paused, paused_pss),
            "memory_budget": budget,
            "prewarms": {"made": self.prewarms.made.load(Ordering::Relaxed), "skipped": self.prewarms.skipped.load(Ordering::Relaxed)},
        })
    }

    /// Each lambda's sandboxes, queue, windows and (under a budget) memory estimate, for
    /// `/metrics`.
    pub fn lambda_figures(&self) -> Vec<LambdaFigures> {
        let pools = self.pools.lock().unwrap();
        let idle_times = self.idle_times.as_ref().map(|t| t.lock().unwrap());
        let estimates = self.memory.estimates.lock().unwrap();
        pools
            .figures()
            .map(|(name, f)| {
                let (prewarm, keep_alive) = match &idle_times {
                    Some(t) => {
                        let w = t.windows(name);
                        (w.prewarm, w.keep_alive)
                    }
                    None => (Duration::ZERO, self.cfg.idle_timeout),
                };
                LambdaFigures {
                    name: name.to_string(),
                    busy: f.sandboxes - f.idle,
                    idle: f.idle,
                    queued: f.queued,
                    prewarm,
                    keep_alive,
                    memory_estimate: self.memory_group.as_ref().map(|_| estimates.of(name, self.cfg.sandbox_estimate)),
                }
            })
            .collect()
    }

    /// The memory budget in bytes, when there is one.
    pub fn budget_limit(&self) -> Option<u64> {
        self.cfg.budget.map(|b| b.limit)
    }

    /// Handler cache figures for /metrics: (paused sandboxes, their PSS, evictions by reason).
    pub fn cache_figures(&self) -> (usize, u64, Vec<(&'static str, u64)>) {
        let (paused, pss) = self.pools.lock().unwrap().paused_figures();
        let evictions = Eviction::ALL.iter().map(|e| (e.label(), self.cache.evictions(*e))).collect();
        (paused, pss, evictions)
    }

    /// Forget what was learnt of a deleted lambda (its sandboxes go by their own way).
    pub fn forget(&self, name: &str) {
        self.long_requests.lock().unwrap().forget(name);
    }

    /// Stop taking requests, destroy every idle sandbox and wait for destruction to finish.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        let idle = self.pools.lock().unwrap().shutdown();
        for kept in idle {
            self.figures.state(kept.backend, SandboxState::Idle, -1);
            self.destroy(kept.sandbox);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.destroying.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.backend.shutdown().await;
    }
}
