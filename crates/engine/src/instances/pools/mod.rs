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
    /// Told, before it is handed back to be destroyed, that it no longer counts among its
    /// lambda's sandboxes: whoever counts them apart from the pools (the memory budget's
    /// [`Pools::queue_instead`] caller) must stop at once, within the same lock, or a request
    /// could queue for a sandbox already gone and wait for nothing.
    fn leaves(&mut self) {}
}

/// `occupant`, told it [`Occupant::leaves`].
fn leaving<O: Occupant>(mut occupant: O) -> O {
    occupant.leaves();
    occupant
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
        doomed.extend(stale.into_iter().map(|i| (leaving(i.occupant), Eviction::Replaced)));
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
            return Released::Destroy(leaving(occupant));
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
        doomed.push((leaving(idle.occupant), Eviction::Room));
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
                (leaving(i.occupant), why)
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
                    doomed.push((leaving(pool.idle.remove(at).occupant), Eviction::Memory));
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
            all.extend(pool.idle.drain(..).map(|i| leaving(i.occupant)));
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
            doomed.extend(gone.into_iter().map(|i| (leaving(i.occupant), why)));
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
mod tests;
