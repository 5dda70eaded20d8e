//! Writing a benchmark's results: JSON for tracking across versions, a markdown table for the
//! README, and a PNG plot drawn by a matplotlib script in bench/.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// A goal's verdict for a command's output: met, NOT met, or not measured.
pub fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    }
}

/// The number at `path` in a result, if there is one.
pub fn get(v: &serde_json::Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(*k))?.as_f64()
}

/// The median of `xs` (the upper one of an even count); None when there are none.
pub fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.get(xs.len() / 2).copied()
}

/// Percentile `q` (0-1) of `samples`, nearest rank; NaN when there are none.
pub fn percentile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// One line describing this machine, recorded with every result.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|v| v.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    // Online CPUs of the machine, not the affinity of this (possibly pinned) process.
    // SAFETY: sysconf takes an integer name and touches no memory of ours.
    let cores = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1);
    let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
        .unwrap_or(0);
    let kernel = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    let os = std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_string()))
        .unwrap_or_default();
    format!("{cores} cores ({cpu}), {} GiB, Linux {kernel}, {os}", (mem_kb + (1 << 19)) >> 20)
}

/// The repository's bench/ directory (where the plot scripts live).
pub fn bench_dir() -> PathBuf {
    let from_source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench");
    if from_source.is_dir() {
        return from_source;
    }
    PathBuf::from("bench")
}

/// Write `<out>/<name>.json` and `<out>/<name>.md`, then draw `<out>/<name>.png` with
/// `bench/<plot_script>`.
/// The markdown table of a benchmark's `targets` (`[{"target", "measured", "met"}]`), the
/// measured figure to `digits` decimals, headed by a blank line.
pub fn targets_table(targets: &serde_json::Value, digits: usize) -> String {
    let mut s = String::from("\n| target | measured | met |\n|---|---:|---|\n");
    for t in targets.as_array().into_iter().flatten() {
        let met = match t["met"].as_bool() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not measured",
        };
        let measured = t["measured"].as_f64().map(|x| format!("{x:.digits$}")).unwrap_or_else(|| "—".into());
        s += &format!("| {} | {measured} | {met} |\n", t["target"].as_str().unwrap_or(""));
    }
    s
}

pub fn write(out: &Path, name: &str, json: &serde_json::Value, markdown: &str, plot_script: &str) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let json_path = out.join(format!("{name}.json"));
    std::fs::write(&json_path, serde_json::to_string_pretty(json)? + "\n")?;
    std::fs::write(out.join(format!("{name}.md")), markdown)?;
    let png = out.join(format!("{name}.png"));
    let status = Command::new("python3")
        .arg(bench_dir().join(plot_script))
        .arg(&json_path)
        .arg(&png)
        .status()
        .context("running the plot script (python3 with matplotlib)")?;
    if !status.success() {
        bail!("{plot_script} failed ({status}); JSON and markdown are written");
    }
    Ok(())
}
