//! How a request's sandbox shares its CPU: the lambdas' weights written to their sandboxes'
//! cgroups ([`crate::cpu_shares`] decides them), and a long request idled for the rest of its
//! run, with preemption ticks meanwhile ([`crate::ticker`]).

use std::time::Duration;

use sprout_sandbox::cgroup::CpuControl;

/// Run `invoke`; if it is still running `after` from now (at once for zero), idle its
/// sandbox's cgroup until it ends (a long request yields a contended CPU to short ones), and
/// not after; says whether it idled.
pub(super) async fn yield_when_long<T>(
    invoke: impl std::future::Future<Output = T>,
    after: Duration,
    cpu: &CpuControl,
    ticker: Option<&crate::ticker::Ticker>,
) -> (T, bool) {
    tokio::pin!(invoke);
    if !after.is_zero() {
        tokio::select! {
            done = &mut invoke => return (done, false),
            _ = tokio::time::sleep(after) => {}
        }
    }
    let idled = cpu.set_idle(true).unwrap_or_else(|e| {
        tracing::debug!("idling a long request's sandbox: {e}");
        false
    });
    let ticking = ticker.filter(|_| idled).map(crate::ticker::Ticker::long_request);
    let done = invoke.await;
    drop(ticking);
    if idled {
        if let Err(e) = cpu.set_idle(false) {
            tracing::warn!("a long request's sandbox stays idle on the CPU: {e}");
        }
    }
    (done, idled)
}

/// Write sandboxes' CPU weights (a sandbox gone meanwhile has no file: nothing to do).
pub(super) fn write_cpu_weights(writes: Vec<(CpuControl, u64)>) {
    for (handle, weight) in writes {
        if let Err(e) = handle.set_weight(weight) {
            tracing::debug!("setting a sandbox's CPU weight: {e}");
        }
    }
}
