//! What sandboxes print: each sandbox's stdout and stderr go into one pipe that the worker
//! reads and hands, as complete lines, to an [`OutputSink`] (a handler's: its lambda's logs;
//! a Zygote's: the worker's own log).
//!
//! One thread of the worker's, the poller, reads every pipe: at once when a sandbox between
//! requests writes, and, while a sandbox serves a request ([`OutputPipe::begin`]), only every
//! [`DRAIN_INTERVAL`] — so a handler's output costs its request no wake-up of the worker,
//! whose CPU that request shares. [`OutputPipe::settle`] hands over, at once, everything
//! written before it was called: the session calls it when a request's reply has arrived (the
//! helper flushes stdout and stderr before replying), so every line a request wrote reaches
//! the sink before the request is over. A pipe holds [`PIPE_BYTES`]: a handler writing faster
//! than that between two drains waits for the next one.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

/// Longest line kept; the rest of a longer line is dropped.
pub const MAX_LINE: usize = 4096;

/// How often the pipes of sandboxes serving requests are drained.
pub const DRAIN_INTERVAL: Duration = Duration::from_millis(10);

/// How much a pipe holds (asked of the kernel; it may give less).
pub const PIPE_BYTES: usize = 1 << 20;

/// How long the poller waits for a write when no sandbox serves a request.
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// Most bytes the poller takes from one pipe in one go: a flood waits in its pipe (and then
/// its writer waits) rather than hold the poller, and the CPU it shares with requests, long.
const MAX_PER_DRAIN: usize = 256 << 10;

/// Most bytes the poller takes from a flooded sink's pipe in one go (every
/// [`DRAIN_INTERVAL`] while serving: 1.6 MB/s, more than the rate it keeps).
pub const FLOOD_DRAIN: usize = 16 << 10;

/// Where a sandbox's output goes.
pub trait OutputSink: Send + Sync {
    /// `lines` holds one or more complete lines, each ending in `\n` (a line cut at
    /// [`MAX_LINE`] gets one), read from sandbox `sandbox`'s pipe, in order. Called on the
    /// poller's thread or a request's: it must not block.
    fn write(&self, sandbox: u64, lines: &[u8]);

    /// Whether it drops what it is given now (past a rate): then its pipe is read only
    /// [`FLOOD_DRAIN`] at a time, and a sandbox writing faster waits on its own output rather
    /// than have the worker read what would be dropped.
    fn flooded(&self) -> bool {
        false
    }
}

/// The worker's own log, at target `sandbox`: where Zygotes' output goes.
pub struct TracingSink(pub String);

impl OutputSink for TracingSink {
    fn write(&self, sandbox: u64, lines: &[u8]) {
        for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            tracing::info!(target: "sandbox", lambda = %self.0, sandbox, "{}", String::from_utf8_lossy(line).trim_end());
        }
    }
}

/// The worker's end of a sandbox's output pipe.
#[derive(Clone)]
pub struct OutputPipe {
    reader: Arc<Reader>,
}

struct Reader {
    fd: OwnedFd,
    token: u64,
    sandbox: u64,
    sink: Arc<dyn OutputSink>,
    /// Line assembly, and the lock that orders the poller's reads with `settle`'s.
    lines: Mutex<Lines>,
    serving: AtomicBool,
}

