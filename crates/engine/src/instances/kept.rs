//! What the pools hold: a sandbox with the version of the lambda it serves ([`Kept`]), a
//! queued request's end of its hand-off, a sandbox lent to one request, and the token that
//! counts a lambda's sandbox from its admission ([`Made`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sprout_sandbox::Sandbox;
use tokio::sync::oneshot;

use super::pools::{Grant, Occupant, Waiter};
use crate::logs::SandboxOutput;
use crate::registry::Lambda;

/// A sandbox and the version of the lambda it serves: what the pools keep.
pub(super) struct Kept {
    pub sandbox: Box<dyn Sandbox>,
    pub lambda: Arc<Lambda>,
    /// The back-end that made it.
    pub backend: &'static str,
    /// Where its output goes: its lambda's log.
    pub output: Arc<SandboxOutput>,
    /// Counts it among its lambda's sandboxes while it exists and the pools hold it.
    pub made: Made,
}

impl Occupant for Kept {
    fn id(&self) -> u64 {
        self.sandbox.id()
    }
    fn version(&self) -> u64 {
        self.lambda.version
    }
    fn is_current(&self) -> bool {
        self.lambda.is_current()
    }
    fn leaves(&mut self) {
        self.made.release();
    }
}

/// A queued request's end of its hand-off.
pub(super) type Handoff = oneshot::Sender<Grant<Kept>>;

impl Waiter<Kept> for Handoff {
    fn grant(self, grant: Grant<Kept>) -> Result<(), Grant<Kept>> {
        self.send(grant)
    }
    fn is_gone(&self) -> bool {
        self.is_closed()
    }
}

/// A sandbox lent to one request.
pub(super) struct Lease {
    pub kept: Kept,
    pub cold: bool,
}

/// One sandbox of a lambda, counted from its admission while it is made and exists (held
/// by its [`Kept`]) until released: when the pools give it up, or when it is dropped.
pub(super) struct Made(Option<Arc<AtomicUsize>>);

impl Made {
    /// Count one more sandbox on `count` until released.
    pub(super) fn on(count: Arc<AtomicUsize>) -> Made {
        count.fetch_add(1, Ordering::AcqRel);
        Made(Some(count))
    }

    /// Stop counting it (once; later calls do nothing).
    pub(super) fn release(&mut self) {
        if let Some(count) = self.0.take() {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Made {
    fn drop(&mut self) {
        self.release();
    }
}
