//! `sprout bench primitives`: SOCK section 2 (figures 1-5) reproduced on this kernel.
//!
//! Every measurement is a rate (operations per second) at several concurrency levels (threads,
//! each driving its own operations or its own forked children), made with direct system calls:
//!
//! 1. Figure 1, storage: mount + unmount of a bind mount against an overlay mount (overlayfs
//!    stands in for AUFS) inside a private mount tree under `work_dir`.
//! 2. Figure 2, mount-namespace scalability: forked children that unshare(CLONE_NEWNS) and exit,
//!    as the number of mounts in the namespace being copied grows.
//! 3. Figures 3-4, namespaces: fork + unshare(flags) + exit + reap for several flag sets.
//! 4. Figure 5, cgroups: fresh cgroup per child (create, join, exit, remove) against a pool of
//!    cgroups made ahead (join, exit).
//! 5. The same for networks: a lambda's network namespace made as the worker makes one (veth,
//!    addresses, routes) and deleted, against a child joining one made ahead.
//!
//! Forked children run raw system calls only (no allocation, no locks), so forking from the
//! measuring threads of this multithreaded process is safe. The measurements need root, and
//! they reap their own children with `waitpid(pid)`: do not run them next to a `waitpid(-1)`
//! reaper. Every mount, child and cgroup is removed again, on errors and panics too (guards
//! whose `Drop` cleans up); leftovers of a killed run are removed at the start of the next.

use std::ffi::CString;
use std::fmt::Write as _;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Map, Value};
use sprout_sandbox::cgroup::{Layout, Version};
use sprout_sandbox::mounts;

use crate::report::{self, get};

/// The parent cgroup (in every hierarchy used) of all groups the benchmark makes.
pub const CGROUP_PARENT: &str = "sprout-bench-primitives";

/// Controllers whose hierarchies a benchmark cgroup joins (on cgroup v1).
const CGROUP_CONTROLLERS: [&str; 4] = ["memory", "pids", "cpu", "freezer"];

/// What to measure and where.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where primitives.{json,md,png} go (bench/results).
    pub out_dir: PathBuf,
    /// Scratch directory for the private mount tree (bind-mounted onto itself).
    pub work_dir: PathBuf,
    /// How long each point (one measurement at one concurrency) runs.
    pub seconds_per_point: f64,
    /// Numbers of concurrent threads (each with its own mounts or children).
    pub concurrency: Vec<usize>,
    /// A fast smoke run: only the lowest and highest concurrency, fewer mount counts,
    /// at most 0.3 s per point.
    pub quick: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            out_dir: report::bench_dir().join("results"),
            work_dir: PathBuf::from("/tmp/sprout-primitives"),
            seconds_per_point: 1.0,
            concurrency: vec![1, 2, 4, 8],
            quick: false,
        }
    }
}

/// Extra mounts (beyond the host's) in figure 2, full and quick runs.
const MOUNT_COUNTS: [usize; 4] = [0, 250, 1000, 4000];
const MOUNT_COUNTS_QUICK: [usize; 3] = [0, 250, 1000];

/// Namespace flag sets of figures 3-4, in the order measured (network last: its teardown
/// runs on after the children are reaped).
const NAMESPACE_SETS: [(&str, libc::c_int); 9] = [
    ("none", 0),
    ("uts", libc::CLONE_NEWUTS),
    ("ipc", libc::CLONE_NEWIPC),
    ("pid", libc::CLONE_NEWPID),
    ("mnt", libc::CLONE_NEWNS),
    ("sock", libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS),
    ("no_net", libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWNS),
    ("net", libc::CLONE_NEWNET),
    ("all", libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWNS | libc::CLONE_NEWNET),
];

