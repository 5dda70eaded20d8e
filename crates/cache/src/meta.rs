//! The meta commands of memcached 1.6.45 (`protocol.txt`, "Meta Commands"): mg, ms, md, ma,
//! mn, me. Each takes single-letter flags, some with a token (`T30`, `Oabc`), and answers with
//! a two-letter code (HD, VA, EN, NS, EX, NF) followed by the flags asked to be returned.
//! mg: `b c C f h k l N O q R s t T u v E`, answering `W X Z`; ms: `b c C E F I k M N O q s T`
//! (`I`: a cas older than the item's stores it stale, keeping its TTL); md: `b C E I k O q T x`;
//! ma: `b c C D E J k M N O q t T v`; me. Flags are checked as memcached checks them: an unknown
//! one is `CLIENT_ERROR invalid flag`, a repeated one `CLIENT_ERROR duplicate flag`.

use crate::exec;
use crate::output::Output;
use crate::request::{Env, Next, Reply, StoreOp};
use crate::stats::CoreStats;
use crate::store::meta_ops::MetaRead;
use crate::store::{Deleted, DeltaError, Mode};
use crate::text::{strict_i32, strict_u32, strict_u64, KEY_MAX};

const BAD: &[u8] = b"CLIENT_ERROR bad command line format\r\n";

/// Why a command's flags were refused.
enum FlagError {
    /// A flag that is no letter or digit: memcached's tokenizer refuses the line before any
    /// flag is read (an ms's value is not discarded: it is read as the next command).
    Tokenizer,
    /// The error line.
    Refused(&'static [u8]),
}

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
    recache: Option<i64>,
    cas_in: Option<u64>,
    invalidate: bool,
    remove_value: bool,
}

/// The flags as memcached 1.6.45's `_meta_flag_preparse` reads them (any command takes any
/// known flag); Err: the error line.
fn parse_flags<'a>(tokens: &[&'a [u8]]) -> Result<Flags<'a>, FlagError> {
    const TOKEN: &[u8] = b"CLIENT_ERROR bad token in command line format\r\n";
    let mut f = Flags::default();
    let mut seen = [false; 128];
    let mut error = None;
    for t in tokens {
        let (flag, rest) = (t[0], &t[1..]);
        if !flag.is_ascii_alphanumeric() {
            return Err(FlagError::Tokenizer);
        }
        if flag >= 127 || std::mem::replace(&mut seen[flag as usize], true) {
            return Err(FlagError::Refused(b"CLIENT_ERROR duplicate flag\r\n"));
        }
        if matches!(flag, b'c' | b'f' | b'h' | b'k' | b'l' | b's' | b't' | b'O') {
            f.order.push(flag);
        }
        let e = &mut error;
        match flag {
            b'c' | b'f' | b'h' | b'k' | b'l' | b's' | b't' | b'P' | b'L' => {}
            b'v' => f.value = true,
            b'q' => f.quiet = true,
            b'u' => f.no_bump = true,
            b'b' => f.base64 = true,
            b'I' => f.invalidate = true,
            b'x' => f.remove_value = true,
            b'O' => f.opaque = Some(rest),
            b'C' => f.compare_cas = checked(strict_u64(rest), e, TOKEN),
            b'E' => f.cas_in = checked(strict_u64(rest), e, TOKEN),
            b'F' => f.client_flags = checked(strict_u32(rest), e, BAD),
            b'T' => f.ttl = checked(strict_i32(rest), e, TOKEN),
            b'N' => f.vivify = checked(strict_i32(rest), e, TOKEN),
            b'R' => f.recache = checked(strict_i32(rest), e, TOKEN),
            b'J' => f.initial = checked(strict_u64(rest), e, b"CLIENT_ERROR invalid numeric initial value\r\n"),
            b'D' => f.delta = checked(strict_u64(rest), e, b"CLIENT_ERROR invalid numeric delta value\r\n"),
            b'M' => f.mode = rest.first().copied(),
            _ => return Err(FlagError::Refused(b"CLIENT_ERROR invalid flag\r\n")),
        }
    }
    match error {
        Some(e) => Err(FlagError::Refused(e)),
        None => Ok(f),
    }
}

