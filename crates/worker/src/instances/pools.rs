//! The bookkeeping of sandboxes per lambda as a pure state machine: whether a request gets an
//! idle sandbox, room to make a new one, or a place in its lambda's queue; where a sandbox goes
//! after its request; and which idle sandboxes are evicted (least recently used to make room,
//! idle too long, of a replaced version, or past the handler cache's memory limit).
//!
//! It performs nothing itself: each method changes the counts and returns what the caller must
//! do (destroy these, make one, resume that), and hands sandboxes and room to waiting requests
//! through the [`Waiter`] it was given. [`super::Instances`] drives it with real sandboxes and
//! tokio channels; the tests below drive it with plain values and explicit instants.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::handler_cache::{self, Eviction};

/// What the pools need to know of a sandbox they keep.
pub trait Occupant {
    /// Unique among the worker's sandboxes.
    fn id(&self) -> u64;
    /// The version of the lambda it was made for.
    fn version(&self) -> u64;
    /// False once that version was replaced or deleted.
    fn is_current(&self) -> bool;
}

/// What a queued request is handed.
pub enum Grant<O> {
    /// A sandbox just released by the request that used it (possibly of another version).
    Sandbox(O),
    /// Room to make a new sandbox, already counted as live.
    Room,
}

/// A queued request's end of a hand-off.
pub trait Waiter<O>: Sized {
    /// Hand `grant` over; gives it back if the request stopped waiting.
    fn grant(self, grant: Grant<O>) -> Result<(), Grant<O>>;
    /// Whether the request stopped waiting (its grant would come back).
    fn is_gone(&self) -> bool;
}

/// The counts the pools enforce.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_per_lambda: usize,
    pub max_total: usize,
    pub queue_depth: usize,
}

/// An idle sandbox.
pub struct Idle<O> {
    pub occupant: O,
    /// When its last request ended.
    pub since: Instant,
    pub paused: bool,
    /// PSS when last measured while paused (0 until then).
    pub pss: u64,
}

/// How a request is served.
pub enum Acquired<O> {
    /// An idle sandbox of its version (resume it first if `paused`).
    Warm(Idle<O>),
    /// Room for a new sandbox, counted as live: make one, or give the room back.
    Create,
    /// The request waits for its [`Waiter`] to be granted something.
    Queued,
    /// The queue holds `queue_depth` requests already.
    Full,
}

/// Where a released sandbox went.
pub enum Released<O> {
    /// To the request that had waited longest.
    Handed,
    /// Into the idle set (schedule its pause).
    Idle,
    /// Out: destroy it (its room went to a waiting request, if any).
    Destroy(O),
}

struct Pool<O, W> {
    idle: Vec<Idle<O>>,
    /// Sandboxes of this lambda that exist or are being made.
    live: usize,
    /// Requests waiting for a sandbox of this lambda or room to make one.
    waiters: VecDeque<W>,
    /// Requests waiting only for a sandbox of this lambda ([`Pools::queue_instead`]): room
    /// reaches them only when one of its sandboxes is destroyed.
    for_sandbox: VecDeque<W>,
    served: u64,
    /// When its recent requests came (within [`RECENT`]): the cost of evicting its sandboxes.
    recent: VecDeque<Instant>,
}

impl<O, W> Default for Pool<O, W> {
    fn default() -> Self {
        Pool { idle: Vec::new(), live: 0, waiters: VecDeque::new(), for_sandbox: VecDeque::new(), served: 0, recent: VecDeque::new() }
    }
}

/// The window a lambda's recent requests are counted in.
pub const RECENT: Duration = Duration::from_secs(60);
/// Most recent requests remembered per lambda.
const MAX_RECENT: usize = 1024;

/// One lambda's figures, for `/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolFigures {
    pub sandboxes: usize,
    pub idle: usize,
    pub queued: usize,
    pub served: u64,
}

/// Every lambda's sandboxes.
pub struct Pools<O, W> {
    bounds: Bounds,
    pools: HashMap<String, Pool<O, W>>,
    total: usize,
}

impl<O: Occupant, W: Waiter<O>> Pools<O, W> {
    pub fn new(bounds: Bounds) -> Self {
        Pools { bounds, pools: HashMap::new(), total: 0 }
    }

    /// Sandboxes that exist or are being made, of every lambda.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Serve a request for `version` of `name`: the most recently used idle sandbox of that
    /// version, else room for a new one (evicting another lambda's least recently used idle
    /// sandbox when the worker is full), else a place in the queue for `waiter()`. Idle
    /// sandboxes of other versions are evicted on the way; the caller destroys `doomed`.
    pub fn acquire(&mut self, name: &str, version: u64, waiter: impl FnOnce() -> W, doomed: &mut Vec<(O, Eviction)>) -> Acquired<O> {
        self.acquire_at(name, version, waiter, doomed, Instant::now())
    }

