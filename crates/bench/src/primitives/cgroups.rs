//! Figure 5: a fresh cgroup per child (create, join, exit, remove) against a pool of cgroups
//! made ahead (join, exit).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use sprout_sandbox::cgroup::{Layout, Version};

use super::child::{errno_code, Child};
use super::measure::{c_key, rate, round};
use super::sys::{cstr, errno};

/// The parent cgroup (in every hierarchy used) of all groups the benchmark makes.
pub const CGROUP_PARENT: &str = "sprout-bench-primitives";

/// Controllers whose hierarchies a benchmark cgroup joins (on cgroup v1).
const CGROUP_CONTROLLERS: [&str; 4] = ["memory", "pids", "cpu", "freezer"];

/// The hierarchies used, the parent group in each, and a pool of pre-made groups (one per
/// thread) with their cgroup.procs open. Drop removes the parent group and all below it.
pub(super) struct CgroupBench {
    layout: Layout,
    /// `<hierarchy>/<CGROUP_PARENT>` for each hierarchy.
    parents: Vec<PathBuf>,
    /// Per thread: the open cgroup.procs of its pooled group, one per hierarchy.
    pool_fds: Vec<Vec<OwnedFd>>,
    pool_raw: Vec<Vec<libc::c_int>>,
    cleaned: bool,
}

fn open_procs(dir: &Path) -> io::Result<OwnedFd> {
    let path = cstr(&dir.join("cgroup.procs"))?;
    // SAFETY: `path` is a NUL-terminated CString alive for the call.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: open succeeded, so `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Child body: join the group of every hierarchy by writing "0" to its cgroup.procs.
fn join_body(fds: &[libc::c_int]) -> libc::c_int {
    for &fd in fds {
        // SAFETY: the buffer is a static 1-byte literal, matching the length; `fd` is a cgroup.procs
        // descriptor inherited from the parent, whose owner keeps it open until the child is reaped.
        if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
            return errno_code();
        }
    }
    0
}

impl CgroupBench {
    pub(super) fn setup(threads: usize) -> Result<CgroupBench> {
        let detected = Layout::detect(Version::Auto, None).context("finding the cgroup hierarchies")?;
        let layout = match detected {
            Layout::V1 { hierarchies } => {
                let mut chosen: Vec<(PathBuf, Vec<String>)> = Vec::new();
                for want in CGROUP_CONTROLLERS {
                    if let Some(h) = hierarchies.iter().find(|(_, cs)| cs.iter().any(|c| c == want)) {
                        if !chosen.iter().any(|(p, _)| p == &h.0) {
                            chosen.push(h.clone());
                        }
                    }
                }
                if chosen.is_empty() {
                    bail!("none of the memory, pids, cpu, freezer cgroup v1 hierarchies is mounted");
                }
                Layout::V1 { hierarchies: chosen }
            }
            v2 => v2,
        };
        let roots: Vec<PathBuf> = match &layout {
            Layout::V1 { hierarchies } => hierarchies.iter().map(|(p, _)| p.clone()).collect(),
            Layout::V2 { root, .. } => vec![root.clone()],
        };
        // Leftovers of a run that was killed.
        layout.remove_tree(CGROUP_PARENT).context("removing an old benchmark cgroup")?;
        let mut bench = CgroupBench {
            parents: roots.iter().map(|r| r.join(CGROUP_PARENT)).collect(),
            layout,
            pool_fds: Vec::new(),
            pool_raw: Vec::new(),
            cleaned: false,
        };
        bench.layout.create_parent(CGROUP_PARENT).context("creating the benchmark's parent cgroup")?;
        for t in 0..threads {
            let mut fds = Vec::new();
            for p in &bench.parents {
                let dir = p.join(format!("pool-{t}"));
                std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
                fds.push(open_procs(&dir).with_context(|| format!("opening {}/cgroup.procs", dir.display()))?);
            }
            bench.pool_raw.push(fds.iter().map(|f| f.as_raw_fd()).collect());
            bench.pool_fds.push(fds);
        }
        Ok(bench)
    }

