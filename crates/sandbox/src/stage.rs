//! The stage: the worker's private mount tree from which every sandbox root is stitched.
//!
//! ```text
//! DIR/run                 bound onto itself and made private (nothing propagates in or out)
//! DIR/run/base            the shared base image, read-only, nosuid
//! DIR/run/base/opt/sprout   DIR/runtime (the helper, and the `sprout` package), read-only
//! DIR/run/base/packages     the install cache's installed/ directory, read-only
//! DIR/run/base/<path>       each volume (`sandbox.volumes`): a host directory, nosuid,
//!                           nodev, read-only unless writable
//! DIR/run/code            DIR/registry (lambda code), read-only, nosuid, nodev
//! DIR/run/sb/<slot>/root  one sandbox root: run/base bound recursively, its code at
//!                         /handler, a tmpfs scratch at /host, its own /proc
//! ```
//!
//! A sandbox root therefore costs three mount calls (SOCK stitched four directories; the
//! base and packages come as one recursive bind here), and one lazy unmount removes it.
//! Volumes come along with the base at no cost per sandbox, in lean sandboxes, in the
//! detached copies package Zygotes and their handlers live in (`open_tree` copies the tree
//! recursively), and in runc containers, whose root is run/base bound recursively too.
//!
//! Since a writable volume's files are the host's, `run` is deleted only once nothing is
//! mounted below it any more ([`remove_run`]).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::Doing;
use crate::mounts;

/// The in-sandbox helper and the modules it loads by path from beside it (its ASGI server
/// for ASGI apps only), embedded so the worker binary carries its own runtime: (file name in
/// the runtime directory, contents).
pub const RUNTIME_PY: [(&str, &str); 9] = [
    ("helper.py", include_str!("../../../python/sprout/runtime/helper.py")),
    ("load.py", include_str!("../../../python/sprout/runtime/load.py")),
    ("channel.py", include_str!("../../../python/sprout/runtime/channel.py")),
    ("dispatch.py", include_str!("../../../python/sprout/runtime/dispatch.py")),
    ("asgi.py", include_str!("../../../python/sprout/runtime/asgi.py")),
    ("handler.py", include_str!("../../../python/sprout/runtime/handler.py")),
    ("zygote.py", include_str!("../../../python/sprout/runtime/zygote.py")),
    ("pod.py", include_str!("../../../python/sprout/runtime/pod.py")),
    ("vm.py", include_str!("../../../python/sprout/runtime/vm.py")),
];

/// The Zygote's C provisioning loop (csrc/zygote.c), built by build.rs.
pub const LIBSPROUT_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libsprout.so"));

/// The `sprout` Python package (but for its runtime): (path below python/, contents). Every
/// sandbox finds it at /opt/sprout/python, last on sys.path.
pub const PYTHON_PACKAGE: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/python_package.rs"));

/// Where the helper is inside every sandbox.
pub const HELPER_IN_SANDBOX: &str = "/opt/sprout/helper.py";

/// Size of each tmpfs holding sandbox and Zygote directories (mount points: no data goes there).
const MOUNT_POINTS_TMPFS_MB: u64 = 1;

/// Directories every sandbox root needs as mount points; `init` creates them in the base.
/// `wheels` is where installer sandboxes see a local wheel directory.
pub const BASE_MOUNT_POINTS: [&str; 5] = ["handler", "host", "packages", "opt/sprout", "wheels"];

/// A host directory every sandbox sees at `path` (absolute, checked by the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub host: PathBuf,
    pub path: String,
    pub writable: bool,
}

pub struct Stage {
    pub worker_dir: PathBuf,
    pub run: PathBuf,
    pub base: PathBuf,
    pub code: PathBuf,
    pub registry: PathBuf,
    pub packages: PathBuf,
    pub runtime: PathBuf,
    /// The volumes bound below `base`.
    pub volumes: Vec<Volume>,
}

impl Stage {
    /// The paths of the stage of `worker_dir`, without touching anything.
    pub fn paths(worker_dir: &Path) -> Stage {
        let run = worker_dir.join("run");
        Stage {
            worker_dir: worker_dir.to_path_buf(),
            base: run.join("base"),
            code: run.join("code"),
            run,
            registry: worker_dir.join("registry"),
            packages: worker_dir.join("packages").join("installed"),
            runtime: worker_dir.join("runtime"),
            volumes: Vec::new(),
        }
    }

