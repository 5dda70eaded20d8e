//! Cgroups for sandboxes, on the v1 hierarchies (one directory per controller) or on the
//! unified v2 hierarchy, made ahead in a pool and reused after a sandbox exits.
//!
//! SOCK (section 2.3) measured reusing a cgroup at twice the speed of creating one, so a
//! worker keeps a pool: [`CgroupPool::acquire`] hands out an empty cgroup with the limits
//! already written, [`CgroupPool::release`] takes it back once its processes are gone. A
//! [`Cgroup`] hides the version: on v1 it is one directory in each of the memory, pids, cpu,
//! cpuacct and freezer hierarchies; on v2 it is one directory of the unified tree.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::PlatformError;

/// What a sandbox's session reads of its cgroup: its processes, its OOM kills (the count
/// when the sandbox was made, and the file that counts them), and its peak memory.
#[derive(Debug, Clone)]
pub(crate) struct CgroupView {
    pub procs: PathBuf,
    pub oom_before: u64,
    pub oom_source: Option<PathBuf>,
    /// `memory.max_usage_in_bytes` (v1) or `memory.peak` (v2).
    pub peak: Option<PathBuf>,
}

/// This process's own group in the cpu hierarchy ([`Layout::join_cpu_group`]).
#[derive(Debug)]
pub struct OwnCpuGroup {
    /// `cgroup.procs` of the group it came from.
    back: PathBuf,
}

impl OwnCpuGroup {
    /// Go back to the group it came from, so its own can be removed.
    pub fn leave(self) -> io::Result<()> {
        write_file(&self.back, &std::process::id().to_string())
    }
}

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
}

/// A cgroup's peak memory since the last [`PeakMeter::reset`]: v1's `memory.max_usage_in_bytes`
/// (reset by writing 0), v2's `memory.peak` (reset by writing to it, for reads through the
/// same open file: Linux 6.12 and later; before that it reads the peak since the group was
/// made). One open file, two system calls a request.
pub(crate) struct PeakMeter {
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
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 32];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
    }
}

/// Which cgroup hierarchy to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    /// v2 when the unified hierarchy is the main one (mounted at the cgroup root), else v1.
    #[default]
    Auto,
    V1,
    V2,
}

/// Controllers a sandbox cgroup uses.
const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// Resource limits of one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u64,
    /// CPU bandwidth in cores (1.5 = one and a half cores); 0 means unlimited.
    pub cpus: f64,
}

/// The cgroup hierarchies found on this host.
#[derive(Debug, Clone)]
pub enum Layout {
    V1 {
        /// (mount point, controllers) of each hierarchy a sandbox joins.
        hierarchies: Vec<(PathBuf, Vec<String>)>,
    },
    V2 {
        root: PathBuf,
        /// Controllers available to our subtree (may be empty on a hybrid host).
        controllers: Vec<String>,
    },
}

impl Layout {
    /// Find the hierarchies from /proc/self/mountinfo. `v2_root` overrides where the unified
    /// hierarchy is looked for (it may be mounted elsewhere, e.g. /sys/fs/cgroup/unified).
    pub fn detect(version: Version, v2_root: Option<&Path>) -> io::Result<Layout> {
        let mut v1: Vec<(PathBuf, Vec<String>)> = Vec::new();
        let mut v2: Vec<PathBuf> = Vec::new();
        for mount in crate::mountinfo::read()? {
            match mount.fs_type.as_str() {
                "cgroup" => {
                    let controllers: Vec<String> =
                        mount.super_options.split(',').filter(|o| V1_CONTROLLERS.contains(o)).map(str::to_string).collect();
                    if !controllers.is_empty() && !v1.iter().any(|(p, _)| p == &mount.mount_point) {
                        v1.push((mount.mount_point, controllers));
                    }
                }
                "cgroup2" => v2.push(mount.mount_point),
                _ => {}
            }
        }
        let unified_main = v2.iter().any(|p| p == Path::new("/sys/fs/cgroup"));
        let use_v2 = match version {
            Version::V2 => true,
            Version::V1 => false,
            Version::Auto => unified_main || v1.is_empty(),
        };
        if use_v2 {
            let root = match v2_root {
                Some(r) => r.to_path_buf(),
                None if unified_main => PathBuf::from("/sys/fs/cgroup"),
                None => v2.first().cloned().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no cgroup2 hierarchy is mounted"))?,
            };
            let available = fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            let controllers = available.split_whitespace().filter(|c| V2_CONTROLLERS.contains(c)).map(str::to_string).collect();
            Ok(Layout::V2 { root, controllers })
        } else {
            if v1.is_empty() {
                return Err(io::Error::new(io::ErrorKind::NotFound, "no cgroup v1 hierarchy is mounted"));
            }
            Ok(Layout::V1 { hierarchies: v1 })
        }
    }