    fn hierarchy_names(&self) -> Vec<String> {
        self.parents.iter().map(|p| p.parent().unwrap_or(p).display().to_string()).collect()
    }

    /// Create a fresh group in each hierarchy, have a child join it and exit, remove it.
    fn create_cycle(&self, t: usize, i: u64) -> Result<()> {
        let name = format!("c{t}-{i}");
        let mut group = FreshGroup { dirs: Vec::with_capacity(self.parents.len()), fds: Vec::new() };
        for p in &self.parents {
            let dir = p.join(&name);
            let c = cstr(&dir)?;
            // SAFETY: `c` is a NUL-terminated CString alive for the call.
            if unsafe { libc::mkdir(c.as_ptr(), 0o755) } != 0 {
                bail!("mkdir {}: {}", dir.display(), errno());
            }
            group.dirs.push(c);
            group.fds.push(open_procs(&dir).with_context(|| format!("opening {}/cgroup.procs", dir.display()))?);
        }
        let raw: Vec<libc::c_int> = group.fds.iter().map(|f| f.as_raw_fd()).collect();
        Child::spawn(|| join_body(&raw))?.wait("joining a fresh cgroup")?;
        group.remove()
    }

    /// Have a child join this thread's pooled group and exit.
    fn reuse_cycle(&self, t: usize) -> Result<()> {
        let raw = &self.pool_raw[t];
        Child::spawn(|| join_body(raw))?.wait("joining a pooled cgroup")
    }

    pub(super) fn cleanup(mut self) -> Result<()> {
        self.cleaned = true;
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        self.pool_raw.clear();
        self.pool_fds.clear();
        self.layout.remove_tree(CGROUP_PARENT).context("removing the benchmark cgroups")
    }
}

impl Drop for CgroupBench {
    fn drop(&mut self) {
        if !self.cleaned {
            if let Err(e) = self.teardown() {
                eprintln!("primitives: {e:#}");
            }
        }
    }
}

/// A fresh group of one create cycle: removed on drop if the cycle did not get to it.
struct FreshGroup {
    dirs: Vec<CString>,
    fds: Vec<OwnedFd>,
}

impl FreshGroup {
    fn remove(mut self) -> Result<()> {
        self.fds.clear();
        let dirs = std::mem::take(&mut self.dirs);
        for d in &dirs {
            rmdir_retry(d).with_context(|| format!("rmdir {}", d.to_string_lossy()))?;
        }
        Ok(())
    }
}

impl Drop for FreshGroup {
    fn drop(&mut self) {
        self.fds.clear();
        for d in &self.dirs {
            let _ = rmdir_retry(d);
        }
    }
}

/// rmdir, retrying briefly while the kernel still counts an exited child in the group.
fn rmdir_retry(dir: &CString) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        // SAFETY: `dir` is a borrowed NUL-terminated CString, alive for the call.
        if unsafe { libc::rmdir(dir.as_ptr()) } == 0 {
            return Ok(());
        }
        let e = errno();
        match e.raw_os_error() {
            Some(libc::ENOENT) => return Ok(()),
            Some(libc::EBUSY) if Instant::now() < deadline => std::thread::yield_now(),
            _ => return Err(e),
        }
    }
}

pub(super) fn cgroups(bench: &CgroupBench, conc: &[usize], secs: f64) -> Result<Value> {
    let mut create = Map::new();
    let mut reuse = Map::new();
    for &c in conc {
        let r = rate(c, secs, |t, i| bench.create_cycle(t, i))?;
        eprintln!("primitives: cgroups create c{c}: {r:>9.0} create+join+exit+remove/s");
        create.insert(c_key(c), json!(round(r, 1)));
        let r = rate(c, secs, |t, _| bench.reuse_cycle(t))?;
        eprintln!("primitives: cgroups reuse  c{c}: {r:>9.0} join+exit/s");
        reuse.insert(c_key(c), json!(round(r, 1)));
    }
    Ok(json!({
        "hierarchies": bench.hierarchy_names(),
        "create": create,
        "reuse": reuse,
    }))
}
