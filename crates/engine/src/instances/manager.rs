//! The instance manager at work: a request's way to a sandbox (warm, cold, or handed over
//! from the queue), its run, and the sandbox's way after (to a waiter, idle and paused, or
//! destroyed); idle sandboxes reaped, measured, evicted and pre-warmed in the background.
//! Every decision is [`Pools`]'; this file carries decisions out against the back-end.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sprout_sandbox::cgroup::CpuControl;
use sprout_sandbox::channel::{Reply, Request};
use sprout_sandbox::{Backend, Calls, CreateError, InvokeError, Sandbox};
use tokio::sync::oneshot;

use super::admission::{Admitted, Gate, MemoryAccounts};
use super::cpu::{write_cpu_weights, yield_when_long};
use super::figures::{InstanceFigures, SandboxState};
use super::kept::{Handoff, Kept, Lease, Made};
use super::outcome::{Failure, Invocation};
use super::pools::{Acquired, Bounds, Grant, Idle, Pools, Released};
use super::prepare::Prepare;
use super::settings::InstanceConfig;
use crate::cpu_shares::{CpuShares, CpuYield, LongRequests};
use crate::errors::ErrorCode;
use crate::handler_cache::{self, Eviction};
use crate::keepalive::Tracker;
use crate::logs::{Logs, RequestTag, RunReport};
use crate::registry::Lambda;
use crate::retry;

/// How often every paused sandbox's PSS is measured again.
const REMEASURE: Duration = Duration::from_secs(5);

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

/// The instance manager: every lambda's sandboxes, and the requests waiting for one.
pub struct Instances {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) prepare: Arc<dyn Prepare>,
    pub(super) cfg: InstanceConfig,
    pub(super) pools: Mutex<Pools<Kept, Handoff>>,
    pub(super) cache: handler_cache::Counters,
    /// Each lambda's idle times, for its keep-alive window (only under the histogram policy:
    /// with a fixed window, the request path takes no lock for them).
    pub(super) idle_times: Option<Mutex<Tracker>>,
    pub(super) figures: InstanceFigures,
    pub(super) destroying: Arc<AtomicUsize>,
    pub(super) closed: AtomicBool,
    /// Wakes the background task to measure a newly paused sandbox.
    pub(super) measure: tokio::sync::Notify,
    pub(super) me: std::sync::Weak<Instances>,
    /// Where the memory budget is enforced and measured: the back-end's cgroup.
    pub(super) memory_group: Option<(Arc<sprout_sandbox::cgroup::Layout>, String)>,
    pub(super) memory: MemoryAccounts,
    pub(super) prewarms: Prewarms,
    pub(super) on_deploy: super::deploy_starts::StartsOnDeploy,
    /// The lambdas' logs, where each sandbox's output and each request's report go.
    pub(super) logs: Arc<Logs>,
    /// Each live sandbox's CPU weight: its lambda's, or a split of it.
    pub(super) cpu: Option<Mutex<CpuShares<CpuControl>>>,
    /// Which lambdas' requests run long (and yield the CPU from their start).
    pub(super) long_requests: Mutex<LongRequests>,
    /// Requests that yielded the CPU as long ones.
    pub(super) long_requests_idled: AtomicU64,
    /// Lambdas whose requests yield from their start anyway (unset: none).
    pub(super) cpu_yield: std::sync::OnceLock<Arc<dyn CpuYield>>,
    /// Preemption ticks while long requests run.
    pub(super) ticker: Option<crate::ticker::Ticker>,
}

/// Pre-warms under the histogram policy: sandboxes started ahead of a lambda's expected next
/// request, and those skipped for want of room.
#[derive(Default)]
pub(super) struct Prewarms {
    pub(super) made: AtomicU64,
    pub(super) skipped: AtomicU64,
}

