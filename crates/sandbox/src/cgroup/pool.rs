//! The pool of sandbox cgroups (SOCK section 2.3): groups made ahead with their limits
//! written, handed out ([`CgroupPool::acquire`]), taken back and reused
//! ([`CgroupPool::release`]), and refilled in the background.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::group::Cgroup;
use super::layout::Layout;
use super::limits::Limits;

/// Counters of a pool, for /stats and /metrics.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct PoolStats {
    pub created: u64,
    pub reused: u64,
    pub free: usize,
}

/// How long after a pooled group is taken the pool is refilled.
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(30);

/// Cgroups made ahead and reused: `sprout-<worker>/sb-<n>` in every hierarchy, refilled in the
/// background as cold starts take them.
pub struct CgroupPool {
    layout: Arc<Layout>,
    parent: String,
    limits: Limits,
    free: Mutex<Vec<Cgroup>>,
    next: AtomicU64,
    created: AtomicU64,
    reused: AtomicU64,
    max_free: usize,
    /// Free groups kept ready: taking one below half of this refills the pool in the
    /// background, so that a cold start makes a group itself only when the pool ran dry.
    prefill: usize,
    refilling: std::sync::atomic::AtomicBool,
}

impl CgroupPool {
    /// Create the parent group and `prefill` sandbox groups with `limits` written.
    pub fn new(layout: Arc<Layout>, parent: &str, limits: Limits, prefill: usize, max_free: usize) -> io::Result<CgroupPool> {
        layout.create_parent(parent)?;
        let pool = CgroupPool {
            layout,
            parent: parent.to_string(),
            limits,
            free: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
            created: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            max_free: max_free.max(prefill),
            prefill,
            refilling: false.into(),
        };
        let mut made = Vec::with_capacity(prefill);
        for _ in 0..prefill {
            made.push(pool.make()?);
        }
        *pool.free.lock().unwrap() = made;
        Ok(pool)
    }

    pub fn layout(&self) -> &Arc<Layout> {
        &self.layout
    }

    pub fn parent(&self) -> &str {
        &self.parent
    }

    fn make(&self) -> io::Result<Cgroup> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut cg = Cgroup::create(self.layout.clone(), &format!("{}/sb-{n}", self.parent))?;
        cg.set_limits(&self.limits)?;
        self.created.fetch_add(1, Ordering::Relaxed);
        Ok(cg)
    }

    /// An empty cgroup with `limits` in place: a pooled one when there is one.
    pub fn acquire(self: &Arc<Self>, limits: &Limits) -> io::Result<Cgroup> {
        let (pooled, left) = {
            let mut free = self.free.lock().unwrap();
            (free.pop(), free.len())
        };
        if left < self.prefill / 2 && !self.refilling.swap(true, Ordering::AcqRel) {
            let pool = self.clone();
            let refill = move || {
                // Not while the cold start that took a group is under way, on the same CPU.
                std::thread::sleep(REFILL_DELAY);
                // Stops when the parent is gone (the worker cleaning up): make would make it again.
                let parent = pool.layout.dirs(&pool.parent);
                while pool.free.lock().unwrap().len() < pool.prefill && parent.iter().all(|d| d.exists()) {
                    match pool.make() {
                        Ok(cg) => pool.free.lock().unwrap().push(cg),
                        Err(e) => {
                            tracing::warn!("refilling the cgroup pool: {e}");
                            break;
                        }
                    }
                }
                pool.refilling.store(false, Ordering::Release);
            };
            if let Err(e) = std::thread::Builder::new().name("cgroup-pool".into()).spawn(refill) {
                tracing::warn!("refilling the cgroup pool: {e}");
                self.refilling.store(false, Ordering::Release);
            }
        }
        let mut cg = match pooled {
            Some(cg) => {
                self.reused.fetch_add(1, Ordering::Relaxed);
                cg
            }
            None => self.make()?,
        };
        cg.set_limits(limits)?;
        Ok(cg)
    }

    /// Return an empty cgroup to the pool (or remove it when the pool is full).
    pub fn release(&self, cg: Cgroup) {
        let mut free = self.free.lock().unwrap();
        if free.len() < self.max_free {
            free.push(cg);
        } else {
            drop(free);
            if let Err(e) = cg.remove() {
                tracing::warn!("removing a surplus cgroup: {e}");
            }
        }
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            created: self.created.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
            free: self.free.lock().unwrap().len(),
        }
    }

    /// Remove every pooled group and the parent (at shutdown).
    pub fn destroy(&self) -> io::Result<()> {
        self.free.lock().unwrap().clear();
        self.layout.remove_tree(&self.parent)
    }
}
