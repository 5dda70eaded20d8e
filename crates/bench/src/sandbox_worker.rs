//! A real worker for one sandbox variant of `sprout bench sandboxes` (`sock`, `sock-isolated`,
//! `gvisor`, ...), and the options the sandbox benchmarks share (`isolation`, `footprint`,
//! `asgi`, `neighbours`): configured, started pinned to the worker CPU, deployed to, stopped.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub const BACKENDS: [&str; 7] = ["sock", "sock-isolated", "sock-nospares", "sock-nozygote", "gvisor", "runc", "docker"];

/// The worker's backend, and the keys that make `variant` what it is: for `[sandbox]`, and
/// sections to append.
fn variant_config(variant: &str) -> (&str, &'static str, String) {
    let service = |isolate: bool| {
        let echo = crate::echo::echo_port();
        format!("[network]\nisolate = {isolate}\n\n[[network.allow]]\nname = \"echo\"\naddress = \"127.0.0.1:{echo}\"\n")
    };
    match variant {
        // SOCK's lean sandbox, as before network namespaces and seccomp.
        "sock" => ("sock", "seccomp = false\n", service(false)),
        "sock-isolated" => ("sock", "seccomp = true\n", service(true)),
        // SOCK's sandbox without spares: every cold start forks on demand.
        "sock-nospares" => ("sock", "seccomp = false\nspares = 0\n", service(false)),
        "sock-nozygote" => ("sock-nozygote", "seccomp = false\n", "[network]\nisolate = false\n".into()),
        // A pod per lambda under gVisor's kernel, isolated as sock-isolated is.
        "gvisor" => ("gvisor", "seccomp = true\n", service(true)),
        // The same, its pods parked to disk soon after their sandboxes are paused; restored
        // with memory loaded in the background, or before the restore returns.
        "gvisor-park" | "gvisor-park-fg" => (
            "gvisor",
            "seccomp = true\n",
            service(true)
                + "\n[gvisor]\npark_after_ms = 500\n"
                + if variant == "gvisor-park" { "background_restore = true\n" } else { "background_restore = false\n" }
                + "\n[handler_cache]\npause_after_ms = 20\n",
        ),
        other => (other, "", String::new()),
    }
}

/// `config` with each `section.key=value` of `settings` set in it (the value parsed as TOML,
/// or taken as a string where it is not TOML: `limits.cpu_weight_per=lambda`).
pub(crate) fn with_settings(config: &str, settings: &[String]) -> Result<String> {
    if settings.is_empty() {
        return Ok(config.to_string());
    }
    let mut table: toml::Table = config.parse()?;
    for setting in settings {
        let (path, value) = setting.split_once('=').ok_or_else(|| anyhow::anyhow!("--set {setting}: not section.key=value"))?;
        let (section, key) = path.trim().split_once('.').ok_or_else(|| anyhow::anyhow!("--set {setting}: name a section and a key"))?;
        let value = format!("v = {value}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()));
        match table.entry(section).or_insert_with(|| toml::Value::Table(toml::Table::new())) {
            toml::Value::Table(t) => t.insert(key.to_string(), value),
            _ => anyhow::bail!("--set {setting}: {section} is not a section"),
        };
    }
    Ok(toml::to_string(&table)?)
}

#[derive(Debug, Clone)]
pub struct Options {
    pub backends: Vec<String>,
    pub concurrency: Vec<usize>,
    /// Measured seconds per cold-start point (after a short warm-up).
    pub seconds: f64,
    /// CPU for the worker and its sandboxes, and CPU for this load generator.
    pub worker_cpu: usize,
    pub client_cpu: usize,
    /// Scratch directory for the workers.
    pub work_dir: PathBuf,
    pub out_dir: PathBuf,
    /// The `sprout` binary that runs the workers.
    pub sprout: PathBuf,
    /// Worker settings over the benchmark's own (`section.key=value`, the value in TOML or a
    /// bare string), to compare configurations of one build.
    pub settings: Vec<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            backends: BACKENDS.iter().map(|s| s.to_string()).collect(),
            concurrency: vec![1, 2, 5, 10, 20],
            seconds: 5.0,
            worker_cpu: 0,
            client_cpu: 1,
            work_dir: PathBuf::from("/tmp/sprout-bench-sandboxes"),
            out_dir: PathBuf::from("bench/results"),
            sprout: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("sprout")),
            settings: Vec::new(),
        }
    }
}

pub(crate) fn pin_to(cpu: usize) -> std::io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(std::io::Error::from)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(std::io::Error::from)
}

/// A worker started for one phase of the benchmark.
pub(crate) struct Worker {
    child: Child,
    dir: PathBuf,
    pub(crate) port: u16,
    /// Its `worker.name`, which names its cgroups.
    pub(crate) name: String,
    sprout: PathBuf,
}

