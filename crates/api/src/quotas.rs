//! Tenants' quotas: the limits the operator sets per tenant ([`Quotas`], kept with the tenant
//! in `DIR/tenants.json`) and what is in use against them now ([`Usage`]: a token bucket of
//! invocations per second and the invocations in flight, per tenant, in memory). Each refusal
//! names its quota and limit, and is counted per tenant and quota for `/metrics`
//! (`sprout_tenant_quota_refusals_total`). The operator's own lambdas have no quota.
//!
//! - `lambdas`: how many lambdas the tenant may own; a new one past it is 429 `quota_exceeded`.
//! - `code_mb`: its lambdas' archives together, as uploaded; an upload past it is 413
//!   `code_quota_exceeded` (the version it would replace is not counted).
//! - `invocations_per_s`: invocations from outside (`/run`, `/map`, the app port) a second,
//!   with a burst of one second's worth; more is 429 `quota_exceeded` at once (never queued,
//!   so a flooding tenant holds no sandbox and no queue place of another's).
//! - `concurrent`: its invocations in flight at once; one more is 429 `quota_exceeded`.
//! - `memory_mb`: its share of the memory budget — its invocations in flight, each counted at
//!   a sandbox's memory limit (`[limits] memory_mb`: what the kernel lets it hold); one more
//!   is 429 `quota_exceeded`. Idle sandboxes are not counted: the budget evicts them for any
//!   tenant's cold start.
//! - `log_kb_s`: its lambdas' output together, KB a second (a second's worth at once); past
//!   it lines are dropped, counted (`sprout_tenant_log_dropped_bytes_total`) and noted in the
//!   log, as past a lambda's own `[logs] rate_kb_s`.
//! - `files_mb`: its blobs and its leases' files together; an upload past it is 413
//!   `files_quota_exceeded` ([`crate::stored_files`]).
//!
//! A tenant refused an invocation within the last second is at its quota: its requests
//! meanwhile run idle on the CPU ([`crate::tenant_policies::QuotaYield`]), so a flood within its rate takes no CPU
//! another tenant's requests want.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sprout_engine::ErrorCode;

use crate::http::ApiError;

/// A tenant's limits; None: no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lambdas: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocations_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_kb_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_mb: Option<u64>,
}

impl Quotas {
    /// Why these limits cannot be set, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        match self.invocations_per_s {
            Some(rate) if !(rate.is_finite() && rate > 0.0) => Err(format!("invocations_per_s must be above 0, not {rate}")),
            _ if self.concurrent == Some(0) => Err("concurrent must be at least 1 (leave it out: no limit)".into()),
            _ if self.memory_mb == Some(0) => Err("memory_mb must be at least 1 (leave it out: no limit)".into()),
            _ if self.log_kb_s == Some(0) => Err("log_kb_s must be at least 1 (leave it out: no limit)".into()),
            _ => Ok(()),
        }
    }
}

/// A refusal: which quota, its limit, and the error's status (429, or 413 for code).
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub quota: &'static str,
    pub limit: f64,
}

impl Refused {
    /// The refusal's words, naming the quota and its limit.
    pub fn message(&self, tenant: &str) -> String {
        match self.quota {
            "lambdas" => format!("tenant {tenant:?} owns its quota of {} lambdas: delete one first", self.limit),
            "code_mb" => {
                format!("this upload would take tenant {tenant:?} past its code quota of {} MB (its archives together)", self.limit)
            }
            "invocations_per_s" => {
                format!("tenant {tenant:?} is past its quota of {} invocations a second: try again in a moment", self.limit)
            }
            "memory_mb" => format!(
                "tenant {tenant:?}'s invocations in flight hold its quota of {} MB (each counted at a sandbox's memory limit): \
                 try again when one ends",
                self.limit
            ),
            "files_mb" => format!(
                "this upload would take tenant {tenant:?} past its quota of {} MB of stored files (its blobs and leases' files together)",
                self.limit
            ),
            _ => format!("tenant {tenant:?} has its quota of {} invocations in flight: try again when one ends", self.limit),
        }
    }

    /// The error to answer (`code`: 429 `quota_exceeded`, or 413 for code bytes), its body
    /// naming the quota, its limit and the tenant.
    pub fn error(&self, code: ErrorCode, tenant: &str) -> ApiError {
        ApiError::new(code, self.message(tenant)).with("quota", self.quota).with("limit", self.limit).with("tenant", tenant)
    }
}

