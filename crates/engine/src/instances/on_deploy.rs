//! Sandboxes started when a lambda arrives (`[instances] start_on_deploy`): one made for each
//! new version with no sandbox yet, then left idle, so its keep-alive decides for it as for
//! any (under gVisor's parking it is written to disk: the lambda's first request restores its
//! handler loaded, as AWS Lambda's SnapStart snapshots a version when it is published). Made
//! one at a time, taking no room from another lambda and never queueing for it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::deploy_starts::Pending;
use super::manager::Instances;
use crate::registry::Lambda;

impl Instances {
    /// `lambda` (a new version) arrived: with `start_on_deploy`, make it a sandbox in the
    /// background and leave it idle.
    pub fn arrived(&self, lambda: Arc<Lambda>) {
        if !self.cfg.start_on_deploy {
            return;
        }
        let me = self.me.clone();
        self.on_deploy.pending.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            let Some(me) = me.upgrade() else { return };
            let starts = &me.on_deploy;
            let _pending = Pending(&starts.pending);
            let Ok(_turn) = starts.one_at_a_time.acquire().await else { return };
            if me.closed.load(Ordering::Acquire) || !lambda.is_current() {
                starts.skipped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            match me.start_ahead(&lambda).await {
                None => _ = starts.skipped.fetch_add(1, Ordering::Relaxed),
                Some(Ok(())) => _ = starts.made.fetch_add(1, Ordering::Relaxed),
                Some(Err(e)) => {
                    starts.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(lambda = %lambda.name, "starting a sandbox on deploy: {e}");
                }
            }
        });
    }
}
