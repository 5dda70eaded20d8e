//! One sandbox network namespace: made with its loopback up and one veth link to the host,
//! held by a descriptor (never a name under /run/netns, so nothing outlives the worker), and
//! deleted with its link.
//!
//! Making one takes two runs of iproute2's `ip -batch`, a few milliseconds, which is why the
//! pool makes them ahead ([`super::pool`]). The first run configures the inside and *is* the
//! namespace's first process: it unshares a new network namespace before it execs (after
//! joining the package Zygotes' user namespace, when there is one, so that the namespace
//! belongs to it and handlers forked by package Zygotes may join it), then blocks reading its
//! commands while the second run, on the host, makes the veth pair with one end inside.
//!
//! Inside: `lo` up; `eth0` with the namespace's /32 address; a permanent neighbour entry for
//! the gateway (the host's end, whose MAC is fixed) and one route, the services' /24, through
//! it. No default route: any other destination fails at once with "network unreachable".

use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use super::plan::{self, Block};
use crate::error::Doing;

/// A network namespace made for sandboxes, with its link.
#[derive(Debug)]
pub struct Namespace {
    fd: OwnedFd,
    pub slot: u32,
    /// The host's end of its link.
    pub interface: String,
    /// Its address (on `eth0` inside).
    pub address: Ipv4Addr,
    /// The `ip` commands that configure its inside, idempotent (`replace`).
    inside: String,
}

impl Namespace {
    /// The descriptor to `setns` into.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Configure the inside again: gVisor's network stack takes `eth0`'s address and routes
    /// away from the host's kernel while a gVisor sandbox uses the namespace, and does not
    /// give them back when it ends.
    pub fn configure_again(&self) -> io::Result<()> {
        ip_in(self.fd.as_raw_fd(), &self.inside)
    }

    /// Lend its link (`eth0`) to the network namespace `to`, configured there as it is here:
    /// a gVisor pod created ahead in a namespace of its own takes its lambda's link (the
    /// host's end, and its rules, unchanged).
    pub fn lend_link(&self, to: RawFd) -> io::Result<()> {
        move_link(self.fd.as_raw_fd(), "eth0", to)?;
        ip_in(to, &self.inside)
    }

    /// Take its link back from the namespace `from` it was lent to (configured again before
    /// the next pod starts here).
    pub fn take_link_back(&self, from: RawFd) -> io::Result<()> {
        move_link(from, "eth0", self.fd.as_raw_fd())
    }
}

/// Move the link `name` of the network namespace `from` into the namespace `to`: one
/// rtnetlink request (`ip link set NAME netns`, without a process) from a thread that enters
/// `from` and ends.
fn move_link(from: RawFd, name: &str, to: RawFd) -> io::Result<()> {
    const NLM_F_REQUEST_ACK: u16 = 1 | 4;
    const NLMSG_ERROR: u16 = 2;
    const IFLA_IFNAME: u16 = 3;
    const IFLA_NET_NS_FD: u16 = 28;
    let name_len = 4 + name.len() + 1;
    let total = 16 + 16 + 8 + name_len.next_multiple_of(4);
    let mut msg = Vec::with_capacity(total);
    msg.extend((total as u32).to_ne_bytes());
    msg.extend(libc::RTM_NEWLINK.to_ne_bytes());
    msg.extend(NLM_F_REQUEST_ACK.to_ne_bytes());
    msg.extend([1u32, 0].iter().flat_map(|v| v.to_ne_bytes())); // sequence, port
    msg.extend([0u8; 16]); // ifinfomsg: any family, the link named below
    msg.extend([8u16, IFLA_NET_NS_FD].iter().flat_map(|v| v.to_ne_bytes()));
    msg.extend((to as u32).to_ne_bytes());
    msg.extend([name_len as u16, IFLA_IFNAME].iter().flat_map(|v| v.to_ne_bytes()));
    msg.extend(name.as_bytes());
    msg.resize(total, 0);
    let request = move || -> io::Result<()> {
        // SAFETY: setns affects only this thread, which ends after the request; the socket is
        // owned at once; send and recv get buffers of the lengths given.
        unsafe {
            if libc::setns(from, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            let sock = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE);
            if sock < 0 {
                return Err(io::Error::last_os_error());
            }
            let sock = <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(sock);
            if libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut reply = [0u8; 1024];
            let got = libc::recv(sock.as_raw_fd(), reply.as_mut_ptr().cast(), reply.len(), 0);
            if got < 20 {
                return Err(if got < 0 { io::Error::last_os_error() } else { io::Error::other("a short netlink reply") });
            }
            let kind = u16::from_ne_bytes([reply[4], reply[5]]);
            let error = i32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]);
            match (kind, error) {
                (NLMSG_ERROR, 0) => Ok(()),
                (NLMSG_ERROR, e) => Err(io::Error::from_raw_os_error(-e)),
                _ => Err(io::Error::other(format!("a netlink reply of type {kind}"))),
            }
        }
    };
    let moved = std::thread::spawn(request).join().map_err(|_| io::Error::other("the thread moving a link panicked"))?;
    moved.map_err(|e| io::Error::new(e.kind(), format!("moving {name} to another network namespace: {e}")))
}

