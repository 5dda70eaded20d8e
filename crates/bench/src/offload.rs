//! `sprout bench offload`: elastic offload (docs/offload.md): `sprout.map` over a worker's
//! sandboxes against Ray and `multiprocessing.Pool`, side by side in one run, on the same CPUs.
//!
//! One real worker (the `sock` back-end; `[instances] keep_warm = true`, `max_per_lambda` =
//! `--sandboxes`, 2 by default) runs with its sandboxes on `--cpus` (0 and 1); the driver,
//! bench/offload.py, pins itself and every process it starts (Ray's cluster, the pools) to the
//! same CPUs. It deploys one lambda per task kind with the SDK (their f.py made from the
//! driver's own task functions) and measures, for each peer, one round at a time in a fresh
//! interpreter, `rounds` rounds (the median is reported):
//!
//! * `sprout`: `sprout.map` with the worker sizing chunks; `sprout_unbatched`: `chunk=1`, every
//!   item an invocation of its own;
//! * `ray`: `ray==2.60.0`, `ray.init(num_cpus=2)` (installed by the driver when `import ray`
//!   fails; a failed install stops the run);
//! * `multiprocessing`: `Pool(2).map(chunksize=1)`; `multiprocessing_chunked`: its default
//!   chunksize.
//!
//! Parts: (a) 10,000 no-op tasks (tasks per second, per-task overhead = 1000 / tasks per
//! second, in ms) and the median of 200 one-at-a-time round trips; (b) 1,000 tasks of 10 ms
//! of CPU each (a busy loop on `time.process_time`): the makespan against the ideal
//! (1000 × 10 ms / 2 CPUs = 5 s); (c) a 4096 × 4096 float64 matmul in tiles of 1024:
//! `sprout.elastic` (one part per CPU), Ray's tasks and the pool over tiles, against NumPy's
//! `a @ b` in one process with a BLAS thread per CPU (bench/offload_matmul.py); (d) the
//! worker's memory (PSS of it and every process below it, plus its leases' files) before,
//! during and after a Matrix's life. `--parts tasks` or `matmul` runs (a)+(b) or (c)+(d)
//! alone. Results: offload.json, .md and .png (bench/plot_offload.py).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use crate::report::{self, bench_dir, get};
use crate::worker::{pin_to_cpus, BenchWorker};

/// The rows, in the order of the table.
pub const PEERS: [&str; 5] = ["sprout", "sprout_unbatched", "ray", "multiprocessing", "multiprocessing_chunked"];

/// The issue's goals.
pub const OVERHEAD_GOAL_MS: f64 = 0.3;
pub const RAY_GOAL_X: f64 = 3.0;
pub const POOL_MAKESPAN_GOAL_X: f64 = 1.15;
pub const MATMUL_GOAL_X: f64 = 1.3;
pub const MEMORY_BACK_GOAL_S: f64 = 5.0;
/// A pool's CPU makespan over the ideal beyond which the machine was not quiet.
pub const QUIET_POOL_X: f64 = 1.10;

#[derive(Debug, Clone)]
pub struct Options {
    pub out_dir: PathBuf,
    pub work_dir: PathBuf,
    pub sprout: PathBuf,
    /// CPUs of every peer: the worker and its sandboxes, the driver, Ray, the pools.
    pub cpus: Vec<usize>,
    /// Fewer tasks (1,000 no-ops, 50 round trips, 200 CPU tasks) and one round.
    pub quick: bool,
    /// Rounds of every peer (default: 3, `quick`: 1).
    pub rounds: Option<usize>,
    /// `[instances] max_per_lambda` of the worker.
    pub sandboxes: usize,
    /// Peers to run (default: all).
    pub peers: Vec<String>,
    /// `tasks` ((a) and (b)) and/or `matmul` ((c) and (d)).
    pub parts: Vec<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            out_dir: PathBuf::from("bench/results"),
            work_dir: PathBuf::from("/tmp/sprout-bench-offload"),
            sprout: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("sprout")),
            cpus: vec![0, 1],
            quick: false,
            rounds: None,
            sandboxes: 2,
            peers: PEERS.iter().map(|p| p.to_string()).collect(),
            parts: vec!["tasks".into(), "matmul".into()],
        }
    }
}

