//! The virtio-vsock packet header (virtio 1.2, section 5.10.6): 44 bytes, little endian, in
//! front of every packet on the rx and tx queues.

/// Bytes of a header.
pub const HEADER_LEN: usize = 44;

/// Stream sockets, the only type this device carries.
pub const TYPE_STREAM: u16 = 1;

/// What a packet asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    Request = 1,
    Response = 2,
    Rst = 3,
    Shutdown = 4,
    Rw = 5,
    CreditUpdate = 6,
    CreditRequest = 7,
}

impl Op {
    fn from_u16(v: u16) -> Option<Op> {
        Some(match v {
            1 => Op::Request,
            2 => Op::Response,
            3 => Op::Rst,
            4 => Op::Shutdown,
            5 => Op::Rw,
            6 => Op::CreditUpdate,
            7 => Op::CreditRequest,
            _ => return None,
        })
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub kind: u16,
    pub op: Op,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.kind.to_le_bytes());
        b[30..32].copy_from_slice(&(self.op as u16).to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// Decode a header; None when it is short or names no known operation.
    pub fn decode(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER_LEN {
            return None;
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(Header {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            kind: u16_at(28),
            op: Op::from_u16(u16_at(30))?,
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_survives_encoding() {
        let h = Header {
            src_cid: 2,
            dst_cid: 3,
            src_port: 1 << 30,
            dst_port: 1024,
            len: 17,
            kind: TYPE_STREAM,
            op: Op::Rw,
            flags: 3,
            buf_alloc: 256 << 10,
            fwd_cnt: 99,
        };
        let bytes = h.encode();
        assert_eq!(&bytes[30..32], &[5, 0]);
        assert_eq!(Header::decode(&bytes), Some(h));
    }

    #[test]
    fn short_or_unknown_headers_are_refused() {
        assert_eq!(Header::decode(&[0u8; 43]), None);
        let mut b = [0u8; HEADER_LEN];
        b[30] = 9;
        assert_eq!(Header::decode(&b), None);
    }
}
