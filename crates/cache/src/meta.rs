//! The meta commands of memcached 1.6 (`protocol.txt`, "Meta Commands"): mg, ms, md, ma,
//! mn. Each takes single-letter flags, some with a token (`T30`, `Oabc`), and answers with a
//! two-letter code (HD, VA, EN, NS, EX, NF) followed by the flags asked to be returned.
//! Supported: mg `c f k O q s t T u v`; ms `c C F k O q T M`; md `C k O q`; ma `c C D J k M
//! N O q t T v`; `b` (base64 keys) on all; `h l I x` are accepted and ignored.

use crate::exec::{self, Read};
use crate::output::Output;
use crate::request::{Env, Next, Reply, StoreOp};
use crate::stats::CoreStats;
use crate::store::{Deleted, DeltaError, Mode};
use crate::text::{parse_i32, parse_u64, KEY_MAX};

const BAD: &[u8] = b"CLIENT_ERROR bad command line format\r\n";

/// The flags of one meta command.
#[derive(Default, Debug)]
struct Flags<'a> {
    /// The flags to return, in the order asked (memcached answers in that order).
    order: Vec<u8>,
    value: bool,
    quiet: bool,
    no_bump: bool,
    base64: bool,
    /// The key as the client wrote it (base64 when `b`), for the `k` flag.
    shown_key: Option<&'a [u8]>,
    opaque: Option<&'a [u8]>,
    compare_cas: Option<u64>,
    client_flags: Option<u32>,
    ttl: Option<i64>,
    mode: Option<u8>,
    vivify: Option<i64>,
    initial: Option<u64>,
    delta: Option<u64>,
}

fn parse_flags<'a>(tokens: &[&'a [u8]]) -> Option<Flags<'a>> {
    let mut f = Flags::default();
    for t in tokens {
        let (flag, arg) = (t[0], &t[1..]);
        if matches!(flag, b'c' | b'f' | b'k' | b's' | b't' | b'O') {
            f.order.push(flag);
        }
        match flag {
            b'c' | b'f' | b'k' | b's' | b't' => {}
            b'v' => f.value = true,
            b'q' => f.quiet = true,
            b'u' => f.no_bump = true,
            b'b' => f.base64 = true,
            // Accepted and ignored: hit/last-access reporting, invalidation, win flags.
            b'h' | b'l' | b'I' | b'x' => {}
            b'O' => f.opaque = Some(arg),
            b'C' => f.compare_cas = Some(parse_u64(arg)?),
            b'F' => f.client_flags = Some(parse_u64(arg)? as u32),
            b'T' => f.ttl = Some(parse_i32(arg)?),
            b'N' => f.vivify = Some(parse_i32(arg)?),
            b'J' => f.initial = Some(parse_u64(arg)?),
            b'D' => f.delta = Some(parse_u64(arg)?),
            b'M' => f.mode = Some(*arg.first()?),
            _ => return None,
        }
    }
    Some(f)
}

/// The returned flags, in the order they were asked for; those that need an item are left
/// out when there is none.
fn put_flags(out: &mut Output, f: &Flags, key: &[u8], cas: Option<u64>, flags: Option<u32>, size: Option<usize>, ttl: Option<i64>) {
    for &flag in &f.order {
        match flag {
            b'c' => {
                if let Some(cas) = cas {
                    out.put(b" c");
                    out.put_u64(cas);
                }
            }
            b'f' => {
                if let Some(flags) = flags {
                    out.put(b" f");
                    out.put_u64(flags as u64);
                }
            }
            b'k' => {
                out.put(b" k");
                out.put(f.shown_key.unwrap_or(key));
            }
            b'O' => {
                if let Some(o) = f.opaque {
                    out.put(b" O");
                    out.put(o);
                }
            }
            b's' => {
                if let Some(size) = size {
                    out.put(b" s");
                    out.put_u64(size as u64);
                }
            }
            b't' => {
                if let Some(ttl) = ttl {
                    out.put(b" t");
                    out.put(ttl.to_string().as_bytes());
                }
            }
            _ => {}
        }
    }
    // A base64 key is returned with `b`, so the client knows to decode it.
    if f.base64 && f.order.contains(&b'k') {
        out.put(b" b");
    }
}

