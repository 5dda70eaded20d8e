//! What starting sandboxes on deploy ([`super::on_deploy`]) keeps: its turn (one start at a
//! time) and its counts.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};
use tokio::sync::Semaphore;

/// What starting sandboxes on deploy has done.
pub(super) struct StartsOnDeploy {
    pub(super) one_at_a_time: Semaphore,
    /// Made and left idle; skipped (the lambda had a sandbox, a newer version came, or the
    /// worker had no room); failed (the cold start's error is logged); still to be made.
    pub(super) made: AtomicU64,
    pub(super) skipped: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) pending: AtomicU64,
}

impl Default for StartsOnDeploy {
    fn default() -> Self {
        StartsOnDeploy {
            one_at_a_time: Semaphore::new(1),
            made: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            pending: AtomicU64::new(0),
        }
    }
}

impl StartsOnDeploy {
    pub(super) fn json(&self) -> Value {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        json!({"made": n(&self.made), "skipped": n(&self.skipped), "failed": n(&self.failed), "pending": n(&self.pending)})
    }
}

/// Counts a start as no longer pending however its task ends.
pub(super) struct Pending<'a>(pub(super) &'a AtomicU64);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