/// Run every measurement, write primitives.{json,md,png} under `opts.out_dir` and return the
/// JSON.
pub fn run(opts: &Options) -> Result<Value> {
    // SAFETY: geteuid takes no arguments and always succeeds.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the primitives benchmark mounts, unshares and makes cgroups: run it as root");
    }
    let started = Instant::now();
    let mut conc: Vec<usize> = opts.concurrency.iter().copied().filter(|&c| c > 0).collect();
    conc.sort_unstable();
    conc.dedup();
    if conc.is_empty() {
        conc.push(1);
    }
    if opts.quick && conc.len() > 2 {
        conc = vec![conc[0], *conc.last().unwrap()];
    }
    let secs = if opts.quick { opts.seconds_per_point.min(0.3) } else { opts.seconds_per_point }.max(0.01);
    let cmax = *conc.last().unwrap();
    let counts: &[usize] = if opts.quick { &MOUNT_COUNTS_QUICK } else { &MOUNT_COUNTS };
    let machine = report::machine();
    let kernel = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    eprintln!("primitives: {machine}");
    eprintln!("primitives: concurrency {conc:?}, {secs} s per point");

    let load_start = loadavg();
    let mut notes: Vec<String> = vec![
        format!(
            "Each rate counts completed operations per second of wall-clock time, summed over all \
             threads; a point runs in {ROUNDS} rounds (one if shorter than 0.3 s) that each run to \
             a deadline and wait for the operations in flight, and its rate is their median. \
             Other load on the machine lowers the rates: loadavg_start is /proc/loadavg before \
             the run (later readings would count the benchmark's own threads)."
        ),
        "Forked children run raw system calls only (unshare, write, _exit); the parent reaps each \
         with waitpid(pid) before counting it."
            .into(),
    ];

    // Figures 1 and 2, inside one private mount tree.
    let (storage, mount_ns) = {
        let mut tree = MountTree::setup(&opts.work_dir, cmax)?;
        let storage = storage(&tree, &conc, secs)?;
        let mount_ns = mount_ns(&mut tree, counts, &[conc[0], cmax], secs)?;
        tree.cleanup()?;
        (storage, mount_ns)
    };
    notes.push(format!(
        "storage: overlayfs stands in for AUFS (not in this kernel). overlay = a container-style \
             writable overlay: lowerdir with 200 files, a per-thread upperdir and workdir on the \
             work dir's file system ({}); overlay_ro = two read-only lower layers, no upper. Each \
             op is mount(2) onto the thread's own target directory then umount2(target, 0), a \
             synchronous unmount (a writable overlay syncs its upper file system at unmount).",
        storage["work_dir_fs"].as_str().unwrap_or("?")
    ));
    notes.push(format!(
        "mount_ns: each op forks a child that unshares CLONE_NEWNS (copying every mount of this \
         namespace: {} host/tree mounts plus the extra bind mounts of the x-axis) and exits; the \
         copy is torn down at exit, before the child can be reaped.",
        mount_ns["base_mounts"]
    ));

    // Figures 3-4.
    let (namespaces, ns_notes) = namespaces(&conc, secs, opts.quick)?;
    notes.extend(ns_notes);

    // Figure 5.
    let cgroups = {
        let bench = CgroupBench::setup(cmax)?;
        let result = cgroups(&bench, &conc, secs);
        bench.cleanup()?;
        result?
    };
    notes.push(format!(
        "cgroups: hierarchies {}; no limits are written. create = mkdir a fresh group in each \
         hierarchy, open its cgroup.procs, fork a child that writes \"0\" to each (joining), reap \
         it, rmdir the groups; reuse = the same child joining a per-thread group of a pool made \
         ahead, whose cgroup.procs descriptors stay open. Parent group {CGROUP_PARENT}, removed at \
         the end.",
        cgroups["hierarchies"].as_array().map(|a| a.len()).unwrap_or(0)
    ));

    // What the network pool saves a sandbox: making a lambda's network against joining one.
    let network = network(&opts.work_dir, &conc, secs)?;
    notes.push(
        "network: make = a network namespace as the worker makes one (crates/sandbox/src/network): \
         unshared by the first process of `ip -batch`, a veth pair with one end inside, addresses, \
         permanent neighbours and routes on both sides, then deleted (its link, and its descriptor \
         closed); join = a forked child that setns(2)s into a namespace made ahead and exits, as a \
         handler does in the fork protocol. Each thread has a namespace (a slot of a block claimed \
         for the benchmark) of its own."
            .into(),
    );

    let ratios_max = ratios(&storage, &mount_ns, &namespaces, &cgroups, &network, cmax, conc[0]);
    let ratios_c1 = ratios(&storage, &mount_ns, &namespaces, &cgroups, &network, conc[0], conc[0]);
    let total = started.elapsed().as_secs_f64();
    notes.push(format!(
        "ratios are taken at the highest concurrency (c{cmax}), ratios_c1 at c{}; mount_ns \
         ratios compare 0 against the most extra mounts at the lowest concurrency.",
        conc[0]
    ));

    let json = json!({
        "machine": machine,
        "kernel": kernel,
        "seconds_per_point": secs,
        "concurrency": conc,
        "quick": opts.quick,
        "storage": storage,
        "mount_ns": mount_ns,
        "namespaces": namespaces,
        "cgroups": cgroups,
        "network": network,
        "ratios": ratios_max,
        "ratios_c1": ratios_c1,
        "total_seconds": round(total, 1),
        "loadavg_start": load_start,
        "notes": notes,
    });
    let markdown = markdown(&json, &conc);
    report::write(&opts.out_dir, "primitives", &json, &markdown, "plot_primitives.py")?;
    eprintln!("primitives: done in {total:.1} s, results in {}", opts.out_dir.display());
    Ok(json)
}

