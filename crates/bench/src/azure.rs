//! Synthetic applications drawn, with a seed, from the distributions Azure Functions
//! published ("Serverless in the Wild", Shahrad et al., USENIX ATC '20, section 3), for the
//! benchmarks that need a population of mostly idle applications.
//!
//! What is drawn, and from which published figure:
//!
//! * **rate**: an application's mean invocations per day, log-uniform within three bands
//!   that reproduce figure 5a's shares: 45% of applications are invoked at most once an hour
//!   (1-24 a day), a further 36% at most once a minute (24-1,440 a day), the remaining 19%
//!   more often (1,440-100,000 a day; the trace reaches 10^8, cut here to keep runs small).
//! * **trigger**: 29% of applications are timer-triggered (figure 3: timers are in 29% of
//!   applications), invoked every `1 / rate` with a jitter of 1%; the rest see requests.
//! * **arrivals** of request-triggered applications: figure 7 finds their inter-arrival
//!   times' coefficient of variation near 1 for a large share and well above 1 for many: half
//!   are Poisson (CV 1), half bursty — on/off, with bursts at 10x the mean rate separated by
//!   idle gaps that keep the mean (CV about 3).
//!
//! [`Rng`] is splitmix64: the same seed gives the same population and the same arrivals.

use std::time::Duration;

/// splitmix64: small, seedable, good enough for workload generation.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with mean `mean`.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.f64()).ln()
    }
}

/// How an application is invoked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// Every period, with a 1% jitter.
    Timer,
    /// Poisson arrivals.
    Poisson,
    /// Bursts at 10x the mean rate, separated by idle gaps that keep the mean.
    Bursty,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Timer => "timer",
            Trigger::Poisson => "poisson",
            Trigger::Bursty => "bursty",
        }
    }
}

/// One synthetic application.
#[derive(Debug, Clone)]
pub struct App {
    pub per_day: f64,
    pub trigger: Trigger,
}

/// `n` applications drawn with `rng`.
pub fn population(n: usize, rng: &mut Rng) -> Vec<App> {
    (0..n)
        .map(|_| {
            let band = rng.f64();
            let (lo, hi): (f64, f64) = if band < 0.45 {
                (1.0, 24.0)
            } else if band < 0.81 {
                (24.0, 1440.0)
            } else {
                (1440.0, 100_000.0)
            };
            let per_day = (lo.ln() + rng.f64() * (hi.ln() - lo.ln())).exp();
            let kind = rng.f64();
            let trigger = if kind < 0.29 {
                Trigger::Timer
            } else if kind < 0.645 {
                Trigger::Poisson
            } else {
                Trigger::Bursty
            };
            App { per_day, trigger }
        })
        .collect()
}

/// Invocation times of `app` within `span`, as offsets from its start.
pub fn arrivals(app: &App, span: Duration, rng: &mut Rng) -> Vec<Duration> {
    let mean_gap = 86_400.0 / app.per_day;
    let end = span.as_secs_f64();
    let mut out = Vec::new();
    match app.trigger {
        Trigger::Timer => {
            let mut t = rng.f64() * mean_gap;
            while t < end {
                out.push(t);
                t += mean_gap * (1.0 + (rng.f64() - 0.5) * 0.02);
            }
        }
        Trigger::Poisson => {
            let mut t = rng.exponential(mean_gap);
            while t < end {
                out.push(t);
                t += rng.exponential(mean_gap);
            }
        }
        Trigger::Bursty => {
            // Bursts of 10 on average at 10x the rate, then an idle gap making up the mean.
            let mut t = rng.exponential(mean_gap * 10.0);
            while t < end {
                let burst = 1 + rng.exponential(9.0) as usize;
                for _ in 0..burst {
                    if t >= end {
                        break;
                    }
                    out.push(t);
                    t += rng.exponential(mean_gap / 10.0);
                }
                t += rng.exponential(mean_gap * burst as f64 * 0.9);
            }
        }
    }
    out.into_iter().map(Duration::from_secs_f64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_population_has_the_published_shares() {
        let apps = population(20_000, &mut Rng::new(7));
        let share = |f: &dyn Fn(&App) -> bool| apps.iter().filter(|a| f(a)).count() as f64 / apps.len() as f64;
        let hourly = share(&|a| a.per_day <= 24.0);
        let minutely = share(&|a| a.per_day <= 1440.0);
        let timers = share(&|a| a.trigger == Trigger::Timer);
        assert!((hourly - 0.45).abs() < 0.02, "{hourly}");
        assert!((minutely - 0.81).abs() < 0.02, "{minutely}");
        assert!((timers - 0.29).abs() < 0.02, "{timers}");
    }

    #[test]
    fn arrivals_keep_the_mean_rate_and_timers_are_regular() {
        let mut rng = Rng::new(3);
        let week = Duration::from_secs(7 * 86_400);
        for trigger in [Trigger::Timer, Trigger::Poisson, Trigger::Bursty] {
            let app = App { per_day: 200.0, trigger };
            let n = arrivals(&app, week, &mut rng).len() as f64;
            assert!((n / 1400.0 - 1.0).abs() < 0.2, "{trigger:?}: {n} in a week");
        }
        let times = arrivals(&App { per_day: 24.0, trigger: Trigger::Timer }, week, &mut rng);
        let gaps: Vec<f64> = times.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        assert!(gaps.iter().all(|g| (g / 3600.0 - 1.0).abs() < 0.02));
    }
}
