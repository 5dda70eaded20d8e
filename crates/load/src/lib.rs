//! sprout-load: Cloudstone's workload generator (a Faban-style Markov-chain, closed-loop,
//! session-based driver) and the arithmetic that judges a run.

pub mod browser;
pub mod chain;
pub mod checks;
pub mod control;
pub mod cost;
pub mod cycle;
pub mod drivers;
pub mod engine;
pub mod fleet;
pub mod fleet_agent;
pub mod fleet_report;
pub mod fleet_run;
pub mod fleet_stats;
pub mod profile;
pub mod report;
pub mod run;
pub mod search;
pub mod stats;
pub mod utilization;
pub mod workload;
