//! The handler cache's accounting (SOCK section 4.3): idle sandboxes are paused with the
//! cgroup freezer, their memory is measured as PSS (so handlers sharing a Zygote's pages are
//! charged their share, not every page they map), and when paused sandboxes together pass
//! the limit the least recently used are evicted. [`crate::instances`] keeps the sandboxes;
//! this module decides which go and counts why.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::{json, Value};

#[derive(Debug, Clone, Copy)]
pub struct HandlerCacheConfig {
    /// Pause idle sandboxes (false: they stay runnable).
    pub pause: bool,
    /// How long a sandbox is idle before it is paused.
    pub pause_after: std::time::Duration,
    /// Bytes of PSS paused sandboxes may hold in all.
    pub memory_limit: u64,
}

/// Why an idle sandbox left the cache.
#[derive(Debug, Clone, Copy)]
pub enum Eviction {
    /// Paused sandboxes passed the memory limit (least recently used first).
    Memory,
    /// Idle past `instances.idle_timeout_s`.
    Idle,
    /// The worker needed room for another lambda's sandbox (`instances.max_total`).
    Room,
    /// Its lambda was replaced or deleted.
    Replaced,
    /// It had died while idle (its Zygote died, or it was killed).
    Dead,
    /// A cold start needed its memory under the worker's memory budget.
    Budget,
    /// Its lambda has a pre-warm window: it goes after its request, and a new one is started
    /// just before the next is expected.
    Prewarm,
}

impl Eviction {
    pub const ALL: [Eviction; 7] =
        [Eviction::Memory, Eviction::Idle, Eviction::Room, Eviction::Replaced, Eviction::Dead, Eviction::Budget, Eviction::Prewarm];

    pub fn label(self) -> &'static str {
        match self {
            Eviction::Memory => "memory",
            Eviction::Idle => "idle",
            Eviction::Room => "room",
            Eviction::Replaced => "replaced",
            Eviction::Dead => "dead",
            Eviction::Budget => "budget",
            Eviction::Prewarm => "prewarm",
        }
    }
}

#[derive(Default)]
pub struct Counters {
    evictions: [AtomicU64; 7],
    pauses: AtomicU64,
    resumes: AtomicU64,
    resume_us: AtomicU64,
}

impl Counters {
    pub fn evicted(&self, why: Eviction, n: usize) {
        self.evictions[why as usize].fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn paused(&self) {
        self.pauses.fetch_add(1, Ordering::Relaxed);
    }

    pub fn resumed(&self, took: std::time::Duration) {
        self.resumes.fetch_add(1, Ordering::Relaxed);
        self.resume_us.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn evictions(&self, why: Eviction) -> u64 {
        self.evictions[why as usize].load(Ordering::Relaxed)
    }

    pub fn json(&self, cfg: &HandlerCacheConfig, paused: usize, paused_pss: u64) -> Value {
        let resumes = self.resumes.load(Ordering::Relaxed);
        let evictions: serde_json::Map<String, Value> =
            Eviction::ALL.iter().map(|e| (e.label().to_string(), json!(self.evictions(*e)))).collect();
        json!({
            "pause": cfg.pause,
            "memory_limit_mb": cfg.memory_limit >> 20,
            "paused": paused,
            "paused_pss_mb": paused_pss as f64 / (1 << 20) as f64,
            "pauses": self.pauses.load(Ordering::Relaxed),
            "resumes": resumes,
            "mean_resume_us": self.resume_us.load(Ordering::Relaxed).checked_div(resumes).unwrap_or(0),
            "evictions": evictions,
        })
    }
}

/// Which of the paused sandboxes to evict so that the rest fit in `limit`: least recently
/// used first. `entries` are (last use, PSS, key); returns the keys to evict.
pub fn over_limit<K: Clone>(mut entries: Vec<(Instant, u64, K)>, limit: u64) -> Vec<K> {
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    entries.sort_by_key(|e| e.0);
    let mut out = Vec::new();
    for (_, pss, key) in entries {
        if total <= limit {
            break;
        }
        total -= pss;
        out.push(key);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_least_recently_used_go_until_the_rest_fit() {
        let now = Instant::now();
        let at = |s: u64| now - Duration::from_secs(s);
        let entries = vec![(at(1), 40, "newest"), (at(30), 50, "oldest"), (at(10), 30, "middle")];
        assert_eq!(over_limit(entries.clone(), 120), Vec::<&str>::new());
        assert_eq!(over_limit(entries.clone(), 100), vec!["oldest"]);
        assert_eq!(over_limit(entries.clone(), 40), vec!["oldest", "middle"]);
        assert_eq!(over_limit(entries, 0), vec!["oldest", "middle", "newest"]);
    }
}
