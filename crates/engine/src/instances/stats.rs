//! What the instance manager reports: per-lambda figures, the handler cache's and the memory
//! budget's, for `/stats` (JSON) and `/metrics`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};

use super::admission::BudgetFigures;
use super::manager::Instances;
use crate::handler_cache::Eviction;

/// One lambda's figures for `/metrics`.
pub struct LambdaFigures {
    pub name: String,
    /// Sandboxes serving a request or starting.
    pub busy: usize,
    pub idle: usize,
    pub queued: usize,
    pub prewarm: Duration,
    pub keep_alive: Duration,
    pub memory_estimate: Option<u64>,
}

impl Instances {
    /// Per-lambda figures and the handler cache's, for `/stats`.
    pub fn stats(&self) -> Value {
        let pools = self.pools.lock().unwrap();
        let idle_times = self.idle_times.as_ref().map(|t| t.lock().unwrap());
        let keep_alive = |name: &str| match &idle_times {
            Some(idle_times) => {
                let w = idle_times.windows(name);
                json!({"policy": "histogram", "basis": w.basis.as_str(), "prewarm_s": w.prewarm.as_secs_f64(),
                       "keep_alive_s": w.keep_alive.as_secs_f64(), "idle_times": idle_times.samples(name)})
            }
            None => json!({"policy": "fixed", "keep_alive_s": self.cfg.idle_timeout.as_secs_f64()}),
        };
        let estimates = self.memory.estimates.lock().unwrap();
        let mb = |bytes: u64| bytes as f64 / (1 << 20) as f64;
        let per_lambda: serde_json::Map<String, Value> = pools
            .figures()
            .map(|(name, f)| {
                let mut figures = json!({"sandboxes": f.sandboxes, "idle": f.idle, "queued": f.queued, "served": f.served, "keep_alive": keep_alive(name)});
                if self.memory_group.is_some() {
                    figures["memory_estimate_mb"] = json!(mb(estimates.of(name, self.cfg.sandbox_estimate)));
                }
                (name.to_string(), figures)
            })
            .collect();
        let (paused, paused_pss) = pools.paused_figures();
        let budget = match (self.cfg.budget, self.budget_figures()) {
            (Some(budget), Some(f)) => json!({
                "limit_mb": mb(budget.limit), "reserve_mb": mb(budget.reserve), "used_mb": mb(f.used),
                "charged_mb": mb(self.memory_group.as_ref().map(|(layout, group)| layout.memory_usage_of(group)).unwrap_or(0)),
                "pending_mb": mb(f.pending),
                "freeing_mb": mb(f.freeing), "waits": f.waits, "evictions": self.cache.evictions(Eviction::Budget),
                "queued_instead": f.queued_instead,
                "sandbox_estimate_mb": mb(self.cfg.sandbox_estimate),
            }),
            _ => Value::Null,
        };
        json!({
            "total_sandboxes": pools.total(),
            "per_lambda": per_lambda,
            "handler_cache": self.cache.json(&self.cfg.handler_cache, paused, paused_pss),
            "memory_budget": budget,
            "prewarms": {"made": self.prewarms.made.load(Ordering::Relaxed), "skipped": self.prewarms.skipped.load(Ordering::Relaxed)},
            "started_on_deploy": self.on_deploy.json(),
            "long_requests_idled": self.long_requests_idled(),
        })
    }

    /// Each lambda's sandboxes, queue, windows and (under a budget) memory estimate, for
    /// `/metrics`.
    pub fn lambda_figures(&self) -> Vec<LambdaFigures> {
        let pools = self.pools.lock().unwrap();
        let idle_times = self.idle_times.as_ref().map(|t| t.lock().unwrap());
        let estimates = self.memory.estimates.lock().unwrap();
        pools
            .figures()
            .map(|(name, f)| {
                let (prewarm, keep_alive) = match &idle_times {
                    Some(t) => {
                        let w = t.windows(name);
                        (w.prewarm, w.keep_alive)
                    }
                    None => (Duration::ZERO, self.cfg.idle_timeout),
                };
                LambdaFigures {
                    name: name.to_string(),
                    busy: f.sandboxes - f.idle,
                    idle: f.idle,
                    queued: f.queued,
                    prewarm,
                    keep_alive,
                    memory_estimate: self.memory_group.as_ref().map(|_| estimates.of(name, self.cfg.sandbox_estimate)),
                }
            })
            .collect()
    }

    /// Requests that yielded the CPU as long ones (`[limits] long_request_ms`).
    pub fn long_requests_idled(&self) -> u64 {
        self.long_requests_idled.load(Ordering::Relaxed)
    }

    /// The memory budget in bytes, when there is one.
    pub fn budget_limit(&self) -> Option<u64> {
        self.cfg.budget.map(|b| b.limit)
    }

    /// Handler cache figures for /metrics: (paused sandboxes, their PSS, evictions by reason).
    pub fn cache_figures(&self) -> (usize, u64, Vec<(&'static str, u64)>) {
        let (paused, pss) = self.pools.lock().unwrap().paused_figures();
        let evictions = Eviction::ALL.iter().map(|e| (e.label(), self.cache.evictions(*e))).collect();
        (paused, pss, evictions)
    }

    /// The memory budget's accounts, when there is one.
    pub fn budget_figures(&self) -> Option<BudgetFigures> {
        Some(self.memory.figures(self.memory_group.as_ref()?))
    }
}
