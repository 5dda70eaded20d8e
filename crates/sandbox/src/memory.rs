//! Memory of processes as the caches account it: PSS (proportional set size), which charges
//! each page shared by N processes 1/N to each, so handlers forked from one Zygote — sharing
//! its interpreter and imported packages copy-on-write — are charged fairly (SOCK figure 19).

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

/// The summed PSS of `pids` (processes that are gone count nothing).
pub fn pss_of_pids(pids: &[i32]) -> u64 {
    pids.iter().filter_map(|p| pss_bytes(*p)).sum()
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
