//! The shape of a fleet, decided before anything starts: each worker's name, network
//! namespace, link names and addresses (one /30 of the fleet's own /24 in 10.200.0.0/16),
//! ports, CPUs and memory budget. Pure: the same directory and sizes give the same plan.

use std::net::Ipv4Addr;
use std::path::Path;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The most workers one fleet's /24 holds (a /30 each).
pub const MAX_WORKERS: usize = 63;
/// Ports every worker listens on, at its own address.
pub const API_PORT: u16 = 5000;
pub const APP_PORT: u16 = 8080;

/// One worker of the fleet: a host of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// `w1`, `w2`, ...: its directory under the fleet's, and its server name in HAProxy.
    pub name: String,
    pub netns: String,
    /// The link's end in the host's namespace, and in the worker's.
    pub host_link: String,
    pub worker_link: String,
    pub host_addr: Ipv4Addr,
    pub addr: Ipv4Addr,
    /// The CPUs its worker and sandboxes run on (cpuset syntax).
    pub cpus: String,
    pub memory_mb: u64,
}

/// A fleet's members and what names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Six hex digits from the fleet's directory: in every name the fleet makes.
    pub tag: String,
    /// The third octet of the fleet's 10.200.x.0/24.
    pub subnet: u8,
}

impl Plan {
    /// The plan of the fleet living in `dir` (its canonical path decides the tag).
    pub fn for_dir(dir: &Path) -> Plan {
        let digest = Sha256::digest(dir.to_string_lossy().as_bytes());
        Plan { tag: hex::encode(&digest[..3]), subnet: digest[3] }
    }

    /// Member `index` (1-based), on `cpus` with `memory_mb` MiB.
    pub fn member(&self, index: usize, cpus: &str, memory_mb: u64) -> Result<Member> {
        if index == 0 || index > MAX_WORKERS {
            bail!("a fleet has workers 1 to {MAX_WORKERS}, not {index}");
        }
        let base = (index * 4) as u8; // the /30 of member `index`: .4i to .4i+3
        Ok(Member {
            name: format!("w{index}"),
            netns: format!("sprout-{}-w{index}", self.tag),
            host_link: format!("sf{}w{index}", self.tag),
            worker_link: format!("sf{}w{index}p", self.tag),
            host_addr: Ipv4Addr::new(10, 200, self.subnet, base + 1),
            addr: Ipv4Addr::new(10, 200, self.subnet, base + 2),
            cpus: cpus.to_string(),
            memory_mb,
        })
    }

    /// The fleet's own address on this host (`10.200.<subnet>.1`, outside every member's /30),
    /// on the host's loopback: where the fleet's PostgreSQL and the services its sandboxes
    /// may reach listen, the same address from every member's namespace (each routes to it
    /// through its link), as a services machine's address is on a real network.
    pub fn services_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 200, self.subnet, 1)
    }

    /// The label of [`Plan::services_addr`] on `lo` (`ip addr` shows it).
    pub fn services_label(&self) -> String {
        format!("lo:sf{}s", self.tag)
    }

    /// `count` members, their CPUs dealt round the `cpus` list (one CPU each, in turn).
    pub fn members(&self, count: usize, cpus: &[usize], memory_mb: u64) -> Result<Vec<Member>> {
        if cpus.is_empty() {
            bail!("no CPUs to run the fleet on");
        }
        (1..=count).map(|i| self.member(i, &cpus[(i - 1) % cpus.len()].to_string(), memory_mb)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_get_distinct_links_and_addresses_in_the_fleets_subnet() {
        let plan = Plan::for_dir(Path::new("/var/tmp/fleet-a"));
        let members = plan.members(MAX_WORKERS, &[0, 1], 512).unwrap();
        let mut addrs: Vec<_> = members.iter().flat_map(|m| [m.host_addr, m.addr]).collect();
        addrs.sort();
        addrs.dedup();
        assert_eq!(addrs.len(), 2 * MAX_WORKERS);
        for m in &members {
            assert!(m.host_link.len() <= 15 && m.worker_link.len() <= 15, "interface names are at most 15 bytes: {}", m.worker_link);
            assert_eq!(m.addr.octets()[..3], [10, 200, plan.subnet]);
            assert_eq!(u32::from(m.addr) - u32::from(m.host_addr), 1);
            assert_ne!(m.host_addr, plan.services_addr());
            assert!(plan.services_label().len() <= 15);
        }
        assert_eq!(plan.services_addr().octets()[..3], [10, 200, plan.subnet]);
        assert_eq!((members[0].cpus.as_str(), members[1].cpus.as_str(), members[2].cpus.as_str()), ("0", "1", "0"));
    }

    #[test]
    fn the_plan_depends_only_on_the_directory() {
        let a = Plan::for_dir(Path::new("/var/tmp/fleet-a"));
        assert_eq!(a, Plan::for_dir(Path::new("/var/tmp/fleet-a")));
        assert_ne!(a.tag, Plan::for_dir(Path::new("/var/tmp/fleet-b")).tag);
        assert_eq!(a.tag.len(), 6);
    }

    #[test]
    fn sizes_out_of_range_are_refused() {
        let plan = Plan::for_dir(Path::new("/x"));
        assert!(plan.member(0, "0", 1).is_err());
        assert!(plan.member(MAX_WORKERS + 1, "0", 1).is_err());
        assert!(plan.members(2, &[], 1).is_err());
    }
}
