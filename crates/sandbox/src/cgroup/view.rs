//! What a sandbox's session reads of its cgroup after each request: its processes, its OOM
//! kills and its peak memory ([`CgroupView`], [`PeakMeter`], [`TaskCounter`]), for a group of
//! Sprout's or one an OCI runtime made ([`view_of`]).

use std::fs;
use std::path::{Path, PathBuf};

use super::files::{read_again, read_oom_kills};
use super::layout::Layout;

/// What a sandbox's session reads of its cgroup: its processes, its OOM kills (the count
/// when the sandbox was made, and the file that counts them), and its peak memory.
#[derive(Debug, Clone)]
pub struct CgroupView {
    pub procs: PathBuf,
    pub oom_before: u64,
    pub oom_source: Option<PathBuf>,
    /// `memory.max_usage_in_bytes` (v1) or `memory.peak` (v2).
    pub peak: Option<PathBuf>,
    /// `pids.current`: the tasks (threads) in the group, where the pids controller counts them.
    pub tasks: Option<PathBuf>,
}

/// A cgroup's peak memory since the last [`PeakMeter::reset`]: v1's `memory.max_usage_in_bytes`
/// (reset by writing 0), v2's `memory.peak` (reset by writing to it, for reads through the
/// same open file: Linux 6.12 and later; before that it reads the peak since the group was
/// made). One open file, two system calls a request.
pub struct PeakMeter {
    file: fs::File,
    v1: bool,
}

impl PeakMeter {
    pub fn open(path: &Path) -> Option<PeakMeter> {
        let file = fs::OpenOptions::new().read(true).write(true).open(path).ok()?;
        Some(PeakMeter { file, v1: path.file_name().is_some_and(|n| n == "memory.max_usage_in_bytes") })
    }

    pub fn reset(&self) {
        use std::os::unix::fs::FileExt;
        let _ = self.file.write_at(if self.v1 { b"0" } else { b"reset" }, 0);
    }

    pub fn read(&self) -> Option<u64> {
        read_number(&self.file)
    }
}

/// The tasks in a cgroup (`pids.current`: every thread of every process, the group's
/// subgroups' too), read through a file kept open: one system call, where reading
/// `cgroup.procs` builds a list of the group's processes. A count of one proves the group
/// holds one process; more may be one process's threads, which only `cgroup.procs` tells.
pub struct TaskCounter {
    file: fs::File,
}

impl TaskCounter {
    pub fn open(path: &Path) -> Option<TaskCounter> {
        Some(TaskCounter { file: fs::File::open(path).ok()? })
    }

    pub fn read(&self) -> Option<u64> {
        read_number(&self.file)
    }
}

/// The number a cgroup file kept open holds now.
fn read_number(file: &fs::File) -> Option<u64> {
    read_again(file, &mut [0u8; 32])?.trim().parse().ok()
}

/// The cgroup.procs and OOM counter of cgroup `name` (relative to the hierarchy roots).
pub fn view_of(layout: Option<&Layout>, name: &str) -> Option<CgroupView> {
    let (dir, oom_file) = match layout? {
        Layout::V1 { hierarchies } => {
            let (mount, _) = hierarchies.iter().find(|(_, c)| c.iter().any(|x| x == "memory"))?;
            (mount.join(name), "memory.oom_control")
        }
        Layout::V2 { root, .. } => (root.join(name), "memory.events"),
    };
    let procs = dir.join("cgroup.procs");
    if !procs.exists() {
        return None;
    }
    let oom_source = Some(dir.join(oom_file)).filter(|p| p.exists());
    let oom_before = oom_source.as_deref().map(read_oom_kills).unwrap_or(0);
    let peak = Some(dir.join(peak_file(layout?))).filter(|p| p.exists());
    Some(CgroupView { procs, oom_before, oom_source, peak, tasks: tasks_file(layout?, name) })
}

/// Group `name`'s `pids.current`, where the pids controller reaches it.
pub(super) fn tasks_file(layout: &Layout, name: &str) -> Option<PathBuf> {
    let dir = match layout {
        Layout::V1 { .. } => layout.v1_dir_of(name, "pids")?,
        Layout::V2 { root, .. } => root.join(name),
    };
    Some(dir.join("pids.current")).filter(|p| p.exists())
}

/// The file holding a group's peak memory.
pub(super) fn peak_file(layout: &Layout) -> &'static str {
    match layout {
        Layout::V1 { .. } => "memory.max_usage_in_bytes",
        Layout::V2 { .. } => "memory.peak",
    }
}
