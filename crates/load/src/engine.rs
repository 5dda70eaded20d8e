//! The closed loop: simulated users, each moving between operations by the workload's chain
//! with negative-exponential cycle times, started over the ramp-up, measured through the
//! steady state, stopped after the ramp-down; the number of active users may follow a load
//! profile. Runs on one thread (a current-thread tokio runtime): an agent is one process.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;

use anyhow::Result;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::browser::Failure;
use crate::profile::Profile;
use crate::stats::{Windows, WireWindows};
use crate::workload::Workload;

/// Performs a workload's operations for one application.
pub trait Driver: 'static {
    type User: 'static;
    /// A new simulated user (`cold`: its browser cache starts empty).
    fn new_user(&self, id: u64, cold: bool, rng: &mut SmallRng) -> Self::User;
    /// Perform operation `op`; counters it bumps (e.g. "attend") go in `counters`.
    fn run(
        &self,
        user: &mut Self::User,
        op: usize,
        rng: &mut SmallRng,
        counters: &mut BTreeMap<String, u64>,
    ) -> impl Future<Output = Result<(), Failure>>;
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub users: usize,
    pub ramp_up: Duration,
    pub steady: Duration,
    pub ramp_down: Duration,
    /// SLA window length (Cloudstone: 5 minutes; shorter for short runs).
    pub window: Duration,
    /// Time-series interval (and progress lines).
    pub interval: Duration,
    /// Pause between starting two users (Faban's thread start delay), at most.
    pub start_delay: Duration,
    pub profile: Option<Profile>,
    pub seed: u64,
    /// This agent's number (0-based) of `agents`: it runs the global user slots s with
    /// s % agents == agent; user ids are agent-unique (agent * 1,000,000 + n).
    pub agent: u32,
    pub agents: u32,
    pub progress: bool,
}

impl Plan {
    pub fn total(&self) -> Duration {
        self.ramp_up + self.steady + self.ramp_down
    }

    /// Users wanted on this agent at `t` into the run.
    pub fn users_at(&self, t: Duration) -> usize {
        let global = match &self.profile {
            Some(p) => p.users_at(t.as_secs_f64()),
            None => self.users,
        };
        share(global, self.agent, self.agents)
    }
}

/// How many of `global` user slots agent `agent` of `agents` runs (slots dealt round-robin).
pub fn share(global: usize, agent: u32, agents: u32) -> usize {
    let (agent, agents) = (agent as usize, agents.max(1) as usize);
    if global > agent {
        (global - agent).div_ceil(agents)
    } else {
        0
    }
}

/// What an agent measured, in a form a controller merges exactly.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct AgentResult {
    pub agent: u32,
    /// Per SLA window of the steady state.
    pub steady: Option<WireWindows>,
    /// Per interval from the start of the run (ramps included).
    pub series: Option<WireWindows>,
    pub cycles: u64,
    pub cycle_ms_sum: f64,
    pub counters: BTreeMap<String, u64>,
    /// (seconds into the run, active users) each interval.
    pub active_users: Vec<(f64, usize)>,
}

struct Shared<D: Driver> {
    driver: D,
    workload: Workload,
    plan: Plan,
    start: Instant,
    steady: RefCell<Windows>,
    series: RefCell<Windows>,
    cycles: Cell<u64>,
    cycle_ms_sum: Cell<f64>,
    counters: RefCell<BTreeMap<String, u64>>,
    stop: Cell<bool>,
    /// The user slots: a session runs in a free one.
    slots: RefCell<Vec<Slot>>,
}

#[derive(Clone, Copy, Default)]
struct Slot {
    /// A session's task runs in it.
    running: bool,
    /// Sessions it has started: a profile that lowers the users and raises them again starts
    /// new sessions in old slots, each with its own random stream (the same stream would
    /// replay its predecessor's walk and re-register its user names). Counted per slot so that
    /// a slot's first session keeps the stream it always had.
    sessions: u64,
}

fn running(slots: &RefCell<Vec<Slot>>) -> usize {
    slots.borrow().iter().filter(|s| s.running).count()
}

impl<D: Driver> Shared<D> {
    fn in_steady(&self, t: Duration) -> bool {
        t >= self.plan.ramp_up && t < self.plan.ramp_up + self.plan.steady
    }
}