/// The worker's configuration: its defaults but for the sandboxes' CPUs, a lambda's sandboxes
/// kept warm (at most `sandboxes` of them), a deep queue, and bodies of 2 MB requests.
pub fn worker_config(cpus: &[usize], sandboxes: usize) -> String {
    let cpuset = cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
    format!(
        "[sandbox]\nbackend = \"sock\"\ncpuset = \"{cpuset}\"\nstart_timeout_ms = 60000\n\n\
         [limits]\ntimeout_ms = 60000\nmax_body_mb = 16\n\n\
         [instances]\nkeep_warm = true\nmax_per_lambda = {}\nqueue_depth = 4096\n",
        sandboxes.max(2)
    )
}

/// Run every peer; writes offload.json, .md and .png under `opts.out_dir`.
pub fn run(opts: &Options) -> Result<Value> {
    for p in &opts.peers {
        if !PEERS.contains(&p.as_str()) {
            bail!("unknown peer {p:?}; the peers are {}", PEERS.join(", "));
        }
    }
    // SAFETY: sysconf takes an integer name and touches no memory of ours.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    if opts.cpus.is_empty() || opts.cpus.iter().any(|&c| c >= online) {
        bail!("--cpus {:?}: this machine has CPUs 0-{}", opts.cpus, online - 1);
    }
    pin_to_cpus(&opts.cpus).context("pinning the driver")?;
    std::fs::create_dir_all(&opts.work_dir)?;
    let wants_sprout = opts.peers.iter().any(|p| p.starts_with("sprout"));
    let config = worker_config(&opts.cpus, opts.sandboxes);
    let worker = if wants_sprout {
        let dir = opts.work_dir.join("worker");
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port();
        eprintln!("offload: starting a worker in {} on CPUs {:?}", dir.display(), opts.cpus);
        Some(BenchWorker::start_on(&opts.sprout, &dir, port, &opts.cpus, &config)?)
    } else {
        None
    };
    let load_before = load_average();
    let raw_path = opts.work_dir.join("offload-raw.json");
    let _ = std::fs::remove_file(&raw_path);
    let driven = drive(opts, worker.as_ref(), &raw_path);
    if let Some(worker) = worker {
        let tail = worker.log_tail(5);
        worker.stop()?;
        if driven.is_err() && !tail.is_empty() {
            eprintln!("offload: the worker's log ended with:\n{tail}");
        }
    }
    driven?;
    let raw: Value = serde_json::from_slice(&std::fs::read(&raw_path)?).with_context(|| format!("reading {}", raw_path.display()))?;
    let mut out = results(&raw);
    out["load_average"] = json!({"before": load_before, "after": load_average()});
    out["machine"] = json!(report::machine());
    out["date"] = json!(shell("date", &["-u", "+%Y-%m-%d %H:%M UTC"]));
    out["commit"] = json!(shell("git", &["describe", "--always", "--dirty"]));
    out["worker_config"] = if wants_sprout { json!(config) } else { Value::Null };
    out["method"] = json!(method(opts, &raw));
    report::write(&opts.out_dir, "offload", &out, &markdown(&out), "plot_offload.py")?;
    Ok(out)
}

/// Run bench/offload.py against the worker, its progress lines on our stderr.
fn drive(opts: &Options, worker: Option<&BenchWorker>, raw_path: &Path) -> Result<()> {
    let cpus = opts.cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new("python3");
    cmd.arg(bench_dir().join("offload.py")).arg(raw_path).args(["--cpus", &cpus, "--peers", &opts.peers.join(",")]);
    cmd.args(["--parts", &opts.parts.join(",")]);
    if opts.quick {
        cmd.arg("--quick");
    }
    if let Some(rounds) = opts.rounds {
        cmd.args(["--rounds", &rounds.to_string()]);
    }
    if let Some(worker) = worker {
        let token = std::fs::read_to_string(worker.dir.join("api-token")).context("reading the worker's api-token")?;
        cmd.args(["--url", &worker.url()]).arg("--worker-dir").arg(&worker.dir).env("SPROUT_TOKEN", token.trim());
    }
    let status = cmd.status().context("running bench/offload.py (python3)")?;
    if !status.success() {
        bail!("bench/offload.py failed ({status})");
    }
    Ok(())
}

