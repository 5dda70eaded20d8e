//! The pools' state machine against plain occupants and waiters: reuse, bounds, queueing,
//! hand-offs, reaping, pausing and eviction, each decision checked without a sandbox.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::*;

/// A sandbox: an id, a version, whether that version is still the lambda's, and how many
/// times the pools told it that it left them.
#[derive(Debug, Clone)]
struct Fake {
    id: u64,
    version: u64,
    current: Rc<Cell<bool>>,
    left: Rc<Cell<u32>>,
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
    fn leaves(&mut self) {
        self.left.set(self.left.get() + 1);
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
        Fake { id: self.next_id - 1, version, current, left: Rc::default() }
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
fn every_sandbox_the_pools_give_up_is_told_so_once_before_it_is_handed_back() {
    // Whoever counts a lambda's sandboxes beside the pools (the memory budget's queue_instead)
    // stops counting one as the pools give it up: counted until it was destroyed, a request
    // could queue for a sandbox already gone, with nothing ever to hand it.
    let told = |f: &Fake| f.left.get();
    let all_told_once = |doomed: &[(Fake, Eviction)]| doomed.iter().all(|(f, _)| f.left.get() == 1);
    let mut w = World::new(4, 3, 4);
    let (kept, failed) = (w.cold("a", 1), w.cold("a", 1));
    let (kept_id, kept_left) = (kept.id, kept.left.clone());
    assert!(matches!(w.pools.release("a", kept, true, w.now), Released::Idle));
    assert_eq!(kept_left.get(), 0, "idle, it still counts");
    match w.pools.release("a", failed, false, w.now) {
        Released::Destroy(f) => assert_eq!(told(&f), 1, "released to be destroyed"),
        _ => panic!("a sandbox not kept is destroyed"),
    }
    // Least recently used, for room.
    w.tick(1);
    w.idle_one("b", 1);
    w.idle_one("c", 1);
    let (_, doomed, _) = w.acquire("d", 1);
    assert_eq!(ids(&doomed), vec![(kept_id, "room")]);
    assert!(all_told_once(&doomed));
    // Of a replaced version, on the next request.
    let mut w = World::new(4, 8, 4);
    w.idle_one("a", 1);
    let (_, doomed, _) = w.acquire("a", 2);
    assert_eq!(doomed.len(), 1);
    assert!(all_told_once(&doomed));
    // Reaped, evicted for the budget, over the paused memory limit, at shutdown.
    let mut w = World::new(8, 8, 4);
    w.idle_one("a", 1);
    w.tick(100);
    let reaped = w.pools.reap(w.now, |_| Duration::from_secs(10));
    assert_eq!(reaped.len(), 1);
    assert!(all_told_once(&reaped));
    let b = w.idle_one("b", 1);
    let budget = w.pools.evict_ids(&[b], Eviction::Budget);
    assert!(budget.len() == 1 && all_told_once(&budget));
    let c = w.idle_one("c", 1);
    w.pools.due_for_pause("c", c, w.now, Duration::ZERO).expect("due").paused = true;
    let memory = w.pools.measured(&[(c, 100)], 10);
    assert!(memory.len() == 1 && all_told_once(&memory));
    w.idle_one("d", 1);
    let shut = w.pools.shutdown();
    assert!(shut.len() == 1 && shut.iter().all(|f| f.left.get() == 1));
    // Handed to a waiter, a sandbox still counts.
    let mut w = World::new(1, 8, 4);
    let busy = w.cold("a", 1);
    let busy_left = busy.left.clone();
    let (_, _, waiting) = w.acquire("a", 1);
    assert!(matches!(w.pools.release("a", busy, true, w.now), Released::Handed));
    assert!(waiting.taken().is_some());
    assert_eq!(busy_left.get(), 0);
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
