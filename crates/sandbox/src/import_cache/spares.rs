//! Spares: children forked from a busy Zygote ahead of demand and bound to no lambda, so that
//! a cold start binds one (it enters the sandbox's root, cgroup and namespaces and connects:
//! a few system calls) instead of waiting for a fork and for the new process's first writes
//! to copy the pages it shares with its Zygote. The spare has made those copies already,
//! off the request path (see `serve_spare` in helper.py and `sprout_spare_wait` in
//! csrc/zygote.c). A spare is bound once or killed, so it never holds another lambda's code,
//! environment or files.
//!
//! How many spares each Zygote keeps is [`SparePlan::target`]'s decision (pure, tested
//! below): none for a Zygote unused for [`SparePlan::idle`], else enough to cover the cold
//! starts expected while replacements are forked, up to the configured most.

use std::collections::VecDeque;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::*;
use crate::zygote::ForkRequest;

/// How long after a spare is taken its replacement is forked, and between two forks.
const REFILL_DELAY: Duration = Duration::from_millis(2);

/// A child forked ahead of demand, waiting on its link to be bound.
pub(super) struct Spare {
    process: PidFd,
    /// Non-blocking; `None` once bound.
    link: Option<UnixStream>,
    /// It said it has warmed up.
    ready: bool,
}

/// What a look at a spare found.
#[derive(Debug, PartialEq)]
enum Readiness {
    Ready,
    Warming,
    Gone,
}

impl Spare {
    fn new(process: PidFd, link: OwnedFd) -> std::io::Result<Spare> {
        let link = UnixStream::from(link);
        link.set_nonblocking(true)?;
        Ok(Spare { process, link: Some(link), ready: false })
    }

    /// Let it warm up (it waits for this byte: until then it may not be in its cgroup yet).
    fn start(&mut self) -> std::io::Result<()> {
        let link = self.link.as_mut().expect("not bound yet");
        match std::io::Write::write(link, b"G")? {
            1 => Ok(()),
            _ => Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "a spare's link took nothing")),
        }
    }

    /// Whether it has warmed up (it sends one byte when it has), is still warming, or died.
    fn readiness(&mut self) -> Readiness {
        if self.ready {
            return if self.process.has_exited() { Readiness::Gone } else { Readiness::Ready };
        }
        let Some(link) = self.link.as_mut() else { return Readiness::Gone };
        let mut byte = [0u8; 1];
        match link.read(&mut byte) {
            Ok(1) if byte[0] == b'R' => {
                self.ready = true;
                Readiness::Ready
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Readiness::Warming,
            _ => Readiness::Gone,
        }
    }

    /// Send the spare what a fork request for a handler would carry; it becomes that handler.
    /// Returns its pidfd (to be trusted only as far as the Zygote that forked it is).
    fn bind(mut self, request: ForkRequest, fds: &[RawFd]) -> std::io::Result<PidFd> {
        let link = self.link.take().expect("a spare is bound once");
        let bytes = request.encode();
        let iov = [std::io::IoSlice::new(&bytes)];
        let cmsg = [nix::sys::socket::ControlMessage::ScmRights(fds)];
        // An empty socket buffer takes 16 bytes at once: this cannot block or split.
        let flags = nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL;
        let sent = nix::sys::socket::sendmsg::<()>(link.as_raw_fd(), &iov, &cmsg, flags, None).map_err(std::io::Error::from)?;
        if sent != bytes.len() {
            return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "a spare's link took part of its binding"));
        }
        self.process.try_clone()
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        if self.link.is_some() {
            self.process.kill(); // not bound: its Zygote reaps it
        }
    }
}

/// How many spares a Zygote keeps, from its recent cold starts.
#[derive(Debug, Clone, Copy)]
pub struct SparePlan {
    /// Most spares per Zygote (0: none are kept).
    pub max: usize,
    /// A Zygote without a cold start for this long keeps none (the root Zygote keeps one).
    pub idle: Duration,
    /// The arrival rate is counted over this window.
    pub horizon: Duration,
    /// Time allowed to fork and warm a replacement: the spares cover the cold starts
    /// expected meanwhile, plus one.
    pub refill: Duration,
}

