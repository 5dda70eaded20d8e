//! sprout-load: Cloudstone's workload generator (a Faban-style Markov-chain, closed-loop,
//! session-based driver) and the arithmetic that judges a run.

mod browser;
mod chain;
mod checks;
mod control;
mod cost;
mod cycle;
mod drivers;
mod engine;
mod fleet;
mod fleet_agent;
mod fleet_report;
mod fleet_run;
mod fleet_stats;
mod profile;
mod report;
mod run;
mod search;
mod stats;
mod utilization;
mod workload;

// What the command line names; every module stays private behind these.
pub use control::{agent_main, Spec};
pub use cost::{Price, Pricing, HOURS_PER_MONTH};
pub use fleet_run::{fleet_agent_main, run_fleet, FleetRunOptions};
pub use run::{run, RunOptions};
pub use search::{search, Maximum, SearchOptions};
pub use utilization::{cpu_jiffies, pss_of_cgroup};
