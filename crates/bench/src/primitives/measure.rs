//! The measuring loop of `sprout bench primitives`: an operation run on several threads to a
//! deadline, its rate the median of a few rounds; and how the rates are recorded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

/// Rounds a point is split into; its rate is their median, which shrugs off a burst of
/// other activity on the machine.
pub(super) const ROUNDS: usize = 3;

/// Run `op(thread, iteration)` in a loop on `threads` threads for `secs` seconds in all;
/// completed operations per second, the median of [`ROUNDS`] rounds (one when `secs` is
/// short). The first error (or panic) of any thread stops them all.
pub(super) fn rate<F>(threads: usize, secs: f64, op: F) -> Result<f64>
where
    F: Fn(usize, u64) -> Result<()> + Sync,
{
    let rounds = if secs >= 0.3 { ROUNDS } else { 1 };
    let mut rates = Vec::with_capacity(rounds);
    let mut base = 0u64;
    for _ in 0..rounds {
        let (r, n) = rate_round(threads, secs / rounds as f64, base, &op)?;
        base += n;
        rates.push(r);
    }
    rates.sort_by(f64::total_cmp);
    Ok(rates[rates.len() / 2])
}

/// One round of [`rate`]: (operations per second, operations done). Iteration numbers start
/// at `base` so they stay unique across rounds.
fn rate_round<F>(threads: usize, secs: f64, base: u64, op: &F) -> Result<(f64, u64)>
where
    F: Fn(usize, u64) -> Result<()> + Sync,
{
    let barrier = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let deadline = std::sync::OnceLock::<Instant>::new();
    let (start, outcomes) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, stop, done, deadline) = (&barrier, &stop, &done, &deadline);
                s.spawn(move || -> Result<()> {
                    barrier.wait();
                    let deadline = *deadline.wait();
                    let mut i = base;
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        if let Err(e) = op(t, i) {
                            stop.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        i += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        let start = Instant::now();
        let _ = deadline.set(start + Duration::from_secs_f64(secs));
        barrier.wait();
        let outcomes: Vec<Result<()>> =
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a measuring thread panicked")))).collect();
        (start, outcomes)
    });
    let elapsed = start.elapsed().as_secs_f64();
    for o in outcomes {
        o?;
    }
    let n = done.load(Ordering::Relaxed);
    Ok((n as f64 / elapsed, n))
}

/// /proc/loadavg's three load averages.
pub(super) fn loadavg() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().take(3).filter_map(|x| x.parse().ok()).collect()
}

pub(super) fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

pub(super) fn c_key(c: usize) -> String {
    format!("c{c}")
}