/// The 1-, 5- and 15-minute load averages (/proc/loadavg).
fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|x| x.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// One line of a command's output.
fn shell(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).current_dir(bench_dir()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn method(opts: &Options, raw: &Value) -> String {
    let plan = &raw["plan"];
    let worker = if opts.peers.iter().any(|p| p.starts_with("sprout")) {
        format!("the Sprout worker (sock back-end, keep_warm, max_per_lambda = {}) with its sandboxes, ", opts.sandboxes.max(2))
    } else {
        String::new()
    };
    let rounds = plan["rounds"].as_u64().unwrap_or(1);
    format!(
        "every peer on CPUs {:?}: {worker}the driver (bench/offload.py) and every process it starts (Ray's local cluster, the \
         pools); {} no-op tasks at once, {} one-at-a-time round trips, {} CPU tasks of {} ms each (a busy loop on \
         time.process_time) at once; each peer's round in a fresh interpreter after a warm-up (Sprout: both sandboxes of each \
         lambda warm; Ray: its workers started), {}; every answer checked",
        opts.cpus,
        plan["tasks"],
        plan["round_trips"],
        plan["cpu_tasks"],
        plan["task_ms"],
        if rounds == 1 { "one round".to_string() } else { format!("the median of {rounds} rounds") },
    )
}

/// `a / b` when both are there and `b` is not 0.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => Some(a / b),
        _ => None,
    }
}

