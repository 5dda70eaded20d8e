//! What the engine asks of the tenants, answered from their store and usage: which of a
//! tenant's lambdas yield the CPU ([`QuotaYield`]) and which group their output counts
//! against ([`LogGroups`] for [`Tenants`]). Which lambdas a handler may call is
//! [`Tenants`]' own `CallPolicy`.

use std::sync::Arc;

use sprout_engine::{CpuYield, LogGroups};

use crate::auth::Tenants;
use crate::quotas::Usage;

/// The engine's [`CpuYield`] policy: a lambda whose tenant is at its invocation quota
/// (flooding it) runs its requests idle on the CPU, so they take only what no other tenant's
/// want; the rate quota alone bounds how many run, not the CPU they take from neighbours.
pub struct QuotaYield {
    pub tenants: Arc<Tenants>,
    pub usage: Arc<Usage>,
}

impl CpuYield for QuotaYield {
    fn yields(&self, lambda: &str) -> bool {
        // Most requests: nobody at a quota, known from one atomic load (no owner lookup).
        let now = self.usage.now();
        self.usage.anyone_at_quota(now) && self.tenants.owner(lambda).is_some_and(|tenant| self.usage.at_quota_at(&tenant, now))
    }
}

/// A tenant's lambdas write their output against one bucket of `log_kb_s` between them
/// (beyond each lambda's `[logs] rate_kb_s`); past it, their lines are dropped and counted.
impl LogGroups for Tenants {
    fn group(&self, lambda: &str) -> Option<(String, u64)> {
        let (tenant, quotas) = self.owner_quotas(lambda)?;
        Some((tenant, quotas.log_kb_s? << 10))
    }
}
