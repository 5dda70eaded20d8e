//! The whole worker's memory budget (pure): whether a cold start fits, and which idle
//! sandboxes to evict so that it does, by SOCK's benefit/cost rule.
//!
//! The kernel enforces the budget as the memory limit of the cgroup holding every sandbox,
//! Zygote and spare; this decides before the kernel has to. A cold start needs its lambda's
//! estimate (the memory its sandboxes were last seen to hold) on top of what the cgroup holds
//! and what cold starts under way were granted, with `reserve` left free. When that does not
//! fit, idle sandboxes are evicted, the highest benefit per cost first — benefit the memory
//! freed, cost the requests its lambda had lately (each a cold start again if evicted) —
//! and when not even all of them free enough, the request waits for busy sandboxes to end
//! rather than fail. Only a worker with nothing running and nothing to evict lets a cold
//! start through regardless: refusing would fail a request a cold start could serve.

/// The budget: the cgroup's limit, and what is kept free below it for growth and the page
/// cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    pub limit: u64,
    pub reserve: u64,
}

impl Budget {
    /// A budget of `limit` bytes keeping 5% (at least 16 MiB, at most a quarter) free.
    pub fn new(limit: u64) -> Budget {
        let reserve = (limit / 20).max(16 << 20).min(limit / 4);
        Budget { limit, reserve }
    }

    fn room(&self, used: u64) -> u64 {
        self.limit.saturating_sub(self.reserve).saturating_sub(used)
    }
}

/// An idle sandbox that may be evicted.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub id: u64,
    /// Memory its cgroup holds.
    pub bytes: u64,
    /// Requests to its lambda within the recent window.
    pub recent_uses: usize,
}

/// What a cold start may do.
#[derive(Debug, PartialEq)]
pub enum Admission {
    /// It fits.
    Go,
    /// It fits once these idle sandboxes are gone.
    Evict(Vec<u64>),
    /// It does not fit even then: evict these (maybe none) and wait for busy sandboxes to end.
    Wait(Vec<u64>),
}

/// Whether `need` more bytes fit as things are, evicting nothing.
pub fn fits(budget: &Budget, used: u64, pending: u64, need: u64) -> bool {
    need <= budget.room(used.saturating_add(pending))
}

/// Whether a cold start needing `need` bytes fits when the budget's cgroup holds `used` and
/// cold starts under way were granted `pending`, with `idle` sandboxes evictable and `busy`
/// ones serving requests.
pub fn admit(budget: &Budget, used: u64, pending: u64, need: u64, idle: &[Candidate], busy: usize) -> Admission {
    if fits(budget, used, pending, need) {
        return Admission::Go;
    }
    let room = budget.room(used.saturating_add(pending));
    let mut order: Vec<&Candidate> = idle.iter().collect();
    // Highest benefit per cost first: bytes / (1 + recent uses); larger first on ties.
    order.sort_by(|a, b| {
        let score = |c: &Candidate| c.bytes as f64 / (1 + c.recent_uses) as f64;
        score(b).partial_cmp(&score(a)).unwrap_or(std::cmp::Ordering::Equal).then(b.bytes.cmp(&a.bytes)).then(a.id.cmp(&b.id))
    });
    let mut freed = 0u64;
    let mut victims = Vec::new();
    for candidate in order {
        if room + freed >= need {
            break;
        }
        victims.push(candidate.id);
        freed += candidate.bytes;
    }
    if room + freed >= need {
        return Admission::Evict(victims);
    }
    if busy == 0 && pending == 0 {
        // Nothing will end to make room: the kernel's limit decides.
        return Admission::Evict(victims);
    }
    Admission::Wait(victims)
}

/// Each lambda's memory per sandbox, learned from its sandboxes (an exponentially weighted
/// mean, so a lambda that grows is followed), with a default for lambdas never seen.
#[derive(Debug, Default)]
pub struct Estimates {
    per_lambda: std::collections::HashMap<String, u64>,
}