/// The peers' figures (kept as the driver measured them, in [`PEERS`] order), their ratios
/// and the goals.
pub fn results(raw: &Value) -> Value {
    let mut peers = Map::new(); // (serde_json's map sorts its keys: tables follow PEERS)
    for p in PEERS {
        if let Some(v) = raw["peers"].get(p) {
            peers.insert(p.to_string(), v.clone());
        }
    }
    let peers = Value::Object(peers);
    let at = |peer: &str, key: &str| get(&peers, &[peer, key]);
    // The better of the pool's two rows.
    let pool_makespan = [at("multiprocessing", "cpu_makespan_s"), at("multiprocessing_chunked", "cpu_makespan_s")]
        .into_iter()
        .flatten()
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))));
    let tps = |peer: &str| at(peer, "noop_tasks_per_s");
    let numpy_matmul = get(raw, &["matmul", "numpy", "matmul_s"]);
    let memory = &raw["matmul"]["sprout"]["memory"];
    let ratios = json!({
        "sprout_over_ray_noop_tasks_per_s": ratio(tps("sprout"), tps("ray")),
        "sprout_over_multiprocessing_noop_tasks_per_s": ratio(tps("sprout"), tps("multiprocessing")),
        "sprout_over_multiprocessing_chunked_noop_tasks_per_s": ratio(tps("sprout"), tps("multiprocessing_chunked")),
        "sprout_over_sprout_unbatched_noop_tasks_per_s": ratio(tps("sprout"), tps("sprout_unbatched")),
        "sprout_unbatched_over_ray_noop_tasks_per_s": ratio(tps("sprout_unbatched"), tps("ray")),
        "sprout_round_trip_over_ray": ratio(at("sprout", "round_trip_ms"), at("ray", "round_trip_ms")),
        "sprout_round_trip_over_multiprocessing": ratio(at("sprout", "round_trip_ms"), at("multiprocessing", "round_trip_ms")),
        "sprout_cpu_makespan_over_multiprocessing": ratio(at("sprout", "cpu_makespan_s"), pool_makespan),
        "sprout_cpu_makespan_over_ray": ratio(at("sprout", "cpu_makespan_s"), at("ray", "cpu_makespan_s")),
        "sprout_unbatched_cpu_makespan_over_multiprocessing": ratio(at("sprout_unbatched", "cpu_makespan_s"), pool_makespan),
        "sprout_matmul_over_numpy": ratio(at("sprout", "matmul_s"), numpy_matmul),
        "ray_matmul_over_numpy": ratio(at("ray", "matmul_s"), numpy_matmul),
        "multiprocessing_matmul_over_numpy": ratio(at("multiprocessing", "matmul_s"), numpy_matmul),
    });
    let goal = |text: &str, target: f64, at_most: bool, measured: Option<f64>, unit: &str| {
        json!({
            "goal": text,
            "target": target,
            "measured": measured,
            "unit": unit,
            "met": measured.map(|m| if at_most { m <= target } else { m >= target }),
        })
    };
    let mut goals = json!([
        goal(
            "warm per-task overhead <= 0.3 ms (sprout.map, the worker's chunks: 1000 / no-op tasks per second)",
            OVERHEAD_GOAL_MS,
            true,
            at("sprout", "task_overhead_ms"),
            "ms",
        ),
        goal(">= 3x Ray's no-op tasks per second", RAY_GOAL_X, false, ratios["sprout_over_ray_noop_tasks_per_s"].as_f64(), "x"),
        goal(
            "CPU makespan within 1.15x of multiprocessing.Pool's (the better of its two chunksizes)",
            POOL_MAKESPAN_GOAL_X,
            true,
            ratios["sprout_cpu_makespan_over_multiprocessing"].as_f64(),
            "x",
        ),
        goal(
            "tiled matmul within 1.3x of NumPy's time on the same cores",
            MATMUL_GOAL_X,
            true,
            ratios["sprout_matmul_over_numpy"].as_f64(),
            "x"
        ),
        goal(
            "the worker's memory back where it was within 5 s of the Matrix being collected",
            MEMORY_BACK_GOAL_S,
            true,
            memory["back_s"].as_f64(),
            "s",
        ),
    ]);
    if memory.is_object() && memory["back_s"].is_null() {
        goals[4]["met"] = json!(false); // weighed, and never back within the driver's wait
    }
    let plan = &raw["plan"];
    let mut notes = Vec::new();
    // The pool runs CPU-bound work at the machine's pace: far off the ideal, the CPUs were not free.
    let pool_ratio = ratio(pool_makespan, plan["ideal_s"].as_f64());
    if let Some(x) = pool_ratio.filter(|x| *x > QUIET_POOL_X) {
        notes.push(format!(
            "multiprocessing.Pool's CPU makespan was {x:.2}× the ideal: the CPUs were not free for this run (another process used \
             them), and its figures are not to be quoted"
        ));
    }
    json!({
        "peers": peers,
        "notes": notes,
        "ratios": ratios,
        "goals": goals,
        "cpu_ideal_s": plan["ideal_s"],
        "plan": plan,
        "versions": raw["versions"],
        "affinity": raw["affinity"],
        "numpy_matmul_s": numpy_matmul,
        "matmul": raw["matmul"],
    })
}

