//! The worker's nftables table, as text for `nft -f`: what a sandbox's packets may reach.
//!
//! Everything arriving from a sandbox link (`iifname "sb<tag>-*"`) meets one rule set, in one
//! table of its own (`inet sprout_<tag>`) that nothing else on the host shares:
//!
//! * **prerouting** rewrites a connection to a service's virtual address and port into the
//!   service's real address (DNAT, a map lookup): the worker-wide map first, then the map of
//!   grants keyed by the link, for services only some lambdas may use.
//! * **input** and **forward** accept replies and the connections prerouting rewrote (up to
//!   `max_connections` open per link, counted by conntrack) and refuse everything else at
//!   once: a TCP reset (the caller sees "connection refused") or an ICMP administratively
//!   prohibited (an error, never a timeout). Nothing reaches the host's own addresses, the
//!   worker's API, other links, or IPv6.
//! * **input_snat** makes a connection to a service on the host's loopback come from the
//!   loopback too, as it did when sandboxes shared the host's network: a service listening
//!   on 127.0.0.1 trusts its local clients (PostgreSQL's `host ... 127.0.0.1/32` lines)
//!   and sees a sandbox as one, never as an address from the worker's block.
//! * **postrouting** masquerades connections to services on other hosts behind the host's
//!   address.

use std::fmt::Write;
use std::net::{Ipv4Addr, SocketAddrV4};

/// The transport a service speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn parse(text: &str) -> Option<Protocol> {
        match text {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// A service sandboxes may reach: at `address` (virtual, in the worker's block) and the real
/// service's port, rewritten to `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub name: String,
    pub address: Ipv4Addr,
    pub protocol: Protocol,
    pub target: SocketAddrV4,
    /// Only these lambdas may reach it; None: every lambda.
    pub lambdas: Option<Vec<String>>,
}

impl Service {
    /// Where a sandbox connects: the virtual address and the real port.
    pub fn virtual_endpoint(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.address, self.target.port())
    }

    pub fn allows(&self, lambda: &str) -> bool {
        self.lambdas.as_ref().map(|l| l.iter().any(|n| n == lambda)).unwrap_or(true)
    }

    /// The map key and value of this service (without the link, for grants).
    fn element(&self) -> String {
        format!("{} . {} . {} : {} . {}", self.address, self.protocol.name(), self.target.port(), self.target.ip(), self.target.port())
    }
}

/// A service as configured, before it has a virtual address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    pub name: String,
    pub protocol: Protocol,
    pub target: SocketAddrV4,
    pub lambdas: Option<Vec<String>>,
}

impl ServiceSpec {
    /// The service where sandboxes reach it: at `address` (virtual, or the real one when
    /// sandboxes share the host's network).
    pub fn at(&self, address: Ipv4Addr) -> Service {
        Service { name: self.name.clone(), address, protocol: self.protocol, target: self.target, lambdas: self.lambdas.clone() }
    }
}

/// The table's name for the worker tagged `tag`.
pub fn table(tag: &str) -> String {
    format!("sprout_{tag}")
}

