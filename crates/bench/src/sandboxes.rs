//! `sprout bench sandboxes`: SOCK's figures 14-16 on this machine, through the real worker.
//!
//! For every backend (sock, sock-nozygote, runc, docker) a real worker is started with that
//! backend, pinned with its sandboxes to one CPU while this load generator runs on another,
//! and a no-op lambda is invoked over HTTP:
//!
//! * cold starts: the worker keeps no sandbox (`keep_warm = false`), so each request
//!   provisions one; closed loops at concurrency 1, 2, 5, 10 and 20 give throughput and
//!   latency percentiles per point (figures 14 and 15);
//! * paced cold starts: one request every 10 ms (100/s, open loop: a late one does not delay
//!   the next), the case spares are made for — a worker with CPU time between cold starts;
//! * warm invocations: the sandbox is kept, so each request only crosses the worker and the
//!   channel (figure 16).
//!
//! Every backend runs in the same run, one after another, so ratios compare like with like.
//! `sock` is the lean sandbox as SOCK made it (the host's network, no seccomp filter), with
//! spares (children forked ahead of demand); `sock-nospares` the same forking on demand;
//! `sock-isolated` is what a worker runs by default: each lambda in a network namespace of its
//! own, every process under seccomp. The two are also compared head to head, in alternating
//! rounds, with a service round trip from inside the sandbox ([`crate::isolation`]).

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::load_loop::{closed_loop, paced, Point};
use crate::report::{self, get};
use crate::sandbox_worker::{pin_to, Worker};
pub use crate::sandbox_worker::{Options, BACKENDS};

/// Cold starts per second of the paced point: a worker with CPU time to spare between them
/// (gVisor's, whose forks cost ten times a host's, at the rate its target names).
fn paced_per_s(backend: &str) -> f64 {
    if backend == "gvisor" {
        20.0
    } else {
        100.0
    }
}

fn docker_answers() -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect("/var/run/docker.sock") else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut out = [0u8; 512];
    s.write_all(b"GET /_ping HTTP/1.0\r\n\r\n").is_ok()
        && s.read(&mut out).map(|n| String::from_utf8_lossy(&out[..n]).contains("OK")).unwrap_or(false)
}

