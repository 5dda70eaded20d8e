//! Cycle times: the delay between the starts of a session's successive operations, drawn from
//! a negative exponential with the workload's mean, capped at `max_factor` × the mean (as
//! Faban truncates it), and raised to an operation's own minimum (a form takes time to fill).

use rand::Rng;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CycleTime {
    pub mean_ms: f64,
    /// The cap, in means (Olio: 5).
    pub max_factor: f64,
}

impl CycleTime {
    pub fn cap_ms(&self) -> f64 {
        self.mean_ms * self.max_factor
    }

    /// The delay before an operation whose minimum is `min_ms`.
    pub fn draw(&self, min_ms: f64, rng: &mut impl Rng) -> f64 {
        // 1 - u lies in (0, 1], so the logarithm is finite.
        let u: f64 = rng.random();
        let x = -self.mean_ms * (1.0 - u).ln();
        x.min(self.cap_ms()).max(min_ms)
    }

    /// The expected delay before an operation with minimum `min_ms`:
    /// E[max(min(X, c), m)] = m + μ (e^(-m/μ) - e^(-c/μ)) for X ~ Exp(μ), m < c.
    #[cfg(test)]
    pub fn expected_ms(&self, min_ms: f64) -> f64 {
        let (mu, c) = (self.mean_ms, self.cap_ms());
        if min_ms >= c {
            return min_ms;
        }
        min_ms + mu * ((-min_ms / mu).exp() - (-c / mu).exp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, SeedableRng};

    const OLIO: CycleTime = CycleTime { mean_ms: 5000.0, max_factor: 5.0 };

    fn sample_mean(min_ms: f64, n: usize) -> (f64, f64, f64) {
        let mut rng = SmallRng::seed_from_u64(42);
        let draws: Vec<f64> = (0..n).map(|_| OLIO.draw(min_ms, &mut rng)).collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let lo = draws.iter().cloned().fold(f64::MAX, f64::min);
        let hi = draws.iter().cloned().fold(0.0, f64::max);
        (mean, lo, hi)
    }

    #[test]
    fn capped_mean_matches_the_formula() {
        // Capping at 5 means loses e^-5 of the mean: 4966.3 ms.
        let expected = OLIO.expected_ms(0.0);
        assert!((expected - 5000.0 * (1.0 - (-5f64).exp())).abs() < 1e-9);
        let (mean, lo, hi) = sample_mean(0.0, 400_000);
        assert!((mean - expected).abs() / expected < 0.005, "{mean} vs {expected}");
        assert!(lo >= 0.0 && hi <= 25_000.0);
    }

    #[test]
    fn minimums_raise_short_draws() {
        let expected = OLIO.expected_ms(3000.0);
        let (mean, lo, _) = sample_mean(3000.0, 400_000);
        assert_eq!(lo, 3000.0);
        assert!((mean - expected).abs() / expected < 0.005, "{mean} vs {expected}");
        assert_eq!(OLIO.expected_ms(30_000.0), 30_000.0);
    }
}
