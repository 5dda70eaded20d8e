//! The `runc` baseline: every sandbox is a general-purpose OCI container, made and torn down
//! by runc, so the benchmarks can measure what SOCK's lean sandboxes save.
//!
//! The container runs the same base root file system (the stage's read-only `run/base`, whose
//! submounts bring the helper at /opt/sprout, the packages at /packages, the volumes and the
//! /etc/hosts naming the services along) and the same helper as a lean sandbox; only the way
//! it comes to be differs. Each sandbox has a bundle directory `run/runc/<id>` holding an OCI
//! runtime spec close to what `runc spec` writes — new PID, IPC, UTS, mount and cgroup
//! namespaces, default masked paths, no capabilities — and a scratch directory bound at
//! /host, where the worker listens before runc starts. Its network is the lean sandboxes':
//! the lambda's own namespace when the worker gave it one (joined by path), else the host's.
//! runc creates a fresh cgroup per container (`<cgroup_parent>/<id>`): no
//! pooling, no Zygote, which is the point of the baseline. `runc run --detach` hands its
//! stdout and stderr down to the container, so they are the sandbox's log pipe; runc's own
//! complaints go to a log file in the bundle, read back when it fails.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::process::Command;

use crate::backend::{Backend, Counters, Sandbox};
use crate::cgroup::{view_of, Layout, Version};
use crate::channel::Endpoint;
use crate::channel::{Reply, Request};
use crate::error::{helper_failed, Doing, PlatformError};
use crate::output::OutputPipe;
use crate::process::PidFd;
use crate::scratch::{make_scratch, remove_dir};
use crate::session::{handler_kind, Calls, Session};
use crate::session_methods;
use crate::spec::{sandbox_env_strings, BackendStats, CreateError, InvokeError, SandboxSpec};
use crate::stage::{Stage, HELPER_IN_SANDBOX};

/// Settings of the runc backend.
#[derive(Debug, Clone)]
pub struct RuncConfig {
    /// The runc program (looked up in PATH unless it is a path).
    pub binary: String,
    /// The user handlers run as.
    pub uid: u32,
    pub gid: u32,
    /// The interpreter inside the base.
    pub python: String,
    pub start_timeout: Duration,
    /// Largest response body a handler may send, in bytes.
    pub max_response: u32,
    /// The cgroup (relative to the hierarchy roots) under which runc makes each container's.
    pub cgroup_parent: String,
    /// Pin containers to these CPUs (cpuset syntax, e.g. "0-3").
    pub cpuset: Option<String>,
}

/// The `runc` back-end.
pub struct RuncBackend {
    runc: Arc<Runc>,
}

/// What the back-end and its sandboxes share: a sandbox deletes its container through it.
struct Runc {
    cfg: RuncConfig,
    stage: Arc<Stage>,
    layout: Option<Layout>,
    /// `cgroup.procs` of the v1 cpuset group the worker runs in, when that is not the root
    /// and no `cpuset` is configured: containers are moved back into it (see [`worker_cpuset`]).
    worker_cpuset: Option<PathBuf>,
    next_id: AtomicU64,
    counters: Counters,
}

/// One container and its helper.
struct RuncSandbox {
    session: Session,
    container: String,
    bundle: PathBuf,
    runc: Arc<Runc>,
}

impl RuncBackend {
    pub fn new(cfg: RuncConfig, stage: Arc<Stage>) -> RuncBackend {
        let layout = Layout::detect(Version::Auto, None)
            .map_err(|e| tracing::warn!("no cgroup hierarchy found; runc sandboxes go unwatched: {e}"))
            .ok();
        let worker_cpuset = if cfg.cpuset.is_none() { worker_cpuset() } else { None };
        let runc = Runc { cfg, stage, layout, worker_cpuset, next_id: AtomicU64::new(1), counters: Counters::default() };
        RuncBackend { runc: Arc::new(runc) }
    }
}