/// A flag's token: when it is not a number, the first such error is the command's answer.
fn checked<T>(value: Option<T>, error: &mut Option<&'static [u8]>, message: &'static [u8]) -> Option<T> {
    if value.is_none() {
        error.get_or_insert(message);
    }
    value
}

/// What a reply can show of its item (None: not shown, as there is no item).
#[derive(Default)]
struct Shown {
    cas: Option<u64>,
    flags: Option<u32>,
    size: Option<usize>,
    ttl: Option<i64>,
    hit_before: Option<bool>,
    idle_s: Option<u32>,
}

/// The returned flags, in the order they were asked for; those that need an item are left
/// out when there is none.
fn put_flags(out: &mut Output, f: &Flags, key: &[u8], shown: &Shown) {
    fn put(out: &mut Output, letter: &[u8], value: Option<u64>) {
        if let Some(v) = value {
            out.put(letter);
            out.put_u64(v);
        }
    }
    for &flag in &f.order {
        match flag {
            b'c' => put(out, b" c", shown.cas),
            b'f' => put(out, b" f", shown.flags.map(u64::from)),
            b's' => put(out, b" s", shown.size.map(|s| s as u64)),
            b'h' => put(out, b" h", shown.hit_before.map(u64::from)),
            b'l' => put(out, b" l", shown.idle_s.map(u64::from)),
            b't' => {
                if let Some(ttl) = shown.ttl {
                    out.put(b" t");
                    out.put(ttl.to_string().as_bytes());
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
    let Some((&key, rest)) = tokens.split_first() else {
        out.put(BAD);
        return Next::Continue;
    };
    if key.len() > KEY_MAX {
        out.put(BAD);
        return Next::Continue;
    }
    if name == b'e' {
        debug(key, rest.first() == Some(&&b"b"[..]), env, out);
        return Next::Continue;
    }
    // ms carries its data length before the flags.
    let (datalen, flag_tokens) = if name == b's' {
        match rest.split_first().and_then(|(len, f)| strict_i32(len).filter(|n| *n >= 0).map(|n| (n as usize, f))) {
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
    let mut f = match parse_flags(flag_tokens) {
        Ok(f) => f,
        Err(FlagError::Tokenizer) => {
            out.put(BAD);
            return Next::Continue;
        }
        // ma answers every flag error in these words.
        Err(_) if name == b'a' => return swallow(out, b"CLIENT_ERROR invalid or duplicate flag\r\n"),
        Err(FlagError::Refused(message)) => return swallow(out, message),
    };
    f.shown_key = Some(key);
    // `b`: the key is base64; it is stored decoded and returned as given.
    let decoded;
    let key = if f.base64 {
        match decode_key(key) {
            Some(k) => {
                decoded = k;
                &decoded[..]
            }
            None => return swallow(out, b"CLIENT_ERROR error decoding key\r\n"),
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

fn decode_key(key: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(key).ok().filter(|k| !k.is_empty() && k.len() <= KEY_MAX)
}

/// me: `ME <key> exp= la= cas= fetch= cls= size=`, or EN.
fn debug(key: &[u8], base64: bool, env: &Env, out: &mut Output) {
    let decoded = if base64 { decode_key(key) } else { Some(key.to_vec()) };
    let Some(stored_key) = decoded else {
        out.put(BAD);
        return;
    };
    match env.shared.store.debug(&stored_key, env.shared.clock.now()) {
        Some(d) => {
            let fetch = if d.fetched { "yes" } else { "no" };
            out.put(b"ME ");
            out.put(key);
            out.put(format!(" exp={} la={} cas={} fetch={fetch} cls={} size={}\r\n", d.ttl, d.idle_s, d.cas, d.class, d.size).as_bytes());
        }
        None => out.put(b"EN\r\n"),
    }
}

fn get(key: &[u8], f: &Flags, env: &Env, out: &mut Output) {
    let clock = &env.shared.clock;
    let now = clock.now();
    let read = MetaRead {
        touch: f.ttl.map(|t| clock.expiry(t)),
        vivify: f.vivify.map(|t| (clock.expiry(t), f.cas_in.unwrap_or_else(|| env.stats.next_cas()))),
        recache_before: f.recache.map(|t| clock.expiry(t)),
        bump: !f.no_bump,
    };
    let Some(found) = exec::meta_read(env, key, &read) else {
        if !f.quiet {
            out.put(b"EN");
            let echo = Flags { order: f.order.iter().copied().filter(|c| matches!(c, b'O' | b'k')).collect(), ..*f };
            put_flags(out, &echo, key, &Shown::default());
            out.put(b"\r\n");
        }
        return;
    };
    let item = &found.item;
    // C: an unchanged item (same cas) is not sent again.
    let value = f.value && f.compare_cas != Some(item.cas);
    if value {
        out.put(b"VA ");
        out.put_u64(item.value.len() as u64);
    } else {
        out.put(b"HD");
    }
    let shown = Shown {
        cas: Some(item.cas),
        flags: Some(item.flags),
        size: Some(item.value.len()),
        ttl: Some(remaining(item.exptime, now)),
        hit_before: Some(found.hit_before),
        idle_s: Some(found.idle_s),
    };
    put_flags(out, f, key, &shown);
    for (on, letter) in [(found.token_was_sent, b" Z"), (found.stale, b" X"), (found.won, b" W")] {
        if on {
            out.put(letter);
        }
    }
    out.put(b"\r\n");
    if value {
        out.put_value(&item.value);
        out.put(b"\r\n");
    }
}

fn set(key: &[u8], datalen: usize, f: &Flags, env: &Env, out: &mut Output) -> Next {
    let vivify = f.vivify.is_some();
    let mode = match (f.mode, f.compare_cas) {
        (Some(b'E'), _) => Mode::Add,
        (Some(b'A'), c) => Mode::Append(c.unwrap_or(0)),
        (Some(b'P'), c) => Mode::Prepend(c.unwrap_or(0)),
        (Some(b'R'), None) => Mode::Replace,
        (Some(b'S') | None, Some(c)) | (Some(b'R'), Some(c)) if f.invalidate => Mode::CasOrStale(c),
        (Some(b'S') | None, Some(c)) | (Some(b'R'), Some(c)) => Mode::Cas(c),
        (Some(b'S') | None, None) => Mode::Set,
        _ => {
            out.put(b"CLIENT_ERROR invalid mode for ms M token\r\n");
            return Next::Swallow(datalen + 2);
        }
    };
    if exec::refuse_too_large(env, key, datalen, f.client_flags.unwrap_or(0), false) {
        out.put(b"SERVER_ERROR object too large for cache\r\n");
        return Next::Swallow(datalen + 2);
    }
    // N with append or prepend: a missing item is created from this value, with N's TTL.
    let (mode, ttl) = match (mode, vivify) {
        (Mode::Append(0) | Mode::Prepend(0), true) if env.shared.store.peek(key, env.shared.clock.now()).is_none() => (Mode::Add, f.vivify),
        _ => (mode, f.ttl),
    };
    Next::Data(StoreOp {
        reply: Reply::Meta {
            quiet: f.quiet,
            opaque: f.opaque.map(|o| o.to_vec()),
            ret: f.order.clone(),
            base64: f.base64,
            cas_in: f.cas_in,
        },
        mode,
        key: key.to_vec(),
        flags: f.client_flags.unwrap_or(0),
        exptime: env.shared.clock.expiry(ttl.unwrap_or(0)),
        len: datalen,
        trailer: 2,
    })
}

fn delete(key: &[u8], f: &Flags, env: &Env, out: &mut Output) {
    let (store, clock) = (&env.shared.store, &env.shared.clock);
    let cas = f.compare_cas.unwrap_or(0);
    // x empties the value and I marks the item stale (both: first x, then I); else it goes.
    let mut result = if f.remove_value { store.drop_value(key, cas, clock.now()) } else { Deleted::Deleted };
    if f.invalidate && result == Deleted::Deleted {
        let new_cas = f.cas_in.unwrap_or_else(|| env.stats.next_cas());
        result = store.invalidate(key, cas, new_cas, f.ttl.map(|t| clock.expiry(t)), clock.now());
    } else if !f.invalidate && !f.remove_value {
        result = exec::delete(env, key, cas);
    }
    let code: &[u8] = match result {
        Deleted::Deleted if f.quiet => return,
        Deleted::Deleted => b"HD",
        Deleted::NotFound => b"NF",
        Deleted::Exists => b"EX",
    };
    out.put(code);
    put_flags(out, f, key, &Shown::default());
    out.put(b"\r\n");
}

fn arithmetic(key: &[u8], f: &Flags, env: &Env, out: &mut Output) {
    let incr = match f.mode {
        None | Some(b'I' | b'i' | b'+') => true,
        Some(b'D' | b'd' | b'-') => false,
        Some(_) => {
            out.put(b"CLIENT_ERROR invalid mode for ma M token\r\n");
            return;
        }
    };
    let clock = &env.shared.clock;
    let create = f.vivify.map(|ttl| (f.initial.unwrap_or(0), clock.expiry(ttl)));
    match exec::delta(env, key, incr, f.delta.unwrap_or(1), f.compare_cas.unwrap_or(0), create, f.cas_in) {
        Ok((value, cas)) => {
            // T: a new TTL on success; t: the TTL it has now.
            let now = clock.now();
            let ttl = match f.ttl {
                Some(t) => env.shared.store.touch(key, clock.expiry(t), now).map(|i| i.exptime),
                None => env.shared.store.peek(key, now).map(|i| i.exptime),
            };
            let text = value.to_string();
            if f.value {
                out.put(b"VA ");
                out.put_u64(text.len() as u64);
            } else if f.quiet {
                return;
            } else {
                out.put(b"HD");
            }
            let shown = Shown { cas: Some(cas), ttl: Some(ttl.map_or(-1, |e| remaining(e, now))), ..Default::default() };
            put_flags(out, f, key, &shown);
            out.put(b"\r\n");
            if f.value {
                out.put(text.as_bytes());
                out.put(b"\r\n");
            }
        }
        Err(DeltaError::NotFound) => {
            out.put(b"NF");
            put_flags(out, f, key, &Shown::default());
            out.put(b"\r\n");
        }
        Err(DeltaError::Exists) => {
            out.put(b"EX");
            put_flags(out, f, key, &Shown::default());
            out.put(b"\r\n");
        }
        Err(DeltaError::NonNumeric) => out.put(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"),
    }
}

/// The reply to ms once its value is stored (`size`: the stored value's, for `s`).
/// `key` is the stored (decoded) key; with `base64` it is returned encoded, as mg, md and ma
/// return the key the client sent.
#[allow(clippy::too_many_arguments)]
pub fn store_reply(
    result: crate::store::Stored,
    key: &[u8],
    base64: bool,
    quiet: bool,
    opaque: Option<&[u8]>,
    order: Vec<u8>,
    size: usize,
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
        // c on a failure shows 0, as memcached's.
        Stored::NotStored => (b"NS", Some(0)),
        Stored::Exists => (b"EX", Some(0)),
        Stored::NotFound => (b"NF", Some(0)),
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
    let size = matches!(result, Stored::Stored(_)).then_some(size);
    put_flags(out, &f, key, &Shown { cas, size, ..Default::default() });
    out.put(b"\r\n");
}
