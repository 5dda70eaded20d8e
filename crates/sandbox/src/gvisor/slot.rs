//! A lambda's pod through its life (none yet, running, parked to disk, or lost: its image
//! evicted, or parking failed), the sandboxes in it, and what parking has done; the changes
//! themselves are [`super::parking`]'s.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::pod::{Parked, Pod};
use crate::cgroup::CpuControl;
use crate::spec::{ParkingStats, SandboxSpec};

/// Where a lambda's pod is.
pub(super) enum PodState {
    None,
    Running(Arc<Pod>),
    Parked(Parked),
    /// Its image was evicted for the disk budget, or parking or restoring it failed: the
    /// handlers in it are gone, and so are its sandboxes at their next request.
    Lost,
}

/// A lambda's pod (by lambda, code and packages) and the sandboxes in it.
pub(super) struct PodSlot {
    pub key: String,
    /// Held through every change of state (a start, a park, a restore).
    pub state: tokio::sync::Mutex<PodState>,
    /// The running pod, for readers that cannot wait.
    pub running: Mutex<Option<Arc<Pod>>>,
    pub sandboxes: AtomicUsize,
    /// Sandboxes the worker has paused (idle in its pool).
    pub paused: AtomicUsize,
    /// Bumped by every resume: a park planned before it is called off.
    pub epoch: AtomicU64,
    pub lost: AtomicBool,
    /// When a sandbox of it was last taken or paused (milliseconds since the Unix epoch).
    pub last_used: AtomicU64,
    /// Each handler's channel descriptor, by pid, while its sandbox lives.
    pub handlers: Mutex<HashMap<i32, RawFd>>,
    /// What the pod was made for, to make or restore it again.
    pub spec: Mutex<Option<SandboxSpec>>,
    /// The CPU group of its pod while a background park idles it: a request that comes to
    /// wait for the park takes it and gives the group its weight back.
    pub idled_for_park: Mutex<Option<CpuControl>>,
}

/// A slot as the disk ledger names it.
pub(super) struct SlotRef(pub Weak<PodSlot>);

impl PartialEq for SlotRef {
    fn eq(&self, other: &SlotRef) -> bool {
        Weak::ptr_eq(&self.0, &other.0)
    }
}

impl PodSlot {
    pub fn new(key: String) -> PodSlot {
        PodSlot {
            key,
            state: tokio::sync::Mutex::new(PodState::None),
            running: Mutex::new(None),
            sandboxes: AtomicUsize::new(0),
            paused: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            last_used: AtomicU64::new(now_ms()),
            handlers: Mutex::new(HashMap::new()),
            spec: Mutex::new(None),
            idled_for_park: Mutex::new(None),
        }
    }

    pub fn running(&self) -> Option<Arc<Pod>> {
        self.running.lock().expect("running lock").clone()
    }

    pub fn set_running(&self, pod: Option<Arc<Pod>>) {
        *self.running.lock().expect("running lock") = pod;
    }

    /// A sandbox of it was taken or paused now.
    pub fn touch(&self) {
        self.last_used.store(now_ms(), Ordering::Relaxed);
    }

    /// Every sandbox of it is paused.
    pub fn all_paused(&self) -> bool {
        let sandboxes = self.sandboxes.load(Ordering::SeqCst);
        sandboxes > 0 && self.paused.load(Ordering::SeqCst) == sandboxes
    }
}

/// What parking and restoring have done, for the back-end's stats.
#[derive(Default)]
pub(super) struct ParkingCounters {
    pub parks: AtomicU64,
    pub park_failures: AtomicU64,
    pub park_us: AtomicU64,
    pub restores: AtomicU64,
    pub restore_failures: AtomicU64,
    pub restore_us: AtomicU64,
    /// CPU the restored pods' processes had used when their restores ended (since they were
    /// created, ahead or not), and how many restores it was read for.
    pub restore_cpu_us: AtomicU64,
    pub restore_cpu_read: AtomicU64,
    pub evicted: AtomicU64,
    /// Pods started or restored over the resident budget (nothing idle left to park).
    pub over_budget: AtomicU64,
    /// Parks under way.
    pub parking_now: AtomicU64,
    /// Background parks a request waited for, their CPU group given its weight back.
    pub hurried: AtomicU64,
    /// Parks a start or restore waited for (`make_room` for a pod).
    pub waited_for: AtomicU64,
    /// A parked handler's first request in the worker, µs: its pod's restore (when this
    /// request waited for it), its binding and the request itself.
    pub first_requests: Mutex<Option<Histogram<u64>>>,
}

impl ParkingCounters {
    /// Count a parked handler's first request, which took `took` in the worker.
    pub fn first_request(&self, took: Duration) {
        let mut h = self.first_requests.lock().expect("first requests lock");
        let h = h.get_or_insert_with(|| Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"));
        h.saturating_record(took.as_micros().max(1) as u64);
    }

    /// The figures, with the images parked now and their bytes.
    pub fn stats(&self, (parked, parked_bytes): (usize, u64)) -> ParkingStats {
        let mean_ms = |us: &AtomicU64, n: &AtomicU64| us.load(Ordering::Relaxed) as f64 / 1e3 / n.load(Ordering::Relaxed).max(1) as f64;
        let first = self.first_requests.lock().expect("first requests lock");
        let quantile_ms = |q: f64| first.as_ref().map_or(0.0, |h| h.value_at_quantile(q) as f64 / 1e3);
        ParkingStats {
            first_requests_after_park: first.as_ref().map_or(0, |h| h.len()),
            first_request_after_park_p50_ms: quantile_ms(0.5),
            first_request_after_park_p99_ms: quantile_ms(0.99),
            first_request_after_park_max_ms: first.as_ref().map_or(0.0, |h| h.max() as f64 / 1e3),
            parks: self.parks.load(Ordering::Relaxed),
            park_failures: self.park_failures.load(Ordering::Relaxed),
            park_ms_mean: mean_ms(&self.park_us, &self.parks),
            restores: self.restores.load(Ordering::Relaxed),
            restore_failures: self.restore_failures.load(Ordering::Relaxed),
            restore_ms_mean: mean_ms(&self.restore_us, &self.restores),
            restore_cpu_ms_mean: mean_ms(&self.restore_cpu_us, &self.restore_cpu_read),
            evicted: self.evicted.load(Ordering::Relaxed),
            over_budget: self.over_budget.load(Ordering::Relaxed),
            parking_now: self.parking_now.load(Ordering::Relaxed),
            parks_hurried: self.hurried.load(Ordering::Relaxed),
            parks_waited_for: self.waited_for.load(Ordering::Relaxed),
            parked: parked as u64,
            parked_bytes,
        }
    }
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