// ---------------------------------------------------------------------------------------------
// The measuring loop.

/// Rounds a point is split into; its rate is their median, which shrugs off a burst of
/// other activity on the machine.
const ROUNDS: usize = 3;

/// Run `op(thread, iteration)` in a loop on `threads` threads for `secs` seconds in all;
/// completed operations per second, the median of [`ROUNDS`] rounds (one when `secs` is
/// short). The first error (or panic) of any thread stops them all.
fn rate<F>(threads: usize, secs: f64, op: F) -> Result<f64>
where
    F: Fn(usize, u64) -> Result<()> + Sync,
{
    let rounds = if secs >= 0.3 { ROUNDS } else { 1 };
    let mut rates = Vec::with_capacity(rounds);
    let mut base = 0u64;
    for _ in 0..rounds {
        let (r, n) = rate_round(threads, secs / rounds as f64, base, &op)?;
        base += n;
        rates.push(r);
    }
    rates.sort_by(f64::total_cmp);
    Ok(rates[rates.len() / 2])
}

/// One round of [`rate`]: (operations per second, operations done). Iteration numbers start
/// at `base` so they stay unique across rounds.
fn rate_round<F>(threads: usize, secs: f64, base: u64, op: &F) -> Result<(f64, u64)>
where
    F: Fn(usize, u64) -> Result<()> + Sync,
{
    let barrier = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let deadline = std::sync::OnceLock::<Instant>::new();
    let (start, outcomes) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, stop, done, deadline) = (&barrier, &stop, &done, &deadline);
                s.spawn(move || -> Result<()> {
                    barrier.wait();
                    let deadline = *deadline.wait();
                    let mut i = base;
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        if let Err(e) = op(t, i) {
                            stop.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        i += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        let start = Instant::now();
        let _ = deadline.set(start + Duration::from_secs_f64(secs));
        barrier.wait();
        let outcomes: Vec<Result<()>> =
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a measuring thread panicked")))).collect();
        (start, outcomes)
    });
    let elapsed = start.elapsed().as_secs_f64();
    for o in outcomes {
        o?;
    }
    let n = done.load(Ordering::Relaxed);
    Ok((n as f64 / elapsed, n))
}

/// /proc/loadavg's three load averages.
fn loadavg() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().take(3).filter_map(|x| x.parse().ok()).collect()
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

fn c_key(c: usize) -> String {
    format!("c{c}")
}

fn errno() -> io::Error {
    io::Error::last_os_error()
}

fn cstr(path: &Path) -> io::Result<CString> {
    mounts::cpath(path)
}

// ---------------------------------------------------------------------------------------------
// Forked children.

/// A forked child; killed and reaped on drop unless [`Child::wait`] reaped it.
struct Child {
    pid: libc::pid_t,
    reaped: bool,
}

impl Child {
    /// Fork a child that runs `body` (raw system calls only: no allocation, no locks) and
    /// exits with its return value.
    fn spawn(body: impl FnOnce() -> libc::c_int) -> io::Result<Child> {
        // SAFETY: the child runs only `body`, which callers keep to raw system calls on data made before
        // the fork (no allocation, locks or panics), then _exit; the parent only keeps the pid.
        match unsafe { libc::fork() } {
            -1 => Err(errno()),
            0 => {
                let code = body();
                // SAFETY: _exit takes an integer and never returns; it ends the forked child without running
                // the destructors or atexit handlers copied from the parent.
                unsafe { libc::_exit(code) }
            }
            pid => Ok(Child { pid, reaped: false }),
        }
    }

    fn reap(&mut self) -> io::Result<libc::c_int> {
        let mut status = 0;
        loop {
            // SAFETY: `status` is a live c_int that waitpid may write.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                self.reaped = true;
                return Ok(status);
            }
            let e = errno();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ECHILD) => {
                    // Somebody else reaped it (a waitpid(-1) reaper): it is gone all the same.
                    self.reaped = true;
                    return Ok(0);
                }
                _ => return Err(e),
            }
        }
    }

    /// Reap the child; an error when it did not exit with 0 (its exit code is an errno).
    fn wait(mut self, what: &str) -> Result<()> {
        let status = self.reap()?;
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            return Ok(());
        }
        if libc::WIFEXITED(status) {
            bail!("{what} failed in the child: {}", io::Error::from_raw_os_error(libc::WEXITSTATUS(status)));
        }
        bail!("{what}: child ended with status {status:#x}");
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: kill takes two integers and touches no memory of ours; `self.pid` is our child,
            // which we have not reaped.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = self.reap();
        }
    }
}

