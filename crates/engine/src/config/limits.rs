//! `[limits]`, `[instances]` and `[handler_cache]`: what each sandbox and request may use, how
//! many sandboxes a lambda and the worker may have, and how long idle ones are kept.

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsSection {
    pub memory_mb: u64,
    pub pids: u64,
    pub cpus: f64,
    pub timeout_ms: u64,
    pub max_body_mb: u64,
    pub max_response_mb: u64,
    pub max_upload_mb: u64,
    pub max_unpacked_mb: u64,
    pub max_files: usize,
    pub max_invoke_depth: u32,
    /// Each lambda's CPU weight (cgroup v2's scale), each of its sandboxes' or split among
    /// them ([`CpuWeightPer`]); 0: each sandbox its cgroup's default.
    pub cpu_weight: u64,
    pub cpu_weight_per: CpuWeightPer,
    /// A request that has computed for half of this by the time it has run this long
    /// (milliseconds; checked again every as long) yields the CPU to other requests for the
    /// rest of its run (its sandbox's cgroup idles); 0: never.
    pub long_request_ms: u64,
    /// While long requests run, wake each CPU this often (microseconds, [`crate::ticker`]); 0: never.
    pub preempt_tick_us: u64,
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            memory_mb: 128,
            pids: 64,
            cpus: 1.0,
            timeout_ms: 30_000,
            max_body_mb: 6,
            max_response_mb: 16,
            max_upload_mb: 50,
            max_unpacked_mb: 200,
            max_files: 10_000,
            max_invoke_depth: 8,
            cpu_weight: 100,
            cpu_weight_per: CpuWeightPer::Sandbox,
            long_request_ms: 50,
            preempt_tick_us: 250,
        }
    }
}

/// `[limits] cpu_weight_per`: what `cpu_weight` weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuWeightPer {
    /// Each sandbox weighs `cpu_weight`, as a pod or a function invocation elsewhere gets its
    /// own share: a lambda's concurrency (at most `instances.max_per_lambda`) buys CPU, and its
    /// requests in flight finish before new cold starts take the CPU.
    Sandbox,
    /// A lambda's `cpu_weight` is split evenly among its live sandboxes: it gets no more of a
    /// contended CPU by running more of them, at a cost to its own tail latency (its
    /// sandboxes, weighing a fraction each, wait behind the worker's and the Zygotes' work
    /// for its next cold starts: issue 51 measured 1.6-2x the p99 at concurrency 10).
    Lambda,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InstancesSection {
    pub keep_warm: bool,
    /// Make each lambda that arrives (a new version, uploaded or from the fleet's registry) a
    /// sandbox at once, left idle for its keep-alive: under gVisor's parking its first request
    /// restores a handler already loaded.
    pub start_on_deploy: bool,
    pub idle_timeout_s: u64,
    /// How long idle sandboxes are kept: `idle_timeout_s` for all (`fixed`), or per lambda
    /// from its idle times (`histogram`, the default: the hybrid histogram policy, falling back
    /// to `idle_timeout_s` while it has too few; with a pre-warm window, the sandbox goes
    /// after its request and a new one is started that long after).
    pub keep_alive: KeepAlive,
    pub max_per_lambda: usize,
    pub queue_depth: usize,
    pub max_total: usize,
    /// The whole worker's memory budget, MiB (0: none): see crate::budget.
    pub memory_budget_mb: u64,
    /// Memory a lambda's sandbox is assumed to need until one has been measured, MiB.
    pub sandbox_estimate_mb: u64,
}

/// `[instances] keep_alive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeepAlive {
    Histogram,
    Fixed,
}

impl Default for InstancesSection {
    fn default() -> Self {
        InstancesSection {
            keep_warm: true,
            start_on_deploy: false,
            idle_timeout_s: 300,
            keep_alive: KeepAlive::Histogram,
            max_per_lambda: 16,
            queue_depth: 64,
            max_total: 256,
            memory_budget_mb: 0,
            sandbox_estimate_mb: 32,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HandlerCacheSection {
    pub pause: bool,
    pub pause_after_ms: u64,
    pub memory_mb: u64,
}

impl Default for HandlerCacheSection {
    fn default() -> Self {
        HandlerCacheSection { pause: true, pause_after_ms: 100, memory_mb: 1024 }
    }
}

impl LimitsSection {
    /// Each sandbox's limits, as the sandbox engine takes them.
    pub fn sandbox_limits(&self) -> sprout_sandbox::Limits {
        sprout_sandbox::Limits { memory_bytes: self.memory_mb << 20, pids: self.pids, cpus: self.cpus }
    }

    /// The time limit of one request.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}