impl SparePlan {
    pub fn new(max: usize) -> SparePlan {
        SparePlan { max, idle: Duration::from_secs(60), horizon: Duration::from_secs(1), refill: Duration::from_millis(10) }
    }

    /// Spares to keep at `now`, given the times of recent cold starts (oldest first).
    pub fn target(&self, now: Instant, starts: &VecDeque<Instant>, root: bool) -> usize {
        if self.max == 0 {
            return 0;
        }
        let floor = usize::from(root);
        let Some(last) = starts.back() else { return floor };
        if now.saturating_duration_since(*last) > self.idle {
            return floor;
        }
        let recent = starts.iter().filter(|t| now.saturating_duration_since(**t) <= self.horizon).count();
        let rate = recent as f64 / self.horizon.as_secs_f64();
        let need = (rate * self.refill.as_secs_f64()).ceil() as usize + 1;
        need.clamp(1, self.max)
    }

    /// Forget starts too old to matter to [`SparePlan::target`] (keeping the newest).
    pub fn trim(&self, now: Instant, starts: &mut VecDeque<Instant>) {
        while starts.len() > 1 && starts.front().is_some_and(|t| now.saturating_duration_since(*t) > self.horizon) {
            starts.pop_front();
        }
    }
}

/// A Zygote's spares and the demand they are sized from.
#[derive(Default)]
pub(super) struct SparePool {
    ready: VecDeque<Spare>,
    starts: VecDeque<Instant>,
    refilling: bool,
}

impl SparePool {
    pub(super) fn ready(&self) -> usize {
        self.ready.len()
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(now: Instant, ago_ms: &[u64]) -> VecDeque<Instant> {
        let mut v: Vec<Instant> = ago_ms.iter().map(|ms| now - Duration::from_millis(*ms)).collect();
        v.sort();
        v.into()
    }

    #[test]
    fn none_without_demand_but_the_root_keeps_one() {
        let plan = SparePlan::new(4);
        let now = Instant::now() + Duration::from_secs(3600);
        assert_eq!(plan.target(now, &VecDeque::new(), false), 0);
        assert_eq!(plan.target(now, &VecDeque::new(), true), 1);
        // Used 61 s ago: idle.
        assert_eq!(plan.target(now, &starts(now, &[61_000]), false), 0);
        assert_eq!(plan.target(now, &starts(now, &[61_000]), true), 1);
        // Off entirely.
        assert_eq!(SparePlan::new(0).target(now, &starts(now, &[1]), true), 0);
    }

    #[test]
    fn sized_from_the_arrival_rate_within_bounds() {
        let plan = SparePlan::new(4);
        let now = Instant::now() + Duration::from_secs(3600);
        // One start 30 s ago: busy, but slow: one spare.
        assert_eq!(plan.target(now, &starts(now, &[30_000]), false), 1);
        // 150 starts in the last second, 10 ms to refill: 1.5 expected meanwhile, so 2 + 1.
        let busy: Vec<u64> = (0..150).map(|i| i * 6).collect();
        assert_eq!(plan.target(now, &starts(now, &busy), false), 3);
        // 1,000 a second would want 11: capped at the most.
        let flood: Vec<u64> = (0..1000).collect();
        assert_eq!(plan.target(now, &starts(now, &flood), false), 4);
    }

    #[test]
    fn trimming_keeps_the_newest_start() {
        let plan = SparePlan::new(4);
        let now = Instant::now() + Duration::from_secs(3600);
        let mut s = starts(now, &[50_000, 20_000, 500, 10]);
        plan.trim(now, &mut s);
        assert_eq!(s.len(), 2);
        let mut old = starts(now, &[50_000, 20_000]);
        plan.trim(now, &mut old);
        assert_eq!(old.len(), 1, "the last start stays, so idleness is still known");
        assert_eq!(plan.target(now, &old, false), 1, "20 s ago is within the idle window");
    }
}
