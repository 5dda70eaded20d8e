//! How a lambda's pod moves through its life ([`super::slot`]): started by its first
//! sandbox; parked once every sandbox of it has been paused by the worker for `park_after`
//! (its handlers' state kept in the image); restored by the next request or cold start;
//! stopped, or its image removed, when its last sandbox goes. Parked images count against
//! the disk budget ([`super::ledger`]); the oldest go when a new one does not fit.

use std::collections::HashSet;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pod::{Parked, Pod};
use super::slot::{PodSlot, PodState, SlotRef};
use super::template::Recipe;
use super::Inner;
use crate::error::PlatformError;
use crate::scratch::remove_dir;
use crate::spec::{CreateError, ParkingStats, SandboxSpec};

impl Inner {
    /// The slot of `spec`'s pod, counting one more sandbox in it.
    pub(super) fn slot(&self, spec: &SandboxSpec) -> Arc<PodSlot> {
        let packages: Vec<&str> = spec.packages.iter().map(|p| p.key.as_str()).collect();
        let key = format!("{}\n{}\n{}", spec.lambda, spec.code_dir.display(), packages.join(","));
        let mut pods = self.pods.lock().expect("pods lock");
        let slot = pods.entry(key.clone()).or_insert_with(|| Arc::new(PodSlot::new(key)));
        slot.sandboxes.fetch_add(1, Ordering::SeqCst);
        slot.spec.lock().expect("spec lock").get_or_insert_with(|| spec.clone());
        slot.clone()
    }

    /// The running pod of `slot`: started for `spec` if it has none, restored if parked.
    pub(super) async fn pod_for(self: &Arc<Self>, slot: &Arc<PodSlot>, spec: Option<&SandboxSpec>) -> Result<Arc<Pod>, CreateError> {
        let mut state = match slot.state.try_lock() {
            Ok(state) => state,
            Err(_) => {
                self.hurry_park(slot);
                slot.state.lock().await
            }
        };
        let was_running = matches!(*state, PodState::Running(_));
        if !was_running {
            // Its own image, if parked, leaves the ledger first: parking others for room must
            // not evict what is about to be restored.
            self.ledger.lock().expect("ledger lock").remove(&SlotRef(Arc::downgrade(slot)));
            self.make_room(Some(slot)).await;
        }
        let pod = match std::mem::replace(&mut *state, PodState::Lost) {
            PodState::Running(pod) => pod,
            PodState::Parked(parked) => match self.restore_parked(slot, parked).await {
                Ok(pod) => pod,
                Err(e) => {
                    self.lose(slot);
                    return Err(e);
                }
            },
            PodState::None if spec.is_some() => {
                let spec = spec.expect("checked");
                match self.start_pod(spec).await {
                    Ok(pod) => pod,
                    Err(e) => {
                        *state = PodState::None;
                        return Err(e);
                    }
                }
            }
            PodState::None | PodState::Lost => {
                return Err(PlatformError::Engine {
                    engine: "gvisor",
                    doing: "restore the pod".into(),
                    message: "its parked image is gone (evicted for the disk budget, or it failed)".into(),
                }
                .into())
            }
        };
        *state = PodState::Running(pod.clone());
        slot.set_running(Some(pod.clone()));
        if !was_running && self.settings.cfg.resident_bytes.is_some() {
            let inner = self.clone();
            tokio::spawn(async move {
                let Some(_busy) = inner.background.start() else { return };
                inner.make_room(None).await
            });
        }
        Ok(pod)
    }

    /// A request waits for `slot`'s state: if that is a background park, idled so that it
    /// takes only CPU time nobody wants, give its pod's CPU group its weight back (on a busy
    /// host an idled park can take a minute; the request waits only for the park's work).
    fn hurry_park(&self, slot: &PodSlot) {
        let Some(cpu) = slot.idled_for_park.lock().expect("idled lock").take() else { return };
        match cpu.set_idle_or_least_weight(false) {
            Ok(()) => {
                self.parking.hurried.fetch_add(1, Ordering::Relaxed);
                tracing::info!(lambda = %slot.key.lines().next().unwrap_or(""), "a request waits for its pod's park: the park hurried");
            }
            Err(e) => tracing::debug!("giving a parking pod's CPU group its weight back: {e}"),
        }
    }

    /// Mark `slot` lost: its sandboxes die at their next request, and the next cold start of
    /// its lambda makes a new slot.
    fn lose(&self, slot: &Arc<PodSlot>) {
        slot.lost.store(true, Ordering::SeqCst);
        slot.set_running(None);
        let mut pods = self.pods.lock().expect("pods lock");
        if pods.get(&slot.key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            pods.remove(&slot.key);
        }
    }

