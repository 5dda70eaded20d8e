//! How long a lambda's idle sandboxes are kept, and when one is started ahead of the next
//! request: the hybrid histogram policy of "Serverless in the Wild" (Shahrad et al., USENIX
//! ATC '20, section 4), a pure state machine fed the lambda's idle times.
//!
//! Each lambda keeps a histogram of its idle times (from the end of one invocation to the
//! start of the next) in bins of `bin` (the paper: 1 minute) over `range` (4 hours). Once it
//! holds enough idle times and is not flat (its bin counts' coefficient of variation at least
//! `min_cv`), it is read as the paper reads it:
//!
//! - **pre-warm window**: the head of the distribution (the 5th percentile) less a 10%
//!   margin: after an invocation the sandbox may go, and a new one is started this long
//!   after, just before the next invocation is likely;
//! - **keep-alive window**: the tail (the 99th percentile) plus a 10% margin, less the
//!   pre-warm window: how long the (pre-warmed or kept) sandbox then stays.
//!
//! While the histogram is young or flat, or when most idle times fall beyond its range, the
//! policy falls back to a fixed keep-alive window (no pre-warming), as the paper's hybrid
//! policy does (it would use a time-series forecast for the out-of-range case; Sprout keeps
//! the fixed window there). [`Tracker`] collects the idle times of every lambda as the
//! instance manager starts and ends invocations; the instance manager carries the windows
//! out: with a pre-warm window, the sandbox that served an invocation goes at once and a new
//! one is started that long after, unless the lambda was invoked meanwhile
//! ([`Tracker::prewarm_after`], [`Tracker::invocations`]); an idle sandbox (kept, or
//! pre-warmed) stays for the keep-alive window ([`Tracker::keep_for`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The policy's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Width of a histogram bin.
    pub bin: Duration,
    /// The idle times the histogram covers; longer ones are out of bounds.
    pub range: Duration,
    /// Percentile of the idle times that sets the pre-warm window (the head).
    pub head_percentile: f64,
    /// Percentile that sets the end of the keep-alive window (the tail).
    pub tail_percentile: f64,
    /// Margin taken off the head and added to the tail.
    pub margin: f64,
    /// Idle times before the histogram is trusted.
    pub min_samples: u32,
    /// Coefficient of variation of the bin counts below which the histogram is too flat to say
    /// anything.
    pub min_cv: f64,
    /// Share of idle times beyond the range above which the histogram is not representative.
    pub max_out_of_bounds: f64,
    /// The window used while the histogram is not trusted (providers use 10-20 minutes).
    pub fixed_keep_alive: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            bin: Duration::from_secs(60),
            range: Duration::from_secs(4 * 3600),
            head_percentile: 5.0,
            tail_percentile: 99.0,
            margin: 0.10,
            min_samples: 10,
            min_cv: 2.0,
            max_out_of_bounds: 0.5,
            fixed_keep_alive: Duration::from_secs(600),
        }
    }
}

/// Why the windows are what they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// Read from the histogram.
    Histogram,
    /// The fixed window: too few idle times yet.
    Young,
    /// The fixed window: the idle times are spread evenly, so no window fits better.
    Flat,
    /// The fixed window: most idle times are longer than the histogram's range.
    OutOfBounds,
}

impl Basis {
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Histogram => "histogram",
            Basis::Young => "young",
            Basis::Flat => "flat",
            Basis::OutOfBounds => "out_of_bounds",
        }
    }
}

/// What to do with a lambda's sandbox after an invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// Start a sandbox this long after the invocation ends (zero: keep the one that served it).
    pub prewarm: Duration,
    /// Keep it this long after that.
    pub keep_alive: Duration,
    pub basis: Basis,
}

/// One lambda's idle times.
#[derive(Debug, Clone)]
pub struct IdleHistogram {
    bins: Vec<u32>,
    in_bounds: u32,
    out_of_bounds: u32,
}

impl IdleHistogram {
    pub fn new(policy: &Policy) -> IdleHistogram {
        let n = (policy.range.as_nanos() / policy.bin.as_nanos().max(1)).max(1) as usize;
        IdleHistogram { bins: vec![0; n], in_bounds: 0, out_of_bounds: 0 }
    }

    /// One idle time: from the end of an invocation to the start of the next.
    pub fn record(&mut self, idle: Duration, policy: &Policy) {
        let bin = (idle.as_nanos() / policy.bin.as_nanos().max(1)) as usize;
        match self.bins.get_mut(bin) {
            Some(count) => {
                *count = count.saturating_add(1);
                self.in_bounds = self.in_bounds.saturating_add(1);
            }
            None => self.out_of_bounds = self.out_of_bounds.saturating_add(1),
        }
    }

    pub fn samples(&self) -> u32 {
        self.in_bounds + self.out_of_bounds
    }

