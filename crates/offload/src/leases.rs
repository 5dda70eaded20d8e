//! User leases' bookkeeping as a pure table: their parts, lost parts and idle expiry ([`crate::lease_routes`] acts on it).
//!
//! A lease holds `parts` sandboxes of one lambda for a client-side object. Each part is a
//! `P` (the real one: a held sandbox behind a lock; tests: anything). A lease is idle while no
//! call runs on it; one idle (no call, no keepalive) longer than its timeout is expired. A
//! part whose sandbox died is marked lost and stays so: it is never replaced silently.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Most seconds a lease may idle before the worker releases it.
pub const MAX_IDLE_TIMEOUT_S: u64 = 3600;
/// The idle timeout of a lease that names none.
pub const DEFAULT_IDLE_TIMEOUT_S: u64 = 60;

/// One lease.
pub struct Lease<P> {
    pub id: String,
    pub lambda: String,
    pub idle_timeout: Duration,
    pub parts: Vec<P>,
    lost: Vec<bool>,
    /// When it was last called or kept alive (or a call under way ended).
    last_used: Instant,
    /// Calls under way: never idle while there is one.
    in_flight: usize,
}

impl<P> Lease<P> {
    fn idle_for(&self, now: Instant) -> Duration {
        if self.in_flight > 0 {
            Duration::ZERO
        } else {
            now.saturating_duration_since(self.last_used)
        }
    }

    /// Which parts are lost.
    pub fn lost(&self) -> Vec<usize> {
        self.lost.iter().enumerate().filter(|(_, lost)| **lost).map(|(i, _)| i).collect()
    }
}

/// What a lease looks like in `GET /leases`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    pub lease: String,
    pub lambda: String,
    pub parts: usize,
    pub idle_timeout_s: u64,
    pub idle_s: f64,
    pub lost_parts: Vec<usize>,
}

/// Why a call on a lease's part is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    NotFound,
    NoSuchPart { parts: usize },
    PartLost,
}

/// Every lease of a worker.
pub struct Leases<P> {
    leases: BTreeMap<String, Lease<P>>,
}

impl<P> Default for Leases<P> {
    fn default() -> Self {
        Leases { leases: BTreeMap::new() }
    }
}

impl<P: Clone> Leases<P> {
    /// Check a lease's request: `parts` from 1 to `max_parts`, a timeout from 1 s to an hour.
    pub fn check(parts: u64, idle_timeout_s: u64, max_parts: usize) -> Result<(usize, Duration), String> {
        if parts == 0 || parts > max_parts as u64 {
            return Err(format!("parts must be 1 to {max_parts} (instances.max_per_lambda), not {parts}"));
        }
        if !(1..=MAX_IDLE_TIMEOUT_S).contains(&idle_timeout_s) {
            return Err(format!("idle_timeout_s must be 1 to {MAX_IDLE_TIMEOUT_S}, not {idle_timeout_s}"));
        }
        Ok((parts as usize, Duration::from_secs(idle_timeout_s)))
    }

    /// Keep a new lease, idle from `now`.
    pub fn insert(&mut self, id: String, lambda: String, idle_timeout: Duration, parts: Vec<P>, now: Instant) {
        let lost = vec![false; parts.len()];
        self.leases.insert(id.clone(), Lease { id, lambda, idle_timeout, parts, lost, last_used: now, in_flight: 0 });
    }

    /// A call begins on part `part` of lease `id`: the part to run it on, the lease busy
    /// until [`Leases::end_call`].
    pub fn begin_call(&mut self, id: &str, part: usize) -> Result<P, Refused> {
        let lease = self.leases.get_mut(id).ok_or(Refused::NotFound)?;
        if part >= lease.parts.len() {
            return Err(Refused::NoSuchPart { parts: lease.parts.len() });
        }
        if lease.lost[part] {
            return Err(Refused::PartLost);
        }
        lease.in_flight += 1;
        Ok(lease.parts[part].clone())
    }

    /// A call on lease `id` ended (at `now`); `lost`: its part's sandbox is gone.
    pub fn end_call(&mut self, id: &str, part: usize, lost: bool, now: Instant) {
        if let Some(lease) = self.leases.get_mut(id) {
            lease.in_flight = lease.in_flight.saturating_sub(1);
            lease.last_used = now;
            if lost {
                if let Some(l) = lease.lost.get_mut(part) {
                    *l = true;
                }
            }
        }
    }