/// The current errno as an exit code (never 0).
fn errno_code() -> libc::c_int {
    // SAFETY: __errno_location returns a valid, aligned pointer to this thread's errno, which
    // lives as long as the thread.
    match unsafe { *libc::__errno_location() } {
        0 => 255,
        e => e.min(254),
    }
}

/// Child body: unshare(flags) and report.
fn unshare_body(flags: libc::c_int) -> libc::c_int {
    if flags == 0 {
        return 0;
    }
    // SAFETY: unshare takes an integer flag set and touches no memory of ours.
    if unsafe { libc::syscall(libc::SYS_unshare, flags as libc::c_long) } == 0 {
        0
    } else {
        errno_code()
    }
}

/// Fork a child that unshares `flags` and exits; reap it.
fn churn_once(flags: libc::c_int) -> Result<()> {
    Child::spawn(|| unshare_body(flags))?.wait("unshare")
}

// ---------------------------------------------------------------------------------------------
// Figures 1 and 2: the private mount tree.

/// `work_dir` bound onto itself and made rprivate, holding a lower directory with files,
/// per-thread mount targets and overlay upper/work directories, and the extra mounts of
/// figure 2 (under `extra/`, itself a mount so one lazy unmount drops them all).
struct MountTree {
    root: PathBuf,
    created_root: bool,
    lower: CString,
    bind_targets: Vec<CString>,
    overlay_targets: Vec<CString>,
    overlay_opts: Vec<CString>,
    overlay_ro_targets: Vec<CString>,
    overlay_ro_opts: CString,
    extra: PathBuf,
    extra_mounted: bool,
    extra_count: usize,
    cleaned: bool,
}

/// Subdirectories of the work dir that the benchmark creates (and removes).
const TREE_DIRS: [&str; 5] = ["lower", "lower2", "targets", "overlay", "extra"];

impl MountTree {
    fn setup(work_dir: &Path, threads: usize) -> Result<MountTree> {
        let root = std::path::absolute(work_dir).context("work_dir")?;
        // Leftovers of a run that was killed.
        if !mounts::mounts_under(&root)?.is_empty() {
            eprintln!("primitives: removing mounts left under {} by an earlier run", root.display());
            mounts::detach_all_under(&root)?;
        }
        let created_root = !root.exists();
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let mut tree = MountTree {
            lower: cstr(&root.join("lower"))?,
            extra: root.join("extra"),
            root,
            created_root,
            bind_targets: Vec::new(),
            overlay_targets: Vec::new(),
            overlay_opts: Vec::new(),
            overlay_ro_targets: Vec::new(),
            overlay_ro_opts: CString::default(),
            extra_mounted: false,
            extra_count: 0,
            cleaned: false,
        };
        // From here on, Drop undoes whatever was done.
        tree.remove_dirs()?;
        mounts::bind(&tree.root, &tree.root, false)?;
        mounts::make_rprivate(&tree.root)?;

        let lower = tree.root.join("lower");
        for d in 0..10 {
            let dir = lower.join(format!("d{d}"));
            std::fs::create_dir_all(&dir)?;
            for f in 0..20 {
                std::fs::write(dir.join(format!("f{f}.txt")), format!("file {d}/{f}\n"))?;
            }
        }
        // A second read-only layer for the overlay without an upper layer.
        let lower2 = tree.root.join("lower2");
        std::fs::create_dir_all(lower2.join("d0"))?;
        for f in 0..20 {
            std::fs::write(lower2.join("d0").join(format!("g{f}.txt")), format!("layer 2 file {f}\n"))?;
        }
        tree.overlay_ro_opts = CString::new(format!("lowerdir={}:{}", lower2.display(), lower.display()))?;
        for t in 0..threads {
            let target = tree.root.join("targets").join(format!("ro-{t}"));
            std::fs::create_dir_all(&target)?;
            tree.overlay_ro_targets.push(cstr(&target)?);
            let target = tree.root.join("targets").join(format!("bind-{t}"));
            std::fs::create_dir_all(&target)?;
            tree.bind_targets.push(cstr(&target)?);
            let base = tree.root.join("overlay").join(format!("t{t}"));
            let (merged, upper, work) = (base.join("merged"), base.join("upper"), base.join("work"));
            for d in [&merged, &upper, &work] {
                std::fs::create_dir_all(d)?;
            }
            tree.overlay_targets.push(cstr(&merged)?);
            tree.overlay_opts.push(CString::new(format!(
                "lowerdir={},upperdir={},workdir={}",
                lower.display(),
                upper.display(),
                work.display()
            ))?);
        }
        std::fs::create_dir_all(&tree.extra)?;
        mounts::bind(&tree.extra, &tree.extra, false)?;
        tree.extra_mounted = true;
        Ok(tree)
    }