/// On cgroup v1 runc puts each container into a cpuset group of its own at the hierarchy's
/// root, which has every CPU: a worker confined to a cpuset group (a deployment's) would see
/// its containers leave it, while lean sandboxes stay in the worker's group. Without a
/// configured `cpuset`, a container's init is therefore moved back into the worker's group
/// as soon as it runs, before its helper connects (what it starts later follows it). This is
/// the `cgroup.procs` of that group, when the worker runs in one other than the root.
pub(crate) fn worker_cpuset() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let group = own.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers.split(',').any(|c| c == "cpuset").then_some(path)
    })?;
    if group == "/" {
        return None;
    }
    Some(cpuset_mount()?.join(group.trim_start_matches('/')).join("cgroup.procs"))
}

/// Where the v1 cpuset hierarchy is mounted.
pub(crate) fn cpuset_mount() -> Option<PathBuf> {
    let mounts = crate::mountinfo::read().ok()?;
    mounts.into_iter().find(|m| m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == "cpuset")).map(|m| m.mount_point)
}

impl Runc {
    /// Where runc keeps its state of this worker's containers.
    fn state_root(&self) -> PathBuf {
        self.stage.run.join("runc-state")
    }

    /// `runc --root <state>`, with runc's own log in `log` when given.
    fn runc(&self, log: Option<&Path>) -> Command {
        let mut cmd = Command::new(&self.cfg.binary);
        cmd.arg("--root").arg(self.state_root());
        if let Some(log) = log {
            cmd.arg("--log").arg(log).args(["--log-format", "json"]);
        }
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        cmd
    }

    /// What to say when runc cannot be run at all.
    fn spawn_error(&self, error: std::io::Error) -> PlatformError {
        let doing = if error.kind() == std::io::ErrorKind::NotFound { "running runc (apt-get install runc)" } else { "running runc" };
        PlatformError::Path { doing: doing.into(), path: self.cfg.binary.clone().into(), error }
    }

