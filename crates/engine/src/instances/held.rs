//! Sandboxes held beyond one request: a user lease's parts ([`Instances::hold`]), each
//! busy to the pools all along (never paused, reaped or evicted), run on one request at a
//! time, and destroyed when the [`Held`] is dropped.

use std::sync::Arc;
use std::time::Duration;

use sprout_sandbox::channel::Request;
use sprout_sandbox::Calls;

use super::kept::Lease;
use super::manager::Instances;
use super::outcome::{Failure, Invocation};
use crate::logs::RequestTag;
use crate::registry::Lambda;

/// A sandbox held beyond one request ([`Instances::hold`]): destroyed when dropped, never
/// returned to the idle pool (it holds a client's state).
pub struct Held {
    /// None once its sandbox died.
    pub(super) lease: Option<Lease>,
    pub(super) owner: std::sync::Weak<Instances>,
}

impl Held {
    /// Its sandbox died (or failed a request): it holds nothing.
    pub fn is_lost(&self) -> bool {
        self.lease.is_none()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let (Some(lease), Some(owner)) = (self.lease.take(), self.owner.upgrade()) {
            owner.release(lease, false);
        }
    }
}

impl Instances {
    /// Hold a sandbox of `lambda` (an idle one, or a new one within `wait`, through the usual
    /// admission) until the [`Held`] is dropped: busy to the pools all along, so never paused,
    /// reaped or evicted. A user lease's part ([`crate::lease_routes`]).
    pub async fn hold(&self, lambda: &Arc<Lambda>, wait: Duration) -> Result<Held, Failure> {
        let lease = self.acquire(lambda, wait).await?;
        Ok(Held { lease: Some(lease), owner: self.me.clone() })
    }

    /// Run a request on a held sandbox, as [`Instances::invoke`] runs one (logged the same
    /// way, within `limit`), keeping the sandbox afterwards; never retried. A sandbox that
    /// failed (crashed, ran out of memory or time) or cannot serve again is destroyed, and the
    /// [`Held`] holds nothing from then on ([`Held::is_lost`]).
    pub async fn run_held(
        &self,
        held: &mut Held,
        request: &Request,
        body: &[u8],
        limit: Duration,
        calls: &dyn Calls,
        tag: &RequestTag,
    ) -> Result<Invocation, Failure> {
        let Some(lease) = held.lease.as_mut() else {
            return Err(Failure::Platform("the held sandbox is gone".into()));
        };
        let (result, ran) = self.run_on(lease, request, body, limit, calls, tag).await;
        let (cold, sandbox) = (lease.cold, lease.kept.sandbox.id());
        lease.cold = false;
        if result.is_err() || !lease.kept.sandbox.reusable() {
            if let Some(lease) = held.lease.take() {
                self.release(lease, false);
            }
        }
        let (reply, body) = result?;
        Ok(Invocation { reply, body, cold, sandbox, ran })
    }
}
