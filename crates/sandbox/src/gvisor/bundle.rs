//! A pod's bundle on the host: its directory under the stage's run directory, its scratch
//! (mounted at /host, where the worker listens for the pod's helpers) and the OCI runtime
//! spec runsc reads; the same for a pod started afresh, a template and a restored pod.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::settings::PodSettings;
use crate::channel::Endpoint;
use crate::error::{Doing, PlatformError};
use crate::scratch::make_scratch;
use crate::spec::{sandbox_env_strings, SandboxSpec};
use crate::stage::{Stage, HELPER_IN_SANDBOX};

/// What a pod's runtime spec differs by.
pub(crate) struct Contents<'a> {
    /// Mounted read-only at /handler (a template's: an empty directory of its bundle).
    pub handler: Option<&'a Path>,
    /// The Zygote's environment beyond the sandboxes' defaults (a template's and a restored
    /// pod's: none; a lambda's variables reach its handlers with the init frame anyway).
    pub env: &'a [(String, String)],
    /// The network namespace the pod joins (a descriptor of the worker's); None: one of its own.
    pub network: Option<RawFd>,
    /// Processes the pod may hold.
    pub pids: u64,
}

/// The processes a pod of `spec`'s lambda may hold.
pub(crate) fn pods_pids(spec: &SandboxSpec) -> u64 {
    spec.limits.pids.max(64) * 8
}

/// A pod's bundle, written, with the worker listening in its scratch.
pub(crate) struct Bundle {
    pub container: String,
    pub dir: PathBuf,
    pub scratch: PathBuf,
    pub cgroup: String,
    pub endpoint: Endpoint,
}

impl Bundle {
    /// Write the bundle of the container `name` under `run/gvisor/`.
    pub async fn write(settings: &PodSettings, stage: &Stage, name: &str, contents: Contents<'_>) -> Result<Bundle, PlatformError> {
        let dir = stage.run.join("gvisor").join(name);
        let scratch = dir.join("scratch");
        make_scratch(&scratch, settings.cfg.uid, settings.cfg.gid).at("making the pod's scratch directory", &scratch)?;
        let empty = dir.join("handler");
        let handler = match contents.handler {
            Some(code) => code.to_path_buf(),
            None => {
                tokio::fs::create_dir(&empty).await.at("making", &empty)?;
                empty
            }
        };
        let endpoint = Endpoint::listen_in(&scratch)?;
        let cgroup = format!("{}/{name}", settings.cfg.cgroup_parent);
        let config = runtime_spec(settings, stage, &handler, &scratch, &cgroup, &contents);
        let body = serde_json::to_vec(&config).doing("encoding the runtime spec")?;
        tokio::fs::write(dir.join("config.json"), body).await.at("writing", &dir.join("config.json"))?;
        Ok(Bundle { container: container(name), dir, scratch, cgroup, endpoint })
    }
}

/// The runsc container of the bundle `name`. runsc takes an ID for any container whose ID it
/// begins (`sprout-pod-1` is ambiguous beside `sprout-pod-10`: deleting it fails), so each
/// ends in `.gv`, which no other begins with.
pub(crate) fn container(name: &str) -> String {
    format!("sprout-{name}.gv")
}

/// The OCI runtime spec of a pod: the base read-only with `handler` at /handler and the
/// pod's scratch at /host; the lambda's network namespace joined when it has one; its first
/// process the Zygote, as gVisor's root with only the capabilities it needs to drop its
/// spares to the handlers' user and kill them.
fn runtime_spec(settings: &PodSettings, stage: &Stage, handler: &Path, scratch: &Path, cgroup: &str, contents: &Contents) -> Value {
    let bind = |dst: &str, src: &Path, mode: &str| json!({"destination": dst, "type": "bind", "source": src, "options": ["rbind", mode]});
    let caps = ["CAP_SETUID", "CAP_SETGID", "CAP_KILL"];
    let mut namespaces: Vec<Value> = ["pid", "ipc", "uts", "mount"].iter().map(|t| json!({"type": t})).collect();
    namespaces.push(match contents.network {
        Some(fd) => json!({"type": "network", "path": format!("/proc/{}/fd/{fd}", std::process::id())}),
        None => json!({"type": "network"}),
    });
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
        bind("/handler", handler, "ro"),
        bind("/host", scratch, "rw"),
    ];
    // Volumes are bound below the base on the host, but gVisor sees the root as one read-only
    // mount: each is a mount of its own here, writable as configured (the same in a template
    // and in the pods restored from it).
    mounts.extend(stage.volumes.iter().map(|v| bind(&v.path, &v.host, if v.writable { "rw" } else { "ro" })));
    json!({
        "ociVersion": "1.0.2",
        "root": {"path": stage.base, "readonly": true},
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": [settings.cfg.python, "-I", "-S", HELPER_IN_SANDBOX, "pod"],
            "env": sandbox_env_strings(contents.env),
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
                "pids": {"limit": contents.pids},
                "cpu": {"cpus": settings.cfg.cpuset},
            },
        },
    })
}
