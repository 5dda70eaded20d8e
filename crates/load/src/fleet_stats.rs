//! A fleet's measurements and their wire form: per site, each operation's response times
//! (kept one by one while few, in a small histogram past that) and errors by kind, and the
//! first operations after the site was idle; per interval, all sites' response times together;
//! and the agents' results merged exactly into the fleet's.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::stats::{self, WireStats, MAX_US};

/// Significant digits of per-site and per-interval histograms (1%): a fleet keeps thousands.
pub const SIGFIG: u8 = 2;

/// A site's operation times kept one by one until this many, then folded into a histogram:
/// most sites of a mostly idle fleet see a few dozen operations in a run.
const FOLD_AT: usize = 4096;

/// The error kind of an operation still unanswered when the run ended (past every limit).
pub const UNFINISHED: &str = "unfinished at the end of the run";

/// An empty histogram of the precision fleets keep.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, SIGFIG).expect("valid bounds")
}

/// What an agent measured, in a form its controller merges exactly.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FleetAgentResult {
    pub agent: u32,
    /// Every site of the agent's share.
    pub sites: Vec<SiteResult>,
    /// Per interval from the start.
    pub series: Vec<WireInterval>,
    pub counters: BTreeMap<String, u64>,
    pub cycles: u64,
    pub cycle_ms_sum: f64,
    /// Times a site's supervisor woke (once per profile change of a busy site): what
    /// driving the idle sites cost.
    pub supervisor_wakeups: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SiteResult {
    pub index: usize,
    pub host: String,
    /// Sessions started.
    pub sessions: u64,
    /// Per operation of the workload, in its order; empty when the site saw none.
    pub ops: Vec<WireStats>,
    pub first_after_idle: Vec<FirstAfterIdle>,
}

/// An operation that was the first the site received after `idle_gap` without any (or its
/// very first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstAfterIdle {
    /// Seconds from the run's start to the operation's.
    pub t: f64,
    pub op: String,
    pub ms: f64,
    /// Answered within its operation's limit (max90_s).
    pub ok: bool,
}

/// One interval, over all of an agent's sites, as it crosses to the controller.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireInterval {
    /// Response times of the operations that started in it and succeeded, all operations
    /// together ([`stats::encode_histogram`]); None when there were none.
    pub hist: Option<String>,
    pub errors: u64,
    /// Sessions running, and sites with one or more, at the interval's end.
    pub active_users: usize,
    pub active_sites: usize,
}

/// Whether an operation starting at `now` is the first after idle: nothing of the site's is in
/// flight, and its last operation ended `gap` or longer ago (or it had none).
pub fn first_after_idle(in_flight: usize, last_end: Option<Instant>, now: Instant, gap: Duration) -> bool {
    in_flight == 0 && last_end.is_none_or(|end| now.saturating_duration_since(end) >= gap)
}

/// One site's response times to one operation, and its errors by kind.
#[derive(Default)]
pub(crate) struct SiteOp {
    few: Vec<u32>,
    many: Option<Box<Histogram<u64>>>,
    errors: BTreeMap<String, u64>,
}

impl SiteOp {
    pub(crate) fn record(&mut self, us: u64) {
        let us = us.clamp(1, MAX_US);
        match &mut self.many {
            Some(h) => h.saturating_record(us),
            None => {
                self.few.push(us as u32);
                if self.few.len() >= FOLD_AT {
                    self.many = Some(Box::new(self.histogram()));
                    self.few = Vec::new();
                }
            }
        }
    }

    pub(crate) fn error(&mut self, kind: &str) {
        *self.errors.entry(kind.to_string()).or_default() += 1;
    }

    fn histogram(&self) -> Histogram<u64> {
        let mut h = self.many.as_deref().cloned().unwrap_or_else(histogram);
        for &us in &self.few {
            h.saturating_record(us as u64);
        }
        h
    }

    pub(crate) fn to_wire(&self) -> Result<WireStats> {
        Ok(WireStats { hist: stats::encode_histogram(&self.histogram())?, errors: self.errors.clone() })
    }
}

