//! `sprout cloudstone fleet`: how many mostly idle Olio sites each deployment holds within
//! SLA-2 and a memory budget on the same confined cores, searched site count by site count
//! (deploy, drive every site with its own profile, judge, take down), priced per site-month.

mod args;
mod fleet_file;
mod run;
mod summary;

use std::process::Command;

use anyhow::{bail, Context, Result};
use sprout_bench::fleet::Bracket;

pub use args::FleetArgs;
use fleet_file::read_fleet;
pub use fleet_file::{write_file, FleetFileArgs};
use run::{one_run, FleetStep};
use summary::{previous_stacks, stack_result, summary_text, write_summary, StackResult};

/// The deployments `sprout olio fleet-up` makes.
const STACKS: [&str; 5] = ["sprout", "sprout-runc", "sprout-gvisor", "conventional", "conventional-ondemand"];

/// `sprout cloudstone fleet`.
pub fn search(a: &FleetArgs) -> Result<()> {
    let repo = crate::olio::repo_root()?;
    let exe = std::env::current_exe()?;
    let pricing = sprout_load::Pricing::load(&a.pricing)?;
    let price = pricing.prices.iter().find(|p| p.name == pricing.default).context("the pricing file's default price is missing")?.clone();
    if let Some(bad) = a.stacks.iter().find(|s| !STACKS.contains(&s.as_str())) {
        bail!("--stacks: {bad:?} is not a deployment (choose from {})", STACKS.join(", "));
    }
    // The vassals' settings are fleet-up's to check too; these would fail every run.
    if a.vassal_idle == Some(0) {
        bail!("--vassal-idle 0: give the seconds (at least 1) without a request after which a vassal stops");
    }
    if let Some(p) = a.vassal_processes.as_deref().filter(|p| *p != "auto") {
        if !matches!(p.parse::<u32>(), Ok(1..=32)) {
            bail!("--vassal-processes {p:?}: give auto or a number from 1 to 32");
        }
    }
    // A bad --fleet file is refused before anything starts; its size caps the search.
    let max = match &a.fleet {
        Some(path) => a.max.min(read_fleet(path)?.sites.len()),
        None => a.max,
    };
    std::fs::create_dir_all(&a.out)?;
    // The summary keeps the last search of every deployment: those not searched now stay;
    // with --resume, those searched now continue from the runs they recorded.
    let mut stacks = previous_stacks(a);
    for stack in &a.stacks {
        let mut bracket = Bracket::new(a.start, max, a.resolution, a.min_step);
        let mut steps: Vec<FleetStep> = match stacks.get(stack) {
            Some(old) if a.resume => serde_json::from_value::<StackResult>(old.clone()).map(|r| r.steps).unwrap_or_default(),
            _ => Vec::new(),
        };
        for step in &steps {
            eprintln!("==> {stack}: {} sites {} (recorded)", step.sites, if step.passed { "held" } else { "failed" });
            bracket.record(step.sites, step.passed);
        }
        stacks.remove(stack);
        loop {
            let n = match a.sites {
                Some(n) if steps.is_empty() => n,
                Some(_) => break,
                None => match bracket.next() {
                    Some(n) => n,
                    None => break,
                },
            };
            eprintln!("==> {stack}: {n} sites");
            let (step, teardown) = one_run(a, &exe, stack, n)?;
            eprintln!("==> {stack}: {n} sites {} {}", if step.passed { "held" } else { "failed:" }, step.reason);
            bracket.record(n, step.passed);
            steps.push(step);
            let partial = stack_result(stack, &steps, &bracket, &pricing, &price, a);
            stacks.insert(stack.clone(), serde_json::to_value(&partial)?);
            write_summary(a, &stacks, &price)?;
            teardown.context("taking the fleet down after its run (recorded; continue with --resume once it is down)")?;
        }
        if !steps.is_empty() {
            // A resumed search that was already complete keeps its result.
            stacks.insert(stack.clone(), serde_json::to_value(stack_result(stack, &steps, &bracket, &pricing, &price, a))?);
        }
    }
    let summary = write_summary(a, &stacks, &price)?;
    println!("{}", summary_text(&summary));
    let status = Command::new("python3").arg(repo.join("bench/plot_fleet.py")).arg(&a.json).status();
    match status {
        Ok(s) if s.success() => {}
        other => eprintln!("warning: bench/plot_fleet.py did not draw the plot ({other:?})"),
    }
    Ok(())
}