    pub fn version(&self) -> u8 {
        match self {
            Layout::V1 { .. } => 1,
            Layout::V2 { .. } => 2,
        }
    }

    /// The directory of group `name` (a relative path such as "sprout-x/sb-3") in every
    /// hierarchy we use.
    fn dirs(&self, name: &str) -> Vec<PathBuf> {
        match self {
            Layout::V1 { hierarchies } => hierarchies.iter().map(|(p, _)| p.join(name)).collect(),
            Layout::V2 { root, .. } => vec![root.join(name)],
        }
    }

    fn v1_dir_of(&self, name: &str, controller: &str) -> Option<PathBuf> {
        match self {
            Layout::V1 { hierarchies } => hierarchies.iter().find(|(_, c)| c.iter().any(|x| x == controller)).map(|(p, _)| p.join(name)),
            Layout::V2 { .. } => None,
        }
    }

    /// The memory controller's directory of group `name`.
    fn memory_dir_of(&self, name: &str) -> Option<PathBuf> {
        match self {
            Layout::V1 { .. } => self.v1_dir_of(name, "memory"),
            Layout::V2 { root, controllers } => controllers.iter().any(|c| c == "memory").then(|| root.join(name)),
        }
    }

    /// Limit the memory of group `name` and everything below it (a parent group): the
    /// kernel reclaims, then kills within the group, at `bytes`.
    pub fn set_memory_limit(&self, name: &str, bytes: u64) -> io::Result<()> {
        let dir = self.memory_dir_of(name).ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "no memory controller"))?;
        match self {
            Layout::V1 { .. } => write_file(&dir.join("memory.limit_in_bytes"), &bytes.to_string()),
            Layout::V2 { .. } => write_file(&dir.join("memory.max"), &bytes.to_string()),
        }
    }

    /// Memory charged to group `name` and everything below it, in bytes (0 if unknown).
    pub fn memory_usage_of(&self, name: &str) -> u64 {
        let Some(dir) = self.memory_dir_of(name) else { return 0 };
        let file = if matches!(self, Layout::V1 { .. }) { "memory.usage_in_bytes" } else { "memory.current" };
        fs::read_to_string(dir.join(file)).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    /// Memory group `name` and everything below it hold that the kernel cannot simply drop
    /// ([`crate::memory::in_use`]: charged, less page cache no process maps), in bytes.
    pub fn memory_in_use_of(&self, name: &str) -> u64 {
        self.memory_dir_of(name).map(|dir| self.in_use(&dir)).unwrap_or(0)
    }

    fn in_use(&self, dir: &Path) -> u64 {
        let v1 = matches!(self, Layout::V1 { .. });
        let usage = fs::read_to_string(dir.join(if v1 { "memory.usage_in_bytes" } else { "memory.current" }))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        crate::memory::in_use(usage, &fs::read_to_string(dir.join("memory.stat")).unwrap_or_default(), v1)
    }

    /// Controllers whose limits we cannot enforce here (v2 without delegated controllers).
    pub fn missing_controllers(&self) -> Vec<String> {
        match self {
            Layout::V1 { hierarchies } => ["memory", "pids", "cpu"]
                .iter()
                .filter(|c| !hierarchies.iter().any(|(_, cs)| cs.iter().any(|x| x == *c)))
                .map(|c| c.to_string())
                .collect(),
            Layout::V2 { controllers, .. } => {
                V2_CONTROLLERS.iter().filter(|c| !controllers.iter().any(|x| x == *c)).map(|c| c.to_string()).collect()
            }
        }
    }

    /// Make moving tasks between cgroups cheap, at a small cost to every fork and exit: the
    /// kernel's `favordynmods`. Without it, each move (one per cold start) waits for an RCU
    /// grace period unless another happened just before: 10-40 ms on a small VM when
    /// requests are sparse. On v2 the unified hierarchy is remounted with the option; v1
    /// hierarchies cannot be remounted with new options, but the mode it sets is global, so a
    /// small named hierarchy is mounted with it at `mount_dir` (under the worker's private
    /// run directory, removed with it). Returns what was done, or why it could not be.
    pub fn favor_dynamic_modifications(&self, mount_dir: &Path) -> io::Result<&'static str> {
        use nix::mount::{mount, MsFlags};
        match self {
            Layout::V2 { root, .. } => {
                let already = crate::mountinfo::read().unwrap_or_default().iter().any(|m| {
                    m.mount_point == *root && m.super_options.split(',').chain(m.mount_options.split(',')).any(|o| o == "favordynmods")
                });
                if already {
                    return Ok("the cgroup2 hierarchy already favors dynamic modifications");
                }
                mount(None::<&str>, root.as_path(), None::<&str>, MsFlags::MS_REMOUNT, Some("favordynmods"))
                    .map_err(|e| io::Error::other(format!("remounting {} with favordynmods: {e}", root.display())))?;
                Ok("remounted the cgroup2 hierarchy with favordynmods")
            }
            Layout::V1 { .. } => {
                fs::create_dir_all(mount_dir)?;
                mount(
                    Some("cgroup"),
                    mount_dir,
                    Some("cgroup"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                    Some("none,name=sprout-dynmods,favordynmods"),
                )
                .map_err(|e| io::Error::other(format!("mounting a cgroup v1 hierarchy with favordynmods: {e}")))?;
                Ok("mounted a named cgroup v1 hierarchy with favordynmods")
            }
        }
    }

    /// Create the parent group `name` in every hierarchy; on v2 delegate our controllers.
    pub fn create_parent(&self, name: &str) -> io::Result<()> {
        for dir in self.dirs(name) {
            mkdir_exist_ok(&dir)?;
        }
        if let Layout::V2 { root, controllers } = self {
            if !controllers.is_empty() {
                let enable: String = controllers.iter().map(|c| format!("+{c} ")).collect();
                // The root may already delegate them; failure there surfaces on the next write.
                let _ = write_file(&root.join("cgroup.subtree_control"), enable.trim());
                write_file(&root.join(name).join("cgroup.subtree_control"), enable.trim())?;
            }
        }
        Ok(())
    }

    /// Remove `name`, the parent under which an OCI runtime (runc, runsc) made its
    /// containers' groups, with what is under it; on v1 also from the hierarchies Sprout does
    /// not use (blkio, devices, …), where the runtime made them too and its `delete` can
    /// leave a container's behind. Failures are logged.
    pub fn remove_container_parent(&self, name: &str) {
        if let Err(e) = self.remove_tree(name) {
            tracing::warn!("removing cgroup {name}: {e}");
        }
        self.remove_from_unused_hierarchies(name);
    }

    /// On v1, remove `name`'s tree from the hierarchies Sprout does not use, where an OCI
    /// runtime made groups too; returns how many trees it removed.
    pub fn remove_from_unused_hierarchies(&self, name: &str) -> usize {
        let mut removed = 0;
        if let Layout::V1 { hierarchies } = self {
            if let Some(root) = hierarchies.first().and_then(|(mount, _)| mount.parent()) {
                for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
                    let dir = entry.path().join(name);
                    if dir.is_dir() {
                        match remove_group_tree(&dir) {
                            Ok(()) => removed += 1,
                            Err(e) => tracing::warn!("removing cgroup {}: {e}", dir.display()),
                        }
                    }
                }
            }
        }
        removed
    }

    /// Remove group `name` and every group below it, killing what still runs there. Paused
    /// groups are thawed first, in every hierarchy: a frozen process cannot die.
    pub fn remove_tree(&self, name: &str) -> io::Result<()> {
        for dir in self.dirs(name) {
            thaw_tree(&dir);
        }
        for dir in self.dirs(name) {
            if dir.exists() {
                remove_group_tree(&dir)?;
            }
        }
        Ok(())
    }

    /// The `tasks` file of the cpu hierarchy's root group, on v1 (where a thread can be placed
    /// apart from its process, and real-time threads may run).
    pub fn cpu_root_tasks(&self) -> Option<PathBuf> {
        match self {
            Layout::V1 { hierarchies } => {
                hierarchies.iter().find(|(_, c)| c.iter().any(|x| x == "cpu")).map(|(mount, _)| mount.join("tasks"))
            }
            Layout::V2 { .. } => None,
        }
    }

    /// Move this whole process (every thread, and those it makes later) into group `name` of
    /// the cpu hierarchy with CPU weight `weight`: on v1 only, where that hierarchy stands
    /// apart, so the process's memory stays where it was (outside a memory budget set on a
    /// parent of `name`). None on v2 or without a cpu hierarchy: nothing was moved.
    pub fn join_cpu_group(&self, name: &str, weight: u64) -> io::Result<Option<OwnCpuGroup>> {
        let Layout::V1 { hierarchies } = self else { return Ok(None) };
        let Some((mount, controllers)) = hierarchies.iter().find(|(_, c)| c.iter().any(|x| x == "cpu")) else { return Ok(None) };
        let own = fs::read_to_string("/proc/self/cgroup")?;
        let was = own
            .lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, ':').skip(1);
                parts.next().zip(parts.next())
            })
            .find(|(list, _)| list.split(',').any(|c| controllers.iter().any(|x| x == c)))
            .map(|(_, path)| mount.join(path.trim_start_matches('/')))
            .unwrap_or_else(|| mount.clone());
        let dir = mount.join(name);
        fs::create_dir_all(&dir)?;
        CpuControl::at(&dir, true).set_weight(weight)?;
        write_file(&dir.join("cgroup.procs"), &std::process::id().to_string())?;
        Ok(Some(OwnCpuGroup { back: was.join("cgroup.procs") }))
    }

    /// Processes in group `name` or any group below it (read from the first hierarchy).
    pub fn procs_in_tree(&self, name: &str) -> Vec<i32> {
        let mut out = Vec::new();
        if let Some(dir) = self.dirs(name).first() {
            collect_procs(dir, &mut out);
        }
        out
    }
}

