//! The system calls sandboxes may not make: seccomp filters, compiled with seccompiler.
//!
//! A handler runs unprivileged, chrooted, in namespaces of its own, so the kernel already
//! refuses it most of what could reach beyond its sandbox. The filters close what is left
//! open to an unprivileged process, and make the rest fail even if a privilege leaked:
//!
//! * **every sandbox process** (Zygotes included): `ptrace` and reading or writing other
//!   processes' memory, `perf_event_open`, `bpf`, `userfaultfd`, the kernel keyrings (not
//!   namespaced: every sandbox's user shares one), `io_uring`, loading kernels and modules,
//!   rebooting, swap, accounting, the kernel log, file handles, `kcmp`, clocks, port I/O.
//! * **handlers** besides: every way to a new namespace or mount (`unshare`, `setns`,
//!   `clone` with a namespace flag, `mount` and the new mount API, `pivot_root`, `chroot`);
//!   `clone3` answers "not implemented", as under Docker, since its flags cannot be
//!   inspected, and glibc then falls back to `clone`.
//!
//! Denied calls fail with EPERM (the program goes on and can say what it could not do);
//! a call of another architecture's ABI (32-bit x86, x32) kills the process. Zygotes get
//! their filter from [`crate::process::spawn`]; each handler installs its own last before
//! lambda code runs — the Zygote's C loop reads it from the runtime directory
//! ([`HANDLER_FILE`], written by the stage), `spawn` takes it for `sock-nozygote` and pip.

use std::collections::BTreeMap;
use std::io;

use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch};

/// The handlers' filters, in the runtime directory (`/opt/sprout/` in every sandbox).
pub const HANDLER_FILE: &str = "seccomp-handler.bpf";

/// Who a filter is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Zygotes (and what they fork, until a handler installs its own on top).
    Zygote,
    /// Handlers, and one-shot programs such as pip.
    Handler,
}

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

const DENIED_TO_HANDLERS: &[i64] = &[
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
];

/// Namespace flags `clone` may not be given by a handler.
const NAMESPACE_FLAGS: &[i32] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
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

/// The filters of `profile`, in the order to install them.
pub fn programs(profile: Profile) -> io::Result<Vec<BpfProgram>> {
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> = DENIED_TO_ALL.iter().map(|nr| (*nr, Vec::new())).collect();
    let mut out = Vec::new();
    if profile == Profile::Handler {
        denied.extend(DENIED_TO_HANDLERS.iter().map(|nr| (*nr, Vec::new())));
        let clone_rules = NAMESPACE_FLAGS
            .iter()
            .map(|flag| {
                let flag = *flag as u64;
                let cond =
                    SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag), flag).map_err(io::Error::other)?;
                SeccompRule::new(vec![cond]).map_err(io::Error::other)
            })
            .collect::<io::Result<Vec<_>>>()?;
        denied.insert(libc::SYS_clone, clone_rules);
        out.push(compile(BTreeMap::from([(libc::SYS_clone3, Vec::new())]), libc::ENOSYS)?);
    }
    out.insert(0, compile(denied, libc::EPERM)?);
    #[cfg(target_arch = "x86_64")]
    out.push(no_x32());
    Ok(out)
}

/// On x86-64, x32 calls share the architecture's audit tag but not its numbers (they have bit
/// 30 set): refuse them all, so that no denied call is made under another number.
#[cfg(target_arch = "x86_64")]
fn no_x32() -> BpfProgram {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JGE_K: u16 = 0x35;
    const BPF_RET_K: u16 = 0x06;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
    vec![
        sock_filter { code: BPF_LD_W_ABS, jt: 0, jf: 0, k: 0 }, // seccomp_data.nr
        sock_filter { code: BPF_JGE_K, jt: 0, jf: 1, k: 0x4000_0000 },
        sock_filter { code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_KILL_PROCESS },
        sock_filter { code: BPF_RET_K, jt: 0, jf: 0, k: SECCOMP_RET_ALLOW },
    ]
}

/// Programs as the C loop reads them: each a little-endian u32 count of instructions, then
/// the instructions (8 bytes each, `struct sock_filter`).
pub fn encode(programs: &[BpfProgram]) -> Vec<u8> {
    let mut out = Vec::new();
    for program in programs {
        out.extend_from_slice(&(program.len() as u32).to_le_bytes());
        for insn in program {
            out.extend_from_slice(&insn.code.to_le_bytes());
            out.push(insn.jt);
            out.push(insn.jf);
            out.extend_from_slice(&insn.k.to_le_bytes());
        }
    }
    out
}

/// Install `programs` in the calling thread (after `PR_SET_NO_NEW_PRIVS`). Makes only
/// system calls: safe in the child of a raw clone.
///
/// # Safety
/// The programs must be valid BPF (as [`programs`] makes them).
pub unsafe fn install(programs: &[libc::sock_fprog]) -> i32 {
    for prog in programs {
        // SAFETY: `prog` points at a live program of `len` instructions (the caller's promise).
        if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, prog as *const libc::sock_fprog) } != 0 {
            return -1;
        }
    }
    0
}

/// `sock_fprog`s pointing into `programs` (which must outlive them).
pub fn fprogs(programs: &[BpfProgram]) -> Vec<libc::sock_fprog> {
    programs.iter().map(|p| libc::sock_fprog { len: p.len() as u16, filter: p.as_ptr() as *mut libc::sock_filter }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handlers_get_more_filters_than_zygotes() {
        let zygote = programs(Profile::Zygote).unwrap();
        let handler = programs(Profile::Handler).unwrap();
        assert!(handler.len() > zygote.len());
        assert!(handler[0].len() > zygote[0].len());
        let bytes = encode(&handler);
        assert_eq!(bytes.len(), handler.iter().map(|p| 4 + 8 * p.len()).sum::<usize>());
        assert_eq!(u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize, handler[0].len());
    }

    /// In a forked child: install the handler's filters and try a denied call, an allowed
    /// one, clone with and without a namespace flag, and clone3.
    #[test]
    fn denied_calls_fail_with_eperm_and_the_rest_work() {
        let programs = programs(Profile::Handler).unwrap();
        let fprogs = fprogs(&programs);
        // SAFETY: the child makes only system calls and exits with a code saying what failed.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                if install(&fprogs) != 0 {
                    libc::_exit(10);
                }
                let errno = || *libc::__errno_location();
                if libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) != -1 || errno() != libc::EPERM {
                    libc::_exit(11);
                }
                if libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER) != -1 || errno() != libc::EPERM {
                    libc::_exit(12);
                }
                if libc::syscall(libc::SYS_clone, (libc::CLONE_NEWNET | libc::SIGCHLD) as libc::c_long, 0, 0, 0, 0) != -1
                    || errno() != libc::EPERM
                {
                    libc::_exit(13);
                }
                if libc::syscall(libc::SYS_clone3, 0, 0) != -1 || errno() != libc::ENOSYS {
                    libc::_exit(14);
                }
                if libc::getpid() <= 0 {
                    libc::_exit(15);
                }
                let child = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0);
                if child == 0 {
                    libc::_exit(0);
                }
                if child < 0 {
                    libc::_exit(16);
                }
                libc::_exit(0);
            }
        }
        let mut status = 0;
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "status {status}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }
}