impl Worker {
    pub(crate) fn start(opts: &Options, variant: &str, keep_warm: bool, port: u16) -> Result<Worker> {
        let (backend, sandbox_keys, sections) = variant_config(variant);
        let dir = opts.work_dir.join(format!("{variant}-{}", if keep_warm { "warm" } else { "cold" }));
        if dir.join("config.toml").exists() {
            // A worker of an earlier, interrupted run may still hold it.
            let _ = Command::new(&opts.sprout).args(["worker", "down"]).arg(&dir).output();
        }
        std::fs::create_dir_all(&dir)?;
        let max = opts.concurrency.iter().copied().max().unwrap_or(1).max(1);
        let config = format!(
            "[worker]\nlisten = \"127.0.0.1:{port}\"\nname = \"bench-{variant}-{phase}\"\nlog = \"warn\"\n\
             [sandbox]\nbackend = \"{backend}\"\ncpuset = \"{cpu}\"\nstart_timeout_ms = 120000\ncgroup_pool = {pool}\n{sandbox_keys}\
             [limits]\ntimeout_ms = 120000\n\
             [instances]\nkeep_warm = {keep_warm}\nmax_per_lambda = {max}\nqueue_depth = 1024\nmax_total = {total}\n{sections}",
            phase = if keep_warm { "warm" } else { "cold" },
            cpu = opts.worker_cpu,
            pool = max * 2,
            total = max * 2,
        );
        std::fs::write(dir.join("config.toml"), with_settings(&config, &opts.settings)?)?;
        let init = Command::new(&opts.sprout).args(["worker", "init"]).arg(&dir).output()?;
        if !init.status.success() {
            bail!("sprout worker init: {}", String::from_utf8_lossy(&init.stderr));
        }
        let log = std::fs::File::create(dir.join("bench-worker.log"))?;
        let cpu = opts.worker_cpu;
        let mut cmd = Command::new(&opts.sprout);
        cmd.args(["worker", "up"]).arg(&dir).stdout(log.try_clone()?).stderr(log);
        // SAFETY: the closure runs in the forked child before exec; pin_to only fills a CpuSet on the
        // stack and calls sched_setaffinity, which is async-signal-safe, and allocates nothing.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || pin_to(cpu));
        }
        let child = cmd.spawn()?;
        let name = format!("bench-{variant}-{}", if keep_warm { "warm" } else { "cold" });
        let mut worker = Worker { child, dir, port, name, sprout: opts.sprout.clone() };
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            if let Some(status) = worker.child.try_wait()? {
                let log = std::fs::read_to_string(worker.dir.join("bench-worker.log")).unwrap_or_default();
                bail!("the {backend} worker exited ({status}): {}", log.lines().rev().take(5).collect::<Vec<_>>().join(" | "));
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!("the {backend} worker did not start");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let noop = worker.dir.join("noop");
        let deployed = std::fs::create_dir_all(&noop)
            .and_then(|()| std::fs::write(noop.join("f.py"), "def f(event):\n    return None\n"))
            .map_err(anyhow::Error::from)
            .and_then(|()| worker.deploy(opts, &noop, "noop"));
        if let Err(e) = deployed {
            let _ = worker.stop();
            return Err(e);
        }
        Ok(worker)
    }

    /// Deploy the lambda in `dir` as `name`, with the worker's token.
    pub(crate) fn deploy(&self, opts: &Options, dir: &std::path::Path, name: &str) -> Result<()> {
        let token = std::fs::read_to_string(self.dir.join("api-token")).context("reading the worker's API token")?;
        let deploy = Command::new(&opts.sprout)
            .args(["deploy"])
            .arg(dir)
            .args(["--name", name, "--url", &self.url(), "--token", token.trim()])
            .output()?;
        if !deploy.status.success() {
            bail!("deploying {name}: {}", String::from_utf8_lossy(&deploy.stderr));
        }
        Ok(())
    }

    /// The worker's `/stats`.
    pub(crate) fn stats(&self) -> Result<serde_json::Value> {
        use std::io::{Read, Write};
        let token = std::fs::read_to_string(self.dir.join("api-token")).context("reading the worker's API token")?;
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(stream, "GET /stats HTTP/1.0\r\nHost: bench\r\nAuthorization: Bearer {}\r\n\r\n", token.trim())?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        let body = reply.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        serde_json::from_str(body).with_context(|| format!("the worker's /stats: {}", reply.lines().next().unwrap_or("")))
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn stop(mut self) -> Result<()> {
        self.shut_down();
        Ok(())
    }

    /// `sprout worker down`, or a kill when that fails; nothing when it has exited.
    fn shut_down(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let down = Command::new(&self.sprout).args(["worker", "down"]).arg(&self.dir).output();
        if !down.map(|o| o.status.success()).unwrap_or(false) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A worker is never left running, whatever error cut its phase short.
impl Drop for Worker {
    fn drop(&mut self) {
        self.shut_down();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn settings_are_set_over_the_benchmarks_own() {
        let config = "[worker]\nlog = \"warn\"\n[limits]\ntimeout_ms = 120000\n";
        let set = |s: &[&str]| super::with_settings(config, &s.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let table: toml::Table =
            set(&["worker.cpu_weight=400", "limits.cpu_weight_per=lambda", "gvisor.spares=\"2\""]).unwrap().parse().unwrap();
        assert_eq!(table["worker"]["cpu_weight"].as_integer(), Some(400));
        assert_eq!(table["worker"]["log"].as_str(), Some("warn"));
        assert_eq!(table["limits"]["cpu_weight_per"].as_str(), Some("lambda"));
        assert_eq!(table["limits"]["timeout_ms"].as_integer(), Some(120000));
        assert_eq!(table["gvisor"]["spares"].as_str(), Some("2"));
        assert_eq!(set(&[]).unwrap(), config);
        for bad in ["cpu_weight=1", "worker=1", "worker.log.x"] {
            assert!(set(&[bad]).is_err(), "{bad}");
        }
    }
}
