//! Admission of cold starts to the worker's memory budget: a new sandbox goes ahead when its
//! estimate fits, evicts idle sandboxes by SOCK's benefit/cost when it does not
//! ([`crate::budget::admit`]), or waits for memory being freed — except that a request whose
//! lambda already has a sandbox waits for that one instead of evicting another lambda's
//! (the thrash guard, [`Pools::queue_instead`](super::pools::Pools::queue_instead)).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sprout_sandbox::cgroup::Layout;
use tokio::sync::oneshot;

use super::kept::{Handoff, Kept, Made};
use super::outcome::Failure;
use super::pools::{Acquired, Grant, Idle, Pools};
use crate::budget::{self as memory_budget, Admission, Budget, Estimates};
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
        Made::on(self.count_of(name))
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

/// The memory budget's gate for cold starts: the instance manager's parts an admission reads
/// and changes, lent to it.
pub(super) struct Gate<'a> {
    pub budget: Option<Budget>,
    /// The cgroup the budget is enforced on, and its hierarchy.
    pub memory_group: Option<&'a (Arc<Layout>, String)>,
    pub accounts: &'a MemoryAccounts,
    pub pools: &'a Mutex<Pools<Kept, Handoff>>,
    /// Memory a lambda's sandbox is assumed to need until one has been measured.
    pub estimate: u64,
    /// The longest a cold start waits for memory.
    pub timeout: Duration,
}

impl Gate<'_> {
    /// Wait until a new sandbox of `lambda` fits in the memory budget, evicting idle
    /// sandboxes to make room ([`memory_budget::admit`], destroyed by `evict`); the bytes
    /// granted are counted as pending until the sandbox exists. Without a budget, at once.
    /// When it does not fit as things are and the lambda has a sandbox, the request waits for
    /// that one instead: growing a lambda by evicting others' sandboxes is how a full worker
    /// thrashes (each eviction a cold start to come, each cold start CPU the busy sandboxes
    /// needed).
    pub async fn admit(&self, lambda: &Arc<Lambda>, evict: impl Fn(Vec<(Kept, Eviction)>)) -> Result<Admitted, Failure> {
        let (Some(budget), Some((layout, group))) = (self.budget, self.memory_group) else {
            return Ok(Admitted::Granted { bytes: 0, made: self.accounts.made(&lambda.name) });
        };
        let need = self.accounts.estimates.lock().unwrap().of(&lambda.name, self.estimate);
        let started = Instant::now();
        let mut waited = false;
        loop {
            let used = layout.memory_in_use_of(group).saturating_sub(self.accounts.freeing.load(Ordering::Acquire));
            let (granted, doomed) = {
                // Under the pools' lock, so two requests of a lambda decide one after the other.
                let mut pools = self.pools.lock().unwrap();
                let made = self.accounts.made_of(&lambda.name);
                let pending = self.accounts.pending.load(Ordering::Acquire);
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
                    self.accounts.pending.fetch_add(need, Ordering::AcqRel);
                    self.accounts.made(&lambda.name)
                });
                (granted, doomed)
            };
            evict(doomed);
            if let Some(made) = granted {
                return Ok(Admitted::Granted { bytes: need, made });
            }
            if !waited {
                waited = true;
                self.accounts.waits.fetch_add(1, Ordering::Relaxed);
            }
            if started.elapsed() >= self.timeout {
                return Err(Failure::NoMemory(self.timeout));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn queued_instead(&self, admitted: Admitted) -> Admitted {
        self.accounts.queued_instead.fetch_add(1, Ordering::Relaxed);
        admitted
    }
}

impl MemoryAccounts {
    /// The accounts, for `/stats` and `/metrics`, of a budget enforced on `memory_group`.
    pub(super) fn figures(&self, memory_group: &(Arc<Layout>, String)) -> BudgetFigures {
        let (layout, group) = memory_group;
        BudgetFigures {
            used: layout.memory_in_use_of(group),
            pending: self.pending.load(Ordering::Acquire),
            freeing: self.freeing.load(Ordering::Acquire),
            waits: self.waits.load(Ordering::Relaxed),
            queued_instead: self.queued_instead.load(Ordering::Relaxed),
        }
    }
}
