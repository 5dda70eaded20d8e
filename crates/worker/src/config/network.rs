//! `[network]`: whether each lambda gets a network of its own, and the services sandboxes may
//! reach (`[[network.allow]]`), checked at start with the line of every mistake.

use std::net::SocketAddrV4;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use sprout_sandbox::network::{Block, Protocol, ServiceSpec};
use toml::Spanned;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkSection {
    pub isolate: bool,
    pub subnet: String,
    pub pool: usize,
    pub max_namespaces: usize,
    pub max_connections: u32,
    /// `[[network.allow]]` tables (documented in the template as comments, since a key
    /// `allow = []` there would clash with tables appended after it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<Spanned<AllowEntry>>,
}

impl Default for NetworkSection {
    fn default() -> Self {
        NetworkSection { isolate: true, subnet: "auto".into(), pool: 4, max_namespaces: 1024, max_connections: 512, allow: Vec::new() }
    }
}

/// One service sandboxes may reach.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowEntry {
    pub name: String,
    pub address: String,
    #[serde(default = "tcp")]
    pub protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lambdas: Option<Vec<String>>,
}

fn tcp() -> String {
    "tcp".into()
}

impl NetworkSection {
    /// The block configured, or None for `auto`.
    pub fn block(&self) -> Option<Block> {
        (self.subnet != "auto").then(|| Block::parse(&self.subnet).expect("checked by validate"))
    }

    /// The services, as the sandbox engine takes them (valid once `validate` passed).
    pub fn services(&self) -> Vec<ServiceSpec> {
        self.allow
            .iter()
            .map(|entry| {
                let e = entry.get_ref();
                ServiceSpec {
                    name: e.name.clone(),
                    protocol: Protocol::parse(&e.protocol).expect("checked"),
                    target: e.address.parse().expect("checked"),
                    lambdas: e.lambdas.clone(),
                }
            })
            .collect()
    }
}

/// The line (1-based) of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// A service name is a host name label: sandboxes find it in /etc/hosts.
fn valid_service_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && name != "localhost"
}

