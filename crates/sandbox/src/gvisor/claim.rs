//! How a lambda's pod comes to be: restored from its package set's template, into a
//! container created ahead when one is ready (else created now), or, while the set has no
//! template yet, started afresh (and the template made meanwhile). Parked pods are restored
//! into containers created ahead too ([`super::parking`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::ahead::{self, Created};
use super::pod::Pod;
use super::template::Recipe;
use super::Inner;
use crate::spec::{CreateError, SandboxSpec};

/// How long after a claim the container replacing the one it took is created (each is
/// `runsc create`, 45-80 ms of CPU, off a lambda's first cold start; `[gvisor] created_ahead`
/// says how many per template). An Olio site's first page takes 300-500 ms after its pod is
/// restored: a refill sooner took a quarter of the CPU two sites' first pages had at once.
const REFILL_AFTER: std::time::Duration = std::time::Duration::from_millis(1000);

impl Inner {
    /// Start a pod for `spec`'s lambda: restored from its package set's template when there
    /// is one, else afresh (the first of a set, which has the template made meanwhile).
    pub(super) async fn start_pod(self: &Arc<Self>, spec: &SandboxSpec) -> Result<Arc<Pod>, CreateError> {
        self.return_lambdas_link(spec);
        let recipe = Recipe::of(spec);
        let (template, make) = if self.use_templates { self.templates.lookup(&recipe) } else { (None, false) };
        if let Some(template) = template {
            let created = self.take_created(&recipe);
            let id = created.as_ref().map_or_else(|| self.next_id.fetch_add(1, Ordering::Relaxed), |c| c.id);
            let ahead = created.is_some();
            let started = Instant::now();
            match Pod::restore(id, &self.runsc, &self.settings, &self.stage, spec, &template.image, created, spec.output_sink()).await {
                Ok(pod) => {
                    template.failures.store(0, Ordering::Relaxed);
                    let ms = started.elapsed().as_secs_f64() * 1e3;
                    tracing::info!(lambda = %spec.lambda, pod = id, ahead, ms, "gVisor pod restored from its package set's template");
                    return Ok(Arc::new(pod));
                }
                Err(e) => {
                    tracing::warn!(lambda = %spec.lambda, "restoring a gVisor pod from its template (starting afresh): {e}");
                    self.templates.failed(&recipe, &template);
                    self.discard(id).await;
                }
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let pod = match Pod::start(id, &self.runsc, &self.settings, &self.stage, spec, spec.output_sink()).await {
            Ok(pod) => Arc::new(pod),
            Err(e) => {
                self.discard(id).await;
                return Err(e);
            }
        };
        if make {
            let inner = self.clone();
            tokio::spawn(async move {
                inner.templates.make(recipe.clone(), &inner.runsc, &inner.settings, &inner.stage, &inner.background).await;
                inner.create_ahead(&recipe);
            });
        }
        Ok(pod)
    }

    /// A container created ahead for `recipe`'s pods, if one is ready; its replacement is
    /// created once this restore and its first request are done with the CPU (on one core,
    /// a create beside a restore slows it by a third).
    pub(super) fn take_created(self: &Arc<Self>, recipe: &Recipe) -> Option<Created> {
        let created = self.ahead.lock().expect("ahead lock").get_mut(&recipe.key).and_then(|(ready, _)| ready.pop());
        let (inner, next) = (self.clone(), recipe.clone());
        tokio::spawn(async move {
            tokio::time::sleep(REFILL_AFTER).await;
            inner.create_ahead(&next);
        });
        created
    }

    /// Create containers ahead for `recipe`'s pods (restored from its template, or parked),
    /// up to [`created_ahead`], in the background; none once the worker stops (a refill
    /// due during its shutdown would create a container, and its cgroup, after the last
    /// were deleted).
    fn create_ahead(self: &Arc<Self>, recipe: &Recipe) {
        if (self.templates.lookup_ready(recipe).is_none() && self.settings.cfg.park_after.is_none()) || self.background.is_closed() {
            return;
        }
        let wanted = {
            let mut ahead = self.ahead.lock().expect("ahead lock");
            let (ready, making) = ahead.entry(recipe.key.clone()).or_default();
            let wanted = self.settings.cfg.created_ahead.saturating_sub(ready.len() + *making);
            *making += wanted;
            wanted
        };
        for _ in 0..wanted {
            let (inner, recipe) = (self.clone(), recipe.clone());
            tokio::spawn(async move {
                let Some(_busy) = inner.background.start() else {
                    inner.ahead.lock().expect("ahead lock").entry(recipe.key.clone()).or_default().1 -= 1;
                    return;
                };
                let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
                let made = Created::make(id, &inner.runsc, &inner.settings, &inner.stage, &recipe).await;
                let made = made
                    .map_err(|e| match inner.background.is_closed() {
                        true => tracing::debug!("creating a gVisor container ahead while the worker stops: {e}"),
                        false => tracing::warn!("creating a gVisor container ahead: {e}"),
                    })
                    .ok();
                let leftover = {
                    let mut ahead = inner.ahead.lock().expect("ahead lock");
                    let (ready, making) = ahead.entry(recipe.key.clone()).or_default();
                    *making -= 1;
                    match made {
                        Some(created) if !inner.background.is_closed() => {
                            ready.push(created);
                            None
                        }
                        other => other,
                    }
                };
                if let Some(created) = leftover {
                    created.discard(&inner.runsc).await;
                }
            });
        }
    }

    /// A lambda has one link: a pod of `spec`'s lambda that holds it lent (one of its earlier
    /// code, idling or draining) gives it back before a new pod starts, which needs it.
    pub(super) fn return_lambdas_link(&self, spec: &SandboxSpec) {
        let prefix = format!("{}\n", spec.lambda);
        let others: Vec<Arc<Pod>> = (self.pods.lock().expect("pods lock").values())
            .filter(|slot| slot.key.starts_with(&prefix))
            .filter_map(|slot| slot.running())
            .collect();
        for pod in others {
            pod.return_link();
        }
    }

    /// Remove what a pod that failed to start left.
    pub(super) async fn discard(&self, id: u64) {
        self.runsc.delete(&super::bundle::container(&format!("pod-{id}"))).await;
        ahead::remove_bundle(&self.stage.run.join("gvisor").join(format!("pod-{id}"))).await;
    }
}
