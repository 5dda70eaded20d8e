//! How a cgroup's processes share a contended CPU with its siblings': a group's weight and
//! whether it idles ([`CpuControl`]), and the CPU time it has used.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::files::{read_again, write_file};

/// A cgroup's CPU weight until one is written, on v2's scale (v1's 1024 shares).
pub const DEFAULT_WEIGHT: u64 = 100;

/// How a cgroup's processes share a contended CPU with its siblings': its weight, and
/// whether it idles (`cpu.idle`: the group runs as SCHED_IDLE does, on time no sibling
/// wants, and a sibling waking takes the CPU from it at once). Clones share one handle, and
/// the file its CPU time is read from stays open in it (read at each request's start).
#[derive(Debug, Clone)]
pub struct CpuControl {
    group: Arc<Group>,
}

#[derive(Debug)]
struct Group {
    dir: PathBuf,
    v1: bool,
    /// Where the group's CPU time is read (v1: `cpuacct.usage` in the cpuacct hierarchy,
    /// which may be another than the cpu one; v2: `cpu.stat`), if it is.
    usage: Option<PathBuf>,
    /// That file, opened on the first read.
    usage_file: OnceLock<Option<File>>,
}

impl PartialEq for CpuControl {
    fn eq(&self, other: &CpuControl) -> bool {
        let (a, b) = (&self.group, &other.group);
        a.dir == b.dir && a.v1 == b.v1 && a.usage == b.usage
    }
}

impl Eq for CpuControl {}

impl CpuControl {
    /// The group at `dir` (its directory in the cpu hierarchy), on v1 or not.
    pub fn at(dir: &Path, v1: bool) -> CpuControl {
        let usage = (!v1).then(|| dir.join("cpu.stat"));
        CpuControl::new(dir.to_path_buf(), v1, usage)
    }

    fn new(dir: PathBuf, v1: bool, usage: Option<PathBuf>) -> CpuControl {
        CpuControl { group: Arc::new(Group { dir, v1, usage, usage_file: OnceLock::new() }) }
    }

    /// The same, with its CPU time read from v1's `cpuacct.usage` in `cpuacct_dir`.
    pub fn with_cpuacct(self, cpuacct_dir: Option<PathBuf>) -> CpuControl {
        match self.group.v1 {
            true => CpuControl::new(self.group.dir.clone(), true, cpuacct_dir.map(|d| d.join("cpuacct.usage"))),
            false => self,
        }
    }

    /// CPU time the group and everything below it have used; None where it cannot be read.
    /// Read through the file kept open (one system call), or by its path if that fails.
    pub fn used(&self) -> Option<Duration> {
        let group = &*self.group;
        let path = group.usage.as_deref()?;
        let kept = group.usage_file.get_or_init(|| File::open(path).ok());
        let mut buf = [0u8; 1024];
        match kept.as_ref().and_then(|file| read_again(file, &mut buf)) {
            Some(text) => parse_usage(text, group.v1),
            None => read_usage(path, group.v1),
        }
    }

    /// Set the weight, on v2's scale (1 to 10000, 100 by default); v1's `cpu.shares` are
    /// 10.24 times it (1024 by default).
    pub fn set_weight(&self, weight: u64) -> io::Result<()> {
        if self.group.v1 {
            write_file(&self.group.dir.join("cpu.shares"), &(weight * 1024 / 100).clamp(2, 262_144).to_string())
        } else {
            write_file(&self.group.dir.join("cpu.weight"), &weight.clamp(1, 10_000).to_string())
        }
    }

    /// Idle the group, or not; false when this kernel has no `cpu.idle` (before 5.15).
    pub fn set_idle(&self, idle: bool) -> io::Result<bool> {
        match write_file(&self.group.dir.join("cpu.idle"), if idle { "1" } else { "0" }) {
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
        match (self.group.v1, idle) {
            (true, true) => write_file(&self.group.dir.join("cpu.shares"), "2"),
            (false, true) => write_file(&self.group.dir.join("cpu.weight"), "1"),
            (_, false) => self.set_weight(DEFAULT_WEIGHT),
        }
    }
}

/// CPU time from a v1 `cpuacct.usage` (nanoseconds) or a v2 `cpu.stat` (`usage_usec`).
pub(super) fn read_usage(path: &Path, v1: bool) -> Option<Duration> {
    parse_usage(&std::fs::read_to_string(path).ok()?, v1)
}

fn parse_usage(text: &str, v1: bool) -> Option<Duration> {
    if v1 {
        return text.trim().parse().ok().map(Duration::from_nanos);
    }
    let usec = text.lines().find_map(|l| l.strip_prefix("usage_usec "))?;
    usec.trim().parse().ok().map(Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_again_through_the_file_kept_open_by_every_clone() {
        let dir = tempfile::tempdir().unwrap();
        let stat = dir.path().join("cpu.stat");
        std::fs::write(&stat, "usage_usec 1500\nuser_usec 1000\n").unwrap();
        let cpu = CpuControl::at(dir.path(), false);
        let clone = cpu.clone();
        assert_eq!(cpu.used(), Some(Duration::from_micros(1500)));
        std::fs::write(&stat, "usage_usec 2500\n").unwrap(); // the same file, as a cgroup's is
        assert_eq!(clone.used(), Some(Duration::from_micros(2500)));
        assert_eq!(cpu, clone);

        let v1 = CpuControl::at(dir.path(), true);
        assert_eq!(v1.used(), None, "v1 without cpuacct: unreadable");
        std::fs::write(dir.path().join("cpuacct.usage"), "7000000\n").unwrap();
        let v1 = v1.with_cpuacct(Some(dir.path().to_path_buf()));
        assert_eq!(v1.used(), Some(Duration::from_millis(7)));
        assert_ne!(v1, cpu);
    }
}
