//! `sprout bench fleet`: the routing policies compared on a fleet of workers behind HAProxy
//! (`sprout fleet`), on the synthetic package workload (bench/synthetic_packages.py, SOCK
//! figure 20's: Zipf-popular packages with import costs). Each policy gets a fresh fleet of
//! the same size, each worker with a memory budget and caches that hold only part of the
//! Zygotes and handlers; the handlers are deployed through the fleet's shared registry, then
//! clients invoke them uniformly at random through HAProxy for a warm-up and a measured span.
//! Reported per policy: mean, median and 99th-percentile latency, the share of cold starts,
//! and throughput, as `{"policies": {"round-robin": {...}, ...}}`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::packages::{percentile, Rng};
use crate::report;
use crate::worker::{pin_to, Client};

const POLICIES: [&str; 4] = ["round-robin", "least-conn", "consistent", "package-aware"];

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub sprout: PathBuf,
    pub out: PathBuf,
    pub work_dir: PathBuf,
    pub workers: usize,
    pub handlers: usize,
    pub clients: usize,
    pub warmup_s: f64,
    pub seconds: f64,
    /// Each worker's memory budget, and the share of it its caches may hold.
    pub worker_memory_mb: u64,
    pub cache_mb: u64,
    pub worker_cpu: usize,
    pub client_cpu: usize,
    pub seed: u64,
}