    /// The OCI runtime spec of one sandbox.
    fn runtime_spec(&self, id: u64, spec: &SandboxSpec, scratch: &Path) -> Value {
        let bind =
            |dst: &str, src: &Path, mode: &str| json!({"destination": dst, "type": "bind", "source": src, "options": ["rbind", mode]});
        let mount = |dst: &str, kind: &str, src: &str, options: &[&str]| json!({"destination": dst, "type": kind, "source": src, "options": options});
        let limits = &spec.limits;
        // Absent (null) means unlimited, as runc reads it.
        let quota = (limits.cpus > 0.0).then(|| ((limits.cpus * 100_000.0) as i64).max(1000));
        let no_caps: Vec<String> = Vec::new();
        let mut namespaces: Vec<Value> = ["pid", "ipc", "uts", "mount", "cgroup"].iter().map(|t| json!({"type": t})).collect();
        // The network lean sandboxes get: the lambda's own namespace (network.isolate), joined
        // through the worker's descriptor of it; without one (isolate = false), the host's.
        if let Some(network) = spec.network.as_ref().filter(|n| n.fd() >= 0) {
            namespaces.push(json!({"type": "network", "path": format!("/proc/{}/fd/{}", std::process::id(), network.fd())}));
        }
        json!({
            "ociVersion": "1.0.2",
            "root": {"path": self.stage.base, "readonly": true},
            "process": {
                "terminal": false,
                "user": {"uid": self.cfg.uid, "gid": self.cfg.gid},
                "args": [self.cfg.python, "-I", "-S", HELPER_IN_SANDBOX, "handler"],
                "env": sandbox_env_strings(&spec.env),
                "cwd": "/",
                "noNewPrivileges": true,
                "capabilities": {"bounding": no_caps, "effective": no_caps, "inheritable": no_caps,
                                 "permitted": no_caps, "ambient": no_caps},
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            },
            "hostname": "sandbox",
            "mounts": [
                mount("/proc", "proc", "proc", &[]),
                mount("/dev", "tmpfs", "tmpfs", &["nosuid", "strictatime", "mode=755", "size=65536k"]),
                mount("/dev/pts", "devpts", "devpts", &["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]),
                mount("/dev/shm", "tmpfs", "shm", &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),
                mount("/dev/mqueue", "mqueue", "mqueue", &["nosuid", "noexec", "nodev"]),
                mount("/sys", "sysfs", "sysfs", &["nosuid", "noexec", "nodev", "ro"]),
                bind("/handler", &self.stage.code_view(&spec.code_dir), "ro"),
                bind("/host", scratch, "rw"),
            ],
            "linux": {
                "namespaces": namespaces,
                "cgroupsPath": format!("/{}/{id}", self.cfg.cgroup_parent),
                "resources": {
                    "devices": [{"allow": false, "access": "rwm"}],
                    "memory": {"limit": limits.memory_bytes},
                    "pids": {"limit": limits.pids},
                    "cpu": {"quota": quota, "period": quota.map(|_| 100_000), "cpus": self.cfg.cpuset},
                },
                "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
                                "/proc/scsi"],
                "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
            },
        })
    }

    /// Write the bundle and `runc run --detach` the container; the helper's stdout and
    /// stderr are `log`.
    async fn start_container(&self, name: &str, bundle: &Path, config: &Value, log: OwnedFd) -> Result<(), CreateError> {
        let body = serde_json::to_vec(config).doing("encoding the runtime spec")?;
        let file = bundle.join("config.json");
        tokio::fs::write(&file, body).await.at("writing", &file)?;
        let runc_log = bundle.join("runc.log");
        let mut cmd = self.runc(Some(&runc_log));
        cmd.args(["run", "--detach", "--bundle"]).arg(bundle).arg(name);
        let out_fd = log.try_clone().doing("duplicating the log pipe")?;
        cmd.stdout(Stdio::from(out_fd)).stderr(Stdio::from(log));
        let status = cmd.status().await.map_err(|e| self.spawn_error(e))?;
        if status.success() {
            return Ok(());
        }
        let said = std::fs::read_to_string(&runc_log).unwrap_or_default();
        let errors: Vec<String> = (said.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()))
            .filter(|v| v["level"] == "error" || v["level"] == "fatal")
            .filter_map(|v| v["msg"].as_str().map(str::to_string))
            .collect();
        let why = if errors.is_empty() { status.to_string() } else { errors.join("; ") };
        Err(PlatformError::Engine { engine: "runc", doing: "start the container".into(), message: why }.into())
    }

    /// Start the container and wait for its helper to connect and load the lambda.
    /// The container's init goes into `init` as soon as it runs.
    async fn provision(
        self: &Arc<Self>,
        id: u64,
        name: &str,
        bundle: &Path,
        spec: &SandboxSpec,
        init: &mut Option<PidFd>,
    ) -> Result<RuncSandbox, CreateError> {
        let started = Instant::now();
        let scratch = bundle.join("scratch");
        make_scratch(&scratch, self.cfg.uid, self.cfg.gid).at("making the scratch directory", &scratch)?;
        let endpoint = Endpoint::listen_in(&scratch)?;
        let config = self.runtime_spec(id, spec, &scratch);
        let (output, log) = OutputPipe::new(id, spec.output_sink()).doing("making the sandbox's log pipe")?;
        self.start_container(name, bundle, &config, log).await?;
        // The container's init is the helper itself (runc's init execs it).
        *init = self.init_process(name);
        if let (Some(procs), Some(init)) = (&self.worker_cpuset, init.as_ref()) {
            match std::fs::write(procs, init.pid().to_string()) {
                // Gone already: waiting for its hello below says why.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                moved => moved.at("moving the container into the worker's cpuset group", procs)?,
            }
        }
        let accepted = match init.as_ref() {
            Some(init) => tokio::select! {
                accepted = endpoint.accept(self.cfg.start_timeout, self.cfg.max_response) => accepted,
                dead = init.exited(self.cfg.start_timeout) => return Err(helper_failed(dead, self.cfg.start_timeout).into()),
            },
            None => endpoint.accept(self.cfg.start_timeout, self.cfg.max_response).await,
        };
        let (mut channel, peer) = accepted?;
        let hello = channel.handshake(&spec.env, &spec.paths, self.cfg.start_timeout).await?;
        let kind = handler_kind(hello)?;
        let cgroup_path = view_of(self.layout.as_ref(), &format!("{}/{id}", self.cfg.cgroup_parent));
        let process = init.take().or(peer);
        let session =
            Session::new(id, kind, started.elapsed(), channel, process, cgroup_path, spec.limits, spec.attachments(), Some(output));
        Ok(RuncSandbox { session, container: name.to_string(), bundle: bundle.to_path_buf(), runc: self.clone() })
    }

