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
mod phase;
mod resize;
mod sample;
mod scale;

use anyhow::Result;
use serde_json::{json, Value};

use crate::report;
use crate::worker::pin_to;
use phase::{Bench, PACKAGES};
pub use phase::{Options, PARTS};
pub use sample::{percentile, Rng};

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