pub fn markdown(r: &Value) -> String {
    let f = |v: Option<f64>, d: usize| v.map(|x| format!("{x:.d$}")).unwrap_or_else(|| "—".into());
    let plan = &r["plan"];
    let mut s = format!(
        "# Elastic offload: sprout.map against Ray and multiprocessing.Pool\n\n{} — {}, commit {}\n\n{}.\n",
        r["machine"].as_str().unwrap_or(""),
        r["date"].as_str().unwrap_or(""),
        r["commit"].as_str().unwrap_or(""),
        r["method"].as_str().unwrap_or(""),
    );
    if plan["quick"].as_bool() == Some(true) {
        s += "\n**A `--quick` run** (fewer tasks, one round): not the figures to quote.\n";
    }
    for n in r["notes"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        s += &format!("\n**Note:** {n}.\n");
    }
    if let Some(load) = r["load_average"]["before"].as_array() {
        let l: Vec<String> = load.iter().filter_map(Value::as_f64).map(|x| format!("{x:.2}")).collect();
        s += &format!("\nLoad average before the run: {}.\n", l.join(", "));
    }
    s += &format!(
        "\n(a) {} no-op tasks at once, and one task's round trip (median of {} one at a time); (b) {} tasks of {} ms of CPU \
         at once: the makespan against the ideal {} s ({} × {} ms / {} CPUs); (c) a {n} × {n} float64 matmul in tiles of {t} \
         (time of `A @ B` with A and B already in place; [below](#c-the-tiled-matmul)).\n\n",
        plan["tasks"],
        plan["round_trips"],
        plan["cpu_tasks"],
        plan["task_ms"],
        f(plan["ideal_s"].as_f64(), 2),
        plan["cpu_tasks"],
        plan["task_ms"],
        plan["cpus"].as_array().map_or(0, |c| c.len()),
        n = plan["matmul"]["n"],
        t = plan["matmul"]["tile"],
    );
    s += "| peer | no-op tasks/s | per-task overhead (ms) | round trip (ms) | CPU makespan (s) | ÷ ideal | matmul (s) | how |\n\
          |---|---:|---:|---:|---:|---:|---:|---|\n";
    for p in PEERS {
        let Some(v) = r["peers"].get(p) else { continue };
        s += &format!(
            "| {p} | {} | {} | {} | {} | {} | {} | {} |\n",
            f(v["noop_tasks_per_s"].as_f64(), 0),
            f(v["task_overhead_ms"].as_f64(), 3),
            f(v["round_trip_ms"].as_f64(), 3),
            f(v["cpu_makespan_s"].as_f64(), 2),
            f(v["cpu_makespan_ratio"].as_f64(), 3),
            f(v["matmul_s"].as_f64(), 2),
            v["how"].as_str().unwrap_or("").replace('|', "\\|"),
        );
    }
    let x = |k: &str| f(r["ratios"][k].as_f64(), 2);
    s += &format!(
        "\nSprout's no-op tasks per second: {}× Ray's, {}× multiprocessing's (chunksize=1), {}× with its default chunksize, {}× \
         Sprout's unbatched; round trip {}× Ray's, {}× multiprocessing's; CPU makespan {}× the better pool's, {}× Ray's.\n",
        x("sprout_over_ray_noop_tasks_per_s"),
        x("sprout_over_multiprocessing_noop_tasks_per_s"),
        x("sprout_over_multiprocessing_chunked_noop_tasks_per_s"),
        x("sprout_over_sprout_unbatched_noop_tasks_per_s"),
        x("sprout_round_trip_over_ray"),
        x("sprout_round_trip_over_multiprocessing"),
        x("sprout_cpu_makespan_over_multiprocessing"),
        x("sprout_cpu_makespan_over_ray"),
    );
    s += "\n| goal | target | measured | met |\n|---|---:|---:|---|\n";
    for g in r["goals"].as_array().into_iter().flatten() {
        let met = match g["met"].as_bool() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        let unit = match g["unit"].as_str().unwrap_or("") {
            "x" => "×".to_string(),
            u => format!(" {u}"),
        };
        let measured = g["measured"].as_f64().map(|m| format!("{m:.3}{unit}")).unwrap_or_else(|| "—".into());
        s += &format!("| {} | {}{unit} | {measured} | {met} |\n", g["goal"].as_str().unwrap_or(""), f(g["target"].as_f64(), 2));
    }
    s += &matmul_markdown(r);
    s
}

