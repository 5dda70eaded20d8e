//! A fleet file: many Olio sites served on one address and told apart by their Host header,
//! each with its own accounts and its own load profile over one span — read, checked (each
//! mistake named by its site and field), and dealt to agents.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::profile::Profile;

/// The fleet file format this reader understands.
pub const VERSION: u32 = 1;

/// Most users a profile point may ask of one site (a guard against a misplaced column).
const MAX_SITE_USERS: f64 = 1_000_000.0;

/// A checked fleet.
#[derive(Debug, Clone)]
pub struct Fleet {
    pub seed: u64,
    /// The run's length in seconds: one SLA window for every site.
    pub span_s: f64,
    /// Accounts each site's database was loaded with (user1..userN), unless a site says.
    pub registered_users: u64,
    pub sites: Vec<FleetSite>,
}

#[derive(Debug, Clone)]
pub struct FleetSite {
    pub name: String,
    /// The Host header its requests carry.
    pub host: String,
    pub registered_users: u64,
    /// Concurrent users over time, from the run's start.
    pub profile: Profile,
}

impl FleetSite {
    /// Whether the profile asks for any user before `span_s`.
    pub fn busy(&self, span_s: f64) -> bool {
        self.profile.points.iter().any(|&(t, u)| t < span_s && u > 0)
    }

    /// The profile's changes before `span_s`, from its first point with users: what the
    /// site's supervisor wakes for (an idle site has none, and costs nothing).
    pub fn steps(&self, span_s: f64) -> Vec<(f64, usize)> {
        let mut steps: Vec<(f64, usize)> = Vec::new();
        for &(t, u) in self.profile.points.iter().filter(|p| p.0 < span_s) {
            if steps.last().map_or(0, |s| s.1) != u {
                steps.push((t, u));
            }
        }
        steps
    }
}

/// The file as written; fields this reader does not use are accepted (the fleet's generator
/// records how it made each site).
#[derive(Deserialize)]
struct RawFleet {
    version: u32,
    #[serde(default = "default_seed")]
    seed: u64,
    span_s: f64,
    registered_users: u64,
    sites: Vec<serde_json::Value>,
}

fn default_seed() -> u64 {
    1
}

#[derive(Deserialize)]
struct RawSite {
    name: String,
    host: String,
    #[serde(default)]
    registered_users: Option<u64>,
    /// [seconds, users] points; users are read as numbers so that a fractional one is named.
    profile: Vec<(f64, f64)>,
}

