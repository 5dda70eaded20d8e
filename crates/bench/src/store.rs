//! `sprout bench store`: Mirage's storage benchmark (figure 3) for sprout.store. The workload
//! runs in Python, where the store and its peers live (bench/store_bench.py: it pins itself
//! to CPU 1 and the PostgreSQL server it starts to CPU 0); this drives it and draws the plot.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::report::bench_dir;

pub fn run(out: &Path, iterations: u64, sizes: &str, systems: &str, repeats: u64) -> Result<()> {
    let status = Command::new("python3")
        .arg(bench_dir().join("store_bench.py"))
        .arg(out)
        .args(["--iterations", &iterations.to_string(), "--sizes", sizes, "--systems", systems, "--repeats", &repeats.to_string()])
        .status()
        .context("running bench/store_bench.py (python3 with sqlalchemy, peewee and psycopg: scripts/setup.sh installs them)")?;
    if !status.success() {
        bail!("bench/store_bench.py failed ({status})");
    }
    let plotted = Command::new("python3")
        .arg(bench_dir().join("plot_store.py"))
        .arg(out.join("store.json"))
        .arg(out.join("store.png"))
        .status()
        .context("running bench/plot_store.py")?;
    if !plotted.success() {
        bail!("bench/plot_store.py failed ({plotted}); store.json and store.md are written");
    }
    Ok(())
}
