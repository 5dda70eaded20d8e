//! A memcached load generator with exact latencies, beside memaslap: one pinned thread, N
//! connections, each closed-loop with one request in flight (memaslap's model), gets and sets
//! 9:1 over a fixed key space, and every request's time from send to its full reply recorded
//! in an HdrHistogram (memaslap keeps only power-of-two buckets).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

/// One run's result.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadResult {
    pub ops_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
}

struct Conn {
    stream: TcpStream,
    /// Bytes of the current reply still expected, or None while its length is unknown.
    reply: Vec<u8>,
    sent_at: Instant,
    is_get: bool,
}

/// A small deterministic generator (xorshift) so runs are repeatable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn key(i: u64) -> String {
    format!("key:{i:027}")
}

/// Whether `buf` holds one complete reply to a get (`END\r\n` at its end, after any value)
/// or a set (`STORED\r\n`).
fn complete(buf: &[u8], is_get: bool) -> bool {
    if !is_get {
        return buf.ends_with(b"\r\n");
    }
    if buf.starts_with(b"END\r\n") {
        return true;
    }
    // "VALUE <key> <flags> <bytes>\r\n<data>\r\nEND\r\n"
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        return false;
    };
    let header = std::str::from_utf8(&buf[..nl]).unwrap_or("");
    let Some(len) = header.split_whitespace().nth(3).and_then(|n| n.parse::<usize>().ok()) else {
        return false;
    };
    buf.len() >= nl + 1 + len + 2 + 5
}

/// Drive `addr` with `conns` connections for `seconds` (after a second of warm-up), values of
/// `value_bytes`, over `keys` keys (all set first, so gets hit).
pub fn run(addr: SocketAddr, conns: usize, value_bytes: usize, keys: u64, seconds: f64) -> Result<LoadResult> {
    let value = vec![b'x'; value_bytes];
    // Fill the key space through one blocking connection.
    {
        let mut s = std::net::TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        let mut batch = Vec::new();
        for i in 0..keys {
            batch.extend_from_slice(format!("set {} 0 0 {value_bytes} noreply\r\n", key(i)).as_bytes());
            batch.extend_from_slice(&value);
            batch.extend_from_slice(b"\r\n");
            if batch.len() > 1 << 20 {
                s.write_all(&batch)?;
                batch.clear();
            }
        }
        batch.extend_from_slice(b"version\r\n");
        s.write_all(&batch)?;
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf)?;
        if !buf[..n].starts_with(b"VERSION") {
            bail!("the server did not take the key space: {:?}", String::from_utf8_lossy(&buf[..n]));
        }
    }
    let mut poll = Poll::new()?;
    let mut clients = Vec::with_capacity(conns);
    for i in 0..conns {
        let std = std::net::TcpStream::connect(addr).with_context(|| format!("connection {i} to {addr}"))?;
        std.set_nodelay(true)?;
        std.set_nonblocking(true)?;
        let mut stream = TcpStream::from_std(std);
        poll.registry().register(&mut stream, Token(i), Interest::READABLE)?;
        clients.push(Conn { stream, reply: Vec::with_capacity(value_bytes + 128), sent_at: Instant::now(), is_get: true });
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut request = Vec::with_capacity(value_bytes + 128);
    let mut send = |c: &mut Conn, rng: &mut Rng| -> Result<()> {
        request.clear();
        let k = key(rng.next() % keys);
        c.is_get = !rng.next().is_multiple_of(10);
        if c.is_get {
            request.extend_from_slice(format!("get {k}\r\n").as_bytes());
        } else {
            request.extend_from_slice(format!("set {k} 0 0 {value_bytes}\r\n").as_bytes());
            request.extend_from_slice(&value);
            request.extend_from_slice(b"\r\n");
        }
        c.reply.clear();
        c.sent_at = Instant::now();
        // Requests are small enough for the socket buffer; a partial write is an error here.
        let n = c.stream.write(&request)?;
        if n != request.len() {
            bail!("a request did not fit the socket buffer ({n} of {} bytes)", request.len());
        }
        Ok(())
    };
    for c in clients.iter_mut() {
        send(c, &mut rng)?;
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut events = Events::with_capacity(1024);
    let start = Instant::now();
    let warm_until = start + Duration::from_secs(1);
    let end = warm_until + Duration::from_secs_f64(seconds);
    let mut measured = 0u64;
    let mut buf = vec![0u8; 64 * 1024 + value_bytes];
    while Instant::now() < end {
        poll.poll(&mut events, Some(Duration::from_millis(100)))?;
        for event in events.iter() {
            let c = &mut clients[event.token().0];
            loop {
                match c.stream.read(&mut buf) {
                    Ok(0) => bail!("the server closed a connection"),
                    Ok(n) => {
                        c.reply.extend_from_slice(&buf[..n]);
                        if n < buf.len() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e.into()),
                }
            }
            if complete(&c.reply, c.is_get) {
                let now = Instant::now();
                if now >= warm_until && now < end {
                    hist.record((now - c.sent_at).as_nanos() as u64)?;
                    measured += 1;
                }
                send(c, &mut rng)?;
            }
        }
    }
    if measured == 0 {
        bail!("no request completed");
    }
    Ok(LoadResult {
        ops_per_s: measured as f64 / seconds,
        p50_us: hist.value_at_quantile(0.50) as f64 / 1000.0,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
        mean_us: hist.mean() / 1000.0,
    })
}

#[cfg(test)]
mod tests {
    use super::complete;

    #[test]
    fn knows_when_a_reply_is_whole() {
        assert!(complete(b"END\r\n", true));
        assert!(!complete(b"VALUE k 0 3\r\nab", true));
        assert!(!complete(b"VALUE k 0 3\r\nabc\r\n", true));
        assert!(complete(b"VALUE k 0 3\r\nabc\r\nEND\r\n", true));
        assert!(complete(b"STORED\r\n", false));
        assert!(!complete(b"STOR", false));
    }
}
