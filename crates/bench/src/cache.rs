//! `sprout bench cache`: EbbRT's memcached experiment (figures 4 and 6) on this machine —
//! Debian's memcached and the Sprout cache side by side, each on the same cores, under
//! memaslap (Debian's `memcaslap`, the generator EbbRT used) with a 9:1 get:set mix:
//! throughput and latency while connections grow, and while values grow at 64 connections.
//!
//! One server runs at a time, pinned to the same CPUs as the other will be, started afresh
//! (empty) for each round: a server that kept an earlier point's items would answer another
//! workload (memcached, its memory assigned to small values' slab classes, refuses to store
//! 16 KiB values and answers most gets with a miss, which costs it less than serving the
//! value; Sprout evicts small items to store them), and an idle second server beside it moved
//! a point by up to 2x. Each run reports its get hit ratio, so equal work can be checked. At
//! each point the rounds alternate which server goes first, so drift in the machine's speed
//! falls on both; the median of the rounds is reported, with the spread of the per-round
//! ratios (each Sprout round over the memcached round beside it). memaslap reports latency as a
//! histogram of power-of-two buckets; p50 and p99 are interpolated within their bucket
//! (accurate to the bucket, a factor of two: compare them, do not quote them alone).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use crate::report;

#[derive(Clone, Debug)]
pub struct Options {
    pub out_dir: PathBuf,
    pub sprout: PathBuf,
    /// Core budgets (server cores), e.g. [1, 2].
    pub cores: Vec<usize>,
    pub connections: Vec<usize>,
    pub value_sizes: Vec<usize>,
    /// Connections of the value-size sweep (EbbRT's peak: 64).
    pub value_connections: usize,
    /// Value size of the connection sweep.
    pub small_value: usize,
    pub seconds: u64,
    pub repeats: usize,
    /// CPU for the generators.
    pub client_cpu: usize,
    /// Also run Sprout's own generator (exact latencies) at every point.
    pub exact: bool,
}

/// One memaslap run.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    ops_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    avg_us: f64,
    /// Gets that found their item, of all gets (memaslap's `get_misses` and `cmd_get`).
    get_hit_ratio: f64,
    /// Requests that found their core polling rather than asleep, of all (Sprout's `stats
    /// cores` polls_spun_found over the run's operations; NaN where not reported).
    polled_share: f64,
}

const SYSTEMS: [&str; 2] = ["memcached", "sprout"];

/// A running server under test.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
}