/// Seconds an item has left: -1 for never.
fn remaining(exptime: u32, now: u32) -> i64 {
    if exptime == 0 {
        -1
    } else {
        exptime as i64 - now as i64
    }
}

/// Run a meta command line (`tokens`: the tokens after the command name).
pub fn execute(name: u8, tokens: &[&[u8]], env: &Env, out: &mut Output) -> Next {
    CoreStats::bump(&env.stats.cmd_meta);
    if name == b'n' {
        out.put(b"MN\r\n");
        return Next::Continue;
    }
    if name == b'e' {
        // Debug dump of an item: not offered.
        out.put(b"EN\r\n");
        return Next::Continue;
    }
    let Some((&key, rest)) = tokens.split_first() else {
        out.put(b"ERROR\r\n");
        return Next::Continue;
    };
    if key.len() > KEY_MAX {
        out.put(BAD);
        return Next::Continue;
    }
    // ms carries its data length before the flags.
    let (datalen, flag_tokens) = if name == b's' {
        match rest.split_first().and_then(|(len, f)| parse_i32(len).filter(|n| *n >= 0).map(|n| (n as usize, f))) {
            Some((n, f)) => (n, f),
            None => {
                out.put(BAD);
                return Next::Continue;
            }
        }
    } else {
        (0, rest)
    };
    let swallow = |out: &mut Output, msg: &[u8]| {
        out.put(msg);
        // A refused ms still has its data block coming: skip it.
        if name == b's' {
            Next::Swallow(datalen + 2)
        } else {
            Next::Continue
        }
    };
    let Some(mut f) = parse_flags(flag_tokens) else {
        return swallow(out, BAD);
    };
    f.shown_key = Some(key);
    // `b`: the key is base64; it is stored decoded and returned as given.
    let decoded;
    let key = if f.base64 {
        use base64::Engine;
        match base64::engine::general_purpose::STANDARD.decode(key) {
            Ok(k) if !k.is_empty() && k.len() <= KEY_MAX => {
                decoded = k;
                &decoded[..]
            }
            _ => return swallow(out, b"CLIENT_ERROR error decoding key\r\n"),
        }
    } else {
        key
    };
    match name {
        b'g' => get(key, &f, env, out),
        b's' => return set(key, datalen, &f, env, out),
        b'd' => delete(key, &f, env, out),
        b'a' => arithmetic(key, &f, env, out),
        _ => out.put(b"ERROR\r\n"),
    }
    Next::Continue
}

fn get(key: &[u8], f: &Flags, env: &Env, out: &mut Output) {
    let now = env.shared.clock.now();
    let how = match f.ttl {
        Some(ttl) => Read::GetOrTouch(env.shared.clock.expiry(ttl)),
        None if f.no_bump => Read::Peek,
        None => Read::Get,
    };
    let Some(item) = exec::read(env, key, how) else {
        if !f.quiet {
            out.put(b"EN\r\n");
        }
        return;
    };
    if f.value {
        out.put(b"VA ");
        out.put_u64(item.value.len() as u64);
    } else {
        out.put(b"HD");
    }
    put_flags(out, f, key, Some(item.cas), Some(item.flags), Some(item.value.len()), Some(remaining(item.exptime, now)));
    out.put(b"\r\n");
    if f.value {
        out.put_value(&item.value);
        out.put(b"\r\n");
    }
}

