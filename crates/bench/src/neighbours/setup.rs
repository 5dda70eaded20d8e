//! What `sprout bench neighbours` sets up: the neighbours and the victims it deploys, the
//! worker's configuration, and how long each part runs.

use crate::sandbox_worker::Options;

/// The neighbours, in the order their phases run.
pub const NEIGHBOURS: [&str; 4] = ["printer", "printer-paced", "spinner", "churner"];
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
