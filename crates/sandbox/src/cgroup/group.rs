//! One sandbox's cgroup ([`Cgroup`]): a directory in each hierarchy, with its limits written,
//! processes moved in, counted, frozen and killed, and its memory and OOM kills read.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cpu::CpuControl;
use super::files::{mkdir_exist_ok, read_key, read_oom_kills, read_pids, write_file, write_pid};
use super::layout::Layout;
use super::limits::Limits;
use super::view::{peak_file, tasks_file, CgroupView};

/// One sandbox's cgroup: a directory in each hierarchy.
#[derive(Debug)]
pub struct Cgroup {
    pub name: String,
    layout: Arc<Layout>,
    dirs: Vec<PathBuf>,
    limits: Option<Limits>,
    /// cgroup.procs of each hierarchy, opened for writing once and kept with the group.
    procs_fds: Vec<OwnedFd>,
    /// Its share of a contended CPU, made once (with its CPU time's file kept open).
    cpu: Option<CpuControl>,
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
        let cpu = layout.cpu_control_of(name);
        Ok(Cgroup { name: name.to_string(), layout, dirs, limits: None, procs_fds, cpu })
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
        self.cpu_control().map_or(Ok(()), |cpu| cpu.set_idle_or_least_weight(idle))
    }

    /// The group's share of a contended CPU, where the cpu controller reaches it.
    pub fn cpu_control(&self) -> Option<CpuControl> {
        self.cpu.clone()
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
            tasks: tasks_file(&self.layout, &self.name),
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