fn collect_procs(dir: &Path, out: &mut Vec<i32>) {
    out.extend(read_pids(&dir.join("cgroup.procs")));
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                collect_procs(&e.path(), out);
            }
        }
    }
}

fn thaw_tree(dir: &Path) {
    let _ = write_file(&dir.join("freezer.state"), "THAWED");
    let _ = write_file(&dir.join("cgroup.freeze"), "0");
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                thaw_tree(&e.path());
            }
        }
    }
}

/// Remove the cgroup directory `dir` and every group below it, killing what runs there.
pub fn remove_group_tree(dir: &Path) -> io::Result<()> {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_group_tree(&e.path())?;
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // A frozen group would never let its killed processes exit.
        let _ = write_file(&dir.join("freezer.state"), "THAWED");
        let _ = write_file(&dir.join("cgroup.freeze"), "0");
        let pids = read_pids(&dir.join("cgroup.procs"));
        for pid in &pids {
            // SAFETY: kill takes two integers and touches no memory of ours; the pids were just
            // read from this group's cgroup.procs.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(PlatformError::Path { doing: "removing the cgroup".into(), path: dir.to_path_buf(), error: e }.into())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// The pids in a cgroup.procs file. A task outside the reader's PID namespace is listed as 0,
/// which is left out: `kill(0, ...)` would signal the caller's own process group.
pub(crate) fn read_pids(path: &Path) -> Vec<i32> {
    fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).filter(|p: &i32| *p > 0).collect()
}

/// Write `pid` to each of the cgroup.procs descriptors `fds`: move it into those groups.
pub(crate) fn write_pid(fds: &[OwnedFd], pid: i32) -> io::Result<()> {
    let text = pid.to_string();
    for fd in fds {
        // SAFETY: `fd` is borrowed from a live OwnedFd for the call, and the pointer and length
        // describe `text`, which outlives it.
        let n = unsafe { libc::write(fd.as_raw_fd(), text.as_ptr() as *const libc::c_void, text.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// [`write_pid`] off the async threads: a move may wait for an RCU grace period (see
/// [`Layout::favor_dynamic_modifications`]).
pub(crate) async fn move_pid<'a>(fds: impl IntoIterator<Item = &'a OwnedFd>, pid: i32) -> io::Result<()> {
    let fds: Vec<OwnedFd> = fds.into_iter().map(|f| f.try_clone()).collect::<io::Result<_>>()?;
    tokio::task::spawn_blocking(move || write_pid(&fds, pid)).await.map_err(io::Error::other)?
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
}

fn mkdir_exist_ok(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir_all(dir),
        other => other,
    }
}

/// The `oom_kill` count of a memory.oom_control (v1) or memory.events (v2) file.
pub(crate) fn read_oom_kills(path: &Path) -> u64 {
    read_key(path, "oom_kill").unwrap_or(0)
}

fn read_key(path: &Path, key: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// One sandbox's cgroup: a directory in each hierarchy.
#[derive(Debug)]
pub struct Cgroup {
    pub name: String,
    layout: Arc<Layout>,
    dirs: Vec<PathBuf>,
    limits: Option<Limits>,
    /// cgroup.procs of each hierarchy, opened for writing once and kept with the group.
    procs_fds: Vec<OwnedFd>,
}

impl Cgroup {
    /// Create (or adopt an existing) group `name`, relative to the hierarchy roots.
    pub fn create(layout: Arc<Layout>, name: &str) -> io::Result<Cgroup> {
        let dirs = layout.dirs(name);
        for dir in &dirs {
            mkdir_exist_ok(dir)?;
        }
        let procs_fds = dirs
            .iter()
            .map(|d| fs::OpenOptions::new().write(true).open(d.join("cgroup.procs")).map(OwnedFd::from))
            .collect::<io::Result<_>>()?;
        Ok(Cgroup { name: name.to_string(), layout, dirs, limits: None, procs_fds })
    }

    /// The group's directories, one per hierarchy.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    fn memory_dir(&self) -> Option<PathBuf> {
        match &*self.layout {
            Layout::V1 { .. } => self.layout.v1_dir_of(&self.name, "memory"),
            Layout::V2 { .. } => Some(self.dirs[0].clone()),
        }
    }

    /// Write the limits (skipped when they are already in place).
    pub fn set_limits(&mut self, limits: &Limits) -> io::Result<()> {
        if self.limits.as_ref() == Some(limits) {
            return Ok(());
        }
        let name = self.name.clone();
        match &*self.layout {
            Layout::V1 { .. } => {
                if let Some(d) = self.layout.v1_dir_of(&name, "memory") {
                    write_file(&d.join("memory.limit_in_bytes"), &limits.memory_bytes.to_string())?;
                    let memsw = d.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write_file(&memsw, &limits.memory_bytes.to_string())?;
                    }
                }
                if let Some(d) = self.layout.v1_dir_of(&name, "pids") {
                    write_file(&d.join("pids.max"), &limits.pids.to_string())?;
                }
                if let Some(d) = self.layout.v1_dir_of(&name, "cpu") {
                    write_file(&d.join("cpu.cfs_period_us"), "100000")?;
                    let quota = if limits.cpus > 0.0 { ((limits.cpus * 100_000.0) as i64).max(1000) } else { -1 };
                    write_file(&d.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
            }
            Layout::V2 { controllers, .. } => {
                let d = &self.dirs[0];
                let has = |c: &str| controllers.iter().any(|x| x == c);
                if has("memory") {
                    write_file(&d.join("memory.max"), &limits.memory_bytes.to_string())?;
                    let swap = d.join("memory.swap.max");
                    if swap.exists() {
                        write_file(&swap, "0")?;
                    }
                }
                if has("pids") {
                    write_file(&d.join("pids.max"), &limits.pids.to_string())?;
                }
                if has("cpu") {
                    let quota =
                        if limits.cpus > 0.0 { ((limits.cpus * 100_000.0) as i64).max(1000).to_string() } else { "max".to_string() };
                    write_file(&d.join("cpu.max"), &format!("{quota} 100000"))?;
                }
            }
        }
        self.limits = Some(*limits);
        Ok(())
    }

    /// Run the group's processes only on CPU time no other group wants (`idle`), or as
    /// usual again: `cpu.idle` (the group competes as SCHED_IDLE does), or where the kernel
    /// lacks it the least weight. A process's own SCHED_IDLE would not do: it counts only
    /// against its group's siblings.
    pub fn set_idle(&self, idle: bool) -> io::Result<()> {
        let dir = match &*self.layout {
            Layout::V1 { .. } => self.layout.v1_dir_of(&self.name, "cpu"),
            Layout::V2 { controllers, .. } => controllers.iter().any(|c| c == "cpu").then(|| self.dirs[0].clone()),
        };
        let Some(dir) = dir else { return Ok(()) };
        if dir.join("cpu.idle").exists() {
            return write_file(&dir.join("cpu.idle"), if idle { "1" } else { "0" });
        }
        match &*self.layout {
            Layout::V1 { .. } => write_file(&dir.join("cpu.shares"), if idle { "2" } else { "1024" }),
            Layout::V2 { .. } => write_file(&dir.join("cpu.weight"), if idle { "1" } else { "100" }),
        }
    }

    /// The group's share of a contended CPU, where the cpu controller reaches it.
    pub fn cpu_control(&self) -> Option<CpuControl> {
        match &*self.layout {
            Layout::V1 { .. } => self.layout.v1_dir_of(&self.name, "cpu").map(|d| CpuControl::at(&d, true)),
            Layout::V2 { controllers, .. } => controllers.iter().any(|c| c == "cpu").then(|| CpuControl::at(&self.dirs[0], false)),
        }
    }

    /// cgroup.procs of the hierarchy holding the cpu controller (the unified one on v2): where
    /// a process's CPU share is decided.
    pub fn cpu_procs_fd(&self) -> Option<&OwnedFd> {
        let index = match &*self.layout {
            Layout::V1 { hierarchies } => hierarchies.iter().position(|(_, c)| c.iter().any(|x| x == "cpu"))?,
            Layout::V2 { .. } => 0,
        };
        self.procs_fds.get(index)
    }

    /// cgroup.procs of every hierarchy, open for writing: a process that writes "0" to each
    /// joins the group, so these descriptors are handed to a process being provisioned.
    pub fn procs_fds(&self) -> &[OwnedFd] {
        &self.procs_fds
    }

    /// Move process `pid` (of our PID namespace) into the group, in every hierarchy.
    pub fn add_pid(&self, pid: i32) -> io::Result<()> {
        write_pid(&self.procs_fds, pid)
    }

    /// Pids in the group (as seen from our PID namespace).
    pub fn procs(&self) -> Vec<i32> {
        read_pids(&self.dirs[0].join("cgroup.procs"))
    }

    /// What a sandbox checks of its group after each request.
    pub(crate) fn view(&self) -> CgroupView {
        let oom_source = self.oom_path();
        CgroupView {
            procs: self.dirs[0].join("cgroup.procs"),
            oom_before: oom_source.as_deref().map(read_oom_kills).unwrap_or(0),
            oom_source,
            peak: self.memory_dir().map(|d| d.join(peak_file(&self.layout))),
        }
    }

    /// The file counting OOM kills of this group (`oom_kill N`).
    pub fn oom_path(&self) -> Option<PathBuf> {
        let d = self.memory_dir()?;
        Some(match &*self.layout {
            Layout::V1 { .. } => d.join("memory.oom_control"),
            Layout::V2 { .. } => d.join("memory.events"),
        })
    }

    /// How many times the kernel's OOM killer has killed a process of this group.
    pub fn oom_kills(&self) -> u64 {
        self.oom_path().map(|p| read_oom_kills(&p)).unwrap_or(0)
    }

    /// Whether the group has hit its memory limit since it was made (a hint when no OOM
    /// kill was counted, e.g. on kernels without the oom_kill field).
    pub fn memory_failures(&self) -> u64 {
        let Some(d) = self.memory_dir() else { return 0 };
        match &*self.layout {
            Layout::V1 { .. } => fs::read_to_string(d.join("memory.failcnt")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0),
            Layout::V2 { .. } => read_key(&d.join("memory.events"), "max").unwrap_or(0),
        }
    }

    /// Memory charged to the group, in bytes.
    pub fn memory_usage(&self) -> u64 {
        let Some(d) = self.memory_dir() else { return 0 };
        let file = match &*self.layout {
            Layout::V1 { .. } => "memory.usage_in_bytes",
            Layout::V2 { .. } => "memory.current",
        };
        fs::read_to_string(d.join(file)).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
    }

    /// Memory the group holds that the kernel cannot simply drop ([`Layout::memory_in_use_of`]).
    pub fn memory_in_use(&self) -> u64 {
        self.memory_dir().map(|d| self.layout.in_use(&d)).unwrap_or(0)
    }

    /// Freeze (pause) or thaw every process in the group.
    pub fn set_frozen(&self, frozen: bool) -> io::Result<()> {
        match &*self.layout {
            Layout::V1 { .. } => match self.layout.v1_dir_of(&self.name, "freezer") {
                Some(d) => write_file(&d.join("freezer.state"), if frozen { "FROZEN" } else { "THAWED" }),
                None => Err(io::Error::new(io::ErrorKind::Unsupported, "no freezer hierarchy")),
            },
            Layout::V2 { .. } => write_file(&self.dirs[0].join("cgroup.freeze"), if frozen { "1" } else { "0" }),
        }
    }

    /// Send SIGKILL to every process in the group. On v2 one write to cgroup.kill does it
    /// atomically; on v1 the group is frozen first so nothing can fork while we sweep.
    pub fn kill_all(&self) {
        if let Layout::V2 { .. } = &*self.layout {
            if write_file(&self.dirs[0].join("cgroup.kill"), "1").is_ok() {
                return;
            }
        }
        let frozen = self.set_frozen(true).is_ok();
        for _ in 0..100 {
            let pids = self.procs();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                // SAFETY: kill takes two integers and touches no memory of ours; the pids were
                // just read from the group's cgroup.procs (frozen first, when that worked).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if frozen {
                break; // frozen processes cannot fork; one sweep reaches them all
            }
        }
        if frozen {
            let _ = self.set_frozen(false);
        }
    }

    /// Kill everything in the group and wait until it is empty; false after `timeout`.
    pub async fn wait_empty(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut delay = Duration::from_micros(200);
        let mut next_sweep = Instant::now();
        loop {
            if self.procs().is_empty() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            if Instant::now() >= next_sweep {
                self.kill_all();
                next_sweep = Instant::now() + Duration::from_millis(100);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(20));
        }
    }

    /// Remove the group's directories (it must be empty).
    pub fn remove(mut self) -> io::Result<()> {
        self.procs_fds.clear();
        for d in &self.dirs {
            match fs::remove_dir(d) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}

/// The cgroup.procs and OOM counter of cgroup `name` (relative to the hierarchy roots).
pub(crate) fn view_of(layout: Option<&Layout>, name: &str) -> Option<CgroupView> {
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
    Some(CgroupView { procs, oom_before, oom_source, peak })
}

/// The file holding a group's peak memory.
fn peak_file(layout: &Layout) -> &'static str {
    match layout {
        Layout::V1 { .. } => "memory.max_usage_in_bytes",
        Layout::V2 { .. } => "memory.peak",
    }
}

/// Counters of a pool, for /stats and /metrics.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct PoolStats {
    pub created: u64,
    pub reused: u64,
    pub free: usize,
}

/// How long after a pooled group is taken the pool is refilled.
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(30);

/// Cgroups made ahead and reused: `sprout-<worker>/sb-<n>` in every hierarchy, refilled in the
/// background as cold starts take them.
pub struct CgroupPool {
    layout: Arc<Layout>,
    parent: String,
    limits: Limits,
    free: Mutex<Vec<Cgroup>>,
    next: AtomicU64,
    created: AtomicU64,
    reused: AtomicU64,
    max_free: usize,
    /// Free groups kept ready: taking one below half of this refills the pool in the
    /// background, so that a cold start makes a group itself only when the pool ran dry.
    prefill: usize,
    refilling: std::sync::atomic::AtomicBool,
}

impl CgroupPool {
    /// Create the parent group and `prefill` sandbox groups with `limits` written.
    pub fn new(layout: Arc<Layout>, parent: &str, limits: Limits, prefill: usize, max_free: usize) -> io::Result<CgroupPool> {
        layout.create_parent(parent)?;
        let pool = CgroupPool {
            layout,
            parent: parent.to_string(),
            limits,
            free: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
            created: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            max_free: max_free.max(prefill),
            prefill,
            refilling: false.into(),
        };
        let mut made = Vec::with_capacity(prefill);
        for _ in 0..prefill {
            made.push(pool.make()?);
        }
        *pool.free.lock().unwrap() = made;
        Ok(pool)
    }

    pub fn layout(&self) -> &Arc<Layout> {
        &self.layout
    }

    pub fn parent(&self) -> &str {
        &self.parent
    }

    fn make(&self) -> io::Result<Cgroup> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut cg = Cgroup::create(self.layout.clone(), &format!("{}/sb-{n}", self.parent))?;
        cg.set_limits(&self.limits)?;
        self.created.fetch_add(1, Ordering::Relaxed);
        Ok(cg)
    }

    /// An empty cgroup with `limits` in place: a pooled one when there is one.
    pub fn acquire(self: &Arc<Self>, limits: &Limits) -> io::Result<Cgroup> {
        let (pooled, left) = {
            let mut free = self.free.lock().unwrap();
            (free.pop(), free.len())
        };
        if left < self.prefill / 2 && !self.refilling.swap(true, Ordering::AcqRel) {
            let pool = self.clone();
            let refill = move || {
                // Not while the cold start that took a group is under way, on the same CPU.
                std::thread::sleep(REFILL_DELAY);
                // Stops when the parent is gone (the worker cleaning up): make would make it again.
                let parent = pool.layout.dirs(&pool.parent);
                while pool.free.lock().unwrap().len() < pool.prefill && parent.iter().all(|d| d.exists()) {
                    match pool.make() {
                        Ok(cg) => pool.free.lock().unwrap().push(cg),
                        Err(e) => {
                            tracing::warn!("refilling the cgroup pool: {e}");
                            break;
                        }
                    }
                }
                pool.refilling.store(false, Ordering::Release);
            };
            if let Err(e) = std::thread::Builder::new().name("cgroup-pool".into()).spawn(refill) {
                tracing::warn!("refilling the cgroup pool: {e}");
                self.refilling.store(false, Ordering::Release);
            }
        }
        let mut cg = match pooled {
            Some(cg) => {
                self.reused.fetch_add(1, Ordering::Relaxed);
                cg
            }
            None => self.make()?,
        };
        cg.set_limits(limits)?;
        Ok(cg)
    }

    /// Return an empty cgroup to the pool (or remove it when the pool is full).
    pub fn release(&self, cg: Cgroup) {
        let mut free = self.free.lock().unwrap();
        if free.len() < self.max_free {
            free.push(cg);
        } else {
            drop(free);
            if let Err(e) = cg.remove() {
                tracing::warn!("removing a surplus cgroup: {e}");
            }
        }
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            created: self.created.load(Ordering::Relaxed),
            reused: self.reused.load(Ordering::Relaxed),
            free: self.free.lock().unwrap().len(),
        }
    }

    /// Remove every pooled group and the parent (at shutdown).
    pub fn destroy(&self) -> io::Result<()> {
        self.free.lock().unwrap().clear();
        self.layout.remove_tree(&self.parent)
    }
}
