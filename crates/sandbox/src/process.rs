//! Processes: pidfds (race-free handles on sandbox processes, whatever namespace they are in)
//! and [`spawn`], which starts a program directly inside a new lean sandbox.
//!
//! `spawn` clones with CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS (never a mount namespace;
//! a new network namespace only when asked), so the new process is PID 1 of its own
//! namespace from birth; the child then enters the root with fchdir + chroot, joins its
//! cgroups by writing to the cgroup.procs descriptors it was given, joins a network namespace
//! when given one, drops to an unprivileged user and execs. It is how the worker
//! starts the root Zygote and, for the `sock-nozygote` baseline, every handler. The child of a
//! raw clone in a threaded program may only make plain system calls (no allocation, no glibc
//! set*id broadcast), so everything it needs is prepared before the clone.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::error::PlatformError;
use crate::mounts::cpath;

/// A pidfd: a handle on one process that cannot be confused with a later process reusing
/// its pid.
#[derive(Debug)]
pub struct PidFd {
    fd: OwnedFd,
    pid: i32,
}

impl PidFd {
    pub fn open(pid: i32) -> io::Result<PidFd> {
        // SAFETY: pidfd_open takes two integers and touches no memory of ours.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pidfd_open succeeded, so `fd` is a new descriptor that nothing else owns.
        Ok(PidFd { fd: unsafe { OwnedFd::from_raw_fd(fd as RawFd) }, pid })
    }

    pub fn from_parts(fd: OwnedFd, pid: i32) -> PidFd {
        PidFd { fd, pid }
    }

    /// Adopt a pidfd received from elsewhere; its pid (in our namespace) is read from
    /// /proc/self/fdinfo.
    pub fn from_fd(fd: OwnedFd) -> io::Result<PidFd> {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
        let pid = info
            .lines()
            .find_map(|l| l.strip_prefix("Pid:"))
            .and_then(|v| v.trim().parse::<i32>().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a pidfd"))?;
        Ok(PidFd { fd, pid })
    }

    /// Another handle on the same process.
    pub fn try_clone(&self) -> io::Result<PidFd> {
        Ok(PidFd { fd: self.fd.try_clone()?, pid: self.pid })
    }

    /// The pid in the worker's PID namespace.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn signal(&self, sig: i32) -> io::Result<()> {
        // SAFETY: `self.fd` is owned by `self` and open for the call; a null siginfo is allowed
        // (the kernel fills in a default one).
        let rc = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, self.fd.as_raw_fd(), sig, std::ptr::null::<u8>(), 0) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ESRCH) {
                return Ok(()); // already gone
            }
            return Err(e);
        }
        Ok(())
    }

    pub fn kill(&self) {
        let _ = self.signal(libc::SIGKILL);
    }

    /// Whether the process has exited (a pidfd polls readable once it has).
    pub fn has_exited(&self) -> bool {
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: `pfd` is one live pollfd, matching nfds = 1; its fd is `self.fd`, open for the call.
        unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
    }

    /// Wait up to `timeout` for the process to exit; true if it did.
    pub async fn exited(&self, timeout: Duration) -> bool {
        if self.has_exited() {
            return true;
        }
        let Ok(dup) = self.fd.try_clone() else {
            return false;
        };
        // SAFETY: the AsyncFd owns `dup`, which stays open until the AsyncFd is dropped.
        let Ok(afd) = (unsafe { AsyncFd::register_with_interest(dup, Interest::READABLE) }) else {
            return false;
        };
        tokio::time::timeout(timeout, afd.readable()).await.is_ok()
    }

    /// Whether the process was sent SIGKILL that it has not yet acted on, as a frozen
    /// process cannot (it dies only when thawed); a process already gone counts as killed.
    pub fn sigkill_pending(&self) -> bool {
        match std::fs::read_to_string(format!("/proc/{}/status", self.pid)) {
            Ok(status) => sigkill_in_status(&status),
            Err(_) => true,
        }
    }

    /// Reap the process if it is our child and has exited (no-op otherwise).
    pub fn reap(&self) {
        // SAFETY: waitpid takes a pid and an optional status pointer; null means "don't store".
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), libc::WNOHANG) };
    }

    /// Wait for our child to exit and reap it; returns its wait status.
    pub async fn wait_status(&self) -> i32 {
        loop {
            let mut status = 0;
            // SAFETY: `status` is a live c_int that waitpid may write.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if rc == self.pid {
                return status;
            }
            if rc < 0 {
                return 0; // not our child, or already reaped
            }
            self.exited(Duration::from_secs(3600)).await;
        }
    }
}

