//! When a core polls for its next event instead of sleeping in epoll_wait: a pure state
//! machine told what each poll returned and when, asked before each poll whether to block.
//!
//! Sleeping costs the request that wakes the core a halt and an interrupt (in a virtual
//! machine an exit each way: on this project's VM about 15 µs of a 70 µs round trip); polling
//! costs the CPU it burns. Two windows:
//!
//! * `always`: poll this long after any work (EbbRT's drivers poll so under load). Worth it
//!   only on a dedicated core: with several clients it also stops their requests from
//!   gathering while the core sleeps, and on the VM that cost 10-35% from 4 connections up.
//! * `lone`: poll up to this long, but only while one client alone keeps the core busy: the
//!   last [`LONE_STREAK`] polls that found work each found that same one socket ready, each
//!   within the window of the core going idle, and none found another for [`LONE_QUIET`]. A lone client in a closed loop has nothing to
//!   gather behind it, so there polling is pure gain; when a second client appears, a poll
//!   finds two sockets ready, or the client's next request comes later than the window, the
//!   core sleeps again, so an idle or widely shared core burns at most one window.

use std::time::{Duration, Instant};

use mio::Token;

/// Polls in a row that must find the same lone socket (each quickly) before polling starts.
pub const LONE_STREAK: u32 = 3;

/// How long since any other socket was found ready before a client counts as alone: clients
/// taking turns one at a time can look alone for a few polls, not for this long.
pub const LONE_QUIET: Duration = Duration::from_millis(2);

#[derive(Debug)]
pub struct PollPolicy {
    always: Duration,
    lone: Duration,
    /// When the core last finished work (the start of the current idle time).
    idle_since: Option<Instant>,
    /// The one socket the last polls found ready, and how many polls in a row found it alone.
    lone_token: Option<Token>,
    streak: u32,
    /// When a poll last found another socket ready (or several at once).
    other_seen: Option<Instant>,
}

impl PollPolicy {
    pub fn new(always: Duration, lone: Duration) -> PollPolicy {
        PollPolicy { always, lone, idle_since: None, lone_token: None, streak: 0, other_seen: None }
    }

    /// Whether either window is set (if not, the loop need not read the clock for it).
    pub fn enabled(&self) -> bool {
        !self.always.is_zero() || !self.lone.is_zero()
    }

    /// A poll returned at `now` with `io_events` sockets ready, the first of them `first`.
    pub fn arrived(&mut self, now: Instant, io_events: usize, first: Option<Token>) {
        if io_events == 0 {
            return;
        }
        let quick = self.idle_since.is_some_and(|since| now.saturating_duration_since(since) <= self.lone);
        if io_events == 1 && first.is_some() && first == self.lone_token && quick {
            self.streak = self.streak.saturating_add(1);
        } else if io_events == 1 {
            if self.lone_token.is_some() && first != self.lone_token {
                self.other_seen = Some(now);
            }
            self.lone_token = first;
            self.streak = 1;
        } else {
            self.other_seen = Some(now);
            self.lone_token = None;
            self.streak = 0;
        }
    }

    /// The core finished its work at `now` and is about to wait for more.
    pub fn finished(&mut self, now: Instant) {
        self.idle_since = Some(now);
    }

    /// Whether the next poll should return at once (poll) rather than sleep.
    pub fn poll(&self, now: Instant) -> bool {
        let Some(since) = self.idle_since else { return false };
        let idle = now.saturating_duration_since(since);
        let quiet = self.other_seen.is_none_or(|at| now.saturating_duration_since(at) >= LONE_QUIET);
        idle < self.always || (self.streak >= LONE_STREAK && quiet && idle < self.lone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Drive `policy` with a client whose request comes `gap` after each reply, `rounds` times;
    /// returns the policy and the time of the last reply.
    fn lone_client(policy: &mut PollPolicy, start: Instant, gap: Duration, rounds: u32) -> Instant {
        let mut t = start;
        for _ in 0..rounds {
            t += gap;
            policy.arrived(t, 1, Some(Token(7)));
            t += us(5);
            policy.finished(t);
        }
        t
    }

    #[test]
    fn off_by_default_never_polls() {
        let mut p = PollPolicy::new(Duration::ZERO, Duration::ZERO);
        assert!(!p.enabled());
        let t0 = Instant::now();
        let t = lone_client(&mut p, t0, us(10), 10);
        assert!(!p.poll(t));
    }

    #[test]
    fn always_polls_for_its_window_after_any_work() {
        let mut p = PollPolicy::new(us(50), Duration::ZERO);
        let t0 = Instant::now();
        assert!(!p.poll(t0), "nothing done yet");
        p.arrived(t0, 3, Some(Token(1)));
        p.finished(t0);
        assert!(p.poll(t0 + us(49)));
        assert!(!p.poll(t0 + us(50)));
    }

    #[test]
    fn a_lone_quick_client_is_polled_for_after_the_streak() {
        let mut p = PollPolicy::new(Duration::ZERO, us(200));
        let t0 = Instant::now();
        let t = lone_client(&mut p, t0, us(40), LONE_STREAK - 1);
        assert!(!p.poll(t), "not yet: the first request has no idle time before it");
        let t = lone_client(&mut p, t, us(40), 2);
        assert!(p.poll(t));
        assert!(p.poll(t + us(199)));
        assert!(!p.poll(t + us(200)), "the window is a bound");
    }

    #[test]
    fn a_second_client_stops_the_polling() {
        let mut p = PollPolicy::new(Duration::ZERO, us(200));
        let t = lone_client(&mut p, Instant::now(), us(40), 5);
        assert!(p.poll(t));
        // Two sockets ready at once.
        p.arrived(t + us(10), 2, Some(Token(7)));
        p.finished(t + us(20));
        assert!(!p.poll(t + us(21)));
        // Or sockets taking turns, one at a time, even when one comes back a few times
        // before the next takes its turn.
        let mut t = t + us(20);
        for i in 0..100 {
            t += us(10);
            p.arrived(t, 1, Some(Token(7 + (i / 4) % 2)));
            p.finished(t);
            assert!(!p.poll(t), "turn {i}");
        }
        // Once the other has been quiet for LONE_QUIET, the one left is alone.
        let t = lone_client(&mut p, t, us(40), 60);
        assert!(p.poll(t));
    }

    #[test]
    fn a_client_slower_than_the_window_is_not_polled_for() {
        let mut p = PollPolicy::new(Duration::ZERO, us(200));
        let t = lone_client(&mut p, Instant::now(), us(300), 20);
        assert!(!p.poll(t));
    }

    #[test]
    fn one_late_request_costs_one_window_and_then_the_streak_again() {
        let mut p = PollPolicy::new(Duration::ZERO, us(200));
        let t = lone_client(&mut p, Instant::now(), us(40), 5);
        assert!(p.poll(t + us(100)));
        // The client pauses: the core polls its window out, sleeps, and the request comes late.
        let t = lone_client(&mut p, t, us(1000), 1);
        assert!(!p.poll(t), "late: sleep next time");
        let t = lone_client(&mut p, t, us(40), LONE_STREAK - 1);
        assert!(p.poll(t), "quick again for a streak");
    }
}