/// `shared_cpu`: the generator runs on one of `cpus`, so Sprout's threads float over them
/// (as memcached's always do) instead of pinning one core's loop beside the generator.
fn start(system: &str, sprout: &Path, cpus: &[usize], shared_cpu: bool) -> Result<Server> {
    let port = free_port()?;
    let threads = cpus.len().to_string();
    let mut cmd = Command::new("taskset");
    cmd.arg("-c").arg(cpu_list(cpus));
    match system {
        "memcached" => {
            cmd.arg("memcached").args(["-u", "nobody", "-l", "127.0.0.1", "-U", "0", "-m", "1024", "-c", "4096", "-t", &threads]);
            cmd.arg("-p").arg(port.to_string());
        }
        _ => {
            cmd.arg(sprout).args(["cache", "serve", "-l", "127.0.0.1", "-m", "1024", "-c", "4096", "-t", &threads]);
            cmd.arg("-p").arg(port.to_string()).arg("--cpus").arg(cpu_list(cpus));
            if shared_cpu {
                cmd.arg("--no-pin");
            }
        }
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {system} (scripts/setup.sh installs memcached)"))?;
    let server = Server { child, port };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("{system} did not listen on port {port} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(server)
}

/// memaslap's configuration: 32-byte keys, fixed-size values, 9 gets to each set.
fn write_config(dir: &Path, value: usize) -> Result<PathBuf> {
    let path = dir.join(format!("memaslap-{value}.cnf"));
    std::fs::write(&path, format!("key\n32 32 1\nvalue\n{value} {value} 1\ncmd\n0 0.1\n1 0.9\n"))?;
    Ok(path)
}

fn memaslap(port: u16, conns: usize, config: &Path, seconds: u64, cpu: usize) -> Result<Run> {
    let output = Command::new("taskset")
        .args(["-c", &cpu.to_string(), "memcaslap", "-T", "1"])
        .arg("-s")
        .arg(format!("127.0.0.1:{port}"))
        .arg("-c")
        .arg(conns.to_string())
        .arg("-F")
        .arg(config)
        .arg("-t")
        .arg(format!("{seconds}s"))
        .arg("-S")
        .arg(format!("{seconds}s"))
        .output()
        .context("running memcaslap (Debian's libmemcached-tools; scripts/setup.sh installs it)")?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    parse_memaslap(&text).with_context(|| format!("reading memaslap's output:\n{text}"))
}

/// The run's TPS and its "Total Statistics" latency histogram.
fn parse_memaslap(text: &str) -> Result<Run> {
    let tps = text
        .lines()
        .rev()
        .find_map(|l| l.split("TPS:").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|v| v.parse::<f64>().ok()))
        .context("no TPS line")?;
    // The last "Total Statistics" block is the histogram of the whole run.
    let total = text.rsplit("Total Statistics").next().filter(|_| text.contains("Total Statistics")).context("no Total Statistics")?;
    let avg = total.lines().find_map(|l| l.trim().strip_prefix("Avg:")).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0);
    // "Log2 Dist:" then lines "  4:   0  56 1864 112671": counts for exponents 4..7; a
    // latency v (µs) falls in exponent e when 2^(e-1) <= v < 2^e.
    let mut buckets: Vec<(u32, u64)> = Vec::new();
    let dist = total.split("Log2 Dist:").nth(1).context("no Log2 Dist")?;
    for line in dist.lines().skip(1) {
        let Some((start, counts)) = line.split_once(':') else {
            break;
        };
        let Ok(start) = start.trim().parse::<u32>() else {
            break;
        };
        for (i, c) in counts.split_whitespace().enumerate() {
            buckets.push((start + i as u32, c.parse().unwrap_or(0)));
        }
    }
    let total_count: u64 = buckets.iter().map(|(_, c)| c).sum();
    if total_count == 0 {
        bail!("an empty latency histogram");
    }
    let percentile = |p: f64| {
        let target = p * total_count as f64;
        let mut seen = 0.0;
        for &(e, c) in &buckets {
            if c == 0 {
                continue;
            }
            if seen + c as f64 >= target {
                let low = if e == 0 { 0.0 } else { 2f64.powi(e as i32 - 1) };
                let high = 2f64.powi(e as i32);
                return low + (high - low) * ((target - seen) / c as f64);
            }
            seen += c as f64;
        }
        2f64.powi(buckets.last().map(|b| b.0).unwrap_or(0) as i32)
    };
    // The run's totals come last: "cmd_get: 454128" and "get_misses: 279865".
    let last = |name: &str| text.lines().rev().find_map(|l| l.trim().strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()));
    let get_hit_ratio = match (last("cmd_get:"), last("get_misses:")) {
        (Some(gets), Some(misses)) if gets > 0.0 => 1.0 - misses / gets,
        _ => f64::NAN,
    };
    Ok(Run { ops_per_s: tps, p50_us: percentile(0.50), p99_us: percentile(0.99), avg_us: avg, get_hit_ratio, polled_share: f64::NAN })
}

/// Sprout's polls that found work in a polling window, summed over its cores (`stats cores`);
/// None from a server that does not count them (memcached, an older build under --server).
fn polls_found(port: u16) -> Option<u64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"stats cores\r\n").ok()?;
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    while !text.ends_with(b"END\r\n") && !text.ends_with(b"ERROR\r\n") {
        let n = s.read(&mut buf).ok().filter(|n| *n > 0)?;
        text.extend_from_slice(&buf[..n]);
    }
    let found = String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| l.strip_prefix("STAT core:"))
        .filter_map(|l| l.split_once(":polls_spun_found "))
        .filter_map(|(_, n)| n.trim().parse::<u64>().ok())
        .collect::<Vec<_>>();
    (!found.is_empty()).then(|| found.iter().sum())
}

/// `run`, with the share of its operations Sprout served from a polling window.
fn with_polled_share(port: u16, seconds: f64, run: impl FnOnce() -> Result<Run>) -> Result<Run> {
    let before = polls_found(port);
    let mut r = run()?;
    r.polled_share = match (before, polls_found(port)) {
        (Some(a), Some(b)) if r.ops_per_s > 0.0 => ((b - a) as f64 / (r.ops_per_s * seconds)).min(1.0),
        _ => f64::NAN,
    };
    Ok(r)
}