fn set(key: &[u8], datalen: usize, f: &Flags, env: &Env, out: &mut Output) -> Next {
    let mode = match (f.mode, f.compare_cas) {
        (Some(b'E' | b'e'), _) => Mode::Add,
        (Some(b'A' | b'a'), c) => Mode::Append(c.unwrap_or(0)),
        (Some(b'P' | b'p'), c) => Mode::Prepend(c.unwrap_or(0)),
        (Some(b'R' | b'r'), None) => Mode::Replace,
        (Some(b'S' | b's') | None, Some(c)) | (Some(b'R' | b'r'), Some(c)) => Mode::Cas(c),
        (Some(b'S' | b's') | None, None) => Mode::Set,
        _ => {
            out.put(BAD);
            return Next::Swallow(datalen + 2);
        }
    };
    if exec::refuse_too_large(env, key, datalen, f.client_flags.unwrap_or(0), false) {
        out.put(b"SERVER_ERROR object too large for cache\r\n");
        return Next::Swallow(datalen + 2);
    }
    Next::Data(StoreOp {
        reply: Reply::Meta { quiet: f.quiet, opaque: f.opaque.map(|o| o.to_vec()), ret: f.order.clone(), base64: f.base64 },
        mode,
        key: key.to_vec(),
        flags: f.client_flags.unwrap_or(0),
        exptime: env.shared.clock.expiry(f.ttl.unwrap_or(0)),
        len: datalen,
        trailer: 2,
    })
}

fn delete(key: &[u8], f: &Flags, env: &Env, out: &mut Output) {
    let code: &[u8] = match exec::delete(env, key, f.compare_cas.unwrap_or(0)) {
        Deleted::Deleted if f.quiet => return,
        Deleted::Deleted => b"HD",
        Deleted::NotFound => b"NF",
        Deleted::Exists => b"EX",
    };
    out.put(code);
    put_flags(out, f, key, None, None, None, None);
    out.put(b"\r\n");
}

fn arithmetic(key: &[u8], f: &Flags, env: &Env, out: &mut Output) {
    let incr = !matches!(f.mode, Some(b'D' | b'd' | b'-'));
    let create = f.vivify.map(|ttl| (f.initial.unwrap_or(0), env.shared.clock.expiry(ttl)));
    match exec::delta(env, key, incr, f.delta.unwrap_or(1), f.compare_cas.unwrap_or(0), create) {
        Ok((value, cas)) => {
            let text = value.to_string();
            if f.value {
                out.put(b"VA ");
                out.put_u64(text.len() as u64);
            } else if f.quiet {
                return;
            } else {
                out.put(b"HD");
            }
            put_flags(out, f, key, Some(cas), None, None, Some(-1));
            out.put(b"\r\n");
            if f.value {
                out.put(text.as_bytes());
                out.put(b"\r\n");
            }
        }
        Err(DeltaError::NotFound) => {
            out.put(b"NF");
            put_flags(out, f, key, None, None, None, None);
            out.put(b"\r\n");
        }
        Err(DeltaError::Exists) => {
            out.put(b"EX");
            put_flags(out, f, key, None, None, None, None);
            out.put(b"\r\n");
        }
        Err(DeltaError::NonNumeric) => out.put(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"),
    }
}

/// The reply to ms once its value is stored.
/// `key` is the stored (decoded) key; with `base64` it is returned encoded, as mg, md and ma
/// return the key the client sent.
pub fn store_reply(
    result: crate::store::Stored,
    key: &[u8],
    base64: bool,
    quiet: bool,
    opaque: Option<&[u8]>,
    order: Vec<u8>,
    out: &mut Output,
) {
    use crate::store::Stored;
    let (code, cas): (&[u8], Option<u64>) = match result {
        Stored::Stored(cas) => {
            if quiet {
                return;
            }
            (b"HD", Some(cas))
        }
        Stored::NotStored => (b"NS", None),
        Stored::Exists => (b"EX", None),
        Stored::NotFound => (b"NF", None),
        Stored::TooLarge => {
            out.put(b"SERVER_ERROR out of memory storing object\r\n");
            return;
        }
    };
    out.put(code);
    let encoded = base64.then(|| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(key)
    });
    let f = Flags { order, opaque, base64, shown_key: encoded.as_deref().map(str::as_bytes), ..Default::default() };
    put_flags(out, &f, key, cas, None, None, None);
    out.put(b"\r\n");
}
