//! Eviction from the import cache, by SOCK's rule, under its memory limit.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::state::{ImportCache, Node};

impl ImportCache {
    /// Measure the PSS of Zygotes not measured yet (`all`: of every Zygote, as sharers come
    /// and go); evict while package Zygotes pass the limit; remove retired Zygotes that no
    /// one uses any more.
    pub(super) async fn evict(self: &Arc<Self>, all: bool) {
        let nodes: Vec<Arc<Node>> = self.nodes.lock().unwrap().values().cloned().collect();
        let mut total = 0;
        for node in &nodes {
            let known = node.info.lock().unwrap().pss;
            let pss = if all || known == 0 {
                let pid = node.process.lock().await.as_ref().map(|z| z.process.pid());
                let pss = pid.and_then(crate::memory::pss_bytes).unwrap_or(0);
                node.info.lock().unwrap().pss = pss;
                pss
            } else {
                known
            };
            if !node.is_root() {
                total += pss;
            }
        }
        let idle = |n: &Arc<Node>| {
            let info = n.info.lock().unwrap();
            info.alive && info.children.is_empty() && info.handlers == 0 && !n.is_root()
        };
        for node in nodes.iter().filter(|n| idle(n) && n.info.lock().unwrap().retired) {
            total = total.saturating_sub(node.info.lock().unwrap().pss);
            self.forget(node.id, false).await;
        }
        while total > self.cfg.memory_limit {
            let window = self.cfg.window;
            let candidates: Vec<Arc<Node>> = self.nodes.lock().unwrap().values().filter(|n| !n.pinned && idle(n)).cloned().collect();
            let scored: Vec<(u64, u64, usize)> = candidates.iter().map(|n| (n.id, n.benefit, n.uses_within(window))).collect();
            let Some(victim) = choose_victim(&scored).and_then(|id| candidates.into_iter().find(|n| n.id == id)) else {
                break; // everything left is pinned or in use
            };
            let pss = victim.info.lock().unwrap().pss;
            tracing::info!(zygote = victim.id, packages = ?victim.added, pss_mb = pss >> 20, "evicting a Zygote");
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            self.forget(victim.id, false).await;
            total = total.saturating_sub(pss);
        }
    }
}

/// Every Zygote's PSS is measured again this often. Measuring walks the page tables of an
/// interpreter with its packages imported (a few milliseconds of kernel time each), so doing
/// it every second for every Zygote was the worker's largest cost on an idle machine.
const REMEASURE: Duration = Duration::from_secs(5);

/// Every second: measure new Zygotes (all of them every [`REMEASURE`]), evict, drop nodes no
/// one can use, and size the spares.
pub(super) async fn maintain(cache: Weak<ImportCache>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_full: Option<Instant> = None;
    loop {
        tick.tick().await;
        let Some(cache) = cache.upgrade() else { return };
        let all = last_full.is_none_or(|at| at.elapsed() >= REMEASURE);
        if all {
            last_full = Some(Instant::now());
        }
        cache.evict(all).await;
        cache.trim_spares();
    }
}

/// SOCK's eviction rule: of the candidates (id, benefit in bytes, uses within the window),
/// evict the one with the highest benefit/cost, cost being its uses; unused ones come first
/// (their ratio is infinite), the larger benefit breaking ties.
pub fn choose_victim(candidates: &[(u64, u64, usize)]) -> Option<u64> {
    let ratio = |&(_, benefit, uses): &(u64, u64, usize)| {
        if uses == 0 {
            f64::INFINITY
        } else {
            benefit as f64 / uses as f64
        }
    };
    candidates.iter().max_by(|a, b| ratio(a).partial_cmp(&ratio(b)).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1))).map(|c| c.0)
}

#[cfg(test)]
mod tests {
    use super::choose_victim;

    #[test]
    pub(super) fn the_highest_benefit_per_use_goes_first() {
        // 40 MB used 10 times (4 MB/use) against 10 MB used once (10 MB/use).
        assert_eq!(choose_victim(&[(1, 40 << 20, 10), (2, 10 << 20, 1)]), Some(2));
        // An unused Zygote goes before any used one, however small.
        assert_eq!(choose_victim(&[(1, 400 << 20, 1), (2, 1, 0)]), Some(2));
        // Among unused ones, the one freeing most.
        assert_eq!(choose_victim(&[(1, 5, 0), (2, 9, 0), (3, 7, 0)]), Some(2));
        assert_eq!(choose_victim(&[]), None);
    }
}
