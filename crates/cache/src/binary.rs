//! The binary protocol (EbbRT's memcached spoke it): 24-byte headers, its commands and their
//! quiet variants, with memcached's status codes and messages. Quiet commands answer only on
//! error (and quiet gets not on a miss); a malformed packet gets "Invalid arguments" and the
//! connection closes, as memcached does; an unknown opcode is answered and its body skipped.

use bytes::{Buf, BufMut, BytesMut};

use crate::exec::{self, Read};
use crate::output::Output;
use crate::request::{Env, Next, Reply, StatsRequest, StoreOp};
use crate::stats::{CoreStats, Counters};
use crate::store::{Deleted, DeltaError, Mode, Stored};
use crate::text::KEY_MAX;

pub const REQUEST_MAGIC: u8 = 0x80;
pub const RESPONSE_MAGIC: u8 = 0x81;
pub const HEADER: usize = 24;

pub mod op {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

pub mod status {
    pub const SUCCESS: u16 = 0x00;
    pub const KEY_ENOENT: u16 = 0x01;
    pub const KEY_EEXISTS: u16 = 0x02;
    pub const E2BIG: u16 = 0x03;
    pub const EINVAL: u16 = 0x04;
    pub const NOT_STORED: u16 = 0x05;
    pub const DELTA_BADVAL: u16 = 0x06;
    pub const UNKNOWN_COMMAND: u16 = 0x81;
    pub const ENOMEM: u16 = 0x82;
}

/// memcached's message for each error status.
fn message(status: u16) -> &'static [u8] {
    match status {
        status::KEY_ENOENT => b"Not found",
        status::KEY_EEXISTS => b"Data exists for key.",
        status::E2BIG => b"Too large.",
        status::EINVAL => b"Invalid arguments",
        status::NOT_STORED => b"Not stored.",
        status::DELTA_BADVAL => b"Non-numeric server-side value for incr or decr",
        status::UNKNOWN_COMMAND => b"Unknown command",
        status::ENOMEM => b"Out of memory",
        _ => b"",
    }
}

/// A request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub opcode: u8,
    pub keylen: u16,
    pub extlen: u8,
    pub bodylen: u32,
    pub opaque: u32,
    pub cas: u64,
}

impl Header {
    pub fn parse(b: &[u8]) -> Header {
        Header {
            opcode: b[1],
            keylen: u16::from_be_bytes([b[2], b[3]]),
            extlen: b[4],
            bodylen: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            opaque: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
            cas: u64::from_be_bytes(b[16..24].try_into().unwrap()),
        }
    }
}

/// Write a response header.
#[allow(clippy::too_many_arguments)]
fn header(out: &mut Output, opcode: u8, status: u16, extlen: u8, keylen: u16, bodylen: u32, opaque: u32, cas: u64) {
    let b = out.buf_mut();
    b.reserve(HEADER);
    b.put_u8(RESPONSE_MAGIC);
    b.put_u8(opcode);
    b.put_u16(keylen);
    b.put_u8(extlen);
    b.put_u8(0);
    b.put_u16(status);
    b.put_u32(bodylen);
    b.put_u32(opaque);
    b.put_u64(cas);
}

fn error(out: &mut Output, opcode: u8, status: u16, opaque: u32) {
    let msg = message(status);
    header(out, opcode, status, 0, 0, msg.len() as u32, opaque, 0);
    out.put(msg);
}

fn is_quiet(opcode: u8) -> bool {
    matches!(
        opcode,
        op::GETQ
            | op::GETKQ
            | op::SETQ
            | op::ADDQ
            | op::REPLACEQ
            | op::DELETEQ
            | op::INCREMENTQ
            | op::DECREMENTQ
            | op::QUITQ
            | op::FLUSHQ
            | op::APPENDQ
            | op::PREPENDQ
            | op::GATQ
            | op::GATKQ
    )
}