    /// [`Pools::acquire`] at `now`.
    pub fn acquire_at(
        &mut self,
        name: &str,
        version: u64,
        waiter: impl FnOnce() -> W,
        doomed: &mut Vec<(O, Eviction)>,
        now: Instant,
    ) -> Acquired<O> {
        let pool = pool_of(&mut self.pools, name);
        while pool.recent.front().is_some_and(|t| now.saturating_duration_since(*t) > RECENT) || pool.recent.len() >= MAX_RECENT {
            pool.recent.pop_front();
        }
        pool.recent.push_back(now);
        let (current, stale): (Vec<Idle<O>>, Vec<Idle<O>>) = pool.idle.drain(..).partition(|i| i.occupant.version() == version);
        pool.idle = current;
        pool.live -= stale.len();
        self.total -= stale.len();
        doomed.extend(stale.into_iter().map(|i| (i.occupant, Eviction::Replaced)));
        if let Some(idle) = pool.idle.pop() {
            return Acquired::Warm(idle);
        }
        let lambda_has_room = pool.live < self.bounds.max_per_lambda;
        if lambda_has_room && (self.total < self.bounds.max_total || self.evict_lru(doomed)) {
            let pool = self.pools.get_mut(name).expect("the pool was made above");
            pool.live += 1;
            self.total += 1;
            return Acquired::Create;
        }
        let pool = self.pools.get_mut(name).expect("the pool was made above");
        pool.waiters.retain(|w| !w.is_gone());
        pool.for_sandbox.retain(|w| !w.is_gone());
        if pool.waiters.len() + pool.for_sandbox.len() >= self.bounds.queue_depth {
            return Acquired::Full;
        }
        pool.waiters.push_back(waiter());
        Acquired::Queued
    }

    /// Take back a sandbox after its request. Kept (`keep`), it goes to the longest-waiting
    /// request of its lambda (those waiting only for a sandbox first) or into the idle set;
    /// otherwise the caller destroys it and its room goes to a waiting request.
    pub fn release(&mut self, name: &str, occupant: O, keep: bool, now: Instant) -> Released<O> {
        let pool = pool_of(&mut self.pools, name);
        pool.served += 1;
        if !keep {
            self.sandbox_gone(name);
            return Released::Destroy(occupant);
        }
        let mut grant = Grant::Sandbox(occupant);
        while let Some(waiter) = pool.for_sandbox.pop_front().or_else(|| pool.waiters.pop_front()) {
            match waiter.grant(grant) {
                Ok(()) => return Released::Handed,
                Err(returned) => grant = returned,
            }
        }
        let Grant::Sandbox(occupant) = grant else { unreachable!("only a sandbox was offered") };
        pool.idle.push(Idle { occupant, since: now, paused: false, pss: 0 });
        Released::Idle
    }

    /// Room for a sandbox of `name` that was never made goes back: to a request waiting for
    /// room, of this lambda first, then of any lambda with room of its own.
    pub fn give_back_room(&mut self, name: &str) {
        self.hand_on_room(name, false);
    }

    /// A sandbox of `name` was destroyed: its room goes to a request waiting for one of the
    /// lambda's sandboxes (there may be none left to wait for), else as [`Pools::give_back_room`].
    pub fn sandbox_gone(&mut self, name: &str) {
        self.hand_on_room(name, true);
    }

    fn hand_on_room(&mut self, name: &str, to_its_sandbox_waiters: bool) {
        if let Some(pool) = self.pools.get_mut(name) {
            pool.live -= 1;
        }
        self.total -= 1;
        let order: Vec<String> =
            std::iter::once(name.to_string()).chain(self.pools.keys().filter(|k| k.as_str() != name).cloned()).collect();
        for key in order {
            let Some(pool) = self.pools.get_mut(&key) else { continue };
            if pool.live >= self.bounds.max_per_lambda || self.total >= self.bounds.max_total {
                continue;
            }
            let own = to_its_sandbox_waiters && key == name;
            while let Some(waiter) = if own { pool.for_sandbox.pop_front() } else { None }.or_else(|| pool.waiters.pop_front()) {
                if waiter.grant(Grant::Room).is_ok() {
                    pool.live += 1;
                    self.total += 1;
                    return;
                }
            }
        }
    }

    /// Instead of making a sandbox with the room it was granted, serve a request of `version`
    /// of `name` with one the lambda has: under a full memory budget, waiting for a sandbox
    /// that is serving costs less than a cold start that evicts another lambda's. `made`
    /// counts the lambda's sandboxes that exist or are being made past admission (rooms held
    /// by requests still deciding are no sandbox to wait for). An idle one of its version is taken (`Warm`), else the request
    /// waits for the next one released (`Queued`), taking no room meanwhile: its room goes
    /// to a request waiting for room, never to one waiting only for a sandbox, so rooms are
    /// not handed back and forth. `Create` (the room kept) when there is none to wait for,
    /// or the queue is full.
    pub fn queue_instead(&mut self, name: &str, version: u64, made: usize, waiter: W) -> Acquired<O> {
        let Some(pool) = self.pools.get_mut(name) else { return Acquired::Create };
        if made == 0 {
            return Acquired::Create;
        }
        if let Some(at) = pool.idle.iter().rposition(|i| i.occupant.version() == version) {
            let idle = pool.idle.remove(at);
            self.give_back_room(name);
            return Acquired::Warm(idle);
        }
        pool.waiters.retain(|w| !w.is_gone());
        pool.for_sandbox.retain(|w| !w.is_gone());
        if pool.waiters.len() + pool.for_sandbox.len() >= self.bounds.queue_depth {
            return Acquired::Create;
        }
        pool.for_sandbox.push_back(waiter);
        self.give_back_room(name);
        Acquired::Queued
    }

