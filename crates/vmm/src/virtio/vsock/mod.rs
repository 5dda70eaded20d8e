//! virtio-vsock (virtio 1.2, section 5.10) with its back-end in the VMM over host Unix
//! sockets, as Firecracker does it where there is no vhost: a host program connects to the
//! VM's socket, writes `CONNECT <guest port>\n`, and once the guest accepts reads
//! `OK <host port>\n`; from then on the Unix stream is the guest's vsock stream. Guest-made
//! connections to the host are refused (reset): a sandbox only answers.
//!
//! The queues are served on the vCPU's thread when the guest notifies them, and on a poll
//! thread when a host socket has data or room; both take the one [`Muxer`] lock.

pub mod connection;
pub mod packet;

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use mio::net::{UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Registry, Token};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{read_config_bytes, Interrupt, VirtioDevice, VIRTIO_F_VERSION_1};
use connection::{Connection, State, HOST_CID};
use packet::{Header, Op, HEADER_LEN, TYPE_STREAM};

const DEVICE_VSOCK: u32 = 19;
const QUEUE_SIZE: u16 = 256;
const RX: usize = 0;
const TX: usize = 1;
/// Largest payload of one packet either way (Linux's default receive buffer).
const MAX_PAYLOAD: usize = 64 << 10;
/// Host ports of connections count up from here (below are the guest's well-known ones).
const FIRST_HOST_PORT: u32 = 1 << 30;
const LISTENER: Token = Token(0);
/// Longest `CONNECT <port>\n` line.
const MAX_CONNECT_LINE: usize = 32;

/// The vsock device.
pub struct Vsock {
    cid: u64,
    muxer: Arc<Mutex<Muxer>>,
    poll: Option<Poll>,
}

impl Vsock {
    /// A device with guest CID `cid`, listening for host connections on the Unix socket at
    /// `uds` (made here; an old one is replaced).
    pub fn new(cid: u64, uds: &Path) -> Result<Vsock> {
        let _ = std::fs::remove_file(uds);
        let mut listener = UnixListener::bind(uds).with_context(|| format!("binding the vsock socket {}", uds.display()))?;
        let poll = Poll::new().context("creating the vsock poller")?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let registry = poll.registry().try_clone()?;
        let muxer = Muxer {
            cid,
            listener,
            registry,
            memory: None,
            queues: Vec::new(),
            interrupt: None,
            handshakes: HashMap::new(),
            connections: HashMap::new(),
            control: VecDeque::new(),
            next_port: FIRST_HOST_PORT,
        };
        Ok(Vsock { cid, muxer: Arc::new(Mutex::new(muxer)), poll: Some(poll) })
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        DEVICE_VSOCK
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 3]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.cid.to_le_bytes(), offset, data);
    }

    fn activate(&mut self, memory: GuestMemoryMmap, queues: Vec<Queue>, interrupt: Interrupt) -> Result<()> {
        {
            let mut m = self.muxer.lock().unwrap_or_else(|e| e.into_inner());
            m.memory = Some(memory);
            m.queues = queues;
            m.interrupt = Some(interrupt);
        }
        let poll = self.poll.take().context("the vsock device was activated twice")?;
        let muxer = self.muxer.clone();
        std::thread::Builder::new().name("vsock".into()).spawn(move || poll_host(poll, muxer))?;
        Ok(())
    }

    fn notify(&mut self, index: u16) {
        let mut m = self.muxer.lock().unwrap_or_else(|e| e.into_inner());
        if index as usize == TX {
            m.process_tx();
        }
        m.pump();
    }
}

/// The poll thread: host sockets' readiness, handled under the muxer's lock.
fn poll_host(mut poll: Poll, muxer: Arc<Mutex<Muxer>>) {
    let mut events = Events::with_capacity(64);
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        let mut m = muxer.lock().unwrap_or_else(|e| e.into_inner());
        for event in events.iter() {
            m.host_event(event.token(), event.is_readable(), event.is_writable());
        }
        m.pump();
    }
}

/// A host connection that has not yet said which guest port it wants.
struct Handshake {
    stream: UnixStream,
    line: Vec<u8>,
}

/// An open stream: its bookkeeping and its host end.
struct Link {
    conn: Connection,
    stream: UnixStream,
    /// The host end may have data we have not read (edge-triggered readiness).
    readable: bool,
}

/// All of the device's state behind one lock.
pub struct Muxer {
    cid: u64,
    listener: UnixListener,
    registry: Registry,
    memory: Option<GuestMemoryMmap>,
    queues: Vec<Queue>,
    interrupt: Option<Interrupt>,
    handshakes: HashMap<u32, Handshake>,
    /// By host port.
    connections: HashMap<u32, Link>,
    /// Packets without payload waiting for rx buffers.
    control: VecDeque<Header>,
    next_port: u32,
}

