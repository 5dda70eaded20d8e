//! Forked children that run raw system calls only (no allocation, no locks), each reaped
//! with `waitpid(pid)`, or killed and reaped when dropped.

use std::io;

use anyhow::{bail, Result};

use super::sys::errno;

/// A forked child; killed and reaped on drop unless [`Child::wait`] reaped it.
pub(super) struct Child {
    pid: libc::pid_t,
    reaped: bool,
}

impl Child {
    /// Fork a child that runs `body` (raw system calls only: no allocation, no locks) and
    /// exits with its return value.
    pub(super) fn spawn(body: impl FnOnce() -> libc::c_int) -> io::Result<Child> {
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
    pub(super) fn wait(mut self, what: &str) -> Result<()> {
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
pub(super) fn errno_code() -> libc::c_int {
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
pub(super) fn churn_once(flags: libc::c_int) -> Result<()> {
    Child::spawn(|| unshare_body(flags))?.wait("unshare")
}
