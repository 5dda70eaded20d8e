//! `sprout bench packages`: SOCK's figures 17-21 on this machine, through the real worker, with
//! real packages from the package index and synthetic ones from bench/synthetic_packages.py.
//!
//! * [`cold`] (figure 17): cold starts of lambdas importing django, flask, jinja2, requests,
//!   Pillow and numpy with no caches, the install cache only, the import cache, all caches;
//! * [`django`] (figures 18-19): 100 django lambdas invoked at random by one client under
//!   each cache configuration, and the handler cache's hits without and with the import cache;
//! * [`scale`] (figure 20): synthetic packages, 100 to 10,000 handlers, 10 clients;
//! * [`resize`] (figure 21): a Pillow lambda resizing an image: cold, cold+ and warm;
//! * [`memory`]: the PSS of N lambdas served from a Zygote tree against N interpreters.
//!
//! Every phase starts real workers pinned to one CPU, with this driver on the other; one
//! install cache (filled once with `sprout packages preinstall`) serves every phase that uses
//! the install cache, and the phases without it install from the index every time.

mod cold;
mod django;
mod memory;
mod resize;
mod scale;

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::report;
use crate::worker::{pin_to, BenchWorker};

/// The packages measured one by one: (name, requirement, what a lambda imports).
pub const PACKAGES: [(&str, &str, &str); 6] = [
    ("django", "django==4.2.16", "from django.http import HttpResponse"),
    ("flask", "flask==3.0.3", "from flask import Flask"),
    ("jinja2", "jinja2==3.1.4", "import jinja2"),
    ("requests", "requests==2.32.3", "import requests"),
    ("pillow", "pillow==10.4.0", "from PIL import Image"),
    ("numpy", "numpy==1.26.4", "import numpy"),
];

pub const PARTS: [&str; 5] = ["cold", "django", "scale", "resize", "memory"];

#[derive(Debug, Clone)]
pub struct Options {
    pub parts: Vec<String>,
    /// Fewer samples and smaller points, for a quick look.
    pub quick: bool,
    /// Seconds each scalability point runs.
    pub scale_seconds: f64,
    pub worker_cpu: usize,
    pub client_cpu: usize,
    pub work_dir: PathBuf,
    pub out_dir: PathBuf,
    pub sprout: PathBuf,
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            parts: PARTS.iter().map(|s| s.to_string()).collect(),
            quick: false,
            scale_seconds: 60.0,
            worker_cpu: 0,
            client_cpu: 1,
            work_dir: PathBuf::from("/tmp/sprout-bench-packages"),
            out_dir: PathBuf::from("bench/results"),
            sprout: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("sprout")),
            seed: 1,
        }
    }
}

/// Which caches a phase's worker uses.
#[derive(Debug, Clone, Copy)]
pub struct Caches {
    pub install: bool,
    pub import: bool,
    pub handler: bool,
}

impl Caches {
    pub const NONE: Caches = Caches { install: false, import: false, handler: false };
    pub const HANDLER: Caches = Caches { install: false, import: false, handler: true };
    pub const INSTALL: Caches = Caches { install: true, import: false, handler: false };
    pub const IMPORT: Caches = Caches { install: true, import: true, handler: false };
    pub const ALL: Caches = Caches { install: true, import: true, handler: true };
    pub const INSTALL_HANDLER: Caches = Caches { install: true, import: false, handler: true };
}

/// State shared by the phases.
pub struct Bench {
    pub opts: Options,
    pub cache_dir: PathBuf,
    next_port: std::sync::atomic::AtomicU16,
}

impl Bench {
    /// The worker configuration for `caches`, with the shared install cache.
    pub fn config(&self, caches: Caches, handler_cache_mb: u64, extra: &str) -> String {
        let packages = format!("cache_dir = \"{}\"\ninstall_cache = {}\n", self.cache_dir.display(), caches.install);
        self.config_with_packages(caches, handler_cache_mb, &packages) + extra
    }

