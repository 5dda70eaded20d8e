//! The host's side of a worker's sandbox network: claiming its address block, its routes and
//! its nftables table at start, and removing all of them at shutdown or after a crash.
//!
//! A block is claimed by two routes: a blackhole for the whole block (the namespaces' /32
//! routes are more specific, so only unused addresses fall into it) and a `local` route
//! for the services' /24, which makes every virtual address one of the host's own, so
//! packets to it are answered or refused by the host, never forwarded. Choosing a free
//! block and claiming it happen under a machine-wide lock, so workers starting together never
//! take the same one. What was claimed is written to `DIR/network.json`, which `cleanup`
//! reads after a crash.

use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::namespace::{delete_link, ip_binary, links_with_prefix, quietly, run_script};
use super::plan::{self, Block};
use super::rules::{self, ServiceSpec};

const STATE_FILE: &str = "network.json";
const LOCK_FILE: &str = "/run/sprout/network.lock";

/// What a worker claimed, as written to `DIR/network.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claim {
    pub tag: String,
    pub block: String,
}

/// Where `nft` is.
pub fn nft_binary() -> Option<&'static str> {
    ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"].into_iter().find(|p| Path::new(p).exists())
}

fn need_tools() -> io::Result<(&'static str, &'static str)> {
    match (ip_binary(), nft_binary()) {
        (Some(ip), Some(nft)) => Ok((ip, nft)),
        (None, _) => Err(io::Error::new(io::ErrorKind::NotFound, "network isolation needs iproute2's `ip` (apt-get install iproute2)")),
        (_, None) => Err(io::Error::new(io::ErrorKind::NotFound, "network isolation needs `nft` (apt-get install nftables)")),
    }
}

/// The IPv4 prefixes of every route on the host, in every table.
fn host_routes(ip: &str) -> io::Result<Vec<(Ipv4Addr, u8, String)>> {
    let out = Command::new(ip).args(["-4", "-o", "route", "show", "table", "all"]).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!("ip route show: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(parse_routes(&String::from_utf8_lossy(&out.stdout)))
}

/// Destination prefixes of `ip -o route` lines (`[type] dst ...`), with each line.
fn parse_routes(text: &str) -> Vec<(Ipv4Addr, u8, String)> {
    let kinds = ["unicast", "local", "broadcast", "multicast", "blackhole", "unreachable", "prohibit", "throw", "nat", "anycast"];
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let mut dst = words.next()?;
            if kinds.contains(&dst) {
                dst = words.next()?;
            }
            let (addr, prefix) = match dst {
                "default" => (Ipv4Addr::UNSPECIFIED, 0),
                d => match d.split_once('/') {
                    Some((a, p)) => (a.parse().ok()?, p.parse().ok()?),
                    None => (d.parse().ok()?, 32),
                },
            };
            (prefix > 0).then(|| (addr, prefix, line.trim().to_string()))
        })
        .collect()
}

/// A route overlapping `block`, if the host has one.
fn conflict(block: &Block, routes: &[(Ipv4Addr, u8, String)]) -> Option<String> {
    routes.iter().find(|(a, p, _)| block.overlaps(*a, *p)).map(|r| r.2.clone())
}

/// Take `wanted` (or, with None, the first free block of [`plan::auto_candidates`] from
/// `seed`), add its routes and the nftables table, and record the claim in `worker_dir`.
/// Returns the block and the services at their virtual addresses in it.
pub fn claim(
    worker_dir: &Path,
    tag: &str,
    wanted: Option<Block>,
    seed: u32,
    specs: &[ServiceSpec],
    max_connections: u32,
) -> io::Result<(Block, Vec<rules::Service>)> {
    let (ip, nft) = need_tools()?;
    std::fs::create_dir_all("/run/sprout")?;
    let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(LOCK_FILE)?;
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))?;
    let routes = host_routes(ip)?;
    let block = match wanted {
        Some(block) => {
            if let Some(route) = conflict(&block, &routes) {
                return Err(io::Error::other(format!(
                    "network.subnet {block} overlaps the host's route `{route}` (another worker's, or a real network): choose another"
                )));
            }
            block
        }
        None => plan::auto_candidates(seed).find(|b| conflict(b, &routes).is_none()).ok_or_else(|| {
            io::Error::other("no /18 of 10.224.0.0/11 is free of the host's routes: set network.subnet to a free private block")
        })?,
    };
    let services: Vec<rules::Service> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| s.at(block.service_address(i).expect("at most 254 services (the configuration checks)")))
        .collect();
    run_script(
        command(ip, &["-batch", "-"]),
        &format!("route add blackhole {block}\nroute add local {} dev lo table local\n", block.services_net()),
    )?;
    let state = Claim { tag: tag.to_string(), block: block.to_string() };
    let result = std::fs::write(worker_dir.join(STATE_FILE), serde_json::to_vec(&state)?)
        .and_then(|()| run_script(command(nft, &["-f", "-"]), &rules::ruleset(tag, &services, max_connections)));
    if let Err(e) = result {
        release(worker_dir, tag);
        return Err(e);
    }
    Ok((block, services))
}