/// The command a quiet opcode is the quiet variant of.
fn base(opcode: u8) -> u8 {
    match opcode {
        op::SETQ => op::SET,
        op::ADDQ => op::ADD,
        op::REPLACEQ => op::REPLACE,
        op::DELETEQ => op::DELETE,
        op::INCREMENTQ => op::INCREMENT,
        op::DECREMENTQ => op::DECREMENT,
        op::QUITQ => op::QUIT,
        op::FLUSHQ => op::FLUSH,
        op::APPENDQ => op::APPEND,
        op::PREPENDQ => op::PREPEND,
        op::GETQ => op::GET,
        op::GETKQ => op::GETK,
        op::GATQ => op::GAT,
        op::GATKQ => op::GATK,
        other => other,
    }
}

/// Handle the next request in `input`, if it is complete.
pub fn step(input: &mut BytesMut, env: &Env, out: &mut Output) -> Next {
    if input.len() < HEADER {
        return Next::NeedMore;
    }
    if input[0] != REQUEST_MAGIC {
        // memcached drops a connection that loses the packet framing.
        return Next::Close;
    }
    let h = Header::parse(&input[..HEADER]);
    let (keylen, extlen, bodylen) = (h.keylen as usize, h.extlen as usize, h.bodylen as usize);
    let opcode = base(h.opcode);
    let quiet = is_quiet(h.opcode);
    let invalid = |out: &mut Output| {
        error(out, h.opcode, status::EINVAL, h.opaque);
        Next::Close
    };
    if keylen + extlen > bodylen {
        // memcached's answer to a header that cannot be framed: unknown, and goodbye.
        error(out, h.opcode, status::UNKNOWN_COMMAND, h.opaque);
        return Next::Close;
    }
    if keylen > KEY_MAX {
        return invalid(out);
    }
    // Store commands: the value may be large; read the header, extras and key now and let
    // the session collect the value.
    if matches!(opcode, op::SET | op::ADD | op::REPLACE | op::APPEND | op::PREPEND) {
        let want_ext = if matches!(opcode, op::APPEND | op::PREPEND) { 0 } else { 8 };
        if extlen != want_ext || keylen == 0 {
            return invalid(out);
        }
        let fixed = HEADER + extlen + keylen;
        if input.len() < fixed {
            return Next::NeedMore;
        }
        let vlen = bodylen - extlen - keylen;
        let ext = &input[HEADER..HEADER + extlen];
        let (flags, exptime) = if extlen == 8 {
            (u32::from_be_bytes(ext[0..4].try_into().unwrap()), u32::from_be_bytes(ext[4..8].try_into().unwrap()))
        } else {
            (0, 0)
        };
        let key = input[HEADER + extlen..fixed].to_vec();
        CoreStats::add(&env.stats.bytes_read, (HEADER + bodylen) as u64);
        input.advance(fixed);
        if exec::refuse_too_large(env, &key, vlen, flags, opcode == op::SET) {
            error(out, h.opcode, status::E2BIG, h.opaque);
            return Next::Swallow(vlen);
        }
        let mode = match opcode {
            op::APPEND => Mode::Append(h.cas),
            op::PREPEND => Mode::Prepend(h.cas),
            _ if h.cas != 0 => Mode::Cas(h.cas),
            op::ADD => Mode::Add,
            op::REPLACE => Mode::Replace,
            _ => Mode::Set,
        };
        let op = StoreOp {
            reply: Reply::Binary { opcode: h.opcode, opaque: h.opaque, quiet },
            mode,
            key,
            flags,
            exptime: env.shared.clock.expiry(exptime as i64),
            len: vlen,
            trailer: 0,
        };
        return Next::Data(op);
    }
    // Every other command has a small body: validate its shape before waiting for it.
    let shape_ok = match opcode {
        op::GET | op::GETK | op::DELETE => extlen == 0 && keylen > 0 && bodylen == keylen,
        op::INCREMENT | op::DECREMENT => extlen == 20 && keylen > 0 && bodylen == keylen + 20,
        op::TOUCH | op::GAT | op::GATK => extlen == 4 && keylen > 0 && bodylen == keylen + 4,
        op::VERSION | op::NOOP | op::QUIT => extlen == 0 && keylen == 0 && bodylen == 0,
        op::FLUSH => keylen == 0 && bodylen == extlen && (extlen == 0 || extlen == 4),
        op::STAT => extlen == 0 && bodylen == keylen,
        _ => {
            // Unknown: answer, then skip its body as it arrives.
            error(out, h.opcode, status::UNKNOWN_COMMAND, h.opaque);
            input.advance(HEADER);
            return Next::Swallow(bodylen);
        }
    };
    if !shape_ok {
        return invalid(out);
    }
    if input.len() < HEADER + bodylen {
        return Next::NeedMore;
    }
    CoreStats::add(&env.stats.bytes_read, (HEADER + bodylen) as u64);
    let packet = input.split_to(HEADER + bodylen);
    let ext = &packet[HEADER..HEADER + extlen];
    let key = &packet[HEADER + extlen..HEADER + extlen + keylen];
    execute(h, opcode, quiet, ext, key, env, out)
}

