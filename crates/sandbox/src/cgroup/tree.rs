//! Parent groups and whole subtrees: making a parent (delegating v2's controllers to it),
//! listing the processes under one, and removing one with every group below it, thawed and
//! killed first.

use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::files::{mkdir_exist_ok, read_pids, write_file};
use super::layout::Layout;
use crate::error::PlatformError;

impl Layout {
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
