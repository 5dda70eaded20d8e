//! A connection's outgoing bytes: small replies are written into one buffer, stored values
//! are queued by reference (the `Bytes` the store holds) and the lot goes out with one
//! gathering `sendmsg`, so a value is never copied on its way out.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::os::fd::RawFd;

use bytes::{Buf, Bytes, BytesMut};

/// Values up to this size are copied into the reply buffer: cheaper than an iovec of their
/// own and a reference count.
pub const INLINE_VALUE_MAX: usize = 512;

/// Copy small values into the reply buffer only while it holds less than this.
const INLINE_LIMIT: usize = 1 << 20;

/// At most this many iovecs per sendmsg (Linux's IOV_MAX is 1024).
const MAX_IOVECS: usize = 64;

#[derive(Default)]
pub struct Output {
    /// Finished chunks, in order.
    chunks: VecDeque<Bytes>,
    /// Replies being written, not yet a chunk.
    buf: BytesMut,
    queued: usize,
}

impl Output {
    pub fn new() -> Output {
        Output { chunks: VecDeque::new(), buf: BytesMut::with_capacity(16 * 1024), queued: 0 }
    }

    #[inline]
    pub fn put(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// A decimal number.
    pub fn put_u64(&mut self, n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut n = n;
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.buf.extend_from_slice(&digits[i..]);
    }

    /// A stored value: copied when small, else queued by reference. Once a reply has grown
    /// past `INLINE_LIMIT` (a multi-get of many keys), small values go by reference too, so a
    /// get line cannot make the connection copy more than that.
    pub fn put_value(&mut self, value: &Bytes) {
        if value.len() <= INLINE_VALUE_MAX && self.buf.len() < INLINE_LIMIT {
            self.buf.extend_from_slice(value);
        } else {
            self.seal();
            self.queued += value.len();
            self.chunks.push_back(value.clone());
        }
    }

    fn seal(&mut self) {
        if !self.buf.is_empty() {
            let chunk = self.buf.split().freeze();
            self.queued += chunk.len();
            self.chunks.push_back(chunk);
        }
    }

    /// Bytes waiting to be sent.
    pub fn pending(&self) -> usize {
        self.queued + self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending() == 0
    }

    /// The reply buffer, for protocols that patch headers in place.
    pub fn buf_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Send as much as the socket takes: Ok(true) when everything went, Ok(false) when the
    /// socket is full (wait for writable).
    pub fn flush(&mut self, fd: RawFd) -> std::io::Result<bool> {
        while self.pending() > 0 {
            let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
            let mut count = 0;
            for chunk in self.chunks.iter().take(MAX_IOVECS - 1) {
                slices[count] = IoSlice::new(chunk);
                count += 1;
            }
            if count < MAX_IOVECS - 1 && !self.buf.is_empty() {
                slices[count] = IoSlice::new(&self.buf);
                count += 1;
            }
            // sendmsg rather than writev: the socket's own path, without the VFS layers, and
            // MSG_NOSIGNAL so a peer that left gives EPIPE, never a signal.
            // SAFETY: IoSlice is ABI-compatible with iovec; the buffers outlive the call, and
            // msghdr is plain data.
            let n = unsafe {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = slices.as_ptr() as *mut libc::iovec;
                msg.msg_iovlen = count as _;
                libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::WouldBlock => return Ok(false),
                    std::io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            let mut n = n as usize;
            while n > 0 {
                match self.chunks.front_mut() {
                    Some(front) => {
                        let take = n.min(front.len());
                        front.advance(take);
                        self.queued -= take;
                        n -= take;
                        if front.is_empty() {
                            self.chunks.pop_front();
                        }
                    }
                    None => {
                        self.buf.advance(n);
                        n = 0;
                    }
                }
            }
        }
        if self.buf.is_empty() {
            // Back to the start of the buffer's memory (the allocation is reused).
            self.buf.clear();
            self.buf.reserve(4096);
        }
        Ok(true)
    }
}
