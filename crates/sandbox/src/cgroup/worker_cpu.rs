//! The worker's own groups in the cpu hierarchy, on v1: joining one with a weight of its own
//! ([`Layout::join_cpu_group`]) and leaving it ([`OwnCpuGroup`]), an idle one for threads
//! whose work no request waits for ([`Layout::idle_threads`]), and the root group's `tasks`
//! file, where real-time threads may run ([`Layout::cpu_root_tasks`]).

use std::fs;
use std::io;
use std::path::PathBuf;

use super::cpu::CpuControl;
use super::files::write_file;
use super::layout::Layout;

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

impl Layout {
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

    /// Make group `name` of the cpu hierarchy an idle one (`cpu.idle`: it runs on CPU time
    /// no sibling wants; the least weight where the kernel has no `cpu.idle`) and move this
    /// process's threads called one of `threads` into it: on v1 only, where a thread can be
    /// placed apart from its process. Returns how many were moved (0 on v2).
    pub fn idle_threads(&self, name: &str, threads: &[&str]) -> io::Result<usize> {
        let Some(dir) = self.v1_dir_of(name, "cpu") else { return Ok(0) };
        fs::create_dir_all(&dir)?;
        CpuControl::at(&dir, true).set_idle_or_least_weight(true)?;
        let mut moved = 0;
        for task in fs::read_dir("/proc/self/task")? {
            let task = task?;
            let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if threads.contains(&comm.trim_end()) {
                write_file(&dir.join("tasks"), &task.file_name().to_string_lossy())?;
                moved += 1;
            }
        }
        Ok(moved)
    }
}
