//! A client connection on its core: reads what arrived, runs every complete command through
//! its session, and writes all the replies with one sendmsg — EbbRT's receive event, run to
//! completion. A short read means the socket is drained (epoll reports new data as a new
//! edge), so a request costs one read and one write, with no read that only says EAGAIN.

use std::cell::Cell;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;
use sprout_runtime::mio::net::TcpStream;
use sprout_runtime::{Control, IoHandler, Ready, Token};

use crate::conn_table::{tcp_addr, ConnEntry, ConnState};
use crate::output::Output;
use crate::session::{Env, Session, Step};
use crate::shared::Shared;
use crate::stats::{CoreStats, Counters};
use crate::watch::{self, Watcher};

/// Read buffer size; a read that fills it is followed by another.
const READ_CHUNK: usize = 16 * 1024;
/// Stop reading while this much output waits for a slow reader (memcached stops too).
const OUTPUT_HIGH_WATER: usize = 4 << 20;

pub struct Conn {
    stream: TcpStream,
    input: BytesMut,
    out: Output,
    session: Session,
    shared: Arc<Shared>,
    stats: Rc<CoreStats>,
    /// Counters gathered for a `stats` this connection waits for.
    gathered: Rc<Cell<Option<Counters>>>,
    waiting_stats: bool,
    closing: bool,
    /// Why it closes, for the connevents log: a protocol error, not the client.
    error_close: bool,
    fd: i32,
    peer: Option<std::net::SocketAddr>,
    entry: Arc<ConnEntry>,
    /// Set once the client asked to `watch`: its log lines are written here.
    watcher: Option<Arc<Watcher>>,
    /// The core it lives on (counted in `Shared::loads`).
    core: usize,
}

impl Conn {
    /// A connection placed on this core (`CoreLoads::place` counted it here).
    pub fn new(stream: TcpStream, shared: Arc<Shared>, stats: Rc<CoreStats>) -> Conn {
        CoreStats::bump(&stats.curr_connections);
        CoreStats::bump(&stats.total_connections);
        let fd = stream.as_raw_fd();
        let peer = stream.peer_addr().ok();
        let local = stream.local_addr().map(tcp_addr).unwrap_or_default();
        let entry = shared.conn_table.open(fd, peer.map(tcp_addr).unwrap_or_default(), Some(local), shared.clock.now());
        log_conn_event(&shared, "conn_new", peer, None, fd);
        Conn {
            stream,
            input: BytesMut::with_capacity(READ_CHUNK),
            out: Output::new(),
            session: Session::new(),
            shared,
            stats,
            gathered: Rc::new(Cell::new(None)),
            waiting_stats: false,
            closing: false,
            error_close: false,
            fd,
            peer,
            entry,
            watcher: None,
            core: sprout_runtime::current_core(),
        }
    }

    /// Read and handle until the socket is drained, the peer is gone, or output backs up.
    fn read_and_handle(&mut self, token: Token) -> Reading {
        loop {
            if self.waiting_stats || self.closing {
                return Reading::Drained;
            }
            if self.out.pending() > OUTPUT_HIGH_WATER {
                return Reading::Backpressured;
            }
            // A large value is read straight into its own buffer.
            let result = if let Some((buf, need)) = self.session.direct_buffer() {
                read_into(&mut self.stream, buf, need).map(|n| (n, need))
            } else {
                if self.input.capacity() - self.input.len() < 1024 {
                    self.input.reserve(READ_CHUNK);
                }
                let room = self.input.capacity() - self.input.len();
                read_into(&mut self.stream, &mut self.input, room).map(|n| (n, room))
            };
            match result {
                Err(()) => return Reading::Failed,
                Ok((None, _)) => return Reading::Drained,
                Ok((Some(0), _)) => return Reading::PeerClosed,
                Ok((Some(n), asked)) => {
                    self.handle(token);
                    if n < asked {
                        return Reading::Drained;
                    }
                }
            }
        }
    }

    /// Run the session over what is buffered.
    fn handle(&mut self, token: Token) {
        if self.waiting_stats {
            return;
        }
        if self.watcher.is_none() {
            self.entry.touched(self.shared.clock.now());
        }
        let env = Env { shared: &self.shared, stats: &self.stats, fd: self.fd };
        match self.session.process(&mut self.input, &env, &mut self.out) {
            Step::NeedMore => {}
            Step::Close { error } => {
                self.closing = true;
                self.error_close = error;
            }
            Step::Stats => self.start_gather(token),
            Step::Watch(kinds) => self.start_watching(kinds, token),
        }
        if self.watcher.is_none() {
            self.entry.set_state(if self.session.reading_value() { ConnState::Nread } else { ConnState::Waiting });
        }
    }

    /// Become a watcher of `kinds`: woken on this core whenever its buffer gets lines.
    fn start_watching(&mut self, kinds: u32, token: Token) {
        let core = sprout_runtime::current_core();
        let wake = Box::new(move || {
            // (a connection closing as the runtime stops logs off any core: nobody to wake)
            if sprout_runtime::on_core() {
                sprout_runtime::spawn_on(core, move || sprout_runtime::notify(token));
            }
        });
        match self.shared.watch(kinds, wake) {
            Some(watcher) => {
                self.out.put(b"OK\r\n");
                self.entry.set_state(ConnState::Watch);
                self.watcher = Some(watcher);
            }
            None => {
                // memcached's words; the connection stays an ordinary one.
                self.out.put(b"WATCHER_TOO_MANY log watcher limit reached\r\n");
                self.session = Session::new();
            }
        }
    }

