//! Resource limits: a sandbox's ([`Limits`], which
//! [`Cgroup::set_limits`](super::Cgroup::set_limits) writes to its group) and a parent
//! group's memory limit ([`Layout::set_memory_limit`]).

use std::io;

use serde::{Deserialize, Serialize};

use super::files::write_file;
use super::layout::Layout;

/// Resource limits of one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u64,
    /// CPU bandwidth in cores (1.5 = one and a half cores); 0 means unlimited.
    pub cpus: f64,
}

impl Layout {
    /// Limit the memory of group `name` and everything below it (a parent group): the
    /// kernel reclaims, then kills within the group, at `bytes`.
    pub fn set_memory_limit(&self, name: &str, bytes: u64) -> io::Result<()> {
        let dir = self.memory_dir_of(name).ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "no memory controller"))?;
        match self {
            Layout::V1 { .. } => write_file(&dir.join("memory.limit_in_bytes"), &bytes.to_string()),
            Layout::V2 { .. } => write_file(&dir.join("memory.max"), &bytes.to_string()),
        }
    }
}
