//! What the worker counts: Prometheus metrics for `/metrics` (invocations, cold starts,
//! latencies, sandboxes by state, errors by kind, retries by reason, cgroup pool use, static
//! files served on the app port) and the same figures with latency percentiles
//! (HdrHistogram) for the JSON of `/stats`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram as Hdr;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use sprout_sandbox::Backend;

use crate::errors::ErrorCode;
use crate::instances::{Instances, SandboxState};
use crate::networks::LambdaNetworks;
use crate::packages::Packages;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InvocationLabels {
    lambda: String,
    start: &'static str,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StartLabels {
    start: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StaticLabels {
    prefix: String,
    status: u16,
}

/// Exposes the backend's own counters and the caches' and network's figures at scrape time.
struct BackendCollector {
    backend: Arc<dyn Backend>,
    instances: Arc<Instances>,
    packages: Arc<Packages>,
    networks: Arc<LambdaNetworks>,
}

impl std::fmt::Debug for BackendCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BackendCollector({})", self.backend.name())
    }
}

impl Collector for BackendCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.backend.stats();
        let counters = [
            ("sprout_sandboxes_created", "Sandboxes provisioned", s.created),
            ("sprout_sandboxes_destroyed", "Sandboxes destroyed", s.destroyed),
            ("sprout_sandbox_create_failures", "Sandboxes that failed to provision", s.create_failures),
            ("sprout_cgroups_created", "Cgroups created (pool misses)", s.cgroups_created),
            ("sprout_cgroups_reused", "Cgroups taken from the pool", s.cgroups_reused),
            ("sprout_zygote_restarts", "Times the root Zygote was replaced", s.zygote_restarts),
        ];
        let mut all: Vec<(&str, &str, u64)> = counters.to_vec();
        if let Some(cache) = self.backend.import_cache() {
            all.extend(cache.counters().into_iter().filter(|(name, _, _)| *name != "sprout_zygote_restarts"));
        }
        all.extend(self.packages.counters());
        let handler_cache = Some(self.instances.cache_figures());
        let network = self.networks.figures();
        let mut namespaces = None;
        if let Some((counters, in_use, ready)) = network {
            all.extend(counters);
            namespaces = Some((in_use, ready));
        }
        // Gauges without labels, of the parts that are there.
        let mut gauges: Vec<(&str, &str, i64)> = Vec::new();
        if let (Some(limit), Some(budget)) = (self.instances.budget_limit(), self.instances.budget_figures()) {
            let (used, pending) = (budget.used, budget.pending);
            all.push(("sprout_memory_budget_waits", "Cold starts that waited for memory", budget.waits));
            all.push((
                "sprout_memory_budget_queued_instead",
                "Requests that waited for their lambda's busy sandbox rather than evict another lambda's",
                budget.queued_instead,
            ));
            gauges.extend([
                ("sprout_memory_budget_bytes", "The whole worker's memory budget", limit as i64),
                ("sprout_memory_budget_used_bytes", "Memory the budget's cgroup holds, less page cache no process maps", used as i64),
                ("sprout_memory_budget_pending_bytes", "Memory granted to cold starts under way", pending as i64),
            ]);
        }
        if let Some(cache) = self.backend.import_cache() {
            let (ready, memory) = cache.spare_figures();
            gauges.extend([
                ("sprout_spares_ready", "Spares waiting to be bound, over all Zygotes", ready as i64),
                ("sprout_spares_memory_bytes", "Memory the spares' cgroup holds, less page cache no process maps", memory as i64),
            ]);
        }
        if let Some((paused, pss, _)) = &handler_cache {
            gauges.extend([
                ("sprout_handler_cache_paused", "Idle sandboxes paused in the handler cache", *paused as i64),
                ("sprout_handler_cache_pss_bytes", "Memory (PSS) of the paused sandboxes", *pss as i64),
            ]);
        }
        for (name, help, value) in all {
            let counter = ConstCounter::new(value);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        if let Some((in_use, ready)) = namespaces {
            let mut family = encoder.encode_descriptor(
                "sprout_network_namespaces",
                "Lambdas' network namespaces: held by lambdas or being removed (in_use, which counts the ready ones too), made ahead (ready)",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (state, n) in [("in_use", in_use), ("ready", ready)] {
                let labels = [("state", state)];
                let metric = family.encode_family(&labels)?;
                prometheus_client::metrics::gauge::ConstGauge::new(n as i64).encode(metric)?;
            }
        }
        for (name, help, value) in gauges {
            let gauge = prometheus_client::metrics::gauge::ConstGauge::new(value);
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        self.encode_lambdas(&mut encoder)?;
        if let Some((_, _, evictions)) = handler_cache {
            let mut family = encoder.encode_descriptor(
                "sprout_handler_cache_evictions",
                "Idle sandboxes evicted from the handler cache, by reason",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (reason, n) in evictions {
                let labels = [("reason", reason)];
                let metric = family.encode_family(&labels)?;
                ConstCounter::new(n).encode(metric)?;
            }
        }
        Ok(())
    }
}

/// One figure of a lambda's, when it has it.
type LambdaValue = fn(&crate::instances::LambdaFigures) -> Option<f64>;

impl BackendCollector {
    /// Per lambda: its sandboxes by state, its queue, its keep-alive windows and (under a
    /// memory budget) the memory its sandboxes are estimated to need.
    fn encode_lambdas(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::gauge::ConstGauge;
        use prometheus_client::metrics::MetricType::Gauge;
        let lambdas = self.instances.lambda_figures();
        let mut family = encoder.encode_descriptor(
            "sprout_lambda_sandboxes",
            "Each lambda's sandboxes: busy (serving or starting) or idle",
            None,
            Gauge,
        )?;
        for l in &lambdas {
            for (state, n) in [("busy", l.busy), ("idle", l.idle)] {
                ConstGauge::new(n as i64).encode(family.encode_family(&[("lambda", l.name.as_str()), ("state", state)])?)?;
            }
        }
        let per_lambda: [(&str, &str, LambdaValue); 4] = [
            ("sprout_lambda_queued", "Requests waiting for a sandbox of the lambda", |l| Some(l.queued as f64)),
            ("sprout_lambda_prewarm_seconds", "The lambda's pre-warm window (0: its sandbox is kept instead)", |l| {
                Some(l.prewarm.as_secs_f64())
            }),
            ("sprout_lambda_keep_alive_seconds", "How long the lambda's idle sandboxes are kept", |l| Some(l.keep_alive.as_secs_f64())),
            (
                "sprout_lambda_memory_estimate_bytes",
                "Memory a new sandbox of the lambda is estimated to need (under a memory budget)",
                |l| l.memory_estimate.map(|b| b as f64),
            ),
        ];
        for (name, help, value) in per_lambda {
            if lambdas.iter().all(|l| value(l).is_none()) {
                continue;
            }
            let mut family = encoder.encode_descriptor(name, help, None, Gauge)?;
            for l in &lambdas {
                if let Some(v) = value(l) {
                    ConstGauge::new(v).encode(family.encode_family(&[("lambda", l.name.as_str())])?)?;
                }
            }
        }
        Ok(())
    }
}

struct Percentiles {
    cold: Hdr<u64>,
    warm: Hdr<u64>,
}

pub struct Metrics {
    registry: Registry,
    invocations: Family<InvocationLabels, Counter>,
    cold_starts: Counter,
    latency: Family<StartLabels, Histogram>,
    errors: Family<KindLabels, Counter>,
    statics: Family<StaticLabels, Counter>,
    /// The same counts by prefix and status, for `/stats` (families cannot be listed).
    static_counts: Mutex<BTreeMap<String, BTreeMap<u16, u64>>>,
    percentiles: Mutex<Percentiles>,
    started: Instant,
    backend: Arc<dyn Backend>,
    instances: Arc<Instances>,
}

/// Request and start times' Prometheus buckets: 0.2 ms to 26 s, doubling.
pub(crate) fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0002, 2.0, 18))
}