impl Fleet {
    pub fn load(path: &Path) -> Result<Fleet> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the fleet file {}", path.display()))?;
        Fleet::parse(&text).with_context(|| format!("in the fleet file {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Fleet> {
        let raw: RawFleet = serde_json::from_str(text)?;
        if raw.version != VERSION {
            bail!("version {} is not one this reader knows (it reads version {VERSION})", raw.version);
        }
        if !(raw.span_s.is_finite() && raw.span_s > 0.0) {
            bail!("span_s must be a positive number of seconds, not {}", raw.span_s);
        }
        if raw.registered_users == 0 {
            bail!("registered_users must be at least 1 (the driver logs in as user1..userN)");
        }
        if raw.sites.is_empty() {
            bail!("the fleet has no sites");
        }
        let mut sites = Vec::with_capacity(raw.sites.len());
        // Lower-cased host -> the first site with it (Host headers are case-insensitive).
        let mut hosts: HashMap<String, usize> = HashMap::new();
        for (i, value) in raw.sites.into_iter().enumerate() {
            let label = match value.get("name").and_then(|n| n.as_str()) {
                Some(name) => format!("site {i} ({name})"),
                None => format!("site {i}"),
            };
            let site = parse_site(value, raw.registered_users).with_context(|| label.clone())?;
            if let Some(first) = hosts.insert(site.host.to_ascii_lowercase(), i) {
                bail!("{label}: host {:?} is site {first}'s too; each site needs its own", site.host);
            }
            sites.push(site);
        }
        Ok(Fleet { seed: raw.seed, span_s: raw.span_s, registered_users: raw.registered_users, sites })
    }

    /// The sites agent `agent` of `agents` drives, with their indexes: site i goes to agent
    /// i % agents.
    pub fn sites_of(&self, agent: u32, agents: u32) -> impl Iterator<Item = (usize, &FleetSite)> {
        self.sites.iter().enumerate().filter(move |(i, _)| agent_of(*i, agents) == agent)
    }

    /// Users over all sites at `t` seconds.
    #[cfg(test)]
    pub fn users_at(&self, t: f64) -> usize {
        self.sites.iter().map(|s| s.profile.users_at(t)).sum()
    }
}

/// The agent that drives site `site` of a fleet split over `agents`.
pub fn agent_of(site: usize, agents: u32) -> u32 {
    (site % agents.max(1) as usize) as u32
}

fn parse_site(value: serde_json::Value, registered_users: u64) -> Result<FleetSite> {
    let raw: RawSite = serde_json::from_value(value)?;
    if raw.name.trim().is_empty() {
        bail!("name: must not be empty");
    }
    let host_ok = !raw.host.is_empty() && raw.host.bytes().all(|b| b.is_ascii_graphic());
    if !host_ok {
        bail!("host: {:?} is not a host name (printable ASCII, no spaces)", raw.host);
    }
    let registered_users = raw.registered_users.unwrap_or(registered_users);
    if registered_users == 0 {
        bail!("registered_users: must be at least 1");
    }
    let mut points = Vec::with_capacity(raw.profile.len());
    for (p, &(t, u)) in raw.profile.iter().enumerate() {
        if !(u.is_finite() && u >= 0.0 && u.fract() == 0.0 && u <= MAX_SITE_USERS) {
            bail!("profile: point {p}: users must be a whole number from 0 to {MAX_SITE_USERS}, not {u}");
        }
        points.push((t, u as usize));
    }
    let profile = Profile::from_points(points).context("profile")?;
    Ok(FleetSite { name: raw.name, host: raw.host, registered_users, profile })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(sites: &str) -> String {
        format!(r#"{{"version": 1, "seed": 7, "span_s": 300.0, "registered_users": 100, "generator": "x", "sites": [{sites}]}}"#)
    }

    const SITE0: &str = r#"{"name": "site0000", "host": "site0000.fleet.test", "rate_per_day": 1234.5, "trigger": "bursty",
        "sessions": 3, "peak_users": 2, "mean_users": 0.31, "profile": [[0.0, 0], [41.2, 1], [97.0, 0]]}"#;

    fn error(text: &str) -> String {
        format!("{:#}", Fleet::parse(text).unwrap_err())
    }

    #[test]
    fn a_fleet_file_with_extra_fields_reads() {
        let f = Fleet::parse(&fleet(&format!(
            r#"{SITE0}, {{"name": "b", "host": "B.fleet.test", "registered_users": 5, "profile": [[0, 2], [10, 2], [400, 3]]}}"#
        )))
        .unwrap();
        assert_eq!((f.seed, f.span_s, f.sites.len()), (7, 300.0, 2));
        assert_eq!(f.sites[0].profile.points, vec![(0.0, 0), (41.2, 1), (97.0, 0)]);
        assert_eq!((f.sites[0].registered_users, f.sites[1].registered_users), (100, 5));
        assert_eq!(f.users_at(50.0), 3);
        // Steps skip the idle start and unchanged points, and end with the span.
        assert_eq!(f.sites[0].steps(300.0), vec![(41.2, 1), (97.0, 0)]);
        assert_eq!(f.sites[1].steps(300.0), vec![(0.0, 2)]);
        assert!(f.sites[0].busy(300.0) && !f.sites[0].busy(41.0));
    }

    #[test]
    fn mistakes_are_named_by_site_and_field() {
        let bad_profile = fleet(&format!(r#"{SITE0}, {{"name": "s1", "host": "s1.test", "profile": [[0, 1], [5, 2], [5, 0]]}}"#));
        assert!(error(&bad_profile).contains("site 1 (s1): profile: point 2: times must increase"), "{}", error(&bad_profile));
        let late_start = fleet(r#"{"name": "s0", "host": "s0.test", "profile": [[3, 1]]}"#);
        assert!(error(&late_start).contains("site 0 (s0): profile: point 0: the first point must be at 0"), "{}", error(&late_start));
        let half_user = fleet(r#"{"name": "s0", "host": "s0.test", "profile": [[0, 1.5]]}"#);
        assert!(error(&half_user).contains("site 0 (s0): profile: point 0: users must be a whole number"), "{}", error(&half_user));
        let no_points = fleet(r#"{"name": "s0", "host": "s0.test", "profile": []}"#);
        assert!(error(&no_points).contains("site 0 (s0): profile: no points"), "{}", error(&no_points));
        let duplicate = fleet(&format!(r#"{SITE0}, {{"name": "again", "host": "SITE0000.fleet.test", "profile": [[0, 0]]}}"#));
        assert!(error(&duplicate).contains("site 1 (again): host \"SITE0000.fleet.test\" is site 0's too"), "{}", error(&duplicate));
        let no_host = fleet(r#"{"name": "s0", "profile": [[0, 0]]}"#);
        assert!(error(&no_host).contains("site 0 (s0): missing field `host`"), "{}", error(&no_host));
        let spaced = fleet(r#"{"name": "s0", "host": "a b", "profile": [[0, 0]]}"#);
        assert!(error(&spaced).contains("site 0 (s0): host: \"a b\""), "{}", error(&spaced));
        assert!(error(&fleet("")).contains("the fleet has no sites"));
        assert!(error(&fleet(SITE0).replace("\"version\": 1", "\"version\": 2")).contains("version 2"));
        assert!(error(&fleet(SITE0).replace("300.0", "-1")).contains("span_s"));
        assert!(error(&fleet(SITE0).replace("\"registered_users\": 100", "\"registered_users\": 0")).contains("registered_users"));
    }

    #[test]
    fn sites_are_dealt_round_robin() {
        let sites: Vec<String> = (0..7).map(|i| format!(r#"{{"name": "s{i}", "host": "s{i}.test", "profile": [[0, 1]]}}"#)).collect();
        let f = Fleet::parse(&fleet(&sites.join(","))).unwrap();
        let dealt: Vec<Vec<usize>> = (0..3).map(|a| f.sites_of(a, 3).map(|(i, _)| i).collect()).collect();
        assert_eq!(dealt, vec![vec![0, 3, 6], vec![1, 4], vec![2, 5]]);
        assert_eq!(f.sites_of(0, 1).count(), 7);
        assert_eq!(agent_of(5, 3), 2);
    }
}