/// One interval, over all of an agent's sites, as it is measured.
#[derive(Default)]
pub(crate) struct Interval {
    /// Allocated at the interval's first success.
    pub(crate) hist: Option<Box<Histogram<u64>>>,
    pub(crate) errors: u64,
    pub(crate) active_users: usize,
    pub(crate) active_sites: usize,
}

impl Interval {
    pub(crate) fn record(&mut self, us: u64) {
        self.hist.get_or_insert_with(|| Box::new(histogram())).saturating_record(us.clamp(1, MAX_US));
    }

    pub(crate) fn to_wire(&self) -> Result<WireInterval> {
        Ok(WireInterval {
            hist: self.hist.as_deref().map(stats::encode_histogram).transpose()?,
            errors: self.errors,
            active_users: self.active_users,
            active_sites: self.active_sites,
        })
    }
}

/// The agents' measurements, merged: each site from the one agent that drove it (in fleet
/// order), the series interval by interval.
#[derive(Debug, Clone, Default)]
pub struct MergedFleet {
    pub sites: Vec<SiteResult>,
    pub series: Vec<MergedInterval>,
    pub counters: BTreeMap<String, u64>,
    pub cycles: u64,
    pub cycle_ms_sum: f64,
    pub supervisor_wakeups: u64,
}

#[derive(Debug, Clone, Default)]
pub struct MergedInterval {
    pub hist: Option<Histogram<u64>>,
    pub errors: u64,
    pub active_users: usize,
    pub active_sites: usize,
}

