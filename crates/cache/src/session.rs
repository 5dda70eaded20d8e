//! One connection's protocol state machine, without the socket: bytes in, replies out.
//! It picks the protocol from the first byte (0x80: binary, else text, as memcached does),
//! reads commands and data blocks, and hands values too large for the read buffer a buffer
//! of their own that the connection reads into directly. The fuzz targets drive it alone.

use bytes::{Buf, Bytes, BytesMut};

pub use crate::ascii::{MAX_GET_LINE, MAX_LINE};
use crate::output::Output;
pub use crate::request::{Env, Next, Reply, StatsRequest, StoreOp};
use crate::store::Stored;
use crate::{ascii, binary, exec, meta};

/// A value whose block (with its trailer) is at least this large and not yet all read gets a
/// buffer of its own, read into straight from the socket; smaller ones wait in the read
/// buffer and are copied out once.
pub const DIRECT_MIN: usize = 16 * 1024;

/// What the connection must do after `process`.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Everything complete was handled; read more.
    NeedMore,
    /// Gather the counters of every core, then call `finish_stats`.
    Stats,
    /// Send what is queued, then close; `error`: for a protocol error, not a quit.
    Close { error: bool },
    /// Register as a watcher of these log kinds (`crate::watch`), then only write.
    Watch(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Unknown,
    Text,
    Binary,
}

enum State {
    Ready,
    /// Waiting for a value; `buf` is its own buffer when it is large.
    Data {
        op: StoreOp,
        buf: Option<BytesMut>,
    },
    /// Discarding this many bytes (a refused value).
    Swallow(usize),
    /// Waiting for a stats gather.
    Stats,
    Closing,
    /// A watcher: what the client sends is read and dropped, as memcached stops reading it.
    Watching,
}

pub struct Session {
    proto: Proto,
    /// Bytes of the read buffer already searched for a newline (text protocol).
    scanned: usize,
    state: State,
    stats_request: Option<StatsRequest>,
}

impl Default for Session {
    fn default() -> Self {
        Session::new()
    }
}

impl Session {
    pub fn new() -> Session {
        Session { proto: Proto::Unknown, scanned: 0, state: State::Ready, stats_request: None }
    }

    /// The stats a `Step::Stats` asked for.
    pub fn stats_request(&self) -> Option<&StatsRequest> {
        self.stats_request.as_ref()
    }

    /// Handle everything complete in `input` (consuming it), writing replies to `out`.
    pub fn process(&mut self, input: &mut BytesMut, env: &Env, out: &mut Output) -> Step {
        loop {
            match &mut self.state {
                State::Closing => return Step::Close { error: false },
                State::Watching => {
                    input.clear();
                    return Step::NeedMore;
                }
                State::Stats => return Step::Stats,
                State::Swallow(left) => {
                    let n = (*left).min(input.len());
                    input.advance(n);
                    *left -= n;
                    if *left > 0 {
                        return Step::NeedMore;
                    }
                    self.state = State::Ready;
                }
                State::Data { op, buf } => {
                    let need = op.len + op.trailer;
                    let block = match buf {
                        Some(b) => {
                            let n = (need - b.len()).min(input.len());
                            b.extend_from_slice(&input[..n]);
                            input.advance(n);
                            if b.len() < need {
                                return Step::NeedMore;
                            }
                            std::mem::take(b)
                        }
                        None => {
                            if input.len() < need {
                                if need >= DIRECT_MIN {
                                    let mut own = BytesMut::with_capacity(need);
                                    own.extend_from_slice(input);
                                    input.clear();
                                    *buf = Some(own);
                                }
                                return Step::NeedMore;
                            }
                            // Copied out once, to a buffer of exactly its size.
                            let block = BytesMut::from(&input[..need]);
                            input.advance(need);
                            block
                        }
                    };
                    let State::Data { op, .. } = std::mem::replace(&mut self.state, State::Ready) else { unreachable!() };
                    complete_store(op, block, env, out);
                }
                State::Ready => {
                    if input.is_empty() {
                        return Step::NeedMore;
                    }
                    if self.proto == Proto::Unknown {
                        self.proto = if input[0] == binary::REQUEST_MAGIC { Proto::Binary } else { Proto::Text };
                    }
                    let next = match self.proto {
                        Proto::Binary => binary::step(input, env, out),
                        _ => ascii::step(input, &mut self.scanned, env, out),
                    };
                    if !matches!(next, Next::NeedMore) {
                        self.scanned = 0;
                    }
                    match next {
                        Next::Continue => {}
                        Next::NeedMore => return Step::NeedMore,
                        Next::Data(op) => self.state = State::Data { op, buf: None },
                        Next::Swallow(n) => self.state = State::Swallow(n),
                        Next::Stats(request) => {
                            self.stats_request = Some(request);
                            self.state = State::Stats;
                            return Step::Stats;
                        }
                        Next::Watch(kinds) => {
                            self.state = State::Watching;
                            return Step::Watch(kinds);
                        }
                        Next::Quit | Next::Close => {
                            self.state = State::Closing;
                            return Step::Close { error: matches!(next, Next::Close) };
                        }
                    }
                }
            }
        }
    }

