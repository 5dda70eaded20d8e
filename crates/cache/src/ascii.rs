//! The text protocol's commands run against the store, with memcached's replies and errors
//! word for word (`protocol.txt`).

use bytes::{Buf, BytesMut};

use crate::exec::{self, Read};
use crate::meta;
use crate::output::Output;
use crate::prefix_stats::Op;
use crate::request::{Env, Next, Reply, StatsRequest, StoreOp};
use crate::stats::{CoreStats, Counters};
use crate::store::{Deleted, DeltaError, Mode};
use crate::text::{self, Command, Reject, StoreKind};

/// A text line may grow to this size without a newline when it is a get (memcached's
/// multigets are unbounded; this is our bound), else to 2048 bytes, as memcached.
pub const MAX_GET_LINE: usize = 1 << 20;
pub const MAX_LINE: usize = 2048;

/// Handle the next command line in `input`, if it has a whole one. `scanned`: how much of
/// `input` an earlier call already searched for a newline (so a long line arriving in small
/// pieces is searched once, not once per piece); reset when a line is consumed.
pub fn step(input: &mut BytesMut, scanned: &mut usize, env: &Env, out: &mut Output) -> Next {
    let from = (*scanned).min(input.len());
    let Some(nl) = memchr(b'\n', &input[from..]).map(|i| i + from) else {
        *scanned = input.len();
        if input.len() > MAX_LINE {
            // memcached: a long line without a newline must be a multiget, else the
            // connection goes.
            let spaces = input.iter().take_while(|&&b| b == b' ').count();
            let rest = &input[spaces..];
            if spaces > 100 || !(rest.starts_with(b"get ") || rest.starts_with(b"gets ")) || input.len() > MAX_GET_LINE {
                return Next::Close;
            }
        }
        return Next::NeedMore;
    };
    let end = if nl > 1 && input[nl - 1] == b'\r' { nl - 1 } else { nl };
    CoreStats::add(&env.stats.bytes_read, nl as u64 + 1);
    // memcached 1.6.45: a line under 4 bytes with its terminator names no command.
    let parsed = if nl + 1 < 4 { Err(Reject::Client { message: text::BAD_FORMAT, noreply: false }) } else { text::parse(&input[..end]) };
    let next = match parsed {
        Ok(Command::Store { kind, key, flags, exptime, bytes, cas, noreply }) => {
            let op = StoreOp {
                reply: Reply::Text { noreply },
                mode: match kind {
                    StoreKind::Set => Mode::Set,
                    StoreKind::Add => Mode::Add,
                    StoreKind::Replace => Mode::Replace,
                    StoreKind::Append => Mode::Append(0),
                    StoreKind::Prepend => Mode::Prepend(0),
                    StoreKind::Cas => Mode::Cas(cas),
                },
                key: key.to_vec(),
                flags,
                exptime: env.shared.clock.expiry(exptime),
                len: bytes,
                trailer: 2,
            };
            input.advance(nl + 1);
            CoreStats::add(&env.stats.bytes_read, (bytes + 2) as u64);
            return begin_store(op, kind, noreply, env, out);
        }
        Ok(command) => execute(command, env, out),
        Err(reject) => {
            match reject {
                Reject::Error { noreply } => {
                    if !noreply {
                        out.put(b"ERROR\r\n");
                    }
                }
                Reject::Client { message, noreply } => client_error(message, noreply, out),
                Reject::Data { message, noreply, bytes } => {
                    client_error(message, noreply, out);
                    input.advance(nl + 1);
                    CoreStats::add(&env.stats.bytes_read, (bytes + 2) as u64);
                    return Next::Swallow(bytes + 2);
                }
                Reject::Server(message) => {
                    out.put(b"SERVER_ERROR ");
                    out.put(message.as_bytes());
                    out.put(b"\r\n");
                }
                Reject::Close => {
                    input.advance(nl + 1);
                    return Next::Close;
                }
            }
            Next::Continue
        }
    };
    input.advance(nl + 1);
    next
}

fn client_error(message: &str, noreply: bool, out: &mut Output) {
    if !noreply {
        out.put(b"CLIENT_ERROR ");
        out.put(message.as_bytes());
        out.put(b"\r\n");
    }
}

/// A store command's line is read: refuse a value that can never fit (discarding it as it
/// arrives, never buffering it), else wait for it.
fn begin_store(op: StoreOp, kind: StoreKind, noreply: bool, env: &Env, out: &mut Output) -> Next {
    if exec::refuse_too_large(env, &op.key, op.len, op.flags, kind == StoreKind::Set) {
        if !noreply {
            out.put(b"SERVER_ERROR object too large for cache\r\n");
        }
        return Next::Swallow(op.len + 2);
    }
    Next::Data(op)
}

