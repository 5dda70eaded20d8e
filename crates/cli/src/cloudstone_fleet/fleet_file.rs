//! Fleet files: `sprout cloudstone fleet-file` writes one (its flags, and how busy its
//! sites are), `--fleet` reads one.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use sprout_bench::fleet::{self, FleetParams};

#[derive(Args, Clone)]
pub struct FleetFileArgs {
    #[arg(long)]
    pub sites: usize,
    #[arg(long, default_value_t = 300.0)]
    pub span: f64,
    #[arg(long, default_value_t = 60.0)]
    pub session_mean: f64,
    #[arg(long, default_value_t = 100)]
    pub registered_users: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to write it (- for stdout).
    #[arg(long, default_value = "-")]
    pub out: PathBuf,
}

pub(super) fn read_fleet(path: &Path) -> Result<fleet::FleetFile> {
    let text = std::fs::read(path).with_context(|| format!("reading the fleet file {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parsing the fleet file {}", path.display()))
}

/// `sprout cloudstone fleet-file`: one fleet file, and how busy its sites are.
pub fn write_file(a: &FleetFileArgs) -> Result<()> {
    let file = fleet::fleet(&FleetParams {
        sites: a.sites,
        span_s: a.span,
        seed: a.seed,
        session_mean_s: a.session_mean,
        registered_users: a.registered_users,
        ..FleetParams::default()
    });
    let text = serde_json::to_string_pretty(&file)?;
    if a.out == Path::new("-") {
        println!("{text}");
    } else {
        std::fs::write(&a.out, text).with_context(|| format!("writing {}", a.out.display()))?;
    }
    eprintln!("{}", describe(&file));
    Ok(())
}

pub(super) fn describe(file: &fleet::FleetFile) -> String {
    let active = file.sites.iter().filter(|s| s.sessions > 0).count();
    let users: f64 = file.sites.iter().map(|s| s.mean_users).sum();
    let peak = file.sites.iter().map(|s| s.peak_users).max().unwrap_or(0);
    format!(
        "{} sites over {:.0} s: {active} with a visit, {users:.1} users on average in all, the busiest site {peak} at once",
        file.sites.len(),
        file.span_s
    )
}
