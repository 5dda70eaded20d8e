//! The instance manager's settings: how many sandboxes, how long idle ones are kept, the
//! memory budget, the time limit, CPU sharing ([`InstanceConfig`]).

use std::time::Duration;

use sprout_sandbox::Limits;

use crate::budget::Budget;
use crate::handler_cache::HandlerCacheConfig;

#[derive(Debug, Clone)]
pub struct InstanceConfig {
    pub keep_warm: bool,
    /// Make each arriving lambda a sandbox at once and leave it idle ([`super::on_deploy`]).
    pub start_on_deploy: bool,
    pub idle_timeout: Duration,
    /// Keep each lambda's idle sandboxes for the windows its idle times give
    /// ([`crate::keepalive`]); None: `idle_timeout` for every lambda.
    pub keep_alive: Option<crate::keepalive::Policy>,
    pub max_per_lambda: usize,
    pub queue_depth: usize,
    pub max_total: usize,
    /// Time limit of one request in its sandbox; also the longest a request may queue.
    pub timeout: Duration,
    pub limits: Limits,
    pub handler_cache: HandlerCacheConfig,
    /// The whole worker's memory budget ([`crate::budget`]); None: no budget.
    pub budget: Option<Budget>,
    /// Memory a lambda's sandbox is assumed to need until one has been measured.
    pub sandbox_estimate: u64,
    /// Each lambda's CPU weight ([`crate::cpu_shares`]): each of its sandboxes', or split
    /// among them (`cpu_weight_split`); 0 leaves every sandbox at its cgroup's default.
    pub lambda_cpu_weight: u64,
    pub cpu_weight_split: bool,
    /// A request running longer idles its sandbox's cgroup for the rest of its run, so
    /// shorter requests take a contended CPU at once; None: never.
    pub long_request: Option<Duration>,
    /// While long requests run, wake every CPU this often ([`crate::ticker`]); None: never.
    pub preempt_tick: Option<Duration>,
    /// Where the tick threads may run as real-time ones: the cpu hierarchy's root `tasks`.
    pub rt_home: Option<std::path::PathBuf>,
}
