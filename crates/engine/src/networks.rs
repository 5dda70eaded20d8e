//! Which network namespace each lambda holds, and what its sandboxes are told about services.
//!
//! A lambda takes a namespace from the pool at its first cold start and keeps it while it
//! exists, so every later sandbox of it only joins (a `setns` in the fork protocol). It lets
//! go when it is deleted, or — once `network.max_namespaces` would be passed — when it has
//! no sandboxes, least recently used first. The namespace itself is removed when the last
//! sandbox holding it is gone. The choice of whom to let go is [`Assignments`], a pure state
//! machine with unit tests.

use std::collections::HashMap;
use std::sync::Arc;

use sprout_sandbox::network::{service_env, LambdaNetwork, Network, Service};

/// The pool's counters (name, help, value), and its namespaces in use and ready.
pub type NetworkFigures = ([(&'static str, &'static str, u64); 4], u64, u64);

/// Named entries with a use clock: which to keep, which to let go.
#[derive(Debug)]
pub struct Assignments<T> {
    entries: HashMap<String, (T, u64)>,
    clock: u64,
}

impl<T> Default for Assignments<T> {
    fn default() -> Self {
        Assignments { entries: HashMap::new(), clock: 0 }
    }
}

impl<T> Assignments<T> {
    /// The entry of `name`, marked as just used.
    pub fn get(&mut self, name: &str) -> Option<&T> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(name).map(|(value, used)| {
            *used = clock;
            &*value
        })
    }

    pub fn insert(&mut self, name: &str, value: T) {
        self.clock += 1;
        self.entries.insert(name.to_string(), (value, self.clock));
    }

    pub fn remove(&mut self, name: &str) -> Option<T> {
        self.entries.remove(name).map(|(v, _)| v)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Names to let go so that one more entry fits within `limit`: the least recently used
    /// of those `idle` says nobody else holds. Fewer than needed when too few are idle.
    pub fn to_release(&self, limit: usize, idle: impl Fn(&T) -> bool) -> Vec<String> {
        let excess = (self.entries.len() + 1).saturating_sub(limit);
        if excess == 0 {
            return Vec::new();
        }
        let mut candidates: Vec<(&String, u64)> =
            self.entries.iter().filter(|(_, (v, _))| idle(v)).map(|(k, (_, used))| (k, *used)).collect();
        candidates.sort_by_key(|(_, used)| *used);
        candidates.into_iter().take(excess).map(|(k, _)| k.clone()).collect()
    }
}

/// The lambdas' networks: isolated (a namespace each, from `network`) or the host's.
pub struct LambdaNetworks {
    network: Option<Arc<Network>>,
    services: Vec<Service>,
    limit: usize,
    assigned: tokio::sync::Mutex<Assignments<Arc<LambdaNetwork>>>,
}

impl LambdaNetworks {
    /// With `network`, each lambda gets a namespace of its own (at most `limit` held by
    /// lambdas at once); without, sandboxes share the host's network and reach `services` at
    /// their real addresses.
    pub fn new(network: Option<Arc<Network>>, services: Vec<Service>, limit: usize) -> LambdaNetworks {
        let services = network.as_ref().map(|n| n.services().to_vec()).unwrap_or(services);
        LambdaNetworks { network, services, limit: limit.max(1), assigned: tokio::sync::Mutex::new(Assignments::default()) }
    }

    /// The services, where sandboxes reach them.
    pub fn services(&self) -> Vec<Service> {
        self.services.clone()
    }

    /// The namespace `lambda`'s sandboxes join; None when sandboxes share the host's network.
    pub async fn for_lambda(&self, lambda: &str) -> std::io::Result<Option<Arc<LambdaNetwork>>> {
        let Some(network) = &self.network else {
            return Ok(None);
        };
        let mut assigned = self.assigned.lock().await;
        if let Some(held) = assigned.get(lambda) {
            return Ok(Some(held.clone()));
        }
        for name in assigned.to_release(self.limit, |held| Arc::strong_count(held) == 1) {
            assigned.remove(&name);
        }
        let held = Arc::new(network.take(lambda).await?);
        assigned.insert(lambda, held.clone());
        Ok(Some(held))
    }

    /// `lambda` was just uploaded: take its namespace now and make the pool's replacement
    /// before the upload is answered, rather than at its first cold start, where making one
    /// competes with the start for the CPU (measured: +5 ms on a 3 ms cold start). A failure
    /// is left to the first cold start, which reports it.
    pub async fn prepare(&self, lambda: &str) {
        let Some(network) = &self.network else { return };
        if let Err(e) = self.for_lambda(lambda).await {
            tracing::debug!(lambda, "no network namespace at upload (the first cold start tries again): {e}");
            return;
        }
        network.top_up().await;
    }

    /// `lambda` was deleted: its namespace goes once its last sandbox has.
    pub async fn forget(&self, lambda: &str) {
        self.assigned.lock().await.remove(lambda);
    }

    /// What a sandbox of `lambda` is told about its services.
    pub fn env_for(&self, lambda: &str) -> Vec<(String, String)> {
        service_env(&self.services, lambda)
    }

    /// The pool's counters and its namespaces in use and ready, for /metrics (None: the host's
    /// network).
    pub fn figures(&self) -> Option<NetworkFigures> {
        self.network.as_ref().map(|n| n.figures())
    }

    pub fn stats(&self) -> serde_json::Value {
        match &self.network {
            Some(network) => {
                let mut stats = network.stats();
                stats["isolated"] = true.into();
                stats["lambdas_holding_namespaces"] = self.assigned.try_lock().map(|a| a.len()).unwrap_or(0).into();
                stats
            }
            None => serde_json::json!({"isolated": false}),
        }
    }

    /// Remove the worker's network from the host (at shutdown; blocking).
    pub fn shutdown(&self) -> Vec<String> {
        self.network.as_ref().map(|n| n.shutdown()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_released_below_the_limit() {
        let mut a = Assignments::default();
        a.insert("x", 1);
        a.insert("y", 2);
        assert!(a.to_release(3, |_| true).is_empty());
        assert_eq!(a.to_release(2, |_| true), ["x"]);
    }

    #[test]
    fn the_least_recently_used_idle_ones_go_first() {
        let mut a = Assignments::default();
        for name in ["a", "b", "c", "d"] {
            a.insert(name, name == "b"); // b is busy
        }
        a.get("a"); // a was used last
        assert_eq!(a.to_release(3, |busy| !busy), ["c", "d"]);
        assert_eq!(a.to_release(2, |busy| !busy), ["c", "d", "a"]);
        // Only three are idle: releasing cannot make room for more.
        assert_eq!(a.to_release(1, |busy| !busy).len(), 3);
    }

    #[test]
    fn removing_forgets() {
        let mut a = Assignments::default();
        a.insert("x", 1);
        assert_eq!(a.remove("x"), Some(1));
        assert!(a.get("x").is_none() && a.is_empty());
    }
}
