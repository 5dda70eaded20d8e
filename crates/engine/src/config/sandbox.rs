//! `[sandbox]`: how sandboxes are made (the default back-end, user, mounts, scratch space,
//! Zygote limits, spares, seccomp), and the back-ends a worker can run ([`BackendKind`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::volumes::VolumeSection;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum BackendKind {
    #[default]
    #[serde(rename = "sock")]
    Sock,
    #[serde(rename = "sock-nozygote")]
    SockNoZygote,
    #[serde(rename = "runc")]
    Runc,
    #[serde(rename = "docker")]
    Docker,
    #[serde(rename = "vm")]
    Vm,
    #[serde(rename = "gvisor")]
    Gvisor,
}

impl BackendKind {
    pub const ALL: [BackendKind; 6] =
        [BackendKind::Sock, BackendKind::SockNoZygote, BackendKind::Runc, BackendKind::Docker, BackendKind::Vm, BackendKind::Gvisor];

    /// The back-end of this configuration name, if there is one.
    pub fn from_name(name: &str) -> Option<BackendKind> {
        BackendKind::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Sock => "sock",
            BackendKind::SockNoZygote => "sock-nozygote",
            BackendKind::Runc => "runc",
            BackendKind::Docker => "docker",
            BackendKind::Vm => "vm",
            BackendKind::Gvisor => "gvisor",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSection {
    pub backend: BackendKind,
    pub uid: u32,
    pub gid: u32,
    pub mount_proc: bool,
    pub scratch_mb: u64,
    pub python: String,
    pub start_timeout_ms: u64,
    pub cgroup_pool: usize,
    pub zygote_memory_mb: u64,
    /// Most spares (children forked ahead of demand, not yet bound to a lambda) per Zygote.
    pub spares: usize,
    pub cpuset: String,
    pub volumes: Vec<VolumeSection>,
    pub seccomp: bool,
}

impl Default for SandboxSection {
    fn default() -> Self {
        SandboxSection {
            backend: BackendKind::Sock,
            uid: 65534,
            gid: 65534,
            mount_proc: true,
            scratch_mb: 64,
            python: "/usr/bin/python3".into(),
            start_timeout_ms: 10_000,
            cgroup_pool: 16,
            zygote_memory_mb: 512,
            spares: 4,
            cpuset: String::new(),
            volumes: Vec::new(),
            seccomp: true,
        }
    }
}

impl SandboxSection {
    /// How long a new sandbox may take to start.
    pub fn start_timeout(&self) -> Duration {
        Duration::from_millis(self.start_timeout_ms)
    }

    /// The CPUs the sandboxes may use (`cpuset`), when limited.
    pub fn cpuset(&self) -> Option<String> {
        (!self.cpuset.is_empty()).then(|| self.cpuset.clone())
    }
}
