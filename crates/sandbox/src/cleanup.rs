//! Removing what a worker left behind when it died without shutting down (kill -9, a
//! crash, a power cut): its sandbox processes, its mounts and its cgroups.
//!
//! Every process a worker starts lives in a cgroup below the worker's own parent groups, so
//! killing the cgroup trees finds them all, whatever PID namespace they are in; every mount
//! lives below `DIR/run`, so unmounting that tree finds them all.

use std::io;
use std::path::Path;

use serde::Serialize;

use crate::cgroup::Layout;
use crate::stage::Stage;

/// What a cleanup removed.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    pub processes_killed: usize,
    pub mounts_removed: usize,
    pub cgroups_removed: Vec<String>,
    /// The network's links, table and routes (filled in by the caller, who knows its tag).
    pub network_removed: Vec<String>,
}

impl Report {
    pub fn is_empty(&self) -> bool {
        self.processes_killed == 0 && self.mounts_removed == 0 && self.cgroups_removed.is_empty() && self.network_removed.is_empty()
    }
}

/// Kill everything in the cgroup trees `parents`, remove those trees, and unmount and
/// delete the run directory of `worker_dir`. Safe to run when nothing is left.
pub fn cleanup(worker_dir: &Path, layout: &Layout, parents: &[String]) -> io::Result<Report> {
    let mut report = Report::default();
    for parent in parents {
        let procs = layout.procs_in_tree(parent);
        let exists = match layout {
            Layout::V1 { hierarchies } => hierarchies.iter().any(|(p, _)| p.join(parent).exists()),
            Layout::V2 { root, .. } => root.join(parent).exists(),
        };
        if exists {
            layout.remove_tree(parent)?;
            report.processes_killed += procs.len();
            report.cgroups_removed.push(parent.clone());
        }
        // What an OCI runtime (runc, runsc) made under the parent in v1 hierarchies Sprout
        // does not use (blkio, devices, …): its containers were killed with the trees above.
        if layout.remove_from_unused_hierarchies(parent) > 0 && !exists {
            report.cgroups_removed.push(parent.clone());
        }
    }
    let stage = Stage::paths(worker_dir);
    if stage.run.exists() {
        report.mounts_removed = crate::stage::remove_run(&stage.run)?;
    }
    Ok(report)
}
