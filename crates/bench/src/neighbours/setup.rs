//! What `sprout bench neighbours` sets up: the neighbours and the victims it deploys (one as
//! a tenant flooding its quota), the worker's configuration, and how long each part runs.

use crate::sandbox_worker::Options;

/// The neighbours, in the order their phases run.
pub const NEIGHBOURS: [&str; 5] = ["printer", "printer-paced", "spinner", "churner", TENANT_FLOOD];
/// The neighbour that is a tenant of its own calling its lambda at [`FLOOD_TIMES`] its quota
/// of [`FLOOD_QUOTA`] invocations a second (and [`CALLERS`] + 1 in flight).
pub const TENANT_FLOOD: &str = "tenant-flood";
pub const FLOOD_QUOTA: f64 = 50.0;
pub const FLOOD_TIMES: f64 = 10.0;
/// CPU each of the flooding tenant's calls spends, in seconds.
pub const FLOOD_CALL_CPU_S: f64 = 0.002;
/// Closed-loop clients calling the neighbour in its phase.
pub const CALLERS: usize = 3;

const VICTIM: &str = "def f(event):\n    return event\n";

const VICTIM_PRINTS: &str = "def f(event):\n    print(\"victim-prints: handled a request\")\n    return event\n";

/// 20 MB of 100-byte lines per call, 1 MB per write, as fast as the pipe takes them.
const PRINTER: &str = r#"import sys
import time

LINE = "p" * 99 + "\n"
CHUNK = LINE * 10_000  # 1 MB
CHUNKS = 20


def f(event):
    t0 = time.monotonic()
    for _ in range(CHUNKS):
        sys.stdout.write(CHUNK)
    sys.stdout.flush()
    return {"bytes": CHUNKS * len(CHUNK), "seconds": time.monotonic() - t0}
"#;

/// ~33 MB/s for ~1 s per call, 1 MB per write, sleeping to keep the pace: 100 MB/s in all
/// across three callers.
const PRINTER_PACED: &str = r#"import sys
import time

LINE = "q" * 99 + "\n"
CHUNK = LINE * 10_000  # 1 MB
RATE = 100e6 / 3  # bytes a second, per call
CHUNKS = round(RATE / len(CHUNK))  # one second's worth


def f(event):
    t0 = time.monotonic()
    for i in range(CHUNKS):
        delay = t0 + i * len(CHUNK) / RATE - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sys.stdout.write(CHUNK)
    sys.stdout.flush()
    delay = t0 + CHUNKS * len(CHUNK) / RATE - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    return {"bytes": CHUNKS * len(CHUNK), "seconds": time.monotonic() - t0}
"#;

/// A busy loop until it has used 1 s of CPU.
const SPINNER: &str = r#"import time


def f(event):
    t0 = time.process_time()
    n = 0
    while time.process_time() - t0 < 1.0:
        for _ in range(10_000):
            n += 1
    return {"cpu_seconds": time.process_time() - t0, "loops": n}
"#;

/// 100 MiB allocated, every page touched, freed.
const CHURNER: &str = r#"import time

SIZE = 100 << 20
PAGE = 4096


def f(event):
    t0 = time.monotonic()
    b = bytearray(SIZE)
    for i in range(0, SIZE, PAGE):
        b[i] = 1
    del b
    return {"allocated": SIZE, "seconds": time.monotonic() - t0}
"#;

/// 2 ms of CPU a call ([`FLOOD_CALL_CPU_S`]): the work a flooding tenant's quota admits.
const FLOODER: &str = r#"import time


def f(event):
    t0 = time.process_time()
    while time.process_time() - t0 < 0.002:
        pass
    return None
"#;

/// How often each of a neighbour's callers calls: every [`CALLERS`] / rate for the tenant
/// flood (its callers together at [`FLOOD_TIMES`] x [`FLOOD_QUOTA`]); None, back to back.
pub(super) fn pace_of(neighbour: &str) -> Option<std::time::Duration> {
    (neighbour == TENANT_FLOOD).then(|| std::time::Duration::from_secs_f64(CALLERS as f64 / (FLOOD_TIMES * FLOOD_QUOTA)))
}

/// Make the flooding tenant (its key, its quota) and deploy its lambda with its key.
pub(super) fn deploy_tenant_flood(worker: &crate::worker::BenchWorker) -> anyhow::Result<()> {
    let token = std::fs::read_to_string(worker.dir.join("api-token"))?;
    let admin = |method: &str, path: &str, body: serde_json::Value| -> anyhow::Result<serde_json::Value> {
        let request = ureq::request(method, &format!("{}{path}", worker.url())).set("Authorization", &format!("Bearer {}", token.trim()));
        match request.send_json(body) {
            Ok(r) => Ok(r.into_json()?),
            Err(ureq::Error::Status(code, r)) => anyhow::bail!("{method} {path}: {code} {}", r.into_string().unwrap_or_default()),
            Err(e) => Err(e.into()),
        }
    };
    admin("POST", "/tenants", serde_json::json!({"name": "flood"}))?;
    let key = admin("POST", "/tenants/flood/keys", serde_json::json!({}))?["key"].as_str().unwrap_or_default().to_string();
    admin("PUT", "/tenants/flood/quotas", serde_json::json!({"invocations_per_s": FLOOD_QUOTA, "concurrent": CALLERS + 1}))?;
    let client = crate::worker::Client::new(&worker.url(), &key, std::time::Duration::from_secs(120));
    client.upload(TENANT_FLOOD, &[("f.py", FLOODER.as_bytes())])
}

pub(super) const LAMBDAS: [(&str, &str); 6] = [
    ("victim", VICTIM),
    ("victim-prints", VICTIM_PRINTS),
    ("printer", PRINTER),
    ("printer-paced", PRINTER_PACED),
    ("spinner", SPINNER),
    ("churner", CHURNER),
];

/// How long each part runs.
pub(super) struct Plan {
    pub(super) quick: bool,
    /// Measured seconds per phase, after `warmup`.
    pub(super) seconds: f64,
    pub(super) warmup: f64,
    /// G1: alternating rounds of the silent and the printing victim, `g1_seconds` each.
    pub(super) g1_rounds: usize,
    pub(super) g1_seconds: f64,
    pub(super) g1_warmup: f64,
}

impl Plan {
    pub(super) fn new(opts: &Options, quick: bool) -> Plan {
        if quick {
            let seconds = opts.seconds.min(4.0);
            Plan { quick, seconds, warmup: 2.0, g1_rounds: 4, g1_seconds: seconds / 2.0, g1_warmup: 0.5 }
        } else {
            Plan { quick, seconds: opts.seconds, warmup: 5.0, g1_rounds: 6, g1_seconds: opts.seconds / 4.0, g1_warmup: 1.0 }
        }
    }
}

/// The worker's configuration: its defaults but for what the neighbours need.
pub(super) fn worker_config(cpu: usize) -> String {
    format!(
        "[sandbox]\nbackend = \"sock\"\ncpuset = \"{cpu}\"\nstart_timeout_ms = 60000\n\n\
         [limits]\ntimeout_ms = 120000\n\n\
         [instances]\nmax_per_lambda = {}\n",
        CALLERS + 1
    )
}
