//! Load on a worker's `/run/...` over keep-alive HTTP connections, for the sandbox benchmarks:
//! closed loops, a paced open loop, and what a run measured ([`Point`]: the answers, and the
//! CPU each CPU of the machine was busy for meanwhile).

use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;

use crate::http::{Answer, Client};

/// Results of one closed-loop run.
pub(crate) struct Point {
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    /// Requests answered by a warm sandbox when a cold one was expected, or the reverse.
    pub(crate) wrong_start: u64,
    elapsed: Duration,
    latency: Histogram<u64>,
    /// Busy time of each CPU (by number) over the measured part, from /proc/stat.
    busy: Vec<Duration>,
}

impl Point {
    fn new() -> Point {
        Point {
            ok: 0,
            errors: 0,
            wrong_start: 0,
            elapsed: Duration::ZERO,
            latency: Histogram::new_with_bounds(1, 600_000_000, 3).unwrap(),
            busy: Vec::new(),
        }
    }

    /// Count one answered request; `expect` ("cold", "warm" or "" for either) is the start it
    /// should report.
    fn count(&mut self, answer: &Answer, expect: &str) {
        if !answer.ok() {
            self.errors += 1;
            return;
        }
        self.ok += 1;
        let _ = self.latency.record((answer.elapsed.as_micros() as u64).max(1));
        if !expect.is_empty() && answer.start != expect {
            self.wrong_start += 1;
        }
    }

    fn add(&mut self, other: Point) -> Result<()> {
        self.latency.add(other.latency)?;
        self.ok += other.ok;
        self.errors += other.errors;
        self.wrong_start += other.wrong_start;
        Ok(())
    }

    pub(crate) fn ms(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1000.0
    }

    pub(crate) fn per_s(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    /// Milliseconds of CPU per answered request: the busy time of `cpu` (every CPU when None)
    /// over the measured part, shared by the answers; None if /proc/stat could not say.
    pub(crate) fn cpu_ms_per_request(&self, cpu: Option<usize>) -> Option<f64> {
        let busy: Duration = match cpu {
            Some(cpu) => *self.busy.get(cpu)?,
            None if self.busy.is_empty() => return None,
            None => self.busy.iter().sum(),
        };
        (self.ok > 0).then(|| busy.as_secs_f64() * 1e3 / self.ok as f64)
    }
}

/// Each CPU's busy time so far (its busy jiffies, 10 ms each); empty if it cannot be read.
fn busy_per_cpu() -> Vec<Duration> {
    sprout_load::cpu_jiffies().iter().map(|(busy, _, _)| Duration::from_millis(busy * 10)).collect()
}

/// What each CPU was busy for between `before` and now.
fn busy_since(before: &[Duration]) -> Vec<Duration> {
    busy_per_cpu().iter().zip(before).map(|(now, then)| now.saturating_sub(*then)).collect()
}

/// `concurrency` clients, each sending requests back to back on its own keep-alive
/// connection, for `duration` after `warmup`; only requests started after the warm-up count.
pub(crate) async fn closed_loop(
    port: u16,
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
    expect: &'static str,
    path: &str,
) -> Result<Point> {
    let started = Instant::now();
    let measure_from = started + warmup;
    let stop_at = measure_from + duration;
    let busy_at_start = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from.into()).await;
        busy_per_cpu()
    });
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let path = path.to_string();
        tasks.push(tokio::spawn(async move {
            let mut point = Point::new();
            let mut client = Client::connect(port).await?;
            while Instant::now() < stop_at {
                let sent = Instant::now();
                let answer = client.post(&path, b"null").await?;
                if sent >= measure_from {
                    point.count(&answer, expect);
                }
            }
            anyhow::Ok(point)
        }));
    }
    let mut point = Point::new();
    for t in tasks {
        point.add(t.await??)?;
    }
    point.busy = busy_since(&busy_at_start.await?);
    point.elapsed = started.elapsed().saturating_sub(warmup);
    Ok(point)
}

/// One request every `1 / per_s` seconds on one keep-alive connection for `duration` after
/// `warmup`, each sent on schedule or, when the one before ran late, at once (so a slow
/// request delays only itself). Counts only requests started after the warm-up.
pub(crate) async fn paced(port: u16, per_s: f64, warmup: Duration, duration: Duration, expect: &'static str, path: &str) -> Result<Point> {
    let started = Instant::now();
    let measure_from = started + warmup;
    let stop_at = measure_from + duration;
    let interval = Duration::from_secs_f64(1.0 / per_s);
    let mut point = Point::new();
    let mut client = Client::connect(port).await?;
    let mut next = Instant::now();
    let mut busy_at_start = None;
    while next < stop_at {
        tokio::time::sleep_until(next.into()).await;
        let sent = Instant::now();
        if sent >= measure_from && busy_at_start.is_none() {
            busy_at_start = Some(busy_per_cpu());
        }
        let answer = client.post(path, b"null").await?;
        if sent >= measure_from {
            point.count(&answer, expect);
        }
        next = (next + interval).max(Instant::now());
    }
    point.busy = busy_at_start.map(|b| busy_since(&b)).unwrap_or_default();
    point.elapsed = started.elapsed().saturating_sub(warmup);
    Ok(point)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_per_request_is_the_cpus_busy_time_shared_by_the_answers() {
        let mut p = Point::new();
        p.ok = 100;
        p.busy = vec![Duration::from_millis(210), Duration::from_millis(1350)];
        assert_eq!(p.cpu_ms_per_request(Some(0)), Some(2.1));
        assert_eq!(p.cpu_ms_per_request(None), Some(15.6));
        assert_eq!(p.cpu_ms_per_request(Some(5)), None);
        assert_eq!(Point::new().cpu_ms_per_request(None), None);
    }
}
