//! A fleet's measurements and their wire form: per site, each operation's response times
//! (kept one by one while few, in a small histogram past that) and errors by kind, and the
//! first operations after the site was idle; per interval, all sites' response times together.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
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
}