/// How long a tenant counts as at its invocation quota after a refusal, in seconds: its
/// requests meanwhile yield the CPU to every other tenant's
/// ([`crate::tenant_policies::QuotaYield`]).
pub const AT_QUOTA: f64 = 1.0;

/// A token bucket: `rate` tokens a second, holding at most `burst`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    /// Seconds, on the caller's clock, of the last refill.
    last: f64,
}

impl TokenBucket {
    /// A full bucket of one second's worth (at least one token).
    pub fn new(rate: f64, now: f64) -> TokenBucket {
        let burst = rate.max(1.0);
        TokenBucket { rate, burst, tokens: burst, last: now }
    }

    /// Take a token at `now` (seconds), if there is one.
    pub fn try_take(&mut self, now: f64) -> bool {
        self.tokens = (self.tokens + (now - self.last).max(0.0) * self.rate).min(self.burst);
        self.last = self.last.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug, Default)]
struct TenantUse {
    /// The bucket and the rate it was made for (made again when the quota changes).
    bucket: Option<(f64, TokenBucket)>,
    in_flight: u64,
    /// Its invocations in flight's memory, counted at the sandboxes' limit, MB.
    memory_in_flight: u64,
    refused: HashMap<&'static str, u64>,
    /// When (on the usage's clock) an invocation was last refused.
    last_refused: Option<f64>,
}

/// What each tenant uses now, against its quotas.
#[derive(Debug)]
pub struct Usage {
    started: Instant,
    /// The latest invocation refusal of any tenant (an f64's bits, seconds on this clock), so
    /// most requests learn that nobody is at a quota without a lock.
    last_refusal: AtomicU64,
    /// What an invocation in flight counts against `memory_mb`: a sandbox's memory limit.
    sandbox_mb: u64,
    tenants: Mutex<HashMap<String, TenantUse>>,
}

impl Default for Usage {
    fn default() -> Usage {
        Usage::new(128)
    }
}

/// An invocation counted in flight until dropped.
pub struct InFlight<'a> {
    usage: &'a Usage,
    tenant: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut tenants = self.usage.lock();
        if let Some(u) = tenants.get_mut(&self.tenant) {
            u.in_flight = u.in_flight.saturating_sub(1);
            u.memory_in_flight = u.memory_in_flight.saturating_sub(self.usage.sandbox_mb);
        }
    }
}

