//! The worker's life cycle: `init` (config, API token and base image), `serve` (the running
//! worker, [`serve`]), `up --detach`, `down`, `status` and `cleanup`.
//!
//! A running worker holds an exclusive lock on `DIR/worker.lock` for its whole life. The lock
//! dies with the process however it ends, so "is a worker running here?" never trusts a stale
//! pid file, and `serve` can always clean up what a killed predecessor left before starting.

mod docker;
mod host;
mod serve;

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sprout_docker::DockerBackend;
use sprout_sandbox::stage::Stage;
use sprout_sandbox::{base, cleanup, network};

use sprout_api::auth::token;
use sprout_engine::config::BackendKind;

use crate::config::{Config, TEMPLATE};

use host::{detect_layout, LOCK, PID};
pub use host::{running_pid, LOG};
pub use serve::serve;
pub use sprout_sandbox::base::Outcome as InitOutcome;

/// Write `DIR/config.toml` and `DIR/api-token` (unless present) and make sure the base image
/// exists.
pub fn init(dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<InitOutcome> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let config_path = dir.join("config.toml");
    if !config_path.exists() {
        fs::write(&config_path, TEMPLATE)?;
        progress(&format!("wrote {}", config_path.display()));
    } else {
        progress(&format!("keeping {}", config_path.display()));
    }
    let config = Config::load(dir)?;
    if token::ensure_token(dir)?.1 {
        progress(&format!("wrote {} (the API token)", token::token_path(dir).display()));
    }
    for sub in ["registry", "packages"] {
        fs::create_dir_all(dir.join(sub))?;
    }
    let mirror = (!config.base.mirror.is_empty()).then_some(config.base.mirror.as_str());
    let outcome = base::ensure(&config.base.path, &config.base.suite, mirror, progress)?;
    // The microVMs' guest kernel (minutes), only for a worker configured for them on a host
    // whose KVM can run them; elsewhere nothing would boot it (the worker builds it on demand).
    if config.sandbox.backend == BackendKind::Vm && sprout_sandbox::vm::kvm_host() == sprout_sandbox::vm::KvmHost::Hardware {
        match sprout_sandbox::vm::kernel::ensure(&config.vm.dir, progress)? {
            (kernel, sprout_sandbox::vm::kernel::Outcome::Built(t)) => {
                progress(&format!("guest kernel built in {:.0} s: {}", t.as_secs_f64(), kernel.vmlinux.display()))
            }
            (kernel, _) => progress(&format!("guest kernel ready (reused): {}", kernel.vmlinux.display())),
        }
    }
    Ok(outcome)
}

/// What `status` reports.
#[derive(Debug, Serialize)]
pub struct Status {
    pub running: bool,
    pub pid: Option<u32>,
    pub listen: String,
    pub backend: &'static str,
    pub ready: bool,
}

pub fn status(dir: &Path) -> Result<Status> {
    let config = Config::load(dir)?;
    let pid = running_pid(dir);
    let ready = pid.is_some() && http_ready(&config.worker.listen);
    Ok(Status { running: pid.is_some(), pid, listen: config.worker.listen, backend: config.sandbox.backend.name(), ready })
}

fn http_ready(listen: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(addr) = listen.parse::<SocketAddr>() else {
        return false;
    };
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /status HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200") && out.ends_with("ready\n")
}

/// Start `exe worker up DIR` in the background, logging to DIR/worker.log; returns once it
/// answers /status, or with the log's tail if it died.
pub fn up_detached(dir: &Path, exe: &Path) -> Result<u32> {
    if let Some(pid) = running_pid(dir) {
        bail!("a worker is already running in {} (pid {pid})", dir.display());
    }
    let config = Config::load(dir)?;
    let log = fs::OpenOptions::new().create(true).append(true).open(dir.join(LOG))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["worker", "up"]).arg(dir).stdin(std::process::Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // SAFETY: the pre_exec closure runs in the forked child before exec and only calls setsid,
    // which is async-signal-safe; it captures nothing and allocates nothing.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait()? {
            let log = fs::read_to_string(dir.join(LOG)).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("the worker exited during start-up ({status}):\n{}", tail.join("\n"));
        }
        if http_ready(&config.worker.listen) {
            return Ok(child.id());
        }
        if Instant::now() > deadline {
            bail!("the worker did not become ready within 120 s; see {}", dir.join(LOG).display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stop the worker in `dir`: SIGTERM, then SIGKILL and a cleanup if it does not finish.
/// Returns false when no worker was running.
pub fn down(dir: &Path, grace: Duration) -> Result<bool> {
    let Some(pid) = running_pid(dir) else {
        return Ok(false);
    };
    let Some(pid) = i32::try_from(pid).ok().filter(|p| *p > 0) else {
        bail!("a worker holds {} but its pid file holds no process id ({pid})", dir.join(LOCK).display());
    };
    // SAFETY: kill takes two integers and touches no memory of ours; `pid` is the locked
    // worker's, read from its pid file and checked positive above (never a process group).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while running_pid(dir).is_some() {
        if Instant::now() > deadline {
            tracing::warn!("the worker did not stop within {grace:?}; killing it");
            // SAFETY: as above, kill takes only integers; `pid` is the same non-zero worker pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            std::thread::sleep(Duration::from_millis(200));
            cleanup_dir(dir)?;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(true)
}

/// Remove what a dead worker left in `dir`; refuses while a worker is running there.
pub fn cleanup_dir(dir: &Path) -> Result<cleanup::Report> {
    if let Some(pid) = running_pid(dir) {
        bail!("a worker is running in {} (pid {pid}); stop it with `sprout worker down`", dir.display());
    }
    let config = Config::load(dir)?;
    let layout = detect_layout(&config)?;
    let mut report = cleanup::cleanup(dir, &layout, &config.cgroup_parents(dir))?;
    report.network_removed = network::host::release(dir, &config.network_tag(dir).0);
    if config.sandbox.backend == BackendKind::Docker && config.docker.socket.exists() {
        let docker_config = docker::docker_config(&config.engine(), &config.worker_name(dir));
        let docker = DockerBackend::new(docker_config, Arc::new(Stage::paths(dir)));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        report.processes_killed += rt.block_on(docker.remove_leftovers());
    }
    let _ = fs::remove_file(dir.join(PID));
    if let (Ok(listen), Ok(token)) = (config.worker.listen.parse(), token::read_token(dir)) {
        token::withdraw(listen, &token);
    }
    Ok(report)
}