/// The whole table: `nft -f` makes it in one transaction (deleting an older one first).
pub fn ruleset(tag: &str, services: &[Service], max_connections: u32) -> String {
    let links = format!("\"{}*\"", super::plan::interface_prefix(tag));
    let everyone: Vec<String> = services.iter().filter(|s| s.lambdas.is_none()).map(Service::element).collect();
    let elements = if everyone.is_empty() { String::new() } else { format!("\t\telements = {{ {} }}\n", everyone.join(", ")) };
    let table = table(tag);
    let mut out = String::new();
    // Declaring the table first lets the delete succeed whether or not it existed.
    let _ = writeln!(out, "table inet {table} {{}}\ndelete table inet {table}");
    let _ = write!(
        out,
        "table inet {table} {{
\tmap services {{
\t\ttype ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
{elements}\t}}
\tmap lambda_services {{
\t\ttype ifname . ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
\t}}
\tset connections {{
\t\ttype ifname
\t\tsize 65535
\t\tflags dynamic
\t}}
\tchain prerouting {{
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tiifname {links} meta nfproto ipv4 dnat ip to ip daddr . meta l4proto . th dport map @services
\t\tiifname {links} meta nfproto ipv4 dnat ip to iifname . ip daddr . meta l4proto . th dport map @lambda_services
\t}}
\tchain postrouting {{
\t\ttype nat hook postrouting priority srcnat; policy accept;
\t\tiifname {links} ct status dnat oifname != \"lo\" masquerade
\t}}
\tchain input_snat {{
\t\ttype nat hook input priority 100; policy accept;
\t\tiifname {links} ct status dnat ip daddr 127.0.0.0/8 snat ip to 127.0.0.1
\t}}
\tchain input {{
\t\ttype filter hook input priority filter; policy accept;
\t\tiifname {links} jump from_sandbox
\t}}
\tchain forward {{
\t\ttype filter hook forward priority filter; policy accept;
\t\tiifname {links} jump from_sandbox
\t\toifname {links} ct state established,related accept
\t\toifname {links} reject with icmpx admin-prohibited
\t}}
\tchain from_sandbox {{
\t\tct state established,related accept
\t\tmeta l4proto tcp ct status dnat ct state new add @connections {{ iifname ct count over {max_connections} }} reject with tcp reset
\t\tmeta l4proto != tcp ct status dnat ct state new add @connections {{ iifname ct count over {max_connections} }} reject with icmpx admin-prohibited
\t\tct status dnat accept
\t\tmeta l4proto tcp reject with tcp reset
\t\tmeta l4proto udp reject with icmpx port-unreachable
\t\treject with icmpx admin-prohibited
\t}}
}}
"
    );
    out
}

/// The grant elements of the link `interface` for `lambda`: the services only some lambdas
/// may reach, of which it is one.
pub fn grants(interface: &str, lambda: &str, services: &[Service]) -> Vec<String> {
    services.iter().filter(|s| s.lambdas.is_some() && s.allows(lambda)).map(|s| format!("\"{interface}\" . {}", s.element())).collect()
}

/// `nft -f` input adding (or deleting) grant elements.
pub fn grant_command(tag: &str, verb: &str, elements: &[String]) -> String {
    format!("{verb} element inet {} lambda_services {{ {} }}\n", table(tag), elements.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, last: u8, target: &str, lambdas: Option<&[&str]>) -> Service {
        Service {
            name: name.into(),
            address: Ipv4Addr::new(10, 224, 0, last),
            protocol: Protocol::Tcp,
            target: target.parse().unwrap(),
            lambdas: lambdas.map(|l| l.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn worker_wide_services_are_map_elements_and_grants_are_not() {
        let services = [service("db", 1, "127.0.0.1:5432", None), service("cache", 2, "127.0.0.1:11211", Some(&["visits"]))];
        let text = ruleset("abc123", &services, 64);
        assert!(text.contains("elements = { 10.224.0.1 . tcp . 5432 : 127.0.0.1 . 5432 }"), "{text}");
        assert!(!text.contains("11211"), "{text}");
        assert!(text.contains("iifname \"sbabc123-*\" jump from_sandbox"));
        assert!(text.contains("ct count over 64"));
        assert!(text.starts_with("table inet sprout_abc123 {}\ndelete table inet sprout_abc123\n"));
        assert_eq!(grants("sbabc123-7", "visits", &services), ["\"sbabc123-7\" . 10.224.0.2 . tcp . 11211 : 127.0.0.1 . 11211"]);
        assert!(grants("sbabc123-7", "echo", &services).is_empty());
        assert_eq!(
            grant_command("abc123", "add", &grants("sbabc123-7", "visits", &services)),
            "add element inet sprout_abc123 lambda_services { \"sbabc123-7\" . 10.224.0.2 . tcp . 11211 : 127.0.0.1 . 11211 }\n"
        );
    }

    #[test]
    fn no_services_no_elements() {
        let text = ruleset("abc123", &[], 8);
        assert!(!text.contains("elements"));
    }

    #[test]
    fn services_say_where_sandboxes_connect_and_who_may() {
        let s = service("cache", 2, "127.0.0.1:11211", Some(&["visits"]));
        assert_eq!(s.virtual_endpoint().to_string(), "10.224.0.2:11211");
        assert!(s.allows("visits") && !s.allows("echo"));
        assert!(service("db", 1, "127.0.0.1:5432", None).allows("anyone"));
        assert_eq!(Protocol::parse("udp"), Some(Protocol::Udp));
        assert_eq!(Protocol::parse("sctp"), None);
    }
}
