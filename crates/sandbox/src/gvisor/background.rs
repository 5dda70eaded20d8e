//! The gVisor back-end's work off any request's path (templates and containers made ahead,
//! parks, pods ended after their last sandbox): counted while it runs, so that the worker's
//! shutdown waits for it before it deletes what is left, and refused once the worker stops.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// How long a shutdown waits for background work under way (a park's checkpoint takes up to
/// a second on a busy host; a template's, a few).
const SETTLE_FOR: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(crate) struct Background {
    /// The worker is stopping: no new park, template or container made ahead.
    closed: AtomicBool,
    /// Background tasks under way now.
    busy: AtomicUsize,
}

impl Background {
    /// Start no more background work.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Count one more task under way until the guard goes. A task that must not start once
    /// the worker stops takes the guard first and checks [`Self::is_closed`] after, so that a
    /// shutdown's [`Self::settle`] either sees it or it sees the close.
    pub fn busy(&self) -> Busy<'_> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(&self.busy)
    }

    /// The guard of [`Self::busy`], or None once the worker stops.
    pub fn start(&self) -> Option<Busy<'_>> {
        let busy = self.busy();
        (!self.is_closed()).then_some(busy)
    }

    /// Wait (up to [`SETTLE_FOR`]) until no background task is under way: what one makes
    /// after the close it removes itself, and it must finish before the worker deletes the
    /// pods' containers and cgroups and its runtime goes.
    pub async fn settle(&self) {
        let step = Duration::from_millis(10);
        for _ in 0..SETTLE_FOR.as_millis() / step.as_millis() {
            if self.busy.load(Ordering::SeqCst) == 0 {
                return;
            }
            tokio::time::sleep(step).await;
        }
        tracing::warn!(tasks = self.busy.load(Ordering::SeqCst), "gVisor background work still under way at shutdown");
    }
}

/// One background task under way ([`Background::busy`]).
pub(crate) struct Busy<'a>(&'a AtomicUsize);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_started_before_the_close_is_counted_and_none_starts_after() {
        let background = Background::default();
        let early = background.start().expect("open");
        background.close();
        assert!(background.start().is_none());
        assert_eq!(background.busy.load(Ordering::SeqCst), 1);
        drop(early);
        assert_eq!(background.busy.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn settle_waits_for_the_last_task() {
        let background = std::sync::Arc::new(Background::default());
        let (held, release) = tokio::sync::oneshot::channel::<()>();
        let task = {
            let background = background.clone();
            tokio::spawn(async move {
                let _busy = background.busy();
                let _ = release.await;
            })
        };
        tokio::task::yield_now().await;
        background.close();
        let settled = tokio::spawn({
            let background = background.clone();
            async move { background.settle().await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!settled.is_finished(), "settle returned while a task was under way");
        drop(held);
        task.await.unwrap();
        settled.await.unwrap();
        assert_eq!(background.busy.load(Ordering::SeqCst), 0);
    }
}