    /// Reset lease `id`'s idle clock; false when there is no such lease.
    pub fn keepalive(&mut self, id: &str, now: Instant) -> bool {
        self.touch(id, now).is_some()
    }

    /// Reset lease `id`'s idle clock (a use of its files), and lend its first part (what
    /// every part shares, such as the lease's directory); `None` when there is no such lease.
    pub fn touch(&mut self, id: &str, now: Instant) -> Option<P> {
        let lease = self.leases.get_mut(id)?;
        lease.last_used = now;
        lease.parts.first().cloned()
    }

    /// The first part of every lease whose lambda `keep` accepts (no use of them).
    pub fn first_parts(&self, keep: impl Fn(&str) -> bool) -> Vec<P>
    where
        P: Clone,
    {
        self.leases.values().filter(|l| keep(&l.lambda)).filter_map(|l| l.parts.first().cloned()).collect()
    }

    /// The lambda of lease `id`, if there is such a lease (no use of it: its clock is not reset).
    pub fn lambda_of(&self, id: &str) -> Option<&str> {
        self.leases.get(id).map(|lease| lease.lambda.as_str())
    }

    pub fn remove(&mut self, id: &str) -> Option<Lease<P>> {
        self.leases.remove(id)
    }

    /// Take out the leases idle past their timeout at `now`.
    pub fn expired(&mut self, now: Instant) -> Vec<Lease<P>> {
        self.take(|lease| lease.idle_for(now) > lease.idle_timeout)
    }

    /// Take out the leases of lambda `name` (deleted or replaced).
    pub fn of_lambda(&mut self, name: &str) -> Vec<Lease<P>> {
        self.take(|lease| lease.lambda == name)
    }

    /// Take out every lease (the worker is stopping).
    pub fn all(&mut self) -> Vec<Lease<P>> {
        self.take(|_| true)
    }

    fn take(&mut self, doomed: impl Fn(&Lease<P>) -> bool) -> Vec<Lease<P>> {
        let ids: Vec<String> = self.leases.values().filter(|l| doomed(l)).map(|l| l.id.clone()).collect();
        ids.iter().filter_map(|id| self.leases.remove(id)).collect()
    }

    /// Every lease, by id.
    pub fn list(&self, now: Instant) -> Vec<Summary> {
        self.leases
            .values()
            .map(|l| Summary {
                lease: l.id.clone(),
                lambda: l.lambda.clone(),
                parts: l.parts.len(),
                idle_timeout_s: l.idle_timeout.as_secs(),
                idle_s: (l.idle_for(now).as_secs_f64() * 1000.0).round() / 1000.0,
                lost_parts: l.lost(),
            })
            .collect()
    }

