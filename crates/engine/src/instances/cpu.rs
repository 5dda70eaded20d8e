//! How a request's sandbox shares its CPU: the lambdas' weights written to their sandboxes'
//! cgroups ([`crate::cpu_shares`] decides them), and a long request idled for the rest of its
//! run, with preemption ticks meanwhile ([`crate::ticker`]).

use std::time::Duration;

use sprout_sandbox::cgroup::CpuControl;

/// What a request must have computed by a check, `after` of its run or more, to count as
/// long: half of it (a CPU-bound request alone on its CPU computes all of it).
const LONG_SHARE: u32 = 2;

/// Run `invoke`; once it has computed for `after` / [`LONG_SHARE`] (checked every `after`;
/// at once for zero), idle its sandbox's cgroup until it ends (a long request yields a
/// contended CPU to short ones), and not after. Says whether it idled, and the CPU time its
/// sandbox used meanwhile (where its cgroup's can be read; not read for a request done before
/// the first check, whose time says it is short).
///
/// Long means computing, not waiting: on a CPU crowded with cold starts a no-op request
/// takes longer than `after` while it computes for a fraction of a millisecond, and idling
/// it (with preemption ticks) only slowed every request more (issue 51: a quarter of the
/// cold starts a second and 5x the p99). Where the CPU time cannot be read, the time alone
/// decides.
pub(super) async fn yield_when_long<T>(
    invoke: impl std::future::Future<Output = T>,
    after: Duration,
    cpu: &CpuControl,
    ticker: Option<&crate::ticker::Ticker>,
) -> (T, bool, Option<Duration>) {
    let began = cpu.used();
    let used = |cpu: &CpuControl| Some(cpu.used()?.saturating_sub(began?));
    tokio::pin!(invoke);
    if !after.is_zero() {
        let mut checked = false;
        loop {
            tokio::select! {
                // Done before the first check it is short whatever it computed: its CPU time
                // is not read again (most requests end here, on the warm path).
                done = &mut invoke => return (done, false, if checked { used(cpu) } else { None }),
                _ = tokio::time::sleep(after) => {}
            }
            checked = true;
            match used(cpu) {
                Some(computed) if computed < after / LONG_SHARE => continue,
                _ => break,
            }
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
    (done, idled, used(cpu))
}

/// Write sandboxes' CPU weights (a sandbox gone meanwhile has no file: nothing to do).
pub(super) fn write_cpu_weights(writes: Vec<(CpuControl, u64)>) {
    for (handle, weight) in writes {
        if let Err(e) = handle.set_weight(weight) {
            tracing::debug!("setting a sandbox's CPU weight: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup directory (v2's files) whose CPU time the test sets.
    fn group(dir: &std::path::Path, usec: u64) -> CpuControl {
        std::fs::write(dir.join("cpu.stat"), format!("usage_usec {usec}\nuser_usec 0\n")).unwrap();
        std::fs::write(dir.join("cpu.idle"), "0").unwrap();
        CpuControl::at(dir, false)
    }

    fn idle_written(dir: &std::path::Path) -> bool {
        std::fs::read_to_string(dir.join("cpu.idle")).unwrap() == "1"
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_waits_for_the_cpu_is_not_long() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = group(dir.path(), 1_000);
        let invoke = async {
            tokio::time::sleep(Duration::from_millis(180)).await;
            std::fs::write(dir.path().join("cpu.stat"), "usage_usec 1300\n").unwrap();
            "done"
        };
        let (done, idled, used) = yield_when_long(invoke, Duration::from_millis(50), &cpu, None).await;
        assert_eq!((done, idled), ("done", false));
        assert_eq!(used, Some(Duration::from_micros(300)));
        assert!(!idle_written(dir.path()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_computes_is_idled_at_the_first_check_past_half() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = group(dir.path(), 0);
        let path = dir.path().join("cpu.stat");
        // Computes a fifth of the time for 100 ms (crowded), then all of it.
        let invoke = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            std::fs::write(&path, "usage_usec 20000\n").unwrap();
            tokio::time::sleep(Duration::from_millis(40)).await;
            std::fs::write(&path, "usage_usec 60000\n").unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(idle_written(dir.path()), "idled by the check at 150 ms");
            std::fs::write(&path, "usage_usec 160000\n").unwrap();
        };
        let (_, idled, used) = yield_when_long(invoke, Duration::from_millis(50), &cpu, None).await;
        assert!(idled);
        assert_eq!(used, Some(Duration::from_millis(160)));
        assert_eq!(std::fs::read_to_string(dir.path().join("cpu.idle")).unwrap(), "0", "and not after");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_done_before_the_first_check_is_short_unread() {
        let dir = tempfile::tempdir().unwrap();
        let cpu = group(dir.path(), 0);
        let (_, idled, used) = yield_when_long(tokio::time::sleep(Duration::from_millis(20)), Duration::from_millis(50), &cpu, None).await;
        assert!(!idled && used.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn without_its_cpu_time_the_time_alone_decides() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cpu.idle"), "0").unwrap();
        let cpu = CpuControl::at(dir.path(), true); // v1 without cpuacct: unreadable
        let (_, idled, used) = yield_when_long(tokio::time::sleep(Duration::from_millis(80)), Duration::from_millis(50), &cpu, None).await;
        assert!(idled && used.is_none());
    }
}