impl Instances {
    pub fn new(backend: Arc<dyn Backend>, prepare: Arc<dyn Prepare>, cfg: InstanceConfig, logs: Arc<Logs>) -> Arc<Instances> {
        let bounds = Bounds { max_per_lambda: cfg.max_per_lambda, max_total: cfg.max_total, queue_depth: cfg.queue_depth };
        let idle_times = cfg.keep_alive.map(|policy| Mutex::new(Tracker::new(policy)));
        let memory_group = cfg.budget.and(backend.memory_group());
        let (cfg_cpu_weight, cfg_split, cfg_long) = (cfg.lambda_cpu_weight, cfg.cpu_weight_split, cfg.long_request);
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
            on_deploy: Default::default(),
            long_requests_idled: AtomicU64::new(0),
            cpu_yield: std::sync::OnceLock::new(),
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
            cpu: (cfg_cpu_weight > 0).then(|| Mutex::new(CpuShares::new(cfg_cpu_weight, cfg_split))),
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

    /// Set which lambdas' requests yield the CPU from their start (once; later calls are ignored).
    pub fn set_cpu_yield(&self, policy: Arc<dyn CpuYield>) {
        let _ = self.cpu_yield.set(policy);
    }

    /// The memory budget's gate, for a cold start.
    fn gate(&self) -> Gate<'_> {
        Gate {
            budget: self.cfg.budget,
            memory_group: self.memory_group.as_ref(),
            accounts: &self.memory,
            pools: &self.pools,
            estimate: self.cfg.sandbox_estimate,
            timeout: self.cfg.timeout,
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

    /// Run a request on a sandbox lent to it, and log the run; the sandbox stays lent.
    pub(super) async fn run_on(
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
        let mut computed = None;
        let result = match &cpu {
            None => invoke.await,
            Some((after, cpu)) => {
                // A lambda whose requests run long yields from the start, as does one the
                // policy names (its tenant at its quota); any other once it has run long.
                let name = &lease.kept.lambda.name;
                let yields = self.long_requests.lock().unwrap().expected_long(name) || self.cpu_yield.get().is_some_and(|p| p.yields(name));
                let after = if yields { Duration::ZERO } else { *after };
                let (done, idled, used) = yield_when_long(invoke, after, cpu, self.ticker.as_ref()).await;
                computed = used;
                if idled {
                    self.long_requests_idled.fetch_add(1, Ordering::Relaxed);
                }
                // Back from idling its group weighs as a default one: its weight again.
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
            // What it computed, where that is known: a short request that waited for a
            // crowded CPU does not make its lambda's requests long.
            self.long_requests.lock().unwrap().ran(&lease.kept.lambda.name, computed.unwrap_or(duration));
        }
        let (outcome, error) = match &result {
            Ok((reply, _)) => match reply.error.as_deref() {
                Some(code) => (code, Some((reply.message.as_deref().unwrap_or(""), reply.traceback.as_deref()))),
                None => ("ok", None),
            },
            Err(e) => (ErrorCode::of_invoke_error(e).as_str(), None),
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
    pub(super) async fn acquire(&self, lambda: &Arc<Lambda>, wait: Duration) -> Result<Lease, Failure> {
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
                Step::Create => match self.gate().admit(lambda, |doomed| self.evict(doomed)).await {
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
    async fn create_admitted(&self, lambda: &Arc<Lambda>, made: Made) -> Result<Lease, Failure> {
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
                Ok(Lease { kept: Kept { sandbox, lambda: lambda.clone(), backend, output, made }, cold: true })
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
    pub(super) fn release(&self, lease: Lease, reusable: bool) {
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
            match me.start_ahead(&lambda).await {
                None => _ = me.prewarms.skipped.fetch_add(1, Ordering::Relaxed),
                Some(Ok(())) => _ = me.prewarms.made.fetch_add(1, Ordering::Relaxed),
                Some(Err(e)) => tracing::warn!(lambda = %lambda.name, "pre-warming a sandbox: {e}"),
            }
        });
    }

    /// Make `lambda` a sandbox ahead of its requests and leave it idle, only with room to
    /// spare: the lambda has none and the worker has room without evicting or queueing (a
    /// pre-warm, a start on deploy). None: no room, nothing made.
    pub(super) async fn start_ahead(&self, lambda: &Arc<Lambda>) -> Option<Result<(), Failure>> {
        if !self.pools.lock().unwrap().acquire_room(&lambda.name) {
            return None;
        }
        Some(self.obtain(lambda, Step::Create, self.cfg.timeout).await.map(|lease| self.release_to(lease, true, None)))
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
