//! Cloudstone for a fleet, its pure half: each site's load profile drawn from the Azure
//! population ([`crate::azure`]), the fleet file the generator and the deployments read, and
//! the search for the most sites a deployment holds.
//!
//! A site is one Olio application with its own database and host name. Azure's figures are
//! invocations; a web site's invocation is one page request, and its requests come from
//! visitors' sessions. So, per site, with its own seeded stream (site `i` is the same site
//! in a fleet of 8 and of 800, so larger fleets only add sites):
//!
//! * `rate_per_day` and `trigger` are drawn as [`crate::azure::population`] draws an
//!   application (log-uniform rates in the bands of figure 5a; timer, Poisson or bursty
//!   arrivals in the shares of figures 3 and 7);
//! * sessions arrive as [`crate::azure::arrivals`] places invocations, at `rate_per_day /
//!   ops_per_session` (a session of `session_mean_s` seconds at Olio's 5 s mean cycle time
//!   performs `session_mean_s / 5` requests, so the site's request rate is the drawn rate);
//! * each session is one user for an exponentially distributed time (mean
//!   `session_mean_s`, 60 s by default: Faban's Olio sessions are open-ended, so this is our
//!   choice, documented in docs/cloudstone.md), cut at the end of the span;
//! * the site's profile is the number of its sessions under way, a step function of time.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use crate::azure::{self, Rng};

/// What a fleet is drawn from.
#[derive(Debug, Clone)]
pub struct FleetParams {
    pub sites: usize,
    /// Seconds of load.
    pub span_s: f64,
    pub seed: u64,
    /// Mean seconds a visitor's session lasts.
    pub session_mean_s: f64,
    /// Mean seconds between a user's requests (the workload's mean cycle time).
    pub cycle_s: f64,
    /// Accounts in each site's database.
    pub registered_users: u64,
    /// Site `i` is `site{i:04}.{domain}`.
    pub domain: String,
}

impl Default for FleetParams {
    fn default() -> FleetParams {
        FleetParams {
            sites: 8,
            span_s: 300.0,
            seed: 1,
            session_mean_s: 60.0,
            cycle_s: 5.0,
            registered_users: 100,
            domain: "fleet.test".into(),
        }
    }
}

/// The fleet file (`sprout load fleet --fleet`, `sprout olio fleet-up --fleet`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FleetFile {
    pub version: u32,
    pub seed: u64,
    pub span_s: f64,
    pub registered_users: u64,
    pub session_mean_s: f64,
    pub sites: Vec<SiteLoad>,
}

/// One site and its load.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SiteLoad {
    pub name: String,
    pub host: String,
    /// Its drawn mean requests per day.
    pub rate_per_day: f64,
    pub trigger: String,
    /// Sessions that start within the span.
    pub sessions: usize,
    pub peak_users: usize,
    /// Mean users over the span.
    pub mean_users: f64,
    /// (seconds, users from then on): first point at 0, times increasing.
    pub profile: Vec<(f64, usize)>,
}

/// The fleet of `params.sites` sites.
pub fn fleet(params: &FleetParams) -> FleetFile {
    FleetFile {
        version: 1,
        seed: params.seed,
        span_s: params.span_s,
        registered_users: params.registered_users,
        session_mean_s: params.session_mean_s,
        sites: (0..params.sites).map(|i| site(params, i)).collect(),
    }
}

/// Site `i`: drawn from its own stream, so it does not depend on the fleet's size.
pub fn site(params: &FleetParams, i: usize) -> SiteLoad {
    let mut rng = Rng::new(params.seed ^ (i as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F));
    let app = azure::population(1, &mut rng).remove(0);
    let ops_per_session = (params.session_mean_s / params.cycle_s).max(1.0);
    let sessions_app = azure::App { per_day: app.per_day / ops_per_session, trigger: app.trigger };
    let starts = azure::arrivals(&sessions_app, Duration::from_secs_f64(params.span_s), &mut rng);
    let sessions: Vec<(f64, f64)> = starts
        .iter()
        .map(|s| {
            let start = s.as_secs_f64();
            (start, (start + rng.exponential(params.session_mean_s)).min(params.span_s))
        })
        .collect();
    let profile = profile_of(&sessions);
    SiteLoad {
        name: format!("site{i:04}"),
        host: format!("site{i:04}.{}", params.domain),
        rate_per_day: app.per_day,
        trigger: app.trigger.as_str().into(),
        sessions: sessions.len(),
        peak_users: profile.iter().map(|p| p.1).max().unwrap_or(0),
        mean_users: sessions.iter().map(|(a, b)| b - a).sum::<f64>() / params.span_s.max(1e-9),
        profile,
    }
}

/// The number of sessions under way over time, from (start, end) pairs.
fn profile_of(sessions: &[(f64, f64)]) -> Vec<(f64, usize)> {
    let mut edges: Vec<(f64, i64)> = sessions.iter().flat_map(|&(a, b)| [(a, 1), (b, -1)]).collect();
    edges.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
    let mut points = vec![(0.0, 0usize)];
    let mut users = 0i64;
    for (t, d) in edges {
        users += d;
        let u = users.max(0) as usize;
        match points.last_mut() {
            Some(last) if last.0 == t => last.1 = u,
            _ => points.push((t, u)),
        }
    }
    // Drop steps that change nothing (a session ending as another starts).
    points.dedup_by(|next, prev| next.1 == prev.1);
    points
}

