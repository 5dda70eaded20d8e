//! `sprout bench keepalive`: the hybrid histogram policy ([`sprout_worker::KeepAliveTracker`], the
//! worker's own code) against a fixed 10-minute keep-alive, and against keeping every
//! application loaded as a conventional host does, over a week of a synthetic Azure
//! population ([`crate::azure`]). As the paper evaluates its policies (Serverless in the Wild,
//! section 5.2), this replays the arrivals through each policy rather than running sandboxes:
//! what is measured is the policy's choices — how many invocations find no loaded sandbox
//! (cold starts), and how long sandboxes sit loaded without running (wasted memory time).
//! The worker carrying a policy's choices out is tested against its fake back-end and a real
//! one (`instances::tests`, tests/worker/test_keep_alive.py).
//!
//! Invocations are instantaneous here, so an idle time is the gap between two arrivals. After
//! an invocation, with windows (pre-warm P, keep-alive K): P = 0 keeps the sandbox K; the next
//! arrival after gap g is warm if g <= K and wasted min(g, K). P > 0 unloads it and loads one
//! at P for K: warm if P <= g <= P + K, wasted min(g - P, K) when g >= P, else nothing.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{json, Value};
use sprout_worker::{KeepAlivePolicy as Policy, KeepAliveTracker as Tracker};

use crate::azure::{self, Rng};
use crate::report;

#[derive(Debug, Clone)]
pub struct Options {
    pub apps: usize,
    pub days: u64,
    pub seed: u64,
    pub out_dir: std::path::PathBuf,
}

/// One policy's outcome for one application.
#[derive(Debug, Default, Clone, Copy)]
struct Outcome {
    invocations: u64,
    cold: u64,
    wasted_s: f64,
}

/// The windows a policy gives after an invocation at `now`.
trait Windows {
    fn invoked(&mut self, now: Instant);
    fn windows(&self) -> (Duration, Duration);
}

struct Fixed(Duration);

impl Windows for Fixed {
    fn invoked(&mut self, _now: Instant) {}
    fn windows(&self) -> (Duration, Duration) {
        (Duration::ZERO, self.0)
    }
}

struct Hybrid(Tracker);

impl Windows for Hybrid {
    fn invoked(&mut self, now: Instant) {
        self.0.started("app", now);
        self.0.ended("app", now);
    }
    fn windows(&self) -> (Duration, Duration) {
        let w = self.0.windows("app");
        (w.prewarm, w.keep_alive)
    }
}

fn replay(times: &[Duration], policy: &mut dyn Windows, base: Instant) -> Outcome {
    let mut out = Outcome { invocations: times.len() as u64, ..Default::default() };
    let mut previous: Option<(Duration, Duration, Duration)> = None; // (time, prewarm, keep)
    for &t in times {
        match previous {
            None => out.cold += 1,
            Some((last, prewarm, keep)) => {
                let gap = t - last;
                let warm = gap >= prewarm && gap <= prewarm + keep;
                if !warm {
                    out.cold += 1;
                }
                if gap >= prewarm {
                    out.wasted_s += (gap - prewarm).min(keep).as_secs_f64();
                }
            }
        }
        policy.invoked(base + t);
        let (prewarm, keep) = policy.windows();
        previous = Some((t, prewarm, keep));
    }
    out
}

/// Percentile `q` (0-1) of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn summarize(outcomes: &[Outcome], span: Duration, always_on: bool) -> Value {
    let invocations: u64 = outcomes.iter().map(|o| o.invocations).sum();
    let cold: u64 = outcomes.iter().map(|o| o.cold).sum();
    let wasted: f64 = outcomes.iter().map(|o| o.wasted_s).sum();
    let mut per_app: Vec<f64> =
        outcomes.iter().filter(|o| o.invocations > 0).map(|o| 100.0 * o.cold as f64 / o.invocations as f64).collect();
    per_app.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let cdf: Vec<f64> = (0..=100).map(|i| quantile(&per_app, i as f64 / 100.0)).collect();
    json!({
        "invocations": invocations,
        "cold_starts": cold,
        "cold_share": cold as f64 / invocations.max(1) as f64,
        "app_cold_pct_p50": quantile(&per_app, 0.5),
        "app_cold_pct_p75": quantile(&per_app, 0.75),
        "app_cold_pct_p90": quantile(&per_app, 0.9),
        "wasted_sandbox_hours": wasted / 3600.0,
        "mean_loaded_sandboxes": if always_on { outcomes.len() as f64 } else { wasted / span.as_secs_f64() },
        "app_cold_pct_cdf": cdf,
    })
}