/// (c) and (d): every peer's matmul against NumPy's, and the worker's memory over a Matrix's life.
fn matmul_markdown(r: &Value) -> String {
    let f = |v: Option<f64>, d: usize| v.map(|x| format!("{x:.d$}")).unwrap_or_else(|| "—".into());
    let numpy = r["numpy_matmul_s"].as_f64();
    let mut s = "\n## (c) the tiled matmul\n\n| peer | A @ B (s) | ÷ NumPy | placing A and B (s) | reading C (s) | how |\n\
                 |---|---:|---:|---:|---:|---|\n"
        .to_string();
    for p in ["numpy", "sprout", "multiprocessing", "ray"] {
        let Some(m) = r["matmul"].get(p) else { continue };
        s += &format!(
            "| {p} | {} | {} | {} | {} | {} |\n",
            f(m["matmul_s"].as_f64(), 3),
            f(ratio(m["matmul_s"].as_f64(), numpy), 2),
            f(m["upload_s"].as_f64(), 2),
            f(m["fetch_s"].as_f64(), 2),
            m["how"].as_str().unwrap_or("").replace('|', "\\|"),
        );
    }
    let memory = &r["matmul"]["sprout"]["memory"];
    if memory.is_object() {
        s += &format!(
            "\n## (d) the worker's memory over a Matrix's life\n\n{}: {} MiB before the Matrix's context, {} MiB at the \
             peak, back within {} of where it was {} s after the context and its matrices were collected ({} MiB a moment later).\n",
            memory["how"].as_str().unwrap_or(""),
            f(memory["before_mib"].as_f64(), 0),
            f(memory["peak_mib"].as_f64(), 0),
            memory["tolerance"].as_str().unwrap_or(""),
            f(memory["back_s"].as_f64(), 2),
            f(memory["after_mib"].as_f64(), 0),
        );
    }
    s
}

