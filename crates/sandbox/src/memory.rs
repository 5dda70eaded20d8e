//! Memory of processes as the caches account it: PSS (proportional set size), which charges
//! each page shared by N processes 1/N to each, so handlers forked from one Zygote — sharing
//! its interpreter and imported packages copy-on-write — are charged fairly (SOCK figure 19).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fs;

fn field_kb(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
}

/// PSS of process `pid` in bytes (from /proc/<pid>/smaps_rollup), if it still exists.
pub fn pss_bytes(pid: i32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    field_kb(&text, "Pss:").map(|kb| kb << 10)
}

/// RSS of process `pid` in bytes: every page it maps, shared or not.
pub fn rss_bytes(pid: i32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    field_kb(&text, "Rss:").map(|kb| kb << 10)
}

/// The summed PSS of `pids` (processes that are gone count nothing; each address space
/// once: [`pss_each`]).
pub fn pss_of_pids(pids: &[i32]) -> u64 {
    pss_each(pids).iter().map(|(_, bytes)| bytes).sum()
}

/// Each of `pids`' PSS in bytes (those gone left out), counting each address space once: a
/// process sharing its memory with one listed before it (`clone(CLONE_VM)` without being its
/// thread, as gVisor's systrap stubs are, two to an address space) counts 0, for
/// /proc/<pid>/smaps_rollup shows every such process the whole shared address space.
pub fn pss_each(pids: &[i32]) -> Vec<(i32, u64)> {
    // The address spaces counted, by their rollup's range (the same for processes sharing
    // one), each list in the kernel's order of address spaces so a new one is placed in a few
    // comparisons.
    let mut counted: HashMap<String, Vec<i32>> = HashMap::new();
    pids.iter()
        .filter_map(|&pid| {
            let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
            let pss = field_kb(&text, "Pss:")? << 10;
            let spaces = counted.entry(text.lines().next().unwrap_or_default().to_string()).or_default();
            let shared = match locate(spaces, pid) {
                Some(Ok(_)) => true,
                Some(Err(at)) => {
                    spaces.insert(at, pid);
                    false
                }
                None => false, // the kernel cannot compare: counted
            };
            Some((pid, if shared { 0 } else { pss }))
        })
        .collect()
}

/// Where `pid`'s address space falls among `spaces` (distinct, in the kernel's order): `Ok`
/// when it is one of them, else `Err` with where it goes; `None` where the kernel cannot
/// compare (a process gone, no kcmp).
fn locate(spaces: &[i32], pid: i32) -> Option<Result<usize, usize>> {
    let (mut low, mut high) = (0, spaces.len());
    while low < high {
        let middle = (low + high) / 2;
        match address_space_order(spaces[middle], pid)? {
            Ordering::Equal => return Some(Ok(middle)),
            Ordering::Less => low = middle + 1,
            Ordering::Greater => high = middle,
        }
    }
    Some(Err(low))
}

/// How two processes' address spaces compare in the kernel's (obfuscated, total) order:
/// `Equal` when they share one (kcmp(2) `KCMP_VM`).
fn address_space_order(a: i32, b: i32) -> Option<Ordering> {
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: kcmp takes two pids, a type and two unused arguments, and touches no memory of ours.
    let order =
        unsafe { libc::syscall(libc::SYS_kcmp, a as libc::c_long, b as libc::c_long, KCMP_VM, 0 as libc::c_long, 0 as libc::c_long) };
    match order {
        0 => Some(Ordering::Equal),
        1 => Some(Ordering::Less),
        2 => Some(Ordering::Greater),
        _ => None,
    }
}

