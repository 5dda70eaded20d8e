//! The system calls sandboxes may not make: one seccomp filter, compiled with seccompiler,
//! that every sandbox process holds.
//!
//! A handler runs unprivileged (no capabilities, `no_new_privs`), chrooted, in namespaces of
//! its own, so the kernel already refuses it every way out that needs a privilege: mounting,
//! `chroot`, `pivot_root`, joining or making PID, mount, network, IPC or UTS namespaces,
//! raw sockets, device nodes. The filter closes what the kernel leaves open to an
//! unprivileged process, for every sandbox process, Zygotes included:
//!
//! * `ptrace` and reading or writing other processes' memory or descriptors (`kcmp`,
//!   `pidfd_getfd`), `perf_event_open`, `bpf`, `userfaultfd`, `io_uring`, the kernel keyrings
//!   (not namespaced: every sandbox's user would share one), new user namespaces (`unshare` or
//!   `clone` with `CLONE_NEWUSER`), loading kernels and modules, rebooting, swap, accounting,
//!   the kernel log, file handles, clocks, port I/O;
//! * `clone3` answers "not implemented", as under Docker, since its flags cannot be inspected;
//!   glibc then falls back to `clone`;
//! * a call of another architecture's ABI (32-bit x86, x32) kills the process, so no denied
//!   call is made under another number.
//!
//! Denied calls fail with EPERM: the program goes on and can say what it could not do. The
//! root Zygote gets the filter from [`crate::process::spawn`] and every Zygote and handler
//! inherits it at fork, so a cold start pays nothing for it (installing a filter costs about
//! 175 µs here: the kernel compiles it and runs it once for every call number to build its
//! cache); `spawn` installs it for `sock-nozygote` handlers and pip too.

use std::collections::BTreeMap;
use std::io;

use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch};

const DENIED_TO_ALL: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_perf_event_open,
    libc::SYS_bpf,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_syslog,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_lookup_dcookie,
    libc::SYS_quotactl,
    libc::SYS_fanotify_init,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_vhangup,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

fn arch() -> io::Result<TargetArch> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|_| io::Error::new(io::ErrorKind::Unsupported, format!("no seccomp filters for {}", std::env::consts::ARCH)))
}

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> io::Result<BpfProgram> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno as u32), arch()?).map_err(io::Error::other)?;
    filter.try_into().map_err(io::Error::other)
}

/// The filter, as one program (each filter a process holds is run on every call the
/// kernel's cache cannot answer).
pub fn program() -> io::Result<BpfProgram> {
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> = DENIED_TO_ALL.iter().map(|nr| (*nr, Vec::new())).collect();
    let new_user = |arg: u8| -> io::Result<Vec<SeccompRule>> {
        let flag = libc::CLONE_NEWUSER as u64;
        let cond = SeccompCondition::new(arg, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag), flag).map_err(io::Error::other)?;
        Ok(vec![SeccompRule::new(vec![cond]).map_err(io::Error::other)?])
    };
    denied.insert(libc::SYS_clone, new_user(0)?);
    denied.insert(libc::SYS_unshare, new_user(0)?);
    with_guards(compile(denied, libc::EPERM)?)
}

/// Add to seccompiler's program what its rules cannot say, right after it loads the call's
/// number (its programs begin: load the architecture, check it, kill, load the number; the
/// jumps after that point only forward, so instructions put there move nothing they reach):
/// on x86-64 a kill for x32 calls, which share the architecture's audit tag but not its
/// numbers (bit 30 set), so no denied call is made under another number; and "not
/// implemented" for `clone3`.
fn with_guards(mut program: BpfProgram) -> io::Result<BpfProgram> {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x15;
    const BPF_RET_K: u16 = 0x06;
    const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    let loads_nr = program.get(3).map(|i| i.code == BPF_LD_W_ABS && i.k == 0).unwrap_or(false);
    if !loads_nr {
        return Err(io::Error::other("seccompiler's program does not begin as expected"));
    }
    let mut guards = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        const BPF_JGE_K: u16 = 0x35;
        guards.push(sock_filter { code: BPF_JGE_K, jt: 0, jf: 1, k: 0x4000_0000 });
        guards.push(sock_filter { code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_KILL_PROCESS });
    }
    guards.push(sock_filter { code: BPF_JEQ_K, jt: 0, jf: 1, k: libc::SYS_clone3 as u32 });
    guards.push(sock_filter { code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ERRNO | libc::ENOSYS as u32 });
    program.splice(4..4, guards);
    Ok(program)
}