    /// Evict the least recently used idle sandbox of any lambda; false when none is idle.
    fn evict_lru(&mut self, doomed: &mut Vec<(O, Eviction)>) -> bool {
        let oldest = self
            .pools
            .iter()
            .flat_map(|(name, p)| p.idle.iter().enumerate().map(move |(i, idle)| (idle.since, name, i)))
            .min_by_key(|(since, _, _)| *since)
            .map(|(_, name, i)| (name.clone(), i));
        let Some((name, index)) = oldest else { return false };
        let pool = self.pools.get_mut(&name).expect("found above");
        let idle = pool.idle.remove(index);
        pool.live -= 1;
        self.total -= 1;
        doomed.push((idle.occupant, Eviction::Room));
        true
    }

    /// Evict sandboxes idle at `now` for their lambda's keep-alive window (`keep_for(name)`)
    /// or longer, and those of replaced versions.
    pub fn reap(&mut self, now: Instant, keep_for: impl Fn(&str) -> Duration) -> Vec<(O, Eviction)> {
        let mut doomed = Vec::new();
        for (name, pool) in self.pools.iter_mut() {
            let window = keep_for(name);
            let (keep, gone): (Vec<Idle<O>>, Vec<Idle<O>>) =
                pool.idle.drain(..).partition(|i| now.saturating_duration_since(i.since) < window && i.occupant.is_current());
            pool.idle = keep;
            pool.live -= gone.len();
            self.total -= gone.len();
            doomed.extend(gone.into_iter().map(|i| {
                let why = if i.occupant.is_current() { Eviction::Idle } else { Eviction::Replaced };
                (i.occupant, why)
            }));
        }
        self.forget_empty();
        doomed
    }

    /// The idle sandbox `id` of `name` if it is due to be paused: idle, not paused, and idle
    /// since `after` or longer at `now` (idle again only since later, its own pause is due later).
    pub fn due_for_pause(&mut self, name: &str, id: u64, now: Instant, after: Duration) -> Option<&mut Idle<O>> {
        let idle = self.pools.get_mut(name)?.idle.iter_mut().find(|i| i.occupant.id() == id)?;
        (!idle.paused && now.saturating_duration_since(idle.since) >= after).then_some(idle)
    }

    /// Paused sandboxes: all of them, or only those not measured yet.
    pub fn paused(&self, unmeasured_only: bool) -> impl Iterator<Item = &O> {
        self.pools.values().flat_map(|p| p.idle.iter()).filter(move |i| i.paused && (!unmeasured_only || i.pss == 0)).map(|i| &i.occupant)
    }

    /// Record measured PSS (`(id, bytes)`), then evict paused sandboxes, least recently used
    /// first, until the rest fit in `limit`.
    pub fn measured(&mut self, pss: &[(u64, u64)], limit: u64) -> Vec<(O, Eviction)> {
        for idle in self.pools.values_mut().flat_map(|p| p.idle.iter_mut()) {
            if let Some((_, bytes)) = pss.iter().find(|(id, _)| *id == idle.occupant.id()) {
                idle.pss = *bytes;
            }
        }
        let paused: Vec<(Instant, u64, u64)> =
            self.pools.values().flat_map(|p| p.idle.iter().filter(|i| i.paused)).map(|i| (i.since, i.pss, i.occupant.id())).collect();
        let mut doomed = Vec::new();
        for id in handler_cache::over_limit(paused, limit) {
            for pool in self.pools.values_mut() {
                if let Some(at) = pool.idle.iter().position(|i| i.occupant.id() == id) {
                    doomed.push((pool.idle.remove(at).occupant, Eviction::Memory));
                    pool.live -= 1;
                    self.total -= 1;
                }
            }
        }
        self.forget_empty();
        doomed
    }

    /// Drop the queues (their requests see the worker shutting down) and give up every idle
    /// sandbox.
    pub fn shutdown(&mut self) -> Vec<O> {
        let mut all = Vec::new();
        for pool in self.pools.values_mut() {
            pool.waiters.clear();
            pool.for_sandbox.clear();
            pool.live -= pool.idle.len();
            self.total -= pool.idle.len();
            all.extend(pool.idle.drain(..).map(|i| i.occupant));
        }
        all
    }

    /// Each lambda's figures.
    pub fn figures(&self) -> impl Iterator<Item = (&str, PoolFigures)> {
        self.pools.iter().map(|(name, p)| {
            (
                name.as_str(),
                PoolFigures { sandboxes: p.live, idle: p.idle.len(), queued: p.waiters.len() + p.for_sandbox.len(), served: p.served },
            )
        })
    }