fn median(v: Vec<f64>) -> f64 {
    report::median(v).unwrap_or(0.0)
}

fn summarize(runs: &[Run]) -> Value {
    json!({
        "ops_per_s": median(runs.iter().map(|r| r.ops_per_s).collect()).round(),
        "p50_us": (median(runs.iter().map(|r| r.p50_us).collect()) * 10.0).round() / 10.0,
        "p99_us": (median(runs.iter().map(|r| r.p99_us).collect()) * 10.0).round() / 10.0,
        "avg_us": median(runs.iter().map(|r| r.avg_us).collect()),
        "get_hit_ratio": runs.iter().map(|r| r.get_hit_ratio).filter(|h| h.is_finite()).reduce(f64::min).map(|h| (h * 1000.0).round() / 1000.0),
        "runs_ops_per_s": runs.iter().map(|r| r.ops_per_s).collect::<Vec<_>>(),
        "polled_share": runs.iter().map(|r| r.polled_share).any(f64::is_finite)
            .then(|| (median(runs.iter().map(|r| r.polled_share).filter(|p| p.is_finite()).collect()) * 1000.0).round() / 1000.0),
    })
}

/// Sprout's generator, on its own thread pinned to the client CPU.
fn exact_run(port: u16, conns: usize, value: usize, opts: &Options) -> Result<Run> {
    let (cpu, seconds) = (opts.client_cpu, opts.seconds as f64);
    let r = std::thread::spawn(move || {
        let _ = crate::worker::pin_to(cpu);
        crate::cache_load::run(([127, 0, 0, 1], port).into(), conns, value, 10_000, seconds)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the load generator panicked"))??;
    Ok(Run {
        ops_per_s: r.ops_per_s,
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        avg_us: r.mean_us,
        get_hit_ratio: f64::NAN,
        polled_share: f64::NAN,
    })
}

/// Run one point on both servers, started afresh on `cpus`, `repeats` times, alternating
/// which goes first.
fn point(cpus: &[usize], conns: usize, value: usize, config: &Path, opts: &Options, label: &str) -> Result<Value> {
    let shared_cpu = cpus.contains(&opts.client_cpu);
    let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
    let mut exact: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
    for r in 0..opts.repeats {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            // Alone on the machine, and empty: the other server is stopped.
            let server = start(SYSTEMS[i], &opts.sprout, cpus, shared_cpu)?;
            let seconds = opts.seconds as f64;
            runs[i].push(with_polled_share(server.port, seconds, || memaslap(server.port, conns, config, opts.seconds, opts.client_cpu))?);
            if opts.exact {
                exact[i].push(with_polled_share(server.port, seconds, || exact_run(server.port, conns, value, opts))?);
            }
        }
    }
    let mut entry = Map::new();
    let spread = |runs: &[Vec<Run>; 2]| {
        let ratios: Vec<f64> = runs[1].iter().zip(&runs[0]).map(|(s, m)| s.ops_per_s / m.ops_per_s.max(1.0)).collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(0.0, f64::max);
        json!([(lo * 1000.0).round() / 1000.0, (hi * 1000.0).round() / 1000.0])
    };
    entry.insert("round_ratio_range".into(), spread(&runs));
    if opts.exact {
        entry.insert("exact_round_ratio_range".into(), spread(&exact));
    }
    for (i, system) in SYSTEMS.iter().enumerate() {
        let mut summary = summarize(&runs[i]);
        if opts.exact {
            summary["exact"] = summarize(&exact[i]);
        }
        entry.insert(system.to_string(), summary);
    }
    if opts.exact {
        let e = |s: &str| entry[s]["exact"]["ops_per_s"].as_f64().unwrap_or(0.0);
        let ratio = e("sprout") / e("memcached").max(1.0);
        entry.insert("exact_sprout_over_memcached".into(), json!((ratio * 1000.0).round() / 1000.0));
    }
    let ratio = entry["sprout"]["ops_per_s"].as_f64().unwrap_or(0.0) / entry["memcached"]["ops_per_s"].as_f64().unwrap_or(1.0).max(1.0);
    entry.insert("sprout_over_memcached".into(), json!((ratio * 1000.0).round() / 1000.0));
    if opts.exact {
        eprintln!(
            "  {label:<22} exact: memcached {:>9.0} ops/s p50 {:>6.1} p99 {:>7.1} µs | sprout {:>9.0} ops/s p50 {:>6.1} p99 {:>7.1} µs",
            entry["memcached"]["exact"]["ops_per_s"].as_f64().unwrap_or(0.0),
            entry["memcached"]["exact"]["p50_us"].as_f64().unwrap_or(0.0),
            entry["memcached"]["exact"]["p99_us"].as_f64().unwrap_or(0.0),
            entry["sprout"]["exact"]["ops_per_s"].as_f64().unwrap_or(0.0),
            entry["sprout"]["exact"]["p50_us"].as_f64().unwrap_or(0.0),
            entry["sprout"]["exact"]["p99_us"].as_f64().unwrap_or(0.0),
        );
    }
    eprintln!(
        "  {label:<22} memaslap: memcached {:>9.0} ops/s p99 {:>7.1} µs | sprout {:>9.0} ops/s p99 {:>7.1} µs | ×{ratio:.2} | polled {:.0}%",
        entry["memcached"]["ops_per_s"].as_f64().unwrap_or(0.0),
        entry["memcached"]["p99_us"].as_f64().unwrap_or(0.0),
        entry["sprout"]["ops_per_s"].as_f64().unwrap_or(0.0),
        entry["sprout"]["p99_us"].as_f64().unwrap_or(0.0),
        entry["sprout"]["polled_share"].as_f64().unwrap_or(f64::NAN) * 100.0,
    );
    Ok(Value::Object(entry))
}

pub fn run(opts: &Options) -> Result<Value> {
    let work = std::env::temp_dir().join("sprout-bench-cache");
    std::fs::create_dir_all(&work)?;
    let mut cores_json = Map::new();
    let started = Instant::now();
    for &budget in &opts.cores {
        let cpus: Vec<usize> = (0..budget).collect();
        eprintln!("== {budget} core(s): servers on CPUs {cpus:?}, memaslap on CPU {}", opts.client_cpu);
        let mut by_conns = Map::new();
        let small = write_config(&work, opts.small_value)?;
        for &conns in &opts.connections {
            by_conns.insert(
                conns.to_string(),
                point(&cpus, conns, opts.small_value, &small, opts, &format!("{conns} conns, {} B", opts.small_value))?,
            );
        }
        let mut by_size = Map::new();
        for &size in &opts.value_sizes {
            let config = write_config(&work, size)?;
            by_size.insert(
                size.to_string(),
                point(&cpus, opts.value_connections, size, &config, opts, &format!("{} conns, {size} B", opts.value_connections))?,
            );
        }
        cores_json.insert(budget.to_string(), json!({ "cpus": cpus, "connections": by_conns, "value_bytes": by_size }));
    }
    let results = json!({
        "machine": report::machine(),
        "generator": "memaslap (Debian's memcaslap, libmemcached-tools), 1 thread, 9:1 get:set, 32-byte keys",
        "exact_generator": if opts.exact { "sprout-bench's own: 1 pinned thread, closed loop, one request in flight per connection, 9:1 get:set over 10,000 31-byte keys, latency of every request in an HdrHistogram (field `exact`)" } else { "not run" },
        "method": {
            "pinning": format!("servers confined to CPUs 0..cores (taskset); memaslap on CPU {}; sprout pins each core's thread to its CPU, except with 2 server cores, where the generator shares CPU 1 and both servers' threads float over CPUs 0-1 (sprout --no-pin, memcached's default); both run their defaults: memcached sleeps whenever idle; Sprout too, except that a core polls up to 200 µs for the next request of a client that alone keeps it busy (--lone-spin-us 200; --spin-us 0), and places each connection on the core with the fewest", opts.client_cpu),
            "seconds_per_run": opts.seconds,
            "repeats": opts.repeats,
            "statistic": "median of the rounds; the two servers alternate which runs first; round_ratio_range: the lowest and highest of the per-round ratios (each sprout round over the memcached round of the same repeat)",
            "servers": "one at a time, each started afresh (empty) for its round; get_hit_ratio is the lowest of the rounds'",
            "latency": "memaslap's power-of-two histogram, percentiles interpolated within the bucket",
            "small_value_bytes": opts.small_value,
            "value_sweep_connections": opts.value_connections,
        },
        "memcached_version": memcached_version(),
        "elapsed_s": started.elapsed().as_secs(),
        "cores": cores_json,
    });
    report::write(&opts.out_dir, "cache", &results, &markdown(&results), "plot_cache.py")?;
    Ok(results)
}

fn memcached_version() -> String {
    Command::new("memcached").arg("-V").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default()
}

fn markdown(r: &Value) -> String {
    let mut md = format!(
        "# Cache: Sprout against memcached (EbbRT figures 4 and 6)\n\n{}\n\nmemaslap: {}. Exact: {}. {}.\n",
        r["machine"].as_str().unwrap_or(""),
        r["generator"].as_str().unwrap_or(""),
        r["exact_generator"].as_str().unwrap_or(""),
        r["method"]["pinning"].as_str().unwrap_or(""),
    );
    let Some(cores) = r["cores"].as_object() else {
        return md;
    };
    for (budget, c) in cores {
        for (sweep, title) in [("connections", "connections"), ("value_bytes", "value bytes")] {
            md += &format!(
                "\n## {budget} core(s), by {title}\n\n| {title} | memcached ops/s | sprout ops/s | ratio | rounds' ratios | get hits, memcached / sprout | p50 / p99 µs, memcached | p50 / p99 µs, sprout | exact ratio | exact p50 / p99 µs, memcached | exact p50 / p99 µs, sprout |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
            );
            let Some(points) = c[sweep].as_object() else {
                continue;
            };
            let mut keys: Vec<&String> = points.keys().collect();
            keys.sort_by_key(|k| k.parse::<usize>().unwrap_or(0));
            for k in keys {
                let p = &points[k];
                let f = |s: &str, f: &str| p[s][f].as_f64().unwrap_or(0.0);
                let e = |s: &str, f: &str| p[s]["exact"][f].as_f64().unwrap_or(0.0);
                let range = |f: &str| p[f][0].as_f64().zip(p[f][1].as_f64()).map_or("-".to_string(), |(lo, hi)| format!("{lo:.2}-{hi:.2}"));
                let hits = |s: &str| p[s]["get_hit_ratio"].as_f64().map_or("-".to_string(), |h| format!("{:.0}%", h * 100.0));
                md += &format!(
                    "| {k} | {:.0} | {:.0} | **{:.2}×** | {} | {} / {} | {:.0} / {:.0} | {:.0} / {:.0} | **{:.2}×** | {:.0} / {:.0} | {:.0} / {:.0} |\n",
                    f("memcached", "ops_per_s"),
                    f("sprout", "ops_per_s"),
                    p["sprout_over_memcached"].as_f64().unwrap_or(0.0),
                    range("round_ratio_range"),
                    hits("memcached"),
                    hits("sprout"),
                    f("memcached", "p50_us"),
                    f("memcached", "p99_us"),
                    f("sprout", "p50_us"),
                    f("sprout", "p99_us"),
                    p["exact_sprout_over_memcached"].as_f64().unwrap_or(0.0),
                    e("memcached", "p50_us"),
                    e("memcached", "p99_us"),
                    e("sprout", "p50_us"),
                    e("sprout", "p99_us"),
                );
            }
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_memaslap_output() {
        let text = "Total Statistics (100 events)\n   Min:        17\n   Max:      2568\n   Avg:       170\n   Geo:    159.96\n   Std:     67.49\n   Log2 Dist:\n       4:        0       10     0   40\n       8:   49    0      0      1\n\ncmd_get: 9\nget_misses: 3\nRun time: 5.0s Ops: 469421 TPS: 93877 Net_rate: 18.9M/s\n";
        let run = parse_memaslap(text).unwrap();
        assert_eq!(run.ops_per_s, 93877.0);
        assert_eq!(run.avg_us, 170.0);
        // 10 in (16,32], 40 in [64,128), 49 in [128,256), 1 in [1024,2048).
        assert!((64.0..=128.0).contains(&run.p50_us), "{}", run.p50_us);
        assert!(run.p99_us >= 128.0 && run.p99_us <= 256.0, "{}", run.p99_us);
        assert!((run.get_hit_ratio - 6.0 / 9.0).abs() < 1e-9);
        let no_totals = text.replace("cmd_get: 9\nget_misses: 3\n", "");
        assert!(parse_memaslap(&no_totals).unwrap().get_hit_ratio.is_nan());
    }
}
