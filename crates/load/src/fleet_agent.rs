//! One agent's share of a fleet, driven on one thread: every site's users follow the site's
//! own profile, walking the workload's sessions with the site's driver (its Host), measured
//! per site over the whole span and fleet-wide per interval (`fleet_stats`).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use anyhow::Result;
use tokio::time::Instant;

use crate::browser::Failure;
use crate::engine::{self, Driver, Sessions};
use crate::fleet_stats::{first_after_idle, FirstAfterIdle, FleetAgentResult, Interval, SiteOp, SiteResult, UNFINISHED};
use crate::workload::Workload;

#[derive(Debug, Clone)]
pub struct FleetPlan {
    /// The run's length: one SLA window.
    pub span: Duration,
    /// Series points and progress lines.
    pub interval: Duration,
    /// A site that received no operation for this long is idle; its next operation is a
    /// "first after idle".
    pub idle_gap: Duration,
    pub seed: u64,
    /// This agent's number, for progress lines.
    pub agent: u32,
    pub progress: bool,
}

impl FleetPlan {
    /// Intervals in the span (the last may be shorter).
    pub fn intervals(&self) -> usize {
        (self.span.as_micros().div_ceil(self.interval.as_micros().max(1)) as usize).max(1)
    }
}

/// One site of this agent's share.
pub struct SitePlan<D> {
    /// Its position in the fleet file.
    pub index: usize,
    pub host: String,
    /// The profile's changes within the span ([`crate::fleet::FleetSite::steps`]).
    pub steps: Vec<(f64, usize)>,
    pub driver: D,
}

/// What all of the agent's sites share.
struct Common {
    workload: Workload,
    plan: FleetPlan,
    start: Instant,
    stop: Cell<bool>,
    /// Each operation's limit (max90_s) in microseconds.
    limits_us: Vec<u64>,
    series: RefCell<Vec<Interval>>,
    counters: RefCell<BTreeMap<String, u64>>,
    cycles: Cell<u64>,
    cycle_ms_sum: Cell<f64>,
    active_users: Cell<usize>,
    active_sites: Cell<usize>,
    in_flight: Cell<usize>,
    supervisor_wakeups: Cell<u64>,
}

impl Common {
    fn seconds(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64()
    }

    fn interval_of(&self, at: Instant) -> usize {
        let k = at.saturating_duration_since(self.start).as_micros() / self.plan.interval.as_micros().max(1);
        (k as usize).min(self.plan.intervals() - 1)
    }
}

#[derive(Default)]
struct Slot {
    running: bool,
    /// Sessions started in it, so each has its own random stream (as the engine's slots).
    sessions: u64,
    /// The operation in flight: (op, start, whether it is the first after idle).
    current: Option<(usize, Instant, bool)>,
}

struct Site<D> {
    common: Rc<Common>,
    index: usize,
    host: String,
    driver: D,
    /// Users the profile asks for now.
    want: Cell<usize>,
    slots: RefCell<Vec<Slot>>,
    running: Cell<usize>,
    /// Per operation; empty until the site's first operation.
    ops: RefCell<Vec<SiteOp>>,
    in_flight: Cell<usize>,
    last_end: Cell<Option<Instant>>,
    first_after_idle: RefCell<Vec<FirstAfterIdle>>,
}

impl<D: Driver> Site<D> {
    fn start_session(self: &Rc<Self>, slot: usize) {
        let life = {
            let mut slots = self.slots.borrow_mut();
            if slots.len() <= slot {
                slots.resize_with(slot + 1, Slot::default);
            }
            let s = &mut slots[slot];
            s.running = true;
            s.sessions += 1;
            s.sessions - 1
        };
        self.running.set(self.running.get() + 1);
        let common = &self.common;
        common.active_users.set(common.active_users.get() + 1);
        if self.running.get() == 1 {
            common.active_sites.set(common.active_sites.get() + 1);
        }
        // Ids and random streams distinct for every site, slot and session of a slot.
        let id = self.index as u64 * 1_000_000 + slot as u64;
        let seed = engine::session_seed(common.plan.seed, id, life);
        tokio::task::spawn_local(engine::session(self.clone(), slot, id, seed));
    }

