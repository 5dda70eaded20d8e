//! Mount primitives for stitching sandbox roots from bind mounts (SOCK section 4.1).
//!
//! Everything lives under one worker directory that is bind-mounted onto itself and made
//! private, so nothing a sandbox mounts propagates to the host or to other sandboxes, and a
//! single lazy unmount of that directory removes every mount the worker ever made.

use std::ffi::CString;

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::error::{Doing, PlatformError};

/// A failed mount call as an `io::Error` that keeps its errno's kind and the typed error.
fn err(e: nix::Error, what: &'static str, path: &Path) -> io::Error {
    PlatformError::Path { doing: what.into(), path: path.to_path_buf(), error: e.into() }.into()
}

/// Bind `src` onto `dst`. With `recursive`, submounts of `src` come along.
pub fn bind(src: &Path, dst: &Path, recursive: bool) -> io::Result<()> {
    let mut flags = MsFlags::MS_BIND;
    if recursive {
        flags |= MsFlags::MS_REC;
    }
    mount(Some(src), dst, None::<&str>, flags, None::<&str>).map_err(|e| err(e, "bind mount onto", dst))
}

/// Make the bind mount at `path` read-only, nosuid (and nodev when asked).
pub fn remount_readonly(path: &Path, nodev: bool) -> io::Result<()> {
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID;
    if nodev {
        flags |= MsFlags::MS_NODEV;
    }
    mount(None::<&str>, path, None::<&str>, flags, None::<&str>).map_err(|e| err(e, "read-only remount of", path))
}

/// Set the flags of the volume bound at `path`: nosuid and nodev, read-only unless
/// `writable`, and whatever noexec, atime and read-only flags the host's mount of the
/// directory had (a bind inherits them, and a remount would otherwise drop them). A
/// writable volume on a read-only host mount is an error, not a silent widening.
pub fn remount_volume(path: &Path, writable: bool) -> io::Result<()> {
    use nix::sys::statvfs::{statvfs, FsFlags};
    let had = statvfs(path).map_err(|e| err(e, "statvfs", path))?.flags();
    if writable && had.contains(FsFlags::ST_RDONLY) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "it is writable = true, but its host directory is on a read-only mount",
        ));
    }
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if !writable {
        flags |= MsFlags::MS_RDONLY;
    }
    if had.contains(FsFlags::ST_NOEXEC) {
        flags |= MsFlags::MS_NOEXEC;
    }
    if had.contains(FsFlags::ST_NOATIME) {
        flags |= MsFlags::MS_NOATIME;
    } else if had.contains(FsFlags::ST_RELATIME) {
        flags |= MsFlags::MS_RELATIME;
    } else {
        flags |= MsFlags::MS_STRICTATIME;
    }
    if had.contains(FsFlags::ST_NODIRATIME) {
        flags |= MsFlags::MS_NODIRATIME;
    }
    mount(None::<&str>, path, None::<&str>, flags, None::<&str>).map_err(|e| err(e, "remount of", path))
}

/// Bind `src` onto `dst` read-only: a bind followed by a remount, as Linux requires.
pub fn bind_readonly(src: &Path, dst: &Path, nodev: bool) -> io::Result<()> {
    bind(src, dst, false)?;
    remount_readonly(dst, nodev)
}

/// Make the mount at `path` (and everything below it) private: no propagation either way.
pub fn make_rprivate(path: &Path) -> io::Result<()> {
    mount(None::<&str>, path, None::<&str>, MsFlags::MS_PRIVATE | MsFlags::MS_REC, None::<&str>).map_err(|e| err(e, "make private", path))
}

/// A size-limited tmpfs owned by `uid:gid`, nosuid and nodev.
pub fn tmpfs(dst: &Path, size_mb: u64, uid: u32, gid: u32) -> io::Result<()> {
    let opts = format!("size={size_mb}m,mode=0755,uid={uid},gid={gid}");
    mount(Some("tmpfs"), dst, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some(opts.as_str()))
        .map_err(|e| err(e, "tmpfs on", dst))
}

/// Lazily unmount `path` and every mount below it.
pub fn detach(path: &Path) -> io::Result<()> {
    match umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) => Ok(()),
        Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()), // not a mount point
        Err(e) => Err(err(e, "unmount", path)),
    }
}

/// Mount points at or below `prefix`, deepest first (the order to unmount them in).
pub fn mounts_under(prefix: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = crate::mountinfo::read()?.into_iter().map(|m| m.mount_point).filter(|p| p.starts_with(prefix)).collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    Ok(found)
}

/// Whether `path` is itself a mount point.
pub fn is_mount_point(path: &Path) -> bool {
    mounts_under(path).map(|m| m.iter().any(|p| p == path)).unwrap_or(false)
}

/// Unmount everything at or below `prefix`; returns how many mounts were removed.
pub fn detach_all_under(prefix: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for _ in 0..64 {
        let mounts = mounts_under(prefix)?;
        if mounts.is_empty() {
            break;
        }
        for m in mounts {
            detach(&m)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// A path as a C string, for raw syscalls.
pub fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

/// A detached copy of the mount tree at `path` (open_tree with OPEN_TREE_CLONE | AT_RECURSIVE):
/// a root that `..` cannot leave, not even with CAP_SYS_CHROOT, since the copy has no parent
/// mount. Package Zygotes and their handlers live in such roots. The copy disappears with its
/// last user (this descriptor, or a process whose root or working directory is in it).
pub fn clone_tree(path: &Path) -> Result<std::os::fd::OwnedFd, PlatformError> {
    use std::os::fd::FromRawFd;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    let c = cpath(path).at("cloning the mount tree at", path)?;
    // SAFETY: `c` is a NUL-terminated path that lives until after the call; the other
    // arguments are plain integers.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE) };
    if fd < 0 {
        let error = io::Error::last_os_error();
        return Err(PlatformError::Path { doing: "cloning the mount tree at".into(), path: path.to_path_buf(), error });
    }
    // SAFETY: open_tree succeeded, so `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}