/// Merge agents' results for a fleet of `sites_total` sites: each site must come from exactly
/// one agent; histograms add, so percentiles over all agents are exact.
pub fn merge(sites_total: usize, results: Vec<FleetAgentResult>) -> Result<MergedFleet> {
    let mut sites: Vec<Option<SiteResult>> = vec![None; sites_total];
    let mut merged = MergedFleet::default();
    for r in results {
        for site in r.sites {
            let i = site.index;
            let slot = sites.get_mut(i).with_context(|| format!("agent {} sent site {i}; the fleet has {sites_total}", r.agent))?;
            if slot.is_some() {
                bail!("site {i} ({}) came from two agents", site.host);
            }
            *slot = Some(site);
        }
        if merged.series.len() < r.series.len() {
            merged.series.resize_with(r.series.len(), MergedInterval::default);
        }
        for (k, w) in r.series.iter().enumerate() {
            let m = &mut merged.series[k];
            if let Some(text) = &w.hist {
                let h = stats::decode_histogram(text).with_context(|| format!("agent {}, interval {k}", r.agent))?;
                match &mut m.hist {
                    Some(sum) => sum.add(&h).map_err(|e| anyhow::anyhow!("adding agent {}'s interval {k}: {e:?}", r.agent))?,
                    None => m.hist = Some(h),
                }
            }
            m.errors += w.errors;
            m.active_users += w.active_users;
            m.active_sites += w.active_sites;
        }
        for (k, v) in r.counters {
            *merged.counters.entry(k).or_default() += v;
        }
        merged.cycles += r.cycles;
        merged.cycle_ms_sum += r.cycle_ms_sum;
        merged.supervisor_wakeups += r.supervisor_wakeups;
    }
    let missing: Vec<String> = sites.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(i, _)| i.to_string()).take(5).collect();
    if !missing.is_empty() {
        bail!("no agent sent site(s) {}", missing.join(", "));
    }
    merged.sites = sites.into_iter().flatten().collect();
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_operation_after_a_gap_is_after_idle() {
        let t = Instant::now();
        let gap = Duration::from_secs(60);
        assert!(first_after_idle(0, None, t, gap), "a site's very first operation");
        assert!(!first_after_idle(1, None, t, gap), "another operation is in flight");
        assert!(!first_after_idle(0, Some(t), t + Duration::from_secs(59), gap));
        assert!(first_after_idle(0, Some(t), t + Duration::from_secs(60), gap));
        assert!(!first_after_idle(2, Some(t), t + Duration::from_secs(600), gap), "busy, however long ago one ended");
    }

    #[test]
    fn many_times_fold_into_the_histogram_they_would_have_made() {
        let mut op = SiteOp::default();
        let mut direct = histogram();
        for i in 0..(FOLD_AT as u64 * 2 + 17) {
            let us = 1_000 + i * 37;
            op.record(us);
            direct.record(us).unwrap();
        }
        assert!(op.many.is_some() && op.few.len() < FOLD_AT);
        assert_eq!(op.histogram(), direct);
        op.error("timeout");
        let wire = op.to_wire().unwrap();
        assert_eq!(stats::decode_histogram(&wire.hist).unwrap(), direct);
        assert_eq!(wire.errors["timeout"], 1);
        // A few times stay as they are: a site that saw three operations costs 12 bytes.
        let mut few = SiteOp::default();
        few.record(5_000);
        assert!(few.many.is_none() && few.histogram().len() == 1);
    }

    fn interval(values: &[u64], errors: u64, users: usize, sites: usize) -> WireInterval {
        let mut h = histogram();
        for v in values {
            h.record(*v).unwrap();
        }
        let hist = (!values.is_empty()).then(|| stats::encode_histogram(&h).unwrap());
        WireInterval { hist, errors, active_users: users, active_sites: sites }
    }

    fn site(index: usize) -> SiteResult {
        SiteResult { index, host: format!("s{index}.test"), ..SiteResult::default() }
    }

    fn agent(agent: u32, sites: &[usize], series: Vec<WireInterval>) -> FleetAgentResult {
        FleetAgentResult {
            agent,
            sites: sites.iter().map(|&i| site(i)).collect(),
            series,
            counters: BTreeMap::from([("http_requests".to_string(), 10)]),
            cycles: 2,
            cycle_ms_sum: 9000.0,
            supervisor_wakeups: 3,
        }
    }

    #[test]
    fn agents_merge_site_by_site_and_interval_by_interval() {
        let a: Vec<u64> = (1..=500).map(|i| i * 1000).collect();
        let b: Vec<u64> = (1..=500).map(|i| 300_000 + i * 7).collect();
        let results = vec![
            agent(0, &[0, 2], vec![interval(&a, 1, 3, 2), interval(&[], 0, 1, 1)]),
            agent(1, &[1], vec![interval(&b, 2, 4, 1), interval(&[5000], 0, 0, 0)]),
        ];
        // Through JSON, as results cross from agents.
        let results: Vec<FleetAgentResult> = serde_json::from_str(&serde_json::to_string(&results).unwrap()).unwrap();
        let m = merge(3, results).unwrap();
        assert_eq!(m.sites.iter().map(|s| s.index).collect::<Vec<_>>(), vec![0, 1, 2]);
        let (first, second) = (&m.series[0], &m.series[1]);
        assert_eq!((first.errors, first.active_users, first.active_sites), (3, 7, 3));
        assert_eq!((second.active_users, second.active_sites, second.hist.as_ref().unwrap().len()), (1, 1, 1));
        // Histograms add: the merged percentiles are those of one recorder of both halves.
        let mut whole = histogram();
        for v in a.iter().chain(&b) {
            whole.record(*v).unwrap();
        }
        let merged = first.hist.as_ref().unwrap();
        for q in [0.5, 0.9, 0.99] {
            assert_eq!(merged.value_at_quantile(q), whole.value_at_quantile(q));
        }
        assert_eq!((m.counters["http_requests"], m.cycles, m.supervisor_wakeups), (20, 4, 6));
    }

    #[test]
    fn every_site_comes_from_exactly_one_agent() {
        let twice = merge(2, vec![agent(0, &[0, 1], vec![]), agent(1, &[1], vec![])]).unwrap_err();
        assert!(twice.to_string().contains("site 1 (s1.test) came from two agents"), "{twice}");
        let missing = merge(3, vec![agent(0, &[0], vec![]), agent(1, &[1], vec![])]).unwrap_err();
        assert!(missing.to_string().contains("no agent sent site(s) 2"), "{missing}");
        let stray = merge(1, vec![agent(0, &[4], vec![])]).unwrap_err();
        assert!(stray.to_string().contains("agent 0 sent site 4; the fleet has 1"), "{stray}");
    }
}
