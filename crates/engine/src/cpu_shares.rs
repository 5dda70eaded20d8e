//! How lambdas share a contended CPU, decided without touching it (the instance manager
//! writes what these say): [`CpuShares`] gives each live sandbox its lambda's weight, or
//! splits that weight evenly among them (so a lambda gets no more CPU by running more
//! sandboxes); [`LongRequests`] knows which lambdas' requests run long, so theirs yield the
//! CPU to short ones from their start.

use std::collections::HashMap;
use std::time::Duration;

use sprout_sandbox::cgroup::DEFAULT_WEIGHT;

/// The weight each of `n` sandboxes of a lambda weighing `weight` gets (at least 1).
pub fn split(weight: u64, n: usize) -> u64 {
    (weight / n.max(1) as u64).max(1)
}

/// Every live sandbox by lambda, with the handle its weight is written through.
pub struct CpuShares<H> {
    /// Each lambda's weight (cgroup v2's scale: 100 is a default process group's).
    weight: u64,
    /// Split it among the lambda's sandboxes (`[limits] cpu_weight_per = "lambda"`), or give
    /// each sandbox all of it (`"sandbox"`, as a pod or a function invocation elsewhere gets
    /// its own share: a lambda's concurrency, capped by `instances.max_per_lambda`, buys CPU).
    split: bool,
    lambdas: HashMap<String, Vec<(u64, H)>>,
    lambda_of: HashMap<u64, String>,
}

impl<H: Clone> CpuShares<H> {
    pub fn new(weight: u64, split: bool) -> CpuShares<H> {
        CpuShares { weight, split, lambdas: HashMap::new(), lambda_of: HashMap::new() }
    }

    /// Sandbox `id` of `lambda` is live: the weights to write (its own and its siblings').
    pub fn added(&mut self, lambda: &str, id: u64, handle: H) -> Vec<(H, u64)> {
        self.lambda_of.insert(id, lambda.to_string());
        let sandboxes = self.lambdas.entry(lambda.to_string()).or_default();
        sandboxes.push((id, handle.clone()));
        match self.split {
            true => self.writes(lambda),
            // Each its own weight: none to write where every group has it already.
            false if self.weight == DEFAULT_WEIGHT => Vec::new(),
            false => vec![(handle, self.weight)],
        }
    }

    /// Sandbox `id` is gone: the weights its siblings get now (none if it was not known).
    pub fn removed(&mut self, id: u64) -> Vec<(H, u64)> {
        let Some(lambda) = self.lambda_of.remove(&id) else { return Vec::new() };
        let Some(sandboxes) = self.lambdas.get_mut(&lambda) else { return Vec::new() };
        sandboxes.retain(|(s, _)| *s != id);
        if sandboxes.is_empty() {
            self.lambdas.remove(&lambda);
            return Vec::new();
        }
        match self.split {
            true => self.writes(&lambda),
            false => Vec::new(),
        }
    }

    fn writes(&self, lambda: &str) -> Vec<(H, u64)> {
        let sandboxes = &self.lambdas[lambda];
        let each = self.each(sandboxes.len());
        sandboxes.iter().map(|(_, h)| (h.clone(), each)).collect()
    }

    /// The weight of each of a lambda's `n` live sandboxes.
    fn each(&self, n: usize) -> u64 {
        if self.split {
            split(self.weight, n)
        } else {
            self.weight
        }
    }

    /// The weight sandbox `id` has now (None: not known).
    pub fn weight_of(&self, id: u64) -> Option<u64> {
        let sandboxes = self.lambdas.get(self.lambda_of.get(&id)?)?;
        Some(self.each(sandboxes.len()))
    }

    /// Live sandboxes of `lambda`.
    #[cfg(test)]
    pub fn count(&self, lambda: &str) -> usize {
        self.lambdas.get(lambda).map_or(0, Vec::len)
    }
}

/// Lambdas whose requests yield the CPU from their start whatever their length: the API's
/// tenants decide (a tenant at its invocation quota yields to every other tenant).
pub trait CpuYield: Send + Sync {
    fn yields(&self, lambda: &str) -> bool;
}