    /// The windows the histogram gives, or the fixed one when it cannot be trusted.
    pub fn windows(&self, policy: &Policy) -> Windows {
        let fixed = |basis| Windows { prewarm: Duration::ZERO, keep_alive: policy.fixed_keep_alive, basis };
        if self.samples() < policy.min_samples {
            return fixed(Basis::Young);
        }
        if f64::from(self.out_of_bounds) > policy.max_out_of_bounds * f64::from(self.samples()) {
            return fixed(Basis::OutOfBounds);
        }
        if self.coefficient_of_variation() < policy.min_cv {
            return fixed(Basis::Flat);
        }
        // A percentile's bin, as the start (head) or end (tail) of its bin.
        let head_bin = self.percentile_bin(policy.head_percentile);
        let tail_bin = self.percentile_bin(policy.tail_percentile);
        let head = policy.bin.mul_f64(head_bin as f64 * (1.0 - policy.margin));
        let tail = policy.bin.mul_f64((tail_bin + 1) as f64 * (1.0 + policy.margin));
        // Whole bins, as the paper uses them (a window is a number of minutes).
        let prewarm = floor_to(head, policy.bin);
        let keep_alive = ceil_to(tail.saturating_sub(prewarm), policy.bin).max(policy.bin);
        Windows { prewarm, keep_alive, basis: Basis::Histogram }
    }

    /// The bin holding the `p`th percentile of the in-bounds idle times.
    fn percentile_bin(&self, p: f64) -> usize {
        let target = (p / 100.0 * f64::from(self.in_bounds)).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (i, &count) in self.bins.iter().enumerate() {
            seen += u64::from(count);
            if seen >= target {
                return i;
            }
        }
        self.bins.len() - 1
    }

    /// Standard deviation over mean of the bin counts: high for concentrated idle times.
    fn coefficient_of_variation(&self) -> f64 {
        let n = self.bins.len() as f64;
        let mean = f64::from(self.in_bounds) / n;
        if mean == 0.0 {
            return 0.0;
        }
        let variance = self.bins.iter().map(|&c| (f64::from(c) - mean).powi(2)).sum::<f64>() / n;
        variance.sqrt() / mean
    }
}

/// Every lambda's idle times, fed by the instance manager as its invocations start and end: an
/// idle time runs from the moment none of the lambda's invocations was running to the start
/// of the next (overlapping invocations make none).
#[derive(Debug)]
pub struct Tracker {
    policy: Policy,
    lambdas: HashMap<String, Activity>,
}

#[derive(Debug)]
struct Activity {
    histogram: IdleHistogram,
    running: u32,
    idle_since: Option<Instant>,
    /// Invocations started, ever.
    invocations: u64,
}

impl Tracker {
    pub fn new(policy: Policy) -> Tracker {
        Tracker { policy, lambdas: HashMap::new() }
    }

    /// An invocation of `name` starts at `now`.
    pub fn started(&mut self, name: &str, now: Instant) {
        let policy = &self.policy;
        if !self.lambdas.contains_key(name) {
            let first = Activity { histogram: IdleHistogram::new(policy), running: 0, idle_since: None, invocations: 0 };
            self.lambdas.insert(name.to_string(), first);
        }
        let a = self.lambdas.get_mut(name).expect("inserted above");
        if a.running == 0 {
            if let Some(since) = a.idle_since.take() {
                a.histogram.record(now.saturating_duration_since(since), policy);
            }
        }
        a.running += 1;
        a.invocations += 1;
    }

    /// An invocation of `name` ends at `now`.
    pub fn ended(&mut self, name: &str, now: Instant) {
        if let Some(a) = self.lambdas.get_mut(name) {
            a.running = a.running.saturating_sub(1);
            if a.running == 0 {
                a.idle_since = Some(now);
            }
        }
    }

    /// `name`'s windows (the fixed one for a lambda never seen).
    pub fn windows(&self, name: &str) -> Windows {
        match self.lambdas.get(name) {
            Some(a) => a.histogram.windows(&self.policy),
            None => Windows { prewarm: Duration::ZERO, keep_alive: self.policy.fixed_keep_alive, basis: Basis::Young },
        }
    }

    /// How long an idle sandbox of `name` is kept: the keep-alive window, counted from the
    /// end of the invocation that used it or from its pre-warming.
    pub fn keep_for(&self, name: &str) -> Duration {
        self.windows(name).keep_alive
    }

    /// After an invocation of `name`: `Some(pre-warm window)` when its sandbox should go now
    /// and a new one start that long after; None when the sandbox is simply kept.
    pub fn prewarm_after(&self, name: &str) -> Option<Duration> {
        Some(self.windows(name).prewarm).filter(|d| !d.is_zero())
    }

    /// Invocations of `name` started so far, and whether one is running: a pre-warm is due
    /// only if neither changed since it was scheduled.
    pub fn invocations(&self, name: &str) -> (u64, bool) {
        self.lambdas.get(name).map_or((0, false), |a| (a.invocations, a.running > 0))
    }

    /// The idle times `name` has recorded.
    pub fn samples(&self, name: &str) -> u32 {
        self.lambdas.get(name).map_or(0, |a| a.histogram.samples())
    }
}

