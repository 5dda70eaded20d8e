//! What the protocols, the session and the executor share, depending on none of them: the
//! environment a request is handled in (`Env`), what a protocol step decided (`Next`), a store
//! command waiting for its value (`StoreOp`, answered per `Reply`) and a `stats` request.

use crate::shared::Shared;
use crate::stats::CoreStats;
use crate::store::Mode;

/// What a connection handles a request with: the server's shared state and this core's
/// counters.
pub struct Env<'a> {
    pub shared: &'a Shared,
    pub stats: &'a CoreStats,
    /// The connection's socket, memcached's `cfd` in log lines and `stats conns` (-1: none).
    pub fd: i32,
}

/// What one protocol step decided.
pub enum Next {
    /// A command was handled; look for the next.
    Continue,
    /// The next command is not complete.
    NeedMore,
    /// A store command's value comes next.
    Data(StoreOp),
    /// Discard this many bytes next.
    Swallow(usize),
    Stats(StatsRequest),
    /// Watch these log kinds (`crate::watch`): the connection only listens from now on.
    Watch(u32),
    /// The client asked to close (quit).
    Quit,
    /// Close for a protocol error.
    Close,
}

/// How to answer a store once its value has arrived.
#[derive(Clone, Debug)]
pub enum Reply {
    Text {
        noreply: bool,
    },
    Binary {
        opcode: u8,
        opaque: u32,
        quiet: bool,
    },
    /// ms: a two-letter code and the flags it asked back.
    /// `base64`: the key came base64-encoded (`b`), and goes back so.
    /// `cas_in`: the cas the stored item takes (`E`), instead of the next one.
    Meta {
        quiet: bool,
        opaque: Option<Vec<u8>>,
        ret: Vec<u8>,
        base64: bool,
        cas_in: Option<u64>,
    },
}

/// A store command waiting for (or holding) its value.
pub struct StoreOp {
    pub reply: Reply,
    pub mode: Mode,
    pub key: Vec<u8>,
    pub flags: u32,
    /// Relative expiry.
    pub exptime: u32,
    /// Value bytes, without the trailer.
    pub len: usize,
    /// Bytes after the value: 2 for the text protocol's "\r\n", 0 for binary.
    pub trailer: usize,
}

/// What `stats` asked for.
#[derive(Clone, Debug)]
pub enum StatsRequest {
    Text { group: Option<Vec<u8>> },
    Binary { group: Option<Vec<u8>>, opaque: u32 },
}

impl StatsRequest {
    pub fn group(&self) -> Option<&[u8]> {
        match self {
            StatsRequest::Text { group } | StatsRequest::Binary { group, .. } => group.as_deref(),
        }
    }

    /// `stats reset` zeroes counters instead of reporting them.
    pub fn is_reset(&self) -> bool {
        self.group() == Some(b"reset")
    }
}
