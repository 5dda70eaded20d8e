//! `sprout bench asgi`: ASGI apps against WSGI ones, cold and warm, through the real worker on
//! the `sock` back-end: a bare ASGI hello world against a bare WSGI one, and a FastAPI app
//! against a Flask one (from examples/openlambda; the frameworks' packages come from the
//! package index, so their apps fork from package Zygotes).
//!
//! Two workers run at once, pinned to the worker CPU while this generator runs on another:
//! one keeps no sandbox (every request is a cold start: a fork from the Zygote, the entry
//! module loaded, for ASGI asyncio imported unless its Zygote has it, the event loop made and
//! the lifespan probed), one keeps them (warm:
//! the worker, the channel and one request through the server, for ASGI one turn of the loop).
//! Rounds alternate which app goes first; the medians of the rounds' p50 and p99 are compared.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Map, Value};

use crate::load_loop::closed_loop;
use crate::report;
use crate::sandbox_worker::{Options, Worker};

/// The apps compared, by lambda name: each a directory of examples/openlambda. Pairs: WSGI
/// first, then the ASGI app it is compared with.
pub const APPS: [&str; 4] = ["wsgi-hello", "asgi-hello", "post-echo", "fastapi-hello"];
const PAIRS: [(&str, &str, &str); 2] =
    [("asgi_over_wsgi", "asgi-hello", "wsgi-hello"), ("fastapi_over_flask", "fastapi-hello", "post-echo")];

fn examples_dir() -> PathBuf {
    report::bench_dir().parent().map(Path::to_path_buf).unwrap_or_default().join("examples").join("openlambda")
}

/// Run `rounds` alternating rounds of `seconds` per measurement; writes asgi.json, .md, .png.
pub fn run(opts: &Options, rounds: usize) -> Result<Value> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    crate::worker::pin_to(opts.client_cpu)?;
    let (cold, warm) = (Worker::start(opts, "sock", false, 5800)?, Worker::start(opts, "sock", true, 5801)?);
    for app in APPS {
        cold.deploy(opts, &examples_dir().join(app), app)?;
        warm.deploy(opts, &examples_dir().join(app), app)?;
    }
    let seconds = Duration::from_secs_f64(opts.seconds);
    let measured = runtime.block_on(async {
        // Install the frameworks and make their Zygotes before anything is timed.
        for app in APPS {
            let path = format!("/run/{app}");
            closed_loop(cold.port, 1, Duration::ZERO, Duration::from_millis(100), "", &path).await?;
            closed_loop(warm.port, 1, Duration::ZERO, Duration::from_millis(100), "", &path).await?;
        }
        let mut samples: Vec<Vec<[f64; 4]>> = vec![Vec::new(); APPS.len()];
        for round in 0..rounds {
            let mut order: Vec<usize> = (0..APPS.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let path = format!("/run/{}", APPS[i]);
                let c = closed_loop(cold.port, 1, Duration::from_millis(300), seconds, "cold", &path).await?;
                closed_loop(warm.port, 1, Duration::ZERO, Duration::from_millis(200), "", &path).await?;
                let w = closed_loop(warm.port, 1, Duration::from_millis(200), seconds, "warm", &path).await?;
                if c.errors + w.errors > 0 || c.wrong_start + w.wrong_start > 0 {
                    anyhow::bail!(
                        "{}: {} errors, {} requests served cold or warm unlike asked",
                        APPS[i],
                        c.errors + w.errors,
                        c.wrong_start + w.wrong_start
                    );
                }
                eprintln!(
                    "  round {round} {:>10}: cold p50 {:.2} ms p99 {:.2} ms | warm p50 {:.3} ms p99 {:.3} ms",
                    APPS[i],
                    c.ms(0.5),
                    c.ms(0.99),
                    w.ms(0.5),
                    w.ms(0.99)
                );
                samples[i].push([c.ms(0.5), c.ms(0.99), w.ms(0.5), w.ms(0.99)]);
            }
        }
        anyhow::Ok(samples)
    });
    cold.stop()?;
    warm.stop()?;
    let samples = measured?;
    let mut apps = Map::new();
    for (i, app) in APPS.iter().enumerate() {
        let s = &samples[i];
        let m = |k: usize| report::median(s.iter().map(|x| x[k]).collect()).unwrap_or(f64::NAN);
        apps.insert(
            app.to_string(),
            json!({
                "cold_p50_ms": m(0), "cold_p99_ms": m(1), "warm_p50_ms": m(2), "warm_p99_ms": m(3),
                "rounds": s.iter().map(|x| json!({"cold_p50_ms": x[0], "cold_p99_ms": x[1], "warm_p50_ms": x[2], "warm_p99_ms": x[3]})).collect::<Vec<_>>(),
            }),
        );
    }
    let ratio = |a: &str, b: &str, key: &str| apps[a][key].as_f64().unwrap_or(f64::NAN) / apps[b][key].as_f64().unwrap_or(f64::NAN);
    let mut results = json!({
        "machine": report::machine(),
        "method": format!(
            "sprout worker on the sock back-end pinned to CPU {} (sandboxes too), this generator on CPU {}; one client, closed loop, \
             {} s per measurement after a warm-up; {rounds} rounds alternating which app goes first; medians of the rounds' percentiles",
            opts.worker_cpu, opts.client_cpu, opts.seconds
        ),
    });
    for (name, a, b) in PAIRS {
        results[name] = json!({
            "cold_p50": ratio(a, b, "cold_p50_ms"), "cold_p99": ratio(a, b, "cold_p99_ms"),
            "warm_p50": ratio(a, b, "warm_p50_ms"), "warm_p99": ratio(a, b, "warm_p99_ms"),
        });
    }
    results["apps"] = Value::Object(apps);
    report::write(&opts.out_dir, "asgi", &results, &markdown(&results), "plot_asgi.py")?;
    Ok(results)
}

fn markdown(r: &Value) -> String {
    let mut md = format!(
        "# ASGI against WSGI, cold and warm: bare hello worlds, FastAPI against Flask\n\n{}\n\n{}.\n\n| app | cold p50 ms | cold p99 ms | warm p50 ms | warm p99 ms |\n|---|---:|---:|---:|---:|\n",
        r["machine"].as_str().unwrap_or(""),
        r["method"].as_str().unwrap_or("")
    );
    for app in APPS {
        let a = &r["apps"][app];
        let f = |k: &str| a[k].as_f64().unwrap_or(f64::NAN);
        md +=
            &format!("| {app} | {:.2} | {:.2} | {:.3} | {:.3} |\n", f("cold_p50_ms"), f("cold_p99_ms"), f("warm_p50_ms"), f("warm_p99_ms"));
    }
    for (name, a, b) in PAIRS {
        let x = |k: &str| r[name][k].as_f64().unwrap_or(f64::NAN);
        md += &format!(
            "| **{a} ÷ {b}** | **{:.2}×** | **{:.2}×** | **{:.2}×** | **{:.2}×** |\n",
            x("cold_p50"),
            x("cold_p99"),
            x("warm_p50"),
            x("warm_p99")
        );
    }
    md
}