/// Add (`verb` "add") or remove ("delete") grant elements in the worker's table.
pub fn update_grants(tag: &str, verb: &str, elements: &[String]) -> io::Result<()> {
    if elements.is_empty() {
        return Ok(());
    }
    let (_, nft) = need_tools()?;
    run_script(command(nft, &["-f", "-"]), &rules::grant_command(tag, verb, elements))
}

/// Let IPv4 packets arriving on `interface` be forwarded (to services on other hosts).
pub fn allow_forwarding(interface: &str) -> io::Result<()> {
    std::fs::write(format!("/proc/sys/net/ipv4/conf/{interface}/forwarding"), "1")
}

/// Remove everything the worker tagged `tag` in `worker_dir` set up on the host: its links,
/// its table and the routes of its claim. Returns what it removed, for the report.
pub fn release(worker_dir: &Path, tag: &str) -> Vec<String> {
    let mut removed = Vec::new();
    for link in links_with_prefix(&plan::interface_prefix(tag)) {
        delete_link(&link);
        removed.push(format!("link {link}"));
    }
    if let Some(nft) = nft_binary() {
        let table = rules::table(tag);
        if quietly(nft, &["list", "table", "inet", &table]) && quietly(nft, &["delete", "table", "inet", &table]) {
            removed.push(format!("nftables table {table}"));
        }
    }
    let state_path = state_file(worker_dir);
    if let Some(claim) = std::fs::read(&state_path).ok().and_then(|b| serde_json::from_slice::<Claim>(&b).ok()) {
        if let (Some(ip), Ok(block)) = (ip_binary(), Block::parse(&claim.block)) {
            if quietly(ip, &["route", "del", "blackhole", &claim.block]) {
                removed.push(format!("route blackhole {}", claim.block));
            }
            if quietly(ip, &["route", "del", "local", &block.services_net(), "dev", "lo", "table", "local"]) {
                removed.push(format!("route local {}", block.services_net()));
            }
        }
        let _ = std::fs::remove_file(&state_path);
    }
    removed
}

pub fn state_file(worker_dir: &Path) -> PathBuf {
    worker_dir.join(STATE_FILE)
}

fn command(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_of_every_kind_are_read() {
        let text = "default via 172.16.0.1 dev eth0\n\
                    10.0.0.0/8 dev wg0 scope link\n\
                    local 10.224.64.0/24 dev lo table local proto kernel\n\
                    blackhole 10.224.64.0/18\n\
                    broadcast 127.255.255.255 dev lo table local\n\
                    172.16.0.0/24 dev eth0 proto kernel scope link src 172.16.0.2\n";
        let routes = parse_routes(text);
        let dsts: Vec<String> = routes.iter().map(|(a, p, _)| format!("{a}/{p}")).collect();
        assert_eq!(dsts, ["10.0.0.0/8", "10.224.64.0/24", "10.224.64.0/18", "127.255.255.255/32", "172.16.0.0/24"]);
    }

    #[test]
    fn a_block_conflicts_with_what_overlaps_it_only() {
        let routes = parse_routes("10.224.0.0/18 dev sb1\n192.168.0.0/16 dev eth1\n");
        assert!(conflict(&Block::parse("10.224.0.0/18").unwrap(), &routes).is_some());
        assert!(conflict(&Block::parse("10.224.32.0/20").unwrap(), &routes).is_some());
        assert!(conflict(&Block::parse("10.224.64.0/18").unwrap(), &routes).is_none());
        let free = plan::auto_candidates(0).find(|b| conflict(b, &routes).is_none()).unwrap();
        assert_eq!(free.to_string(), "10.224.64.0/18");
    }
}
