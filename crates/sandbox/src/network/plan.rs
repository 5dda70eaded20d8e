//! The address plan of a worker's sandbox network: which addresses of its block the services'
//! virtual addresses and the namespaces' links take, and what the host's interfaces are called.
//!
//! A block is one private IPv4 prefix per worker (/16 to /23). Its first 256 addresses are
//! the services' virtual addresses (service `i` is `base + 1 + i`), the rest are links: the
//! namespace in slot `k` has `base + 256 + k` on its `eth0`, as a /32, and the host's end of
//! its veth pair is named `sb<tag>-<k>`. Every namespace routes the virtual addresses through
//! its link and nothing else, so each needs one address, and a /18 holds 16,128 of them. The
//! block's first address is the links' gateway.

use std::net::Ipv4Addr;

/// Addresses reserved at the start of a block for the services' virtual addresses.
const SERVICE_SPAN: u32 = 256;
/// The range `auto` picks blocks from, and the size of the blocks it picks.
const AUTO_RANGE: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 224, 0, 0), 11);
pub const AUTO_PREFIX: u8 = 18;

/// One worker's IPv4 block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub base: Ipv4Addr,
    pub prefix: u8,
}

impl Block {
    /// Parse `a.b.c.d/n` (n from 16 to 23, no host bits set).
    pub fn parse(text: &str) -> Result<Block, String> {
        let (addr, prefix) = text.split_once('/').ok_or_else(|| format!("{text:?} is not a block like \"10.224.0.0/18\""))?;
        let base: Ipv4Addr = addr.parse().map_err(|_| format!("{addr:?} is not an IPv4 address"))?;
        let prefix: u8 = prefix.parse().map_err(|_| format!("{prefix:?} is not a prefix length"))?;
        if !(16..=23).contains(&prefix) {
            return Err(format!("a block must be from /16 to /23, not /{prefix}"));
        }
        let block = Block { base, prefix };
        if u32::from(base) & !block.mask() != 0 {
            return Err(format!(
                "{text} has host bits set; the block starts at {}/{prefix}",
                Ipv4Addr::from(u32::from(base) & block.mask())
            ));
        }
        if !base.is_private() {
            return Err(format!("{text} is not a private (RFC 1918) block"));
        }
        Ok(block)
    }

    fn mask(&self) -> u32 {
        u32::MAX << (32 - self.prefix)
    }

    pub fn size(&self) -> u32 {
        1 << (32 - self.prefix)
    }

    /// How many namespaces the block can address.
    pub fn slots(&self) -> u32 {
        self.size() - SERVICE_SPAN
    }

    /// The virtual address of service `index`; None past the 254th.
    pub fn service_address(&self, index: usize) -> Option<Ipv4Addr> {
        (index < 254).then(|| Ipv4Addr::from(u32::from(self.base) + 1 + index as u32))
    }

    /// The address every namespace's link sees the host at, through which the services are
    /// routed (a permanent neighbour entry, so the link never sends ARP): the block's first
    /// address, one of the host's own like every service address, so that anything sent to
    /// it is refused by the host at once.
    pub fn gateway(&self) -> Ipv4Addr {
        self.base
    }

    /// The /24 every service address lies in.
    pub fn services_net(&self) -> String {
        format!("{}/24", self.base)
    }

    /// The address of the namespace in `slot`.
    pub fn link_address(&self, slot: u32) -> Option<Ipv4Addr> {
        (slot < self.slots()).then(|| Ipv4Addr::from(u32::from(self.base) + SERVICE_SPAN + slot))
    }

    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & self.mask() == u32::from(self.base)
    }

    /// Whether this block and the prefix `other`/`prefix` share any address.
    pub fn overlaps(&self, other: Ipv4Addr, prefix: u8) -> bool {
        let shorter = self.prefix.min(prefix);
        let mask = if shorter == 0 { 0 } else { u32::MAX << (32 - shorter) };
        u32::from(self.base) & mask == u32::from(other) & mask
    }
}

