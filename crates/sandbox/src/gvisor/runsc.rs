//! gVisor's `runsc` as the gvisor back-end runs it: always the systrap platform (no hardware
//! virtualization needed), helpers allowed to open the host sockets and FIFOs in their
//! scratch directory (the only ones a pod's mounts hold), each pod's network gVisor's own
//! stack over the lambda's namespace, the host kernel's stack inside that namespace
//! (`[gvisor] network = "host"`), or none; and its complaints read back from its log.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;
use tokio::process::Command;

use crate::error::PlatformError;

/// The runsc build `scripts/gvisor.sh` makes, pinned with the worker.
pub const VERSION: &str = include_str!("runsc.version");

/// Where `scripts/gvisor.sh` puts runsc on this machine.
pub fn default_binary() -> PathBuf {
    PathBuf::from(format!("/var/lib/sprout/gvisor/{}/runsc", VERSION.trim()))
}

/// One worker's runsc: its binary and the state directory of its pods.
pub struct Runsc {
    pub binary: PathBuf,
    pub root: PathBuf,
    /// A networked pod's sockets are the host kernel's, made by the Sentry inside the pod's
    /// namespace (runsc's `--network=host`), not gVisor's network stack's.
    pub host_network: bool,
    /// Restores return once gVisor's kernel state is loaded, the memory's pages following
    /// in the background (runsc `restore --background`).
    pub background_restore: bool,
    /// On cgroup v1, the worker's own cpuset group (its `cgroup.procs`) and the hierarchy's
    /// mount point, when the worker runs in one other than the root and no `cpuset` is
    /// configured: each pod's processes are moved into it ([`Runsc::join_worker_cpuset`]).
    pub worker_cpuset: Option<(PathBuf, PathBuf)>,
}

