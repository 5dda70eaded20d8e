//! SOCK figure 17: one client invokes, one after another, different lambdas that each import
//! the same package, so every request is a cold start; per package and cache configuration:
//!
//! * `none`: no install cache (each sandbox runs pip first), no import cache;
//! * `install`: packages installed ahead, each handler imports them itself;
//! * `import`: the import cache too (a Zygote holding the package is forked);
//! * `all`: with the handler cache as well (which cannot help here: every lambda is new).

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::{as_refs, lambda_files, summary, Bench, Caches, PACKAGES};

pub fn run(bench: &Bench) -> Result<Value> {
    for (name, requirement, _) in PACKAGES {
        eprintln!("  preinstalling {name}");
        bench.preinstall(requirement)?;
    }
    let quick = bench.opts.quick;
    let configs: [(&str, Caches, usize); 4] = [
        ("none", Caches::NONE, if quick { 1 } else { 3 }),
        ("install", Caches::INSTALL, if quick { 3 } else { 10 }),
        ("import", Caches::IMPORT, if quick { 5 } else { 20 }),
        ("all", Caches::ALL, if quick { 5 } else { 20 }),
    ];
    let mut out = serde_json::Map::new();
    for (config, caches, samples) in configs {
        let worker = bench.start(&format!("cold-{config}"), &bench.config(caches, 1024, ""))?;
        let result = (|| {
            for (name, requirement, import) in PACKAGES {
                let mut ms = Vec::new();
                for i in 0..samples {
                    let lambda = format!("{name}-{config}-{i}");
                    worker.upload(&lambda, &as_refs(&lambda_files(import, requirement, "    return \"ok\"")))?;
                    let reply = worker.invoke(&lambda, b"null")?;
                    if reply.status != 200 || reply.start != "cold" {
                        bail!("{lambda}: {} {} {}", reply.status, reply.start, String::from_utf8_lossy(&reply.body));
                    }
                    ms.push(reply.ms);
                }
                let s = summary(&ms);
                eprintln!("  {name:>9} {config:>8}: p50 {:>9.2} ms  ({} samples)", s["p50_ms"].as_f64().unwrap_or(0.0), ms.len());
                let entry = out.entry(name.to_string()).or_insert_with(|| json!({"requirement": requirement, "import": import}));
                entry[config] =
                    json!({"cold_p50_ms": s["p50_ms"], "cold_p90_ms": s["p90_ms"], "cold_mean_ms": s["mean_ms"], "samples": ms});
            }
            anyhow::Ok(())
        })();
        worker.stop()?;
        result?;
    }
    Ok(Value::Object(out))
}