/// Each lambda's typical request duration (an exponentially weighted mean), to tell a
/// lambda whose requests run long (a batch job, a CPU-bound handler) from one whose requests
/// are short: the long ones' requests idle on the CPU from their start, not only once they
/// have run past the threshold.
pub struct LongRequests {
    threshold: Duration,
    means: HashMap<String, f64>,
}

/// The weight of the newest request in a lambda's mean.
const NEWEST: f64 = 0.2;

impl LongRequests {
    pub fn new(threshold: Duration) -> LongRequests {
        LongRequests { threshold, means: HashMap::new() }
    }

    /// Whether `lambda`'s requests typically run past the threshold.
    pub fn expected_long(&self, lambda: &str) -> bool {
        self.means.get(lambda).is_some_and(|mean| *mean > self.threshold.as_secs_f64())
    }

    /// A request of `lambda` ran for `took`.
    pub fn ran(&mut self, lambda: &str, took: Duration) {
        let took = took.as_secs_f64();
        match self.means.get_mut(lambda) {
            Some(mean) => *mean = NEWEST * took + (1.0 - NEWEST) * *mean,
            None => {
                self.means.insert(lambda.to_string(), took);
            }
        }
    }

    /// Forget `lambda` (deleted).
    pub fn forget(&mut self, lambda: &str) {
        self.means.remove(lambda);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lambda_is_long_once_its_requests_typically_run_long() {
        let ms = Duration::from_millis;
        let mut long = LongRequests::new(ms(50));
        assert!(!long.expected_long("spin"));
        long.ran("spin", ms(1000));
        assert!(long.expected_long("spin"));
        long.ran("web", ms(5));
        long.ran("web", ms(200)); // one slow page: not a long lambda yet
        assert!(!long.expected_long("web"));
        for _ in 0..15 {
            long.ran("spin", ms(1));
        }
        assert!(!long.expected_long("spin"), "short again");
        long.ran("web", ms(500));
        long.forget("web");
        assert!(!long.expected_long("web"));
    }

    #[test]
    fn a_lambdas_weight_is_split_among_its_sandboxes() {
        let mut shares = CpuShares::new(100, true);
        assert_eq!(shares.added("busy", 1, 'a'), [('a', 100)]);
        assert_eq!(shares.added("busy", 2, 'b'), [('a', 50), ('b', 50)]);
        assert_eq!(shares.added("busy", 3, 'c'), [('a', 33), ('b', 33), ('c', 33)]);
        // Another lambda's one sandbox weighs as much as all three together.
        assert_eq!(shares.added("victim", 4, 'v'), [('v', 100)]);
        assert_eq!(shares.removed(2), [('a', 50), ('c', 50)]);
        assert_eq!(shares.removed(4), []);
        assert_eq!(shares.removed(99), []);
        assert_eq!((shares.count("busy"), shares.count("victim")), (2, 0));
        assert_eq!((shares.weight_of(1), shares.weight_of(4)), (Some(50), None));
    }

    #[test]
    fn each_sandbox_weighs_its_lambdas_weight_unless_split() {
        // The default weight is every group's already: nothing to write, ever.
        let mut shares = CpuShares::new(DEFAULT_WEIGHT, false);
        assert_eq!(shares.added("busy", 1, 'a'), []);
        assert_eq!(shares.added("busy", 2, 'b'), []);
        assert_eq!(shares.removed(1), []);
        assert_eq!((shares.weight_of(2), shares.weight_of(1)), (Some(100), None));
        // Another weight: the new sandbox's own, once; its siblings' stay as they are.
        let mut shares = CpuShares::new(300, false);
        assert_eq!(shares.added("busy", 1, 'a'), [('a', 300)]);
        assert_eq!(shares.added("busy", 2, 'b'), [('b', 300)]);
        assert_eq!(shares.added("victim", 3, 'v'), [('v', 300)]);
        assert_eq!(shares.removed(2), []);
        assert_eq!((shares.count("busy"), shares.weight_of(1), shares.weight_of(3)), (1, Some(300), Some(300)));
    }

    #[test]
    fn the_split_never_reaches_zero() {
        assert_eq!(split(100, 1000), 1);
        assert_eq!(split(100, 0), 100);
        assert_eq!(split(10_000, 3), 3333);
    }
}
