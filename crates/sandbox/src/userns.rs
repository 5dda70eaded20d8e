//! The user namespace of package Zygotes. A Zygote that imports packages (code that may be
//! malicious) must not be root on the host, yet must create PID namespaces and chroot for the
//! handlers it forks. So it joins this namespace: there it is root (uid 0), mapped to an
//! unprivileged host user of its own, and its handlers' user maps to the same host user as
//! every other handler's. Its capabilities then reach only namespaces it creates; host files,
//! mounts and processes see an ordinary unprivileged user.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Make the namespace: `0 -> zygote` and `handler -> handler` for both uids and gids.
/// Returns a descriptor of it (/proc/<pid>/ns/user of a process that exits at once).
pub fn create(zygote_uid: u32, zygote_gid: u32, handler_uid: u32, handler_gid: u32) -> io::Result<OwnedFd> {
    if zygote_uid == handler_uid || zygote_gid == handler_gid {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the Zygotes' host user must differ from the handlers'"));
    }
    let mut pipe = [0 as RawFd; 2];
    // SAFETY: `pipe` is a live array of two c_ints, exactly what pipe2 writes.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors that nothing else owns; each is
    // wrapped exactly once.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
    let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_long;
    // SAFETY: a fork-like clone (no CLONE_VM, no new stack, no tid pointers): the child gets a
    // copy of this thread's memory and runs only the block below, which never returns.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // Child: wait until the parent has what it needs, then go. Plain system calls only.
        // SAFETY: the child of a clone in a threaded program must stay async-signal-safe: close,
        // read and _exit are, they act on the child's own copies of `wr` and `rd`, read writes
        // at most the one byte of `b`, and nothing allocates or unwinds.
        unsafe {
            libc::close(wr.as_raw_fd());
            let mut b = 0u8;
            libc::read(rd.as_raw_fd(), &mut b as *mut u8 as *mut libc::c_void, 1);
            libc::_exit(0);
        }
    }
    let pid = pid as i32;
    let result = (|| {
        fs::write(format!("/proc/{pid}/uid_map"), format!("0 {zygote_uid} 1\n{handler_uid} {handler_uid} 1\n"))?;
        fs::write(format!("/proc/{pid}/gid_map"), format!("0 {zygote_gid} 1\n{handler_gid} {handler_gid} 1\n"))?;
        let ns = fs::File::open(format!("/proc/{pid}/ns/user"))?;
        Ok(OwnedFd::from(ns))
    })();
    drop(wr); // the child's read returns: it exits
              // SAFETY: `pid` is our unreaped child (only this call reaps it); a null status is allowed.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    drop(rd);
    result
}