    /// Room for a sandbox of `name` started ahead of demand: only when the lambda has none
    /// and the worker has room without evicting anything. Counted as live when granted.
    pub fn acquire_room(&mut self, name: &str) -> bool {
        let has_none = self.pools.get(name).is_none_or(|p| p.live == 0);
        if !has_none || self.total >= self.bounds.max_total || self.bounds.max_per_lambda == 0 {
            return false;
        }
        pool_of(&mut self.pools, name).live += 1;
        self.total += 1;
        true
    }

    /// Sandboxes that exist or are being made and are not idle: serving or starting.
    pub fn busy(&self) -> usize {
        self.total - self.pools.values().map(|p| p.idle.len()).sum::<usize>()
    }

    /// Every idle sandbox as a candidate for eviction at `now`: its id, the memory
    /// `bytes_of` reads, and its lambda's requests within [`RECENT`] — borne only by the idle
    /// sandbox its lambda's next request takes (the last to idle): the others can go without
    /// costing a cold start, so a busy lambda's extra sandboxes go before another's only one.
    pub fn idle_candidates(&self, now: Instant, bytes_of: impl Fn(&O) -> u64) -> Vec<crate::budget::Candidate> {
        self.pools
            .values()
            .flat_map(|p| {
                let recent_uses = p.recent.iter().filter(|t| now.saturating_duration_since(**t) <= RECENT).count();
                let next = p.idle.len().saturating_sub(1);
                p.idle.iter().enumerate().map(move |(at, i)| (i, if at == next { recent_uses } else { 0 }))
            })
            .map(|(i, recent_uses)| crate::budget::Candidate { id: i.occupant.id(), bytes: bytes_of(&i.occupant), recent_uses })
            .collect()
    }

    /// Evict the idle sandboxes `ids` (those still idle) for `why`.
    pub fn evict_ids(&mut self, ids: &[u64], why: Eviction) -> Vec<(O, Eviction)> {
        let mut doomed = Vec::new();
        for pool in self.pools.values_mut() {
            let (gone, keep): (Vec<Idle<O>>, Vec<Idle<O>>) = pool.idle.drain(..).partition(|i| ids.contains(&i.occupant.id()));
            pool.idle = keep;
            pool.live -= gone.len();
            self.total -= gone.len();
            doomed.extend(gone.into_iter().map(|i| (i.occupant, why)));
        }
        self.forget_empty();
        doomed
    }

    /// Paused sandboxes and their PSS in all.
    pub fn paused_figures(&self) -> (usize, u64) {
        self.pools.values().flat_map(|p| p.idle.iter().filter(|i| i.paused)).fold((0, 0), |(n, pss), i| (n + 1, pss + i.pss))
    }

    fn forget_empty(&mut self) {
        self.pools.retain(|_, p| p.live > 0 || !p.waiters.is_empty() || !p.for_sandbox.is_empty());
    }
}

