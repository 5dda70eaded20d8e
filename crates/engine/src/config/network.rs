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
            if let Some(bad) = lambdas.iter().find(|l| !crate::names::valid_name(l)) {
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