impl Muxer {
    fn host_event(&mut self, token: Token, readable: bool, writable: bool) {
        if token == LISTENER {
            self.accept();
            return;
        }
        let port = token.0 as u32;
        if self.handshakes.contains_key(&port) {
            self.read_handshake(port);
        } else if let Some(link) = self.connections.get_mut(&port) {
            link.readable |= readable;
            if writable {
                self.flush_to_host(port);
            }
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    let port = self.next_port;
                    self.next_port = self.next_port.wrapping_add(1).max(FIRST_HOST_PORT);
                    if self.registry.register(&mut stream, Token(port as usize), Interest::READABLE | Interest::WRITABLE).is_ok() {
                        self.handshakes.insert(port, Handshake { stream, line: Vec::new() });
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => return,
            }
        }
    }

    /// Read a host connection's `CONNECT <port>\n` and ask the guest for that port.
    fn read_handshake(&mut self, port: u32) {
        let Some(hs) = self.handshakes.get_mut(&port) else { return };
        let mut byte = [0u8; 1];
        loop {
            match hs.stream.read(&mut byte) {
                Ok(0) => {
                    self.handshakes.remove(&port);
                    return;
                }
                Ok(_) if byte[0] == b'\n' => break,
                Ok(_) if hs.line.len() < MAX_CONNECT_LINE => hs.line.push(byte[0]),
                Ok(_) => {
                    self.handshakes.remove(&port); // not the protocol
                    return;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.handshakes.remove(&port);
                    return;
                }
            }
        }
        let hs = self.handshakes.remove(&port).expect("present");
        let line = String::from_utf8_lossy(&hs.line).to_string();
        let Some(guest_port) = line.strip_prefix("CONNECT ").and_then(|p| p.trim().parse::<u32>().ok()) else {
            return; // dropping the stream closes it
        };
        let mut conn = Connection::new(self.cid, guest_port, port);
        self.control.push_back(conn.header(Op::Request, 0));
        self.connections.insert(port, Link { conn, stream: hs.stream, readable: false });
    }

    /// Packets the guest sent.
    fn process_tx(&mut self) {
        let Some(memory) = self.memory.clone() else { return };
        let mut used = false;
        let mut packets = Vec::new();
        while let Some(chain) = self.queues.get_mut(TX).and_then(|q| q.pop_descriptor_chain(&memory)) {
            let head = chain.head_index();
            let mut bytes = Vec::new();
            for d in chain.filter(|d| !d.is_write_only()) {
                let len = (d.len() as usize).min(HEADER_LEN + MAX_PAYLOAD - bytes.len().min(HEADER_LEN + MAX_PAYLOAD));
                let start = bytes.len();
                bytes.resize(start + len, 0);
                if memory.read_slice(&mut bytes[start..], d.addr()).is_err() {
                    bytes.truncate(start);
                }
            }
            if let Some(q) = self.queues.get_mut(TX) {
                let _ = q.add_used(&memory, head, 0);
                used = true;
            }
            if let Some(h) = Header::decode(&bytes) {
                let end = (HEADER_LEN + h.len as usize).min(bytes.len());
                packets.push((h, bytes[HEADER_LEN..end].to_vec()));
            }
        }
        for (h, payload) in packets {
            self.guest_packet(h, &payload);
        }
        if used {
            self.interrupt();
        }
    }

    fn guest_packet(&mut self, h: Header, payload: &[u8]) {
        if h.dst_cid != HOST_CID || h.kind != TYPE_STREAM {
            return;
        }
        let port = h.dst_port;
        let Some(link) = self.connections.get_mut(&port).filter(|l| l.conn.guest_port == h.src_port) else {
            if h.op != Op::Rst {
                self.control.push_back(reset_for(&h));
            }
            return;
        };
        link.conn.heard(&h);
        match h.op {
            Op::Response if link.conn.state == State::Connecting => {
                link.conn.state = State::Established;
                // A fresh socket's buffer holds a line: this write completes.
                if link.stream.write_all(format!("OK {port}\n").as_bytes()).is_err() {
                    self.close(port, true);
                }
            }
            Op::Rw if link.conn.state == State::Established => {
                if link.conn.received(payload) {
                    self.flush_to_host(port);
                } else {
                    self.close(port, true);
                }
            }
            Op::CreditUpdate => {}
            Op::CreditRequest => {
                let h = link.conn.header(Op::CreditUpdate, 0);
                self.control.push_back(h);
            }
            Op::Rst => self.close(port, false),
            Op::Shutdown => self.close(port, true),
            _ => self.close(port, true), // out of order: a request to us, a response twice
        }
    }

    /// Drop a connection (closing its host end); tell the guest when it does not know yet.
    fn close(&mut self, port: u32, tell_guest: bool) {
        if let Some(mut link) = self.connections.remove(&port) {
            let _ = self.registry.deregister(&mut link.stream);
            if tell_guest {
                let h = link.conn.header(Op::Rst, 0);
                self.control.push_back(h);
            }
        }
    }

