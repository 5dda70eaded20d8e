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
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use sprout_sandbox::{Backend, BackendStats};

use crate::backends::Backends;
use crate::errors::ErrorCode;
use crate::histograms::{latency_histogram, microsecond_hdr, summary};
use crate::instances::{Instances, SandboxState};
use crate::logs::Logs;
use crate::networks::LambdaNetworks;
use crate::packages::Packages;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InvocationLabels {
    lambda: String,
    start: &'static str,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MapItemLabels {
    lambda: String,
    outcome: &'static str,
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
    backend: Arc<Backends>,
    instances: Arc<Instances>,
    packages: Arc<Packages>,
    networks: Arc<LambdaNetworks>,
    logs: Arc<Logs>,
}

impl std::fmt::Debug for BackendCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BackendCollector({})", self.backend.name())
    }
}

impl Collector for BackendCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.backend.stats();
        let each = self.backend.each_stats();
        type Figure = fn(&BackendStats) -> u64;
        let by_backend: [(&str, &str, Figure); 4] = [
            ("sprout_sandboxes_created", "Sandboxes provisioned, by back-end", |s| s.created),
            ("sprout_sandboxes_destroyed", "Sandboxes destroyed, by back-end", |s| s.destroyed),
            ("sprout_sandbox_create_failures", "Sandboxes that failed to provision, by back-end", |s| s.create_failures),
            ("sprout_spares_let_go", "Spares let go after a quiet spell (gVisor pods'), by back-end", |s| s.spares_let_go),
        ];
        for (name, help, value) in by_backend {
            let mut family = encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Counter)?;
            for (backend, stats) in &each {
                let labels = [("backend", *backend)];
                let metric = family.encode_family(&labels)?;
                ConstCounter::new(value(stats)).encode(metric)?;
            }
        }
        let counters = [
            ("sprout_cgroups_created", "Cgroups created (pool misses)", s.cgroups_created),
            ("sprout_cgroups_reused", "Cgroups taken from the pool", s.cgroups_reused),
            ("sprout_zygote_restarts", "Times the root Zygote was replaced", s.zygote_restarts),
        ];
        let mut all: Vec<(&str, &str, u64)> = counters.to_vec();
        if let Some(cache) = self.backend.import_cache() {
            all.extend(cache.counters().into_iter().filter(|(name, _, _)| *name != "sprout_zygote_restarts"));
        }
        all.extend(self.packages.counters());
        all.push((
            "sprout_long_requests_idled",
            "Requests that computed long enough to yield the CPU to short ones (limits.long_request_ms)",
            self.instances.long_requests_idled(),
        ));
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
        if let Some(parking) = each.iter().find_map(|(_, stats)| stats.parking.clone()) {
            all.extend([
                ("sprout_gvisor_parks", "gVisor pods parked to disk", parking.parks),
                ("sprout_gvisor_park_failures", "gVisor pods that failed to be parked (their sandboxes went)", parking.park_failures),
                ("sprout_gvisor_restores", "Parked gVisor pods restored", parking.restores),
                ("sprout_gvisor_restore_failures", "Parked gVisor pods that failed to be restored", parking.restore_failures),
                ("sprout_gvisor_parked_evicted", "Parked gVisor pods' images removed for the disk budget", parking.evicted),
                ("sprout_gvisor_over_resident_budget", "gVisor pods started or restored over the resident budget", parking.over_budget),
                ("sprout_gvisor_parks_hurried", "gVisor parks a request hurried", parking.parks_hurried),
                ("sprout_gvisor_parks_waited_for", "gVisor parks a pod's start or restore waited for", parking.parks_waited_for),
            ]);
            gauges.extend([
                ("sprout_gvisor_parked", "gVisor pods parked now", parking.parked as i64),
                ("sprout_gvisor_parking", "gVisor pods being parked now", parking.parking_now as i64),
                ("sprout_gvisor_parked_bytes", "Disk the parked gVisor pods' images take", parking.parked_bytes as i64),
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
        self.encode_logs(&mut encoder)?;
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
    /// Output dropped past each lambda's rate, and entries the log writer could not take.
    fn encode_logs(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType::Counter;
        let dropped = self.logs.dropped();
        for (name, help, pick) in [
            ("sprout_log_dropped_lines", "Lines of a lambda's output dropped past its rate (logs.rate_kb_s)", 0),
            ("sprout_log_dropped_bytes", "Bytes of a lambda's output dropped past its rate (logs.rate_kb_s)", 1),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, Counter)?;
            for (lambda, lines, bytes) in &dropped {
                let n = if pick == 0 { *lines } else { *bytes };
                ConstCounter::new(n).encode(family.encode_family(&[("lambda", lambda.as_str())])?)?;
            }
        }
        let writer = ConstCounter::new(self.logs.writer_dropped());
        let metric = encoder.encode_descriptor(
            "sprout_log_writer_dropped_entries",
            "Log entries not written to their files because the writer was behind (kept in memory only)",
            None,
            writer.metric_type(),
        )?;
        writer.encode(metric)
    }

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
    map_items: Family<MapItemLabels, Counter>,
    /// The same counts by prefix and status, for `/stats` (families cannot be listed).
    static_counts: Mutex<BTreeMap<String, BTreeMap<u16, u64>>>,
    percentiles: Mutex<Percentiles>,
    /// Each lambda's last hour, minute by minute.
    timeline: Mutex<crate::timeline::Timeline>,
    /// Each lambda's invocations since the worker started: (all, cold starts, errors).
    per_lambda: Mutex<std::collections::HashMap<String, [u64; 3]>>,
    started: Instant,
    backend: Arc<Backends>,
    instances: Arc<Instances>,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// prometheus_client's OpenMetrics text as Prometheus's text format 0.0.4. OpenMetrics names
/// a counter's family without the `_total` its samples carry and ends with `# EOF`; read as
/// 0.0.4, each counter's samples would be a family of their own, untyped and without help
/// (what `promtool check metrics` found). So a counter's `# HELP` and `# TYPE` lines name
/// `<name>_total`, and `# EOF` is left out; the samples are the same in both formats.
fn text_format(open_metrics: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        open_metrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(open_metrics.len() + 12 * counters.len());
    for line in open_metrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let counter_descriptor = ["# HELP ", "# TYPE "].into_iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').map_or((rest, None), |(n, t)| (n, Some(t)));
            counters.contains(name).then_some((prefix, name, tail))
        });
        match counter_descriptor {
            Some((prefix, name, Some(tail))) => out.push_str(&format!("{prefix}{name}_total {tail}")),
            Some((prefix, name, None)) => out.push_str(&format!("{prefix}{name}_total")),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

impl Metrics {
    /// The worker's metrics: its own, and those `instances`, `packages` and `networks` keep,
    /// read at scrape time.
    pub fn new(
        backend: Arc<Backends>,
        instances: Arc<Instances>,
        packages: Arc<Packages>,
        networks: Arc<LambdaNetworks>,
        logs: Arc<Logs>,
    ) -> Metrics {
        let mut registry = Registry::default();
        let invocations = Family::<InvocationLabels, Counter>::default();
        let cold_starts = Counter::default();
        let latency = Family::<StartLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> Histogram);
        let errors = Family::<KindLabels, Counter>::default();
        let statics = Family::<StaticLabels, Counter>::default();
        let map_items = Family::<MapItemLabels, Counter>::default();
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
        registry.register("sprout_sandboxes", "Sandboxes by state and back-end", figures.sandboxes.clone());
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
        registry.register(
            "sprout_map_items",
            "Items of maps (/map/<name>, a handler's batch calls), by lambda and outcome (ok or the error code)",
            map_items.clone(),
        );
        let collector = BackendCollector { backend: backend.clone(), instances: instances.clone(), packages, networks, logs };
        registry.register_collector(Box::new(collector));
        Metrics {
            registry,
            invocations,
            cold_starts,
            latency,
            errors,
            statics,
            map_items,
            static_counts: Mutex::default(),
            percentiles: Mutex::new(Percentiles { cold: microsecond_hdr(), warm: microsecond_hdr() }),
            timeline: Mutex::default(),
            per_lambda: Mutex::default(),
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
        {
            let mut p = self.percentiles.lock().unwrap();
            let hist = if cold { &mut p.cold } else { &mut p.warm };
            let _ = hist.record(micros);
        }
        self.timeline.lock().unwrap().record(lambda, unix_now(), cold, outcome != "ok", elapsed);
        self.count(lambda, cold, outcome != "ok");
    }

    fn count(&self, lambda: &str, cold: bool, error: bool) {
        let mut per_lambda = self.per_lambda.lock().unwrap();
        let counts = match per_lambda.get_mut(lambda) {
            Some(c) => c,
            None => per_lambda.entry(lambda.to_string()).or_default(),
        };
        counts[0] += 1;
        counts[1] += u64::from(cold);
        counts[2] += u64::from(error);
    }

    /// Each lambda's invocations since the worker started, cold starts and errors among them.
    pub fn lambda_counts(&self) -> Vec<(String, u64, u64, u64)> {
        let per_lambda = self.per_lambda.lock().unwrap();
        let mut out: Vec<_> = per_lambda.iter().map(|(name, c)| (name.clone(), c[0], c[1], c[2])).collect();
        out.sort();
        out
    }

    /// A request to `lambda` that reached no handler (`code` says why), for its timeline.
    pub fn failed(&self, lambda: &str, _code: ErrorCode, elapsed: Duration) {
        self.timeline.lock().unwrap().record(lambda, unix_now(), false, true, elapsed);
        self.count(lambda, false, true);
    }

    /// Each lambda's last hour (`/stats/history`).
    pub fn history(&self) -> Value {
        self.timeline.lock().unwrap().snapshot(unix_now())
    }

    /// A request the app port answered from the static directory of `prefix`.
    pub fn static_request(&self, prefix: &str, status: u16) {
        self.statics.get_or_create(&StaticLabels { prefix: prefix.to_string(), status }).inc();
        *self.static_counts.lock().unwrap().entry(prefix.to_string()).or_default().entry(status).or_default() += 1;
    }

    /// The items of a map over `lambda`, by their outcomes (`ok` or an error code).
    pub fn map_items(&self, lambda: &str, outcomes: impl Iterator<Item = &'static str>) {
        let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
        for outcome in outcomes {
            *counts.entry(outcome).or_default() += 1;
        }
        for (outcome, n) in counts {
            self.map_items.get_or_create(&MapItemLabels { lambda: lambda.to_string(), outcome }).inc_by(n);
        }
    }

    pub fn error(&self, code: ErrorCode) {
        self.errors.get_or_create(&KindLabels { kind: code.as_str() }).inc();
    }

    /// `/metrics`, in Prometheus's text format 0.0.4: what the reply's Content-Type says and
    /// what Prometheus and `promtool check metrics` parse it as.
    pub fn prometheus(&self) -> String {
        let mut open_metrics = String::new();
        prometheus_client::encoding::text::encode(&mut open_metrics, &self.registry).expect("writing to a String");
        text_format(&open_metrics)
    }

    /// Each back-end's counters and sandboxes by state, by its name (the default first).
    fn by_backend(&self) -> Value {
        let states = self.instances.figures().by_backend();
        let mut out = serde_json::Map::new();
        for (name, counters) in self.backend.each_stats() {
            let [starting, busy, idle] = states.iter().find(|(b, _)| *b == name).map(|(_, c)| *c).unwrap_or_default();
            let sandboxes = json!({"starting": starting, "busy": busy, "idle": idle});
            out.insert(name.to_string(), json!({"counters": counters, "sandboxes": sandboxes}));
        }
        Value::Object(out)
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
            "backends": self.by_backend(),
            "lambdas": lambdas,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::gauge::Gauge;

    #[test]
    fn counters_are_described_by_their_samples_name_and_there_is_no_eof() {
        let mut registry = Registry::default();
        let requests = Family::<KindLabels, Counter>::default();
        requests.get_or_create(&KindLabels { kind: "timeout" }).inc();
        registry.register("sprout_things", "Things done", requests);
        let paused = Gauge::<i64>::default();
        paused.set(3);
        registry.register("sprout_paused", "Paused now", paused);
        registry.register("sprout_duration_seconds", "How long", latency_histogram());
        let mut open_metrics = String::new();
        prometheus_client::encoding::text::encode(&mut open_metrics, &registry).unwrap();
        assert!(open_metrics.contains("# TYPE sprout_things counter\n") && open_metrics.ends_with("# EOF\n"), "{open_metrics}");
        let text = text_format(&open_metrics);
        assert!(text.contains("# HELP sprout_things_total Things done.\n# TYPE sprout_things_total counter\n"), "{text}");
        assert!(text.contains("\nsprout_things_total{kind=\"timeout\"} 1\n"), "{text}");
        assert!(text.contains("# HELP sprout_paused Paused now.\n# TYPE sprout_paused gauge\nsprout_paused 3\n"), "{text}");
        assert!(text.contains("# TYPE sprout_duration_seconds histogram\nsprout_duration_seconds_sum 0.0\n"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
        assert_eq!(text.lines().count(), open_metrics.lines().count() - 1);
    }
}
