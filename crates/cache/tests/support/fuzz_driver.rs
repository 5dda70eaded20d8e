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
//!   with keylen + extlen <= bodylen; text: every non-empty batch ends with "\r\n";
//! * a direct (value) buffer is only offered while it still needs bytes, and while it exists
//!   the read buffer is empty;
//! * memory: what the session holds (the unconsumed read buffer plus the capacity of a direct
//!   buffer) never exceeds the bytes fed so far + 64 KiB;
//! * the store's `used()` never exceeds its limit + one item max, and after `flush_all` the
//!   charged bytes go back to exactly 0 (no accounting drift).

#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsRawFd, FromRawFd};
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
}

/// Where replies go: `Output` only writes to a file descriptor, so an anonymous memory file
/// stands in for the socket.
struct Sink {
    file: File,
    batch: Vec<u8>,
}

impl Sink {
    fn new() -> Sink {
        // SAFETY: memfd_create with a NUL-terminated name; the fd is owned by the File.
        let fd = unsafe { libc::memfd_create(c"sprout-fuzz-out".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        Sink { file: unsafe { File::from_raw_fd(fd) }, batch: Vec::new() }
    }

    /// Take what `out` holds into `self.batch`.
    fn drain(&mut self, out: &mut Output) {
        self.batch.clear();
        if out.is_empty() {
            return;
        }
        let pending = out.pending();
        let done = out.flush(self.file.as_raw_fd()).expect("write replies");
        assert!(done && out.is_empty(), "a file takes every byte");
        self.file.seek(SeekFrom::Start(0)).unwrap();
        self.file.read_to_end(&mut self.batch).unwrap();
        assert_eq!(self.batch.len(), pending, "pending() counts what flush writes");
        self.file.set_len(0).unwrap();
        self.file.seek(SeekFrom::Start(0)).unwrap();
    }
}

/// Check one batch of replies.
fn check_replies(binary: bool, batch: &[u8]) {
    if batch.is_empty() {
        return;
    }
    if !binary {
        assert!(batch.ends_with(b"\r\n"), "text replies end with CRLF: ...{:?}", tail(batch));
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

/// Run a fuzz input (`[c0, c1, stream...]`).
pub fn run(data: &[u8]) -> Outcome {
    let (ctrl, stream) = split(data);
    run_stream(ctrl, stream, false)
}

/// Run `stream` with the chunking `ctrl` picks; keep the replies in the outcome when asked.
pub fn run_stream(ctrl: [u8; 2], stream: &[u8], keep_output: bool) -> Outcome {
    let shared = Shared::new(settings(), stats_ebb());
    let stats = <CoreStats as Ebb>::create_rep(&Arc::new(StatsRoot { cores: 1 }), 0);
    let env = Env { shared: &shared, stats: &stats };
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
                break 'feed;
            }
        }
    }

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
            Step::NeedMore => return false,
            Step::Close => return true,
            Step::Stats => {
                assert!(session.stats_request().is_some(), "Step::Stats without a request");
                session.finish_stats(&Counters::default(), env, out);
            }
        }
    }
}
