//! One lambda's gVisor sandbox (a pod): a runsc container whose first process is the helper
//! as that lambda's Zygote (`helper.py pod`), holding the lambda's packages imported, which
//! forks the lambda's handlers inside gVisor's kernel. Every helper in the pod connects to
//! one socket the worker listens on in the pod's scratch directory: the Zygote first (its
//! control channel), then each spare it forks, which says its pid and waits to be bound.
//! Spares are forked ahead, so a cold start inside a running pod only binds one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Mutex};

use super::runsc::Runsc;
use super::GvisorConfig;
use crate::channel::{Channel, Endpoint, Hello, ZygoteOrder};
use crate::error::{Doing, PlatformError};
use crate::network::LambdaNetwork;
use crate::output::{OutputPipe, OutputSink};
use crate::scratch::{make_scratch, remove_dir};
use crate::spec::{sandbox_env_strings, CreateError, SandboxSpec};
use crate::stage::{Stage, HELPER_IN_SANDBOX};

/// What every pod of a worker is made with: the back-end's settings, and the lean sandboxes'
/// seccomp filter (hex of its instructions), which each handler installs so that gVisor's
/// kernel refuses what the host's would.
pub(crate) struct PodSettings {
    pub cfg: GvisorConfig,
    pub seccomp: Option<String>,
}

/// A spare that has connected: its channel and its pid inside the pod.
pub(crate) struct Spare {
    pub channel: Channel,
    pub pid: i32,
}

/// A running pod.
pub(crate) struct Pod {
    pub id: u64,
    pub container: String,
    pub bundle: PathBuf,
    pub scratch: PathBuf,
    pub cgroup: String,
    control: Mutex<Channel>,
    spares: Mutex<mpsc::Receiver<Spare>>,
    /// Spares asked for and not yet taken.
    pending: AtomicUsize,
    accepting: tokio::task::JoinHandle<()>,
    /// The lambda's namespace, held while the pod runs in it (idle, it may outlive the
    /// lambda's sandboxes, which hold it too).
    _network: Option<Arc<LambdaNetwork>>,
    /// Its own output (the Zygote's, and gVisor's), kept while it runs.
    _output: OutputPipe,
    next_fifo: AtomicU64,
}

#[derive(Deserialize)]
struct Forked {
    #[serde(default)]
    pids: Vec<i32>,
    #[serde(default)]
    error: Option<String>,
}

impl Pod {
    /// Start a pod for `spec`'s lambda: write its bundle, run it, wait for the Zygote's hello,
    /// have it import the lambda's packages, and ask for the first spares.
    pub async fn start(
        id: u64,
        runsc: &Runsc,
        settings: &PodSettings,
        stage: &Stage,
        spec: &SandboxSpec,
        sink: Arc<dyn OutputSink>,
    ) -> Result<Pod, CreateError> {
        let container = format!("sprout-pod-{id}");
        let bundle = stage.run.join("gvisor").join(id.to_string());
        let scratch = bundle.join("scratch");
        make_scratch(&scratch, settings.cfg.uid, settings.cfg.gid).at("making the pod's scratch directory", &scratch)?;
        let endpoint = Endpoint::listen_in(&scratch)?;
        let cgroup = format!("{}/pod-{id}", settings.cfg.cgroup_parent);
        let network = spec.network.clone().filter(|n| n.fd() >= 0);
        let config = runtime_spec(settings, stage, spec, &scratch, &cgroup, network.as_deref());
        let body = serde_json::to_vec(&config).doing("encoding the runtime spec")?;
        tokio::fs::write(bundle.join("config.json"), body).await.at("writing", &bundle.join("config.json"))?;
        let (output, log) = OutputPipe::new(id, sink).doing("making the pod's log pipe")?;
        if let Some(network) = &network {
            // A pod before this one in the lambda's namespace took its address away.
            network.configure_again().doing("configuring the lambda's network namespace")?;
        }
        runsc.run(&container, &bundle, network.is_some(), log).await?;
        let timeout = settings.cfg.start_timeout;
        let (mut control, _) = endpoint.accept_next(timeout, settings.cfg.max_response).await?;
        let hello = recv_hello(&mut control, timeout, "start").await?;
        if hello.role.as_deref() != Some("pod") {
            return Err(PlatformError::Engine {
                engine: "gvisor",
                doing: "start the pod".into(),
                message: format!("a hello as {:?}", hello.role),
            }
            .into());
        }
        let imports: Vec<String> = spec.packages.iter().flat_map(|p| p.modules.iter().cloned()).collect();
        let order = ZygoteOrder { op: "zygote", paths: &spec.paths, imports: &imports };
        control.send(&order, &[]).await.doing("sending the pod's Zygote its packages")?;
        let imported = recv_hello(&mut control, timeout, "import the lambda's packages").await?;
        if let Some(failed) = imported.failed.filter(|f| !f.is_empty()) {
            tracing::info!(lambda = %spec.lambda, ?failed, "a pod's Zygote could not import every package ahead");
        }
        let (sender, receiver) = mpsc::channel(64);
        let accepting = tokio::spawn(accept_spares(endpoint, sender, settings.cfg.max_response));
        let pod = Pod {
            id,
            container,
            bundle,
            scratch,
            cgroup,
            control: Mutex::new(control),
            spares: Mutex::new(receiver),
            pending: AtomicUsize::new(0),
            accepting,
            _network: network,
            _output: output,
            next_fifo: AtomicU64::new(1),
        };
        pod.fork_spares(settings, settings.cfg.spares.max(1)).await?;
        Ok(pod)
    }

