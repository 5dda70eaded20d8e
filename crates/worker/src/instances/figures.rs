//! What the instance manager counts: sandboxes by state, how long new sandboxes took to start,
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
}

impl Default for InstanceFigures {
    fn default() -> Self {
        let figures = InstanceFigures {
            sandboxes: Family::default(),
            sandbox_start: crate::metrics::latency_histogram(),
            retries: Family::default(),
            start_times: Mutex::new(crate::metrics::microsecond_hdr()),
        };
        for state in SandboxState::ALL {
            figures.sandboxes.get_or_create(&StateLabels { state: state.label() }).set(0);
        }
        for reason in Reason::ALL {
            let _shown_at_zero = figures.retries.get_or_create(&ReasonLabels { reason: reason.label() });
        }
        figures
    }
}

impl InstanceFigures {
    pub fn state(&self, state: SandboxState, delta: i64) {
        if delta != 0 {
            self.sandboxes.get_or_create(&StateLabels { state: state.label() }).inc_by(delta);
        }
    }

    pub fn in_state(&self, state: SandboxState) -> i64 {
        self.sandboxes.get_or_create(&StateLabels { state: state.label() }).get()
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
        crate::metrics::summary(&self.start_times.lock().unwrap())
    }
}