/// The pool of `name`, made if it has none (its name is copied only then: this is on every
/// request's path).
fn pool_of<'a, O, W>(pools: &'a mut HashMap<String, Pool<O, W>>, name: &str) -> &'a mut Pool<O, W> {
    if !pools.contains_key(name) {
        pools.insert(name.to_string(), Pool::default());
    }
    pools.get_mut(name).expect("inserted above")
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    use super::*;

    /// A sandbox: an id, a version, and whether that version is still the lambda's.
    #[derive(Debug, Clone)]
    struct Fake {
        id: u64,
        version: u64,
        current: Rc<Cell<bool>>,
    }

    impl Occupant for Fake {
        fn id(&self) -> u64 {
            self.id
        }
        fn version(&self) -> u64 {
            self.version
        }
        fn is_current(&self) -> bool {
            self.current.get()
        }
    }

    /// A request's end of the queue: what it was granted, and whether it still waits.
    #[derive(Clone, Default)]
    struct Slot {
        got: Rc<RefCell<Option<Granted>>>,
        gone: Rc<Cell<bool>>,
    }

    #[derive(Debug, PartialEq)]
    enum Granted {
        Sandbox(u64),
        Room,
    }

    impl Waiter<Fake> for Slot {
        fn grant(self, grant: Grant<Fake>) -> Result<(), Grant<Fake>> {
            if self.gone.get() {
                return Err(grant);
            }
            *self.got.borrow_mut() = Some(match grant {
                Grant::Sandbox(f) => Granted::Sandbox(f.id),
                Grant::Room => Granted::Room,
            });
            Ok(())
        }
        fn is_gone(&self) -> bool {
            self.gone.get()
        }
    }

    impl Slot {
        fn taken(&self) -> Option<Granted> {
            self.got.borrow_mut().take()
        }
    }

    struct World {
        pools: Pools<Fake, Slot>,
        next_id: u64,
        now: Instant,
        current: HashMap<(String, u64), Rc<Cell<bool>>>,
    }

    impl World {
        fn new(max_per_lambda: usize, max_total: usize, queue_depth: usize) -> World {
            World {
                pools: Pools::new(Bounds { max_per_lambda, max_total, queue_depth }),
                next_id: 1,
                now: Instant::now(),
                current: HashMap::new(),
            }
        }

        fn sandbox(&mut self, name: &str, version: u64) -> Fake {
            let current = self.current.entry((name.into(), version)).or_insert_with(|| Rc::new(Cell::new(true))).clone();
            self.next_id += 1;
            Fake { id: self.next_id - 1, version, current }
        }

        fn retire(&mut self, name: &str, version: u64) {
            self.current[&(name.to_string(), version)].set(false);
        }

        fn tick(&mut self, secs: u64) {
            self.now += Duration::from_secs(secs);
        }

        /// Acquire; a queued request's slot is returned with the outcome.
        fn acquire(&mut self, name: &str, version: u64) -> (Acquired<Fake>, Vec<(Fake, Eviction)>, Slot) {
            let slot = Slot::default();
            let mut doomed = Vec::new();
            let got = self.pools.acquire_at(name, version, || slot.clone(), &mut doomed, self.now);
            (got, doomed, slot)
        }

        /// Acquire, expecting room, and "make" the sandbox.
        fn cold(&mut self, name: &str, version: u64) -> Fake {
            match self.acquire(name, version).0 {
                Acquired::Create => self.sandbox(name, version),
                other => panic!("expected room for a new sandbox, got {}", describe(&other)),
            }
        }

        /// Serve one request cold and return its sandbox to the idle set.
        fn idle_one(&mut self, name: &str, version: u64) -> u64 {
            let s = self.cold(name, version);
            let id = s.id;
            assert!(matches!(self.pools.release(name, s, true, self.now), Released::Idle));
            id
        }
    }

    fn describe(a: &Acquired<Fake>) -> String {
        match a {
            Acquired::Warm(i) => format!("warm sandbox {}", i.occupant.id),
            Acquired::Create => "create".into(),
            Acquired::Queued => "queued".into(),
            Acquired::Full => "full".into(),
        }
    }

    fn ids(doomed: &[(Fake, Eviction)]) -> Vec<(u64, &'static str)> {
        doomed.iter().map(|(f, why)| (f.id, why.label())).collect()
    }

    #[test]
    fn an_idle_sandbox_is_reused_and_the_most_recently_used_goes_first() {
        let mut w = World::new(4, 8, 4);
        let a = w.cold("f", 1);
        let b = w.cold("f", 1);
        let (a_id, b_id) = (a.id, b.id);
        w.pools.release("f", a, true, w.now);
        w.tick(1);
        w.pools.release("f", b, true, w.now);
        match w.acquire("f", 1).0 {
            Acquired::Warm(idle) => assert_eq!(idle.occupant.id, b_id),
            other => panic!("{}", describe(&other)),
        }
        match w.acquire("f", 1).0 {
            Acquired::Warm(idle) => assert_eq!(idle.occupant.id, a_id),
            other => panic!("{}", describe(&other)),
        }
        assert_eq!(w.pools.total(), 2, "both still count as live while leased");
    }

    #[test]
    fn a_lambda_at_its_limit_queues_and_the_released_sandbox_goes_to_the_first_waiter() {
        let mut w = World::new(1, 8, 2);
        let s = w.cold("f", 1);
        let (first, _, one) = w.acquire("f", 1);
        let (second, _, two) = w.acquire("f", 1);
        assert!(matches!(first, Acquired::Queued) && matches!(second, Acquired::Queued));
        assert!(matches!(w.acquire("f", 1).0, Acquired::Full), "the queue holds two");
        let id = s.id;
        assert!(matches!(w.pools.release("f", s, true, w.now), Released::Handed));
        assert_eq!(one.taken(), Some(Granted::Sandbox(id)));
        assert_eq!(two.taken(), None);
    }

    #[test]
    fn a_waiter_that_gave_up_is_skipped_and_frees_its_queue_place() {
        let mut w = World::new(1, 8, 1);
        let s = w.cold("f", 1);
        let (_, _, gone) = w.acquire("f", 1);
        assert!(matches!(w.acquire("f", 1).0, Acquired::Full));
        gone.gone.set(true);
        let (again, _, waiting) = w.acquire("f", 1);
        assert!(matches!(again, Acquired::Queued), "the gone waiter's place is free");
        let id = s.id;
        w.pools.release("f", s, true, w.now);
        assert_eq!(gone.taken(), None);
        assert_eq!(waiting.taken(), Some(Granted::Sandbox(id)));
    }

    #[test]
    fn with_every_waiter_gone_a_released_sandbox_goes_idle() {
        let mut w = World::new(1, 8, 4);
        let s = w.cold("f", 1);
        let (_, _, gone) = w.acquire("f", 1);
        gone.gone.set(true);
        assert!(matches!(w.pools.release("f", s, true, w.now), Released::Idle));
        assert!(matches!(w.acquire("f", 1).0, Acquired::Warm(_)));
    }

    #[test]
    fn a_failed_sandbox_is_destroyed_and_its_room_goes_to_a_waiter() {
        let mut w = World::new(1, 8, 4);
        let s = w.cold("f", 1);
        let (_, _, waiting) = w.acquire("f", 1);
        let id = s.id;
        match w.pools.release("f", s, false, w.now) {
            Released::Destroy(f) => assert_eq!(f.id, id),
            _ => panic!("a sandbox not kept must be destroyed"),
        }
        assert_eq!(waiting.taken(), Some(Granted::Room));
        assert_eq!(w.pools.total(), 1, "the room is the waiter's now");
    }

    #[test]
    fn room_freed_by_one_lambda_goes_to_another_waiting_for_the_worker() {
        let mut w = World::new(2, 1, 4);
        let f = w.cold("f", 1);
        let (queued, _, g_waits) = w.acquire("g", 1);
        assert!(matches!(queued, Acquired::Queued), "the worker is full and nothing is idle");
        w.pools.release("f", f, false, w.now);
        assert_eq!(g_waits.taken(), Some(Granted::Room));
        assert_eq!(w.pools.figures().find(|(n, _)| *n == "g").map(|(_, f)| f.sandboxes), Some(1));
    }

    #[test]
    fn room_is_not_given_to_a_lambda_at_its_own_limit() {
        let mut w = World::new(1, 2, 4);
        let f = w.cold("f", 1);
        let _g = w.cold("g", 1);
        let (_, _, g_waits) = w.acquire("g", 1);
        w.pools.release("f", f, false, w.now);
        assert_eq!(g_waits.taken(), None, "g has its one sandbox already");
        assert_eq!(w.pools.total(), 1);
    }

    #[test]
    fn a_full_worker_evicts_the_least_recently_used_idle_sandbox_of_another_lambda() {
        let mut w = World::new(4, 3, 4);
        let old = w.idle_one("a", 1);
        w.tick(5);
        let _newer = w.idle_one("b", 1);
        w.tick(5);
        let _newest = w.idle_one("c", 1);
        let (got, doomed, _) = w.acquire("d", 1);
        assert!(matches!(got, Acquired::Create));
        assert_eq!(ids(&doomed), vec![(old, "room")]);
        assert_eq!(w.pools.total(), 3);
    }

    #[test]
    fn budget_candidates_carry_their_lambdas_recent_requests_and_only_idle_ones_are_evicted() {
        let mut w = World::new(8, 16, 4);
        let a = w.idle_one("a", 1);
        for _ in 0..3 {
            match w.acquire("a", 1).0 {
                Acquired::Warm(idle) => assert!(matches!(w.pools.release("a", idle.occupant, true, w.now), Released::Idle)),
                other => panic!("expected a warm sandbox, got {}", describe(&other)),
            }
        }
        let b = w.idle_one("b", 1);
        let busy = w.cold("c", 1);
        assert_eq!(w.pools.busy(), 1);
        let mut candidates = w.pools.idle_candidates(w.now, |f| f.id * 10);
        candidates.sort_by_key(|c| c.id);
        let expect = |id: u64, recent_uses: usize| crate::budget::Candidate { id, bytes: id * 10, recent_uses };
        assert_eq!(candidates, vec![expect(a, 4), expect(b, 1)]);
        w.tick(61);
        assert!(w.pools.idle_candidates(w.now, |_| 1).iter().all(|c| c.recent_uses == 0), "past the window");
        let doomed = w.pools.evict_ids(&[b, busy.id], Eviction::Budget);
        assert_eq!(ids(&doomed), vec![(b, "budget")], "a busy sandbox is not the pools' to evict");
        assert_eq!((w.pools.total(), w.pools.busy()), (2, 1));
    }

    #[test]
    fn a_request_queues_instead_for_its_lambdas_sandbox_and_gets_it_when_it_ends() {
        let mut w = World::new(8, 16, 4);
        assert!(matches!(w.acquire("a", 1).0, Acquired::Create));
        // No sandbox made yet (another request's room is none to wait for): the room is kept.
        assert!(matches!(w.pools.queue_instead("a", 1, 0, Slot::default()), Acquired::Create));
        assert_eq!(w.pools.total(), 1);
        let busy = w.sandbox("a", 1);
        let busy_id = busy.id;
        // A second request gives its room back and waits for the first one's sandbox.
        assert!(matches!(w.acquire("a", 1).0, Acquired::Create));
        let slot = Slot::default();
        assert!(matches!(w.pools.queue_instead("a", 1, 1, slot.clone()), Acquired::Queued));
        assert_eq!((w.pools.total(), w.pools.busy()), (1, 1));
        assert_eq!(w.pools.figures().next().map(|(_, f)| f.queued), Some(1));
        assert!(matches!(w.pools.release("a", busy, true, w.now), Released::Handed));
        assert_eq!(slot.taken(), Some(Granted::Sandbox(busy_id)), "handed the sandbox that ended");
        // Released between a request's room and its decision, the sandbox is taken at once;
        // the room goes back.
        let mut w = World::new(8, 16, 4);
        let first = w.cold("a", 1);
        let first_id = first.id;
        assert!(matches!(w.acquire("a", 1).0, Acquired::Create));
        assert!(matches!(w.pools.release("a", first, true, w.now), Released::Idle));
        match w.pools.queue_instead("a", 1, 1, Slot::default()) {
            Acquired::Warm(idle) => assert_eq!(idle.occupant.id, first_id),
            other => panic!("expected the idle sandbox, got {}", describe(&other)),
        }
        assert_eq!((w.pools.total(), w.pools.busy()), (1, 1));
    }

    #[test]
    fn a_room_given_back_to_wait_never_reaches_a_request_waiting_only_for_a_sandbox() {
        // Requests of "a" wait for its one busy sandbox, each giving its room back. Handed to
        // one of them, a room would come straight back (the budget is still full): requests
        // would pass it around for ever.
        let mut w = World::new(8, 3, 4);
        let busy = w.cold("a", 1);
        let mut waiting = Vec::new();
        let mut queue_instead = |w: &mut World| {
            let slot = Slot::default();
            assert!(matches!(w.pools.queue_instead("a", 1, 1, slot.clone()), Acquired::Queued));
            waiting.push(slot);
        };
        for _ in 0..2 {
            assert!(matches!(w.acquire("a", 1).0, Acquired::Create));
            queue_instead(&mut w);
        }
        assert!(matches!(w.acquire("a", 1).0, Acquired::Create));
        w.cold("c", 1);
        let (queued, _, for_room) = w.acquire("b", 1);
        assert!(matches!(queued, Acquired::Queued), "the worker is full");
        // The third request of "a" gives its room back: it goes to b, waiting for room.
        queue_instead(&mut w);
        assert_eq!(for_room.taken(), Some(Granted::Room));
        assert!(waiting.iter().all(|s| s.taken().is_none()));
        // When a's only sandbox is destroyed, the first request waiting for it gets its room.
        assert!(matches!(w.pools.release("a", busy, false, w.now), Released::Destroy(_)));
        assert_eq!(waiting[0].taken(), Some(Granted::Room));
        assert!(waiting[1..].iter().all(|s| s.taken().is_none()));
        assert_eq!(w.pools.total(), 3, "b's new room, c's sandbox, a's room for a new one");
    }

    #[test]
    fn only_the_idle_sandbox_a_lambda_takes_next_bears_its_recent_requests() {
        let mut w = World::new(8, 16, 4);
        let (one, two) = (w.cold("a", 1), w.cold("a", 1));
        let (first, second) = (one.id, two.id);
        assert!(matches!(w.pools.release("a", one, true, w.now), Released::Idle));
        assert!(matches!(w.pools.release("a", two, true, w.now), Released::Idle));
        let mut candidates = w.pools.idle_candidates(w.now, |_| 1);
        candidates.sort_by_key(|c| c.id);
        let uses = |id: u64| candidates.iter().find(|c| c.id == id).unwrap().recent_uses;
        assert_eq!((uses(first), uses(second)), (0, 2), "the extra one costs no cold start");
        match w.acquire("a", 1).0 {
            Acquired::Warm(idle) => assert_eq!(idle.occupant.id, second, "the one bearing the cost is the one taken"),
            other => panic!("expected a warm sandbox, got {}", describe(&other)),
        }
    }

    #[test]
    fn a_full_worker_with_nothing_idle_queues() {
        let mut w = World::new(4, 1, 4);
        let _busy = w.cold("a", 1);
        assert!(matches!(w.acquire("b", 1).0, Acquired::Queued));
    }

    #[test]
    fn idle_sandboxes_of_another_version_are_evicted_not_reused() {
        let mut w = World::new(4, 8, 4);
        let v1 = w.idle_one("f", 1);
        w.retire("f", 1);
        let (got, doomed, _) = w.acquire("f", 2);
        assert!(matches!(got, Acquired::Create));
        assert_eq!(ids(&doomed), vec![(v1, "replaced")]);
        assert_eq!(w.pools.total(), 1, "only the new one counts");
    }

    #[test]
    fn reaping_takes_the_expired_and_the_replaced_and_keeps_the_rest() {
        let mut w = World::new(4, 8, 4);
        let (old, new) = (w.cold("f", 1), w.cold("f", 1));
        let (expired, fresh) = (old.id, new.id);
        w.pools.release("f", old, true, w.now);
        w.tick(50);
        w.pools.release("f", new, true, w.now);
        let replaced = w.idle_one("g", 1);
        w.retire("g", 1);
        w.tick(20);
        let mut doomed = ids(&w.pools.reap(w.now, |_| Duration::from_secs(60)));
        doomed.sort();
        assert_eq!(doomed, vec![(expired, "idle"), (replaced, "replaced")]);
        assert_eq!(w.pools.total(), 1);
        assert!(w.pools.figures().all(|(name, _)| name == "f"), "g's empty pool is forgotten");
        match w.acquire("f", 1).0 {
            Acquired::Warm(idle) => assert_eq!(idle.occupant.id, fresh),
            other => panic!("{}", describe(&other)),
        }
    }

    #[test]
    fn each_lambdas_idle_sandboxes_are_kept_for_its_own_window() {
        let mut w = World::new(4, 8, 4);
        let (f, g) = (w.idle_one("f", 1), w.idle_one("g", 1));
        w.tick(30);
        let windows = |name: &str| Duration::from_secs(if name == "f" { 20 } else { 60 });
        assert_eq!(ids(&w.pools.reap(w.now, windows)), vec![(f, "idle")]);
        w.tick(30);
        assert_eq!(ids(&w.pools.reap(w.now, windows)), vec![(g, "idle")]);
    }

    #[test]
    fn a_pause_is_due_only_for_a_sandbox_idle_long_enough_and_not_paused() {
        let mut w = World::new(4, 8, 4);
        let id = w.idle_one("f", 1);
        let after = Duration::from_millis(100);
        assert!(w.pools.due_for_pause("f", id, w.now, after).is_none(), "idle only just");
        w.tick(1);
        w.pools.due_for_pause("f", id, w.now, after).expect("due").paused = true;
        assert!(w.pools.due_for_pause("f", id, w.now, after).is_none(), "paused already");
        assert!(w.pools.due_for_pause("f", 999, w.now, after).is_none(), "no such sandbox");
    }

    #[test]
    fn a_sandbox_taken_and_idle_again_is_paused_on_its_own_later_schedule() {
        let mut w = World::new(4, 8, 4);
        let id = w.idle_one("f", 1);
        w.tick(1);
        let Acquired::Warm(idle) = w.acquire("f", 1).0 else { panic!("warm") };
        w.pools.release("f", idle.occupant, true, w.now);
        // The pause scheduled at its first release comes due now, a moment after the second.
        assert!(w.pools.due_for_pause("f", id, w.now, Duration::from_secs(1)).is_none());
        w.tick(1);
        assert!(w.pools.due_for_pause("f", id, w.now, Duration::from_secs(1)).is_some());
    }

    #[test]
    fn paused_sandboxes_past_the_memory_limit_go_least_recently_used_first() {
        let mut w = World::new(8, 8, 4);
        let made: Vec<Fake> = (0..4).map(|_| w.cold("f", 1)).collect();
        let all: Vec<u64> = made.iter().map(|f| f.id).collect();
        for sandbox in made {
            w.pools.release("f", sandbox, true, w.now);
            w.tick(1);
        }
        for id in &all[..3] {
            w.pools.due_for_pause("f", *id, w.now, Duration::ZERO).expect("due").paused = true;
        }
        assert_eq!(w.pools.paused(true).count(), 3);
        let doomed = w.pools.measured(&[(all[0], 30), (all[1], 30), (all[2], 30), (all[3], 1000)], 70);
        assert_eq!(ids(&doomed), vec![(all[0], "memory")], "the unpaused one is not counted");
        assert_eq!(w.pools.paused_figures(), (2, 60));
        assert_eq!(w.pools.paused(true).count(), 0, "all measured");
        assert_eq!(w.pools.total(), 3);
    }

    #[test]
    fn shutdown_gives_up_the_idle_and_drops_the_queue() {
        let mut w = World::new(1, 8, 4);
        let idle = w.idle_one("g", 1);
        let _busy = w.cold("f", 1);
        let (_, _, waiting) = w.acquire("f", 1);
        let doomed: Vec<u64> = w.pools.shutdown().iter().map(|f| f.id).collect();
        assert_eq!(doomed, vec![idle]);
        assert_eq!(w.pools.figures().map(|(_, f)| f.queued).sum::<usize>(), 0);
        assert_eq!(Rc::strong_count(&waiting.got), 1, "the waiter was dropped: its request hears of the shutdown");
        assert_eq!(w.pools.total(), 1, "the busy one is still out");
    }

    #[test]
    fn counts_stay_balanced_through_a_mixed_run() {
        let mut w = World::new(2, 3, 8);
        let mut held = Vec::new();
        for round in 0..20u64 {
            let name = ["a", "b", "c"][(round % 3) as usize];
            let (got, doomed, _) = w.acquire(name, 1);
            drop(doomed);
            match got {
                Acquired::Warm(i) => held.push((name, i.occupant)),
                Acquired::Create => {
                    let s = w.sandbox(name, 1);
                    held.push((name, s));
                }
                Acquired::Queued | Acquired::Full => {}
            }
            if round % 2 == 1 {
                if let Some((name, s)) = held.pop() {
                    w.pools.release(name, s, round % 4 != 3, w.now);
                }
            }
            w.tick(1);
            let figures: Vec<PoolFigures> = w.pools.figures().map(|(_, f)| f).collect();
            let live: usize = figures.iter().map(|f| f.sandboxes).sum();
            assert_eq!(live, w.pools.total());
            assert!(w.pools.total() <= 3);
            assert!(figures.iter().all(|f| f.sandboxes <= 2 && f.idle <= f.sandboxes));
        }
    }
}
