//! SOCK figure 20: synthetic packages (bench/synthetic_packages.py: a universe of 100,000 with
//! Zipf popularity, s = 2.5, PyPI-like dependencies, imports that burn CPU and memory), all
//! pre-installed; 100 to 10,000 handlers each importing 1-3 of them, invoked uniformly at
//! random by 10 concurrent clients. Per point: the latency distribution and the share of
//! requests each cache served — the handler cache (a warm start), the import cache (forked
//! from a Zygote holding all the handler's packages) or the install cache (the handler
//! imported some of its packages itself, or waited for a new Zygote to import them).

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::phase::Bench;
use super::sample::{summary, Rng};
use crate::report;

const CLIENTS: usize = 10;

pub fn run(bench: &Bench) -> Result<Value> {
    let counts: Vec<usize> = if bench.opts.quick { vec![100, 500] } else { vec![100, 500, 1000, 10_000] };
    let cache = bench.opts.work_dir.join("synthetic-cache");
    let manifest_path = bench.opts.work_dir.join("synthetic-manifest.json");
    let handlers_arg = counts.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
    let generated = Command::new("python3")
        .arg(report::bench_dir().join("synthetic_packages.py"))
        .args(["--cache"])
        .arg(&cache)
        .args(["--out"])
        .arg(&manifest_path)
        .args(["--handlers", &handlers_arg, "--seed", &bench.opts.seed.to_string()])
        .output()
        .context("running bench/synthetic_packages.py")?;
    if !generated.status.success() {
        bail!("generating synthetic packages: {}", String::from_utf8_lossy(&generated.stderr));
    }
    let manifest: Value = serde_json::from_slice(&std::fs::read(&manifest_path)?)?;
    eprintln!("  {}", String::from_utf8_lossy(&generated.stdout).trim());
    // No index, and an empty wheel directory: every handler's set is pinned and installed, so
    // pip never runs (it would fail loudly if it did).
    let no_wheels = bench.opts.work_dir.join("no-wheels");
    std::fs::create_dir_all(&no_wheels)?;
    std::fs::set_permissions(&no_wheels, std::fs::Permissions::from_mode(0o755))?;
    let handlers = manifest["handlers"].as_array().cloned().unwrap_or_default();
    let mut out = serde_json::Map::new();
    out.insert(
        "generator".into(),
        json!({
            "universe": manifest["universe"], "zipf_s": manifest["zipf_s"], "seed": manifest["seed"],
            "materialized": manifest["materialized"], "distinct_import_sets": manifest["distinct_import_sets"],
            "mean_import_cpu_ms": manifest["mean_import_cpu_ms"], "mean_import_memory_mb": manifest["mean_import_memory_mb"],
        }),
    );
    for &n in &counts {
        let packages = format!("cache_dir = \"{}\"\noffline = true\nwheel_dir = \"{}\"\n", cache.display(), no_wheels.display());
        let config = bench.config_with_packages(super::phase::Caches::ALL, 1024, &packages);
        let worker = bench.start(&format!("scale-{n}"), &config)?;
        let result = measure(bench, &worker, &handlers[..n.min(handlers.len())]);
        worker.stop()?;
        let point = result?;
        eprintln!(
            "  {n:>6} handlers: p50 {:.1} ms p99 {:.1} ms; handler {:.0}% import {:.0}% install {:.0}%",
            point["p50_ms"].as_f64().unwrap_or(0.0),
            point["p99_ms"].as_f64().unwrap_or(0.0),
            point["share"]["handler"].as_f64().unwrap_or(0.0) * 100.0,
            point["share"]["import"].as_f64().unwrap_or(0.0) * 100.0,
            point["share"]["install"].as_f64().unwrap_or(0.0) * 100.0,
        );
        out.insert(n.to_string(), point);
    }
    Ok(Value::Object(out))
}

fn measure(bench: &Bench, worker: &crate::worker::BenchWorker, handlers: &[Value]) -> Result<Value> {
    // Upload every handler (two at a time: each upload's syntax check runs an interpreter).
    let next = Arc::new(Mutex::new(0usize));
    std::thread::scope(|scope| -> Result<()> {
        let mut jobs = Vec::new();
        for _ in 0..2 {
            let (client, next) = (worker.client(), next.clone());
            jobs.push(scope.spawn(move || -> Result<()> {
                loop {
                    let i = {
                        let mut n = next.lock().unwrap();
                        *n += 1;
                        *n - 1
                    };
                    let Some(h) = handlers.get(i) else {
                        return Ok(());
                    };
                    let imports: Vec<&str> = h["imports"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
                    let reqs: Vec<&str> = h["requirements"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
                    let source = format!("import {}\n\n\ndef f(event):\n    return 1\n", imports.join(", "));
                    let reqs = reqs.join("\n") + "\n";
                    client.upload(h["name"].as_str().unwrap(), &[("f.py", source.as_bytes()), ("requirements.txt", reqs.as_bytes())])?;
                }
            }));
        }
        for j in jobs {
            j.join().map_err(|_| anyhow::anyhow!("an upload thread panicked"))??;
        }
        Ok(())
    })?;
    let before = worker.stats()?;
    let seconds = bench.opts.scale_seconds * if bench.opts.quick { 0.25 } else { 1.0 };
    let stop_at = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let samples: Vec<(f64, bool, bool)> = std::thread::scope(|scope| {
        let jobs: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let client = worker.client();
                let mut rng = Rng::new(bench.opts.seed * 1000 + c as u64);
                scope.spawn(move || {
                    let mut got = Vec::new();
                    while Instant::now() < stop_at {
                        let h = &handlers[rng.below(handlers.len())];
                        match client.invoke(h["name"].as_str().unwrap(), b"null") {
                            Ok(r) => got.push((r.ms, r.status == 200, r.start == "warm")),
                            Err(_) => got.push((0.0, false, false)),
                        }
                    }
                    got
                })
            })
            .collect();
        jobs.into_iter().flat_map(|j| j.join().unwrap_or_default()).collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let after = worker.stats()?;
    let delta = |path: &[&str]| {
        let at = |v: &Value| path.iter().try_fold(v, |v, k| v.get(*k)).and_then(|v| v.as_u64()).unwrap_or(0);
        at(&after).saturating_sub(at(&before))
    };
    let ok: Vec<f64> = samples.iter().filter(|s| s.1).map(|s| s.0).collect();
    let errors = samples.len() - ok.len();
    let handler = samples.iter().filter(|s| s.1 && s.2).count() as u64;
    let import = delta(&["import_cache", "import_cache_hits"]);
    let install = delta(&["import_cache", "import_cache_misses"]) + delta(&["import_cache", "import_cache_fallbacks"]);
    let total = (handler + import + install).max(1) as f64;
    let mut point = summary(&ok);
    point["handlers"] = json!(handlers.len());
    point["seconds"] = json!(elapsed);
    point["requests"] = json!(ok.len());
    point["per_s"] = json!(ok.len() as f64 / elapsed);
    point["errors"] = json!(errors);
    point["counts"] = json!({"handler": handler, "import": import, "install": install,
        "zygotes_created": delta(&["import_cache", "zygotes_created"]), "zygote_evictions": delta(&["import_cache", "zygote_evictions"])});
    point["share"] = json!({"handler": handler as f64 / total, "import": import as f64 / total, "install": install as f64 / total});
    let step = (ok.len() / 4000).max(1);
    point["latencies_ms"] = json!(ok.iter().step_by(step).collect::<Vec<_>>());
    Ok(point)
}