    /// Write what the guest sent to the host end, as far as it takes it.
    fn flush_to_host(&mut self, port: u32) {
        let Some(link) = self.connections.get_mut(&port) else { return };
        while !link.conn.to_host.is_empty() {
            match link.stream.write(&link.conn.to_host) {
                Ok(n) => link.conn.forwarded(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.close(port, true);
                    return;
                }
            }
        }
        if link.conn.owes_credit_update() {
            let h = link.conn.header(Op::CreditUpdate, 0);
            self.control.push_back(h);
        }
    }

    /// Fill the guest's receive buffers: control packets first, then host data within each
    /// connection's credit.
    fn pump(&mut self) {
        let Some(memory) = self.memory.clone() else { return };
        let mut used = false;
        while let Some(h) = self.control.front().copied() {
            if !self.put_rx(&memory, &h, &[]) {
                break;
            }
            self.control.pop_front();
            used = true;
        }
        let ports: Vec<u32> =
            self.connections.iter().filter(|(_, l)| l.readable && l.conn.state == State::Established).map(|(p, _)| *p).collect();
        let mut buf = vec![0u8; MAX_PAYLOAD];
        for port in ports {
            while let Some(link) = self.connections.get(&port) {
                let credit = link.conn.peer_credit() as usize;
                if credit == 0 || !self.control.is_empty() {
                    break;
                }
                let Some((head, buffers)) = self.take_rx(&memory) else { break };
                let room = buffers.iter().map(|(_, len)| *len as usize).sum::<usize>().saturating_sub(HEADER_LEN);
                let link = self.connections.get_mut(&port).expect("present");
                match link.stream.read(&mut buf[..credit.min(room).min(MAX_PAYLOAD)]) {
                    Ok(n) if n > 0 => {
                        let h = link.conn.header(Op::Rw, n as u32);
                        link.conn.sent(n as u32);
                        self.fill_rx(&memory, head, &buffers, &h, &buf[..n]);
                        used = true;
                        continue;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        link.readable = false;
                        self.untake_rx();
                        break;
                    }
                    _ => {
                        // End of stream (or an error, or a buffer with no room for data).
                        self.untake_rx();
                        self.close(port, true);
                        break;
                    }
                }
            }
        }
        // Control packets queued while reading (resets) go out now if there is room.
        while let Some(h) = self.control.front().copied() {
            if !self.put_rx(&memory, &h, &[]) {
                break;
            }
            self.control.pop_front();
            used = true;
        }
        if used {
            self.interrupt();
        }
    }

    /// Write one payload-less packet into the next receive buffer; false when there is none.
    fn put_rx(&mut self, memory: &GuestMemoryMmap, h: &Header, payload: &[u8]) -> bool {
        match self.take_rx(memory) {
            Some((head, buffers)) => {
                self.fill_rx(memory, head, &buffers, h, payload);
                true
            }
            None => false,
        }
    }

    /// The next receive buffer: its head and writable pieces.
    fn take_rx(&mut self, memory: &GuestMemoryMmap) -> Option<(u16, Vec<(GuestAddress, u32)>)> {
        let chain = self.queues.get_mut(RX)?.pop_descriptor_chain(memory)?;
        let head = chain.head_index();
        Some((head, chain.filter(|d| d.is_write_only()).map(|d| (d.addr(), d.len())).collect()))
    }

    /// Give back the buffer [`Self::take_rx`] took, unused.
    fn untake_rx(&mut self) {
        if let Some(q) = self.queues.get_mut(RX) {
            q.go_to_previous_position();
        }
    }

    /// Write a packet into a taken receive buffer and return it to the guest. A buffer too
    /// small for the header gets what fits (the guest drops it as malformed).
    fn fill_rx(&mut self, memory: &GuestMemoryMmap, head: u16, buffers: &[(GuestAddress, u32)], h: &Header, payload: &[u8]) {
        let header = h.encode();
        let mut rest: &[u8] = &header;
        let mut in_payload = false;
        let mut written = 0usize;
        for &(addr, len) in buffers {
            let mut offset = 0usize;
            while offset < len as usize {
                if rest.is_empty() {
                    if in_payload || payload.is_empty() {
                        break;
                    }
                    rest = payload;
                    in_payload = true;
                }
                let n = rest.len().min(len as usize - offset);
                if memory.write_slice(&rest[..n], GuestAddress(addr.0 + offset as u64)).is_err() {
                    break;
                }
                rest = &rest[n..];
                offset += n;
                written += n;
            }
        }
        if let Some(q) = self.queues.get_mut(RX) {
            let _ = q.add_used(memory, head, written as u32);
        }
    }

    fn interrupt(&self) {
        if let Some(i) = &self.interrupt {
            i.used_ring();
        }
    }
}

/// The reset answering a guest packet for a connection we do not have.
fn reset_for(h: &Header) -> Header {
    Header {
        src_cid: HOST_CID,
        dst_cid: h.src_cid,
        src_port: h.dst_port,
        dst_port: h.src_port,
        len: 0,
        kind: TYPE_STREAM,
        op: Op::Rst,
        flags: 0,
        buf_alloc: 0,
        fwd_cnt: 0,
    }
}
