//! Which cgroup hierarchies this host has ([`Layout::detect`]): v1's, one mount per
//! controller, or v2's unified tree. Where a group's directories are in them, what its memory
//! files say, which controllers are missing, and the hierarchy-wide `favordynmods` mode.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
    pub(super) fn dirs(&self, name: &str) -> Vec<PathBuf> {
        match self {
            Layout::V1 { hierarchies } => hierarchies.iter().map(|(p, _)| p.join(name)).collect(),
            Layout::V2 { root, .. } => vec![root.join(name)],
        }
    }

    pub(super) fn v1_dir_of(&self, name: &str, controller: &str) -> Option<PathBuf> {
        match self {
            Layout::V1 { hierarchies } => hierarchies.iter().find(|(_, c)| c.iter().any(|x| x == controller)).map(|(p, _)| p.join(name)),
            Layout::V2 { .. } => None,
        }
    }

    /// The memory controller's directory of group `name`.
    pub(super) fn memory_dir_of(&self, name: &str) -> Option<PathBuf> {
        match self {
            Layout::V1 { .. } => self.v1_dir_of(name, "memory"),
            Layout::V2 { root, controllers } => controllers.iter().any(|c| c == "memory").then(|| root.join(name)),
        }
    }

    /// How group `name` shares a contended CPU, where the cpu controller reaches it.
    pub fn cpu_control_of(&self, name: &str) -> Option<super::CpuControl> {
        match self {
            Layout::V1 { .. } => {
                self.v1_dir_of(name, "cpu").map(|d| super::CpuControl::at(&d, true).with_cpuacct(self.v1_dir_of(name, "cpuacct")))
            }
            Layout::V2 { root, controllers } => {
                controllers.iter().any(|c| c == "cpu").then(|| super::CpuControl::at(&root.join(name), false))
            }
        }
    }

    /// CPU time group `name` and everything below it have used (v1 `cpuacct.usage`, v2
    /// `cpu.stat`'s `usage_usec`); None if it cannot be read.
    pub fn cpu_usage_of(&self, name: &str) -> Option<std::time::Duration> {
        match self {
            Layout::V1 { .. } => super::cpu::read_usage(&self.v1_dir_of(name, "cpuacct")?.join("cpuacct.usage"), true),
            Layout::V2 { root, .. } => super::cpu::read_usage(&root.join(name).join("cpu.stat"), false),
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

    pub(super) fn in_use(&self, dir: &Path) -> u64 {
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
}