fn execute(h: Header, opcode: u8, quiet: bool, ext: &[u8], key: &[u8], env: &Env, out: &mut Output) -> Next {
    let u32_at = |i: usize| u32::from_be_bytes(ext[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_be_bytes(ext[i..i + 8].try_into().unwrap());
    match opcode {
        op::GET | op::GETK | op::TOUCH | op::GAT | op::GATK => {
            let touch = matches!(opcode, op::TOUCH | op::GAT | op::GATK);
            let with_key = matches!(opcode, op::GETK | op::GATK);
            let how = if touch { Read::Touch(env.shared.clock.expiry(u32_at(0) as i64)) } else { Read::Get };
            let found = exec::read(env, key, how);
            env.shared.prefixes.record(key, crate::prefix_stats::Op::Get { hit: found.is_some() });
            match found {
                Some(item) => {
                    let keylen = if with_key { key.len() } else { 0 };
                    let vlen = if opcode == op::TOUCH { 0 } else { item.value.len() };
                    header(out, h.opcode, status::SUCCESS, 4, keylen as u16, (4 + keylen + vlen) as u32, h.opaque, item.cas);
                    out.buf_mut().put_u32(item.flags);
                    if with_key {
                        out.put(key);
                    }
                    if opcode != op::TOUCH {
                        out.put_value(&item.value);
                    }
                }
                None => {
                    if !quiet {
                        if with_key {
                            header(out, h.opcode, status::KEY_ENOENT, 0, key.len() as u16, key.len() as u32, h.opaque, 0);
                            out.put(key);
                        } else {
                            error(out, h.opcode, status::KEY_ENOENT, h.opaque);
                        }
                    }
                }
            }
        }
        op::DELETE => {
            env.shared.prefixes.record(key, crate::prefix_stats::Op::Delete);
            match exec::delete(env, key, h.cas) {
                Deleted::Deleted => {
                    if !quiet {
                        header(out, h.opcode, status::SUCCESS, 0, 0, 0, h.opaque, 0);
                    }
                }
                Deleted::NotFound => error(out, h.opcode, status::KEY_ENOENT, h.opaque),
                Deleted::Exists => error(out, h.opcode, status::KEY_EEXISTS, h.opaque),
            }
        }
        op::INCREMENT | op::DECREMENT => {
            let incr = opcode == op::INCREMENT;
            let (delta, initial, exptime) = (u64_at(0), u64_at(8), u32_at(16));
            let create = (exptime != u32::MAX).then(|| (initial, env.shared.clock.expiry(exptime as i64)));
            match exec::delta(env, key, incr, delta, h.cas, create, None) {
                Ok((value, cas)) => {
                    if !quiet {
                        header(out, h.opcode, status::SUCCESS, 0, 0, 8, h.opaque, cas);
                        out.buf_mut().put_u64(value);
                    }
                }
                Err(DeltaError::NotFound) => error(out, h.opcode, status::KEY_ENOENT, h.opaque),
                Err(DeltaError::NonNumeric) => error(out, h.opcode, status::DELTA_BADVAL, h.opaque),
                Err(DeltaError::Exists) => error(out, h.opcode, status::KEY_EEXISTS, h.opaque),
            }
        }
        op::FLUSH => {
            exec::flush(env, if ext.len() == 4 { u32_at(0) as i64 } else { 0 });
            if !quiet {
                header(out, h.opcode, status::SUCCESS, 0, 0, 0, h.opaque, 0);
            }
        }
        op::NOOP => header(out, h.opcode, status::SUCCESS, 0, 0, 0, h.opaque, 0),
        op::VERSION => {
            let v = crate::shared::VERSION.as_bytes();
            header(out, h.opcode, status::SUCCESS, 0, 0, v.len() as u32, h.opaque, 0);
            out.put(v);
        }
        op::QUIT => {
            if !quiet {
                header(out, h.opcode, status::SUCCESS, 0, 0, 0, h.opaque, 0);
            }
            return Next::Quit;
        }
        op::STAT => {
            let group = (!key.is_empty()).then(|| key.to_vec());
            return Next::Stats(StatsRequest::Binary { group, opaque: h.opaque });
        }
        _ => unreachable!("opcode {opcode:#x} passed validation"),
    }
    Next::Continue
}

/// The reply to a store whose value has arrived.
pub fn store_reply(opcode: u8, opaque: u32, quiet: bool, result: Stored, out: &mut Output) {
    let status = match result {
        Stored::Stored(cas) => {
            if !quiet {
                header(out, opcode, status::SUCCESS, 0, 0, 0, opaque, cas);
            }
            return;
        }
        Stored::Exists => status::KEY_EEXISTS,
        Stored::NotFound => status::KEY_ENOENT,
        Stored::TooLarge => status::E2BIG,
        // memcached's words for a failed add and replace.
        Stored::NotStored => match base(opcode) {
            op::ADD => status::KEY_EEXISTS,
            op::REPLACE => status::KEY_ENOENT,
            _ => status::NOT_STORED,
        },
    };
    error(out, opcode, status, opaque);
}

/// The reply to STAT: one packet per statistic, then an empty one.
pub fn stats_reply(group: Option<&[u8]>, opaque: u32, counters: &Counters, env: &Env, out: &mut Output) {
    if group == Some(b"reset") {
        env.shared.store.reset_stats();
        env.shared.prefixes.clear();
        header(out, op::STAT, status::SUCCESS, 0, 0, 0, opaque, 0);
        return;
    }
    // `detail on|off` (an empty answer) and `detail dump` (one statistic, `detailed`, holding
    // the text protocol's dump), as memcached's binary STAT.
    if let Some(detail) = group.and_then(|g| g.strip_prefix(b"detail")) {
        match detail {
            b" on" | b" off" => env.shared.prefixes.set_on(detail == b" on"),
            b" dump" => {
                let dump = env.shared.prefixes.dump();
                header(out, op::STAT, status::SUCCESS, 0, 8, (8 + dump.len()) as u32, opaque, 0);
                out.put(b"detailed");
                out.put(&dump);
            }
            _ => return error(out, op::STAT, status::KEY_ENOENT, opaque),
        }
        return header(out, op::STAT, status::SUCCESS, 0, 0, 0, opaque, 0);
    }
    match env.shared.report(group, counters, env.fd) {
        Some(lines) => {
            for (name, value) in lines {
                header(out, op::STAT, status::SUCCESS, 0, name.len() as u16, (name.len() + value.len()) as u32, opaque, 0);
                out.put(name.as_bytes());
                out.put(value.as_bytes());
            }
            header(out, op::STAT, status::SUCCESS, 0, 0, 0, opaque, 0);
        }
        None => error(out, op::STAT, status::KEY_ENOENT, opaque),
    }
}
