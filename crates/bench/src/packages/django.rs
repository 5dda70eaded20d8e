//! SOCK figures 18 and 19: 100 different lambdas that all import django, invoked at random
//! (the same seeded sequence every time) by one client, under each cache configuration.
//!
//! The handler cache gets a memory budget of 20 django handlers as they are without the
//! import cache (measured first: the PSS of paused handlers that imported django
//! themselves). With LRU over 100 lambdas and 200 random requests, a cache of 20 hits about
//! 18% (SOCK's experiment 1); with the import cache, handlers share the Zygote's django pages,
//! are charged only their share, and more of them fit the same budget (experiment 2).

use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::phase::{as_refs, lambda_files, Bench, Caches, PACKAGES};
use super::sample::{summary, Rng};

const LAMBDAS: usize = 100;

pub fn run(bench: &Bench) -> Result<Value> {
    let (_, requirement, import) = PACKAGES[0];
    bench.preinstall(requirement)?;
    let quick = bench.opts.quick;
    let requests = if quick { 60 } else { 200 };
    let files = lambda_files(import, requirement, "    return \"ok\"");

    // The budget: 20 django handlers that imported django themselves.
    let probe = bench.start("django-probe", &bench.config(Caches::INSTALL_HANDLER, 100_000, ""))?;
    let per_handler = (|| {
        for i in 0..3 {
            probe.upload(&format!("dj{i}"), &as_refs(&files))?;
            probe.invoke(&format!("dj{i}"), b"null")?;
        }
        std::thread::sleep(Duration::from_millis(2500));
        let cache = probe.stats()?["handler_cache"].clone();
        anyhow::Ok(cache["paused_pss_mb"].as_f64().unwrap_or(0.0) / cache["paused"].as_f64().unwrap_or(1.0).max(1.0))
    })();
    probe.stop()?;
    let per_handler = per_handler?;
    let budget = ((per_handler * 20.0).round() as u64).max(1);
    eprintln!("  a paused django handler holds {per_handler:.1} MiB without the import cache: budget {budget} MiB");

    let mut sequence = Vec::new();
    let mut rng = Rng::new(bench.opts.seed);
    for _ in 0..requests {
        sequence.push(rng.below(LAMBDAS));
    }
    let configs: [(&str, Caches, usize); 6] = [
        ("none", Caches::NONE, if quick { 5 } else { 30 }),
        ("handler", Caches::HANDLER, requests),
        ("install", Caches::INSTALL, requests),
        ("import", Caches::IMPORT, requests),
        ("all", Caches::ALL, requests),
        ("install+handler", Caches::INSTALL_HANDLER, requests),
    ];
    let mut out = serde_json::Map::new();
    for (name, caches, count) in configs {
        let worker = bench.start(&format!("django-{}", name.replace('+', "-")), &bench.config(caches, budget, ""))?;
        let result = (|| {
            for i in 0..LAMBDAS {
                worker.upload(&format!("dj{i}"), &as_refs(&files))?;
            }
            let (mut ms, mut hits, mut cumulative) = (Vec::new(), 0u64, Vec::new());
            for (n, &lambda) in sequence.iter().take(count).enumerate() {
                let reply = worker.invoke(&format!("dj{lambda}"), b"null")?;
                if reply.status != 200 {
                    bail!("dj{lambda}: {} {}", reply.status, String::from_utf8_lossy(&reply.body));
                }
                if reply.start == "warm" {
                    hits += 1;
                }
                ms.push(reply.ms);
                cumulative.push(hits);
                if (n + 1) % 50 == 0 {
                    eprintln!("  {name:>16}: {} requests, {hits} handler-cache hits", n + 1);
                }
            }
            let stats = worker.stats()?;
            let mut s = summary(&ms);
            s["hits"] = json!(hits);
            s["hit_rate"] = json!(hits as f64 / ms.len().max(1) as f64);
            s["cumulative_hits"] = json!(cumulative);
            s["latencies_ms"] = json!(ms);
            s["handler_cache"] = stats["handler_cache"].clone();
            eprintln!(
                "  {name:>16}: p50 {:.1} ms, p99 {:.1} ms, {hits} hits",
                s["p50_ms"].as_f64().unwrap_or(0.0),
                s["p99_ms"].as_f64().unwrap_or(0.0)
            );
            anyhow::Ok(s)
        })();
        worker.stop()?;
        out.insert(name.to_string(), result?);
    }
    Ok(json!({
        "lambdas": LAMBDAS,
        "requests": requests,
        "seed": bench.opts.seed,
        "handler_cache_mb": budget,
        "handler_cache_rule": format!("20 paused django handlers without the import cache, each {per_handler:.1} MiB PSS"),
        "configs": out,
    }))
}