impl Usage {
    /// Usage counting each invocation in flight at `sandbox_mb` (`[limits] memory_mb`).
    pub fn new(sandbox_mb: u64) -> Usage {
        let last_refusal = AtomicU64::new(f64::NEG_INFINITY.to_bits());
        Usage { started: Instant::now(), last_refusal, sandbox_mb, tenants: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TenantUse>> {
        self.tenants.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admit one invocation of `tenant` under `quotas` at `now` (seconds on this usage's
    /// clock), counting it in flight; or refuse it, counted.
    pub fn admit_at(&self, tenant: &str, quotas: &Quotas, now: f64) -> Result<InFlight<'_>, Refused> {
        let mut tenants = self.lock();
        let u = tenants.entry(tenant.to_string()).or_default();
        let refused = match (quotas.concurrent, quotas.invocations_per_s) {
            (Some(limit), _) if u.in_flight >= limit => Some(Refused { quota: "concurrent", limit: limit as f64 }),
            _ if quotas.memory_mb.is_some_and(|limit| u.memory_in_flight + self.sandbox_mb > limit) => {
                Some(Refused { quota: "memory_mb", limit: quotas.memory_mb.unwrap_or_default() as f64 })
            }
            (_, Some(rate)) => {
                if u.bucket.as_ref().is_none_or(|(r, _)| *r != rate) {
                    u.bucket = Some((rate, TokenBucket::new(rate, now)));
                }
                let taken = u.bucket.as_mut().is_some_and(|(_, b)| b.try_take(now));
                (!taken).then_some(Refused { quota: "invocations_per_s", limit: rate })
            }
            _ => None,
        };
        if let Some(r) = refused {
            *u.refused.entry(r.quota).or_default() += 1;
            u.last_refused = Some(now);
            self.last_refusal.store(now.to_bits(), Ordering::Relaxed);
            return Err(r);
        }
        u.in_flight += 1;
        u.memory_in_flight += self.sandbox_mb;
        Ok(InFlight { usage: self, tenant: tenant.to_string() })
    }

    /// What an invocation in flight counts against `memory_mb`, MB.
    pub fn sandbox_mb(&self) -> u64 {
        self.sandbox_mb
    }

    /// Seconds on this usage's clock.
    pub fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// [`Usage::admit_at`] now.
    pub fn admit(&self, tenant: &str, quotas: &Quotas) -> Result<InFlight<'_>, Refused> {
        self.admit_at(tenant, quotas, self.now())
    }

    /// Whether any tenant had an invocation refused within [`AT_QUOTA`] before `now` (no lock).
    pub fn anyone_at_quota(&self, now: f64) -> bool {
        now - f64::from_bits(self.last_refusal.load(Ordering::Relaxed)) < AT_QUOTA
    }

    /// Whether `tenant` had an invocation refused within [`AT_QUOTA`] before `now`.
    pub fn at_quota_at(&self, tenant: &str, now: f64) -> bool {
        self.anyone_at_quota(now) && self.lock().get(tenant).and_then(|u| u.last_refused).is_some_and(|t| now - t < AT_QUOTA)
    }

    /// Count a refusal made elsewhere (an upload past `lambdas` or `code_mb`).
    pub fn count_refusal(&self, tenant: &str, quota: &'static str) {
        *self.lock().entry(tenant.to_string()).or_default().refused.entry(quota).or_default() += 1;
    }

    /// `tenant`'s invocations in flight and refusals by quota.
    pub fn of(&self, tenant: &str) -> Value {
        let tenants = self.lock();
        let Some(u) = tenants.get(tenant) else { return json!({"in_flight": 0, "refused": {}}) };
        json!({"in_flight": u.in_flight, "refused": u.refused})
    }

    /// Prometheus lines: refusals by tenant and quota, invocations in flight by tenant, and
    /// `log_drops` (each tenant's output dropped past its `log_kb_s`, in bytes).
    pub fn prometheus(&self, log_drops: &[(String, u64)]) -> String {
        let tenants = self.lock();
        let mut names: Vec<&String> = tenants.keys().collect();
        names.sort();
        let mut out = String::from(
            "# HELP sprout_tenant_quota_refusals_total Requests refused by a tenant's quota.\n\
             # TYPE sprout_tenant_quota_refusals_total counter\n",
        );
        for name in &names {
            let mut quotas: Vec<_> = tenants[*name].refused.iter().collect();
            quotas.sort();
            for (quota, count) in quotas {
                out += &format!("sprout_tenant_quota_refusals_total{{tenant=\"{name}\",quota=\"{quota}\"}} {count}\n");
            }
        }
        out += "# HELP sprout_tenant_in_flight A tenant's invocations in flight.\n# TYPE sprout_tenant_in_flight gauge\n";
        for name in &names {
            out += &format!("sprout_tenant_in_flight{{tenant=\"{name}\"}} {}\n", tenants[*name].in_flight);
        }
        out += "# HELP sprout_tenant_log_dropped_bytes_total A tenant's lambdas' output dropped past its log_kb_s quota.\n\
                # TYPE sprout_tenant_log_dropped_bytes_total counter\n";
        for (tenant, bytes) in log_drops {
            out += &format!("sprout_tenant_log_dropped_bytes_total{{tenant=\"{tenant}\"}} {bytes}\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_a_seconds_worth_at_once_then_its_rate() {
        let mut bucket = TokenBucket::new(10.0, 0.0);
        assert_eq!((0..20).filter(|_| bucket.try_take(0.0)).count(), 10);
        assert!(!bucket.try_take(0.05));
        assert!(bucket.try_take(0.1));
        assert_eq!((0..100).filter(|_| bucket.try_take(100.0)).count(), 10, "it holds one second's worth, no more");
        let mut slow = TokenBucket::new(0.5, 0.0);
        assert!(slow.try_take(0.0) && !slow.try_take(1.0) && slow.try_take(2.0));
        // A clock that steps back gives nothing and takes nothing.
        assert!(!slow.try_take(1.0));
    }

    #[test]
    fn invocations_past_the_rate_are_refused_and_counted() {
        let usage = Usage::default();
        let quotas = Quotas { invocations_per_s: Some(2.0), ..Quotas::default() };
        let admitted: Vec<_> = (0..5).map(|_| usage.admit_at("a", &quotas, 0.0)).collect();
        assert_eq!(admitted.iter().filter(|r| r.is_ok()).count(), 2);
        assert_eq!(admitted[4].as_ref().err(), Some(&Refused { quota: "invocations_per_s", limit: 2.0 }));
        drop(admitted);
        assert!(usage.admit_at("a", &quotas, 0.5).is_ok());
        // Another tenant has its own bucket; no quota is no limit.
        assert!(usage.admit_at("b", &quotas, 0.0).is_ok());
        assert!((0..100).all(|_| usage.admit_at("c", &Quotas::default(), 0.0).is_ok()));
        assert_eq!(usage.of("a")["refused"]["invocations_per_s"], 3);
        // Refused, `a` is at its quota for a second after; `b` never was.
        assert!(usage.at_quota_at("a", 0.9) && !usage.at_quota_at("a", 1.5) && !usage.at_quota_at("b", 0.0));
        assert!(usage.anyone_at_quota(0.9) && !usage.anyone_at_quota(1.5) && !Usage::default().anyone_at_quota(0.0));
        assert!(usage.prometheus(&[]).contains("sprout_tenant_quota_refusals_total{tenant=\"a\",quota=\"invocations_per_s\"} 3\n"));
    }

    #[test]
    fn invocations_in_flight_are_bounded_and_freed_when_they_end() {
        let usage = Usage::default();
        let quotas = Quotas { concurrent: Some(2), ..Quotas::default() };
        let first = usage.admit_at("a", &quotas, 0.0).unwrap();
        let _second = usage.admit_at("a", &quotas, 0.0).unwrap();
        let refused = usage.admit_at("a", &quotas, 0.0).err().unwrap();
        assert_eq!(refused, Refused { quota: "concurrent", limit: 2.0 });
        assert!(refused.message("a").contains("2 invocations in flight"));
        assert_eq!(usage.of("a")["in_flight"], 2);
        drop(first);
        assert!(usage.admit_at("a", &quotas, 0.0).is_ok());
        assert!(usage.prometheus(&[]).contains("sprout_tenant_in_flight{tenant=\"a\"} 1\n"));
    }

    #[test]
    fn invocations_in_flight_hold_memory_at_the_sandboxes_limit() {
        let usage = Usage::new(128);
        let quotas = Quotas { memory_mb: Some(300), ..Quotas::default() };
        let first = usage.admit_at("a", &quotas, 0.0).unwrap();
        let _second = usage.admit_at("a", &quotas, 0.0).unwrap();
        let refused = usage.admit_at("a", &quotas, 0.0).err().unwrap();
        assert_eq!(refused, Refused { quota: "memory_mb", limit: 300.0 });
        assert!(refused.message("a").contains("quota of 300 MB"));
        drop(first);
        assert!(usage.admit_at("a", &quotas, 0.0).is_ok());
    }

    #[test]
    fn a_changed_rate_takes_effect_at_once() {
        let usage = Usage::default();
        let one = Quotas { invocations_per_s: Some(1.0), ..Quotas::default() };
        assert!(usage.admit_at("a", &one, 0.0).is_ok());
        assert!(usage.admit_at("a", &one, 0.0).is_err());
        let more = Quotas { invocations_per_s: Some(100.0), ..Quotas::default() };
        assert!(usage.admit_at("a", &more, 0.0).is_ok());
    }

    #[test]
    fn limits_are_checked() {
        assert!(Quotas { invocations_per_s: Some(0.0), ..Quotas::default() }.check().is_err());
        assert!(Quotas { invocations_per_s: Some(f64::NAN), ..Quotas::default() }.check().is_err());
        assert!(Quotas { concurrent: Some(0), ..Quotas::default() }.check().is_err());
        assert!(Quotas { memory_mb: Some(0), ..Quotas::default() }.check().is_err());
        assert!(Quotas { log_kb_s: Some(0), ..Quotas::default() }.check().is_err());
        assert!(Quotas { lambdas: Some(0), code_mb: Some(0), ..Quotas::default() }.check().is_ok());
        assert!(serde_json::from_str::<Quotas>(r#"{"lambdaz": 1}"#).is_err());
    }
}