pub(super) fn validate(network: &NetworkSection, text: &str) -> Result<()> {
    if network.subnet != "auto" {
        if let Err(why) = Block::parse(&network.subnet) {
            bail!("network.subnet = {:?}: {why} (or \"auto\")", network.subnet);
        }
    }
    if network.max_namespaces == 0 || network.max_connections == 0 {
        bail!("network.max_namespaces and network.max_connections must be greater than 0");
    }
    if network.pool >= network.max_namespaces {
        bail!("network.pool ({}) must be smaller than network.max_namespaces ({})", network.pool, network.max_namespaces);
    }
    if network.allow.len() > 254 {
        bail!("network.allow lists {} services; at most 254 fit a block's service addresses", network.allow.len());
    }
    for (i, entry) in network.allow.iter().enumerate() {
        let e = entry.get_ref();
        let at = format!("line {}: network.allow[{i}]", line_of(text, entry.span().start));
        if !valid_service_name(&e.name) {
            bail!(
                "{at}.name = {:?}: a service name is 1-63 lower-case letters, digits and '-' (not at either end), and not \"localhost\"",
                e.name
            );
        }
        if let Some(j) = network.allow[..i].iter().position(|earlier| earlier.get_ref().name == e.name) {
            bail!("{at}.name = {:?} is already the name of network.allow[{j}]", e.name);
        }
        let Ok(target) = e.address.parse::<SocketAddrV4>() else {
            bail!(
                "{at}.address = {:?}: not an IPv4 address and port like \"127.0.0.1:5432\" (host names and IPv6 are not supported)",
                e.address
            );
        };
        if target.port() == 0 || target.ip().is_unspecified() || target.ip().is_multicast() || target.ip().is_broadcast() {
            bail!("{at}.address = {:?}: needs a real address and a port other than 0", e.address);
        }
        if Protocol::parse(&e.protocol).is_none() {
            bail!("{at}.protocol = {:?}: \"tcp\" or \"udp\"", e.protocol);
        }
        if let Some(lambdas) = &e.lambdas {
            if lambdas.is_empty() {
                bail!("{at}.lambdas is empty: list the lambdas that may reach {:?}, or leave it out to allow every lambda", e.name);
            }
            if let Some(bad) = lambdas.iter().find(|l| !crate::registry::valid_name(l)) {
                bail!("{at}.lambdas: {bad:?} is not a lambda name");
            }
        }
        for (j, earlier) in network.allow[..i].iter().enumerate() {
            let other = earlier.get_ref();
            if other.address == e.address && other.protocol == e.protocol {
                bail!("{at}.address = {:?} is already network.allow[{j}] ({:?})", e.address, other.name);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn error(text: &str) -> String {
        format!("{:#}", Config::parse(text).unwrap_err())
    }

    #[test]
    fn services_parse_with_defaults() {
        let c = Config::parse(
            "[network]\n[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:5432\"\n\n[[network.allow]]\nname = \"cache\"\naddress = \"10.1.2.3:11211\"\nprotocol = \"udp\"\nlambdas = [\"visits\"]\n",
        )
        .unwrap();
        let services = c.network.services();
        assert_eq!(services.len(), 2);
        assert_eq!(services[0].target.to_string(), "127.0.0.1:5432");
        assert_eq!(services[0].lambdas, None);
        assert_eq!(services[1].protocol, sprout_sandbox::network::Protocol::Udp);
        assert_eq!(services[1].lambdas.as_deref(), Some(&["visits".to_string()][..]));
    }

    #[test]
    fn a_malformed_allowlist_names_the_line_and_the_reason() {
        let head = "[worker]\nlog = \"info\"\n\n[network]\n";
        let cases = [
            ("[[network.allow]]\nname = \"db\"\naddress = \"localhost:5432\"\n", "line 5: network.allow[0].address", "IPv4 address and port"),
            ("[[network.allow]]\nname = \"Bad_Name\"\naddress = \"127.0.0.1:1\"\n", "line 5: network.allow[0].name", "lower-case"),
            ("[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:0\"\n", "line 5", "port other than 0"),
            ("[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:1\"\nprotocol = \"sctp\"\n", "line 5: network.allow[0].protocol", "\"tcp\" or \"udp\""),
            ("[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:1\"\nlambdas = []\n", "network.allow[0].lambdas is empty", "leave it out"),
            ("[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:1\"\nlambdas = [\"../x\"]\n", "network.allow[0].lambdas", "not a lambda name"),
            (
                "[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:1\"\n\n[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:2\"\n",
                "line 9: network.allow[1].name",
                "already the name of network.allow[0]",
            ),
            (
                "[[network.allow]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\n\n[[network.allow]]\nname = \"b\"\naddress = \"127.0.0.1:1\"\n",
                "line 9: network.allow[1].address",
                "already network.allow[0]",
            ),
            ("[[network.allow]]\nname = \"db\"\naddress = \"127.0.0.1:1\"\nport = 3\n", "line 8", "unknown field `port`"),
            ("[[network.allow]]\nname = \"db\"\n", "line 5", "missing field `address`"),
        ];
        for (body, place, reason) in cases {
            let err = error(&format!("{head}{body}"));
            assert!(err.contains(place) && err.contains(reason), "{body:?}: {err}");
        }
    }

    #[test]
    fn subnet_and_sizes_are_checked() {
        assert!(error("[network]\nsubnet = \"10.0.0.0/8\"\n").contains("network.subnet"));
        assert!(error("[network]\nsubnet = \"8.8.0.0/16\"\n").contains("private"));
        assert!(error("[network]\npool = 10\nmax_namespaces = 10\n").contains("network.pool"));
        assert_eq!(Config::parse("[network]\nsubnet = \"10.9.0.0/18\"\n").unwrap().network.block().unwrap().to_string(), "10.9.0.0/18");
    }
}