fn sprout(opts: &Options, args: &[&str]) -> Result<String> {
    let out = Command::new(&opts.sprout).args(args).output().with_context(|| format!("running sprout {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("sprout {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

pub fn run(opts: &Options) -> Result<Value> {
    std::fs::create_dir_all(&opts.work_dir)?;
    let cache = opts.work_dir.join("synthetic-cache");
    let manifest_path = opts.work_dir.join("synthetic-manifest.json");
    let generated = Command::new("python3")
        .arg(report::bench_dir().join("synthetic_packages.py"))
        .arg("--cache")
        .arg(&cache)
        .arg("--out")
        .arg(&manifest_path)
        .args(["--handlers", &opts.handlers.to_string(), "--seed", &opts.seed.to_string()])
        .output()
        .context("running bench/synthetic_packages.py")?;
    if !generated.status.success() {
        bail!("generating synthetic packages: {}", String::from_utf8_lossy(&generated.stderr));
    }
    let manifest: Value = serde_json::from_slice(&std::fs::read(&manifest_path)?)?;
    let handlers: Vec<Value> = manifest["handlers"].as_array().cloned().unwrap_or_default();
    let no_wheels = opts.work_dir.join("no-wheels");
    std::fs::create_dir_all(&no_wheels)?;
    // Every worker reads the one pre-installed cache (as machines would share a package
    // mirror); nothing is downloaded.
    let worker_config = format!(
        "[packages]\ncache_dir = \"{}\"\noffline = true\nwheel_dir = \"{}\"\n\n[import_cache]\nmemory_mb = {}\n\n\
         [handler_cache]\nmemory_mb = {}\n\n[limits]\ntimeout_ms = 120000\n",
        cache.display(),
        no_wheels.display(),
        opts.cache_mb,
        opts.cache_mb
    );
    let config_path = opts.work_dir.join("worker.toml");
    std::fs::write(&config_path, &worker_config)?;
    let mut policies = serde_json::Map::new();
    for policy in POLICIES {
        eprintln!("==> {policy}: {} workers, {} handlers", opts.workers, handlers.len());
        let point = measure_policy(opts, policy, &handlers, &config_path)?;
        eprintln!(
            "  {policy:>14}: mean {:.1} ms, p50 {:.1} ms, p99 {:.1} ms, cold {:.1}%, {:.0}/s",
            point["mean_ms"].as_f64().unwrap_or(0.0),
            point["p50_ms"].as_f64().unwrap_or(0.0),
            point["p99_ms"].as_f64().unwrap_or(0.0),
            point["cold_share"].as_f64().unwrap_or(0.0) * 100.0,
            point["per_s"].as_f64().unwrap_or(0.0)
        );
        policies.insert(policy.to_string(), point);
    }
    let ratio = |metric: &str| {
        let rr = policies["round-robin"][metric].as_f64().unwrap_or(0.0);
        let pa = policies["package-aware"][metric].as_f64().unwrap_or(0.0);
        if pa > 0.0 {
            json!(rr / pa)
        } else {
            Value::Null
        }
    };
    let ratios = json!({"round_robin_over_package_aware_mean": ratio("mean_ms"), "round_robin_over_package_aware_p99": ratio("p99_ms")});
    let target = |text: &str, measured: &Value, goal: f64| json!({"target": text, "measured": measured, "met": measured.as_f64().map(|r| r >= goal)});
    let targets = json!([
        target("package-aware mean latency >= 1.3x better than round-robin's", &ratios["round_robin_over_package_aware_mean"], 1.3),
        target("package-aware p99 latency >= 5x better than round-robin's", &ratios["round_robin_over_package_aware_p99"], 5.0),
    ]);
    let results = json!({
        "machine": report::machine(),
        "setup": {
            "workers": opts.workers, "handlers": handlers.len(), "clients": opts.clients, "warmup_s": opts.warmup_s,
            "seconds": opts.seconds, "worker_memory_mb": opts.worker_memory_mb, "cache_mb": opts.cache_mb,
            "worker_cpu": opts.worker_cpu, "client_cpu": opts.client_cpu, "seed": opts.seed,
            "note": format!("every worker (each its own network namespace) on CPU {}; HAProxy, PostgreSQL and the {} clients on CPU {}",
                            opts.worker_cpu, opts.clients, opts.client_cpu),
            "generator": {"materialized": manifest["materialized"], "mean_import_cpu_ms": manifest["mean_import_cpu_ms"],
                          "mean_import_memory_mb": manifest["mean_import_memory_mb"]},
        },
        "policies": policies,
        "ratios": ratios,
        "targets": targets,
    });
    Ok(results)
}

/// One policy: a fresh fleet, the handlers deployed, the load, the fleet taken down.
fn measure_policy(opts: &Options, policy: &str, handlers: &[Value], config_path: &std::path::Path) -> Result<Value> {
    let dir = opts.work_dir.join(format!("fleet-{policy}"));
    let _ = sprout(opts, &["fleet", "down", &dir.to_string_lossy()]);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    // The package-aware policy's map: each handler's costliest import.
    let routes: String =
        handlers.iter().map(|h| format!("{} {}\n", h["name"].as_str().unwrap_or(""), h["largest"].as_str().unwrap_or(""))).collect();
    std::fs::write(dir.join("routes.map"), routes)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let listen = format!("127.0.0.1:{port}");
    let up = Command::new("taskset")
        .args(["-c", &opts.client_cpu.to_string()])
        .arg(&opts.sprout)
        .args(["fleet", "up"])
        .arg(&dir)
        .args(["--workers", &opts.workers.to_string(), "--cpus", &opts.worker_cpu.to_string()])
        .args(["--memory-mb", &opts.worker_memory_mb.to_string(), "--policy", policy, "--listen", &listen])
        .arg("--worker-config")
        .arg(config_path)
        .output()?;
    if !up.status.success() {
        bail!("sprout fleet up ({policy}): {}", String::from_utf8_lossy(&up.stderr).trim());
    }
    let result = load(opts, &dir, &listen, handlers);
    let down = sprout(opts, &["fleet", "down", &dir.to_string_lossy()]);
    let point = result?;
    down?;
    Ok(point)
}

fn load(opts: &Options, dir: &std::path::Path, listen: &str, handlers: &[Value]) -> Result<Value> {
    let token = std::fs::read_to_string(dir.join("api-token"))?.trim().to_string();
    let url = format!("http://{listen}");
    // Deploy through the fleet (two uploads at a time), then wait for every worker to have all.
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| -> Result<()> {
        let jobs: Vec<_> = (0..2)
            .map(|_| {
                let client = Client::new(&url, &token, Duration::from_secs(120));
                let next = &next;
                scope.spawn(move || -> Result<()> {
                    while let Some(h) = handlers.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let imports: Vec<&str> = h["imports"].as_array().into_iter().flatten().filter_map(|v| v.as_str()).collect();
                        let reqs: Vec<&str> = h["requirements"].as_array().into_iter().flatten().filter_map(|v| v.as_str()).collect();
                        let source = format!("import {}\n\n\ndef f(event):\n    return 1\n", imports.join(", "));
                        let reqs = reqs.join("\n") + "\n";
                        client.upload(
                            h["name"].as_str().unwrap_or(""),
                            &[("f.py", source.as_bytes()), ("requirements.txt", reqs.as_bytes())],
                        )?;
                    }
                    Ok(())
                })
            })
            .collect();
        for j in jobs {
            j.join().map_err(|_| anyhow::anyhow!("an upload thread panicked"))??;
        }
        Ok(())
    })?;
    wait_for_registries(dir, &token, handlers.len())?;
    pin_to(opts.client_cpu)?;
    let run_for = |seconds: f64, seed: u64| -> Vec<(f64, bool, bool)> {
        let stop_at = Instant::now() + Duration::from_secs_f64(seconds);
        std::thread::scope(|scope| {
            let jobs: Vec<_> = (0..opts.clients)
                .map(|c| {
                    let client = Client::new(&url, &token, Duration::from_secs(120));
                    let mut rng = Rng::new(seed * 1000 + c as u64);
                    scope.spawn(move || {
                        let mut got = Vec::new();
                        while Instant::now() < stop_at {
                            let h = &handlers[rng.below(handlers.len())];
                            match client.invoke(h["name"].as_str().unwrap_or(""), b"null") {
                                Ok(r) => got.push((r.ms, r.status == 200, r.start == "cold")),
                                Err(_) => got.push((0.0, false, false)),
                            }
                        }
                        got
                    })
                })
                .collect();
            jobs.into_iter().flat_map(|j| j.join().unwrap_or_default()).collect()
        })
    };
    run_for(opts.warmup_s, opts.seed + 1);
    let started = Instant::now();
    let samples = run_for(opts.seconds, opts.seed + 2);
    let elapsed = started.elapsed().as_secs_f64();
    let mut ok: Vec<f64> = samples.iter().filter(|s| s.1).map(|s| s.0).collect();
    ok.sort_by(|a, b| a.total_cmp(b));
    let cold = samples.iter().filter(|s| s.1 && s.2).count();
    let mean = if ok.is_empty() { 0.0 } else { ok.iter().sum::<f64>() / ok.len() as f64 };
    let step = (ok.len() / 4000).max(1);
    Ok(json!({
        "mean_ms": mean,
        "p50_ms": percentile(&ok, 0.5),
        "p99_ms": percentile(&ok, 0.99),
        "cold_share": cold as f64 / ok.len().max(1) as f64,
        "per_s": ok.len() as f64 / elapsed,
        "requests": ok.len(),
        "errors": samples.len() - ok.len(),
        "latencies_ms": ok.iter().step_by(step).collect::<Vec<_>>(),
    }))
}

/// Wait until every worker of the fleet in `dir` lists `count` lambdas.
fn wait_for_registries(dir: &std::path::Path, token: &str, count: usize) -> Result<()> {
    let state: Value = serde_json::from_slice(&std::fs::read(dir.join("fleet.json"))?)?;
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
    let deadline = Instant::now() + Duration::from_secs(600);
    for m in state["members"].as_array().into_iter().flatten() {
        let url = format!("http://{}:5000/registry", m["addr"].as_str().unwrap_or(""));
        loop {
            let listed = agent
                .get(&url)
                .set("Authorization", &format!("Bearer {token}"))
                .call()
                .ok()
                .and_then(|r| r.into_json::<Value>().ok())
                .and_then(|v| v.as_array().map(|a| a.len()))
                .unwrap_or(0);
            if listed >= count {
                break;
            }
            if Instant::now() > deadline {
                bail!("worker {} has {listed} of {count} lambdas after 600 s", m["name"]);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// The table of the results.
pub fn markdown(r: &Value) -> String {
    let s = &r["setup"];
    let mut md = format!(
        "Machine: {}. {} workers behind HAProxy, {} synthetic handlers (bench/synthetic_packages.py), {} clients invoking them \
         uniformly at random for {} s after {} s of warm-up; each worker's memory budget {} MiB, its handler and import caches {} MiB each; {}.\n\n\
         | policy | mean (ms) | p50 (ms) | p99 (ms) | cold share | requests/s | errors |\n|---|---:|---:|---:|---:|---:|---:|\n",
        r["machine"].as_str().unwrap_or(""),
        s["workers"], s["handlers"], s["clients"], s["seconds"], s["warmup_s"], s["worker_memory_mb"], s["cache_mb"],
        s["note"].as_str().unwrap_or("")
    );
    for policy in POLICIES {
        let p = &r["policies"][policy];
        md.push_str(&format!(
            "| {policy} | {:.1} | {:.1} | {:.1} | {:.1}% | {:.0} | {} |\n",
            p["mean_ms"].as_f64().unwrap_or(0.0),
            p["p50_ms"].as_f64().unwrap_or(0.0),
            p["p99_ms"].as_f64().unwrap_or(0.0),
            p["cold_share"].as_f64().unwrap_or(0.0) * 100.0,
            p["per_s"].as_f64().unwrap_or(0.0),
            p["errors"]
        ));
    }
    md.push('\n');
    md.push_str(&report::targets_table(&r["targets"], 2));
    md
}
