//! The session driver shared by the `session` fuzz target (`crates/cache/fuzz`, which
//! includes this file with `#[path]`) and the stable replay test `tests/fuzz_regressions.rs`:
//! one connection's byte stream, cut into chunks, fed to a `Session` the way `conn.rs` feeds
//! it, with cheap invariants checked along the way. Any violation panics.
//!
//! Input layout: `[c0, c1, stream...]`.
//! * `c0 & 7` picks the largest chunk: whole stream, 1, 2, 7, 64, 512, 4096 or 16384 bytes;
//!   `c0 & 8` makes every chunk exactly that size, else each is 1..=that size, drawn from a
//!   PRNG seeded by `c1`. Chunks are never smaller than len/2048 (so an input costs at most
//!   ~2048 `process` calls).
//! * `stream` is what the client sends. As in the server, its first byte picks the protocol
//!   (0x80: binary, else text).
//!
//! Invariants:
//! * nothing panics (in the crate or here);
//! * binary: every batch of output is whole response packets, each starting with magic 0x81
//!   with keylen + extlen <= bodylen; text: every batch is whole replies: lines that begin
//!   with a reply word memcached uses (or a number, for incr/decr), with no newline inside
//!   (clients read replies line by line), meta replies made of non-empty space-separated
//!   tokens, each `VALUE` and `VA` line
//!   followed by exactly the data block it announces and "\r\n";
//! * a direct (value) buffer is only offered while it still needs bytes, and while it exists
//!   the read buffer is empty;
//! * memory: what the session holds (the unconsumed read buffer plus the capacity of a direct
//!   buffer) never exceeds the bytes fed so far + 64 KiB;
//! * the store's `used()` never exceeds its limit + one item max, and after `flush_all` the
//!   charged bytes go back to exactly 0 (no accounting drift);
//! * chunking changes nothing: `run` also feeds the stream whole and compares the replies,
//!   unless the difference is legitimate: the chunked run closed on memcached's long-line rule
//!   (a partial line over 2048 bytes that is not a get), a reply holds the time-dependent
//!   general stats, or a clock second passed during either run.

#![allow(dead_code)]

use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock};

use bytes::BytesMut;
use sprout_cache::output::Output;
use sprout_cache::session::{Env, Session, Step};
use sprout_cache::shared::{Settings, Shared};
use sprout_cache::stats::{CoreStats, Counters, StatsRoot};
use sprout_runtime::{Ebb, EbbRef};

/// The store's memory limit in the driver.
pub const LIMIT_BYTES: usize = 1 << 20;
/// The largest item (`-I`) in the driver.
pub const ITEM_MAX: usize = 64 << 10;
/// How much more than it was fed the session may hold.
pub const SLACK: usize = 64 << 10;

const MAX_CHUNKS: [usize; 8] = [usize::MAX, 1, 2, 7, 64, 512, 4096, 16384];

/// The stats Ebb: created once per process (an Ebb's root is never freed), shared by every
/// run. The runs never touch it through a runtime core: their `CoreStats` is built directly.
fn stats_ebb() -> EbbRef<CoreStats> {
    static EBB: OnceLock<EbbRef<CoreStats>> = OnceLock::new();
    *EBB.get_or_init(|| EbbRef::create(StatsRoot { cores: 1 }))
}

pub fn settings() -> Settings {
    Settings { limit_bytes: LIMIT_BYTES, item_max: ITEM_MAX, cores: 1, ..Default::default() }
}

/// What a run saw.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Everything the session replied (only when asked for).
    pub output: Vec<u8>,
    pub output_len: usize,
    pub closed: bool,
    pub binary: bool,
    pub process_calls: usize,
    /// The most the session held at once (read buffer + direct buffer capacity).
    pub peak_held: usize,
    /// Whether a direct buffer was ever handed out.
    pub used_direct: bool,
    /// Closed on the long-line rule: a partial text line over MAX_LINE bytes, not a get.
    pub long_line_close: bool,
    /// The store's clock at the end (2 unless a second passed during the run).
    pub end_now: u32,
}

/// Where replies go: `Output` sends only to a file descriptor (a socket), so one end of a
/// Unix socket pair stands in for the client's connection, and the driver reads the other.
struct Sink {
    ours: std::os::unix::net::UnixStream,
    peer: std::os::unix::net::UnixStream,
    batch: Vec<u8>,
}

impl Sink {
    fn new() -> Sink {
        let (ours, peer) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        ours.set_nonblocking(true).unwrap();
        peer.set_nonblocking(true).unwrap();
        Sink { ours, peer, batch: Vec::new() }
    }