/// Run the plan to its end and return what was measured.
pub async fn run<D: Driver>(driver: D, workload: Workload, plan: Plan) -> Result<AgentResult> {
    let ops = workload.operations.len();
    let shared = Rc::new(Shared {
        steady: RefCell::new(Windows::new(ops, plan.window.as_micros() as u64)),
        series: RefCell::new(Windows::new(ops, plan.interval.as_micros() as u64)),
        driver,
        workload,
        start: Instant::now(),
        cycles: Cell::new(0),
        cycle_ms_sum: Cell::new(0.0),
        counters: RefCell::new(BTreeMap::new()),
        stop: Cell::new(false),
        slots: RefCell::new(Vec::new()),
        plan,
    });
    let local = tokio::task::LocalSet::new();
    let active_users = local.run_until(supervise(shared.clone())).await;
    let steady = shared.steady.borrow().to_wire()?;
    let series = shared.series.borrow().to_wire()?;
    let counters = shared.counters.borrow().clone();
    Ok(AgentResult {
        agent: shared.plan.agent,
        steady: Some(steady),
        series: Some(series),
        cycles: shared.cycles.get(),
        cycle_ms_sum: shared.cycle_ms_sum.get(),
        counters,
        active_users,
    })
}

/// Start and stop users to follow the plan; print progress; return the active-user series.
async fn supervise<D: Driver>(shared: Rc<Shared<D>>) -> Vec<(f64, usize)> {
    let plan = shared.plan.clone();
    let mut series = Vec::new();
    let mut next_report = plan.interval;
    let mut last_started = Instant::now() - plan.start_delay;
    let mut last_count = 0u64;
    // Users start no faster than one per start_delay, and fast enough to be all up by the
    // end of the ramp-up.
    let mine = share(plan.users, plan.agent, plan.agents);
    let stagger = if mine > 0 { plan.start_delay.min(plan.ramp_up / mine as u32) } else { plan.start_delay };
    loop {
        let t = shared.start.elapsed();
        if t >= plan.total() {
            break;
        }
        let want = plan.users_at(t);
        if running(&shared.slots) < want && last_started.elapsed() >= stagger {
            let (slot, life) = {
                let mut slots = shared.slots.borrow_mut();
                let slot = slots.iter().position(|s| !s.running).unwrap_or(slots.len());
                if slot == slots.len() {
                    slots.push(Slot::default());
                }
                let free = &mut slots[slot];
                free.running = true;
                free.sessions += 1;
                (slot, free.sessions - 1)
            };
            last_started = Instant::now();
            tokio::task::spawn_local(user_loop(shared.clone(), slot, life));
        }
        if t >= next_report {
            let active = running(&shared.slots);
            series.push((t.as_secs_f64(), active));
            if plan.progress {
                last_count = report(&shared, t, active, last_count);
            }
            next_report += plan.interval;
        }
        tokio::time::sleep(Duration::from_millis(if stagger.is_zero() { 1 } else { stagger.as_millis().clamp(1, 50) as u64 })).await;
    }
    shared.stop.set(true);
    // Let operations in flight finish (they are past the steady state, not recorded) for a
    // moment, then drop them.
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(&shared.slots) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    series
}

fn report<D: Driver>(shared: &Shared<D>, t: Duration, active: usize, last_count: u64) -> u64 {
    let plan = &shared.plan;
    let phase = if t < plan.ramp_up {
        "ramp-up"
    } else if t < plan.ramp_up + plan.steady {
        "steady"
    } else {
        "ramp-down"
    };
    let series = shared.series.borrow();
    let count: u64 = series.windows.iter().flatten().map(|s| s.hist.len()).sum();
    let errors: u64 = series.windows.iter().flatten().map(|s| s.error_count()).sum();
    let rate = (count - last_count) as f64 / plan.interval.as_secs_f64();
    // The last interval that has ended: the one just opened holds only its first moments.
    let p90 = last_complete(t, plan.interval).and_then(|i| series.windows.get(i)).map(|w| {
        w.iter()
            .zip(&shared.workload.operations)
            .filter(|(s, _)| !s.hist.is_empty())
            .map(|(s, op)| format!("{} {}", op.name, s.hist.value_at_quantile(0.9) / 1000))
            .collect::<Vec<_>>()
            .join(", ")
    });
    eprintln!(
        "[agent {}] {:>5.0}s {:<9} users {:>5}  {:>7.1} ops/s  errors {:>4}  p90 ms: {}",
        plan.agent,
        t.as_secs_f64(),
        phase,
        active,
        rate,
        errors,
        p90.unwrap_or_default()
    );
    count
}

