//! How a cgroup's processes share a contended CPU with its siblings': a group's weight and
//! whether it idles ([`CpuControl`]), and the CPU time it has used.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::files::write_file;

/// A cgroup's CPU weight until one is written, on v2's scale (v1's 1024 shares).
pub const DEFAULT_WEIGHT: u64 = 100;

/// How a cgroup's processes share a contended CPU with its siblings': its weight, and
/// whether it idles (`cpu.idle`: the group runs as SCHED_IDLE does, on time no sibling
/// wants, and a sibling waking takes the CPU from it at once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuControl {
    dir: PathBuf,
    v1: bool,
    /// Where the group's CPU time is read (v1: `cpuacct.usage` in the cpuacct hierarchy,
    /// which may be another than the cpu one; v2: `cpu.stat`), if it is.
    usage: Option<PathBuf>,
}

impl CpuControl {
    /// The group at `dir` (its directory in the cpu hierarchy), on v1 or not.
    pub fn at(dir: &Path, v1: bool) -> CpuControl {
        let usage = (!v1).then(|| dir.join("cpu.stat"));
        CpuControl { dir: dir.to_path_buf(), v1, usage }
    }

    /// The same, with its CPU time read from v1's `cpuacct.usage` in `cpuacct_dir`.
    pub fn with_cpuacct(self, cpuacct_dir: Option<PathBuf>) -> CpuControl {
        match self.v1 {
            true => CpuControl { usage: cpuacct_dir.map(|d| d.join("cpuacct.usage")), ..self },
            false => self,
        }
    }

    /// CPU time the group and everything below it have used; None where it cannot be read.
    pub fn used(&self) -> Option<Duration> {
        read_usage(self.usage.as_deref()?, self.v1)
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
            (_, false) => self.set_weight(DEFAULT_WEIGHT),
        }
    }
}

/// CPU time from a v1 `cpuacct.usage` (nanoseconds) or a v2 `cpu.stat` (`usage_usec`).
pub(super) fn read_usage(path: &Path, v1: bool) -> Option<Duration> {
    let text = std::fs::read_to_string(path).ok()?;
    if v1 {
        return text.trim().parse().ok().map(Duration::from_nanos);
    }
    let usec = text.lines().find_map(|l| l.strip_prefix("usage_usec "))?;
    usec.trim().parse().ok().map(Duration::from_micros)
}
