//! Spares: children forked from a busy Zygote ahead of demand and bound to no lambda, so that
//! a cold start binds one (it enters the sandbox's root, cgroup and namespaces and connects:
//! a few system calls) instead of waiting for a fork and for the new process's first writes
//! to copy the pages it shares with its Zygote. The spare has made those copies already,
//! off the request path (see `serve_spare` in runtime/zygote.py and `sprout_spare_wait` in
//! csrc/zygote.c). A spare is bound once or killed, so it never holds another lambda's code,
//! environment or files.
//!
//! How many spares each Zygote keeps is [`SparePlan::target`](super::SparePlan::target)'s
//! decision (pure, tested in [`super::spare`]): none for a Zygote unused for
//! [`SparePlan::idle`](super::SparePlan::idle), else enough to cover the cold starts expected
//! while replacements are forked, up to the configured most.

use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::spare::{Readiness, Spare};
use super::state::{ImportCache, Node, NodeUse};
use crate::cgroup::Cgroup;
use crate::process::PidFd;
use crate::zygote::ForkRequest;

/// How long after a spare is taken its replacement is forked, and between two forks.
const REFILL_DELAY: Duration = Duration::from_millis(2);

impl ImportCache {
    /// Record a cold start on `node` and take its oldest spare that has warmed up, if any: one
    /// still warming means the CPU has had no time to spare, and the caller forks. Replacements
    /// are the caller's to ask for once its handler has started ([`ImportCache::replenish`]):
    /// forked sooner, they would compete with it for the CPU.
    fn take_spare(self: &Arc<Self>, node: &Arc<Node>) -> Option<Spare> {
        let now = Instant::now();
        let taken = {
            let mut pool = node.spares.lock().unwrap();
            pool.starts.push_back(now);
            self.cfg.spares.trim(now, &mut pool.starts);
            // The oldest spare that has warmed up; the dead are dropped, the warming kept.
            let mut taken = None;
            let mut index = 0;
            while index < pool.ready.len() {
                match pool.ready[index].readiness() {
                    Readiness::Ready => {
                        taken = pool.ready.remove(index);
                        break;
                    }
                    Readiness::Warming => index += 1,
                    Readiness::Gone => {
                        pool.ready.remove(index);
                        self.counters.spares_lost.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            taken
        };
        let counter = if taken.is_some() { &self.counters.spares_bound } else { &self.counters.spares_missed };
        if self.cfg.spares.max > 0 {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// Bind a spare of `source` to the handler `request` and `fds` describe, as a fork would
    /// make it; `None` when there is no live spare (the caller forks).
    pub(super) async fn bind_spare(
        self: &Arc<Self>,
        source: &Arc<Node>,
        request: ForkRequest,
        fds: &[RawFd],
        cgroup: &Cgroup,
    ) -> Option<PidFd> {
        let spare = self.take_spare(source)?;
        // Out of the spares' idle CPU group first (the cpu hierarchy is enough; the rest are
        // joined as a fork's child joins them): there, on a busy CPU, it would not run until
        // the CPU had nothing else to do — not even to read its binding.
        // (No cpu controller: the spares' group was not idle either, and nothing moves.)
        if let Err(e) = crate::cgroup::move_pid(cgroup.cpu_procs_fd(), spare.process.pid()).await {
            tracing::debug!(zygote = source.id, "a spare could not be moved into its sandbox's cgroup ({e}); forking instead");
            self.counters.spares_lost.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        match spare.bind(request, fds) {
            Ok(pidfd) => Some(pidfd),
            Err(e) => {
                tracing::debug!(zygote = source.id, "a spare could not be bound ({e}); forking instead");
                self.counters.spares_lost.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Fork spares for the Zygote a handler came from, in the background, up to its target:
    /// called once the handler has started.
    pub fn replenish(self: &Arc<Self>, hold: &NodeUse) {
        self.refill(&hold.0);
    }

    /// The cgroup spares warm up in: idle on the CPU (see [`Cgroup::set_idle`]), so their
    /// warming never delays a request, and its memory is theirs. `None` (spares off) when it
    /// cannot be made.
    fn spare_group(&self) -> Option<&Cgroup> {
        self.spare_group
            .get_or_init(|| {
                let name = format!("{}/spares", self.cgroup_parent);
                let made = Cgroup::create(self.layout.clone(), &name).and_then(|mut group| {
                    group.set_limits(&self.cfg.zygote_limits)?;
                    group.set_idle(true)?;
                    Ok(group)
                });
                made.map_err(|e| tracing::warn!("making the spares' cgroup {name}: {e}; Zygotes keep no spares")).ok()
            })
            .as_ref()
    }

    /// Move a just-forked spare into the spares' cgroup, then let it warm up.
    async fn start_spare(&self, process: PidFd, link: OwnedFd) -> Result<Spare, String> {
        let mut spare = Spare::new(process, link).map_err(|e| e.to_string())?;
        let group = self.spare_group().ok_or("no cgroup for spares")?;
        crate::cgroup::move_pid(group.procs_fds(), spare.process.pid())
            .await
            .map_err(|e| format!("moving a spare into its cgroup: {e}"))?;
        spare.start().map_err(|e| format!("starting a spare: {e}"))?;
        Ok(spare)
    }

    /// Memory spares hold (all of it theirs: the pages they copied warming up).
    pub fn spares_memory(&self) -> u64 {
        self.spare_group.get().and_then(|g| g.as_ref()).map(|g| g.memory_in_use()).unwrap_or(0)
    }

    /// Spares waiting over all Zygotes, and their memory.
    pub fn spare_figures(&self) -> (usize, u64) {
        let ready = self.nodes.lock().unwrap().values().map(|n| n.spares.lock().unwrap().ready()).sum();
        (ready, self.spares_memory())
    }

    /// Fork spares for `node` in the background until it holds its target.
    pub(super) fn refill(self: &Arc<Self>, node: &Arc<Node>) {
        let plan = self.cfg.spares;
        if plan.max == 0 || self.spare_group().is_none() {
            return;
        }
        {
            let mut pool = node.spares.lock().unwrap();
            if pool.refilling || pool.ready.len() >= plan.target(Instant::now(), &pool.starts, node.is_root()) {
                return;
            }
            pool.refilling = true;
        }
        let (cache, node) = (self.clone(), node.clone());
        tokio::spawn(async move {
            loop {
                // The Zygote's fork runs at normal priority (the spare's warming does not):
                // let the request that took a spare finish first, and fork one at a time.
                tokio::time::sleep(REFILL_DELAY).await;
                let wanted = {
                    let pool = node.spares.lock().unwrap();
                    plan.target(Instant::now(), &pool.starts, node.is_root()) > pool.ready.len()
                };
                if !wanted || !node.alive() {
                    break;
                }
                let forked = {
                    let mut guard = node.process.lock().await;
                    match guard.as_mut() {
                        Some(zygote) => zygote.fork_spare(cache.cfg.start_timeout).await,
                        None => break,
                    }
                };
                let made = match forked {
                    Ok((process, link)) => cache.start_spare(process, link).await,
                    Err(e) => Err(e.to_string()),
                };
                let spare = match made {
                    Ok(spare) => spare,
                    Err(e) => {
                        tracing::warn!(zygote = node.id, "forking a spare: {e}");
                        break;
                    }
                };
                cache.counters.spares_forked.fetch_add(1, Ordering::Relaxed);
                node.spares.lock().unwrap().ready.push_back(spare);
            }
            node.spares.lock().unwrap().refilling = false;
        });
    }

    /// Let go of the spares of Zygotes that no longer need them (each second, from
    /// `maintain`), and top up the root Zygote's one.
    pub(super) fn trim_spares(self: &Arc<Self>) {
        let now = Instant::now();
        let nodes: Vec<Arc<Node>> = self.nodes.lock().unwrap().values().cloned().collect();
        for node in nodes {
            let surplus: Vec<Spare> = {
                let mut pool = node.spares.lock().unwrap();
                let target = self.cfg.spares.target(now, &pool.starts, node.is_root());
                let keep = target.min(pool.ready.len());
                pool.ready.drain(keep..).collect()
            };
            if !surplus.is_empty() {
                self.counters.spares_released.fetch_add(surplus.len() as u64, Ordering::Relaxed);
            }
            drop(surplus);
            self.refill(&node);
        }
    }
}