    fn bind_cycle(&self, t: usize) -> Result<()> {
        let target = &self.bind_targets[t];
        // SAFETY: `self.lower` and `target` are NUL-terminated CStrings owned by `self`, alive for the
        // call; a null type and data are allowed with MS_BIND.
        let r = unsafe { libc::mount(self.lower.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
        if r != 0 {
            bail!("bind mount: {}", errno());
        }
        // SAFETY: `target` is a NUL-terminated CString owned by `self`, alive for the call.
        if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
            bail!("unmounting a bind mount: {}", errno());
        }
        Ok(())
    }

    /// Mount + unmount an overlay: writable (a per-thread upper layer) or read-only (two
    /// lower layers, no upper).
    fn overlay_cycle(&self, t: usize, writable: bool) -> Result<()> {
        let (target, opts) =
            if writable { (&self.overlay_targets[t], &self.overlay_opts[t]) } else { (&self.overlay_ro_targets[t], &self.overlay_ro_opts) };
        // SAFETY: source and type are C string literals; `target` and `opts` (which overlay reads as a
        // NUL-terminated string) are CStrings owned by `self`, alive for the call.
        let r = unsafe { libc::mount(c"overlay".as_ptr(), target.as_ptr(), c"overlay".as_ptr(), 0, opts.as_ptr().cast()) };
        if r != 0 {
            bail!("overlay mount: {}", errno());
        }
        // SAFETY: `target` is a NUL-terminated CString owned by `self`, alive for the call.
        if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
            bail!("unmounting an overlay: {}", errno());
        }
        Ok(())
    }