    /// A pidfd of a running container's init process, from runc's state file.
    fn init_process(&self, container: &str) -> Option<PidFd> {
        let state = std::fs::read(self.state_root().join(container).join("state.json")).ok()?;
        let pid = serde_json::from_slice::<Value>(&state).ok()?["init_process_pid"].as_i64()?;
        PidFd::open(pid as i32).ok()
    }

    /// Kill and delete a container (if runc knows it) and remove its bundle. Killing its
    /// init ourselves first spares `runc delete --force` its fixed 100 ms wait after SIGKILL.
    async fn remove(&self, container: &str, bundle: &Path, init: Option<&PidFd>) {
        if let Some(init) = init {
            init.kill();
            init.exited(Duration::from_secs(2)).await;
        }
        let mut delete = self.runc(None);
        delete.args(["delete", "--force", container]).stdout(Stdio::null());
        // Nothing to say when runc never made the container, or cannot run at all.
        if let Ok(out) = delete.output().await {
            let said = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() && !said.contains("does not exist") {
                tracing::warn!(container, "runc delete: {}", said.trim());
            }
        }
        remove_dir(bundle).await;
    }
}

#[async_trait]
impl Backend for RuncBackend {
    fn name(&self) -> &'static str {
        "runc"
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>, CreateError> {
        let runc = &self.runc;
        let id = runc.next_id.fetch_add(1, Ordering::Relaxed);
        let name = format!("sprout-{id}");
        let bundle = runc.stage.run.join("runc").join(id.to_string());
        let mut init = None;
        let result = runc.provision(id, &name, &bundle, spec, &mut init).await;
        runc.counters.record(&result);
        if result.is_err() {
            runc.remove(&name, &bundle, init.as_ref()).await;
        }
        Ok(Box::new(result?))
    }

    fn stats(&self) -> BackendStats {
        self.runc.counters.stats()
    }

    async fn shutdown(&self) {
        let runc = &self.runc;
        let mut cmd = runc.runc(None);
        cmd.args(["list", "-q"]);
        match cmd.stderr(Stdio::null()).output().await {
            Ok(out) => {
                for container in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Some(id) = container.strip_prefix("sprout-") {
                        let init = runc.init_process(container);
                        runc.remove(container, &runc.stage.run.join("runc").join(id), init.as_ref()).await;
                    }
                }
            }
            Err(e) => tracing::warn!("listing runc containers: {}", runc.spawn_error(e)),
        }
        remove_dir(&runc.stage.run.join("runc")).await;
        if let Some(layout) = &runc.layout {
            layout.remove_container_parent(&runc.cfg.cgroup_parent);
        }
    }
}

#[async_trait]
impl Sandbox for RuncSandbox {
    session_methods!();

    async fn invoke(
        &mut self,
        request: &Request,
        body: &[u8],
        timeout: Duration,
        calls: &dyn Calls,
    ) -> Result<(Reply, Bytes), InvokeError> {
        self.session.invoke(request, body, timeout, calls).await
    }

    async fn destroy(self: Box<Self>) {
        let RuncSandbox { session, container, bundle, runc } = *self;
        let Session { channel, process, attached, .. } = session;
        drop(channel);
        runc.remove(&container, &bundle, process.as_ref()).await;
        runc.counters.destroyed();
        drop(attached);
    }
}