    /// Record one operation (on its site, in the fleet's series) by its start.
    fn record(&self, op: usize, started: Instant, took_us: u64, failure: Option<&str>, after_idle: bool) {
        let common = &self.common;
        {
            let mut ops = self.ops.borrow_mut();
            if ops.is_empty() {
                ops.resize_with(common.workload.operations.len(), SiteOp::default);
            }
            match failure {
                None => ops[op].record(took_us),
                Some(kind) => ops[op].error(kind),
            }
        }
        {
            let mut series = common.series.borrow_mut();
            let interval = &mut series[common.interval_of(started)];
            match failure {
                None => interval.record(took_us),
                Some(_) => interval.errors += 1,
            }
        }
        if after_idle {
            self.first_after_idle.borrow_mut().push(FirstAfterIdle {
                t: common.seconds(started),
                op: common.workload.operations[op].name.clone(),
                ms: took_us as f64 / 1000.0,
                ok: failure.is_none() && took_us <= common.limits_us[op],
            });
        }
    }

    fn result(&self) -> Result<SiteResult> {
        Ok(SiteResult {
            index: self.index,
            host: self.host.clone(),
            sessions: self.slots.borrow().iter().map(|s| s.sessions).sum(),
            ops: self.ops.borrow().iter().map(SiteOp::to_wire).collect::<Result<_>>()?,
            first_after_idle: self.first_after_idle.borrow().clone(),
        })
    }
}

impl<D: Driver> Sessions for Site<D> {
    type Driver = D;

    fn driver(&self) -> &D {
        &self.driver
    }

    fn workload(&self) -> &Workload {
        &self.common.workload
    }

    fn wanted(&self, slot: usize) -> bool {
        !self.common.stop.get() && slot < self.want.get()
    }

    fn interrupted(&self, slot: usize) -> bool {
        // A user the profile no longer has leaves while thinking, so the site's users match
        // its profile within a think-time slice.
        !self.wanted(slot)
    }

    fn begin(&self, slot: usize, op: usize, started: Instant) {
        let after_idle = first_after_idle(self.in_flight.get(), self.last_end.get(), started, self.common.plan.idle_gap);
        self.in_flight.set(self.in_flight.get() + 1);
        self.common.in_flight.set(self.common.in_flight.get() + 1);
        self.slots.borrow_mut()[slot].current = Some((op, started, after_idle));
    }

    fn end(
        &self,
        slot: usize,
        op: usize,
        started: Instant,
        took_us: u64,
        outcome: &Result<(), Failure>,
        counters: &BTreeMap<String, u64>,
        cycle_ms: f64,
    ) {
        let after_idle = self.slots.borrow_mut()[slot].current.take().is_some_and(|c| c.2);
        self.in_flight.set(self.in_flight.get() - 1);
        let common = &self.common;
        common.in_flight.set(common.in_flight.get() - 1);
        let ended = started + Duration::from_micros(took_us);
        self.last_end.set(Some(self.last_end.get().map_or(ended, |e| e.max(ended))));
        self.record(op, started, took_us, outcome.as_ref().err().map(|f| f.kind.as_str()), after_idle);
        let mut all = common.counters.borrow_mut();
        for (k, v) in counters {
            *all.entry(k.clone()).or_default() += v;
        }
        common.cycles.set(common.cycles.get() + 1);
        common.cycle_ms_sum.set(common.cycle_ms_sum.get() + cycle_ms);
        if let Err(f) = outcome {
            engine::tracing_error(common.plan.agent, &format!("{} {}", self.host, common.workload.operations[op].name), f);
        }
    }

    fn left(&self, slot: usize) {
        self.slots.borrow_mut()[slot].running = false;
        self.running.set(self.running.get() - 1);
        let common = &self.common;
        common.active_users.set(common.active_users.get() - 1);
        if self.running.get() == 0 {
            common.active_sites.set(common.active_sites.get() - 1);
        }
    }
}