pub fn run(opts: &Options) -> Result<Value> {
    let span = Duration::from_secs(opts.days * 86_400);
    let mut rng = Rng::new(opts.seed);
    let apps = azure::population(opts.apps, &mut rng);
    let base = Instant::now();
    let (mut fixed, mut hybrid, mut on) = (Vec::new(), Vec::new(), Vec::new());
    let mut events = 0usize;
    let started = Instant::now();
    for (i, app) in apps.iter().enumerate() {
        let times = azure::arrivals(app, span, &mut rng);
        events += times.len();
        fixed.push(replay(&times, &mut Fixed(Duration::from_secs(600)), base));
        hybrid.push(replay(&times, &mut Hybrid(Tracker::new(Policy::default())), base));
        // Always loaded: one cold start, and loaded for the whole span.
        let n = times.len() as u64;
        on.push(Outcome { invocations: n, cold: u64::from(n > 0), wasted_s: if n > 0 { span.as_secs_f64() } else { 0.0 } });
        if (i + 1) % (opts.apps / 10).max(1) == 0 {
            eprintln!(
                "  {} of {} applications replayed ({events} invocations, {:.1} s)",
                i + 1,
                opts.apps,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let policies = json!({
        "fixed-10min": summarize(&fixed, span, false),
        "histogram": summarize(&hybrid, span, false),
        "always-on": summarize(&on, span, true),
    });
    let get = |p: &str, k: &str| policies[p][k].as_f64().unwrap_or(f64::NAN);
    let ratios = json!({
        "histogram_over_fixed_wasted": get("histogram", "wasted_sandbox_hours") / get("fixed-10min", "wasted_sandbox_hours"),
        "histogram_over_fixed_cold_starts": get("histogram", "cold_starts") / get("fixed-10min", "cold_starts"),
        "always_on_over_histogram_wasted": get("always-on", "wasted_sandbox_hours") / get("histogram", "wasted_sandbox_hours"),
    });
    let target = |name: &str, measured: f64, met: bool| json!({"target": name, "measured": measured, "met": met});
    let targets = vec![
        target(
            "histogram: 75th-percentile application's cold-start share <= fixed 10-minute keep-alive's",
            get("histogram", "app_cold_pct_p75"),
            get("histogram", "app_cold_pct_p75") <= get("fixed-10min", "app_cold_pct_p75"),
        ),
        target(
            "histogram: wasted memory time < fixed 10-minute keep-alive's",
            ratios["histogram_over_fixed_wasted"].as_f64().unwrap_or(f64::NAN),
            get("histogram", "wasted_sandbox_hours") < get("fixed-10min", "wasted_sandbox_hours"),
        ),
    ];
    let results = json!({
        "machine": report::machine(),
        "method": {
            "population": format!("{} synthetic applications (crates/bench/src/azure.rs: Azure's published rate and trigger shares), seed {}", opts.apps, opts.seed),
            "span": format!("{} days of arrivals per application", opts.days),
            "replay": "each arrival replayed through each policy: the worker's keepalive::Tracker (1-minute bins over 4 hours, 5th/99th percentiles, 10% margins, fixed 10 minutes while young, flat or out of bounds) against a fixed 10-minute window and against keeping every application loaded; invocations are instantaneous",
            "wasted": "time a loaded sandbox waits without running, summed over applications",
        },
        "apps": opts.apps,
        "days": opts.days,
        "seed": opts.seed,
        "invocations": events,
        "policies": policies,
        "ratios": ratios,
        "targets": targets,
    });
    report::write(&opts.out_dir, "keepalive", &results, &markdown(&results), "plot_keepalive.py")?;
    Ok(results)
}

fn markdown(r: &Value) -> String {
    let mut s = format!(
        "{} applications, {} days, {} invocations (seed {}); {}\n\n",
        r["apps"],
        r["days"],
        r["invocations"],
        r["seed"],
        r["method"]["replay"].as_str().unwrap_or("")
    );
    s += "| policy | cold starts | cold share | app cold % p50 / p75 / p90 | wasted sandbox-hours | mean loaded sandboxes |\n|---|---:|---:|---:|---:|---:|\n";
    for p in ["always-on", "fixed-10min", "histogram"] {
        let v = &r["policies"][p];
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        s += &format!(
            "| {p} | {} | {:.3} | {:.1} / {:.1} / {:.1} | {:.0} | {:.1} |\n",
            v["cold_starts"],
            f("cold_share"),
            f("app_cold_pct_p50"),
            f("app_cold_pct_p75"),
            f("app_cold_pct_p90"),
            f("wasted_sandbox_hours"),
            f("mean_loaded_sandboxes")
        );
    }
    s += &report::targets_table(&r["targets"], 3);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|s| Duration::from_secs(*s)).collect()
    }

    #[test]
    fn a_fixed_window_is_warm_within_it_and_wastes_what_it_keeps() {
        let o = replay(&secs(&[0, 300, 1500, 1600]), &mut Fixed(Duration::from_secs(600)), Instant::now());
        // 0 cold; 300 warm (waited 300); 1500 cold (kept 600, then gone); 1600 warm (100).
        assert_eq!((o.invocations, o.cold), (4, 2));
        assert_eq!(o.wasted_s, 1000.0);
    }

    #[test]
    fn a_prewarm_window_wastes_nothing_before_it_and_is_warm_only_within_its_band() {
        struct Band;
        impl Windows for Band {
            fn invoked(&mut self, _now: Instant) {}
            fn windows(&self) -> (Duration, Duration) {
                (Duration::from_secs(100), Duration::from_secs(50))
            }
        }
        let o = replay(&secs(&[0, 120, 170, 400]), &mut Band, Instant::now());
        // 120: within [100, 150] warm, wasted 20; 170: gap 50 < 100, cold, nothing wasted;
        // 400: gap 230 > 150, cold, wasted the whole 50.
        assert_eq!(o.cold, 3);
        assert_eq!(o.wasted_s, 70.0);
    }
}