    /// How many leases there are, and their parts.
    pub fn figures(&self) -> (usize, usize) {
        (self.leases.len(), self.leases.values().map(|l| l.parts.len()).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// A table with lease "a" of lambda "f" (parts "a0", "a1", timeout 10 s) and "b" of "g"
    /// (one part, 60 s), made at `t0`.
    fn table(t0: Instant) -> Leases<&'static str> {
        let mut leases = Leases::default();
        leases.insert("a".into(), "f".into(), s(10), vec!["a0", "a1"], t0);
        leases.insert("b".into(), "g".into(), s(60), vec!["b0"], t0);
        leases
    }

    #[test]
    fn requests_are_checked_against_the_lambdas_bound_and_the_hour() {
        assert_eq!(Leases::<()>::check(3, 60, 4), Ok((3, s(60))));
        assert_eq!(Leases::<()>::check(4, 3600, 4), Ok((4, s(3600))));
        assert!(Leases::<()>::check(0, 60, 4).unwrap_err().contains("parts must be 1 to 4"));
        assert!(Leases::<()>::check(5, 60, 4).is_err());
        assert!(Leases::<()>::check(1, 0, 4).unwrap_err().contains("idle_timeout_s"));
        assert!(Leases::<()>::check(1, 3601, 4).is_err());
    }

    #[test]
    fn a_leases_lambda_is_found_without_using_the_lease() {
        let t0 = Instant::now();
        let mut leases = table(t0);
        assert_eq!((leases.lambda_of("a"), leases.lambda_of("b"), leases.lambda_of("c")), (Some("f"), Some("g"), None));
        // Looking does not reset the idle clock: "a" still expires after its 10 s.
        let expired: Vec<String> = leases.expired(t0 + s(11)).into_iter().map(|l| l.id).collect();
        assert_eq!(expired, ["a"]);
    }

    #[test]
    fn a_call_goes_to_its_part_and_unknown_ones_are_refused() {
        let t0 = Instant::now();
        let mut leases = table(t0);
        assert_eq!(leases.begin_call("a", 1), Ok("a1"));
        assert_eq!(leases.begin_call("a", 0), Ok("a0"));
        assert_eq!(leases.begin_call("a", 2), Err(Refused::NoSuchPart { parts: 2 }));
        assert_eq!(leases.begin_call("zz", 0), Err(Refused::NotFound));
    }

    #[test]
    fn a_lease_idle_past_its_timeout_expires_and_keepalives_or_calls_keep_it() {
        let t0 = Instant::now();
        let mut leases = table(t0);
        assert!(leases.expired(t0 + s(10)).is_empty(), "not past its timeout yet");
        assert!(leases.keepalive("a", t0 + s(9)));
        assert!(leases.expired(t0 + s(15)).is_empty(), "kept alive at 9 s");
        assert_eq!(leases.touch("a", t0 + s(14)), Some("a0"), "a use of its files lends its first part");
        assert!(leases.expired(t0 + s(19)).is_empty(), "and keeps it alive too");
        let gone = leases.expired(t0 + s(25));
        assert_eq!(gone.iter().map(|l| l.id.as_str()).collect::<Vec<_>>(), ["a"]);
        assert_eq!(gone[0].parts, ["a0", "a1"], "its parts, to let go");
        assert!(!leases.keepalive("a", t0 + s(25)), "gone");
        assert_eq!(leases.touch("a", t0 + s(25)), None);
        // A call under way is never idle, however long it runs; its end restarts the clock.
        assert_eq!(leases.begin_call("b", 0), Ok("b0"));
        assert!(leases.expired(t0 + s(500)).is_empty());
        assert_eq!(leases.list(t0 + s(500))[0].idle_s, 0.0);
        leases.end_call("b", 0, false, t0 + s(500));
        assert!(leases.expired(t0 + s(559)).is_empty());
        assert_eq!(leases.list(t0 + s(559))[0].idle_s, 59.0);
        assert_eq!(leases.expired(t0 + s(561)).len(), 1);
        assert_eq!(leases.figures(), (0, 0));
    }

    #[test]
    fn a_lost_part_stays_lost_and_the_others_still_answer() {
        let t0 = Instant::now();
        let mut leases = table(t0);
        leases.begin_call("a", 1).unwrap();
        leases.end_call("a", 1, true, t0 + s(1));
        assert_eq!(leases.begin_call("a", 1), Err(Refused::PartLost));
        assert_eq!(leases.begin_call("a", 0), Ok("a0"));
        assert_eq!(leases.list(t0)[0].lost_parts, [1]);
    }

    #[test]
    fn deleting_a_lambda_takes_its_leases_and_figures_count_parts() {
        let t0 = Instant::now();
        let mut leases = table(t0);
        assert_eq!(leases.figures(), (2, 3));
        let listed = leases.list(t0 + s(2));
        assert_eq!(
            listed.iter().map(|l| (l.lease.as_str(), l.lambda.as_str(), l.parts)).collect::<Vec<_>>(),
            [("a", "f", 2), ("b", "g", 1)]
        );
        assert_eq!(listed[0].idle_s, 2.0);
        assert_eq!(leases.of_lambda("f").len(), 1);
        assert!(leases.of_lambda("f").is_empty());
        assert_eq!(leases.figures(), (1, 1));
        assert!(leases.remove("b").is_some() && leases.remove("b").is_none());
        leases.insert("c".into(), "f".into(), s(1), vec!["c0"], t0);
        assert_eq!(leases.all().len(), 1);
        assert_eq!(leases.figures(), (0, 0));
    }
}