/// The index of the last interval of length `interval` that had ended by `t` (None before
/// the first has).
fn last_complete(t: Duration, interval: Duration) -> Option<usize> {
    ((t.as_micros() / interval.as_micros().max(1)) as usize).checked_sub(1)
}

/// The random stream of the `life`-th session in user slot `id`: distinct for every slot and
/// every session a slot starts, the same from run to run for one seed.
pub(crate) fn session_seed(seed: u64, id: u64, life: u64) -> u64 {
    seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ life.wrapping_mul(0xD1B5_4A32_D192_ED03).rotate_left(29)
}

/// What a session needs from the run it belongs to: the driver and workload it walks, whether
/// it should go on, and where its measurements go. A single-site run and each site of a fleet
/// implement it, so both walk sessions alike.
pub(crate) trait Sessions: 'static {
    type Driver: Driver;
    fn driver(&self) -> &Self::Driver;
    fn workload(&self) -> &Workload;
    /// Whether the session in `slot` starts another operation now.
    fn wanted(&self, slot: usize) -> bool;
    /// Whether the session in `slot` should stop thinking and leave.
    fn interrupted(&self, slot: usize) -> bool;
    /// Operation `op` starts now, at `started`.
    fn begin(&self, _slot: usize, _op: usize, _started: Instant) {}
    /// Operation `op`, started at `started`, took `took_us` with `outcome`, bumped `counters`;
    /// its cycle (to the next operation's start, or its own end when longer) is `cycle_ms`.
    #[allow(clippy::too_many_arguments)] // one operation's measurements, each once
    fn end(
        &self,
        slot: usize,
        op: usize,
        started: Instant,
        took_us: u64,
        outcome: &Result<(), Failure>,
        counters: &BTreeMap<String, u64>,
        cycle_ms: f64,
    );
    /// The session in `slot` has ended.
    fn left(&self, slot: usize);
}

/// One user session: a new user of the driver (its browser cache cold for the workload's
/// share of sessions), moving between operations by the chain with cycle times drawn from the
/// workload's distribution, until its run no longer wants it.
pub(crate) async fn session<S: Sessions>(run: Rc<S>, slot: usize, id: u64, seed: u64) {
    let workload = run.workload();
    let mut rng = SmallRng::seed_from_u64(seed);
    let cold = rng.random::<f64>() < workload.cold_cache_share;
    let mut user = run.driver().new_user(id, cold, &mut rng);
    let mut op = 0usize;
    let mut counters = BTreeMap::new();
    loop {
        if !run.wanted(slot) {
            break;
        }
        let started = Instant::now();
        counters.clear();
        run.begin(slot, op, started);
        let outcome = run.driver().run(&mut user, op, &mut rng, &mut counters).await;
        let took = started.elapsed().as_micros() as u64;
        let next = workload.chain.next(op, &mut rng);
        let delay = workload.cycle.draw(workload.operations[next].min_cycle_ms, &mut rng);
        run.end(slot, op, started, took, &outcome, &counters, delay.max(took as f64 / 1000.0));
        let wake = started + Duration::from_secs_f64(delay / 1000.0);
        // Sleep in slices so a stop or a lower profile ends the session promptly.
        while Instant::now() < wake && !run.interrupted(slot) {
            let left = wake.saturating_duration_since(Instant::now());
            tokio::time::sleep(left.min(Duration::from_millis(500))).await;
        }
        op = next;
    }
    run.left(slot);
}

async fn user_loop<D: Driver>(shared: Rc<Shared<D>>, slot: usize, life: u64) {
    let id = shared.plan.agent as u64 * 1_000_000 + slot as u64;
    let seed = session_seed(shared.plan.seed, id, life);
    session(shared, slot, id, seed).await
}

impl<D: Driver> Sessions for Shared<D> {
    type Driver = D;

    fn driver(&self) -> &D {
        &self.driver
    }

    fn workload(&self) -> &Workload {
        &self.workload
    }

