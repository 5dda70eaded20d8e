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
//! * `lone`: poll up to this long, but only while few clients keep the core busy: the last
//!   [`LONE_STREAK`] polls each found work within the window of the core going idle, and no
//!   more than `few` sockets (1 by default: a lone client) were found ready within
//!   [`LONE_QUIET`]. Few clients in a closed loop have little to gather behind them, so on a
//!   core of its own polling is gain; when more appear, or a request comes later than the
//!   window, the core sleeps again, so an idle or widely shared core burns at most one window.
//!   Where the clients run on the core's own CPU, polling for them takes that CPU from them:
//!   `few` above 1 is for dedicated cores.

use std::time::{Duration, Instant};

use mio::Token;

/// Polls in a row that must find work (each quickly) before polling starts.
pub const LONE_STREAK: u32 = 3;

/// The span over which the sockets found ready are counted: clients taking turns one at a
/// time can look few for a few polls, not for this long.
pub const LONE_QUIET: Duration = Duration::from_millis(2);

#[derive(Debug)]
pub struct PollPolicy {
    always: Duration,
    lone: Duration,
    /// The most sockets found ready within [`LONE_QUIET`] for the `lone` window to apply.
    few: usize,
    /// When the core last finished work (the start of the current idle time).
    idle_since: Option<Instant>,
    /// Polls in a row that found work, each within the `lone` window of idling.
    streak: u32,
    /// The sockets found ready lately, each with when it last was (at most `few` + 1).
    recent: Vec<(Token, Instant)>,
    /// When more than `few` sockets were last found ready within [`LONE_QUIET`].
    crowded_at: Option<Instant>,
}

impl PollPolicy {
    /// `always`: poll this long after any work; `lone`: poll this long while at most `few`
    /// clients keep the core busy.
    pub fn new(always: Duration, lone: Duration, few: usize) -> PollPolicy {
        let few = few.max(1);
        PollPolicy { always, lone, few, idle_since: None, streak: 0, recent: Vec::with_capacity(few + 1), crowded_at: None }
    }

    /// Whether either window is set (if not, the loop need not read the clock for it).
    pub fn enabled(&self) -> bool {
        !self.always.is_zero() || !self.lone.is_zero()
    }

    /// A poll that returned at `now` found `token`'s socket ready.
    pub fn ready(&mut self, now: Instant, token: Token) {
        if let Some(seen) = self.recent.iter_mut().find(|(t, _)| *t == token) {
            seen.1 = now; // a socket already counted: the count is unchanged
            return;
        }
        self.recent.retain(|(_, at)| now.saturating_duration_since(*at) < LONE_QUIET);
        self.recent.push((token, now));
        if self.recent.len() > self.few {
            self.crowded_at = Some(now);
            // Only the most recent few + 1 matter: keep the list short.
            if let Some(oldest) = self.recent.iter().enumerate().min_by_key(|(_, (_, at))| *at).map(|(i, _)| i) {
                self.recent.swap_remove(oldest);
            }
        }
    }

    /// A poll returned at `now` with `io_events` sockets ready (each told to [`Self::ready`]).
    pub fn arrived(&mut self, now: Instant, io_events: usize) {
        if io_events == 0 {
            return;
        }
        let quick = self.idle_since.is_some_and(|since| now.saturating_duration_since(since) <= self.lone);
        self.streak = if quick { self.streak.saturating_add(1) } else { 1 };
    }

    /// The core finished its work at `now` and is about to wait for more.
    pub fn finished(&mut self, now: Instant) {
        self.idle_since = Some(now);
    }