    /// Take what `out` holds into `self.batch`.
    fn drain(&mut self, out: &mut Output) {
        self.batch.clear();
        if out.is_empty() {
            return;
        }
        let pending = out.pending();
        loop {
            let done = out.flush(self.ours.as_raw_fd()).expect("send replies");
            // Read what the socket holds (all of it, while the sender is full).
            let mut chunk = [0u8; 64 * 1024];
            loop {
                match self.peer.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => self.batch.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("read replies: {e}"),
                }
            }
            if done {
                break;
            }
        }
        assert!(out.is_empty(), "flush reported done with bytes pending");
        assert_eq!(self.batch.len(), pending, "pending() counts what flush sends");
    }
}

/// Check one batch of replies.
fn check_replies(binary: bool, batch: &[u8]) {
    if batch.is_empty() {
        return;
    }
    if !binary {
        check_text_replies(batch);
        return;
    }
    let mut rest = batch;
    while !rest.is_empty() {
        assert!(rest.len() >= 24, "truncated binary response header: {:?}", rest);
        assert_eq!(rest[0], 0x81, "response magic");
        let keylen = u16::from_be_bytes([rest[2], rest[3]]) as usize;
        let extlen = rest[4] as usize;
        let bodylen = u32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]) as usize;
        assert!(keylen + extlen <= bodylen, "keylen {keylen} + extlen {extlen} > bodylen {bodylen}");
        assert!(rest.len() >= 24 + bodylen, "response body shorter ({}) than its bodylen {bodylen}", rest.len() - 24);
        rest = &rest[24 + bodylen..];
    }
}

/// Text replies: each line "\r\n"-terminated and starting with a reply word; the data blocks
/// of `VALUE` (text get) and `VA` (meta) exactly as long as announced.
fn check_text_replies(batch: &[u8]) {
    let mut rest = batch;
    while !rest.is_empty() {
        let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
            panic!("text reply without CRLF: {:?}", tail(rest));
        };
        let line = &rest[..end];
        rest = &rest[end + 2..];
        // Clients read replies line by line: a newline inside one ends it early.
        assert!(!line.contains(&b'\n'), "newline inside a reply line: {:?}", String::from_utf8_lossy(line));
        let word = line.split(|&b| b == b' ').next().unwrap_or(b"");
        let block = match word {
            // VALUE <key> <flags> <bytes> [<cas>]
            b"VALUE" => {
                let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
                assert!(matches!(fields.len(), 4 | 5), "malformed VALUE line: {:?}", String::from_utf8_lossy(line));
                Some(fields[3])
            }
            // VA <size> <flags>*
            b"VA" => {
                assert!(!line.ends_with(b" ") && !contains(line, b"  "), "empty token in {:?}", String::from_utf8_lossy(line));
                Some(line.split(|&b| b == b' ').nth(1).unwrap_or(b""))
            }
            b"STORED" | b"NOT_STORED" | b"EXISTS" | b"NOT_FOUND" | b"DELETED" | b"TOUCHED" | b"END" | b"ERROR" | b"OK" | b"RESET"
            | b"MN" => {
                assert_eq!(line, word, "unexpected words after {:?}", String::from_utf8_lossy(word));
                None
            }
            // Meta replies: a code, then flags, each a non-empty token.
            b"HD" | b"EN" | b"NS" | b"EX" | b"NF" => {
                assert!(!line.ends_with(b" ") && !contains(line, b"  "), "empty token in {:?}", String::from_utf8_lossy(line));
                None
            }
            b"CLIENT_ERROR" | b"SERVER_ERROR" | b"STAT" | b"VERSION" => None,
            w if !w.is_empty() && w.iter().all(u8::is_ascii_digit) && line == w => None,
            _ => panic!("not a reply line: {:?} (after {} bytes)", String::from_utf8_lossy(line), batch.len() - rest.len() - end - 2),
        };
        if let Some(len) = block {
            let len: usize = std::str::from_utf8(len)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("bad data length in {:?}", String::from_utf8_lossy(line)));
            assert!(
                rest.len() >= len + 2 && &rest[len..len + 2] == b"\r\n",
                "data block not {len} bytes + CRLF after {:?}",
                String::from_utf8_lossy(line)
            );
            rest = &rest[len + 2..];
        }
    }
}

fn tail(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[b.len().saturating_sub(40)..]).into_owned()
}

/// xorshift64*, for chunk sizes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Split `data` into chunking control and stream.
pub fn split(data: &[u8]) -> ([u8; 2], &[u8]) {
    match data {
        [c0, c1, stream @ ..] => ([*c0, *c1], stream),
        _ => ([0, 0], data),
    }
}