    /// Whether a store's value is being read (memcached's conn_nread), for `stats conns`.
    pub fn reading_value(&self) -> bool {
        matches!(self.state, State::Data { .. } | State::Swallow(_))
    }

    /// Where the connection may read the rest of a large value directly: the value's own
    /// buffer, and how many bytes it still needs.
    pub fn direct_buffer(&mut self) -> Option<(&mut BytesMut, usize)> {
        match &mut self.state {
            State::Data { op, buf: Some(b) } => {
                let need = op.len + op.trailer - b.len();
                Some((b, need))
            }
            _ => None,
        }
    }

    /// Reply to the stats request with the gathered counters, and go on.
    pub fn finish_stats(&mut self, counters: &crate::stats::Counters, env: &Env, out: &mut Output) {
        if let Some(request) = self.stats_request.take() {
            match &request {
                StatsRequest::Text { group } => ascii::stats_reply(group.as_deref(), counters, env, out),
                StatsRequest::Binary { group, opaque } => binary::stats_reply(group.as_deref(), *opaque, counters, env, out),
            }
        }
        if matches!(self.state, State::Stats) {
            self.state = State::Ready;
        }
    }
}

/// Store a value that has fully arrived (`block` holds it and its trailer), and reply.
pub fn complete_store(op: StoreOp, mut block: BytesMut, env: &Env, out: &mut Output) {
    if op.trailer == 2 && &block[op.len..] != b"\r\n" {
        // noreply silences even this (memcached does); a meta set always hears it.
        if matches!(op.reply, Reply::Text { noreply: false } | Reply::Meta { .. }) {
            out.put(b"CLIENT_ERROR bad data chunk\r\n");
        }
        return;
    }
    block.truncate(op.len);
    let value: Bytes = block.freeze();
    if !matches!(op.reply, Reply::Meta { .. }) {
        env.shared.prefixes.record(&op.key, crate::prefix_stats::Op::Set);
    }
    let cas_in = match op.reply {
        Reply::Meta { cas_in, .. } => cas_in,
        _ => None,
    };
    let result = exec::store(env, op.mode, &op.key, value, op.flags, op.exptime, cas_in);
    match op.reply {
        Reply::Text { noreply } => {
            if !noreply {
                out.put(match result {
                    Stored::Stored(_) => b"STORED\r\n",
                    Stored::NotStored => b"NOT_STORED\r\n",
                    Stored::Exists => b"EXISTS\r\n",
                    Stored::NotFound => b"NOT_FOUND\r\n",
                    Stored::TooLarge => &b"SERVER_ERROR out of memory storing object\r\n"[..],
                });
            }
        }
        Reply::Binary { opcode, opaque, quiet } => binary::store_reply(opcode, opaque, quiet, result, out),
        Reply::Meta { quiet, opaque, ret, base64, .. } => {
            // s: the stored value's size (after an append, the whole).
            let size =
                if ret.contains(&b's') { env.shared.store.peek(&op.key, env.shared.clock.now()).map_or(0, |i| i.value.len()) } else { 0 };
            meta::store_reply(result, &op.key, base64, quiet, opaque.as_deref(), ret, size, out)
        }
    }
}