    /// Move the watcher's lines to the output, unless the client is not taking them (then
    /// they wait, and past the buffer are skipped and counted).
    fn take_watched(&mut self) {
        if let Some(watcher) = &self.watcher {
            if self.out.pending() < OUTPUT_HIGH_WATER {
                let text = watcher.take();
                if !text.is_empty() {
                    self.out.put(&text);
                }
            }
        }
    }

    /// Gather every core's counters (or reset them), then wake this connection.
    fn start_gather(&mut self, token: Token) {
        self.waiting_stats = true;
        let reset = self.session.stats_request().is_some_and(|r| r.is_reset());
        let gathered = self.gathered.clone();
        self.shared.stats.gather(
            move |rep: &CoreStats| {
                let snapshot = rep.snapshot();
                if reset {
                    // curr_connections is a level, not a count: keep it.
                    let open = rep.curr_connections.get();
                    rep.reset();
                    rep.curr_connections.set(open);
                }
                snapshot
            },
            move |results| {
                let mut sum = Counters::default();
                for (_, c) in &results {
                    sum.add(c);
                }
                gathered.set(Some(sum));
                sprout_runtime::notify(token);
            },
        );
    }

    fn flush(&mut self) -> Result<(), ()> {
        let before = self.out.pending();
        let result = self.out.flush(self.stream.as_raw_fd());
        CoreStats::add(&self.stats.bytes_written, (before - self.out.pending()) as u64);
        result.map(|_| ()).map_err(|_| ())
    }
}

enum Reading {
    /// Nothing more to read now.
    Drained,
    /// Stopped: too much output waits.
    Backpressured,
    PeerClosed,
    Failed,
}

/// Read at most `max` bytes into the spare capacity of `buf`. Ok(None): nothing to read now.
fn read_into(stream: &mut TcpStream, buf: &mut BytesMut, max: usize) -> Result<Option<usize>, ()> {
    buf.reserve(max);
    let spare = &mut buf.spare_capacity_mut()[..max];
    // SAFETY: read writes initialized bytes into the front of `spare` and reports how many.
    let slice = unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr() as *mut u8, spare.len()) };
    loop {
        match stream.read(slice) {
            Ok(n) => {
                // SAFETY: the first n bytes were just written by read.
                unsafe { buf.set_len(buf.len() + n) };
                return Ok(Some(n));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(()),
        }
    }
}

impl IoHandler for Conn {
    fn source(&mut self) -> &mut dyn sprout_runtime::mio::event::Source {
        &mut self.stream
    }

    fn ready(&mut self, token: Token, ready: Ready) -> Control {
        if ready.notified {
            if let Some(counters) = self.gathered.take() {
                let env = Env { shared: &self.shared, stats: &self.stats, fd: self.fd };
                self.session.finish_stats(&counters, &env, &mut self.out);
                self.waiting_stats = false;
                // Commands that arrived behind the stats request.
                self.handle(token);
            }
        }
        loop {
            let reading = self.read_and_handle(token);
            self.take_watched();
            if self.flush().is_err() {
                return Control::Close;
            }
            match reading {
                Reading::Failed => return Control::Close,
                Reading::PeerClosed => {
                    // Finish sending what was asked before the peer shut its side.
                    self.closing = true;
                    break;
                }
                Reading::Drained => break,
                // Wait for the socket to take more unless the flush made room.
                Reading::Backpressured if self.out.pending() > OUTPUT_HIGH_WATER => break,
                Reading::Backpressured => {}
            }
        }
        if self.closing && self.out.is_empty() {
            return Control::Close;
        }
        Control::Keep
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(watcher) = &self.watcher {
            self.shared.unwatch(watcher);
        }
        self.shared.conn_table.close(self.fd);
        let reason = if self.error_close { "error" } else { "normal" };
        log_conn_event(&self.shared, "conn_close", self.peer, Some(reason), self.fd);
        self.stats.curr_connections.set(self.stats.curr_connections.get().saturating_sub(1));
        self.shared.conns.fetch_sub(1, Ordering::Relaxed);
        self.shared.loads.closed(self.core);
    }
}

/// memcached's connevents line: `conn_new` or `conn_close` (with its reason).
fn log_conn_event(shared: &Shared, kind: &str, peer: Option<std::net::SocketAddr>, reason: Option<&str>, fd: i32) {
    shared.watchers.log(watch::CONNEVENTS, |line| {
        use std::fmt::Write;
        let (ip, port) = peer.map_or((String::new(), 0), |p| (p.ip().to_string(), p.port()));
        let _ = write!(line, "{kind} rip={ip} rport={port} transport=tcp");
        if let Some(reason) = reason {
            let _ = write!(line, " reason={reason}");
        }
        let _ = write!(line, " cfd={fd}");
    });
}
