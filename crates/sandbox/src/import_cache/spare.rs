//! One spare (a child forked from a Zygote ahead of demand, waiting on its link to be bound)
//! and each Zygote's pool of them, with [`SparePlan`], the pure rule sizing the pool (tested
//! below). Making, binding and trimming spares is the cache's work, in [`super::spares`].

use std::collections::VecDeque;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::process::PidFd;
use crate::zygote::ForkRequest;

/// A child forked ahead of demand, waiting on its link to be bound.
pub(super) struct Spare {
    pub(super) process: PidFd,
    /// Non-blocking; `None` once bound.
    link: Option<UnixStream>,
    /// It said it has warmed up.
    ready: bool,
}

/// What a look at a spare found.
#[derive(Debug, PartialEq)]
pub(super) enum Readiness {
    Ready,
    Warming,
    Gone,
}

impl Spare {
    pub(super) fn new(process: PidFd, link: OwnedFd) -> std::io::Result<Spare> {
        let link = UnixStream::from(link);
        link.set_nonblocking(true)?;
        Ok(Spare { process, link: Some(link), ready: false })
    }

    /// Let it warm up (it waits for this byte: until then it may not be in its cgroup yet).
    pub(super) fn start(&mut self) -> std::io::Result<()> {
        let link = self.link.as_mut().expect("not bound yet");
        match std::io::Write::write(link, b"G")? {
            1 => Ok(()),
            _ => Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "a spare's link took nothing")),
        }
    }

    /// Whether it has warmed up (it sends one byte when it has), is still warming, or died.
    pub(super) fn readiness(&mut self) -> Readiness {
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
    pub(super) fn bind(mut self, request: ForkRequest, fds: &[RawFd]) -> std::io::Result<PidFd> {
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
    pub(super) ready: VecDeque<Spare>,
    pub(super) starts: VecDeque<Instant>,
    pub(super) refilling: bool,
}

impl SparePool {
    pub(super) fn ready(&self) -> usize {
        self.ready.len()
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