/// Drive `sites` for the plan's span and return what was measured. Sites without users cost
/// nothing: a busy site's supervisor sleeps until its profile's next change.
pub async fn run<D: Driver>(sites: Vec<SitePlan<D>>, workload: Workload, plan: FleetPlan) -> Result<FleetAgentResult> {
    let limits_us = workload.operations.iter().map(|op| (op.max90_s * 1e6) as u64).collect();
    // Operations still unanswered this long after the end are past every limit.
    let grace = Duration::from_secs_f64(workload.operations.iter().map(|op| op.max90_s).fold(0.0, f64::max) + 1.0);
    let common = Rc::new(Common {
        series: RefCell::new((0..plan.intervals()).map(|_| Interval::default()).collect()),
        workload,
        start: Instant::now(),
        stop: Cell::new(false),
        limits_us,
        counters: RefCell::new(BTreeMap::new()),
        cycles: Cell::new(0),
        cycle_ms_sum: Cell::new(0.0),
        active_users: Cell::new(0),
        active_sites: Cell::new(0),
        in_flight: Cell::new(0),
        supervisor_wakeups: Cell::new(0),
        plan,
    });
    let local = tokio::task::LocalSet::new();
    let mut all = Vec::with_capacity(sites.len());
    for s in sites {
        let site = Rc::new(Site {
            common: common.clone(),
            index: s.index,
            host: s.host,
            driver: s.driver,
            want: Cell::new(0),
            slots: RefCell::new(Vec::new()),
            running: Cell::new(0),
            ops: RefCell::new(Vec::new()),
            in_flight: Cell::new(0),
            last_end: Cell::new(None),
            first_after_idle: RefCell::new(Vec::new()),
        });
        if !s.steps.is_empty() {
            local.spawn_local(supervise(site.clone(), s.steps));
        }
        all.push(site);
    }
    local.run_until(report_until_the_end(&common, grace)).await;
    // Whatever is still in flight is dropped with the LocalSet; count it as failed.
    let now = Instant::now();
    for site in &all {
        let unfinished: Vec<_> = site.slots.borrow().iter().filter_map(|s| s.current).collect();
        for (op, started, after_idle) in unfinished {
            site.record(op, started, now.saturating_duration_since(started).as_micros() as u64, Some(UNFINISHED), after_idle);
        }
    }
    drop(local);
    let series = common.series.borrow().iter().map(Interval::to_wire).collect::<Result<_>>()?;
    let counters = common.counters.borrow().clone();
    Ok(FleetAgentResult {
        agent: common.plan.agent,
        sites: all.iter().map(|s| s.result()).collect::<Result<_>>()?,
        series,
        counters,
        cycles: common.cycles.get(),
        cycle_ms_sum: common.cycle_ms_sum.get(),
        supervisor_wakeups: common.supervisor_wakeups.get(),
    })
}

/// Set the site's users at each of its profile's changes: start sessions in the free slots
/// below the new count (sessions above it leave by themselves).
async fn supervise<D: Driver>(site: Rc<Site<D>>, steps: Vec<(f64, usize)>) {
    for (t, users) in steps {
        tokio::time::sleep_until(site.common.start + Duration::from_secs_f64(t)).await;
        let common = &site.common;
        common.supervisor_wakeups.set(common.supervisor_wakeups.get() + 1);
        if common.stop.get() {
            return;
        }
        site.want.set(users);
        for slot in 0..users {
            let free = site.slots.borrow().get(slot).is_none_or(|s| !s.running);
            if free {
                site.start_session(slot);
            }
        }
    }
}