/// An HdrHistogram of microseconds up to an hour, for the percentiles of `/stats`.
pub(crate) fn microsecond_hdr() -> Hdr<u64> {
    Hdr::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

/// A histogram of microseconds as `/stats` shows it, in milliseconds.
pub(crate) fn summary(h: &Hdr<u64>) -> Value {
    let ms = |v: u64| (v as f64) / 1000.0;
    json!({
        "count": h.len(),
        "p50_ms": ms(h.value_at_quantile(0.5)),
        "p90_ms": ms(h.value_at_quantile(0.9)),
        "p99_ms": ms(h.value_at_quantile(0.99)),
        "max_ms": ms(h.max()),
        "mean_ms": h.mean() / 1000.0,
    })
}

impl Metrics {
    /// The worker's metrics: its own, and those `instances`, `packages` and `networks` keep,
    /// read at scrape time.
    pub fn new(backend: Arc<dyn Backend>, instances: Arc<Instances>, packages: Arc<Packages>, networks: Arc<LambdaNetworks>) -> Metrics {
        let mut registry = Registry::default();
        let invocations = Family::<InvocationLabels, Counter>::default();
        let cold_starts = Counter::default();
        let latency = Family::<StartLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> Histogram);
        let errors = Family::<KindLabels, Counter>::default();
        let statics = Family::<StaticLabels, Counter>::default();
        let figures = instances.figures();
        registry.register("sprout_invocations", "Requests to lambdas, by lambda, start and outcome", invocations.clone());
        registry.register("sprout_cold_starts", "Requests that needed a new sandbox", cold_starts.clone());
        registry.register(
            "sprout_request_duration_seconds",
            "Time from receiving a request to having its reply, by cold or warm start",
            latency.clone(),
        );
        registry.register(
            "sprout_sandbox_start_duration_seconds",
            "Time to provision a sandbox and load its lambda",
            figures.sandbox_start.clone(),
        );
        registry.register("sprout_sandboxes", "Sandboxes by state", figures.sandboxes.clone());
        registry.register("sprout_errors", "Failed requests, by error code", errors.clone());
        registry.register(
            "sprout_retries",
            "Requests run again on another sandbox after theirs died before answering, by reason",
            figures.retries.clone(),
        );
        registry.register(
            "sprout_static_requests",
            "Requests the app port answered from a static directory, by prefix and status",
            statics.clone(),
        );
        let collector = BackendCollector { backend: backend.clone(), instances: instances.clone(), packages, networks };
        registry.register_collector(Box::new(collector));
        Metrics {
            registry,
            invocations,
            cold_starts,
            latency,
            errors,
            statics,
            static_counts: Mutex::default(),
            percentiles: Mutex::new(Percentiles { cold: microsecond_hdr(), warm: microsecond_hdr() }),
            started: Instant::now(),
            backend,
            instances,
        }
    }

    /// The import cache's figures and tree (null for backends without Zygotes).
    pub fn import_cache_stats(&self) -> Value {
        self.backend.import_cache().map(|c| c.stats()).unwrap_or(Value::Null)
    }

    /// A request that reached a sandbox and got a reply (the handler may still have failed).
    pub fn invocation(&self, lambda: &str, cold: bool, outcome: &str, elapsed: Duration) {
        let start = if cold { "cold" } else { "warm" };
        self.invocations.get_or_create(&InvocationLabels { lambda: lambda.to_string(), start, outcome: outcome.to_string() }).inc();
        if cold {
            self.cold_starts.inc();
        }
        self.latency.get_or_create(&StartLabels { start }).observe(elapsed.as_secs_f64());
        let micros = (elapsed.as_micros() as u64).max(1);
        let mut p = self.percentiles.lock().unwrap();
        let hist = if cold { &mut p.cold } else { &mut p.warm };
        let _ = hist.record(micros);
    }

    /// A request the app port answered from the static directory of `prefix`.
    pub fn static_request(&self, prefix: &str, status: u16) {
        self.statics.get_or_create(&StaticLabels { prefix: prefix.to_string(), status }).inc();
        *self.static_counts.lock().unwrap().entry(prefix.to_string()).or_default().entry(status).or_default() += 1;
    }

    pub fn error(&self, code: ErrorCode) {
        self.errors.get_or_create(&KindLabels { kind: code.as_str() }).inc();
    }

    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }

    /// The JSON of `/stats`.
    pub fn stats(&self, lambdas: Value) -> Value {
        let p = self.percentiles.lock().unwrap();
        let figures = self.instances.figures();
        let gauge = |s: SandboxState| figures.in_state(s);
        let errors: serde_json::Map<String, Value> = {
            let mut out = serde_json::Map::new();
            // Families are not iterable; the error codes are a closed set.
            for code in ErrorCode::ALL {
                let n = self.errors.get_or_create(&KindLabels { kind: code.as_str() }).get();
                if n > 0 {
                    out.insert(code.to_string(), json!(n));
                }
            }
            out
        };
        let retries: serde_json::Map<String, Value> =
            crate::retry::Reason::ALL.iter().map(|r| (r.label().to_string(), json!(figures.retries(*r)))).collect();
        json!({
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "backend": self.backend.name(),
            "invocations": p.cold.len() + p.warm.len(),
            "cold_starts": p.cold.len(),
            "warm_starts": p.warm.len(),
            "latency": {"cold": summary(&p.cold), "warm": summary(&p.warm)},
            "sandbox_start": figures.start_summary(),
            "sandboxes": {
                "starting": gauge(SandboxState::Starting),
                "busy": gauge(SandboxState::Busy),
                "idle": gauge(SandboxState::Idle),
            },
            "errors": errors,
            "retries": retries,
            "static": *self.static_counts.lock().unwrap(),
            "backend_counters": self.backend.stats(),
            "lambdas": lambdas,
        })
    }
}