fn floor_to(d: Duration, unit: Duration) -> Duration {
    unit * (d.as_nanos() / unit.as_nanos().max(1)) as u32
}

fn ceil_to(d: Duration, unit: Duration) -> Duration {
    unit * d.as_nanos().div_ceil(unit.as_nanos().max(1)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minutes(m: u64) -> Duration {
        Duration::from_secs(m * 60)
    }

    fn history(idle: impl IntoIterator<Item = Duration>) -> (IdleHistogram, Policy) {
        let policy = Policy::default();
        let mut h = IdleHistogram::new(&policy);
        for d in idle {
            h.record(d, &policy);
        }
        (h, policy)
    }

    #[test]
    fn the_tracker_records_gaps_between_invocations_not_overlaps() {
        let policy = Policy { min_samples: 2, ..Policy::default() };
        let mut t = Tracker::new(policy);
        let t0 = Instant::now();
        let at = |m: u64| t0 + minutes(m);
        assert_eq!(t.windows("f").basis, Basis::Young);
        t.started("f", at(0));
        t.started("f", at(1)); // overlapping: no idle time
        t.ended("f", at(2));
        t.ended("f", at(3));
        assert_eq!(t.samples("f"), 0);
        t.started("f", at(33)); // idle 30 minutes
        t.ended("f", at(33));
        t.started("f", at(63)); // and again
        t.ended("f", at(63));
        assert_eq!(t.samples("f"), 2);
        let w = t.windows("f");
        assert_eq!((w.basis, w.prewarm, w.keep_alive), (Basis::Histogram, minutes(27), minutes(8)));
        assert_eq!(t.keep_for("f"), minutes(8), "from the end of an invocation, or from a pre-warm");
        assert_eq!(t.prewarm_after("f"), Some(minutes(27)), "so the sandbox goes, and a new one comes 27 minutes on");
        assert_eq!(t.invocations("f"), (4, false));
        assert_eq!((t.keep_for("never-seen"), t.prewarm_after("never-seen")), (minutes(10), None));
        t.ended("unknown", at(70)); // an end without a start is ignored
    }

    #[test]
    fn a_young_histogram_keeps_the_fixed_window() {
        let (h, policy) = history((0..9).map(|_| minutes(30)));
        assert_eq!(h.windows(&policy), Windows { prewarm: Duration::ZERO, keep_alive: minutes(10), basis: Basis::Young });
    }

    #[test]
    fn an_app_called_every_half_hour_is_prewarmed_just_before_and_kept_briefly() {
        // Idle times of 29-31 minutes: a timer-driven app.
        let (h, policy) = history((0..60).map(|i| minutes(29 + i % 3)));
        let w = h.windows(&policy);
        assert_eq!(w.basis, Basis::Histogram);
        // Head: bin 29 less 10% is 26.1 min, whole minutes: 26. Tail: the end of bin 31 (32 min)
        // plus 10% is 35.2 min; less the pre-warm, rounded up: 10 min.
        assert_eq!((w.prewarm, w.keep_alive), (minutes(26), minutes(10)));
        // Together they cover every idle time seen, and the sandbox is gone for 26 of 30 minutes.
        assert!(w.prewarm <= minutes(29) && w.prewarm + w.keep_alive >= minutes(32));
    }

    #[test]
    fn a_busy_app_is_kept_without_prewarming() {
        let (h, policy) = history((0..200).map(|i| Duration::from_secs(5 + i % 40)));
        let w = h.windows(&policy);
        assert_eq!((w.prewarm, w.basis), (Duration::ZERO, Basis::Histogram));
        assert_eq!(w.keep_alive, minutes(2)); // the 99th percentile, 44 s, falls in the first bin
    }

    #[test]
    fn idle_times_spread_over_the_whole_range_fall_back_to_the_fixed_window() {
        let (h, policy) = history((0..480).map(|i| minutes(i / 2)));
        assert_eq!(h.windows(&policy).basis, Basis::Flat);
    }

    #[test]
    fn mostly_longer_idle_times_than_the_range_fall_back_too() {
        let (h, policy) = history((0..20).map(|i| if i < 12 { minutes(300) } else { minutes(30) }));
        assert_eq!(h.windows(&policy).basis, Basis::OutOfBounds);
        assert_eq!(h.samples(), 20);
    }

    #[test]
    fn the_windows_follow_a_changed_pattern_as_idle_times_accumulate() {
        let policy = Policy { bin: Duration::from_secs(1), range: Duration::from_secs(120), min_samples: 5, ..Policy::default() };
        let mut h = IdleHistogram::new(&policy);
        for _ in 0..10 {
            h.record(Duration::from_secs(60), &policy);
        }
        assert_eq!(h.windows(&policy).prewarm, Duration::from_secs(54));
        for _ in 0..1000 {
            h.record(Duration::from_millis(300), &policy);
        }
        // The minute-long gaps are now under 1% of the idle times: past the 99th percentile.
        let w = h.windows(&policy);
        assert_eq!((w.prewarm, w.keep_alive), (Duration::ZERO, Duration::from_secs(2)));
    }
}
