//! Figures 1 and 2: bind against overlay mounts, and `unshare(CLONE_NEWNS)` as the mounts to
//! copy grow, in a private mount tree under the work dir.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use sprout_sandbox::mounts;

use super::child::churn_once;
use super::measure::{c_key, rate, round};
use super::sys::{cstr, errno};

/// Extra mounts (beyond the host's) in figure 2, full and quick runs.
pub(super) const MOUNT_COUNTS: [usize; 4] = [0, 250, 1000, 4000];
pub(super) const MOUNT_COUNTS_QUICK: [usize; 3] = [0, 250, 1000];

/// `work_dir` bound onto itself and made rprivate, holding a lower directory with files,
/// per-thread mount targets and overlay upper/work directories, and the extra mounts of
/// figure 2 (under `extra/`, itself a mount so one lazy unmount drops them all).
pub(super) struct MountTree {
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
    pub(super) fn setup(work_dir: &Path, threads: usize) -> Result<MountTree> {
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
    pub(super) fn cleanup(mut self) -> Result<()> {
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

pub(super) fn storage(tree: &MountTree, conc: &[usize], secs: f64) -> Result<Value> {
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

pub(super) fn mount_ns(tree: &mut MountTree, counts: &[usize], conc: &[usize], secs: f64) -> Result<Value> {
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
