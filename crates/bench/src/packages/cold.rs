//! SOCK figure 17: one client invokes, one after another, different lambdas that each import
//! the same package, so every request is a cold start; per package and cache configuration:
//!
//! * `none`: no install cache (each sandbox runs pip first), no import cache;
//! * `install`: packages installed ahead, each handler imports them itself;
//! * `import`: the import cache too (a Zygote holding the package is forked);
//! * `all`: with the handler cache as well (which cannot help here: every lambda is new).
//!
//! The yardstick is the fork floor: with the import cache, each package cold start is
//! followed by the cold start of a new lambda importing nothing, on the same worker, and the
//! package's p50 is compared with theirs (`no_package`). A package's first cold starts are
//! kept in order (`first_five_ms`): the first may build its Zygote, the next ones must not
//! wait for one.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::phase::{as_refs, lambda_files, Bench, Caches, PACKAGES};
use super::sample::summary;
use crate::worker::BenchWorker;

/// Cold starts per package: (configuration, caches, samples, samples with --quick).
const CONFIGS: [(&str, Caches, usize, usize); 4] =
    [("none", Caches::NONE, 3, 1), ("install", Caches::INSTALL, 10, 5), ("import", Caches::IMPORT, 20, 8), ("all", Caches::ALL, 20, 8)];

/// `{"no_package": {...}, <package>: {...}}`. Without caches each cold start runs pip (seconds),
/// so that configuration runs alone first; the others run side by side: one worker each, all
/// up at once, and each package's cold starts taken in turns across them (with a no-package
/// cold start after each of the import cache's), so that every configuration sees the same
/// machine at the same time.
pub fn run(bench: &Bench) -> Result<Value> {
    for (name, requirement, _) in PACKAGES {
        eprintln!("  preinstalling {name}");
        bench.preinstall(requirement)?;
    }
    let quick = bench.opts.quick;
    let samples = |full: usize, few: usize| if quick { few } else { full };
    let mut out = serde_json::Map::new();
    let mut no_package = Vec::new();
    let (none, side_by_side) = CONFIGS.split_at(1);
    for (config, caches, full, few) in none {
        let worker = bench.start(&format!("cold-{config}"), &bench.config(*caches, 1024, ""))?;
        let result = (|| {
            for (name, requirement, import) in PACKAGES {
                let files = lambda_files(import, requirement, "    return \"ok\"");
                let ms = (0..samples(*full, *few))
                    .map(|i| cold_start(&worker, &format!("{name}-{config}-{i}"), &files))
                    .collect::<Result<Vec<_>>>()?;
                record(&mut out, name, requirement, import, config, &ms);
            }
            anyhow::Ok(())
        })();
        worker.stop()?;
        result?;
    }
    let mut workers = Vec::new();
    for (config, caches, full, few) in side_by_side {
        workers.push((*config, samples(*full, *few), bench.start(&format!("cold-{config}"), &bench.config(*caches, 1024, ""))?));
    }
    let result = (|| {
        let plain = vec![("f.py".to_string(), b"def f(event):\n    return \"ok\"\n".to_vec())];
        for (name, requirement, import) in PACKAGES {
            let files = lambda_files(import, requirement, "    return \"ok\"");
            let mut ms: Vec<Vec<f64>> = vec![Vec::new(); workers.len()];
            let most = workers.iter().map(|w| w.1).max().unwrap_or(0);
            for i in 0..most {
                for (k, (config, wanted, worker)) in workers.iter().enumerate() {
                    if i >= *wanted {
                        continue;
                    }
                    ms[k].push(cold_start(worker, &format!("{name}-{config}-{i}"), &files)?);
                    if *config == "import" {
                        // The same worker's fork floor.
                        no_package.push(cold_start(worker, &format!("plain-{name}-{i}"), &plain)?);
                    }
                }
            }
            for (k, (config, _, _)) in workers.iter().enumerate() {
                record(&mut out, name, requirement, import, config, &ms[k]);
            }
        }
        anyhow::Ok(())
    })();
    for (_, _, worker) in workers {
        worker.stop()?;
    }
    result?;
    let s = summary(&no_package);
    eprintln!("  no package   import: p50 {:>9.2} ms  ({} samples)", s["p50_ms"].as_f64().unwrap_or(0.0), no_package.len());
    out.insert(
        "no_package".into(),
        json!({"cold_p50_ms": s["p50_ms"], "cold_p90_ms": s["p90_ms"], "cold_mean_ms": s["mean_ms"], "samples": no_package}),
    );
    Ok(Value::Object(out))
}

/// Put one package's cold starts under one configuration into `out`.
fn record(out: &mut serde_json::Map<String, Value>, name: &str, requirement: &str, import: &str, config: &str, ms: &[f64]) {
    let s = summary(ms);
    eprintln!("  {name:>9} {config:>8}: p50 {:>9.2} ms  ({} samples)", s["p50_ms"].as_f64().unwrap_or(0.0), ms.len());
    let entry = out.entry(name.to_string()).or_insert_with(|| json!({"requirement": requirement, "import": import}));
    if config == "import" {
        entry["first_five_ms"] = json!(ms.iter().take(5).collect::<Vec<_>>());
    }
    entry[config] = json!({"cold_p50_ms": s["p50_ms"], "cold_p90_ms": s["p90_ms"], "cold_mean_ms": s["mean_ms"], "samples": ms});
}

/// Upload `files` as the new lambda `lambda` and time its first invocation (a cold start).
fn cold_start(worker: &BenchWorker, lambda: &str, files: &[(String, Vec<u8>)]) -> Result<f64> {
    worker.upload(lambda, &as_refs(files))?;
    let reply = worker.invoke(lambda, b"null")?;
    if reply.status != 200 || reply.start != "cold" {
        bail!("{lambda}: {} {} {}", reply.status, reply.start, String::from_utf8_lossy(&reply.body));
    }
    Ok(reply.ms)
}
