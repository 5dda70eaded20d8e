//! The cgroup filesystem's files, read and written: a value written to a control file, a
//! group's directory made, the pids of a cgroup.procs file, a keyed counter, a file kept open
//! read again from its start, and processes moved into groups through their open
//! cgroup.procs descriptors.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// The pids in a cgroup.procs file. A task outside the reader's PID namespace is listed as 0,
/// which is left out: `kill(0, ...)` would signal the caller's own process group.
pub(crate) fn read_pids(path: &Path) -> Vec<i32> {
    fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).filter(|p: &i32| *p > 0).collect()
}

/// Write `pid` to each of the cgroup.procs descriptors `fds`: move it into those groups.
pub(crate) fn write_pid(fds: &[OwnedFd], pid: i32) -> io::Result<()> {
    let text = pid.to_string();
    for fd in fds {
        // SAFETY: `fd` is borrowed from a live OwnedFd for the call, and the pointer and length
        // describe `text`, which outlives it.
        let n = unsafe { libc::write(fd.as_raw_fd(), text.as_ptr() as *const libc::c_void, text.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// [`write_pid`] off the async threads: a move may wait for an RCU grace period (see
/// [`Layout::favor_dynamic_modifications`](super::Layout::favor_dynamic_modifications)).
pub(crate) async fn move_pid<'a>(fds: impl IntoIterator<Item = &'a OwnedFd>, pid: i32) -> io::Result<()> {
    let fds: Vec<OwnedFd> = fds.into_iter().map(|f| f.try_clone()).collect::<io::Result<_>>()?;
    tokio::task::spawn_blocking(move || write_pid(&fds, pid)).await.map_err(io::Error::other)?
}

/// What a cgroup file kept open holds now (a control file is made afresh at each read from
/// its start): one system call, into `buf`. None if it cannot be read.
pub(super) fn read_again<'a>(file: &fs::File, buf: &'a mut [u8]) -> Option<&'a str> {
    use std::os::unix::fs::FileExt;
    let n = file.read_at(buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()
}

pub(super) fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
}

pub(super) fn mkdir_exist_ok(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir_all(dir),
        other => other,
    }
}

/// The `oom_kill` count of a memory.oom_control (v1) or memory.events (v2) file.
pub(crate) fn read_oom_kills(path: &Path) -> u64 {
    read_key(path, "oom_kill").unwrap_or(0)
}

pub(super) fn read_key(path: &Path, key: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}
