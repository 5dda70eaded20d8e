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
}