impl OutputPipe {
    /// Make a pipe whose lines go to `sink`; returns the worker's end and the write end for
    /// the sandbox (its stdout and stderr). The poller reads it until every write end is
    /// closed and the pipe is drained.
    pub fn new(sandbox: u64, sink: Arc<dyn OutputSink>) -> io::Result<(OutputPipe, OwnedFd)> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` is a live array of two c_ints, exactly what pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are fresh descriptors that nothing else owns; each is
        // wrapped exactly once.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // The sandbox's end must block like an ordinary stdout; the pipe holds more than the
        // default 64 KiB, for the time between two drains (best effort: the kernel may refuse).
        // SAFETY: both descriptors are owned and alive here; F_SETFL and F_SETPIPE_SZ take an
        // int, no pointer.
        unsafe {
            libc::fcntl(fds[1], libc::F_SETFL, 0);
            libc::fcntl(fds[0], libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_int);
        }
        Ok((Self::reading(read, sandbox, sink)?, write))
    }

    /// Read a FIFO the sandbox opens by its path (a gVisor sandbox's handler, which cannot
    /// be handed a host descriptor): made at `path` for any user, opened here first; returns
    /// the worker's end and a write end the worker holds until the handler has opened its
    /// own (until then the FIFO has no writer, which the poller would take for the end).
    pub fn fifo(path: &std::path::Path, sandbox: u64, sink: Arc<dyn OutputSink>) -> io::Result<(OutputPipe, OwnedFd)> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o622)).map_err(io::Error::from)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o622))?;
        let read: OwnedFd = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?.into();
        let hold: OwnedFd = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_CLOEXEC).open(path)?.into();
        // SAFETY: `read` is owned and alive; F_SETPIPE_SZ takes an int, no pointer.
        unsafe { libc::fcntl(read.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_int) };
        Ok((Self::reading(read, sandbox, sink)?, hold))
    }

    /// Hand `read` (non-blocking) to the poller.
    fn reading(read: OwnedFd, sandbox: u64, sink: Arc<dyn OutputSink>) -> io::Result<OutputPipe> {
        let poller = poller()?;
        let token = poller.next_token.fetch_add(1, Ordering::Relaxed);
        let reader =
            Arc::new(Reader { fd: read, token, sandbox, sink, lines: Mutex::new(Lines::default()), serving: AtomicBool::new(false) });
        poller.add(reader.clone())?;
        Ok(OutputPipe { reader })
    }

    /// A request starts: until [`OutputPipe::settle`] the pipe is drained every
    /// [`DRAIN_INTERVAL`] rather than at each write.
    pub fn begin(&self) {
        let reader = &self.reader;
        if !reader.serving.swap(true, Ordering::AcqRel) {
            if let Some(poller) = POLLER.get() {
                poller.serving.fetch_add(1, Ordering::AcqRel);
                poller.watch(reader, false);
            }
        }
    }

    /// Hand the sink every byte written to the pipe before this call (a partial last line
    /// included, as a line of its own), and drain the pipe at each write again. Bounded by
    /// what the pipe held when called, so a sandbox writing on meanwhile cannot keep it going.
    pub fn settle(&self) {
        let reader = &self.reader;
        {
            let mut lines = reader.lines.lock().unwrap();
            let mut left = pending_bytes(reader.fd.as_raw_fd());
            // Most requests print nothing: no buffer to clear for them (64 KiB, every request).
            let mut chunk = if left > 0 { vec![0u8; left.min(64 * 1024)] } else { Vec::new() };
            while left > 0 {
                match read_now(reader.fd.as_raw_fd(), &mut chunk[..left.min(64 * 1024)]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        left -= n;
                        lines.take(&chunk[..n], |out| reader.sink.write(reader.sandbox, out));
                    }
                }
            }
            lines.flush(|out| reader.sink.write(reader.sandbox, out));
        }
        if reader.serving.swap(false, Ordering::AcqRel) {
            if let Some(poller) = POLLER.get() {
                poller.watch(reader, true);
                poller.serving.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

impl Reader {
    /// How much to take in one go: less while its sink drops what it is given.
    fn drain_limit(&self) -> usize {
        if self.sink.flooded() {
            FLOOD_DRAIN
        } else {
            MAX_PER_DRAIN
        }
    }

    /// Take what the pipe holds (at most `limit` bytes); true once every write end is closed
    /// and the pipe is empty.
    fn drain(&self, buf: &mut [u8], limit: usize) -> bool {
        let mut lines = self.lines.lock().unwrap();
        let mut taken = 0;
        while taken < limit {
            match read_now(self.fd.as_raw_fd(), buf) {
                Ok(0) => {
                    lines.flush(|out| self.sink.write(self.sandbox, out));
                    return true;
                }
                Ok(n) => {
                    taken += n;
                    lines.take(&buf[..n], |out| self.sink.write(self.sandbox, out));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
        false
    }
}

/// The thread that reads every sandbox's output pipe.
struct Poller {
    epoll: Epoll,
    readers: Mutex<HashMap<u64, Arc<Reader>>>,
    next_token: AtomicU64,
    /// Pipes of sandboxes serving a request (drained every [`DRAIN_INTERVAL`]).
    serving: AtomicUsize,
}

static POLLER: OnceLock<Poller> = OnceLock::new();

/// The poller, started on first use.
/// Start the thread that reads every sandbox's output (`sprout-output`) now, rather than
/// with the first pipe, so the worker can place it.
pub fn start_poller() -> io::Result<()> {
    poller().map(|_| ())
}

fn poller() -> io::Result<&'static Poller> {
    if let Some(p) = POLLER.get() {
        return Ok(p);
    }
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io::Error::from)?;
    let poller = Poller { epoll, readers: Mutex::default(), next_token: AtomicU64::new(1), serving: AtomicUsize::new(0) };
    if POLLER.set(poller).is_ok() {
        std::thread::Builder::new().name("sprout-output".into()).spawn(|| POLLER.get().expect("set above").run())?;
    }
    Ok(POLLER.get().expect("set by this call or another"))
}

impl Poller {
    fn add(&self, reader: Arc<Reader>) -> io::Result<()> {
        self.readers.lock().unwrap().insert(reader.token, reader.clone());
        let event = EpollEvent::new(EpollFlags::EPOLLIN, reader.token);
        self.epoll.add(reader.fd.as_fd(), event).map_err(|e| {
            self.readers.lock().unwrap().remove(&reader.token);
            io::Error::from(e)
        })
    }

    /// Wake for `reader`'s writes (`at_once`), or not (its request's output waits for the
    /// next sweep or for `settle`).
    fn watch(&self, reader: &Reader, at_once: bool) {
        let flags = if at_once { EpollFlags::EPOLLIN } else { EpollFlags::empty() };
        let mut event = EpollEvent::new(flags, reader.token);
        // Fails only for a pipe already taken out (its sandbox's ends all closed): nothing to watch.
        let _ = self.epoll.modify(reader.fd.as_fd(), &mut event);
    }

    fn run(&self) {
        let mut events = vec![EpollEvent::empty(); 64];
        let mut buf = vec![0u8; 64 * 1024];
        let mut last_sweep = Instant::now();
        loop {
            let serving = self.serving.load(Ordering::Acquire) > 0;
            let wait = if serving { DRAIN_INTERVAL.saturating_sub(last_sweep.elapsed()) } else { IDLE_WAIT };
            // In whole milliseconds, rounded up: rounded down, the last fraction of a
            // millisecond before a sweep would be spent polling.
            let millis = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
            let timeout = EpollTimeout::try_from(millis).unwrap_or(EpollTimeout::NONE);
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    tracing::error!("the sandboxes' output poller stopped: {e}");
                    return;
                }
            };
            for event in &events[..n] {
                let reader = self.readers.lock().unwrap().get(&event.data()).cloned();
                if let Some(reader) = reader {
                    if reader.drain(&mut buf, reader.drain_limit()) {
                        self.remove(&reader);
                    }
                }
            }
            if last_sweep.elapsed() >= DRAIN_INTERVAL {
                last_sweep = Instant::now();
                if self.serving.load(Ordering::Acquire) > 0 {
                    let serving: Vec<Arc<Reader>> =
                        self.readers.lock().unwrap().values().filter(|r| r.serving.load(Ordering::Acquire)).cloned().collect();
                    for reader in serving {
                        if pending_bytes(reader.fd.as_raw_fd()) > 0 && reader.drain(&mut buf, reader.drain_limit()) {
                            self.remove(&reader);
                        }
                    }
                }
            }
        }
    }

    /// Stop watching a pipe whose writers are all gone.
    fn remove(&self, reader: &Arc<Reader>) {
        let _ = self.epoll.delete(reader.fd.as_fd());
        self.readers.lock().unwrap().remove(&reader.token);
        if reader.serving.swap(false, Ordering::AcqRel) {
            self.serving.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Bytes waiting in a pipe (FIONREAD).
fn pending_bytes(fd: RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int into `n`, a live local; `fd` is the open read end.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } != 0 {
        return 0;
    }
    n.max(0) as usize
}

/// Read what a non-blocking descriptor holds now.
fn read_now(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a live, writable slice of `buf.len()` bytes; `fd` is open for the call.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// A Zygote's output pipe, lines logged to the worker's own log; returns the write end.
pub fn log_pipe(label: &str, id: u64) -> io::Result<OwnedFd> {
    OutputPipe::new(id, Arc::new(TracingSink(label.to_string()))).map(|(_, write)| write)
}

/// Splits a byte stream into complete lines of at most [`MAX_LINE`] bytes.
#[derive(Default)]
struct Lines {
    /// Complete lines not yet handed on, and then the start of the next one.
    buf: Vec<u8>,
    /// Where the incomplete line starts in `buf`.
    partial_from: usize,
    /// Inside an over-long line, dropping until its end.
    skipping: bool,
}

impl Lines {
    /// Add `data`; hand `out` the complete lines it finishes, in one slice. Lines within
    /// [`MAX_LINE`] that start in `data` are handed over straight from it (a flood of output
    /// is not copied line by line); only a line split across reads, or cut, is copied.
    fn take(&mut self, mut data: &[u8], mut out: impl FnMut(&[u8])) {
        if self.partial_from == 0 && self.buf.is_empty() && !self.skipping {
            let whole = whole_lines(data);
            if whole > 0 {
                out(&data[..whole]);
                data = &data[whole..];
            }
        }
        for piece in data.split_inclusive(|b| *b == b'\n') {
            let complete = piece.ends_with(b"\n");
            if self.skipping {
                self.skipping = !complete;
                continue;
            }
            let room = MAX_LINE - (self.buf.len() - self.partial_from);
            if piece.len() > room || (piece.len() == room && !complete) {
                self.buf.extend_from_slice(&piece[..room.min(piece.len())]);
                self.buf.push(b'\n');
                self.partial_from = self.buf.len();
                self.skipping = !complete;
                continue;
            }
            self.buf.extend_from_slice(piece);
            if complete {
                self.partial_from = self.buf.len();
            }
        }
        if self.partial_from > 0 {
            out(&self.buf[..self.partial_from]);
            self.buf.drain(..self.partial_from);
            self.partial_from = 0;
        }
    }

    /// Hand on an incomplete last line as a line of its own.
    fn flush(&mut self, mut out: impl FnMut(&[u8])) {
        if !self.buf.is_empty() {
            self.buf.push(b'\n');
            out(&self.buf);
            self.buf.clear();
        }
        self.partial_from = 0;
    }
}

/// How many bytes at the start of `data` are complete lines of at most [`MAX_LINE`] bytes.
fn whole_lines(data: &[u8]) -> usize {
    let mut start = 0;
    for newline in memchr::memchr_iter(b'\n', data) {
        if newline - start >= MAX_LINE {
            break;
        }
        start = newline + 1;
    }
    start
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(chunks: &[&[u8]]) -> Vec<String> {
        let mut lines = Lines::default();
        let mut got = Vec::new();
        for chunk in chunks {
            lines.take(chunk, |out| {
                assert!(out.ends_with(b"\n"), "{out:?}");
                got.extend(String::from_utf8_lossy(out).lines().map(str::to_string));
            });
        }
        lines.flush(|out| got.extend(String::from_utf8_lossy(out).lines().map(str::to_string)));
        got
    }

    #[test]
    fn whole_lines_stop_at_a_partial_or_over_long_line() {
        assert_eq!(whole_lines(b"ab\ncd\nef"), 6);
        assert_eq!(whole_lines(b"no newline"), 0);
        let long = [vec![b'x'; MAX_LINE], b"\nafter\n".to_vec()].concat();
        assert_eq!(whole_lines(&long), 0);
        let fits = [b"a\n".to_vec(), vec![b'y'; MAX_LINE - 1], b"\n".to_vec()].concat();
        assert_eq!(whole_lines(&fits), fits.len());
    }

    #[test]
    fn lines_are_joined_across_reads_and_the_last_is_flushed() {
        assert_eq!(feed(&[b"a\nb", b"c\n", b"d\ne"]), ["a", "bc", "d", "e"]);
        assert_eq!(feed(&[b"", b"\n\n"]), ["", ""]);
        assert!(feed(&[b""]).is_empty());
    }

    #[test]
    fn an_over_long_line_is_cut_and_its_rest_dropped() {
        let long = vec![b'x'; MAX_LINE + 100];
        let got = feed(&[&long[..3000], &long[3000..], b"\nnext\n"]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].len(), MAX_LINE);
        assert_eq!(got[1], "next");
        let exact = [vec![b'y'; MAX_LINE], b"\nafter\n".to_vec()].concat();
        assert_eq!(feed(&[&exact]), [String::from_utf8(vec![b'y'; MAX_LINE]).unwrap(), "after".to_string()]);
    }

    struct Collect(Mutex<Vec<u8>>);
    impl OutputSink for Collect {
        fn write(&self, _sandbox: u64, lines: &[u8]) {
            self.0.lock().unwrap().extend_from_slice(lines);
        }
    }

    #[test]
    fn settle_hands_over_everything_written_before_it() {
        let sink = Arc::new(Collect(Mutex::new(Vec::new())));
        let (pipe, write) = OutputPipe::new(7, sink.clone()).unwrap();
        let mut file = std::fs::File::from(write);
        use std::io::Write;
        for i in 0..1000 {
            writeln!(file, "line {i}").unwrap();
        }
        write!(file, "partial").unwrap();
        pipe.begin();
        pipe.settle();
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1001, "{}", &text[text.len().saturating_sub(200)..]);
        assert!(text.ends_with("line 999\npartial\n"));
    }

    #[test]
    fn the_poller_reads_between_requests_at_once_and_during_them_by_sweeps() {
        let sink = Arc::new(Collect(Mutex::new(Vec::new())));
        let (pipe, write) = OutputPipe::new(8, sink.clone()).unwrap();
        let mut file = std::fs::File::from(write);
        use std::io::Write;
        let seen = |what: &str| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if String::from_utf8_lossy(&sink.0.lock().unwrap()).contains(what) {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            false
        };
        writeln!(file, "idle line").unwrap();
        assert!(seen("idle line\n"));
        pipe.begin();
        // More than the pipe holds: the sweeps drain it, so the writer is never stuck.
        let big = vec![b'z'; 100];
        for _ in 0..(3 * PIPE_BYTES / 101) {
            file.write_all(&big).unwrap();
            file.write_all(b"\n").unwrap();
        }
        writeln!(file, "last").unwrap();
        pipe.settle();
        assert!(String::from_utf8_lossy(&sink.0.lock().unwrap()).ends_with("last\n"));
        drop(file);
        assert!(seen("last\n"));
    }
}
