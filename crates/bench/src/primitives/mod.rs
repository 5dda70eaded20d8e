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

mod cgroups;
mod child;
mod measure;
mod namespaces;
mod network;
mod storage;
mod summary;
mod sys;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::report;
pub use cgroups::CGROUP_PARENT;
use cgroups::{cgroups, CgroupBench};
use measure::{loadavg, round, ROUNDS};
use namespaces::namespaces;
use network::network;
use storage::{mount_ns, storage, MountTree, MOUNT_COUNTS, MOUNT_COUNTS_QUICK};
use summary::{markdown, ratios};

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

#[cfg(test)]
mod tests {
    use super::measure::rate;
    use super::summary::ratios;
    use super::*;
    use crate::report::get;
    use sprout_sandbox::mounts;
    use std::path::Path;

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
