//! Finding the most users a deployment serves within the SLA (the search Cloudstone's authors
//! did by hand): runs at growing user counts until SLA-1 fails, then bisection for SLA-1 and
//! for SLA-2; each run on a freshly deployed stack whose database is loaded at the matching
//! scale. Writes search.json (the trace, the maxima, the cost) and its HTML page.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::cost::Pricing;
use crate::report::RunReport;
use crate::run::{self, RunOptions};

#[derive(Debug, Clone)]
pub struct SearchOptions {
    /// Template for each run (users, url, registered users and out are set per run).
    pub run: RunOptions,
    pub stack: String,
    /// CPUs the deployment is confined to.
    pub cpus: String,
    /// Extra arguments for `sprout olio up` (e.g. --cache off).
    pub up_args: Vec<String>,
    pub port: u16,
    pub start_users: usize,
    pub max_users: usize,
    /// Stop bisecting when the bracket is narrower than this share of the lower bound...
    pub resolution: f64,
    /// ...or than this many users.
    pub min_step: usize,
    /// Start from the runs in `out/search-trace.json` (an interrupted search's).
    pub resume: bool,
    /// Runs at each end of the final brackets (1: no repeats).
    pub repeats: usize,
    /// Registered accounts per concurrent user (Olio: 100), at least 1,000 (U >= 3).
    pub accounts_per_user: u64,
    pub pricing: PathBuf,
    /// Instances the deployment occupies (both stacks here: one 1-vCPU instance).
    pub instances: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    pub users: usize,
    pub registered_users: u64,
    pub sla1: bool,
    pub sla2: bool,
    pub ops_per_s: f64,
    /// The first failed check, if any.
    pub reason: String,
    pub report: String,
    /// The interpreter build the deployment's Python processes ran (run.json's).
    #[serde(default)]
    pub interpreter: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SearchResult {
    pub stack: String,
    pub machine: String,
    pub run_seconds: f64,
    pub cpus: String,
    pub up_args: Vec<String>,
    pub trace: Vec<Step>,
    pub sla1_users: usize,
    pub sla2_users: usize,
    /// The maxima with their spread and whether the repeats at each bracket agreed.
    #[serde(default)]
    pub sla1: Maximum,
    #[serde(default)]
    pub sla2: Maximum,
    /// Runs at each end of each final bracket.
    #[serde(default)]
    pub repeats: usize,
    /// The interpreter build the deployment's Python processes ran (the last run's).
    #[serde(default)]
    pub interpreter: serde_json::Value,
    pub instances: f64,
    /// price name -> {"sla1"|"sla2" -> {"1"|"12"|"36" -> $/user/month}}
    pub usd_per_user_month: BTreeMap<String, BTreeMap<String, BTreeMap<String, Option<f64>>>>,
    pub default_price: String,
    pub prices: Vec<crate::cost::Price>,
}

pub fn search(opts: &SearchOptions) -> Result<SearchResult> {
    let pricing = Pricing::load(&opts.pricing)?;
    if opts.start_users == 0 || opts.max_users < opts.start_users {
        bail!("--start must be at least 1 and at most --max");
    }
    std::fs::create_dir_all(&opts.run.out)?;
    let mut trace: Vec<Step> = if opts.resume { resumed(&opts.run.out)? } else { Vec::new() };
    // The verdicts at `users` over all its runs, running it first if it never ran.
    let run_at = |users: usize, trace: &mut Vec<Step>| -> Result<(bool, bool)> {
        if !trace.iter().any(|s| s.users == users) {
            run_once(opts, users, trace)?;
        }
        Ok((verdict(trace, Sla::One, users) == Some(true), verdict(trace, Sla::Two, users) == Some(true)))
    };
    // The two runs closest to a maximum (its highest pass, its lowest failure above), run
    // again until each has `repeats` runs: a verdict counts only when its runs agree.
    let confirm = |lo: usize, hi: Option<usize>, trace: &mut Vec<Step>| -> Result<()> {
        for users in [Some(lo).filter(|&u| u > 0), hi].into_iter().flatten() {
            while trace.iter().filter(|s| s.users == users).count() < opts.repeats {
                run_once(opts, users, trace)?;
            }
        }
        Ok(())
    };
    // Grow until SLA-1 fails (or the cap).
    let (mut lo1, mut hi1) = (0usize, None::<usize>);
    let mut users = opts.start_users;
    loop {
        let (sla1, _) = run_at(users, &mut trace)?;
        if sla1 {
            lo1 = users;
            if users >= opts.max_users {
                break;
            }
            users = (users * 2).min(opts.max_users);
        } else {
            hi1 = Some(users);
            break;
        }
    }
    let narrow = |lo: usize, hi: usize| hi - lo <= opts.min_step.max((lo as f64 * opts.resolution).ceil() as usize);
    if let Some(mut hi) = hi1 {
        while !narrow(lo1, hi) {
            let mid = (lo1 + hi) / 2;
            if run_at(mid, &mut trace)?.0 {
                lo1 = mid;
            } else {
                hi = mid;
            }
        }
        hi1 = Some(hi);
    }
    confirm(lo1, hi1, &mut trace)?;
    let sla1 = maximum(&trace, Sla::One, lo1, hi1);
    // SLA-2 below the SLA-1 maximum, from what the runs so far showed.
    let mut lo2 = levels(&trace, Sla::Two).into_iter().filter(|&(u, (p, n))| p == n && u <= sla1.users).map(|(u, _)| u).max().unwrap_or(0);
    // With no failure above it, every run passed SLA-2 and the SLA-1 maximum is SLA-2's too.
    let mut hi2 = levels(&trace, Sla::Two).into_iter().filter(|&(u, (p, n))| p < n && u > lo2).map(|(u, _)| u).min();
    if let Some(mut hi) = hi2 {
        while !narrow(lo2, hi) {
            let mid = (lo2 + hi) / 2;
            if mid == 0 {
                break;
            }
            if run_at(mid, &mut trace)?.1 {
                lo2 = mid;
            } else {
                hi = mid;
            }
        }
        hi2 = Some(hi);
    }
    confirm(lo2, hi2, &mut trace)?;
    let sla2 = maximum(&trace, Sla::Two, lo2, hi2);
    trace.sort_by_key(|s| s.users);
    let mut usd = BTreeMap::new();
    for price in &pricing.prices {
        let mut by_sla = BTreeMap::new();
        for (sla, users) in [("sla1", sla1.users), ("sla2", sla2.users)] {
            let terms = price.per_user_month(opts.instances, users as u64).into_iter().map(|(m, v)| (m.to_string(), v)).collect();
            by_sla.insert(sla.to_string(), terms);
        }
        usd.insert(price.name.clone(), by_sla);
    }
    let interpreter = trace.iter().rev().map(|s| s.interpreter.clone()).find(|i| !i.is_null()).unwrap_or_default();
    let result = SearchResult {
        stack: opts.stack.clone(),
        machine: opts.run.machine.clone(),
        run_seconds: opts.run.spec.steady_s,
        cpus: opts.cpus.clone(),
        up_args: opts.up_args.clone(),
        trace,
        sla1_users: sla1.users,
        sla2_users: sla2.users,
        sla1,
        sla2,
        repeats: opts.repeats,
        interpreter,
        instances: opts.instances,
        usd_per_user_month: usd,
        default_price: pricing.default.clone(),
        prices: pricing.prices.clone(),
    };
    let path = opts.run.out.join("search.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&result)?)?;
    render(&opts.run.repo, &path)?;
    Ok(result)
}

/// One more run at `users` (the first, or a repeat), added to the trace and saved.
fn run_once(opts: &SearchOptions, users: usize, trace: &mut Vec<Step>) -> Result<()> {
    let nth = trace.iter().filter(|s| s.users == users).count() + 1;
    let step = one_run(opts, users, nth)?;
    eprintln!(
        "==> {} users{}: SLA-1 {}, SLA-2 {}{}",
        users,
        if nth > 1 { format!(" (run {nth})") } else { String::new() },
        pass(step.sla1),
        pass(step.sla2),
        if step.reason.is_empty() { String::new() } else { format!(" ({})", step.reason) }
    );
    trace.push(step);
    write_partial(&opts.run.out, trace)
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sla {
    One,
    Two,
}

impl Step {
    fn passed(&self, sla: Sla) -> bool {
        match sla {
            Sla::One => self.sla1,
            Sla::Two => self.sla2,
        }
    }
}

/// For each user count tried: (runs that passed `sla`, runs).
fn levels(trace: &[Step], sla: Sla) -> BTreeMap<usize, (usize, usize)> {
    let mut by = BTreeMap::new();
    for s in trace {
        let e = by.entry(s.users).or_insert((0, 0));
        e.0 += s.passed(sla) as usize;
        e.1 += 1;
    }
    by
}

/// Whether every run at `users` passed `sla` (None: it never ran).
fn verdict(trace: &[Step], sla: Sla, users: usize) -> Option<bool> {
    levels(trace, sla).get(&users).map(|&(p, n)| p == n)
}

/// A maximum and how sure it is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Maximum {
    /// The most users at which every run passed, at or below the search's bracket.
    pub users: usize,
    /// The most users at which any run passed: `users`..`high` is the spread.
    pub high: usize,
    /// Whether the runs at the bracket's two ends agreed (all passed below, all failed above).
    pub agreed: bool,
}

/// The maximum the bracket (lo passes, hi fails) gives once its ends were repeated: lo when
/// all its runs passed and all of hi's failed; otherwise the highest level below whose runs
/// all passed, with the spread up to the highest level any run passed at.
fn maximum(trace: &[Step], sla: Sla, lo: usize, hi: Option<usize>) -> Maximum {
    let by = levels(trace, sla);
    let all_pass = |u: usize| by.get(&u).is_some_and(|&(p, n)| p == n);
    let all_fail = |u: usize| by.get(&u).is_some_and(|&(p, _)| p == 0);
    let agreed = (lo == 0 || all_pass(lo)) && hi.is_none_or(all_fail);
    let users =
        if lo == 0 || all_pass(lo) { lo } else { by.iter().filter(|&(&u, &(p, n))| u < lo && p == n).map(|(&u, _)| u).max().unwrap_or(0) };
    let high = by.iter().filter(|&(_, &(p, _))| p > 0).map(|(&u, _)| u).max().unwrap_or(0).max(users);
    Maximum { users, high, agreed }
}

fn pass(ok: bool) -> &'static str {
    if ok {
        "pass"
    } else {
        "fail"
    }
}

/// Where the `nth` run with `users` keeps its run.json and report (repeats: run-00850-2, ...).
fn run_dir(out: &Path, users: usize, nth: usize) -> PathBuf {
    out.join(if nth > 1 { format!("run-{users:05}-{nth}") } else { format!("run-{users:05}") })
}

/// The runs an interrupted search recorded whose results are still there; none if it recorded none.
fn resumed(out: &Path) -> Result<Vec<Step>> {
    let path = out.join("search-trace.json");
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let steps: Vec<Step> = serde_json::from_slice(&text).with_context(|| format!("{} is not a search trace", path.display()))?;
    // A run's directory is directly under `out` (its report path may be relative to where the search ran).
    let run_json = |s: &Step| Path::new(&s.report).parent().and_then(|d| d.file_name()).map(|name| out.join(name).join("run.json"));
    // bench/results keeps its runs' run.json gzipped.
    let kept: Vec<Step> =
        steps.into_iter().filter(|s| run_json(s).is_some_and(|p| p.exists() || p.with_file_name("run.json.gz").exists())).collect();
    for s in &kept {
        eprintln!("==> {} users: SLA-1 {}, SLA-2 {} (kept from {})", s.users, pass(s.sla1), pass(s.sla2), path.display());
    }
    Ok(kept)
}

fn write_partial(out: &Path, trace: &[Step]) -> Result<()> {
    std::fs::write(out.join("search-trace.json"), serde_json::to_vec_pretty(trace)?)?;
    Ok(())
}

/// Deploy the stack fresh with a database at the scale of `users`, run, and take it down.
fn one_run(opts: &SearchOptions, users: usize, nth: usize) -> Result<Step> {
    let registered = (users as u64 * opts.accounts_per_user).max(1000);
    let state = opts.run.out.join("state");
    let exe = &opts.run.exe;
    olio(exe, &["down", "--dir"], &state).ok();
    if state.exists() {
        std::fs::remove_dir_all(&state).with_context(|| format!("clearing {}", state.display()))?;
    }
    let mut up: Vec<String> = vec![
        "up".into(),
        "--stack".into(),
        opts.stack.clone(),
        "--cpus".into(),
        opts.cpus.clone(),
        "--port".into(),
        opts.port.to_string(),
        "--users".into(),
        registered.to_string(),
    ];
    up.extend(opts.up_args.iter().cloned());
    up.push("--dir".into());
    let up_refs: Vec<&str> = up.iter().map(String::as_str).collect();
    olio(exe, &up_refs, &state).with_context(|| format!("deploying {} for {users} users", opts.stack))?;
    let mut run = opts.run.clone();
    run.spec.users = users;
    run.spec.registered_users = registered;
    run.spec.url = format!("http://127.0.0.1:{}", opts.port);
    run.stack = opts.stack.clone();
    run.out = run_dir(&opts.run.out, users, nth);
    run.sut_cgroup = confinement_cgroup(exe, &state);
    run.deployment = Some(state.clone());
    let report = run::run(&run);
    let down = olio(exe, &["down", "--dir"], &state);
    let report: RunReport = report?;
    down?;
    let reason = report.checks.iter().find(|c| !c.passed).map(|c| format!("{}: {}", c.name, c.detail)).unwrap_or_default();
    Ok(Step {
        users,
        registered_users: registered,
        sla1: report.sla1_passed,
        sla2: report.sla2_passed,
        ops_per_s: report.ops_per_s,
        reason,
        report: run.out.join("report.html").display().to_string(),
        interpreter: report.interpreter.clone(),
    })
}

fn olio(exe: &Path, args: &[&str], state: &Path) -> Result<()> {
    let status =
        Command::new(exe).arg("olio").args(args).arg(state).status().with_context(|| format!("running sprout olio {}", args.join(" ")))?;
    if !status.success() {
        bail!("sprout olio {} {} failed ({status})", args.join(" "), state.display());
    }
    Ok(())
}

/// The cgroup holding the deployment's processes, from `sprout olio status`.
fn confinement_cgroup(exe: &Path, state: &Path) -> Option<PathBuf> {
    let out = Command::new(exe).args(["olio", "status", "--dir"]).arg(state).output().ok()?;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    status["confinement"]["cgroup"].as_str().map(PathBuf::from)
}

/// bench/cloudstone_search.py draws the trace and writes search.html beside the JSON.
fn render(repo: &Path, json: &Path) -> Result<()> {
    let script = repo.join("bench/cloudstone_search.py");
    let status = Command::new("python3").arg(&script).arg(json).status().with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(status.success(), "{} failed ({status})", script.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(users: usize, report: &str) -> Step {
        Step {
            users,
            registered_users: users as u64 * 100,
            sla1: users < 300,
            sla2: users < 200,
            ops_per_s: 1.0,
            reason: String::new(),
            report: report.into(),
            interpreter: serde_json::Value::Null,
        }
    }

    fn verdicts(runs: &[(usize, bool)]) -> Vec<Step> {
        runs.iter().map(|&(users, ok)| Step { sla1: ok, ..step(users, "") }).collect()
    }

    #[test]
    fn a_maximum_is_taken_when_the_repeats_at_both_ends_agree() {
        let trace = verdicts(&[(400, true), (800, false), (600, true), (700, false), (600, true), (700, false)]);
        assert_eq!(maximum(&trace, Sla::One, 600, Some(700)), Maximum { users: 600, high: 600, agreed: true });
    }

    #[test]
    fn a_failed_repeat_of_the_highest_pass_lowers_the_maximum_and_reports_the_spread() {
        // 650 passed once and failed once: the maximum is 600 (every run passed), up to 650.
        let trace = verdicts(&[(400, true), (800, false), (600, true), (700, false), (650, true), (650, false), (700, false)]);
        assert_eq!(maximum(&trace, Sla::One, 650, Some(700)), Maximum { users: 600, high: 650, agreed: false });
    }

    #[test]
    fn a_passed_repeat_above_the_maximum_widens_the_spread_only() {
        // The non-monotonic case: 750 failed, then passed on its repeat.
        let trace = verdicts(&[(700, true), (750, false), (700, true), (750, true)]);
        assert_eq!(maximum(&trace, Sla::One, 700, Some(750)), Maximum { users: 700, high: 750, agreed: false });
        // Failing at the first run: no maximum.
        let trace = verdicts(&[(100, false), (100, false)]);
        assert_eq!(maximum(&trace, Sla::One, 0, Some(100)), Maximum { users: 0, high: 0, agreed: true });
        // Passing at the cap: the maximum is only a lower bound, but agreed.
        let trace = verdicts(&[(100, true), (200, true), (200, true)]);
        assert_eq!(maximum(&trace, Sla::One, 200, None), Maximum { users: 200, high: 200, agreed: true });
    }

    #[test]
    fn resume_keeps_the_runs_whose_reports_remain() {
        let dir = tempfile::tempdir().unwrap();
        assert!(resumed(dir.path()).unwrap().is_empty(), "no trace: a fresh search");
        for (users, name) in [(100, "run.json"), (200, "run.json.gz")] {
            std::fs::create_dir_all(run_dir(dir.path(), users, 1)).unwrap();
            std::fs::write(run_dir(dir.path(), users, 1).join(name), "{}").unwrap();
        }
        assert_eq!(run_dir(dir.path(), 200, 2), dir.path().join("run-00200-2"), "a repeat has its own directory");
        // 400's results are gone (its directory removed): it runs again.
        // Report paths as a search run from elsewhere wrote them (relative to its own directory).
        write_partial(
            dir.path(),
            &[step(100, "results/x/run-00100/report.html"), step(200, "run-00200/report.html"), step(400, "run-00400/report.html")],
        )
        .unwrap();
        let kept = resumed(dir.path()).unwrap();
        assert_eq!(kept.iter().map(|s| s.users).collect::<Vec<_>>(), vec![100, 200]);
        assert!(kept[0].sla2 && !kept[1].sla2);
        std::fs::write(dir.path().join("search-trace.json"), "not json").unwrap();
        let err = resumed(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("is not a search trace"), "{err:#}");
    }
}