/// At each interval's end, note the active users and sites and print a progress line; at the
/// span's end, stop the sessions and give operations in flight `grace` to finish.
async fn report_until_the_end(common: &Common, grace: Duration) {
    let plan = &common.plan;
    let n = plan.intervals();
    for k in 0..n {
        let end = (plan.interval * (k as u32 + 1)).min(plan.span);
        tokio::time::sleep_until(common.start + end).await;
        let (users, sites) = (common.active_users.get(), common.active_sites.get());
        let mut series = common.series.borrow_mut();
        series[k].active_users = users;
        series[k].active_sites = sites;
        if plan.progress {
            let i = &series[k];
            let seconds = (end - plan.interval * k as u32).as_secs_f64();
            let ops = i.hist.as_ref().map_or(0, |h| h.len());
            let p90 = i.hist.as_ref().map_or("-".to_string(), |h| format!("{} ms", h.value_at_quantile(0.9) / 1000));
            eprintln!(
                "[fleet agent {}] {:>5.0}s  sites {:>5}  users {:>5}  {:>7.1} ops/s  errors {:>4}  p90 {}",
                plan.agent,
                end.as_secs_f64(),
                sites,
                users,
                ops as f64 / seconds,
                i.errors,
                p90
            );
        }
    }
    common.stop.set(true);
    let deadline = Instant::now() + grace;
    while common.in_flight.get() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::fleet::Fleet;
    use crate::stats;
    use rand::rngs::SmallRng;
    use rand::Rng;

    /// Each call (host, seconds from the log's start, user id) a fake site received.
    pub(crate) type Log = Rc<RefCell<Vec<(String, f64, u64)>>>;
    /// Each user a fake site made: (host, id, first random draw of its session).
    pub(crate) type Users = Rc<RefCell<Vec<(String, u64, u64)>>>;

    /// A site that answers every operation in a fixed time (or never), and logs its calls.
    pub(crate) struct Fake {
        pub host: String,
        pub took: Option<Duration>,
        pub log: Log,
        pub t0: Instant,
        pub users: Users,
    }

    impl Driver for Fake {
        type User = u64;
        fn new_user(&self, id: u64, _: bool, rng: &mut SmallRng) -> u64 {
            self.users.borrow_mut().push((self.host.clone(), id, rng.random()));
            id
        }
        async fn run(&self, user: &mut u64, _: usize, _: &mut SmallRng, counters: &mut BTreeMap<String, u64>) -> Result<(), Failure> {
            self.log.borrow_mut().push((self.host.clone(), self.t0.elapsed().as_secs_f64(), *user));
            *counters.entry("http_requests".into()).or_default() += 1;
            match self.took {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
            Ok(())
        }
    }

    pub(crate) fn olio() -> Workload {
        Workload::parse(include_str!("../../../bench/workloads/olio.toml")).unwrap()
    }

    pub(crate) fn plan(span_s: u64, idle_gap_s: u64) -> FleetPlan {
        FleetPlan {
            span: Duration::from_secs(span_s),
            interval: Duration::from_secs(10),
            idle_gap: Duration::from_secs(idle_gap_s),
            seed: 5,
            agent: 0,
            progress: false,
        }
    }

    /// A fleet file of `busy` sites (their profiles given) and `idle` more with no users.
    pub(crate) fn fleet(span_s: u64, busy: &[&str], idle: usize) -> Fleet {
        let mut sites: Vec<String> =
            busy.iter().enumerate().map(|(i, p)| format!(r#"{{"name": "b{i}", "host": "b{i}.test", "profile": {p}}}"#)).collect();
        sites.extend((0..idle).map(|i| format!(r#"{{"name": "i{i}", "host": "i{i}.test", "profile": [[0, 0], [10, 0]]}}"#)));
        Fleet::parse(&format!(r#"{{"version": 1, "span_s": {span_s}, "registered_users": 10, "sites": [{}]}}"#, sites.join(","))).unwrap()
    }

    /// The fake sites of agent 0 of `agents`, all logging to one log.
    pub(crate) fn sites(fleet: &Fleet, took: Option<Duration>, agents: u32) -> (Vec<SitePlan<Fake>>, Log, Users) {
        let log: Log = Rc::default();
        let users: Users = Rc::default();
        let t0 = Instant::now();
        let plans = fleet
            .sites_of(0, agents)
            .map(|(index, s)| SitePlan {
                index,
                host: s.host.clone(),
                steps: s.steps(fleet.span_s),
                driver: Fake { host: s.host.clone(), took, log: log.clone(), t0, users: Rc::clone(&users) },
            })
            .collect();
        (plans, log, users)
    }

    #[tokio::test(start_paused = true)]
    async fn users_follow_each_sites_profile_and_idle_sites_cost_nothing() {
        let fleet =
            fleet(300, &["[[0, 2], [100.5, 0]]", "[[0, 0], [50.5, 3], [150.5, 1]]", "[[0, 1], [20.5, 0], [200.5, 2], [400, 5]]"], 1000);
        let (plans, log, _) = sites(&fleet, Some(Duration::from_millis(20)), 1);
        let r = run(plans, olio(), plan(300, 60)).await.unwrap();
        // At each interval's end, the sessions running are what the profiles ask (users leave
        // while thinking, within half a second of their step).
        assert_eq!(r.series.len(), 30);
        for (k, i) in r.series.iter().enumerate() {
            let t = (k + 1) as f64 * 10.0;
            let want = fleet.users_at(t);
            assert_eq!(i.active_users, want, "at {t} s: {:?}", r.series.iter().map(|i| i.active_users).collect::<Vec<_>>());
            let sites = fleet.sites.iter().filter(|s| s.profile.users_at(t) > 0).count();
            assert_eq!(i.active_sites, sites, "at {t} s");
        }
        // Each operation fell while its site had users (a session ends at its next operation
        // or within a think-time slice).
        let log = log.borrow();
        for (host, t, _) in log.iter() {
            let site = fleet.sites.iter().find(|s| &s.host == host).unwrap();
            assert!(site.profile.users_at(*t) > 0 || site.profile.users_at(t - 0.6) > 0, "{host} at {t} s");
        }
        // b0: 2 users for 100 s at 5 s cycles, about 40 operations.
        let b0 = log.iter().filter(|c| c.0 == "b0.test").count();
        assert!((25..60).contains(&b0), "{b0}");
        // Idle sites were never called, started nothing, and their supervisors never woke:
        // only the busy sites' profile changes did (b1's idle start is no change, and b2's
        // change at 400 s is past the span).
        assert!(log.iter().all(|c| c.0.starts_with('b')));
        assert_eq!(r.supervisor_wakeups, 2 + 2 + 3);
        assert_eq!(r.sites.len(), 1003);
        assert!(r.sites[3..].iter().all(|s| s.ops.is_empty() && s.sessions == 0 && s.first_after_idle.is_empty()));
        assert_eq!(r.sites[1].sessions, 3, "the step down to 1 keeps slot 0's session");
        let ops: u64 = r.sites.iter().flat_map(|s| &s.ops).map(|w| stats::decode_histogram(&w.hist).unwrap().len()).sum();
        assert_eq!(ops as usize, log.len());
        assert_eq!(r.counters["http_requests"] as usize, log.len());
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_operation_after_each_idle_gap_is_recorded() {
        // One user for 20 s, none for 80 s, one again for 10 s.
        let fleet = fleet(300, &["[[0, 1], [20.5, 0], [100, 1], [110, 0]]"], 0);
        let (plans, _, _) = sites(&fleet, Some(Duration::from_millis(1500)), 1);
        let r = run(plans, olio(), plan(300, 60)).await.unwrap();
        let idle = &r.sites[0].first_after_idle;
        assert_eq!(idle.len(), 2, "{idle:?}");
        assert_eq!((idle[0].t, idle[0].op.as_str()), (0.0, "HomePage"));
        assert!((idle[1].t - 100.0).abs() < 1e-9 && idle[1].op == "HomePage", "{idle:?}");
        // 1.5 s is past HomePage's 1 s limit.
        assert!(idle.iter().all(|f| (f.ms - 1500.0).abs() < 1.0 && !f.ok), "{idle:?}");
        // With a longer gap than the 80 s pause, only the very first counts.
        let (plans, _, _) = sites(&fleet, Some(Duration::from_millis(1500)), 1);
        let r = run(plans, olio(), plan(300, 90)).await.unwrap();
        assert_eq!(r.sites[0].first_after_idle.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_operation_unanswered_at_the_end_fails() {
        let fleet = fleet(30, &["[[0, 1]]"], 0);
        let (plans, _, _) = sites(&fleet, None, 1);
        let r = run(plans, olio(), plan(30, 60)).await.unwrap();
        let errors: u64 = r.sites[0].ops.iter().map(|w| w.errors.get(UNFINISHED).copied().unwrap_or(0)).sum();
        assert_eq!(errors, 1);
        assert_eq!(r.series[0].errors, 1, "counted in the interval it started in");
        assert!(!r.sites[0].first_after_idle[0].ok);
    }

    #[tokio::test(start_paused = true)]
    async fn sessions_draw_streams_of_their_own_per_site_and_slot() {
        let fleet = fleet(60, &["[[0, 3], [20, 0], [30, 3]]", "[[0, 3], [20, 0], [30, 3]]"], 0);
        let (plans, _, users) = sites(&fleet, Some(Duration::from_millis(5)), 1);
        run(plans, olio(), plan(60, 60)).await.unwrap();
        let users = users.borrow();
        assert_eq!(users.len(), 12, "3 slots, twice, on each of 2 sites");
        let mut draws: Vec<u64> = users.iter().map(|u| u.2).collect();
        draws.sort_unstable();
        draws.dedup();
        assert_eq!(draws.len(), 12, "{users:?}");
        assert!(users.iter().any(|u| u.0 == "b1.test" && u.1 == 1_000_002), "site 1's slot 2: {users:?}");
    }
}