    /// Ask the Zygote for `count` more spares.
    pub async fn fork_spares(&self, settings: &PodSettings, count: usize) -> Result<(), PlatformError> {
        // Counted before asking: a spare can connect, and be taken, before the reply comes.
        self.pending.fetch_add(count, Ordering::Relaxed);
        let order = json!({"op": "spares", "count": count, "uid": settings.cfg.uid, "gid": settings.cfg.gid, "seccomp": settings.seccomp});
        let forked = match self.control(order).await {
            Ok(reply) => serde_json::from_value::<Forked>(reply).doing("reading the pod's fork reply"),
            Err(e) => Err(e),
        };
        let made = forked.as_ref().map(|f| f.pids.len()).unwrap_or(0);
        self.uncount(count.saturating_sub(made));
        match forked {
            Ok(Forked { error: Some(error), .. }) => {
                Err(PlatformError::Engine { engine: "gvisor", doing: "fork spares".into(), message: error })
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `n` fewer spares on their way (never below none).
    fn uncount(&self, n: usize) {
        let _ = self.pending.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| Some(p.saturating_sub(n)));
    }

    /// The next spare to connect, within `timeout`; a replacement is asked for by the caller.
    pub async fn take_spare(&self, timeout: Duration) -> Result<Spare, PlatformError> {
        let mut spares = self.spares.lock().await;
        match tokio::time::timeout(timeout, spares.recv()).await {
            Ok(Some(spare)) => {
                self.uncount(1);
                Ok(spare)
            }
            Ok(None) => Err(PlatformError::Engine { engine: "gvisor", doing: "take a spare".into(), message: "the pod stopped".into() }),
            Err(_) => Err(PlatformError::timed_out("a pod's spare", "connect", timeout)),
        }
    }

    /// Spares asked for and not yet bound.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// How the handler `pid` ended: an exit code, a negated signal, or None while it runs.
    pub async fn status(&self, pid: i32) -> Option<i32> {
        let reply = self.control(json!({"op": "status", "pids": [pid]})).await.ok()?;
        reply["status"][pid.to_string()].as_i64().map(|s| s as i32)
    }

    /// SIGKILL one handler.
    pub async fn kill(&self, pid: i32) {
        if let Err(e) = self.control(json!({"op": "kill", "pid": pid})).await {
            tracing::debug!(pod = self.id, pid, "killing a pod's handler: {e}");
        }
    }

    /// A new FIFO for a handler's output: its path on the host and inside the pod.
    pub fn output_fifo(&self) -> (PathBuf, String) {
        let n = self.next_fifo.fetch_add(1, Ordering::Relaxed);
        let name = format!("out-{n}.fifo");
        (self.scratch.join(&name), format!("/host/{name}"))
    }

    /// One control frame and its reply.
    async fn control(&self, order: Value) -> Result<Value, PlatformError> {
        let mut control = self.control.lock().await;
        let exchange = async {
            control.send(&order, &[]).await?;
            control.recv::<Value>().await.map(|(reply, _)| reply)
        };
        match tokio::time::timeout(Duration::from_secs(10), exchange).await {
            Ok(reply) => reply.doing("talking to the pod's Zygote"),
            Err(_) => Err(PlatformError::timed_out("the pod's Zygote", "answer", Duration::from_secs(10))),
        }
    }

    /// Stop the pod: its container, bundle and cgroup go (its lambda's namespace gets its
    /// address back when the next pod starts in it).
    pub async fn stop(&self, runsc: &Runsc) {
        self.accepting.abort();
        runsc.delete(&self.container).await;
        remove_dir(&self.bundle).await;
    }
}

/// Accept the pod's spares as they connect; each says which process it is first.
async fn accept_spares(endpoint: Endpoint, spares: mpsc::Sender<Spare>, max_body: u32) {
    loop {
        let (mut channel, _) = match endpoint.accept_next(Duration::from_secs(24 * 3600), max_body).await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin; the pod's takers time out.
                tracing::warn!("accepting a pod's spare: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let said = tokio::time::timeout(Duration::from_secs(10), channel.recv::<Value>()).await;
        let Ok(Ok((hello, _))) = said else { continue };
        if hello["op"] != "spare" {
            tracing::warn!("a pod's helper connected saying {hello}, not as a spare");
            continue;
        }
        let pid = hello["pid"].as_i64().unwrap_or(0) as i32;
        if spares.send(Spare { channel, pid }).await.is_err() {
            return;
        }
    }
}

async fn recv_hello(channel: &mut Channel, timeout: Duration, doing: &str) -> Result<Hello, PlatformError> {
    match tokio::time::timeout(timeout, channel.recv::<Hello>()).await {
        Ok(Ok((hello, _))) => Ok(hello),
        Ok(Err(e)) => Err(e).doing(format!("the pod's Zygote died while it was to {doing}")),
        Err(_) => Err(PlatformError::timed_out("the pod's Zygote", doing.to_string(), timeout)),
    }
}

/// The OCI runtime spec of a pod: the base read-only with the lambda's code at /handler and
/// the pod's scratch at /host; the lambda's network namespace joined when it has one; its
/// first process the Zygote, as gVisor's root with only the capabilities it needs to drop
/// its spares to the handlers' user and kill them.
fn runtime_spec(
    settings: &PodSettings,
    stage: &Stage,
    spec: &SandboxSpec,
    scratch: &Path,
    cgroup: &str,
    network: Option<&LambdaNetwork>,
) -> Value {
    let bind = |dst: &str, src: &Path, mode: &str| json!({"destination": dst, "type": "bind", "source": src, "options": ["rbind", mode]});
    let caps = ["CAP_SETUID", "CAP_SETGID", "CAP_KILL"];
    let mut namespaces: Vec<Value> = ["pid", "ipc", "uts", "mount"].iter().map(|t| json!({"type": t})).collect();
    namespaces.push(match network {
        Some(n) => json!({"type": "network", "path": format!("/proc/{}/fd/{}", std::process::id(), n.fd())}),
        None => json!({"type": "network"}),
    });
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
        bind("/handler", &stage.code_view(&spec.code_dir), "ro"),
        bind("/host", scratch, "rw"),
    ];
    // Volumes are bound below the base on the host, but gVisor sees the root as one read-only
    // mount: each is a mount of its own here, writable as configured.
    mounts.extend(stage.volumes.iter().map(|v| bind(&v.path, &v.host, if v.writable { "rw" } else { "ro" })));
    json!({
        "ociVersion": "1.0.2",
        "root": {"path": stage.base, "readonly": true},
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": [settings.cfg.python, "-I", "-S", HELPER_IN_SANDBOX, "pod"],
            "env": sandbox_env_strings(&spec.env),
            "cwd": "/",
            "noNewPrivileges": true,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps, "inheritable": [], "ambient": []},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}],
        },
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": format!("/{cgroup}"),
            "resources": {
                "memory": {"limit": settings.cfg.pod_memory_bytes},
                "pids": {"limit": spec.limits.pids.max(64) * 8},
                "cpu": {"cpus": settings.cfg.cpuset},
            },
        },
    })
}
