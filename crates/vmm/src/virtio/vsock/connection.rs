//! One vsock stream between a host Unix socket and a guest port: its state and its credit
//! (virtio 1.2, 5.10.6.3). Pure bookkeeping; the device does the I/O it decides.

use std::num::Wrapping;

use super::packet::{Header, Op, TYPE_STREAM};

/// Bytes of guest data this side buffers for a connection before the host reads them: the
/// credit (`buf_alloc`) we give the guest.
pub const BUF_ALLOC: u32 = 256 << 10;

/// The host's CID, as every guest knows it.
pub const HOST_CID: u64 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The host asked for the guest's port; the guest has not answered.
    Connecting,
    Established,
}

#[derive(Debug)]
pub struct Connection {
    pub guest_cid: u64,
    pub guest_port: u32,
    pub host_port: u32,
    pub state: State,
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    /// Bytes sent to the guest.
    tx_cnt: Wrapping<u32>,
    /// Bytes of the guest's taken off our buffer (written to the host socket).
    fwd_cnt: Wrapping<u32>,
    /// `fwd_cnt` as last told to the guest.
    fwd_cnt_told: Wrapping<u32>,
    /// Guest bytes not yet written to the host socket.
    pub to_host: Vec<u8>,
}

impl Connection {
    pub fn new(guest_cid: u64, guest_port: u32, host_port: u32) -> Connection {
        Connection {
            guest_cid,
            guest_port,
            host_port,
            state: State::Connecting,
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            tx_cnt: Wrapping(0),
            fwd_cnt: Wrapping(0),
            fwd_cnt_told: Wrapping(0),
            to_host: Vec::new(),
        }
    }

    /// A header from this side, carrying our credit.
    pub fn header(&mut self, op: Op, len: u32) -> Header {
        self.fwd_cnt_told = self.fwd_cnt;
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.host_port,
            dst_port: self.guest_port,
            len,
            kind: TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc: BUF_ALLOC,
            fwd_cnt: self.fwd_cnt.0,
        }
    }

    /// Every guest packet tells us its credit.
    pub fn heard(&mut self, h: &Header) {
        self.peer_buf_alloc = h.buf_alloc;
        self.peer_fwd_cnt = Wrapping(h.fwd_cnt);
    }

    /// Bytes the guest can take now.
    pub fn peer_credit(&self) -> u32 {
        let in_flight = (self.tx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    pub fn sent(&mut self, n: u32) {
        self.tx_cnt += Wrapping(n);
    }

    /// Guest data arrived; false when it overflows the credit we gave (the guest broke the
    /// protocol and the connection must be reset).
    pub fn received(&mut self, data: &[u8]) -> bool {
        if self.to_host.len() + data.len() > BUF_ALLOC as usize {
            return false;
        }
        self.to_host.extend_from_slice(data);
        true
    }

    /// `n` bytes of `to_host` reached the host socket.
    pub fn forwarded(&mut self, n: usize) {
        self.to_host.drain(..n);
        self.fwd_cnt += Wrapping(n as u32);
    }

    /// Whether the guest should hear of freed buffer space now: once a quarter of its credit
    /// has come back since we last said.
    pub fn owes_credit_update(&self) -> bool {
        (self.fwd_cnt - self.fwd_cnt_told).0 >= BUF_ALLOC / 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest(op: Op, buf_alloc: u32, fwd_cnt: u32) -> Header {
        Header {
            src_cid: 3,
            dst_cid: HOST_CID,
            src_port: 1024,
            dst_port: 1 << 30,
            len: 0,
            kind: TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc,
            fwd_cnt,
        }
    }

    #[test]
    fn credit_is_the_peers_buffer_less_what_it_has_not_consumed() {
        let mut c = Connection::new(3, 1024, 1 << 30);
        assert_eq!(c.peer_credit(), 0, "no credit before the guest says");
        c.heard(&guest(Op::Response, 1000, 0));
        assert_eq!(c.peer_credit(), 1000);
        c.sent(600);
        assert_eq!(c.peer_credit(), 400);
        c.heard(&guest(Op::CreditUpdate, 1000, 500));
        assert_eq!(c.peer_credit(), 900);
    }

    #[test]
    fn credit_survives_the_counters_wrapping() {
        let mut c = Connection::new(3, 1024, 1 << 30);
        c.tx_cnt = Wrapping(u32::MAX - 10);
        c.heard(&guest(Op::CreditUpdate, 100, u32::MAX - 10));
        c.sent(50);
        assert_eq!(c.peer_credit(), 50);
    }

    #[test]
    fn guest_data_beyond_our_credit_is_refused() {
        let mut c = Connection::new(3, 1024, 1 << 30);
        assert!(c.received(&vec![0; BUF_ALLOC as usize]));
        assert!(!c.received(&[1]));
        c.forwarded(10);
        assert!(c.received(&[1; 10]));
    }

    #[test]
    fn a_credit_update_is_owed_after_a_quarter_of_the_buffer_drains() {
        let mut c = Connection::new(3, 1024, 1 << 30);
        assert!(c.received(&vec![0; BUF_ALLOC as usize]));
        c.forwarded(BUF_ALLOC as usize / 4 - 1);
        assert!(!c.owes_credit_update());
        c.forwarded(1);
        assert!(c.owes_credit_update());
        let h = c.header(Op::CreditUpdate, 0);
        assert_eq!(h.fwd_cnt, BUF_ALLOC / 4);
        assert!(!c.owes_credit_update());
    }
}