    fn wanted(&self, slot: usize) -> bool {
        !self.stop.get() && slot < self.plan.users_at(self.start.elapsed())
    }

    fn interrupted(&self, _slot: usize) -> bool {
        // A lower profile ends a session after its cycle (at its next operation's start).
        self.stop.get()
    }

    fn end(
        &self,
        _slot: usize,
        op: usize,
        started: Instant,
        took: u64,
        outcome: &Result<(), Failure>,
        counters: &BTreeMap<String, u64>,
        cycle_ms: f64,
    ) {
        let plan = &self.plan;
        let t = started - self.start;
        let measured = self.in_steady(t);
        {
            let mut series = self.series.borrow_mut();
            let s = series.at(t.as_micros() as u64, op);
            match outcome {
                Ok(()) => s.record(took),
                Err(f) => s.error(&f.kind),
            }
        }
        if measured {
            let at = (t - plan.ramp_up).as_micros() as u64;
            let mut steady = self.steady.borrow_mut();
            let s = steady.at(at, op);
            match outcome {
                Ok(()) => s.record(took),
                Err(f) => s.error(&f.kind),
            }
            let mut all = self.counters.borrow_mut();
            for (k, v) in counters {
                *all.entry(k.clone()).or_default() += v;
            }
        }
        if let Err(f) = outcome {
            tracing_error(plan.agent, &self.workload.operations[op].name, f);
        }
        // Cycles are counted for operations that started in the steady state (by start, so
        // long cycles near its end are not missed).
        if measured {
            self.cycles.set(self.cycles.get() + 1);
            self.cycle_ms_sum.set(self.cycle_ms_sum.get() + cycle_ms);
        }
    }

    fn left(&self, slot: usize) {
        self.slots.borrow_mut()[slot].running = false;
    }
}