/// The goals, one line each, for the command's output.
pub fn summary(r: &Value) -> String {
    let mut s = String::new();
    for g in r["goals"].as_array().into_iter().flatten() {
        let met = crate::report::verdict(g["met"].as_bool());
        let unit = match g["unit"].as_str().unwrap_or("") {
            "x" => "×".to_string(),
            u => format!(" {u}"),
        };
        let measured = g["measured"].as_f64().map(|m| format!("{m:.3}{unit}")).unwrap_or_else(|| "—".into());
        s += &format!("{met}: {} (measured {measured}, target {}{unit})\n", g["goal"].as_str().unwrap_or(""), g["target"]);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> Value {
        let peer = |tps: f64, rt: f64, makespan: f64, matmul: Option<f64>| {
            json!({"noop_tasks_per_s": tps, "task_overhead_ms": 1000.0 / tps, "round_trip_ms": rt, "cpu_makespan_s": makespan,
                   "cpu_makespan_ratio": makespan / 5.0, "matmul_s": matmul, "how": "x", "rounds": []})
        };
        json!({
            "plan": {"tasks": 10000, "round_trips": 200, "cpu_tasks": 1000, "task_ms": 10.0, "cpus": [0, 1], "rounds": 3, "quick": false,
                     "ideal_s": 5.0, "matmul": {"n": 4096, "tile": 1024}},
            "peers": {
                "ray": peer(2000.0, 2.0, 5.6, Some(6.0)),
                "sprout": peer(8000.0, 1.0, 5.5, Some(4.8)),
                "sprout_unbatched": peer(2500.0, 1.0, 5.9, None),
                "multiprocessing": peer(50000.0, 0.2, 5.2, Some(4.5)),
                "multiprocessing_chunked": peer(500000.0, 0.2, 5.0, None),
            },
            "matmul": {
                "numpy": {"matmul_s": 4.0, "how": "a @ b"},
                "sprout": {"matmul_s": 4.8, "upload_s": 1.0, "fetch_s": 0.5, "how": "elastic",
                           "memory": {"before_mib": 100.0, "peak_mib": 900.0, "after_mib": 101.0, "back_s": 1.5,
                                      "tolerance": "max(2%, 8 MiB)", "how": "PSS"}},
                "ray": {"matmul_s": 6.0, "how": "tasks"},
            },
            "versions": {"ray": "2.60.0"},
            "affinity": [0, 1],
        })
    }

    #[test]
    fn goals_are_judged_against_the_issues_targets() {
        let r = results(&raw());
        assert_eq!(r["ratios"]["sprout_matmul_over_numpy"], 1.2);
        assert_eq!(r["ratios"]["ray_matmul_over_numpy"], 1.5);
        assert_eq!(r["ratios"]["sprout_over_ray_noop_tasks_per_s"], 4.0);
        assert_eq!(r["ratios"]["sprout_over_sprout_unbatched_noop_tasks_per_s"], 3.2);
        // Against the better of the pool's two rows.
        assert_eq!(r["ratios"]["sprout_cpu_makespan_over_multiprocessing"], 1.1);
        let goals = r["goals"].as_array().unwrap();
        assert_eq!(goals.len(), 5);
        assert_eq!(goals[4]["measured"], 1.5);
        assert_eq!(goals[0]["measured"], 0.125);
        assert_eq!(goals[0]["target"], 0.3);
        assert!(goals.iter().all(|g| g["met"] == true), "{goals:?}");
        let md = markdown(&r);
        assert!(md.contains("| sprout | 8000 | 0.125 | 1.000 | 5.50 | 1.100 | 4.80 |"), "{md}");
        assert!(md.contains("| sprout | 4.800 | 1.20 | 1.00 | 0.50 | elastic |"), "{md}");
        assert!(md.contains("| numpy | 4.000 | 1.00 |"), "{md}");
        assert!(md.contains("900 MiB at the peak") && md.contains("1.50 s after"), "{md}");
        assert!(!summary(&r).contains("NOT"));
        assert!(r["notes"].as_array().unwrap().is_empty());
    }

    #[test]
    fn a_goal_missed_or_not_measured_says_so() {
        let mut raw = raw();
        raw["peers"]["sprout"]["noop_tasks_per_s"] = json!(3000.0);
        raw["peers"]["sprout"]["task_overhead_ms"] = json!(1000.0 / 3000.0);
        raw["peers"]["sprout"]["cpu_makespan_s"] = json!(5.8);
        raw["peers"].as_object_mut().unwrap().remove("ray");
        raw["matmul"].as_object_mut().unwrap().remove("ray");
        raw["peers"]["sprout"]["matmul_s"] = json!(6.0);
        raw["matmul"]["sprout"]["memory"]["back_s"] = Value::Null; // never back within the wait
        let r = results(&raw);
        let met: Vec<Value> = r["goals"].as_array().unwrap().iter().map(|g| g["met"].clone()).collect();
        assert_eq!(met, [json!(false), Value::Null, json!(false), json!(false), json!(false)], "never back: not met");
        assert!(r["ratios"]["sprout_over_ray_noop_tasks_per_s"].is_null());
        let md = markdown(&r);
        assert!(md.contains("| **no** |") && md.contains("| not measured |"), "{md}");
        // A pool far off the ideal: the machine was busy, and the run says so.
        raw["peers"]["multiprocessing"]["cpu_makespan_s"] = json!(10.0);
        raw["peers"]["multiprocessing_chunked"]["cpu_makespan_s"] = json!(9.0);
        let r = results(&raw);
        assert!(r["notes"][0].as_str().unwrap().starts_with("multiprocessing.Pool's CPU makespan was 1.80× the ideal"), "{}", r["notes"]);
        assert!(markdown(&r).contains("**Note:** multiprocessing.Pool's"));
        assert!(!md.contains("| ray |"));
    }

    #[test]
    fn the_worker_keeps_two_sandboxes_warm_at_least() {
        let c = worker_config(&[0, 1], 1);
        assert!(c.contains("cpuset = \"0,1\"") && c.contains("keep_warm = true") && c.contains("max_per_lambda = 2"), "{c}");
        let parsed = sprout_worker::Config::parse(&c).unwrap();
        assert!(parsed.instances.keep_warm);
        assert_eq!(parsed.instances.max_per_lambda, 2);
        assert_eq!(worker_config(&[1], 4).matches("max_per_lambda = 4").count(), 1);
    }
}