/// Start Debian's Docker engine pinned to the worker's CPU, unless one is running.
fn ensure_docker(opts: &Options) -> Result<Option<Child>> {
    if docker_answers() {
        eprintln!("  using the running Docker engine (not pinned by this benchmark)");
        return Ok(None);
    }
    let log = std::fs::File::create(opts.work_dir.join("dockerd.log"))?;
    let cpu = opts.worker_cpu;
    let mut cmd = Command::new("dockerd");
    cmd.args(["--iptables=false", "--bridge=none"]).stdout(log.try_clone()?).stderr(log).stdin(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec; pin_to only fills a CpuSet on the
    // stack and calls sched_setaffinity, which is async-signal-safe, and allocates nothing.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || pin_to(cpu));
    }
    let mut child = cmd.spawn().context("starting dockerd (apt-get install docker.io)")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !docker_answers() {
        if child.try_wait()?.is_some() || Instant::now() > deadline {
            bail!("dockerd did not start; see {}", opts.work_dir.join("dockerd.log").display());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(Some(child))
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH").map(|paths| std::env::split_paths(&paths).any(|p| p.join(program).is_file())).unwrap_or(false)
}

/// The worker's CPU when the worker and the load generator can be kept apart (else None).
fn pinned_worker_cpu(opts: &Options) -> Option<usize> {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    (cpus > opts.worker_cpu.max(opts.client_cpu) && opts.worker_cpu != opts.client_cpu).then_some(opts.worker_cpu)
}

async fn measure_backend(opts: &Options, backend: &str, port: u16) -> Result<Value> {
    let mut out = serde_json::Map::new();
    // A sandbox's life in CPU: what the worker's CPU (the worker, its sandboxes, the kernel's
    // work for them) was busy for, shared by the cold starts; every CPU's when not pinned.
    let worker_cpu = pinned_worker_cpu(opts);
    let cold = Worker::start(opts, backend, false, port)?;
    let result = async {
        let warmup = Duration::from_millis(500);
        let measured = Duration::from_secs_f64(opts.seconds);
        let cold_point = |label: String, p: &Point| -> Result<Value> {
            eprintln!(
                "  {backend:>14} cold {label:<12} {:>8.1}/s  p50 {:>8.2} ms  p99 {:>8.2} ms  ({} ok, {} errors)",
                p.per_s(),
                p.ms(0.5),
                p.ms(0.99),
                p.ok,
                p.errors
            );
            if p.wrong_start > 0 {
                bail!("{} of the {label} cold-start requests were served warm", p.wrong_start);
            }
            Ok(json!({"cold_p50_ms": p.ms(0.5), "cold_p99_ms": p.ms(0.99), "cold_per_s": p.per_s(), "requests": p.ok, "errors": p.errors,
                "cpu_ms_per_cold_start": p.cpu_ms_per_request(worker_cpu)}))
        };
        let first = crate::footprint::first_cold_starts(opts, &cold).await?;
        let first_p50 = crate::report::median(first.clone()).unwrap_or(0.0);
        eprintln!("  {backend:>14} a new lambda's first cold start p50 {first_p50:.1} ms ({first:.1?})");
        out.insert("first_cold_p50_ms".into(), json!(first_p50));
        out.insert("first_cold_ms".into(), json!(first));
        for &c in &opts.concurrency {
            let p = closed_loop(port, c, warmup, measured, "cold", "/run/noop").await?;
            out.insert(format!("c{c}"), cold_point(format!("c={c}"), &p)?);
        }
        // The back-end's figure: at concurrency 10 (where cold starts per second are judged),
        // else at the highest measured.
        let headline = opts.concurrency.iter().copied().find(|&c| c == 10).or_else(|| opts.concurrency.iter().copied().max());
        if let Some(cpu) = headline.and_then(|c| out[&format!("c{c}")]["cpu_ms_per_cold_start"].as_f64()) {
            eprintln!("  {backend:>14} CPU per sandbox life (cold start, request, teardown) {cpu:.2} ms");
            out.insert("cpu_ms_per_cold_start".into(), json!(cpu));
        }
        let per_s = paced_per_s(backend);
        let p = paced(port, per_s, warmup, measured, "cold", "/run/noop").await?;
        let mut paced_point = cold_point(format!("{per_s}/s paced"), &p)?;
        paced_point["per_s"] = json!(per_s);
        out.insert("paced".into(), paced_point);
        anyhow::Ok(())
    }
    .await;
    cold.stop()?;
    result?;
    let warm = Worker::start(opts, backend, true, port)?;
    let result = async {
        // Docker's containers are in its own cgroups, which this does not weigh.
        if backend != "docker" {
            let idle = crate::footprint::idle_pss_mib(opts, &warm).await?;
            eprintln!("  {backend:>14} an idle lambda adds {idle:.1} MiB PSS");
            out.insert("idle_pss_mib".into(), json!(idle));
        }
        // Prime the sandbox, then time requests that reuse it.
        closed_loop(port, 1, Duration::ZERO, Duration::from_millis(300), "", "/run/noop").await?;
        let p = closed_loop(port, 1, Duration::from_millis(200), Duration::from_secs_f64(opts.seconds), "warm", "/run/noop").await?;
        eprintln!("  {backend:>14} warm c=1   {:>8.1}/s  p50 {:>8.3} ms  p99 {:>8.3} ms", p.per_s(), p.ms(0.5), p.ms(0.99));
        out.insert("warm_p50_ms".into(), json!(p.ms(0.5)));
        out.insert("warm_p99_ms".into(), json!(p.ms(0.99)));
        out.insert("warm_per_s".into(), json!(p.per_s()));
        out.insert("warm_requests".into(), json!(p.ok));
        anyhow::Ok(())
    }
    .await;
    warm.stop()?;
    result?;
    if backend == "gvisor" {
        out.insert("park".into(), crate::parking::measure(opts, port + 100).await?);
    }
    Ok(Value::Object(out))
}

/// Run the benchmark; writes sandboxes.json, .md and .png under `opts.out_dir`.
pub fn run(opts: &Options) -> Result<Value> {
    std::fs::create_dir_all(&opts.work_dir)?;
    let pinned = pinned_worker_cpu(opts).is_some();
    if pinned {
        pin_to(opts.client_cpu)?;
    } else {
        eprintln!("warning: cannot put the worker and the load generator on separate CPUs here");
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut backends = serde_json::Map::new();
    let mut docker_engine = None;
    for (i, backend) in opts.backends.iter().enumerate() {
        eprintln!("{backend}:");
        let skip = match backend.as_str() {
            "runc" if !which("runc") => Some("runc is not installed (apt-get install runc)".to_string()),
            "docker" => match ensure_docker(opts) {
                Ok(engine) => {
                    docker_engine = engine;
                    None
                }
                Err(e) => Some(format!("{e:#}")),
            },
            _ => None,
        };
        let result = match skip {
            Some(reason) => Err(anyhow::anyhow!(reason)),
            None => runtime.block_on(measure_backend(opts, backend, 5600 + i as u16)),
        };
        match result {
            Ok(v) => {
                backends.insert(backend.clone(), v);
            }
            Err(e) => {
                eprintln!("  skipped: {e:#}");
                backends.insert(backend.clone(), json!({"skipped": format!("{e:#}")}));
            }
        }
    }
    let isolation = if crate::isolation::VARIANTS.iter().all(|v| opts.backends.iter().any(|b| b == v)) {
        eprintln!("sock against sock-isolated, alternating rounds:");
        match runtime.block_on(crate::isolation::compare(opts, 5700, 5, crate::isolation::VARIANTS, "isolated_over_sock")) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("  failed: {e:#}");
                json!({"skipped": format!("{e:#}")})
            }
        }
    } else {
        Value::Null
    };
    let second_kernel = if crate::isolation::SECOND_KERNEL.iter().all(|v| opts.backends.iter().any(|b| b == v)) {
        eprintln!("sock-isolated against gvisor, alternating rounds:");
        let compared = crate::isolation::compare(opts, 5710, 5, crate::isolation::SECOND_KERNEL, "gvisor_over_isolated");
        runtime.block_on(compared).unwrap_or_else(|e| {
            eprintln!("  failed: {e:#}");
            json!({"skipped": format!("{e:#}")})
        })
    } else {
        Value::Null
    };
    if let Some(mut engine) = docker_engine {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(engine.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = engine.wait();
    }
    let mut results = summarize(opts, backends, pinned);
    add_isolation(&mut results, isolation);
    crate::second_kernel::add(&mut results, second_kernel);
    report::write(&opts.out_dir, "sandboxes", &results, &markdown(&results), "plot_sandboxes.py")?;
    Ok(results)
}

fn summarize(opts: &Options, backends: serde_json::Map<String, Value>, pinned: bool) -> Value {
    let backends = Value::Object(backends);
    let b = &backends;
    let ratio = |a: &[&str], c: &[&str]| match (get(b, a), get(b, c)) {
        (Some(x), Some(y)) if y > 0.0 => json!(x / y),
        _ => Value::Null,
    };
    let ratios = json!({
        "sock_over_runc_cold_per_s_c10": ratio(&["sock", "c10", "cold_per_s"], &["runc", "c10", "cold_per_s"]),
        "sock_over_docker_cold_per_s_c10": ratio(&["sock", "c10", "cold_per_s"], &["docker", "c10", "cold_per_s"]),
        "sock_over_nozygote_cold_per_s_c10": ratio(&["sock", "c10", "cold_per_s"], &["sock-nozygote", "c10", "cold_per_s"]),
        "runc_over_sock_cold_p50_c1": ratio(&["runc", "c1", "cold_p50_ms"], &["sock", "c1", "cold_p50_ms"]),
        "docker_over_sock_cold_p50_c1": ratio(&["docker", "c1", "cold_p50_ms"], &["sock", "c1", "cold_p50_ms"]),
        "sock_cold_over_warm_p50": ratio(&["sock", "c1", "cold_p50_ms"], &["sock", "warm_p50_ms"]),
        "nospares_over_sock_paced_p50": ratio(&["sock-nospares", "paced", "cold_p50_ms"], &["sock", "paced", "cold_p50_ms"]),
        "nospares_over_sock_cold_p50_c1": ratio(&["sock-nospares", "c1", "cold_p50_ms"], &["sock", "c1", "cold_p50_ms"]),
        "sock_over_nospares_cold_per_s_c10": ratio(&["sock", "c10", "cold_per_s"], &["sock-nospares", "c10", "cold_per_s"]),
    });
    let target = |name: &str, measured: Value, met: Option<bool>| json!({"target": name, "measured": measured, "met": met});
    let cmp = |v: Option<f64>, f: &dyn Fn(f64) -> bool| v.map(f);
    let targets = vec![
        target(
            "sock cold start p50 <= 5 ms at concurrency 1",
            json!(get(b, &["sock", "c1", "cold_p50_ms"])),
            cmp(get(b, &["sock", "c1", "cold_p50_ms"]), &|x| x <= 5.0),
        ),
        target(
            ">= 10x runc's cold-start throughput at concurrency 10",
            ratios["sock_over_runc_cold_per_s_c10"].clone(),
            cmp(ratios["sock_over_runc_cold_per_s_c10"].as_f64(), &|x| x >= 10.0),
        ),
        target(
            ">= 50x docker's cold-start throughput at concurrency 10",
            ratios["sock_over_docker_cold_per_s_c10"].clone(),
            cmp(ratios["sock_over_docker_cold_per_s_c10"].as_f64(), &|x| x >= 50.0),
        ),
        target(
            "warm invocation p50 <= 0.5 ms",
            json!(get(b, &["sock", "warm_p50_ms"])),
            cmp(get(b, &["sock", "warm_p50_ms"]), &|x| x <= 0.5),
        ),
        target(
            ">= 200 cold starts per second at concurrency 10",
            json!(get(b, &["sock", "c10", "cold_per_s"])),
            cmp(get(b, &["sock", "c10", "cold_per_s"]), &|x| x >= 200.0),
        ),
        target(
            "cold start p50 <= 1 ms at concurrency 1 (closed loop: no idle CPU to warm spares in)",
            json!(get(b, &["sock", "c1", "cold_p50_ms"])),
            cmp(get(b, &["sock", "c1", "cold_p50_ms"]), &|x| x <= 1.0),
        ),
        target(
            "cold start p50 <= 1 ms at 100 cold starts/s (paced)",
            json!(get(b, &["sock", "paced", "cold_p50_ms"])),
            cmp(get(b, &["sock", "paced", "cold_p50_ms"]), &|x| x <= 1.0),
        ),
        target(
            ">= 1,000 cold starts per second at concurrency 10 on one core",
            json!(get(b, &["sock", "c10", "cold_per_s"])),
            cmp(get(b, &["sock", "c10", "cold_per_s"]), &|x| x >= 1000.0),
        ),
        target(
            "spares do not cost saturated throughput: >= 0.95x sock-nospares' cold starts/s at c=10",
            ratios["sock_over_nospares_cold_per_s_c10"].clone(),
            cmp(ratios["sock_over_nospares_cold_per_s_c10"].as_f64(), &|x| x >= 0.95),
        ),
    ];
    json!({
        "machine": report::machine(),
        "method": {
            "lambda": "no-op f(event) returning None, POST /run/noop over HTTP/1.1 keep-alive",
            "cold": format!("keep_warm = false: one new sandbox per request; closed loop, {} s per point after 0.5 s of warm-up", opts.seconds),
            "paced": format!("keep_warm = false; one request every {:.0} ms (gvisor: {:.0} ms) on one connection, sent at once when the one before ran late; {} s after 0.5 s of warm-up", 1000.0 / paced_per_s("sock"), 1000.0 / paced_per_s("gvisor"), opts.seconds),
            "first_cold": format!("{} no-op lambdas deployed one after another to the cold worker, each one's first request timed (gvisor: its pod starts too); the median", crate::footprint::FIRST_LAMBDAS),
            "idle_pss": format!("PSS of every process in the warm worker's cgroups, each address space once (sandboxes, Zygotes and spares; gVisor's pods: Sentry, gofer, Zygote, handler, and spares until the pod lets them go, [gvisor] spares_idle_ms = 2000), after {n} no-op lambdas' first requests, less before them, each after {s} s still; divided by {n}", s = crate::footprint::SETTLE.as_secs(), n = crate::footprint::IDLE_LAMBDAS),
            "warm": "keep_warm = true: the same sandbox serves every request; concurrency 1",
            "cpu_per_cold_start": "the busy time (user, nice, system, irq, softirq in /proc/stat) of the worker's CPU over a cold point's measured seconds, divided by its cold starts: the worker, its sandboxes and the kernel's work for them, whole lives (start, request, teardown); every CPU's when not pinned. The back-end's figure is at concurrency 10",
            "pinning": if pinned {
                format!("worker and its sandboxes on CPU {} (affinity inherited by the Zygote, runc and containers; runc and docker containers also get cpuset {0}; a dockerd started by the benchmark too); load generator on CPU {}", opts.worker_cpu, opts.client_cpu)
            } else {
                "none: fewer than two CPUs".to_string()
            },
        },
        "settings": opts.settings,
        "backends": backends,
        "ratios": ratios,
        "targets": targets,
    })
}

/// The head-to-head comparison and its promises: isolation costs at most 10% of a cold or
/// warm start.
fn add_isolation(results: &mut Value, isolation: Value) {
    if isolation.is_null() {
        return;
    }
    let ratio = |key: &str| isolation["isolated_over_sock"][key].as_f64();
    let targets = results["targets"].as_array_mut().expect("targets");
    for (name, key) in [
        ("isolated sandbox cold start p50 <= 1.1x sock's (alternating rounds)", "cold_p50"),
        ("isolated sandbox warm invocation p50 <= 1.1x sock's (alternating rounds)", "warm_p50"),
    ] {
        targets.push(json!({"target": name, "measured": ratio(key), "met": ratio(key).map(|r| r <= 1.1)}));
    }
    results["isolation"] = isolation;
}

fn markdown(r: &Value) -> String {
    let f = |v: Option<f64>, digits: usize| v.map(|x| format!("{x:.digits$}")).unwrap_or_else(|| "—".into());
    let mut s = format!("Machine: {}. {}\n\n", r["machine"].as_str().unwrap_or(""), r["method"]["pinning"].as_str().unwrap_or(""));
    s += "| backend | cold p50 c=1 (ms) | cold p99 c=1 (ms) | cold/s c=1 | cold p50 c=10 (ms) | cold/s c=10 | CPU per sandbox life (ms) | cold p50 / p99 paced (ms) | warm p50 (ms) | a new lambda's first cold p50 (ms) | idle lambda (MiB PSS) |\n";
    s += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    if let Some(backends) = r["backends"].as_object() {
        let order: BTreeMap<usize, (&String, &Value)> =
            backends.iter().map(|(k, v)| (BACKENDS.iter().position(|b| b == k).unwrap_or(99), (k, v))).collect();
        for (_, (name, v)) in order {
            if let Some(reason) = v.get("skipped").and_then(|x| x.as_str()) {
                s += &format!("| {name} | skipped: {reason} ||||||||||\n");
                continue;
            }
            s += &format!(
                "| {name} | {} | {} | {} | {} | {} | {} | {} / {} at {}/s | {} | {} | {} |\n",
                f(get(v, &["c1", "cold_p50_ms"]), 2),
                f(get(v, &["c1", "cold_p99_ms"]), 2),
                f(get(v, &["c1", "cold_per_s"]), 1),
                f(get(v, &["c10", "cold_p50_ms"]), 2),
                f(get(v, &["c10", "cold_per_s"]), 1),
                f(get(v, &["cpu_ms_per_cold_start"]), 2),
                f(get(v, &["paced", "cold_p50_ms"]), 2),
                f(get(v, &["paced", "cold_p99_ms"]), 2),
                f(get(v, &["paced", "per_s"]), 0),
                f(get(v, &["warm_p50_ms"]), 3),
                f(get(v, &["first_cold_p50_ms"]), 1),
                f(get(v, &["idle_pss_mib"]), 1),
            );
        }
    }
    let iso = &r["isolation"];
    if iso.get("sock").is_some() {
        s += &format!(
            "\nHead to head, {} alternating rounds (medians of the rounds' p50s; the service is a TCP echo on the load generator's CPU, reached from inside a warm sandbox):\n\n",
            iso["rounds"]
        );
        s += "| sandbox | cold p50 (ms) | warm p50 (ms) | service round trip p50 / p99 (µs) | new connection + round trip p50 / p99 (µs) |\n|---|---:|---:|---:|---:|\n";
        for name in crate::isolation::VARIANTS {
            let v = &iso[name];
            s += &format!(
                "| {name} | {} | {} | {} / {} | {} / {} |\n",
                f(v["cold_p50_ms"].as_f64(), 2),
                f(v["warm_p50_ms"].as_f64(), 3),
                f(v["service_rtt_p50_us"].as_f64(), 1),
                f(v["service_rtt_p99_us"].as_f64(), 1),
                f(v["service_connect_p50_us"].as_f64(), 1),
                f(v["service_connect_p99_us"].as_f64(), 1),
            );
        }
        let ratio = |k: &str| f(iso["isolated_over_sock"][k].as_f64(), 3);
        s += &format!(
            "| isolated ÷ sock | {} | {} | {} | {} |\n",
            ratio("cold_p50"),
            ratio("warm_p50"),
            ratio("service_rtt_p50"),
            ratio("service_connect_p50")
        );
    }
    let park = &r["backends"]["gvisor"]["park"];
    if park.get("background").is_some() {
        let side = |k: &str| {
            let v = &park[k];
            format!(
                "{} ms | {} / {} ms | {} ms | {} MiB",
                f(v["park_ms"].as_f64(), 1),
                f(v["restore_parked_p50_ms"].as_f64(), 1),
                f(v["restore_parked_p99_ms"].as_f64(), 1),
                f(v["restore_only_p50_ms"].as_f64(), 1),
                f(v["parked_image_mib"].as_f64(), 1)
            )
        };
        s += &format!(
            "\ngVisor pods parked to disk and restored by their next request, {} rounds alternating the two ways of restoring, {} parks each (one more parked pod weighs {} MiB PSS):\n\n",
            park["rounds"],
            park["parks_per_round"],
            f(park["parked_pss_mib"].as_f64(), 1)
        );
        s += "| restore | park p50 | next request p50 / p99 | the restore alone p50 | image |\n|---|---:|---:|---:|---:|\n";
        s += &format!("| memory loaded in the background | {} |\n", side("background"));
        s += &format!("| memory loaded first | {} |\n", side("foreground"));
    }
    let second = &r["second_kernel"];
    if second.get("gvisor").is_some() {
        s += &format!("\nA second kernel, head to head: the isolated lean sandbox against gVisor's, {} alternating rounds (medians of the rounds' p50s):\n\n", second["rounds"]);
        s += "| sandbox | cold p50 (ms) | warm p50 (ms) | service round trip p50 (µs) | new connection + round trip p50 (µs) |\n|---|---:|---:|---:|---:|\n";
        for name in crate::isolation::SECOND_KERNEL {
            let v = &second[name];
            s += &format!(
                "| {name} | {} | {} | {} | {} |\n",
                f(v["cold_p50_ms"].as_f64(), 2),
                f(v["warm_p50_ms"].as_f64(), 3),
                f(v["service_rtt_p50_us"].as_f64(), 1),
                f(v["service_connect_p50_us"].as_f64(), 1)
            );
        }
        let ratio = |k: &str| f(second["gvisor_over_isolated"][k].as_f64(), 2);
        s += &format!(
            "| gvisor ÷ isolated | {} | {} | {} | {} |\n",
            ratio("cold_p50"),
            ratio("warm_p50"),
            ratio("service_rtt_p50"),
            ratio("service_connect_p50")
        );
    }
    s += &report::targets_table(&r["targets"], 2);
    s
}