    /// Grow the extra bind mounts under `extra/` to `n`.
    fn grow_extra(&mut self, n: usize) -> Result<()> {
        while self.extra_count < n {
            let dir = self.extra.join(format!("m{}", self.extra_count));
            std::fs::create_dir_all(&dir)?;
            let target = cstr(&dir)?;
            // SAFETY: `self.lower` and the local `target` are NUL-terminated CStrings alive for the call;
            // a null type and data are allowed with MS_BIND.
            let r = unsafe { libc::mount(self.lower.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
            if r != 0 {
                bail!("extra bind mount {}: {}", dir.display(), errno());
            }
            self.extra_count += 1;
        }
        Ok(())
    }

    /// Unmount the whole tree and remove the directories made; report what failed.
    fn cleanup(mut self) -> Result<()> {
        self.cleaned = true;
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        // One lazy unmount of the root drops every mount below it; then make sure.
        mounts::detach(&self.root)?;
        let left = mounts::mounts_under(&self.root)?;
        if !left.is_empty() {
            mounts::detach_all_under(&self.root)?;
        }
        self.extra_mounted = false;
        self.extra_count = 0;
        if !mounts::mounts_under(&self.root)?.is_empty() {
            bail!("mounts remain under {}", self.root.display());
        }
        self.remove_dirs()?;
        if self.created_root {
            let _ = std::fs::remove_dir(&self.root);
        }
        Ok(())
    }

    /// Remove the benchmark's directories, only when nothing is mounted below the root (a
    /// recursive delete through a bind mount would delete its source).
    fn remove_dirs(&self) -> Result<()> {
        if !mounts::mounts_under(&self.root)?.iter().all(|m| m == &self.root) {
            bail!("refusing to delete under {}: mounts remain", self.root.display());
        }
        for d in TREE_DIRS {
            let p = self.root.join(d);
            if p.exists() {
                std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
            }
        }
        Ok(())
    }
}

impl Drop for MountTree {
    fn drop(&mut self) {
        if !self.cleaned {
            if let Err(e) = self.teardown() {
                eprintln!("primitives: cleaning up {}: {e:#}", self.root.display());
            }
        }
    }
}

fn storage(tree: &MountTree, conc: &[usize], secs: f64) -> Result<Value> {
    let mut bind = Map::new();
    let mut overlay = Map::new();
    let mut overlay_ro = Map::new();
    for &c in conc {
        let r = rate(c, secs, |t, _| tree.bind_cycle(t))?;
        eprintln!("primitives: storage bind       c{c}: {r:>9.0} mount+unmount/s");
        bind.insert(c_key(c), json!(round(r, 1)));
        let r = rate(c, secs, |t, _| tree.overlay_cycle(t, true))?;
        eprintln!("primitives: storage overlay    c{c}: {r:>9.0} mount+unmount/s");
        overlay.insert(c_key(c), json!(round(r, 1)));
        let r = rate(c, secs, |t, _| tree.overlay_cycle(t, false))?;
        eprintln!("primitives: storage overlay_ro c{c}: {r:>9.0} mount+unmount/s");
        overlay_ro.insert(c_key(c), json!(round(r, 1)));
    }
    Ok(json!({
        "bind": bind,
        "overlay": overlay,
        "overlay_ro": overlay_ro,
        "work_dir_fs": fs_type(&tree.root),
    }))
}

/// The file system type of `path` (where the overlay's upper layer lives).
fn fs_type(path: &Path) -> String {
    let Ok(c) = cstr(path) else {
        return "unknown".into();
    };
    // SAFETY: statfs is plain integer fields, for which all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated CString alive for the call, and `st` is a live statfs for
    // the kernel to fill.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "unknown".into();
    }
    match st.f_type as u64 {
        0xEF53 => "ext4".into(),
        0x0102_1994 => "tmpfs".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x794C_7630 => "overlay".into(),
        other => format!("{other:#x}"),
    }
}

fn count_mounts() -> usize {
    sprout_sandbox::mountinfo::read().map(|m| m.len()).unwrap_or(0)
}

fn mount_ns(tree: &mut MountTree, counts: &[usize], conc: &[usize], secs: f64) -> Result<Value> {
    let base_mounts = count_mounts();
    let mut series: Vec<(usize, Vec<Value>)> = conc.iter().map(|&c| (c, Vec::new())).collect();
    series.dedup_by_key(|(c, _)| *c);
    for &n in counts {
        let t0 = Instant::now();
        tree.grow_extra(n)?;
        if n > 0 {
            eprintln!(
                "primitives: mount_ns: {} extra mounts ({} in the namespace), made in {:.2} s",
                n,
                count_mounts(),
                t0.elapsed().as_secs_f64()
            );
        }
        for (c, rates) in series.iter_mut() {
            let r = rate(*c, secs, |_, _| churn_once(libc::CLONE_NEWNS))?;
            eprintln!("primitives: mount_ns {n:>5} mounts c{c}: {r:>9.0} unshare(NEWNS)+exit/s");
            rates.push(json!(round(r, 1)));
        }
    }
    let mut out = json!({ "mounts": counts, "base_mounts": base_mounts });
    for (c, rates) in series {
        out[c_key(c)] = Value::Array(rates);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Figures 3-4: namespaces.

fn namespaces(conc: &[usize], secs: f64, quick: bool) -> Result<(Value, Vec<String>)> {
    let mut out = Map::new();
    let settle = Duration::from_secs_f64(if quick { 0.2 } else { 0.5 });
    for (name, flags) in NAMESPACE_SETS {
        let mut rates = Map::new();
        for &c in conc {
            let r = rate(c, secs, |_, _| churn_once(flags))?;
            eprintln!("primitives: namespaces {name:<6} c{c}: {r:>9.0} fork+unshare+exit/s");
            rates.insert(c_key(c), json!(round(r, 1)));
            if flags & libc::CLONE_NEWNET != 0 {
                // Let the kernel's cleanup_net work drain before the next point.
                std::thread::sleep(settle);
            }
        }
        out.insert(name.to_string(), Value::Object(rates));
    }
    let notes = vec![
        "namespaces: each op forks a child that calls unshare(flags) and exits; the parent reaps it \
         with waitpid. none = plain fork+exit+wait; sock = pid|ipc|uts (what Sprout uses); \
         no_net = pid|ipc|uts|mnt; all = pid|ipc|uts|mnt|net. unshare(CLONE_NEWPID) creates the \
         PID namespace for the child's future children (the child itself stays in ours)."
            .into(),
        format!(
            "namespaces: teardown of net, mnt and ipc namespaces is partly asynchronous in the \
             kernel (net: the cleanup_net workqueue, batched, under pernet_ops_rwsem; ipc: a \
             free_ipc work item after an RCU grace period; mnt: mntput of the copied mounts is \
             deferred). Rates count children until they are reaped, so work left to those \
             workers is not in them; after each point with a network namespace the benchmark \
             pauses {:.1} s to let it drain.",
            settle.as_secs_f64()
        ),
    ];
    Ok((Value::Object(out), notes))
}

// ---------------------------------------------------------------------------------------------
// Figure 5: cgroups.

/// The hierarchies used, the parent group in each, and a pool of pre-made groups (one per
/// thread) with their cgroup.procs open. Drop removes the parent group and all below it.
struct CgroupBench {
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
    fn setup(threads: usize) -> Result<CgroupBench> {
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

    fn cleanup(mut self) -> Result<()> {
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

fn cgroups(bench: &CgroupBench, conc: &[usize], secs: f64) -> Result<Value> {
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

// ---------------------------------------------------------------------------------------------
// The network pool: making a configured network namespace against joining one.

fn network(work_dir: &Path, conc: &[usize], secs: f64) -> Result<Value> {
    use sprout_sandbox::network::{host, namespace};
    let tag = "b0b0b0";
    let dir = work_dir.join("network");
    std::fs::create_dir_all(&dir)?;
    host::release(&dir, tag);
    let (block, _) = host::claim(&dir, tag, None, std::process::id(), &[], 64).context("claiming a block for the benchmark")?;
    let result = (|| {
        let cmax = *conc.last().unwrap();
        let pooled: Vec<namespace::Namespace> =
            (0..cmax).map(|t| namespace::create(tag, &block, (cmax + t) as u32, None)).collect::<io::Result<_>>()?;
        let mut make = Map::new();
        let mut join = Map::new();
        for &c in conc {
            let r = rate(c, secs, |t, _| {
                namespace::destroy(namespace::create(tag, &block, t as u32, None)?);
                Ok(())
            })?;
            eprintln!("primitives: network make c{c}: {r:>9.0} make+delete/s");
            make.insert(c_key(c), json!(round(r, 1)));
            let r = rate(c, secs, |t, _| {
                let fd = pooled[t].fd();
                // SAFETY: the child body makes only setns (integers, no memory of ours) and reads errno, as
                // Child::spawn requires; `fd` is inherited from `pooled[t]`, which stays open until after `rate`.
                Child::spawn(|| if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } == 0 { 0 } else { errno_code() })?
                    .wait("joining a pooled network namespace")
            })?;
            eprintln!("primitives: network join c{c}: {r:>9.0} join+exit/s");
            join.insert(c_key(c), json!(round(r, 1)));
        }
        for ns in pooled {
            namespace::destroy(ns);
        }
        anyhow::Ok(json!({"block": block.to_string(), "make": make, "join": join}))
    })();
    host::release(&dir, tag);
    result
}

// ---------------------------------------------------------------------------------------------
// Summaries.

fn ratio(a: Option<f64>, b: Option<f64>) -> Value {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => json!(round(a / b, 2)),
        _ => Value::Null,
    }
}

/// Ratios of rates at concurrency `c`; the mount-namespace one at `c_low` (the lowest).
fn ratios(storage: &Value, mount_ns: &Value, ns: &Value, cg: &Value, net: &Value, c: usize, c_low: usize) -> Value {
    let k = c_key(c);
    let ns_at = |name: &str| get(ns, &[name, &k]);
    let first_c1 = mount_ns.get(c_key(c_low)).and_then(Value::as_array).cloned().unwrap_or_default();
    json!({
        "bind_over_overlay": ratio(get(storage, &["bind", &k]), get(storage, &["overlay", &k])),
        "bind_over_overlay_ro": ratio(get(storage, &["bind", &k]), get(storage, &["overlay_ro", &k])),
        "reuse_over_create": ratio(get(cg, &["reuse", &k]), get(cg, &["create", &k])),
        "netns_join_over_make": ratio(get(net, &["join", &k]), get(net, &["make", &k])),
        "sock_over_all": ratio(ns_at("sock"), ns_at("all")),
        "no_net_over_net": ratio(ns_at("no_net"), ns_at("all")),
        "none_over_net": ratio(ns_at("none"), ns_at("net")),
        "none_over_sock": ratio(ns_at("none"), ns_at("sock")),
        "none_over_mnt": ratio(ns_at("none"), ns_at("mnt")),
        "mount_ns_0_over_max_mounts": ratio(
            first_c1.first().and_then(Value::as_f64),
            first_c1.last().and_then(Value::as_f64)
        ),
    })
}

fn markdown(json: &Value, conc: &[usize]) -> String {
    let (c1, cn) = (conc[0], *conc.last().unwrap());
    let (k1, kn) = (c_key(c1), c_key(cn));
    let fmt = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "–".into());
    let mut md = String::new();
    let load = json["loadavg_start"][0].as_f64().map(|x| format!("{x:.2}")).unwrap_or_else(|| "?".into());
    let _ = writeln!(
        md,
        "Machine: {}; {} s per point; load average {load} before the run.\n",
        json["machine"].as_str().unwrap_or(""),
        json["seconds_per_point"],
    );
    let _ = writeln!(md, "| measurement (ops/s) | c={c1} | c={cn} |");
    let _ = writeln!(md, "|---|---:|---:|");
    let mut row = |label: &str, a: Option<f64>, b: Option<f64>| {
        let _ = writeln!(md, "| {label} | {} | {} |", fmt(a), fmt(b));
    };
    for (key, label) in [
        ("bind", "bind mount + unmount"),
        ("overlay", "overlay (writable) mount + unmount"),
        ("overlay_ro", "overlay (read-only) mount + unmount"),
    ] {
        row(label, get(json, &["storage", key, &k1]), get(json, &["storage", key, &kn]));
    }
    let mns = &json["mount_ns"];
    if let Some(counts) = mns["mounts"].as_array() {
        for (i, n) in counts.iter().enumerate() {
            let at = |k: &str| mns[k].get(i).and_then(Value::as_f64);
            row(&format!("unshare(mnt) churn, {n} extra mounts"), at(&k1), at(&kn));
        }
    }
    for (name, _) in NAMESPACE_SETS {
        let label = match name {
            "none" => "fork + exit (no namespace)".to_string(),
            "sock" => "unshare pid+ipc+uts (sock)".to_string(),
            "no_net" => "unshare pid+ipc+uts+mnt".to_string(),
            "all" => "unshare pid+ipc+uts+mnt+net (all)".to_string(),
            other => format!("unshare {other}"),
        };
        row(&label, get(json, &["namespaces", name, &k1]), get(json, &["namespaces", name, &kn]));
    }
    row("cgroup create + join + remove", get(json, &["cgroups", "create", &k1]), get(json, &["cgroups", "create", &kn]));
    row("cgroup reuse (join only)", get(json, &["cgroups", "reuse", &k1]), get(json, &["cgroups", "reuse", &kn]));
    row("network namespace made (veth, routes) + deleted", get(json, &["network", "make", &k1]), get(json, &["network", "make", &kn]));
    row("network namespace joined (setns, pooled)", get(json, &["network", "join", &k1]), get(json, &["network", "join", &kn]));
    let r = |k: &str| json["ratios"][k].as_f64().map(|x| format!("{x:.2}×")).unwrap_or_else(|| "–".into());
    let _ = writeln!(
        md,
        "\nRatios at c={cn}: bind/overlay {} (read-only overlay {}), cgroup reuse/create {}, network namespace join/make {}, \
         sock/all namespaces {}, all-but-net/all {}, fork/net {}; unshare(mnt) with 0 / {} extra mounts (c={c1}) {}.",
        r("bind_over_overlay"),
        r("bind_over_overlay_ro"),
        r("reuse_over_create"),
        r("netns_join_over_make"),
        r("sock_over_all"),
        r("no_net_over_net"),
        r("none_over_net"),
        mns["mounts"].as_array().and_then(|a| a.last()).cloned().unwrap_or(Value::Null),
        r("mount_ns_0_over_max_mounts"),
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_counts_operations() {
        let r = rate(2, 0.05, |_, _| Ok(())).unwrap();
        assert!(r > 1000.0, "{r}");
        assert!(rate(2, 0.05, |_, i| if i == 3 { bail!("boom") } else { Ok(()) }).is_err());
    }

    #[test]
    fn ratios_handle_missing_points() {
        let v = ratios(&json!({}), &json!({}), &json!({}), &json!({}), &json!({}), 1, 1);
        assert!(v["bind_over_overlay"].is_null());
    }

    /// Runs the whole benchmark in quick mode (as root): `cargo test -p sprout-bench --
    /// --ignored primitives`.
    #[test]
    #[ignore]
    fn quick_run_leaves_nothing_behind() {
        // SAFETY: geteuid takes no arguments and always succeeds.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let tmp = std::env::temp_dir().join(format!("sprout-primitives-test-{}", std::process::id()));
        let opts = Options {
            out_dir: tmp.join("results"),
            work_dir: tmp.join("work"),
            seconds_per_point: 0.2,
            concurrency: vec![1, 2, 4],
            quick: true,
        };
        let json = run(&opts).unwrap();
        for key in ["storage", "mount_ns", "namespaces", "cgroups", "ratios"] {
            assert!(json.get(key).is_some(), "{key} missing");
        }
        assert!(get(&json, &["namespaces", "none", "c1"]).unwrap() > 0.0);
        assert!(mounts::mounts_under(&tmp).unwrap().is_empty());
        assert!(!Path::new("/sys/fs/cgroup/memory").join(CGROUP_PARENT).exists());
        for f in ["primitives.json", "primitives.md", "primitives.png"] {
            assert!(opts.out_dir.join(f).exists(), "{f}");
        }
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
