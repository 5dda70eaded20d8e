//! Admission of cold starts to the worker's memory budget: a new sandbox goes ahead when its
//! estimate fits, evicts idle sandboxes by SOCK's benefit/cost when it does not
//! ([`crate::budget::admit`]), or waits for memory being freed — except that a request whose
//! lambda already has a sandbox waits for that one instead of evicting another lambda's
//! (the thrash guard, [`Pools::queue_instead`](super::pools::Pools::queue_instead)).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::pools::{Acquired, Grant, Idle};
use super::{Failure, Instances, Kept};
use crate::budget::{self as memory_budget, Admission, Estimates};
use crate::handler_cache::Eviction;
use crate::registry::Lambda;

/// Most lambdas whose sandbox counts are remembered before those with none are forgotten.
const MAX_COUNTED: usize = 1024;

/// The memory budget's running accounts.
#[derive(Default)]
pub(super) struct MemoryAccounts {
    pub(super) estimates: Mutex<Estimates>,
    /// Granted to cold starts under way (not yet in the cgroup's usage).
    pub(super) pending: AtomicU64,
    /// Held by sandboxes evicted for the budget and still being destroyed.
    pub(super) freeing: Arc<AtomicU64>,
    /// Cold starts that had to wait for memory.
    pub(super) waits: AtomicU64,
    /// Requests that waited for their lambda's sandbox rather than evict another's.
    pub(super) queued_instead: AtomicU64,
    /// Each lambda's sandboxes that exist or are being made past admission.
    made: Mutex<HashMap<String, Arc<AtomicUsize>>>,
}

/// One sandbox of a lambda, counted from its admission while it is made and exists (held
/// by its [`Kept`]).
pub(super) struct Made(Arc<AtomicUsize>);

impl Drop for Made {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The memory budget's accounts, for `/stats` and `/metrics`.
pub struct BudgetFigures {
    /// In use in the budget's cgroup: charged, less page cache no process maps.
    pub used: u64,
    /// Granted to cold starts under way.
    pub pending: u64,
    /// Held by evicted sandboxes still being destroyed.
    pub freeing: u64,
    /// Cold starts that waited for memory.
    pub waits: u64,
    /// Requests that waited for their lambda's sandbox rather than evict another's.
    pub queued_instead: u64,
}

/// What a cold start's admission to the memory budget came to.
pub(super) enum Admitted {
    /// Go ahead: `bytes` were granted (pending until the sandbox exists), and the sandbox to
    /// be made counts among its lambda's from now (others wait for it rather than evict).
    Granted { bytes: u64, made: Made },
    /// Its room was given back; it waits here for one of its lambda's sandboxes.
    Queued(oneshot::Receiver<Grant<Kept>>),
    /// Its room was given back for this idle sandbox of its lambda, released meanwhile.
    Warm(Idle<Kept>),
}

impl MemoryAccounts {
    /// Count a new sandbox of `name` until the token returned is dropped.
    pub(super) fn made(&self, name: &str) -> Made {
        let count = self.count_of(name);
        count.fetch_add(1, Ordering::AcqRel);
        Made(count)
    }

    /// How many sandboxes of `name` exist or are being made past admission.
    fn made_of(&self, name: &str) -> usize {
        self.made.lock().unwrap().get(name).map_or(0, |count| count.load(Ordering::Acquire))
    }

    fn count_of(&self, name: &str) -> Arc<AtomicUsize> {
        let mut made = self.made.lock().unwrap();
        if let Some(count) = made.get(name) {
            return count.clone();
        }
        if made.len() >= MAX_COUNTED {
            made.retain(|_, count| count.load(Ordering::Acquire) > 0 || Arc::strong_count(count) > 1);
        }
        made.entry(name.to_string()).or_default().clone()
    }
}

impl Instances {
    /// Wait until a new sandbox of `lambda` fits in the memory budget, evicting idle
    /// sandboxes to make room ([`memory_budget::admit`]); the bytes granted are counted as
    /// pending until the sandbox exists. Without a budget, at once. When it does not fit as
    /// things are and the lambda has a sandbox, the request waits for that one instead:
    /// growing a lambda by evicting others' sandboxes is how a full worker thrashes (each
    /// eviction a cold start to come, each cold start CPU the busy sandboxes needed).
    pub(super) async fn admit(&self, lambda: &Arc<Lambda>) -> Result<Admitted, Failure> {
        let (Some(budget), Some((layout, group))) = (self.cfg.budget, &self.memory_group) else {
            return Ok(Admitted::Granted { bytes: 0, made: self.memory.made(&lambda.name) });
        };
        let need = self.memory.estimates.lock().unwrap().of(&lambda.name, self.cfg.sandbox_estimate);
        let started = Instant::now();
        let mut waited = false;
        loop {
            let used = layout.memory_in_use_of(group).saturating_sub(self.memory.freeing.load(Ordering::Acquire));
            let (granted, doomed) = {
                // Under the pools' lock, so two requests of a lambda decide one after the other.
                let mut pools = self.pools.lock().unwrap();
                let made = self.memory.made_of(&lambda.name);
                let pending = self.memory.pending.load(Ordering::Acquire);
                let admission = if memory_budget::fits(&budget, used, pending, need) {
                    Admission::Go
                } else {
                    let (tx, rx) = oneshot::channel();
                    match pools.queue_instead(&lambda.name, lambda.version, made, tx) {
                        Acquired::Queued => return Ok(self.queued_instead(Admitted::Queued(rx))),
                        Acquired::Warm(idle) => return Ok(self.queued_instead(Admitted::Warm(idle))),
                        Acquired::Create | Acquired::Full => {}
                    }
                    let idle = pools.idle_candidates(Instant::now(), |kept| kept.sandbox.memory_bytes());
                    memory_budget::admit(&budget, used, pending, need, &idle, pools.busy().saturating_sub(1))
                };
                let doomed = match &admission {
                    Admission::Go => Vec::new(),
                    Admission::Evict(ids) | Admission::Wait(ids) => pools.evict_ids(ids, Eviction::Budget),
                };
                let granted = (!matches!(admission, Admission::Wait(_))).then(|| {
                    self.memory.pending.fetch_add(need, Ordering::AcqRel);
                    self.memory.made(&lambda.name)
                });
                (granted, doomed)
            };
            self.evict(doomed);
            if let Some(made) = granted {
                return Ok(Admitted::Granted { bytes: need, made });
            }
            if !waited {
                waited = true;
                self.memory.waits.fetch_add(1, Ordering::Relaxed);
            }
            if started.elapsed() >= self.cfg.timeout {
                return Err(Failure::NoMemory(self.cfg.timeout));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn queued_instead(&self, admitted: Admitted) -> Admitted {
        self.memory.queued_instead.fetch_add(1, Ordering::Relaxed);
        admitted
    }

    /// The memory budget's accounts, when there is one.
    pub fn budget_figures(&self) -> Option<BudgetFigures> {
        let (layout, group) = self.memory_group.as_ref()?;
        let m = &self.memory;
        Some(BudgetFigures {
            used: layout.memory_in_use_of(group),
            pending: m.pending.load(Ordering::Acquire),
            freeing: m.freeing.load(Ordering::Acquire),
            waits: m.waits.load(Ordering::Relaxed),
            queued_instead: m.queued_instead.load(Ordering::Relaxed),
        })
    }
}
