//! A member's host: its network namespace, joined to the host's by a veth pair with a /30
//! (the worker's address and the host side's, its default route), made and removed with
//! iproute2's `ip`; and the fleet's services address, on the host's loopback.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::plan::Member;

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip (apt-get install iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Whether the member's namespace exists.
pub fn exists(m: &Member) -> bool {
    std::path::Path::new("/run/netns").join(&m.netns).exists()
}

/// Make the member's namespace and link (removing a half-made one first).
pub fn create(m: &Member) -> Result<()> {
    remove(m);
    let (host, worker) = (format!("{}/30", m.host_addr), format!("{}/30", m.addr));
    let host_addr = m.host_addr.to_string();
    let steps: [&[&str]; 8] = [
        &["netns", "add", &m.netns],
        &["link", "add", &m.host_link, "type", "veth", "peer", "name", &m.worker_link, "netns", &m.netns],
        &["addr", "add", &host, "dev", &m.host_link],
        &["link", "set", &m.host_link, "up"],
        &["-n", &m.netns, "addr", "add", &worker, "dev", &m.worker_link],
        &["-n", &m.netns, "link", "set", &m.worker_link, "up"],
        &["-n", &m.netns, "link", "set", "lo", "up"],
        &["-n", &m.netns, "route", "add", "default", "via", &host_addr],
    ];
    for step in steps {
        if let Err(e) = ip(step) {
            remove(m);
            return Err(e.context(format!("making {}'s network namespace", m.name)));
        }
    }
    // The member is the machine its sandboxes' connections to services leave by: replies
    // arrive on its link and are forwarded to the sandbox (as on a real machine whose worker
    // has services on other hosts; the worker asks for this and warns without it).
    if let Err(e) = forward_on_link(m) {
        remove(m);
        return Err(e.context(format!("letting {}'s link forward", m.name)));
    }
    Ok(())
}

fn forward_on_link(m: &Member) -> Result<()> {
    let setting = format!("net.ipv4.conf.{}.forwarding=1", m.worker_link);
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", m.netns))
        .args(["sysctl", "-qw", &setting])
        .output()
        .context("running nsenter sysctl")?;
    if !out.status.success() {
        bail!("sysctl -w {setting}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Make the fleet's services address: `addr`/32 on the host's loopback device, labelled
/// `label` (the kernel may lack dummy links; a local address on `lo` is reached the same way).
pub fn create_services(label: &str, addr: std::net::Ipv4Addr) -> Result<()> {
    remove_services(label, addr);
    let cidr = format!("{addr}/32");
    ip(&["addr", "add", &cidr, "dev", "lo", "label", label]).context("making the fleet's services address")
}

/// Remove the fleet's services address (nothing when there is none).
pub fn remove_services(label: &str, addr: std::net::Ipv4Addr) {
    let _ = ip(&["addr", "del", &format!("{addr}/32"), "dev", "lo", "label", label]);
}

/// Remove the member's namespace (its end of the link goes with it, and so the host's).
pub fn remove(m: &Member) {
    let _ = ip(&["netns", "del", &m.netns]);
    let _ = ip(&["link", "del", &m.host_link]);
}
