//! The last hour of each lambda's invocations, minute by minute (invocations, errors, cold
//! starts, latency percentiles), for `/stats/history` and the console's charts. Pure: the
//! time is given. Only minutes with invocations are held, so idle lambdas cost nothing.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use serde_json::{json, Value};

/// Seconds a bucket covers.
pub const BUCKET_S: u64 = 60;
/// Buckets shown: the last hour and the current minute.
pub const BUCKETS: u64 = 61;

/// Latency classes: 0.1 ms times 1.25 to the class, 72 of them (up to about 9 minutes).
const CLASSES: usize = 72;
const FIRST_MS: f64 = 0.1;
const GROWTH: f64 = 1.25;

#[derive(Default)]
pub struct Timeline {
    lambdas: HashMap<String, VecDeque<Minute>>,
}

struct Minute {
    /// Unix time / 60.
    index: u64,
    invocations: u64,
    errors: u64,
    cold: u64,
    latency: [u32; CLASSES],
}

impl Minute {
    fn new(index: u64) -> Minute {
        Minute { index, invocations: 0, errors: 0, cold: 0, latency: [0; CLASSES] }
    }

    /// The latency below which `q` of the minute's invocations fell (its class's upper bound).
    fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total: u64 = self.latency.iter().map(|&n| u64::from(n)).sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (class, &n) in self.latency.iter().enumerate() {
            seen += u64::from(n);
            if seen >= rank {
                return Some(round3(upper_ms(class)));
            }
        }
        None
    }
}

fn class_of(latency: Duration) -> usize {
    let ms = latency.as_secs_f64() * 1000.0;
    if ms <= FIRST_MS {
        return 0;
    }
    ((ms / FIRST_MS).ln() / GROWTH.ln()).ceil().min((CLASSES - 1) as f64) as usize
}

fn upper_ms(class: usize) -> f64 {
    FIRST_MS * GROWTH.powi(class as i32)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

impl Timeline {
    /// An invocation of `lambda` that ended at `now_s` (Unix seconds) after `latency`.
    pub fn record(&mut self, lambda: &str, now_s: u64, cold: bool, error: bool, latency: Duration) {
        let index = now_s / BUCKET_S;
        let minutes = match self.lambdas.get_mut(lambda) {
            Some(m) => m,
            None => self.lambdas.entry(lambda.to_string()).or_default(),
        };
        if minutes.back().is_none_or(|m| m.index < index) {
            minutes.push_back(Minute::new(index));
        }
        while minutes.front().is_some_and(|m| m.index + BUCKETS <= index) {
            minutes.pop_front();
        }
        let minute = minutes.back_mut().expect("pushed above");
        minute.invocations += 1;
        minute.errors += u64::from(error);
        minute.cold += u64::from(cold);
        minute.latency[class_of(latency)] += 1;
    }

    /// The last hour at `now_s`, per lambda with invocations in it (the `/stats/history` JSON).
    pub fn snapshot(&mut self, now_s: u64) -> Value {
        let last = now_s / BUCKET_S;
        let first = last + 1 - BUCKETS;
        self.lambdas.retain(|_, minutes| {
            while minutes.front().is_some_and(|m| m.index < first) {
                minutes.pop_front();
            }
            !minutes.is_empty()
        });
        let mut lambdas = BTreeMap::new();
        for (name, minutes) in &self.lambdas {
            let n = BUCKETS as usize;
            let (mut invocations, mut errors, mut cold) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
            let (mut p50, mut p99) = (vec![None; n], vec![None; n]);
            for m in minutes.iter().filter(|m| m.index <= last) {
                let i = (m.index - first) as usize;
                invocations[i] = m.invocations;
                errors[i] = m.errors;
                cold[i] = m.cold;
                p50[i] = m.quantile_ms(0.5);
                p99[i] = m.quantile_ms(0.99);
            }
            lambdas.insert(
                name.clone(),
                json!({"invocations": invocations, "errors": errors, "cold_starts": cold, "p50_ms": p50, "p99_ms": p99}),
            );
        }
        json!({"bucket_s": BUCKET_S, "start": first * BUCKET_S, "buckets": BUCKETS, "lambdas": lambdas})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_800_000_000; // a minute's start (divisible by 60)

    #[test]
    fn invocations_fall_into_their_minute_and_the_hour_slides() {
        let mut t = Timeline::default();
        t.record("a", T0 + 5, true, false, Duration::from_millis(40));
        t.record("a", T0 + 59, false, true, Duration::from_millis(1));
        t.record("a", T0 + 60, false, false, Duration::from_millis(1));
        let s = t.snapshot(T0 + 61);
        assert_eq!(s["start"], T0 + 60 - 60 * 60);
        let a = &s["lambdas"]["a"];
        let n = BUCKETS as usize;
        assert_eq!(a["invocations"][n - 2], 2);
        assert_eq!(a["errors"][n - 2], 1);
        assert_eq!(a["cold_starts"][n - 2], 1);
        assert_eq!(a["invocations"][n - 1], 1);
        assert_eq!(a["invocations"][0], 0);
        assert!(a["p50_ms"][0].is_null());
        // An hour and a minute on, the first minute has gone; two hours on, the lambda too.
        let later = t.snapshot(T0 + 61 * 60);
        assert_eq!(later["lambdas"]["a"]["invocations"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum::<u64>(), 1);
        assert!(t.snapshot(T0 + 7200)["lambdas"].as_object().unwrap().is_empty());
    }

    #[test]
    fn percentiles_are_within_a_class_of_the_truth() {
        let mut t = Timeline::default();
        for ms in 1..=100 {
            t.record("p", T0, false, false, Duration::from_millis(ms));
        }
        let s = t.snapshot(T0);
        let n = BUCKETS as usize - 1;
        let p50 = s["lambdas"]["p"]["p50_ms"][n].as_f64().unwrap();
        let p99 = s["lambdas"]["p"]["p99_ms"][n].as_f64().unwrap();
        assert!((50.0..=62.5).contains(&p50), "{p50}");
        assert!((99.0..=124.0).contains(&p99), "{p99}");
        assert_eq!(class_of(Duration::ZERO), 0);
        assert_eq!(class_of(Duration::from_secs(100_000)), CLASSES - 1);
    }
}