/// How to start a program in a new lean sandbox.
pub struct SpawnSpec<'a> {
    /// Directory that becomes the root (already stitched together with bind mounts).
    pub root: &'a Path,
    /// cgroup.procs of each hierarchy to join, open for writing.
    pub cgroup_procs: &'a [OwnedFd],
    /// New PID, IPC and UTS namespaces (the SOCK set).
    pub new_namespaces: bool,
    /// A new, empty network namespace as well (the root Zygote's, when sandboxes are
    /// isolated: nothing it or its package Zygotes import can reach any network).
    pub new_network: bool,
    /// A network namespace to join (a lambda's) before dropping privileges.
    pub netns: Option<RawFd>,
    /// Install the sandboxes' seccomp filter last before exec.
    pub seccomp: bool,
    /// Mount a proc file system of the new PID namespace at /proc.
    pub mount_proc: bool,
    pub hostname: Option<&'a str>,
    /// Drop to this uid:gid (with no supplementary groups) before exec.
    pub user: Option<(u32, u32)>,
    pub argv: &'a [String],
    pub env: &'a [(String, String)],
    /// Where stdout and stderr go (stdin is /dev/null).
    pub output: Option<RawFd>,
    /// Working directory inside the root (default /).
    pub workdir: Option<&'a str>,
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in argument"))
}

/// What failed in the child before exec (reported through a close-on-exec pipe).
const STAGES: [&str; 12] = [
    "redirect output",
    "enter root",
    "join cgroup",
    "join the network namespace",
    "set hostname",
    "mount /proc",
    "drop groups",
    "set gid",
    "set uid",
    "set no_new_privs",
    "install the seccomp filter",
    "exec",
];