impl std::fmt::Display for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// The blocks `subnet = "auto"` tries, in order: every /18 of 10.224.0.0/11, starting at one
/// chosen by `seed` (a hash of the worker's name), so workers on one machine rarely probe the
/// same block first.
pub fn auto_candidates(seed: u32) -> impl Iterator<Item = Block> {
    let count = 1u32 << (AUTO_PREFIX - AUTO_RANGE.1);
    let start = seed % count;
    (0..count).map(move |i| {
        let n = (start + i) % count;
        Block { base: Ipv4Addr::from(u32::from(AUTO_RANGE.0) + (n << (32 - AUTO_PREFIX))), prefix: AUTO_PREFIX }
    })
}

/// The host's end of the link of the namespace in `slot` (at most 15 bytes: `sb` + 6 hex + `-` + 5 digits).
pub fn interface(tag: &str, slot: u32) -> String {
    format!("{}{slot}", interface_prefix(tag))
}

/// What every host interface of the worker tagged `tag` starts with.
pub fn interface_prefix(tag: &str) -> String {
    format!("sb{tag}-")
}

/// Locally administered MAC addresses for the two ends of slot `slot`'s link (host, sandbox),
/// fixed so that each end's neighbour entry can be written before the link is up.
pub fn link_macs(slot: u32) -> (String, String) {
    let b = slot.to_be_bytes();
    let mac = |side: u8| format!("02:5b:{side:02x}:{:02x}:{:02x}:{:02x}", b[1], b[2], b[3]);
    (mac(0), mac(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_private_blocks_and_refuses_the_rest() {
        let b = Block::parse("10.224.64.0/18").unwrap();
        assert_eq!((b.size(), b.slots()), (16384, 16128));
        for (bad, why) in [
            ("10.224.64.1/18", "host bits"),
            ("10.0.0.0/8", "/16 to /23"),
            ("10.0.0.0/24", "/16 to /23"),
            ("8.8.0.0/16", "private"),
            ("10.0.0.0", "block like"),
            ("10.0.0/16", "IPv4 address"),
            ("10.0.0.0/x", "prefix length"),
        ] {
            let err = Block::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn services_then_links() {
        let b = Block::parse("10.224.64.0/18").unwrap();
        assert_eq!(b.service_address(0), Some(Ipv4Addr::new(10, 224, 64, 1)));
        assert_eq!(b.service_address(253), Some(Ipv4Addr::new(10, 224, 64, 254)));
        assert_eq!(b.service_address(254), None);
        assert_eq!(b.link_address(0), Some(Ipv4Addr::new(10, 224, 65, 0)));
        assert_eq!(b.link_address(16127), Some(Ipv4Addr::new(10, 224, 127, 255)));
        assert_eq!(b.link_address(16128), None);
        assert!(b.contains(b.link_address(16127).unwrap()));
        assert!(!b.contains(Ipv4Addr::new(10, 224, 128, 0)));
        assert_eq!(b.services_net(), "10.224.64.0/24");
    }

    #[test]
    fn overlap_either_way() {
        let b = Block::parse("10.224.64.0/18").unwrap();
        assert!(b.overlaps(Ipv4Addr::new(10, 0, 0, 0), 8));
        assert!(b.overlaps(Ipv4Addr::new(10, 224, 70, 3), 32));
        assert!(!b.overlaps(Ipv4Addr::new(10, 224, 128, 0), 18));
        assert!(b.overlaps(Ipv4Addr::new(0, 0, 0, 0), 0));
    }

    #[test]
    fn auto_tries_every_block_of_the_range_once() {
        let all: Vec<Block> = auto_candidates(5).collect();
        assert_eq!(all.len(), 128);
        assert_eq!(all[0], Block { base: Ipv4Addr::new(10, 225, 64, 0), prefix: 18 });
        let mut bases: Vec<u32> = all.iter().map(|b| u32::from(b.base)).collect();
        bases.sort();
        bases.dedup();
        assert_eq!(bases.len(), 128);
        assert!(all.iter().all(|b| Block::parse(&b.to_string()).is_ok()));
    }

    #[test]
    fn interface_names_fit_the_kernel_limit() {
        assert_eq!(interface("a1b2c3", 16127), "sba1b2c3-16127");
        assert!(interface("a1b2c3", 16127).len() <= 15);
        let (host, sandbox) = link_macs(258);
        assert_eq!(host, "02:5b:00:00:01:02");
        assert_eq!(sandbox, "02:5b:01:00:01:02");
    }
}