/// The search for the largest fleet a deployment holds: sizes double from `start` until one
/// fails, then the bracket is bisected until it is within `resolution` of its lower end or
/// `min_step` sites.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Bracket {
    pub start: usize,
    pub max: usize,
    pub resolution: f64,
    pub min_step: usize,
    /// The largest size that passed, and the smallest that failed.
    pub passed: Option<usize>,
    pub failed: Option<usize>,
}

impl Bracket {
    pub fn new(start: usize, max: usize, resolution: f64, min_step: usize) -> Bracket {
        Bracket { start: start.max(1), max: max.max(start.max(1)), resolution, min_step: min_step.max(1), passed: None, failed: None }
    }

    pub fn record(&mut self, sites: usize, passed: bool) {
        if passed {
            self.passed = Some(self.passed.map_or(sites, |p| p.max(sites)));
        } else {
            self.failed = Some(self.failed.map_or(sites, |f| f.min(sites)));
        }
    }

    /// The next size to run, or None when the answer is known.
    pub fn next(&self) -> Option<usize> {
        match (self.passed, self.failed) {
            (None, None) => Some(self.start),
            (Some(p), None) => (p < self.max).then(|| (p * 2).min(self.max)),
            (None, Some(f)) => (f > 1).then(|| (f / 2).max(1)).filter(|&n| n < f),
            (Some(p), Some(f)) => {
                let gap = f.saturating_sub(p);
                let close = gap <= self.min_step || (gap as f64) <= self.resolution * p as f64;
                (!close).then(|| p + gap / 2)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_do_not_depend_on_the_fleet_size() {
        let small = fleet(&FleetParams { sites: 8, ..Default::default() });
        let large = fleet(&FleetParams { sites: 64, ..Default::default() });
        assert_eq!(small.sites[..], large.sites[..8]);
        let other = fleet(&FleetParams { sites: 8, seed: 2, ..Default::default() });
        assert_ne!(small.sites, other.sites);
        assert_eq!(large.sites[63].host, "site0063.fleet.test");
    }

    #[test]
    fn most_sites_are_idle_and_the_busy_ones_carry_the_load() {
        let f = fleet(&FleetParams { sites: 2000, ..Default::default() });
        let idle = f.sites.iter().filter(|s| s.sessions == 0).count() as f64 / 2000.0;
        // 81% of applications are invoked at most once a minute: with 12-request sessions,
        // at most one session every 12 minutes, so most see none in 5 minutes.
        assert!(idle > 0.7 && idle < 0.95, "{idle}");
        let mean: f64 = f.sites.iter().map(|s| s.mean_users).sum::<f64>() / 2000.0;
        // Expected mean users: rate x 5 s / 86,400 s averaged over the bands, about 0.27.
        assert!(mean > 0.15 && mean < 0.45, "{mean}");
        for s in &f.sites {
            assert_eq!(s.profile[0].0, 0.0);
            assert!(s.profile.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 != w[1].1), "{:?}", s.profile);
            assert_eq!(s.peak_users, s.profile.iter().map(|p| p.1).max().unwrap());
            assert!(s.profile.last().unwrap().1 == 0 || s.profile.last().unwrap().0 < 300.0);
        }
    }

    #[test]
    fn a_profile_counts_the_sessions_under_way() {
        let p = profile_of(&[(10.0, 50.0), (20.0, 30.0), (50.0, 60.0)]);
        assert_eq!(p, vec![(0.0, 0), (10.0, 1), (20.0, 2), (30.0, 1), (60.0, 0)]);
        assert_eq!(profile_of(&[]), vec![(0.0, 0)]);
        assert_eq!(profile_of(&[(0.0, 5.0)]), vec![(0.0, 1), (5.0, 0)]);
    }

    #[test]
    fn the_search_doubles_then_bisects() {
        let mut b = Bracket::new(8, 1024, 0.1, 4);
        let holds = |n: usize| n <= 100;
        let mut runs = Vec::new();
        while let Some(n) = b.next() {
            runs.push(n);
            b.record(n, holds(n));
        }
        assert_eq!(&runs[..5], &[8, 16, 32, 64, 128]);
        assert!(b.passed.unwrap() <= 100 && b.passed.unwrap() >= 91, "{b:?} after {runs:?}");
        // Failing at the start halves; passing at the maximum stops.
        let mut b = Bracket::new(8, 8, 0.1, 1);
        b.record(8, true);
        assert_eq!(b.next(), None);
        let mut b = Bracket::new(8, 64, 0.1, 1);
        b.record(8, false);
        assert_eq!(b.next(), Some(4));
        b.record(4, false);
        b.record(2, false);
        b.record(1, false);
        assert_eq!(b.next(), None);
    }
}
