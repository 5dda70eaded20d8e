//! A workload file: the operations (names, response-time limits, minimum cycle times), the
//! Markov mix between them, the cycle-time distribution and the static-asset behaviour, read
//! from TOML so that other matrices (and, with their drivers, other applications) can be run.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::chain::Chain;
use crate::cycle::CycleTime;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Operation {
    pub name: String,
    /// The response-time limit its 90th (SLA-1) and 99th (SLA-2) percentiles must meet.
    pub max90_s: f64,
    /// A floor under the cycle time before this operation (e.g. filling in a form).
    #[serde(default)]
    pub min_cycle_ms: f64,
    /// For the generic `http` driver: the requests the operation makes, in order, as
    /// "METHOD /path" (each must answer below 400). Built-in drivers ignore it.
    #[serde(default)]
    pub requests: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CycleSpec {
    mean_ms: f64,
    #[serde(default = "default_max_factor")]
    max_factor: f64,
    /// How far the measured mean cycle time may stray from `mean_ms` (a fraction).
    #[serde(default = "default_tolerance")]
    tolerance: f64,
}

fn default_max_factor() -> f64 {
    5.0
}

fn default_tolerance() -> f64 {
    0.02
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    /// For people reading the file; the generator does not use it.
    #[serde(default, rename = "description")]
    _description: String,
    /// Which built-in driver performs the operations (e.g. "olio").
    driver: String,
    cycle: CycleSpec,
    /// The share of sessions that start with an empty browser cache.
    #[serde(default)]
    cold_cache_share: f64,
    /// How far (percentage points) each operation's share may stray from the mix's
    /// stationary distribution.
    #[serde(default = "default_mix_tolerance")]
    mix_tolerance_points: f64,
    #[serde(rename = "operation")]
    operations: Vec<Operation>,
    /// Rows: previous operation; columns: next; weights normalized per row.
    mix: Vec<Vec<f64>>,
}

fn default_mix_tolerance() -> f64 {
    2.0
}

/// A checked workload.
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub driver: String,
    pub operations: Vec<Operation>,
    pub chain: Chain,
    pub cycle: CycleTime,
    pub cycle_tolerance: f64,
    pub cold_cache_share: f64,
    pub mix_tolerance_points: f64,
}

impl Workload {
    pub fn load(path: &Path) -> Result<Workload> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the workload {}", path.display()))?;
        Workload::parse(&text).with_context(|| format!("in the workload {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Workload> {
        let f: File = toml::from_str(text)?;
        if f.operations.len() != f.mix.len() {
            bail!(
                "{} operations but a mix of {} rows: one row (and column) per operation, in the same order",
                f.operations.len(),
                f.mix.len()
            );
        }
        let mut names = std::collections::HashSet::new();
        for op in &f.operations {
            if op.name.is_empty() || !names.insert(op.name.as_str()) {
                bail!("operation names must be non-empty and distinct ({:?})", op.name);
            }
            if !(op.max90_s > 0.0 && op.max90_s.is_finite()) {
                bail!("operation {}: max90_s must be a positive number of seconds", op.name);
            }
            if !(op.min_cycle_ms >= 0.0 && op.min_cycle_ms.is_finite()) {
                bail!("operation {}: min_cycle_ms must be a non-negative number", op.name);
            }
        }
        if !(f.cycle.mean_ms >= 0.0 && f.cycle.mean_ms.is_finite() && f.cycle.max_factor >= 1.0) {
            bail!("cycle: mean_ms must be a non-negative number (0: no think time) and max_factor at least 1");
        }
        if !(0.0..=1.0).contains(&f.cold_cache_share) {
            bail!("cold_cache_share is a fraction between 0 and 1");
        }
        let chain = Chain::new(&f.mix)?;
        Ok(Workload {
            name: f.name,
            driver: f.driver,
            operations: f.operations,
            chain,
            cycle: CycleTime { mean_ms: f.cycle.mean_ms, max_factor: f.cycle.max_factor },
            cycle_tolerance: f.cycle.tolerance,
            cold_cache_share: f.cold_cache_share,
            mix_tolerance_points: f.mix_tolerance_points,
        })
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.operations.iter().position(|o| o.name == name)
    }

    /// The mean cycle time the mix should show: each operation's expected delay weighted by
    /// its long-run share.
    #[cfg(test)]
    pub fn expected_cycle_ms(&self) -> f64 {
        let pi = self.chain.stationary();
        self.operations.iter().zip(&pi).map(|(op, p)| p * self.cycle.expected_ms(op.min_cycle_ms)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLIO: &str = include_str!("../../../bench/workloads/olio.toml");

    #[test]
    fn olio_workload_parses_and_its_mix_is_as_published() {
        let w = Workload::parse(OLIO).unwrap();
        assert_eq!(w.operations.len(), 7);
        assert_eq!(w.operations[6].name, "AddEvent");
        assert_eq!(w.operations[6].min_cycle_ms, 3000.0);
        // Row HomePage: 0 11 52 36 0 1 0 of 100.
        assert!((w.chain.prob(0, 2) - 0.52).abs() < 1e-12);
        let pi = w.chain.stationary();
        assert!((pi.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        // EventDetail and HomePage dominate; AddPerson is rare.
        let expected = w.expected_cycle_ms();
        assert!((expected - 5000.0).abs() / 5000.0 < 0.02, "{expected}");
    }

    #[test]
    fn a_long_simulated_run_converges_to_the_stationary_mix() {
        use rand::{rngs::SmallRng, SeedableRng};
        let w = Workload::parse(OLIO).unwrap();
        let pi = w.chain.stationary();
        // 100 sessions of 5,000 operations each, every session starting at HomePage.
        let mut counts = vec![0u64; w.operations.len()];
        let mut rng = SmallRng::seed_from_u64(1);
        for _ in 0..100 {
            let mut op = 0;
            for _ in 0..5_000 {
                counts[op] += 1;
                op = w.chain.next(op, &mut rng);
            }
        }
        let total: u64 = counts.iter().sum();
        for (i, c) in counts.iter().enumerate() {
            let share = *c as f64 / total as f64;
            assert!((share - pi[i]).abs() < 0.005, "{}: {share} against {}", w.operations[i].name, pi[i]);
        }
    }

    #[test]
    fn mismatched_shapes_and_unknown_keys_are_refused() {
        let bad = OLIO.replace("[0, 0, 0, 100, 0, 0, 0]", "[0, 0, 0, 100, 0, 0]");
        assert!(format!("{:#}", Workload::parse(&bad).unwrap_err()).contains("has 6 weights"));
        let bad = OLIO.replace("max90_s = 4", "max90 = 4");
        assert!(format!("{:#}", Workload::parse(&bad).unwrap_err()).contains("unknown field"));
    }
}