    /// Whether the next poll should return at once (poll) rather than sleep.
    pub fn poll(&self, now: Instant) -> bool {
        let Some(since) = self.idle_since else { return false };
        let idle = now.saturating_duration_since(since);
        let quiet = self.crowded_at.is_none_or(|at| now.saturating_duration_since(at) >= LONE_QUIET);
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
            policy.ready(t, Token(7));
            policy.arrived(t, 1);
            t += us(5);
            policy.finished(t);
        }
        t
    }

    #[test]
    fn off_by_default_never_polls() {
        let mut p = PollPolicy::new(Duration::ZERO, Duration::ZERO, 1);
        assert!(!p.enabled());
        let t0 = Instant::now();
        let t = lone_client(&mut p, t0, us(10), 10);
        assert!(!p.poll(t));
    }

    #[test]
    fn always_polls_for_its_window_after_any_work() {
        let mut p = PollPolicy::new(us(50), Duration::ZERO, 1);
        let t0 = Instant::now();
        assert!(!p.poll(t0), "nothing done yet");
        for token in 1..=3 {
            p.ready(t0, Token(token));
        }
        p.arrived(t0, 3);
        p.finished(t0);
        assert!(p.poll(t0 + us(49)));
        assert!(!p.poll(t0 + us(50)));
    }

    #[test]
    fn a_lone_quick_client_is_polled_for_after_the_streak() {
        let mut p = PollPolicy::new(Duration::ZERO, us(200), 1);
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
        let mut p = PollPolicy::new(Duration::ZERO, us(200), 1);
        let t = lone_client(&mut p, Instant::now(), us(40), 5);
        assert!(p.poll(t));
        // Two sockets ready at once.
        p.ready(t + us(10), Token(7));
        p.ready(t + us(10), Token(8));
        p.arrived(t + us(10), 2);
        p.finished(t + us(20));
        assert!(!p.poll(t + us(21)));
        // Or sockets taking turns, one at a time, even when one comes back a few times
        // before the next takes its turn.
        let mut t = t + us(20);
        for i in 0..100 {
            t += us(10);
            p.ready(t, Token(7 + (i / 4) % 2));
            p.arrived(t, 1);
            p.finished(t);
            assert!(!p.poll(t), "turn {i}");
        }
        // Once the other has been quiet for LONE_QUIET, the one left is alone.
        let t = lone_client(&mut p, t, us(40), 60);
        assert!(p.poll(t));
    }

    #[test]
    fn a_client_slower_than_the_window_is_not_polled_for() {
        let mut p = PollPolicy::new(Duration::ZERO, us(200), 1);
        let t = lone_client(&mut p, Instant::now(), us(300), 20);
        assert!(!p.poll(t));
    }

    #[test]
    fn one_late_request_costs_one_window_and_then_the_streak_again() {
        let mut p = PollPolicy::new(Duration::ZERO, us(200), 1);
        let t = lone_client(&mut p, Instant::now(), us(40), 5);
        assert!(p.poll(t + us(100)));
        // The client pauses: the core polls its window out, sleeps, and the request comes late.
        let t = lone_client(&mut p, t, us(1000), 1);
        assert!(!p.poll(t), "late: sleep next time");
        let t = lone_client(&mut p, t, us(40), LONE_STREAK - 1);
        assert!(p.poll(t), "quick again for a streak");
    }

    /// Clients `0..n` taking turns, one request at a time, `gap` apart, `rounds` times each.
    fn clients_taking_turns(p: &mut PollPolicy, start: Instant, n: usize, gap: Duration, rounds: usize) -> Instant {
        let mut t = start;
        for i in 0..n * rounds {
            t += gap;
            p.ready(t, Token(i % n));
            p.arrived(t, 1);
            t += us(5);
            p.finished(t);
        }
        t
    }

    #[test]
    fn up_to_few_clients_are_polled_for_and_more_are_left_to_gather() {
        let t0 = Instant::now();
        let mut few = PollPolicy::new(Duration::ZERO, us(200), 4);
        let t = clients_taking_turns(&mut few, t0, 4, us(20), 50);
        assert!(few.poll(t), "four clients, at most four");
        let t = clients_taking_turns(&mut few, t, 5, us(20), 50);
        assert!(!few.poll(t), "a fifth: they gather while the core sleeps");
        let t = clients_taking_turns(&mut few, t + LONE_QUIET, 3, us(20), 50);
        assert!(few.poll(t), "back to three for longer than LONE_QUIET");
        let mut lone = PollPolicy::new(Duration::ZERO, us(200), 1);
        let t = clients_taking_turns(&mut lone, t0, 2, us(20), 50);
        assert!(!lone.poll(t), "a lone client only");
    }
}