fn execute(command: Command<'_>, env: &Env, out: &mut Output) -> Next {
    match command {
        Command::Get { cas, touch, keys } => {
            let how = match touch {
                Some(t) => Read::Touch(env.shared.clock.expiry(t)),
                None => Read::Get,
            };
            // A key too long fails the whole command, before any value is sent.
            if text::keys(keys).any(|k| k.len() > text::KEY_MAX) {
                out.put(b"CLIENT_ERROR bad command line format\r\n");
                return Next::Continue;
            }
            for key in text::keys(keys) {
                let found = exec::read(env, key, how);
                env.shared.prefixes.record(key, Op::Get { hit: found.is_some() });
                if let Some(item) = found {
                    out.put(b"VALUE ");
                    out.put(key);
                    out.put(b" ");
                    out.put_u64(item.flags as u64);
                    out.put(b" ");
                    out.put_u64(item.value.len() as u64);
                    if cas {
                        out.put(b" ");
                        out.put_u64(item.cas);
                    }
                    out.put(b"\r\n");
                    out.put_value(&item.value);
                    out.put(b"\r\n");
                }
            }
            out.put(b"END\r\n");
        }
        Command::Delete { key, noreply } => {
            env.shared.prefixes.record(key, Op::Delete);
            let deleted = exec::delete(env, key, 0) == Deleted::Deleted;
            if !noreply {
                out.put(if deleted { b"DELETED\r\n" } else { b"NOT_FOUND\r\n" });
            }
        }
        Command::Delta { incr, key, delta, noreply } => match exec::delta(env, key, incr, delta, 0, None, None) {
            Ok((value, _)) => {
                if !noreply {
                    out.put_u64(value);
                    out.put(b"\r\n");
                }
            }
            Err(DeltaError::NonNumeric) => {
                if !noreply {
                    out.put(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n");
                }
            }
            Err(_) => {
                if !noreply {
                    out.put(b"NOT_FOUND\r\n");
                }
            }
        },
        Command::Touch { key, exptime, noreply } => {
            let touched = exec::read(env, key, Read::Touch(env.shared.clock.expiry(exptime))).is_some();
            if !noreply {
                out.put(if touched { b"TOUCHED\r\n" } else { b"NOT_FOUND\r\n" });
            }
        }
        Command::FlushAll { delay, noreply } => {
            exec::flush(env, delay);
            if !noreply {
                out.put(b"OK\r\n");
            }
        }
        Command::Stats { args } => match args.as_slice() {
            [b"detail", sub] => match *sub {
                b"on" | b"off" => {
                    env.shared.prefixes.set_on(*sub == b"on");
                    out.put(b"OK\r\n");
                }
                b"dump" => out.put(&env.shared.prefixes.dump()),
                _ => out.put(b"CLIENT_ERROR usage: stats detail on|off|dump\r\n"),
            },
            [b"detail", ..] => out.put(b"CLIENT_ERROR usage: stats detail on|off|dump\r\n"),
            [b"cachedump", class, limit] => cachedump(env, class, limit, out),
            _ => {
                let group = args.first().map(|g| g.to_vec());
                return Next::Stats(StatsRequest::Text { group });
            }
        },
        Command::Version => {
            out.put(b"VERSION ");
            out.put(crate::shared::VERSION.as_bytes());
            out.put(b"\r\n");
        }
        Command::Answer(line) => out.put(line),
        Command::Verbosity { noreply } => {
            if !noreply {
                out.put(b"OK\r\n");
            }
        }
        Command::Quit => return Next::Quit,
        Command::Watch { kinds: Some(kinds) } => return Next::Watch(kinds),
        Command::Watch { kinds: None } => out.put(b"ERROR\r\n"),
        Command::Meta { name, tokens } => return meta::execute(name, &tokens, env, out),
        Command::Store { .. } => unreachable!("store commands are handled by step"),
    }
    Next::Continue
}

/// `stats cachedump <class> <limit>`: the class's items as memcached lists them (`ITEM <key>
/// [<bytes> b; <expiry> s]`, the expiry a unix time or 0), up to `limit` (0: all).
fn cachedump(env: &Env, class: &[u8], limit: &[u8], out: &mut Output) {
    let (Some(class), Some(limit)) = (text::parse_u64(class), text::parse_u64(limit)) else {
        return out.put(b"CLIENT_ERROR bad command line format\r\n");
    };
    if !(1..=crate::slab_classes::SIZES.len() as u64).contains(&class) {
        return out.put(b"CLIENT_ERROR Illegal slab id\r\n");
    }
    let started = env.shared.clock.started_unix();
    for (key, bytes, exptime) in env.shared.store.dump_class(class as u8, limit as usize) {
        out.put(b"ITEM ");
        out.put(&key);
        let expiry = if exptime == 0 { 0 } else { started + exptime as i64 };
        out.put(format!(" [{bytes} b; {expiry} s]\r\n").as_bytes());
    }
    out.put(b"END\r\n");
}

/// The reply to `stats [group]` once the cores' counters are gathered.
pub fn stats_reply(group: Option<&[u8]>, counters: &Counters, env: &Env, out: &mut Output) {
    if group == Some(b"reset") {
        env.shared.store.reset_stats();
        env.shared.prefixes.clear();
        out.put(b"RESET\r\n");
        return;
    }
    match env.shared.report(group, counters, env.fd) {
        Some(lines) => {
            for (name, value) in lines {
                out.put(b"STAT ");
                out.put(name.as_bytes());
                out.put(b" ");
                out.put(value.as_bytes());
                out.put(b"\r\n");
            }
            out.put(b"END\r\n");
        }
        None => out.put(b"ERROR\r\n"),
    }
}

#[inline]
pub fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    memchr::memchr(needle, haystack)
}