/// Run a fuzz input (`[c0, c1, stream...]`): in the chunks it picks, then (when that was not
/// already whole) whole, and the replies must be the same.
pub fn run(data: &[u8]) -> Outcome {
    let (ctrl, stream) = split(data);
    let chunked = run_stream(ctrl, stream, true);
    if ctrl[0] & 7 != 0 && !chunked.long_line_close {
        let whole = run_stream([0, 0], stream, true);
        let timeless = |o: &Outcome| o.end_now == 2 && !contains(&o.output, b"rusage_user");
        if timeless(&chunked) && timeless(&whole) {
            if let Some(at) = chunked.output.iter().zip(&whole.output).position(|(a, b)| a != b) {
                panic!(
                    "chunking changed the replies at byte {at}: chunked {:?} vs whole {:?}",
                    excerpt(&chunked.output, at),
                    excerpt(&whole.output, at)
                );
            }
            assert_eq!(chunked.output.len(), whole.output.len(), "chunking changed the length of the replies");
            assert_eq!(chunked.closed, whole.closed, "chunking changed whether the session closed");
        }
    }
    chunked
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn excerpt(b: &[u8], at: usize) -> String {
    String::from_utf8_lossy(&b[at.saturating_sub(40)..(at + 40).min(b.len())]).into_owned()
}

/// Run `stream` with the chunking `ctrl` picks; keep the replies in the outcome when asked.
pub fn run_stream(ctrl: [u8; 2], stream: &[u8], keep_output: bool) -> Outcome {
    let shared = Shared::new(settings(), stats_ebb());
    let stats = <CoreStats as Ebb>::create_rep(&Arc::new(StatsRoot { cores: 1 }), 0);
    let env = Env { shared: &shared, stats: &stats, fd: -1 };
    let mut session = Session::new();
    let mut input = BytesMut::new();
    let mut out = Output::new();
    let mut sink = Sink::new();
    let mut outcome = Outcome { binary: stream.first() == Some(&0x80), ..Default::default() };

    let max_chunk = MAX_CHUNKS[(ctrl[0] & 7) as usize].max(stream.len() / 2048).max(1);
    let fixed = ctrl[0] & 8 != 0;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((ctrl[1] as u64) << 32 | ctrl[0] as u64));
    let limit = shared.store.limit();

    let mut fed = 0usize;
    let mut pos = 0usize;
    'feed: while pos < stream.len() {
        let size = if fixed || max_chunk == usize::MAX { max_chunk } else { 1 + (rng.next() % max_chunk as u64) as usize };
        let end = pos.saturating_add(size).min(stream.len());
        let mut chunk = &stream[pos..end];
        pos = end;
        while !chunk.is_empty() {
            // As conn.rs: a large value is read straight into its own buffer, at most what it
            // still needs; anything else goes to the read buffer.
            if let Some((buf, need)) = session.direct_buffer() {
                assert!(need > 0, "a direct buffer offered with nothing left to read");
                let n = need.min(chunk.len());
                buf.extend_from_slice(&chunk[..n]);
                chunk = &chunk[n..];
                fed += n;
            } else {
                input.extend_from_slice(chunk);
                fed += chunk.len();
                chunk = &[];
            }
            let closed = pump(&mut session, &mut input, &env, &mut out, &mut outcome);
            sink.drain(&mut out);
            check_replies(outcome.binary, &sink.batch);
            outcome.output_len += sink.batch.len();
            if keep_output {
                outcome.output.extend_from_slice(&sink.batch);
            }

            let direct = session.direct_buffer().map(|(b, need)| {
                assert!(need > 0, "a direct buffer offered with nothing left to read");
                b.capacity()
            });
            if direct.is_some() {
                outcome.used_direct = true;
                assert!(input.is_empty(), "read buffer holds {} bytes beside a direct buffer", input.len());
            }
            let held = input.len() + direct.unwrap_or(0);
            outcome.peak_held = outcome.peak_held.max(held);
            assert!(held <= fed + SLACK, "session holds {held} bytes after being fed {fed}");
            let used = shared.store.used();
            assert!(used <= limit + ITEM_MAX, "store used {used} > limit {limit} + item max");
            if closed {
                outcome.closed = true;
                outcome.long_line_close = !outcome.binary && input.len() > sprout_cache::session::MAX_LINE && !input.contains(&b'\n');
                break 'feed;
            }
        }
    }

    outcome.end_now = shared.clock.now();
    // The charges must add up: a flush frees exactly what is charged.
    let used = shared.store.used();
    assert!(used <= limit + ITEM_MAX, "store used {used} > limit {limit} + item max");
    shared.store.flush(None);
    assert_eq!(shared.store.used(), 0, "store accounting drifted (used was {used})");
    outcome
}

/// Run the session over what is buffered until it needs more or closes; `true` on close.
fn pump(session: &mut Session, input: &mut BytesMut, env: &Env, out: &mut Output, outcome: &mut Outcome) -> bool {
    loop {
        outcome.process_calls += 1;
        match session.process(input, env, out) {
            // A watcher only listens from then on: the rest of the input is dropped.
            Step::NeedMore | Step::Watch(_) => return false,
            Step::Close { .. } => return true,
            Step::Stats => {
                assert!(session.stats_request().is_some(), "Step::Stats without a request");
                session.finish_stats(&Counters::default(), env, out);
            }
        }
    }
}