/// Start `spec.argv` in a new sandbox; returns a pidfd of the child (our child: reap it).
pub fn spawn(spec: &SpawnSpec) -> io::Result<PidFd> {
    // Everything the child touches is made here, before the clone.
    let root = std::fs::File::open(spec.root)?;
    let devnull = std::fs::File::open("/dev/null")?;
    let argv_c: Vec<CString> = spec.argv.iter().map(|a| cstr(a)).collect::<io::Result<_>>()?;
    let env_c: Vec<CString> = spec.env.iter().map(|(k, v)| cstr(&format!("{k}={v}"))).collect::<io::Result<_>>()?;
    let mut argv_p: Vec<*const libc::c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut env_p: Vec<*const libc::c_char> = env_c.iter().map(|c| c.as_ptr()).collect();
    env_p.push(std::ptr::null());
    let dot = cstr(".")?;
    let slash = cstr(spec.workdir.unwrap_or("/"))?;
    let proc_src = cstr("proc")?;
    let proc_dst = cpath(Path::new("/proc"))?;
    let host = spec.hostname.map(cstr).transpose()?;
    let cg_fds: Vec<RawFd> = spec.cgroup_procs.iter().map(|f| f.as_raw_fd()).collect();
    let mut pipe = [0 as RawFd; 2];
    // SAFETY: `pipe` is a live array of two c_ints, exactly what pipe2 writes.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors that nothing else owns; each is
    // wrapped exactly once.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };

    let mut flags = libc::CLONE_PIDFD as libc::c_long | libc::SIGCHLD as libc::c_long;
    if spec.new_namespaces {
        flags |= (libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS) as libc::c_long;
    }
    if spec.new_network {
        flags |= libc::CLONE_NEWNET as libc::c_long;
    }
    let netns = spec.netns;
    let filter = if spec.seccomp { Some(crate::seccomp::program()?) } else { None };
    let fprog = filter.as_ref().map(crate::seccomp::fprog);
    let mut pidfd: libc::c_int = -1;
    // SAFETY: a fork-like clone (no CLONE_VM, no new stack); with CLONE_PIDFD the kernel writes
    // the child's pidfd through the parent_tid argument (third on x86-64 and arm64) into the live
    // local `pidfd`. The child runs only the block below, which never returns.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, &mut pidfd as *mut libc::c_int, 0usize, 0usize) };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // Child: plain system calls only.
        // SAFETY: the child of a clone in a threaded program must stay async-signal-safe: it only makes system calls on
        // descriptors, C strings, pointer arrays and a seccomp program built before the clone (its copy of memory holds
        // them), `fail` writes the 8 bytes of `report`, nothing allocates or unwinds, and every path ends in execve or _exit.
        unsafe {
            let fail = |stage: i32| -> ! {
                let report = [stage, *libc::__errno_location()];
                libc::write(wr.as_raw_fd(), report.as_ptr() as *const libc::c_void, 8);
                libc::_exit(127);
            };
            libc::dup2(devnull.as_raw_fd(), 0);
            if let Some(out) = spec.output {
                if libc::dup2(out, 1) < 0 || libc::dup2(out, 2) < 0 {
                    fail(0);
                }
            }
            if libc::fchdir(root.as_raw_fd()) != 0 || libc::chroot(dot.as_ptr()) != 0 || libc::chdir(slash.as_ptr()) != 0 {
                fail(1);
            }
            for fd in &cg_fds {
                if libc::write(*fd, b"0".as_ptr() as *const libc::c_void, 1) != 1 {
                    fail(2);
                }
            }
            if let Some(ns) = netns {
                if libc::setns(ns, libc::CLONE_NEWNET) != 0 {
                    fail(3);
                }
            }
            if let Some(h) = &host {
                if libc::sethostname(h.as_ptr(), h.as_bytes().len()) != 0 {
                    fail(4);
                }
            }
            if spec.mount_proc {
                let f = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                if libc::mount(proc_src.as_ptr(), proc_dst.as_ptr(), proc_src.as_ptr(), f, std::ptr::null()) != 0 {
                    fail(5);
                }
            }
            if let Some((uid, gid)) = spec.user {
                if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0 {
                    fail(6);
                }
                if libc::syscall(libc::SYS_setgid, gid as libc::c_long) != 0 {
                    fail(7);
                }
                if libc::syscall(libc::SYS_setuid, uid as libc::c_long) != 0 {
                    fail(8);
                }
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                fail(9);
            }
            if fprog.as_ref().map(|f| crate::seccomp::install(f)).unwrap_or(0) != 0 {
                fail(10);
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::execve(argv_p[0], argv_p.as_ptr(), env_p.as_ptr());
            fail(11);
        }
    }
    drop(wr);
    // SAFETY: the clone succeeded, so CLONE_PIDFD stored a new descriptor in `pidfd`; nothing
    // else owns it.
    let pidfd = PidFd { fd: unsafe { OwnedFd::from_raw_fd(pidfd) }, pid: pid as i32 };
    let mut report = [0i32; 2];
    // SAFETY: `rd` is owned here and open for the call, and `report` is 8 writable bytes.
    let n = unsafe { libc::read(rd.as_raw_fd(), report.as_mut_ptr() as *mut libc::c_void, 8) };
    if n == 8 {
        // SAFETY: `pid` is our child, not yet reaped (it failed before exec and exits at once);
        // a null status pointer is allowed.
        unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
        let stage = STAGES.get(report[0] as usize).copied().unwrap_or("start");
        let e = io::Error::from_raw_os_error(report[1]);
        return Err(PlatformError::Io { doing: format!("the sandbox process could not {stage}").into(), error: e }.into());
    }
    Ok(pidfd)
}

/// Whether `/proc/<pid>/status` text shows SIGKILL pending, for the thread or the process.
fn sigkill_in_status(status: &str) -> bool {
    let bit = 1u64 << (libc::SIGKILL - 1);
    status
        .lines()
        .filter_map(|line| line.strip_prefix("SigPnd:").or_else(|| line.strip_prefix("ShdPnd:")))
        .filter_map(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .any(|mask| mask & bit != 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pending_sigkill_is_seen_in_either_mask() {
        let status = |sig: &str, shd: &str| format!("Name:\tpython3\nState:\tD (disk sleep)\nSigPnd:\t{sig}\nShdPnd:\t{shd}\n");
        assert!(super::sigkill_in_status(&status("0000000000000100", "0000000000000100")));
        assert!(super::sigkill_in_status(&status("0000000000000000", "0000000000000100")));
        assert!(!super::sigkill_in_status(&status("0000000000000000", "0000000000000000")));
        // SIGINT and SIGTERM pending are not SIGKILL.
        assert!(!super::sigkill_in_status(&status("0000000000004002", "0000000000000000")));
    }
}