    /// A sandbox of `slot` was paused: once all are, park the pod after `park_after` unless one
    /// is resumed meanwhile.
    pub(super) fn plan_park(self: &Arc<Self>, slot: &Arc<PodSlot>) {
        let Some(after) = self.settings.cfg.park_after else { return };
        if !slot.all_paused() {
            return;
        }
        let epoch = slot.epoch.load(Ordering::SeqCst);
        let (inner, slot) = (self.clone(), slot.clone());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            tokio::time::sleep(after).await;
            if slot.epoch.load(Ordering::SeqCst) != epoch {
                return;
            }
            let Ok(_turn) = inner.park_turn.acquire().await else { return };
            let Some(_busy) = inner.background.start() else { return };
            inner.park(&slot, epoch).await;
        });
    }

    /// Park `slot`'s pod if nothing has been resumed since `epoch` and every sandbox is still
    /// paused.
    async fn park(self: &Arc<Self>, slot: &Arc<PodSlot>, epoch: u64) {
        let state = slot.state.lock().await;
        if slot.epoch.load(Ordering::SeqCst) != epoch || !slot.all_paused() {
            return;
        }
        self.park_locked(slot, state, true).await;
    }

    /// Park `slot`'s running pod (its state lock held), then evict older images over the disk
    /// budget. In the `background` (no request waits for it; the caller holds a
    /// [`Inner::park_turn`]) the pod's cgroup first idles, so that writing its image takes
    /// only CPU time that requests, restores and other pods' calls do not want, until a
    /// request comes to wait for it ([`Self::hurry_park`]).
    pub(super) async fn park_locked(
        self: &Arc<Self>,
        slot: &Arc<PodSlot>,
        mut state: tokio::sync::MutexGuard<'_, PodState>,
        background: bool,
    ) {
        let evicted = {
            let PodState::Running(pod) = &*state else { return };
            let pod = pod.clone();
            if let Some(cpu) = self.layout.as_ref().and_then(|l| l.cpu_control_of(&pod.cgroup)).filter(|_| background) {
                match cpu.set_idle_or_least_weight(true) {
                    Ok(()) => *slot.idled_for_park.lock().expect("idled lock") = Some(cpu),
                    Err(e) => tracing::debug!(pod = pod.id, "idling a pod's CPU group before its park: {e}"),
                }
            }
            slot.set_running(None);
            let handlers = dup_handlers(slot);
            let image = self.stage.run.join("gvisor").join(format!("parked-{}", pod.id));
            self.parking.parking_now.fetch_add(1, Ordering::Relaxed);
            let parked = pod.park(&self.runsc, handlers, &image).await;
            self.parking.parking_now.fetch_sub(1, Ordering::Relaxed);
            slot.idled_for_park.lock().expect("idled lock").take();
            match parked {
                Ok(parked) => {
                    self.parking.parks.fetch_add(1, Ordering::Relaxed);
                    self.parking.park_us.fetch_add(parked.took.as_micros() as u64, Ordering::Relaxed);
                    tracing::info!(
                        pod = pod.id,
                        handlers = parked.pids.len(),
                        ms = parked.took.as_secs_f64() * 1e3,
                        image_kb = parked.bytes >> 10,
                        "gVisor pod parked"
                    );
                    let evicted = self.ledger.lock().expect("ledger lock").park(SlotRef(Arc::downgrade(slot)), parked.bytes);
                    *state = PodState::Parked(parked);
                    evicted
                }
                Err(e) => {
                    tracing::warn!(pod = pod.id, "parking a gVisor pod (its sandboxes go): {e}");
                    self.parking.park_failures.fetch_add(1, Ordering::Relaxed);
                    pod.stop(&self.runsc).await;
                    remove_dir(&image).await;
                    *state = PodState::Lost;
                    self.lose(slot);
                    return;
                }
            }
        };
        drop(state);
        for SlotRef(weak) in evicted {
            let Some(victim) = weak.upgrade() else { continue };
            // A busy one is being restored or ended (its image goes then anyway), and one
            // restored since the ledger named it runs again: either is left alone.
            let Ok(mut state) = victim.state.try_lock() else { continue };
            if !matches!(*state, PodState::Parked(_)) {
                continue;
            }
            if let PodState::Parked(parked) = std::mem::replace(&mut *state, PodState::Lost) {
                remove_dir(&parked.image).await;
                self.parking.evicted.fetch_add(1, Ordering::Relaxed);
                tracing::info!(image = %parked.image.display(), "a parked gVisor pod evicted for the disk budget");
            }
            self.lose(&victim);
        }
    }

    /// Restore `slot`'s parked pod into a new container (its image already out of the
    /// ledger: `pod_for`); the handlers whose sandboxes went while it was parked are killed.
    async fn restore_parked(self: &Arc<Self>, slot: &Arc<PodSlot>, parked: Parked) -> Result<Arc<Pod>, CreateError> {
        let spec = slot.spec.lock().expect("spec lock").clone().expect("a slot's spec is set when it is made");
        self.return_lambdas_link(&spec);
        let created = self.take_created(&Recipe::of(&spec));
        let id = created.as_ref().map_or_else(|| self.next_id.fetch_add(1, Ordering::Relaxed), |c| c.id);
        let started = Instant::now();
        let restored = Pod::restore(id, &self.runsc, &self.settings, &self.stage, &spec, &parked.image, created, spec.output_sink()).await;
        remove_dir(&parked.image).await;
        let pod = match restored {
            Ok(pod) => {
                self.kill_orphans(slot, &pod, &parked.pids).await;
                Arc::new(pod)
            }
            Err(e) => {
                self.parking.restore_failures.fetch_add(1, Ordering::Relaxed);
                self.discard(id).await;
                tracing::warn!(lambda = %spec.lambda, "restoring a parked gVisor pod: {e}");
                return Err(e);
            }
        };
        let took = started.elapsed();
        self.parking.restores.fetch_add(1, Ordering::Relaxed);
        self.parking.restore_us.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        if let Some(cpu) = self.layout.as_ref().and_then(|l| l.cpu_usage_of(&pod.cgroup)) {
            self.parking.restore_cpu_us.fetch_add(cpu.as_micros() as u64, Ordering::Relaxed);
            self.parking.restore_cpu_read.fetch_add(1, Ordering::Relaxed);
        }
        tracing::info!(lambda = %spec.lambda, pod = id, ms = took.as_secs_f64() * 1e3, "parked gVisor pod restored");
        Ok(pod)
    }

    /// One sandbox less in `slot`. A running pod without sandboxes stays up for `pod_idle` (a
    /// cold start then only binds a spare), and is stopped if none came meanwhile: scale to
    /// zero. A parked pod's image goes at once.
    pub(super) async fn release(self: &Arc<Self>, slot: &Arc<PodSlot>) {
        if slot.sandboxes.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        let (inner, slot) = (self.clone(), slot.clone());
        let idle = if slot.running().is_some() { self.settings.cfg.pod_idle } else { Duration::ZERO };
        tokio::spawn(async move {
            tokio::time::sleep(idle).await;
            // Counted even once the worker stops: its pod goes either way, and the shutdown
            // must not delete the container under this task's stop.
            let _busy = inner.background.busy();
            {
                let mut pods = inner.pods.lock().expect("pods lock");
                let current = pods.get(&slot.key).is_some_and(|s| Arc::ptr_eq(s, &slot));
                if slot.sandboxes.load(Ordering::SeqCst) != 0 {
                    return;
                }
                if current {
                    pods.remove(&slot.key);
                }
            }
            inner.end(&slot).await;
        });
    }

    /// Stop `slot`'s pod, or remove its parked image.
    pub(super) async fn end(&self, slot: &Arc<PodSlot>) {
        let mut state = slot.state.lock().await;
        slot.set_running(None);
        match std::mem::replace(&mut *state, PodState::None) {
            PodState::Running(pod) => pod.stop(&self.runsc).await,
            PodState::Parked(parked) => {
                self.ledger.lock().expect("ledger lock").remove(&SlotRef(Arc::downgrade(slot)));
                remove_dir(&parked.image).await;
            }
            PodState::None | PodState::Lost => {}
        }
    }

    /// Kill, in `pod` restored from a park, the handlers whose sandboxes went meanwhile.
    async fn kill_orphans(&self, slot: &PodSlot, pod: &Pod, parked_pids: &[i32]) {
        let live: HashSet<i32> = slot.handlers.lock().expect("handlers lock").keys().copied().collect();
        for pid in parked_pids.iter().filter(|p| !live.contains(p)) {
            pod.forget_resumed(*pid);
            pod.kill(*pid).await;
        }
    }

    pub(super) fn parking_stats(&self) -> Option<ParkingStats> {
        self.settings.cfg.park_after?;
        Some(self.parking.stats(self.ledger.lock().expect("ledger lock").usage()))
    }
}

/// Copies of the channel descriptors of `slot`'s handlers (taken under the lock their
/// sandboxes remove them under before closing them), with their pids.
fn dup_handlers(slot: &PodSlot) -> Vec<(i32, OwnedFd)> {
    use std::os::fd::BorrowedFd;
    let handlers = slot.handlers.lock().expect("handlers lock");
    let copy = |fd: RawFd| {
        // SAFETY: the descriptor stays open while its entry is in the map, which is locked.
        unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned().ok()
    };
    handlers.iter().filter_map(|(pid, fd)| Some((*pid, copy(*fd)?))).collect()
}
