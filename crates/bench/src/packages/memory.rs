//! Memory of N different lambdas that import django, each paused in the handler cache after
//! one request, counted as PSS (each shared page charged 1/N to each of its N users) over
//! every process of the worker's sandboxes and Zygotes:
//!
//! * a Zygote tree: handlers forked from a Zygote that imported django (all caches on);
//! * root forks: handlers forked from the root Zygote, each importing django itself;
//! * separate interpreters: `sock-nozygote`, a fresh interpreter per handler.

use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};

use super::phase::{as_refs, lambda_files, worker_pss_mb, Bench, Caches, PACKAGES};

fn measure(bench: &Bench, phase: &str, config: &str, n: usize) -> Result<(f64, Value)> {
    let (_, requirement, import) = PACKAGES[0];
    let files = lambda_files(import, requirement, "    return \"ok\"");
    let worker = bench.start(phase, config)?;
    let result = (|| {
        for i in 0..n {
            worker.upload(&format!("dj{i}"), &as_refs(&files))?;
            let reply = worker.invoke(&format!("dj{i}"), b"null")?;
            anyhow::ensure!(reply.status == 200, "dj{i}: {}", String::from_utf8_lossy(&reply.body));
        }
        std::thread::sleep(Duration::from_millis(2500)); // let every handler be paused and measured
        let stats = worker.stats()?;
        anyhow::ensure!(
            stats["handler_cache"]["paused"].as_u64() == Some(n as u64),
            "not all handlers were kept: {}",
            stats["handler_cache"]
        );
        Ok((
            worker_pss_mb(&worker),
            json!({"handler_cache": stats["handler_cache"], "import_cache_pss_mb": stats["import_cache"]["package_zygotes_pss_mb"]}),
        ))
    })();
    worker.stop()?;
    result
}

pub fn run(bench: &Bench) -> Result<Value> {
    bench.preinstall(PACKAGES[0].1)?;
    let n = if bench.opts.quick { 5 } else { 20 };
    let (tree, tree_detail) = measure(bench, "memory-tree", &bench.config(Caches::ALL, 100_000, ""), n)?;
    let (root, _) = measure(bench, "memory-root", &bench.config(Caches::INSTALL_HANDLER, 100_000, ""), n)?;
    let separate_config =
        bench.config(Caches::INSTALL_HANDLER, 100_000, "").replacen("[sandbox]\n", "[sandbox]\nbackend = \"sock-nozygote\"\n", 1);
    let (separate, _) = measure(bench, "memory-separate", &separate_config, n)?;
    eprintln!("  {n} django lambdas: Zygote tree {tree:.1} MiB, root forks {root:.1} MiB, separate interpreters {separate:.1} MiB");
    Ok(json!({
        "lambdas": n,
        "package": PACKAGES[0].1,
        "zygote_tree_pss_mb": tree,
        "root_forks_pss_mb": root,
        "separate_pss_mb": separate,
        "separate_over_tree": separate / tree,
        "tree_detail": tree_detail,
    }))
}