    /// The worker configuration for `caches`, with `packages` as its [packages] section.
    pub fn config_with_packages(&self, caches: Caches, handler_cache_mb: u64, packages: &str) -> String {
        format!(
            "[sandbox]\ncgroup_pool = 32\nstart_timeout_ms = 600000\nzygote_memory_mb = 1024\n\
             [limits]\nmemory_mb = 512\npids = 256\ntimeout_ms = 600000\nmax_body_mb = 16\n\
             [packages]\ninstall_timeout_s = 900\n{packages}\
             [import_cache]\nenabled = {}\n\
             [instances]\nkeep_warm = {}\nmax_per_lambda = 4\nmax_total = 512\nidle_timeout_s = 3600\nqueue_depth = 1024\n\
             [handler_cache]\nmemory_mb = {handler_cache_mb}\n",
            caches.import, caches.handler,
        )
    }

    pub fn start(&self, phase: &str, config: &str) -> Result<BenchWorker> {
        let port = self.next_port.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        BenchWorker::start(&self.opts.sprout, &self.opts.work_dir.join(phase), port, Some(self.opts.worker_cpu), config)
    }

    /// Fill the install cache with `requirement` and its dependencies (once per run).
    pub fn preinstall(&self, requirement: &str) -> Result<()> {
        let dir = self.opts.work_dir.join("preinstall");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("config.toml"), format!("[packages]\ncache_dir = \"{}\"\n", self.cache_dir.display()))?;
        let file = dir.join("requirements.txt");
        std::fs::write(&file, format!("{requirement}\n"))?;
        let out = Command::new(&self.opts.sprout).args(["packages", "preinstall"]).arg(&file).arg("--dir").arg(&dir).output()?;
        if !out.status.success() {
            bail!("preinstalling {requirement}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }
}

/// Percentile `q` of `samples` (nearest rank).
pub fn percentile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

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

/// Run the chosen parts; writes packages.json, .md and .png under `opts.out_dir`.
pub fn run(opts: &Options) -> Result<Value> {
    std::fs::create_dir_all(&opts.work_dir)?;
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let pinned = cpus > opts.worker_cpu.max(opts.client_cpu) && opts.worker_cpu != opts.client_cpu;
    if pinned {
        pin_to(opts.client_cpu)?;
    } else {
        eprintln!("warning: cannot put the worker and the load generator on separate CPUs here");
    }
    let bench = Bench { opts: opts.clone(), cache_dir: opts.work_dir.join("package-cache"), next_port: 5700.into() };
    let mut results = serde_json::Map::new();
    let previous = std::fs::read(opts.out_dir.join("packages.json")).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    let wants = |part: &str| opts.parts.iter().any(|p| p == part);
    let mut run_part = |part: &str, key: &str, f: &dyn Fn(&Bench) -> Result<Value>| -> Result<()> {
        if wants(part) {
            eprintln!("== {part}");
            let value = f(&bench)?;
            results.insert(key.to_string(), value);
        } else if let Some(old) = previous.as_ref().and_then(|p| p.get(key)) {
            results.insert(key.to_string(), old.clone()); // kept from an earlier run
        }
        Ok(())
    };
    run_part("cold", "packages", &cold::run)?;
    run_part("django", "django", &django::run)?;
    run_part("scale", "scalability", &scale::run)?;
    run_part("resize", "image_resize", &resize::run)?;
    run_part("memory", "memory", &memory::run)?;
    let mut out = json!({
        "machine": report::machine(),
        "method": {
            "pinning": if pinned {
                format!("worker, Zygotes and sandboxes on CPU {}; this load generator on CPU {}", opts.worker_cpu, opts.client_cpu)
            } else {
                "none: fewer than two CPUs".to_string()
            },
            "packages": "real packages from the package index (pinned versions below); the install cache filled once with `sprout packages preinstall`",
            "no_install_cache": "install_cache = false: each new sandbox runs pip (download from the index, no pip cache, install) before importing",
            "quick": opts.quick,
        },
    });
    for (k, v) in results {
        out[k] = v;
    }
    if let Some(floor) = out.get("packages").and_then(|p| p.get("no_package")).map(|n| n["cold_p50_ms"].clone()) {
        out["no_package_cold_p50_ms"] = floor; // the same run's fork floor, the yardstick
    }
    out["targets"] = targets(&out);
    report::write(&opts.out_dir, "packages", &out, &markdown(&out), "plot_packages.py")?;
    Ok(out)
}

fn get(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(*k))?.as_f64()
}

fn targets(r: &Value) -> Value {
    let packages = PACKAGES.map(|p| p.0);
    let floor = get(r, &["no_package_cold_p50_ms"]);
    let p50 = |p: &str, config: &str| get(r, &["packages", p, config, "cold_p50_ms"]);
    let first_five = |p: &str| -> Vec<f64> {
        r["packages"][p]["first_five_ms"].as_array().map(|v| v.iter().filter_map(|x| x.as_f64()).collect()).unwrap_or_default()
    };
    // The worst package's figure (and every package's) for a per-package ratio.
    let worst = |ratio: &dyn Fn(&str) -> Option<f64>| -> (Option<f64>, serde_json::Map<String, Value>) {
        let each: serde_json::Map<String, Value> = packages.iter().filter_map(|p| Some((p.to_string(), json!(ratio(p)?)))).collect();
        let worst = each.values().filter_map(|v| v.as_f64()).fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
        (worst, each)
    };
    let target = |text: &str, limit: f64, (measured, each): (Option<f64>, serde_json::Map<String, Value>)| json!({"target": text, "measured": measured, "per_package": each, "met": measured.map(|m| m <= limit)});
    Value::Array(vec![
        target(
            "import-cache cold start p50 <= 1.5x the same run's no-package cold start p50, every package (ratio)",
            1.5,
            worst(&|p| Some(p50(p, "import")? / floor?)),
        ),
        target(
            "a package's 2nd to 5th cold starts (import cache) each <= 2x its p50 (worst ratio)",
            2.0,
            worst(&|p| Some(first_five(p).iter().skip(1).fold(0.0f64, |m, x| m.max(*x)) / p50(p, "import")?)),
        ),
        target(
            "a package's 1st cold start (import cache) <= the install cache's p50 (ratio)",
            1.0,
            worst(&|p| Some(*first_five(p).first()? / p50(p, "install")?)),
        ),
        target(
            "all caches' cold start p50 <= the import cache's alone, every package (ratio)",
            1.0,
            worst(&|p| Some(p50(p, "all")? / p50(p, "import")?)),
        ),
    ])
}

fn markdown(r: &Value) -> String {
    let f = |v: Option<f64>, d: usize| v.map(|x| format!("{x:.d$}")).unwrap_or_else(|| "—".into());
    let mut s = format!("Machine: {}. {}\n\n", r["machine"].as_str().unwrap_or(""), r["method"]["pinning"].as_str().unwrap_or(""));
    if r.get("packages").is_some() {
        s += "Cold start p50 (ms) of a lambda importing one package (SOCK figure 17), against the same run's cold start of a lambda importing nothing (import cache on)";
        s += &format!(": **{} ms**.\n\n", f(get(r, &["no_package_cold_p50_ms"]), 2));
        s += "| package | no caches | install cache | import cache | all caches | import / no package | import cache: first five cold starts (ms) |\n|---|---:|---:|---:|---:|---:|---|\n";
        for (p, req, _) in PACKAGES {
            let c = |cfg: &str| get(r, &["packages", p, cfg, "cold_p50_ms"]);
            let ratio = match (c("import"), get(r, &["no_package_cold_p50_ms"])) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            };
            let first: Vec<String> = r["packages"][p]["first_five_ms"]
                .as_array()
                .map(|v| v.iter().take(5).filter_map(|x| x.as_f64()).map(|x| format!("{x:.0}")).collect())
                .unwrap_or_default();
            s += &format!(
                "| {req} | {} | {} | {} | {} | {}× | {} |\n",
                f(c("none"), 0),
                f(c("install"), 1),
                f(c("import"), 2),
                f(c("all"), 2),
                f(ratio, 1),
                first.join(", ")
            );
        }
    }
    if let Some(d) = r.get("django") {
        s += "\n100 django lambdas invoked at random by one client (SOCK figures 18-19): latency (ms) and handler-cache hits\n\n";
        s += "| caches | requests | p50 | p90 | p99 | handler-cache hits |\n|---|---:|---:|---:|---:|---:|\n";
        for cfg in ["none", "handler", "install", "import", "all", "install+handler"] {
            if let Some(c) = d.get("configs").and_then(|x| x.get(cfg)) {
                s += &format!(
                    "| {cfg} | {} | {} | {} | {} | {} |\n",
                    c["samples"],
                    f(c["p50_ms"].as_f64(), 1),
                    f(c["p90_ms"].as_f64(), 1),
                    f(c["p99_ms"].as_f64(), 1),
                    c["hits"]
                );
            }
        }
        s += &format!("\nHandler cache budget: {} MiB ({}).\n", d["handler_cache_mb"], d["handler_cache_rule"].as_str().unwrap_or(""));
    }
    if let Some(sc) = r.get("scalability") {
        s += "\nSynthetic packages, 10 clients (SOCK figure 20):\n\n| handlers | p50 (ms) | p99 (ms) | handler cache | import cache | install cache |\n|---:|---:|---:|---:|---:|---:|\n";
        let mut points: Vec<(&String, &Value)> =
            sc.as_object().map(|o| o.iter().filter(|(k, _)| k.parse::<u64>().is_ok()).collect()).unwrap_or_default();
        points.sort_by_key(|(k, _)| k.parse::<u64>().unwrap_or(0));
        for (n, p) in points {
            let pct = |k: &str| p["share"][k].as_f64().map(|x| format!("{:.0}%", x * 100.0)).unwrap_or_else(|| "—".into());
            s += &format!(
                "| {n} | {} | {} | {} | {} | {} |\n",
                f(p["p50_ms"].as_f64(), 1),
                f(p["p99_ms"].as_f64(), 1),
                pct("handler"),
                pct("import"),
                pct("install")
            );
        }
    }
    if let Some(ir) = r.get("image_resize") {
        s += "\nImage resizing with Pillow (SOCK figure 21), p50 (ms):\n\n| case | total | compute | platform |\n|---|---:|---:|---:|\n";
        for case in ["cold", "cold+", "warm"] {
            let c = &ir[case];
            s += &format!(
                "| {case} | {} | {} | {} |\n",
                f(c["p50_ms"].as_f64(), 1),
                f(c["compute_p50_ms"].as_f64(), 1),
                f(c["platform_p50_ms"].as_f64(), 1)
            );
        }
    }
    if let Some(m) = r.get("memory") {
        s += &format!(
            "\nMemory (PSS) of {} paused django lambdas: Zygote tree {} MiB, root-Zygote forks without the import cache {} MiB, separate interpreters {} MiB.\n",
            m["lambdas"],
            f(m["zygote_tree_pss_mb"].as_f64(), 1),
            f(m["root_forks_pss_mb"].as_f64(), 1),
            f(m["separate_pss_mb"].as_f64(), 1),
        );
    }
    s += &report::targets_table(&r["targets"], 2);
    s
}

/// The files of a lambda importing what `import` says, with `requirement`.
pub fn lambda_files(import: &str, requirement: &str, body: &str) -> Vec<(String, Vec<u8>)> {
    vec![
        ("f.py".to_string(), format!("{import}\n\n\ndef f(event):\n{body}\n").into_bytes()),
        ("requirements.txt".to_string(), format!("{requirement}\n").into_bytes()),
    ]
}

pub fn as_refs(files: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
    files.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect()
}

/// Summed PSS (MiB) of every process of a worker's sandboxes and Zygotes.
pub fn worker_pss_mb(worker: &BenchWorker) -> f64 {
    sprout_sandbox::memory::pss_of_pids(&worker.sandbox_pids()) as f64 / (1 << 20) as f64
}
