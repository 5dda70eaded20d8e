//! The back-ends' own sections: `[cgroups]`, `[base]` (the image sandboxes are stitched from),
//! `[runc]`, `[gvisor]`, `[docker]` and `[vm]`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CgroupsSection {
    pub version: sprout_sandbox::cgroup::Version,
    pub v2_root: String,
    pub favor_dynmods: bool,
}

impl Default for CgroupsSection {
    fn default() -> Self {
        CgroupsSection { version: sprout_sandbox::cgroup::Version::Auto, v2_root: String::new(), favor_dynmods: true }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BaseSection {
    pub path: PathBuf,
    pub suite: String,
    pub mirror: String,
}

impl Default for BaseSection {
    fn default() -> Self {
        BaseSection {
            path: PathBuf::from(sprout_sandbox::base::DEFAULT_PATH),
            suite: sprout_sandbox::base::DEFAULT_SUITE.into(),
            mirror: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuncSection {
    pub binary: String,
}

impl Default for RuncSection {
    fn default() -> Self {
        RuncSection { binary: "runc".into() }
    }
}

/// The gvisor back-end: one gVisor sandbox (a pod) per lambda.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GvisorSection {
    /// runsc; empty: where scripts/gvisor.sh builds the pinned version.
    pub runsc: String,
    /// Spares each pod keeps forked ahead while its lambda has cold starts.
    pub spares: usize,
    /// A pod with no cold start for this long lets its spares go (a spare holds a handler's
    /// pages, several MiB inside gVisor); the next cold start forks one on its path.
    pub spares_idle_ms: u64,
    /// Host memory limit of one pod: gVisor's kernel and all its lambda's handlers.
    pub pod_memory_mb: u64,
    /// How long a pod without sandboxes stays up (then it stops: scale to zero).
    pub pod_idle_ms: u64,
    /// Park a pod to disk (`runsc checkpoint`, its handlers' state in the image) once every
    /// sandbox of it has been paused this long; its next request restores it. 0: never (its
    /// sandboxes are then not paused).
    pub park_after_ms: u64,
    /// Disk the parked pods' images may take, MiB; past it the oldest are removed (their
    /// lambdas' next requests start afresh).
    pub park_disk_mb: u64,
    /// Memory the running pods may hold together, MiB: before a pod starts or is restored,
    /// idle pods are parked at once (least recently used first) until it fits. 0: no budget.
    pub resident_mb: u64,
    /// Restores return once gVisor's kernel is loaded, the memory following in the
    /// background (runsc `restore --background`).
    pub background_restore: bool,
    /// Lambdas' first pods restored from a checkpoint of their package set's template.
    pub templates: bool,
    /// Containers kept created ahead per template.
    pub created_ahead: usize,
    /// Whose network stack a pod's sockets use inside its lambda's namespace.
    pub network: GvisorNetwork,
}

/// Whose network stack a gVisor pod's sockets use, inside its lambda's namespace either way
/// (the allow-list, on the host's side of its link, holds for both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GvisorNetwork {
    /// gVisor's own network stack (netstack), in the Sentry: the host kernel sees packets only.
    Sandbox,
    /// The host kernel's, the Sentry making its sockets (runsc `--network=host`): no netstack
    /// on each query's path, and socket calls in the Sentry's allowed host calls.
    Host,
}

impl Default for GvisorSection {
    fn default() -> Self {
        GvisorSection {
            runsc: String::new(),
            spares: 2,
            spares_idle_ms: 2000,
            pod_memory_mb: 1024,
            pod_idle_ms: 60_000,
            park_after_ms: 10_000,
            park_disk_mb: 4096,
            resident_mb: 0,
            background_restore: false,
            templates: true,
            created_ahead: 1,
            network: GvisorNetwork::Sandbox,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DockerSection {
    pub socket: PathBuf,
    pub image: String,
}

impl Default for DockerSection {
    fn default() -> Self {
        DockerSection { socket: PathBuf::from("/var/run/docker.sock"), image: "sprout-base:bookworm".into() }
    }
}

/// The `vm` back-end's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VmSection {
    /// Where the guest kernel and root disks are built and kept, shared by all workers.
    pub dir: PathBuf,
    /// The VMM program; empty: `sprout-vmm` beside the `sprout` binary.
    pub vmm: String,
}

impl Default for VmSection {
    fn default() -> Self {
        VmSection { dir: PathBuf::from("/var/lib/sprout/vm"), vmm: String::new() }
    }
}