/// Install `prog` in the calling thread (after `PR_SET_NO_NEW_PRIVS`). Makes only system
/// calls: safe in the child of a raw clone.
///
/// # Safety
/// `prog` must point at a valid program (as [`program`] makes), alive for the call.
pub unsafe fn install(prog: &libc::sock_fprog) -> i32 {
    // SAFETY: the caller's promise.
    unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, prog as *const libc::sock_fprog) }
}

/// [`program`] as the bytes of its `sock_filter` array, for a process that installs it
/// itself (a gVisor pod's handlers, through `prctl`: gVisor's kernel runs the same filter).
pub fn program_bytes() -> io::Result<Vec<u8>> {
    let program = program()?;
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for instruction in &program {
        bytes.extend_from_slice(&instruction.code.to_ne_bytes());
        bytes.extend_from_slice(&[instruction.jt, instruction.jf]);
        bytes.extend_from_slice(&instruction.k.to_ne_bytes());
    }
    Ok(bytes)
}

/// A `sock_fprog` pointing into `program` (which must outlive it).
pub fn fprog(program: &BpfProgram) -> libc::sock_fprog {
    libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut libc::sock_filter }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a forked child: install the filter and try denied calls, allowed ones, clone with
    /// and without a new user namespace, clone3, and an x32 call.
    #[test]
    fn denied_calls_fail_with_eperm_and_the_rest_work() {
        let program = program().unwrap();
        let fprog = fprog(&program);
        // SAFETY: the child makes only system calls and exits with a code saying what failed.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: the forked child of the threaded test harness makes only system calls (and
            // reads errno); `fprog` points into `program`, alive in its copy of memory; it ends in _exit.
            unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if install(&fprog) != 0 {
                    libc::_exit(10);
                }
                let errno = || *libc::__errno_location();
                if libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) != -1 || errno() != libc::EPERM {
                    libc::_exit(11);
                }
                if libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER) != -1 || errno() != libc::EPERM {
                    libc::_exit(12);
                }
                if libc::syscall(libc::SYS_clone, (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_long, 0, 0, 0, 0) != -1
                    || errno() != libc::EPERM
                {
                    libc::_exit(13);
                }
                if libc::syscall(libc::SYS_clone3, 0, 0) != -1 || errno() != libc::ENOSYS {
                    libc::_exit(14);
                }
                if libc::syscall(libc::SYS_bpf, 0, 0, 0) != -1 || errno() != libc::EPERM {
                    libc::_exit(15);
                }
                // A plain fork still works, and an x32 call (getpid's number with bit 30)
                // kills its caller.
                let grandchild = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0);
                if grandchild == 0 {
                    #[cfg(target_arch = "x86_64")]
                    libc::syscall(0x4000_0000 | libc::SYS_getpid);
                    libc::_exit(0);
                }
                if grandchild < 0 {
                    libc::_exit(16);
                }
                let mut status = 0;
                libc::waitpid(grandchild as i32, &mut status, 0);
                #[cfg(target_arch = "x86_64")]
                if !libc::WIFSIGNALED(status) || libc::WTERMSIG(status) != libc::SIGSYS {
                    libc::_exit(17);
                }
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: `status` is a live c_int that waitpid may write; `pid` is our forked child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "status {status}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }
}
