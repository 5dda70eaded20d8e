//! How a cgroup's processes share a contended CPU with its siblings': a group's weight and
//! whether it idles ([`CpuControl`]).

use std::io;
use std::path::{Path, PathBuf};

use super::files::write_file;

/// How a cgroup's processes share a contended CPU with its siblings': its weight, and
/// whether it idles (`cpu.idle`: the group runs as SCHED_IDLE does, on time no sibling
/// wants, and a sibling waking takes the CPU from it at once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuControl {
    dir: PathBuf,
    v1: bool,
}

impl CpuControl {
    /// The group at `dir` (its directory in the cpu hierarchy), on v1 or not.
    pub fn at(dir: &Path, v1: bool) -> CpuControl {
        CpuControl { dir: dir.to_path_buf(), v1 }
    }

    /// Set the weight, on v2's scale (1 to 10000, 100 by default); v1's `cpu.shares` are
    /// 10.24 times it (1024 by default).
    pub fn set_weight(&self, weight: u64) -> io::Result<()> {
        if self.v1 {
            write_file(&self.dir.join("cpu.shares"), &(weight * 1024 / 100).clamp(2, 262_144).to_string())
        } else {
            write_file(&self.dir.join("cpu.weight"), &weight.clamp(1, 10_000).to_string())
        }
    }

    /// Idle the group, or not; false when this kernel has no `cpu.idle` (before 5.15).
    pub fn set_idle(&self, idle: bool) -> io::Result<bool> {
        match write_file(&self.dir.join("cpu.idle"), if idle { "1" } else { "0" }) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Run the group only on CPU time no sibling wants (`idle`), or as usual again: `cpu.idle`,
    /// or where the kernel lacks it the least weight (v1's 2 shares, v2's 1) and back to the
    /// default.
    pub fn set_idle_or_least_weight(&self, idle: bool) -> io::Result<()> {
        if self.set_idle(idle)? {
            return Ok(());
        }
        match (self.v1, idle) {
            (true, true) => write_file(&self.dir.join("cpu.shares"), "2"),
            (false, true) => write_file(&self.dir.join("cpu.weight"), "1"),
            (_, false) => self.set_weight(100),
        }
    }
}
