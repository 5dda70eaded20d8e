//! The park phase of `sprout bench sandboxes` for gVisor: a worker that parks a pod soon
//! after its sandboxes are paused (`[gvisor] park_after_ms = 500`); the no-op lambda's pod is
//! left to be parked, and its next request, which restores it, is timed, again and again.
//! The worker's own figures (how long each park and restore took) come from its `/stats`.
//! Restores with the memory loaded in the background (`background_restore`, the default)
//! and before the restore returns are measured in alternating rounds, a worker each.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::http::Client;
use crate::report::median;
use crate::sandbox_worker::{Options, Worker};

/// Rounds per way of restoring, alternating, and parks timed in each.
const ROUNDS: usize = 3;
const PARKS: usize = 8;

/// The worker's parking counters: parks, their total milliseconds, restores, theirs, and the
/// bytes of the images parked now.
fn counters(worker: &Worker) -> Result<(u64, f64, u64, f64, u64)> {
    let stats = worker.stats()?;
    let p = &stats["backends"]["gvisor"]["counters"]["parking"];
    let (parks, restores) = (p["parks"].as_u64().unwrap_or(0), p["restores"].as_u64().unwrap_or(0));
    let total = |mean: &str, n: u64| p[mean].as_f64().unwrap_or(0.0) * n as f64;
    Ok((parks, total("park_ms_mean", parks), restores, total("restore_ms_mean", restores), p["parked_bytes"].as_u64().unwrap_or(0)))
}

/// Every park's, restore's and first request's milliseconds, and each parked image's MiB.
#[derive(Default)]
struct Samples {
    park_ms: Vec<f64>,
    restore_ms: Vec<f64>,
    first_request_ms: Vec<f64>,
    image_mib: Vec<f64>,
}

/// The park phase's figures: each park's and restore's milliseconds (the worker's), and the
/// first request after a park as the client saw it, with either way of restoring.
pub(crate) async fn measure(opts: &Options, port: u16) -> Result<Value> {
    let variants = ["gvisor-park", "gvisor-park-fg"];
    let mut samples: [Samples; 2] = Default::default();
    let mut parked_mib = None;
    for round in 0..ROUNDS {
        for (i, variant) in variants.iter().enumerate() {
            let worker = Worker::start(opts, variant, true, port)?;
            let result = async {
                if round == 0 && i == 0 {
                    parked_mib = Some(weigh(opts, &worker).await?);
                }
                parks(&worker, &mut samples[i]).await
            }
            .await;
            worker.stop()?;
            result.with_context(|| format!("{variant}, round {round}"))?;
        }
    }
    let p50 = |v: &[f64]| median(v.to_vec()).unwrap_or(0.0);
    let p99 = |v: &[f64]| crate::packages::percentile(v, 0.99);
    let figures = |s: &Samples| {
        json!({
            "park_ms": p50(&s.park_ms),
            "restore_parked_p50_ms": p50(&s.first_request_ms),
            "restore_parked_p99_ms": p99(&s.first_request_ms),
            "restore_only_p50_ms": p50(&s.restore_ms),
            "parked_image_mib": p50(&s.image_mib),
            "first_request_ms_each": s.first_request_ms,
        })
    };
    for (variant, s) in variants.iter().zip(&samples) {
        eprintln!(
            "  {variant:>14} park p50 {:.1} ms; the next request (a restore) p50 {:.1} ms, p99 {:.1} ms; the restore alone p50 {:.1} ms",
            p50(&s.park_ms),
            p50(&s.first_request_ms),
            p99(&s.first_request_ms),
            p50(&s.restore_ms)
        );
    }
    let (background, foreground) = (&samples[0], &samples[1]);
    Ok(json!({
        "parked_pss_mib": parked_mib,
        "rounds": ROUNDS,
        "parks_per_round": PARKS,
        "park_ms": p50(&background.park_ms),
        "restore_parked_p50_ms": p50(&background.first_request_ms),
        "restore_parked_p99_ms": p99(&background.first_request_ms),
        "background_over_foreground_p50": p50(&background.first_request_ms) / p50(&foreground.first_request_ms),
        "background": figures(background),
        "foreground": figures(foreground),
    }))
}

/// What one more parked pod weighs, MiB PSS: the worker's processes (pods included) weighed
/// with the no-op lambda's pod parked, and again once a second lambda's pod has been started
/// and parked too (the one container created ahead to restore into is there both times).
async fn weigh(opts: &Options, worker: &Worker) -> Result<f64> {
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let mut client = Client::connect(worker.port).await?;
    let mut weights = Vec::new();
    for name in ["noop", "noop2"] {
        if name != "noop" {
            let dir = opts.work_dir.join("second-noop");
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("f.py"), "def f(event):\n    return None\n")?;
            worker.deploy(opts, &dir, name)?;
        }
        let start = counters(worker)?.0;
        client.post(&format!("/run/{name}"), b"null").await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while counters(worker)?.0 == start {
            if Instant::now() > deadline {
                bail!("{name}'s pod was not parked within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        weights.push(mib(crate::footprint::worker_pss(worker)));
    }
    Ok(weights[1] - weights[0])
}

/// Park `worker`'s no-op pod [`PARKS`] times, timing each park and the request after it.
async fn parks(worker: &Worker, into: &mut Samples) -> Result<()> {
    let mut client = Client::connect(worker.port).await?;
    client.post("/run/noop", b"null").await?;
    for park in 0..PARKS {
        let before = counters(worker)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let parked = loop {
            let now = counters(worker)?;
            if now.0 > before.0 {
                break now;
            }
            if Instant::now() > deadline {
                bail!("park {park}: the pod was not parked within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let answer = client.post("/run/noop", b"null").await?;
        if !answer.ok() || answer.start != "warm" {
            bail!("park {park}: the request after it was not a warm success ({}, {})", answer.status, answer.start);
        }
        let restored = counters(worker)?;
        if restored.2 != parked.2 + 1 {
            bail!("park {park}: the request after it restored {} pods", restored.2 - parked.2);
        }
        into.park_ms.push(parked.1 - before.1);
        into.restore_ms.push(restored.3 - parked.3);
        into.first_request_ms.push(answer.elapsed.as_secs_f64() * 1e3);
        into.image_mib.push(parked.4 as f64 / (1 << 20) as f64);
    }
    Ok(())
}