impl Runsc {
    /// `runsc <global flags>`; `networked`: the pod's namespace's network, through gVisor's
    /// network stack or the host's ([`Runsc::host_network`]), else none but loopback; runsc's
    /// own log in `log` when given.
    pub fn command(&self, networked: bool, log: Option<&Path>) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--root").arg(&self.root).args(["--platform", "systrap", "--host-uds", "open", "--host-fifo", "open"]);
        let network = match (networked, self.host_network) {
            (false, _) => "none",
            (true, false) => "sandbox",
            (true, true) => "host",
        };
        cmd.args(["--network", network]);
        if let Some(log) = log {
            cmd.arg("--log").arg(log).args(["--log-format", "json"]);
        }
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        cmd
    }

    /// Move the processes of the pod whose cgroup is `cgroup` into the worker's cpuset group
    /// (runc's containers are, too: `crate::runc`): runsc makes each pod's cpuset group at
    /// the hierarchy's root, so a worker confined to a deployment's group would see its pods
    /// leave it, their CPUs and their memory out of the deployment's sight. What the pod
    /// starts later (gVisor's stubs) follows its Sentry.
    pub fn join_worker_cpuset(&self, cgroup: &str) {
        let Some((procs, mount)) = &self.worker_cpuset else { return };
        let from = mount.join(cgroup).join("cgroup.procs");
        let pids = std::fs::read_to_string(&from).unwrap_or_default();
        for pid in pids.split_whitespace() {
            match std::fs::write(procs, pid) {
                Err(e) if e.raw_os_error() != Some(libc::ESRCH) => {
                    tracing::warn!(cgroup, pid, "moving a pod's process into the worker's cpuset group: {e}");
                }
                _ => {}
            }
        }
    }

    /// What to say when runsc cannot be run at all.
    pub fn spawn_error(&self, error: std::io::Error) -> PlatformError {
        let doing = if error.kind() == std::io::ErrorKind::NotFound {
            "running gVisor's runsc (bash scripts/gvisor.sh builds it)"
        } else {
            "running gVisor's runsc"
        };
        PlatformError::Path { doing: doing.into(), path: self.binary.clone(), error }
    }

    /// `runsc run --detach` the container `name` of `bundle`; its processes' stdout and
    /// stderr are `output`.
    pub async fn run(&self, name: &str, bundle: &Path, networked: bool, output: OwnedFd) -> Result<(), PlatformError> {
        self.launch(&["run", "--detach"], name, bundle, networked, Some(output), "start the pod").await
    }

    /// `runsc create` the container `name` of `bundle`, to be restored into.
    pub async fn create(&self, name: &str, bundle: &Path, networked: bool, output: Option<OwnedFd>) -> Result<(), PlatformError> {
        self.launch(&["create"], name, bundle, networked, output, "create the pod's container").await
    }

    /// `runsc restore --detach` the checkpoint in `image` into the created container `name`;
    /// the restored processes' stdout and stderr become `output`.
    pub async fn restore(&self, name: &str, bundle: &Path, image: &Path, networked: bool, output: OwnedFd) -> Result<(), PlatformError> {
        let image = format!("--image-path={}", image.display());
        let mut args = vec!["restore", "--detach", &image];
        if self.background_restore {
            args.push("--background");
        }
        self.launch(&args, name, bundle, networked, Some(output), "restore the pod from its image").await
    }

    /// `runsc checkpoint` the container `name` into `image` (the container stops), `doing`
    /// what the caller says in an error.
    pub async fn checkpoint(
        &self,
        name: &str,
        bundle: &Path,
        image: &Path,
        networked: bool,
        doing: &'static str,
    ) -> Result<(), PlatformError> {
        let image = format!("--image-path={}", image.display());
        self.launch(&["checkpoint", &image], name, bundle, networked, None, doing).await
    }

    /// `runsc <args> [--bundle bundle] name`, its log in the bundle, its standard output and
    /// error `output` (none: discarded).
    async fn launch(
        &self,
        args: &[&str],
        name: &str,
        bundle: &Path,
        networked: bool,
        output: Option<OwnedFd>,
        doing: &'static str,
    ) -> Result<(), PlatformError> {
        let log = bundle.join("runsc.log");
        let mut cmd = self.command(networked, Some(&log));
        cmd.args(args);
        if args[0] != "checkpoint" {
            cmd.arg("--bundle").arg(bundle);
        }
        cmd.arg(name);
        match output {
            Some(output) => {
                let err = output.try_clone().map_err(|e| PlatformError::Io { doing: "duplicating the log pipe".into(), error: e })?;
                cmd.stdout(Stdio::from(output)).stderr(Stdio::from(err));
            }
            None => {
                cmd.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        let status = cmd.status().await.map_err(|e| self.spawn_error(e))?;
        if status.success() {
            return Ok(());
        }
        Err(PlatformError::Engine { engine: "runsc", doing: doing.into(), message: complaint(&log).unwrap_or(status.to_string()) })
    }

    /// Kill and delete a container, if runsc knows it.
    pub async fn delete(&self, name: &str) {
        let mut delete = self.command(false, None);
        delete.args(["delete", "--force", name]).stdout(Stdio::null());
        if let Ok(out) = delete.output().await {
            let said = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() && !said.contains("does not exist") && !said.contains("not found") {
                tracing::warn!(container = name, "runsc delete: {}", said.trim());
            }
        }
    }

    /// The names of this worker's containers runsc knows.
    pub async fn list(&self) -> Vec<String> {
        let out = self.command(false, None).args(["list", "-quiet"]).stderr(Stdio::null()).output().await;
        out.map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect()).unwrap_or_default()
    }
}

/// runsc's reason for failing, from its JSON log: the fatal lines, else the last warning.
fn complaint(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let messages: Vec<(String, String)> = (text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()))
        .filter_map(|v| Some((v["level"].as_str()?.to_string(), v["msg"].as_str()?.to_string())))
        .collect();
    let fatal: Vec<&str> = messages.iter().filter(|(_, m)| m.contains("FATAL")).map(|(_, m)| m.as_str()).collect();
    if !fatal.is_empty() {
        return Some(fatal.join("; "));
    }
    messages.iter().rev().find(|(level, _)| level == "warning" || level == "error").map(|(_, m)| m.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fatal_line_is_the_complaint() {
        let dir = std::env::temp_dir().join(format!("sprout-runsc-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("runsc.log");
        std::fs::write(
            &log,
            "{\"level\":\"info\",\"msg\":\"starting\"}\n{\"level\":\"warning\",\"msg\":\"FATAL ERROR: error setting up FS: no such file\"}\n\
             {\"level\":\"warning\",\"msg\":\"later\"}\nnot json\n",
        )
        .unwrap();
        assert_eq!(complaint(&log).as_deref(), Some("FATAL ERROR: error setting up FS: no such file"));
        std::fs::write(&log, "{\"level\":\"info\",\"msg\":\"a\"}\n{\"level\":\"warning\",\"msg\":\"b\"}\n").unwrap();
        assert_eq!(complaint(&log).as_deref(), Some("b"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_pinned_version_is_a_go_pseudo_version() {
        let v = VERSION.trim();
        assert!(v.starts_with("v0.0.0-") && v.len() > 30, "{v}");
        assert!(default_binary().ends_with("runsc"));
    }
}