/// Run `ip -batch` with `script` inside the network namespace `fd`.
fn ip_in(fd: RawFd, script: &str) -> io::Result<()> {
    let ip = ip_binary().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "iproute2's ip is not installed"))?;
    let mut inside = Command::new(ip);
    inside.args(["-batch", "-"]);
    // SAFETY: the closure runs in the forked child before exec and makes one system call
    // on a descriptor the child inherited.
    unsafe {
        inside.pre_exec(move || if libc::setns(fd, libc::CLONE_NEWNET) != 0 { Err(io::Error::last_os_error()) } else { Ok(()) });
    }
    run_script(inside, script)
}

/// Where iproute2's `ip` is; the worker refuses to isolate sandboxes without it.
pub fn ip_binary() -> Option<&'static str> {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].into_iter().find(|p| std::path::Path::new(p).exists())
}

/// Run `program` with `script` on its standard input; an error carries what it printed.
pub(super) fn run_script(mut command: Command, script: &str) -> io::Result<()> {
    command.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = command.spawn()?;
    child.stdin.take().expect("piped").write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        return Err(io::Error::other(format!("{:?} failed ({}): {}", command.get_program(), out.status, said.trim())));
    }
    Ok(())
}

/// Make the namespace of `slot` in `block` for the worker tagged `tag`. With `owner` (a user
/// namespace in which the worker's root maps to nobody) the namespace belongs to that user
/// namespace.
pub fn create(tag: &str, block: &Block, slot: u32, owner: Option<RawFd>) -> io::Result<Namespace> {
    let ip = ip_binary().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "iproute2's ip is not installed"))?;
    let address = block.link_address(slot).ok_or_else(|| io::Error::other(format!("slot {slot} is outside {block}")))?;
    let interface = plan::interface(tag, slot);
    let (host_mac, inside_mac) = plan::link_macs(slot);

    // The inside's `ip`: first process of the new namespace, reading its commands once the
    // link exists.
    let mut inside = Command::new(ip);
    inside.args(["-batch", "-"]).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and makes only system calls.
    unsafe {
        inside.pre_exec(move || {
            if let Some(userns) = owner {
                if libc::setns(userns, libc::CLONE_NEWUSER) != 0
                    || libc::syscall(libc::SYS_setresgid, 0, 0, 0) != 0
                    || libc::syscall(libc::SYS_setresuid, 0, 0, 0) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = inside.spawn().doing("starting ip in a new network namespace")?;
    let made = (|| {
        let fd = OwnedFd::from(std::fs::File::open(format!("/proc/{}/ns/net", child.id()))?);
        let host = format!(
            "link add {interface} address {host_mac} type veth peer name eth0 address {inside_mac} netns {pid}\n\
             link set {interface} up\n\
             route add {address}/32 dev {interface}\n\
             neigh replace {address} lladdr {inside_mac} dev {interface} nud permanent\n",
            pid = child.id()
        );
        let mut host_ip = Command::new(ip);
        host_ip.args(["-batch", "-"]);
        run_script(host_ip, &host)?;
        for (key, value) in [("ipv4/conf/{}/route_localnet", "1"), ("ipv6/conf/{}/disable_ipv6", "1")] {
            let path = format!("/proc/sys/net/{}", key.replace("{}", &interface));
            if std::path::Path::new(&path).exists() {
                std::fs::write(&path, value).at("writing", std::path::Path::new(&path))?;
            }
        }
        Ok::<_, io::Error>(fd)
    })();
    let script = format!(
        "link set lo up\n\
         addr replace {address}/32 dev eth0\n\
         link set eth0 addrgenmode none\n\
         addr flush dev eth0 scope link\n\
         link set eth0 up\n\
         route replace {gateway}/32 dev eth0\n\
         neigh replace {gateway} lladdr {host_mac} dev eth0 nud permanent\n\
         route replace {services} via {gateway} dev eth0 onlink\n",
        services = block.services_net(),
        gateway = block.gateway()
    );
    let mut stdin = child.stdin.take().expect("piped");
    if made.is_ok() {
        let _ = stdin.write_all(script.as_bytes());
    }
    drop(stdin);
    let out = child.wait_with_output()?;
    let fd = match made {
        Ok(fd) => fd,
        Err(e) => {
            delete_link(&interface);
            return Err(e);
        }
    };
    if !out.status.success() {
        delete_link(&interface);
        return Err(io::Error::other(format!("configuring the namespace: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(Namespace { fd, slot, interface, address, inside: script })
}

/// Delete a namespace's link (its other end goes with it); the namespace itself goes when
/// its descriptor and its last process are gone.
pub fn destroy(ns: Namespace) {
    delete_link(&ns.interface);
    drop(ns.fd);
}

/// Delete the host interface `name`, if it exists.
pub fn delete_link(name: &str) {
    if let Some(ip) = ip_binary() {
        quietly(ip, &["link", "del", name]);
    }
}

/// Run `program` with its output discarded; whether it succeeded.
pub(super) fn quietly(program: &str, args: &[&str]) -> bool {
    Command::new(program).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().map(|s| s.success()).unwrap_or(false)
}

/// Names of the host's interfaces starting with `prefix`.
pub fn links_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/class/net") else {
        return Vec::new();
    };
    entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with(prefix)).collect()
}