impl Estimates {
    /// The estimate for `name`, or `default` when its sandboxes were never measured.
    pub fn of(&self, name: &str, default: u64) -> u64 {
        self.per_lambda.get(name).copied().unwrap_or(default)
    }

    /// Record a sandbox of `name` seen holding `bytes` (0 is no measurement).
    pub fn observe(&mut self, name: &str, bytes: u64) {
        if bytes == 0 {
            return;
        }
        match self.per_lambda.get_mut(name) {
            Some(estimate) => *estimate = (*estimate * 3 + bytes) / 4,
            None => {
                self.per_lambda.insert(name.to_string(), bytes);
            }
        }
    }

    #[cfg(test)]
    pub fn forget(&mut self, name: &str) {
        self.per_lambda.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    fn idle(id: u64, mb: u64, uses: usize) -> Candidate {
        Candidate { id, bytes: mb * MB, recent_uses: uses }
    }

    #[test]
    fn the_reserve_is_a_twentieth_within_bounds() {
        assert_eq!(Budget::new(1024 * MB).reserve, 1024 * MB / 20);
        assert_eq!(Budget::new(100 * MB).reserve, 16 * MB);
        assert_eq!(Budget::new(32 * MB).reserve, 8 * MB);
    }

    #[test]
    fn a_cold_start_that_fits_goes() {
        let b = Budget { limit: 100 * MB, reserve: 10 * MB };
        assert_eq!(admit(&b, 50 * MB, 0, 40 * MB, &[], 1), Admission::Go);
        // Pending grants count as used.
        assert_eq!(admit(&b, 50 * MB, 10 * MB, 40 * MB, &[], 1), Admission::Wait(vec![]));
    }

    #[test]
    fn eviction_frees_just_enough_highest_benefit_per_cost_first() {
        let b = Budget { limit: 100 * MB, reserve: 10 * MB };
        // 80 used: room 10; need 25, so 15 must go.
        let idle = [idle(1, 20, 9), idle(2, 10, 0), idle(3, 8, 0), idle(4, 30, 1)];
        // Scores: 1: 2 MB/use, 2: 10, 3: 8, 4: 15. Sandbox 4 alone frees 30.
        assert_eq!(admit(&b, 80 * MB, 0, 25 * MB, &idle, 2), Admission::Evict(vec![4]));
        // Need 50: 40 must go: 4 (30), then 2 (10).
        assert_eq!(admit(&b, 80 * MB, 0, 50 * MB, &idle, 2), Admission::Evict(vec![4, 2]));
    }

    #[test]
    fn when_evicting_everything_is_not_enough_the_request_waits_unless_nothing_runs() {
        let b = Budget { limit: 100 * MB, reserve: 10 * MB };
        let idle = [idle(1, 5, 0)];
        assert_eq!(admit(&b, 85 * MB, 0, 40 * MB, &idle, 3), Admission::Wait(vec![1]));
        assert_eq!(admit(&b, 85 * MB, 5 * MB, 40 * MB, &idle, 0), Admission::Wait(vec![1]));
        // Nothing busy, nothing pending: nothing will end, so it goes (after the eviction).
        assert_eq!(admit(&b, 85 * MB, 0, 40 * MB, &idle, 0), Admission::Evict(vec![1]));
    }

    #[test]
    fn estimates_follow_a_lambda_and_default_for_strangers() {
        let mut e = Estimates::default();
        assert_eq!(e.of("a", 32 * MB), 32 * MB);
        e.observe("a", 8 * MB);
        assert_eq!(e.of("a", 32 * MB), 8 * MB);
        e.observe("a", 16 * MB);
        assert_eq!(e.of("a", 32 * MB), 10 * MB);
        e.observe("a", 0);
        assert_eq!(e.of("a", 32 * MB), 10 * MB, "no measurement changes nothing");
        e.forget("a");
        assert_eq!(e.of("a", 32 * MB), 32 * MB);
    }
}