    /// Build the stage afresh over `base_image`, with the installed packages of the install
    /// cache at `packages`. Leftovers of an earlier run must have been cleaned up first (see
    /// [`crate::cleanup`]).
    pub fn prepare(worker_dir: &Path, base_image: &Path, packages: &Path) -> io::Result<Stage> {
        Stage::prepare_with_volumes(worker_dir, base_image, packages, &[])
    }

    /// [`Stage::prepare`], with `volumes` bound below the base for every sandbox to see.
    /// Their mount points are made in the base image where missing.
    pub fn prepare_with_volumes(worker_dir: &Path, base_image: &Path, packages: &Path, volumes: &[Volume]) -> io::Result<Stage> {
        let mut stage = Stage::paths(worker_dir);
        stage.packages = packages.to_path_buf();
        stage.volumes = volumes.to_vec();
        for point in BASE_MOUNT_POINTS {
            if !base_image.join(point).is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} is not a Sprout base image (no /{point}); run `sprout worker init`", base_image.display()),
                ));
            }
        }
        for dir in [&stage.registry, &stage.packages, &stage.runtime] {
            fs::create_dir_all(dir)?;
        }
        for (name, source) in RUNTIME_PY {
            write_if_changed(&stage.runtime.join(name), source.as_bytes())?;
        }
        write_if_changed(&stage.runtime.join("libsprout.so"), LIBSPROUT_SO)?;
        let python = stage.runtime.join("python");
        if python.exists() {
            fs::remove_dir_all(&python)?; // no module of an older version lingers
        }
        for (path, content) in PYTHON_PACKAGE {
            let file = python.join(path);
            fs::create_dir_all(file.parent().expect("a file in a package"))?;
            fs::write(&file, content)?;
        }

        for volume in volumes {
            mount_point_in_base(base_image, &volume.path).doing(format!("making the volume's mount point {}", volume.path))?;
        }
        if stage.run.exists() {
            remove_run(&stage.run)?;
        }
        fs::create_dir_all(&stage.run)?;
        mounts::bind(&stage.run, &stage.run, false)?;
        mounts::make_rprivate(&stage.run)?;
        for dir in [&stage.base, &stage.code] {
            fs::create_dir_all(dir)?;
        }
        // Sandbox slots and Zygote roots live in memory: each kept sandbox holds its slot, so
        // a cold start next to kept ones makes a new directory (a new package set, a Zygote's),
        // and on ext4 that cost 0.2-0.7 ms of inode search.
        for dir in [stage.slots(), stage.zygotes()] {
            fs::create_dir_all(&dir)?;
            mounts::tmpfs(&dir, MOUNT_POINTS_TMPFS_MB, 0, 0)?;
        }
        // Each source lies outside the private tree and may be shared: make every new mount
        // private before anything is mounted below it.
        let private_ro = |src: &Path, dst: &Path, nodev: bool| -> io::Result<()> {
            mounts::bind(src, dst, false)?;
            mounts::make_rprivate(dst)?;
            mounts::remount_readonly(dst, nodev)
        };
        private_ro(base_image, &stage.base, false)?;
        private_ro(&stage.runtime, &stage.base.join("opt/sprout"), true)?;
        private_ro(&stage.packages, &stage.base.join("packages"), true)?;
        private_ro(&stage.registry, &stage.code, true)?;
        for volume in volumes {
            let dst = stage.base.join(volume.path.trim_start_matches('/'));
            let mounted = mounts::bind(&volume.host, &dst, false)
                .and_then(|()| mounts::make_rprivate(&dst))
                .and_then(|()| mounts::remount_volume(&dst, volume.writable));
            mounted.doing(format!("mounting the volume {} at {}", volume.host.display(), volume.path))?;
        }
        Ok(stage)
    }

    /// Bind the host file `file` read-only over `path` (absolute) in the base every sandbox
    /// root is made from; the base image gets an empty file there to mount on if it has none
    /// (a link or anything but a regular file there is refused).
    pub fn bind_file_in_base(&self, base_image: &Path, file: &Path, path: &str) -> io::Result<()> {
        let rel = path.trim_start_matches('/');
        let in_image = base_image.join(rel);
        match fs::symlink_metadata(&in_image) {
            Ok(m) if m.file_type().is_file() => {}
            Ok(_) => return Err(io::Error::other(format!("{} is not a regular file in the base image", in_image.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(parent) = in_image.parent() {
                    if fs::symlink_metadata(parent).map(|m| !m.is_dir()).unwrap_or(true) {
                        return Err(io::Error::other(format!("{} is not a directory in the base image", parent.display())));
                    }
                }
                fs::write(&in_image, b"")?;
            }
            Err(e) => return Err(e),
        }
        let dst = self.base.join(rel);
        mounts::bind(file, &dst, false)?;
        mounts::remount_readonly(&dst, true)
    }

    /// Root directory of sandbox slot `slot` (created on first use).
    pub fn slot_root(&self, slot: usize) -> io::Result<PathBuf> {
        let root = self.slot_root_path(slot);
        if !root.is_dir() {
            fs::create_dir_all(&root)?;
        }
        Ok(root)
    }

    /// Where slot `slot`'s root is (made or not).
    pub fn slot_root_path(&self, slot: usize) -> PathBuf {
        self.slots().join(slot.to_string()).join("root")
    }

    /// The directory of the sandbox slots (a tmpfs once the stage is prepared).
    fn slots(&self) -> PathBuf {
        self.run.join("sb")
    }

    /// The directory of Zygote `id` (its root is `root` in it).
    pub fn zygote_dir(&self, id: u64) -> PathBuf {
        self.zygotes().join(id.to_string())
    }

    /// The directory of the Zygotes' directories (a tmpfs once the stage is prepared).
    fn zygotes(&self) -> PathBuf {
        self.run.join("zygote")
    }

    /// The read-only view of a code directory under the registry.
    pub fn code_view(&self, code_dir: &Path) -> PathBuf {
        match code_dir.strip_prefix(&self.registry) {
            Ok(rel) => self.code.join(rel),
            Err(_) => code_dir.to_path_buf(),
        }
    }

    /// Stitch a sandbox root: the base (with runtime and packages), the code at /handler
    /// (none for a Zygote), and a tmpfs scratch at /host owned by the sandbox user.
    pub fn stitch(&self, root: &Path, code: Option<&Path>, scratch_mb: u64, uid: u32, gid: u32) -> io::Result<()> {
        mounts::bind(&self.base, root, true)?;
        let result = (|| {
            if let Some(code) = code {
                mounts::bind(&self.code_view(code), &root.join("handler"), false)?;
            }
            let host = root.join("host");
            mounts::tmpfs(&host, scratch_mb, uid, gid)?;
            let tmp = host.join("tmp");
            fs::create_dir(&tmp)?;
            std::os::unix::fs::chown(&tmp, Some(uid), Some(gid))
        })();
        if result.is_err() {
            let _ = mounts::detach(root);
        }
        result
    }

    /// Unmount everything the worker mounted (at shutdown).
    pub fn teardown(&self) -> io::Result<usize> {
        remove_run(&self.run)
    }
}

/// Unmount everything at or below `run`, then delete it; returns how many mounts were
/// removed. Refuses to delete while anything is still mounted there: deleting through a
/// writable volume would delete the host's files.
pub fn remove_run(run: &Path) -> io::Result<usize> {
    let removed = mounts::detach_all_under(run)?;
    let left = mounts::mounts_under(run)?;
    if !left.is_empty() {
        return Err(io::Error::other(format!(
            "{} mounts remain under {} (first {}); not deleting it",
            left.len(),
            run.display(),
            left[0].display()
        )));
    }
    match fs::remove_dir_all(run) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(removed),
    }
}

/// Make the directory `path` (absolute) in the base image for a volume to be mounted on:
/// every part of it a real directory (a symbolic link could lead the mount out of the
/// tree), and the directory itself empty (the volume would hide what it holds).
pub fn mount_point_in_base(base_image: &Path, path: &str) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let refuse = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let mut dir = base_image.to_path_buf();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        dir.push(part);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() => return Err(refuse(format!("{} is a symbolic link in the base image", dir.display()))),
            Ok(m) if !m.is_dir() => return Err(refuse(format!("{} is not a directory in the base image", dir.display()))),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs::DirBuilder::new().mode(0o755).create(&dir)?,
            Err(e) => return Err(e),
        }
    }
    if fs::read_dir(&dir)?.next().is_some() {
        return Err(refuse(format!("{} holds files in the base image, which the volume would hide", dir.display())));
    }
    Ok(())
}

fn write_if_changed(path: &Path, content: &[u8]) -> io::Result<()> {
    if fs::read(path).map(|c| c == content).unwrap_or(false) {
        return Ok(());
    }
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, content)?;
    fs::rename(&tmp, path)
}