/// The first few failures of each kind are printed; after that they are only counted.
pub(crate) fn tracing_error(agent: u32, op: &str, f: &Failure) {
    thread_local! {
        static SEEN: RefCell<BTreeMap<String, u32>> = const { RefCell::new(BTreeMap::new()) };
    }
    SEEN.with(|seen| {
        let mut seen = seen.borrow_mut();
        let n = seen.entry(f.kind.clone()).or_default();
        *n += 1;
        if *n <= 3 {
            eprintln!("[agent {agent}] {op} failed: {f}{}", if *n == 3 { " (further errors of this kind are only counted)" } else { "" });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks;
    use crate::stats::Windows;

    #[test]
    fn progress_shows_the_interval_that_has_ended() {
        let ten = Duration::from_secs(10);
        assert_eq!(last_complete(Duration::from_millis(9_999), ten), None);
        assert_eq!(last_complete(Duration::from_millis(10_002), ten), Some(0), "not window 1, a few ms old");
        assert_eq!(last_complete(Duration::from_secs(35), ten), Some(2));
    }

    /// A driver whose operations take a fixed time and never touch a network: it exercises
    /// the engine's arithmetic (the HTTP drivers are tested against the real application).
    struct Sleeper(Duration);

    impl Driver for Sleeper {
        type User = ();
        fn new_user(&self, _: u64, _: bool, _: &mut SmallRng) {}
        async fn run(&self, _: &mut (), op: usize, _: &mut SmallRng, counters: &mut BTreeMap<String, u64>) -> Result<(), Failure> {
            tokio::time::sleep(self.0).await;
            *counters.entry(format!("op{op}")).or_default() += 1;
            Ok(())
        }
    }

    fn plan(users: usize, steady_s: u64, profile: Option<Profile>) -> Plan {
        Plan {
            users,
            ramp_up: Duration::from_secs(30),
            steady: Duration::from_secs(steady_s),
            ramp_down: Duration::from_secs(10),
            window: Duration::from_secs(300),
            interval: Duration::from_secs(30),
            start_delay: Duration::from_millis(100),
            profile,
            seed: 3,
            agent: 0,
            agents: 1,
            progress: false,
        }
    }

    fn olio() -> Workload {
        Workload::parse(include_str!("../../../bench/workloads/olio.toml")).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_run_meets_the_mix_and_cycle_checks() {
        // 200 users for 30 virtual minutes: about 70,000 operations.
        let w = olio();
        let r = run(Sleeper(Duration::from_millis(20)), w.clone(), plan(200, 1800, None)).await.unwrap();
        let steady = Windows::from_wire(r.steady.as_ref().unwrap()).unwrap();
        assert_eq!(steady.windows.len(), 6, "six 5-minute windows");
        let total = steady.total();
        let ops: u64 = total.iter().map(|s| s.hist.len()).sum();
        assert!(ops > 60_000, "{ops}");
        let mix = checks::mix(&w, &total);
        assert!(mix.passed, "{}", mix.detail);
        let cycle = checks::cycle_time(&w, r.cycle_ms_sum / r.cycles as f64, r.cycles);
        assert!(cycle.passed, "{}", cycle.detail);
        // Each operation took 20 ms of (virtual) time.
        assert!((total[0].summary().p90_ms - 20.0).abs() < 1.0);
        assert_eq!(r.counters.values().sum::<u64>(), ops);
        // All users were up by the end of the ramp-up.
        assert!(r.active_users.iter().any(|&(t, u)| t >= 30.0 && u == 200), "{:?}", r.active_users);
    }

    #[test]
    fn slots_are_dealt_round_robin() {
        assert_eq!((0..3).map(|a| share(10, a, 3)).collect::<Vec<_>>(), vec![4, 3, 3]);
        assert_eq!((0..3).map(|a| share(2, a, 3)).collect::<Vec<_>>(), vec![1, 1, 0]);
        assert_eq!(share(7, 0, 1), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn users_follow_the_profile() {
        let profile = Profile::parse("0 10\n100 50\n200 5\n").unwrap();
        let r = run(Sleeper(Duration::from_millis(5)), olio(), plan(50, 300, Some(profile))).await.unwrap();
        let at = |s: f64| r.active_users.iter().find(|(t, _)| *t >= s).map(|p| p.1).unwrap();
        assert_eq!(at(90.0), 10);
        assert_eq!(at(150.0), 50);
        // Sessions end after their current cycle: within a cap (25 s) of the step down.
        assert_eq!(at(240.0), 5);
    }

    /// Records each session's slot and first random draw (what a driver would name a new
    /// account after).
    struct Namer(RefCell<Vec<(u64, u64)>>);

    impl Driver for Namer {
        type User = ();
        fn new_user(&self, id: u64, _: bool, rng: &mut SmallRng) {
            self.0.borrow_mut().push((id, rng.random()));
        }
        async fn run(&self, _: &mut (), _: usize, _: &mut SmallRng, _: &mut BTreeMap<String, u64>) -> Result<(), Failure> {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_started_again_draws_a_new_random_stream() {
        // 10 users, down to 2, up to 10 again: slots 2-9 start a second session.
        let profile = Profile::parse("0 10\n100 2\n200 10\n").unwrap();
        let namer = Namer(RefCell::new(Vec::new()));
        let seen = Rc::new(namer);
        run(SharedDriver(seen.clone()), olio(), plan(10, 300, Some(profile))).await.unwrap();
        let sessions = seen.0.borrow().clone();
        let again: Vec<_> = sessions.iter().filter(|(id, _)| sessions.iter().filter(|(other, _)| other == id).count() > 1).collect();
        assert!(again.len() >= 16, "slots 2-9 should each have started twice: {sessions:?}");
        let mut draws: Vec<u64> = sessions.iter().map(|(_, d)| *d).collect();
        draws.sort_unstable();
        draws.dedup();
        assert_eq!(draws.len(), sessions.len(), "a session replayed another's random stream: {sessions:?}");
        // The same seed gives the same streams: runs are reproducible.
        assert_eq!(session_seed(3, 5, 1), session_seed(3, 5, 1));
        assert_ne!(session_seed(3, 5, 0), session_seed(3, 5, 1));
    }

    /// Lends a driver to a run while the test keeps a handle on it.
    struct SharedDriver<D>(Rc<D>);

    impl<D: Driver> Driver for SharedDriver<D> {
        type User = D::User;
        fn new_user(&self, id: u64, cold: bool, rng: &mut SmallRng) -> D::User {
            self.0.new_user(id, cold, rng)
        }
        async fn run(
            &self,
            user: &mut D::User,
            op: usize,
            rng: &mut SmallRng,
            counters: &mut BTreeMap<String, u64>,
        ) -> Result<(), Failure> {
            self.0.run(user, op, rng, counters).await
        }
    }
}
