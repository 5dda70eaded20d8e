//! Sampling: the seeded random order the phases invoke their lambdas in, and the
//! percentiles and summary of the latencies they measure.

use serde_json::{json, Value};

pub use crate::report::percentile;

pub fn summary(samples: &[f64]) -> Value {
    let mean = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
    json!({
        "samples": samples.len(),
        "p50_ms": percentile(samples, 0.5),
        "p90_ms": percentile(samples, 0.9),
        "p99_ms": percentile(samples, 0.99),
        "mean_ms": mean,
    })
}

/// A seeded xorshift generator: the same lambdas in the same order on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}
