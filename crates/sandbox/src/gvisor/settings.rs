//! The gvisor back-end's settings ([`GvisorConfig`], from the worker's configuration) and
//! what every pod of a worker is made with ([`PodSettings`]).

use std::path::PathBuf;
use std::time::Duration;

/// Settings of the gvisor back-end.
#[derive(Debug, Clone)]
pub struct GvisorConfig {
    /// The runsc program (`scripts/gvisor.sh` builds it; [`super::runsc::default_binary`]).
    pub runsc: PathBuf,
    /// The user handlers run as (inside gVisor).
    pub uid: u32,
    pub gid: u32,
    /// The interpreter inside the base.
    pub python: String,
    pub start_timeout: Duration,
    /// Largest response body a handler may send, in bytes.
    pub max_response: u32,
    /// The cgroup (relative to the hierarchy roots) under which each pod's is made.
    pub cgroup_parent: String,
    /// Pin pods to these CPUs (cpuset syntax).
    pub cpuset: Option<String>,
    /// Spares each pod keeps forked ahead while its lambda has cold starts.
    pub spares: usize,
    /// A pod with no cold start for this long lets its spares go.
    pub spares_idle: Duration,
    /// Host memory limit of one pod (gVisor's kernel and all the lambda's handlers).
    pub pod_memory_bytes: u64,
    /// How long a pod without sandboxes stays up.
    pub pod_idle: Duration,
    /// Park a pod to disk once all its sandboxes have been paused this long (None: never).
    pub park_after: Option<Duration>,
    /// Disk the parked pods' images may take, bytes (past it, the oldest are evicted).
    pub park_disk_bytes: u64,
    /// Memory the running pods may hold together, bytes: idle ones are parked early to make
    /// room for another (None: no such budget).
    pub resident_bytes: Option<u64>,
    /// Restores return once gVisor's kernel state is loaded, memory following (runsc
    /// `restore --background`).
    pub background_restore: bool,
    /// Start lambdas' first pods from templates (checkpoints per package set); false: each
    /// pod afresh.
    pub templates: bool,
    /// Containers kept created ahead per template (0: created on the request's path).
    pub created_ahead: usize,
    /// Filter handlers' system calls with the lean sandboxes' filter (inside gVisor).
    pub seccomp: bool,
    /// Pods' sockets are the host kernel's, inside the lambda's namespace (runsc
    /// `--network=host`): no gVisor network stack on the way, more host calls for the Sentry.
    pub host_network: bool,
}

/// What every pod of a worker is made with: the back-end's settings, and the lean sandboxes'
/// seccomp filter (hex of its instructions), which each handler installs so that gVisor's
/// kernel refuses what the host's would.
pub(crate) struct PodSettings {
    pub cfg: GvisorConfig,
    pub seccomp: Option<String>,
}