/// The memory a cgroup holds that the kernel cannot simply drop: what is charged to it
/// (`usage`: v1 `memory.usage_in_bytes`, v2 `memory.current`) less the page cache no process
/// maps, read from its `memory.stat` (`v1`: the hierarchical `total_*` keys). Files the
/// group's processes wrote or read (uploads, `.pyc`s) stay charged to it as cache, and stay
/// charged to a pooled cgroup after its sandbox is gone, until the kernel reclaims them at
/// the limit; counting them as used would make a budget evict sandboxes, and refuse cold
/// starts, to keep room for cache.
pub fn in_use(usage: u64, stat: &str, v1: bool) -> u64 {
    let key = |name: &str| -> u64 {
        let name = if v1 { format!("total_{name}") } else { name.to_string() };
        stat.lines().find_map(|l| l.split_once(' ').filter(|(k, _)| *k == name).and_then(|(_, v)| v.trim().parse().ok())).unwrap_or(0)
    };
    let file = key("inactive_file") + key("active_file");
    let mapped = key(if v1 { "mapped_file" } else { "file_mapped" });
    usage.saturating_sub(file.saturating_sub(mapped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_pss_at_most_its_rss() {
        let me = std::process::id() as i32;
        let (pss, rss) = (pss_bytes(me).unwrap(), rss_bytes(me).unwrap());
        assert!(pss > 0 && pss <= rss, "pss {pss} rss {rss}");
        assert_eq!(pss_bytes(i32::MAX), None);
    }

    #[test]
    fn processes_sharing_an_address_space_count_once() {
        // A child cloned with CLONE_VM (not a thread: a process of its own) shares our
        // address space and shows it all in its smaps_rollup.
        let mut stack = vec![0u8; 64 << 10];
        extern "C" fn wait_forever(_: *mut libc::c_void) -> libc::c_int {
            loop {
                // SAFETY: pause only waits for a signal.
                unsafe { libc::pause() };
            }
        }
        // SAFETY: the child runs only `wait_forever` on its own stack, which outlives it (it is
        // killed and reaped below before `stack` is dropped).
        let child = unsafe {
            libc::clone(wait_forever, stack.as_mut_ptr().add(stack.len()).cast(), libc::CLONE_VM | libc::SIGCHLD, std::ptr::null_mut())
        };
        assert!(child > 0);
        let me = std::process::id() as i32;
        let each = pss_each(&[me, child]);
        // SAFETY: plain syscalls on our own child.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        assert_eq!(address_space_order(me, me), Some(Ordering::Equal));
        let mut other = std::process::Command::new("sleep").arg("10").spawn().unwrap();
        let apart = address_space_order(me, other.id() as i32);
        let both = pss_each(&[me, other.id() as i32]);
        other.kill().unwrap();
        other.wait().unwrap();
        assert!(matches!(apart, Some(Ordering::Less | Ordering::Greater)), "{apart:?}");
        assert!(both.iter().all(|(_, pss)| *pss > 0), "a process of its own counts: {both:?}");
        assert_eq!(each.len(), 2);
        assert!(each[0].1 > 0, "{each:?}");
        assert_eq!(each[1].1, 0, "the child's address space is ours, already counted: {each:?}");
    }

    #[test]
    fn in_use_leaves_out_unmapped_page_cache() {
        let v1 = "cache 4096\nrss 8192\nmapped_file 0\ntotal_cache 300\ntotal_rss 500\ntotal_mapped_file 40\n\
                  total_inactive_file 200\ntotal_active_file 100\ninactive_file 7\nactive_file 7\n";
        assert_eq!(in_use(800, v1, true), 800 - (300 - 40));
        let v2 = "anon 500\nfile 300\nfile_mapped 40\nshmem 0\ninactive_file 200\nactive_file 100\n";
        assert_eq!(in_use(820, v2, false), 820 - 260);
        // Nothing to subtract, or a stat that cannot be read: all of it counts.
        assert_eq!(in_use(800, "", true), 800);
        assert_eq!(in_use(800, "total_inactive_file 10\ntotal_mapped_file 50\n", true), 800);
        // Never below zero when the two files were read a moment apart.
        assert_eq!(in_use(100, v2, false), 0);
    }
}
