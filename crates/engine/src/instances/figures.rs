//! What the instance manager counts: sandboxes by state and back-end, how long new sandboxes took to start,
//! and requests run again by reason. The Prometheus handles are registered by
//! [`crate::metrics`]; the start times are kept as an HdrHistogram too, for `/stats`.

use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram as Hdr;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::retry::Reason;

/// Sandbox states for the `sprout_sandboxes` gauge.
#[derive(Clone, Copy, Debug)]
pub enum SandboxState {
    Starting,
    Busy,
    Idle,
}

impl SandboxState {
    pub const ALL: [SandboxState; 3] = [SandboxState::Starting, SandboxState::Busy, SandboxState::Idle];

    pub fn label(self) -> &'static str {
        match self {
            SandboxState::Starting => "starting",
            SandboxState::Busy => "busy",
            SandboxState::Idle => "idle",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
    pub backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

pub struct InstanceFigures {
    pub sandboxes: Family<StateLabels, Gauge>,
    pub sandbox_start: Histogram,
    pub retries: Family<ReasonLabels, Counter>,
    start_times: Mutex<Hdr<u64>>,
    /// The back-ends sandboxes were counted under, in first-counted order.
    backends: Mutex<Vec<&'static str>>,
}

impl InstanceFigures {
    /// Figures with every state of `default`'s sandboxes shown at zero.
    pub fn new(default: &'static str) -> Self {
        let figures = InstanceFigures {
            sandboxes: Family::default(),
            sandbox_start: crate::histograms::latency_histogram(),
            retries: Family::default(),
            start_times: Mutex::new(crate::histograms::microsecond_hdr()),
            backends: Mutex::new(Vec::new()),
        };
        figures.starting_with(default);
        for reason in Reason::ALL {
            let _shown_at_zero = figures.retries.get_or_create(&ReasonLabels { reason: reason.label() });
        }
        figures
    }
}

impl InstanceFigures {
    /// Count `backend`'s sandboxes from now on (every state shown, at zero at first): called
    /// as one starts, so the states of every sandbox counted later are of a known back-end.
    pub fn starting_with(&self, backend: &'static str) {
        let mut backends = self.backends.lock().unwrap();
        if !backends.contains(&backend) {
            backends.push(backend);
            for state in SandboxState::ALL {
                self.sandboxes.get_or_create(&StateLabels { state: state.label(), backend }).set(0);
            }
        }
    }

    /// `delta` more (or fewer) of `backend`'s sandboxes in `state`.
    pub fn state(&self, backend: &'static str, state: SandboxState, delta: i64) {
        if delta != 0 {
            self.sandboxes.get_or_create(&StateLabels { state: state.label(), backend }).inc_by(delta);
        }
    }

    /// Sandboxes in `state`, of every back-end.
    pub fn in_state(&self, state: SandboxState) -> i64 {
        self.by_backend().iter().map(|(_, counts)| counts[state as usize]).sum()
    }

    /// Each back-end's sandboxes starting, busy and idle (in [`SandboxState::ALL`]'s order).
    pub fn by_backend(&self) -> Vec<(&'static str, [i64; 3])> {
        let backends = self.backends.lock().unwrap().clone();
        let count = |backend, state: SandboxState| self.sandboxes.get_or_create(&StateLabels { state: state.label(), backend }).get();
        backends.into_iter().map(|b| (b, SandboxState::ALL.map(|s| count(b, s)))).collect()
    }

    pub fn started(&self, took: Duration) {
        self.sandbox_start.observe(took.as_secs_f64());
        let _ = self.start_times.lock().unwrap().record((took.as_micros() as u64).max(1));
    }

    pub fn retried(&self, reason: Reason) {
        self.retries.get_or_create(&ReasonLabels { reason: reason.label() }).inc();
    }

    pub fn retries(&self, reason: Reason) -> u64 {
        self.retries.get_or_create(&ReasonLabels { reason: reason.label() }).get()
    }

    /// Start times, summarized for `/stats`.
    pub fn start_summary(&self) -> serde_json::Value {
        crate::histograms::summary(&self.start_times.lock().unwrap())
    }
}
