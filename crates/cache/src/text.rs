//! The text protocol's command lines: tokenized and parsed exactly as memcached 1.6 does
//! (`proto_text.c`), into commands that borrow from the line. No I/O and no store here, so
//! the parser can be fuzzed alone.

/// memcached's KEY_MAX_LENGTH.
pub const KEY_MAX: usize = 250;
/// memcached tokenizes at most this many tokens (the rest of a long line stays in the last).
const MAX_TOKENS: usize = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// get / gets / gat / gats: `keys` is the rest of the line (space-separated keys).
    Get {
        cas: bool,
        touch: Option<i64>,
        keys: &'a [u8],
    },
    Store {
        kind: StoreKind,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        bytes: usize,
        cas: u64,
        noreply: bool,
    },
    Delete {
        key: &'a [u8],
        noreply: bool,
    },
    Delta {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    FlushAll {
        delay: i64,
        noreply: bool,
    },
    Stats {
        args: Vec<&'a [u8]>,
    },
    Version,
    Verbosity {
        noreply: bool,
    },
    Quit,
    /// `watch [kinds]`: None when a kind is unknown.
    Watch {
        kinds: Option<u32>,
    },
    /// A command whose answer the line alone decides (`slabs reassign|automove`): the line
    /// to send, `\r\n` included.
    Answer(&'static [u8]),
    /// A meta command (mg, ms, md, ma, mn, me): its tokens after the name.
    Meta {
        name: u8,
        tokens: Vec<&'a [u8]>,
    },
}

/// What a line that is not a valid command gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reject {
    /// `ERROR`: no such command (silent when its last token is `noreply`, as memcached 1.6.45).
    Error { noreply: bool },
    /// `CLIENT_ERROR <message>`; `noreply` says whether the line asked for silence (memcached
    /// honours it even for errors).
    Client { message: &'static str, noreply: bool },
    /// `CLIENT_ERROR <message>` for a storage line whose value length parsed: the value's
    /// `bytes` and its `\r\n` that follow are discarded, not read as commands.
    Data { message: &'static str, noreply: bool, bytes: usize },
    /// `SERVER_ERROR <message>`.
    Server(&'static str),
    /// Close the connection without a word (memcached does this for an HTTP request line).
    Close,
}

pub const BAD_FORMAT: &str = "bad command line format";

/// A line's tokens, in place (no allocation per command).
pub struct Tokens<'a> {
    slots: [&'a [u8]; MAX_TOKENS],
    len: usize,
}

impl<'a> std::ops::Deref for Tokens<'a> {
    type Target = [&'a [u8]];
    fn deref(&self) -> &[&'a [u8]] {
        &self.slots[..self.len]
    }
}

impl<'a> Tokens<'a> {
    fn push(&mut self, t: &'a [u8]) {
        self.slots[self.len] = t;
        self.len += 1;
    }
}

/// Split a line on spaces as memcached's tokenize_command: runs of spaces separate, the
/// 23rd token holds the rest of the line.
pub fn tokenize(line: &[u8]) -> Tokens<'_> {
    let mut tokens = Tokens { slots: [&[]; MAX_TOKENS], len: 0 };
    let mut start = 0;
    let mut i = 0;
    while i < line.len() {
        if line[i] == b' ' {
            if start != i {
                tokens.push(&line[start..i]);
                if tokens.len == MAX_TOKENS - 1 {
                    start = i + 1;
                    // memcached keeps the unprocessed rest as a final value.
                    if start < line.len() {
                        tokens.push(&line[start..]);
                    }
                    return tokens;
                }
            }
            start = i + 1;
        }
        i += 1;
    }
    if start < line.len() {
        tokens.push(&line[start..]);
    }
    tokens
}

/// memcached's safe_strtoul into 32 bits: digits (an optional leading '+'), no sign, values
/// past 32 bits truncated as memcached truncates them, past 64 bits refused.
fn parse_u32(t: &[u8]) -> Option<u32> {
    parse_u64(t).map(|v| v as u32)
}

/// memcached's safe_strtoull: decimal, no minus sign.
pub fn parse_u64(t: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(t).ok()?;
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u64>().ok()
}

/// memcached's safe_strtol into 32 bits.
pub fn parse_i32(t: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(t).ok()?;
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: i64 = s.parse().ok()?;
    // strtol gives a long; memcached stores it in an int32_t.
    Some(v as i32 as i64)
}

/// mcmc's strict token numbers (memcached 1.6.45's `mcmc_toktou32`/`u64`/`tokto32`): digits
/// only (a leading `-` for the signed form), at most `max` bytes, no overflow.
fn strict_digits(t: &[u8], max: usize) -> Option<u64> {
    if t.len() > max || t.is_empty() || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    t.iter().try_fold(0u64, |sum, d| sum.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// A token as mcmc's `tokto32`: a 32-bit signed decimal.
pub fn strict_i32(t: &[u8]) -> Option<i64> {
    let (negative, digits) = match t.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    if t.len() > 11 {
        return None;
    }
    let v = if digits.is_empty() { 0 } else { strict_digits(digits, 11)? as i64 };
    let v = if negative { -v } else { v };
    (i32::MIN as i64..=i32::MAX as i64).contains(&v).then_some(v)
}

/// A token as mcmc's `toktou32`.
pub fn strict_u32(t: &[u8]) -> Option<u32> {
    strict_digits(t, 11).and_then(|v| u32::try_from(v).ok())
}

/// A token as mcmc's `toktou64`.
pub fn strict_u64(t: &[u8]) -> Option<u64> {
    strict_digits(t, 22)
}

/// Whether the line's last token is `noreply` (memcached 1.6.45 reads it there for every
/// command, known or not).
fn noreply(line: &[u8]) -> bool {
    line.rsplit(|&b| b == b' ').find(|t| !t.is_empty()) == Some(b"noreply")
}

/// Parse one command line (without its `\n`, and without a `\r` before it) as memcached
/// 1.6.45's `process_request` and the handlers after it: the command is named by the bytes
/// before the first space; too few tokens, or a value length that is no number, is `CLIENT_ERROR
/// bad command line format` at once; a storage line whose length parsed but whose key, flags,
/// exptime or cas did not is refused with its value discarded ([`Reject::Data`]); tokens past
/// the ones a command reads are ignored. A line shorter than 4 bytes with its terminator is
/// the caller's to refuse (it depends on the `\r`).
pub fn parse(line: &[u8]) -> Result<Command<'_>, Reject> {
    let tokens = tokenize(line);
    let n = tokens.len();
    let name = &line[..line.iter().position(|&b| b == b' ').unwrap_or(line.len())];
    let nr = noreply(line);
    let format = Err(Reject::Client { message: BAD_FORMAT, noreply: false });
    let client = |message| Reject::Client { message, noreply: nr };
    match name {
        b"get" | b"gets" => {
            if n < 2 {
                return format;
            }
            Ok(Command::Get { cas: name == b"gets", touch: None, keys: rest_after(line, tokens[0]) })
        }
        b"gat" | b"gats" => {
            if n < 3 {
                return format;
            }
            let exptime = strict_i32(tokens[1]).ok_or(client("invalid exptime argument"))?;
            Ok(Command::Get { cas: name == b"gats", touch: Some(exptime), keys: rest_after(line, tokens[1]) })
        }
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
            let kind = match name {
                b"set" => StoreKind::Set,
                b"add" => StoreKind::Add,
                b"replace" => StoreKind::Replace,
                b"append" => StoreKind::Append,
                b"prepend" => StoreKind::Prepend,
                _ => StoreKind::Cas,
            };
            if n < 5 {
                return format;
            }
            let Some(bytes) = strict_i32(tokens[4]).filter(|b| (0..=(i32::MAX as i64 - 2)).contains(b)) else {
                return format;
            };
            let bytes = bytes as usize;
            let bad = Reject::Data { message: BAD_FORMAT, noreply: nr, bytes };
            let key = tokens[1];
            if key.len() > KEY_MAX {
                return Err(bad);
            }
            let flags = parse_u32(tokens[2]).ok_or(bad.clone())?;
            let exptime = parse_i32(tokens[3]).ok_or(bad.clone())?;
            let cas = match kind {
                StoreKind::Cas => tokens.get(5).and_then(|t| strict_u64(t)).ok_or(bad)?,
                _ => 0,
            };
            Ok(Command::Store { kind, key, flags, exptime, bytes, cas, noreply: nr })
        }
        b"delete" | b"incr" | b"decr" | b"touch" => {
            if n < if name == b"delete" { 2 } else { 3 } {
                return format;
            }
            let key = tokens[1];
            if key.len() > KEY_MAX {
                return Err(client(BAD_FORMAT));
            }
            match name {
                b"delete" => Ok(Command::Delete { key, noreply: nr }),
                b"touch" => {
                    let exptime = strict_i32(tokens[2]).ok_or(client("invalid exptime argument"))?;
                    Ok(Command::Touch { key, exptime, noreply: nr })
                }
                _ => {
                    let delta = strict_u64(tokens[2]).ok_or(client("invalid numeric delta argument"))?;
                    Ok(Command::Delta { incr: name == b"incr", key, delta, noreply: nr })
                }
            }
        }
        b"stats" => Ok(Command::Stats { args: tokens[1..].to_vec() }),
        b"version" => Ok(Command::Version),
        b"quit" => Ok(Command::Quit),
        b"watch" => Ok(Command::Watch { kinds: crate::watch::parse_kinds(&tokens[1..]) }),
        [b'm', meta] if matches!(meta, b'g' | b's' | b'd' | b'a' | b'n' | b'e') => {
            Ok(Command::Meta { name: *meta, tokens: tokens[1..].to_vec() })
        }
        // The rest are found by their first token (memcached's text_cmd_entries).
        _ => match tokens.first().copied() {
            Some(b"flush_all") => {
                let delay = if n != if nr { 2 } else { 1 } { strict_i32(tokens[1]).ok_or(client("invalid exptime argument"))? } else { 0 };
                Ok(Command::FlushAll { delay, noreply: nr })
            }
            Some(b"verbosity") => {
                tokens.get(1).and_then(|t| strict_u32(t)).ok_or(client(BAD_FORMAT))?;
                Ok(Command::Verbosity { noreply: nr })
            }
            Some(b"slabs") => slabs(&tokens[1..]),
            _ if n > 1 && tokens[n - 1].starts_with(b"HTTP/") => Err(Reject::Close),
            _ => Err(Reject::Error { noreply: nr }),
        },
    }
}

/// `slabs reassign <src> <dst>` and `slabs automove <0|1|2>` (or `ratio|freeratio <r>`,
/// `window <s>`), answered as memcached 1.6 answers them, for a store that reserves no memory
/// by class: a valid reassignment is done at once (whatever memory is free, any class may
/// use already; nothing moves, no item changes); automove settings are taken and have
/// nothing to move.
fn slabs<'a>(args: &[&'a [u8]]) -> Result<Command<'a>, Reject> {
    const LARGEST: i64 = 39; // crate::slab_classes::SIZES.len()
    let bad = Reject::Client { message: BAD_FORMAT, noreply: false };
    match args {
        [b"reassign", src, dst] => {
            let (src, dst) = (parse_i32(src).ok_or(bad.clone())?, parse_i32(dst).ok_or(bad)?);
            let valid = |class: i64| (1..=LARGEST).contains(&class);
            Ok(Command::Answer(if src == dst {
                b"SAME src and dst class are identical\r\n"
            } else if !(valid(src) || src == -1) || !valid(dst) {
                b"BADCLASS invalid src or dst class id\r\n"
            } else {
                b"OK\r\n"
            }))
        }
        [b"automove", b"ratio" | b"freeratio", value, ..] => {
            let ok = std::str::from_utf8(value).ok().and_then(|v| v.parse::<f64>().ok()).is_some();
            Ok(Command::Answer(if ok { b"OK\r\n" } else { b"ERROR\r\n" }))
        }
        [b"automove", b"window", value, ..] => match parse_u32(value).ok_or(bad)? {
            3..=1800 => Ok(Command::Answer(b"OK\r\n")),
            _ => Err(Reject::Client { message: "automove window too low or too high", noreply: false }),
        },
        [b"automove", level, ..] => match parse_u32(level).ok_or(bad)? {
            0..=2 => Ok(Command::Answer(b"OK\r\n")),
            _ => Err(Reject::Error { noreply: false }),
        },
        [b"automove"] => Err(bad),
        _ => Err(Reject::Error { noreply: false }),
    }
}

/// The part of `line` after token `t` (a subslice of it), without leading spaces.
fn rest_after<'a>(line: &'a [u8], t: &'a [u8]) -> &'a [u8] {
    let offset = t.as_ptr() as usize - line.as_ptr() as usize + t.len();
    let rest = &line[offset..];
    let skip = rest.iter().take_while(|&&b| b == b' ').count();
    &rest[skip..]
}

/// The keys of a get line, one by one.
pub fn keys(list: &[u8]) -> impl Iterator<Item = &[u8]> {
    list.split(|&b| b == b' ').filter(|k| !k.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slabs_commands_answer_as_memcached_for_a_store_without_pages() {
        let answer = |line: &'static [u8]| match parse(line) {
            Ok(Command::Answer(a)) => Ok(a),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        assert_eq!(answer(b"slabs automove 1"), Ok(&b"OK\r\n"[..]));
        assert_eq!(answer(b"slabs automove 3"), Err(Reject::Error { noreply: false }));
        assert_eq!(answer(b"slabs automove invalid"), Err(Reject::Client { message: BAD_FORMAT, noreply: false }));
        assert_eq!(
            answer(b"slabs automove window 2").unwrap_err(),
            Reject::Client { message: "automove window too low or too high", noreply: false }
        );
        assert_eq!(answer(b"slabs automove ratio 0.5"), Ok(&b"OK\r\n"[..]));
        assert!(answer(b"slabs reassign 1 1").unwrap().starts_with(b"SAME"));
        assert!(answer(b"slabs reassign 1 40").unwrap().starts_with(b"BADCLASS"));
        assert_eq!(answer(b"slabs reassign -1 2"), Ok(&b"OK\r\n"[..]));
        assert_eq!(answer(b"slabs reassign x 2"), Err(Reject::Client { message: BAD_FORMAT, noreply: false }));
        assert_eq!(answer(b"slabs dance"), Err(Reject::Error { noreply: false }));
    }

    #[test]
    fn tokenizes_like_memcached() {
        assert_eq!(&*tokenize(b"  set  k 0 0 1 "), &[&b"set"[..], b"k", b"0", b"0", b"1"][..]);
        let long: Vec<u8> = (0..30).map(|i| format!("k{i} ")).collect::<String>().into_bytes();
        let t = tokenize(&long);
        assert_eq!(t.len(), 24);
        assert!(t[23].starts_with(b"k23 k24"));
    }

    #[test]
    fn parses_storage_commands() {
        assert_eq!(
            parse(b"set foo 5 100 3 noreply").unwrap(),
            Command::Store { kind: StoreKind::Set, key: b"foo", flags: 5, exptime: 100, bytes: 3, cas: 0, noreply: true }
        );
        assert_eq!(
            parse(b"cas foo 0 0 3 77").unwrap(),
            Command::Store { kind: StoreKind::Cas, key: b"foo", flags: 0, exptime: 0, bytes: 3, cas: 77, noreply: false }
        );
        let format = Err(Reject::Client { message: BAD_FORMAT, noreply: false });
        // No value length to skip: refused at once, the value line is read as a command.
        assert_eq!(parse(b"set foo 0 0 -1"), format);
        assert_eq!(parse(b"set foo 0 0 +1"), format);
        assert_eq!(parse(b"set foo 0 0"), format);
        // A length that parsed: the value goes with the refusal.
        assert_eq!(parse(b"set foo x 0 1"), Err(Reject::Data { message: BAD_FORMAT, noreply: false, bytes: 1 }));
        assert_eq!(parse(b"cas foo 0 0 6"), Err(Reject::Data { message: BAD_FORMAT, noreply: false, bytes: 6 }));
        assert_eq!(parse(b"cas foo 0 0 6 x noreply"), Err(Reject::Data { message: BAD_FORMAT, noreply: true, bytes: 6 }));
        let long_key = format!("set {} 0 0 1", "k".repeat(251));
        assert!(matches!(parse(long_key.as_bytes()), Err(Reject::Data { bytes: 1, .. })));
        let ok_key = format!("set {} 0 0 1", "k".repeat(250));
        assert!(parse(ok_key.as_bytes()).is_ok());
        // Tokens past the ones read are ignored; noreply is the last one or none.
        assert!(matches!(parse(b"set foo 0 0 1 noreply extra"), Ok(Command::Store { noreply: false, .. })));
    }

    #[test]
    fn parses_gets_and_others() {
        let format = Err(Reject::Client { message: BAD_FORMAT, noreply: false });
        assert_eq!(parse(b"get a b  c").unwrap(), Command::Get { cas: false, touch: None, keys: b"a b  c" });
        assert_eq!(parse(b"gats 10 a").unwrap(), Command::Get { cas: true, touch: Some(10), keys: b"a" });
        assert_eq!(keys(b"a b  c").collect::<Vec<_>>(), vec![&b"a"[..], b"b", b"c"]);
        assert_eq!(parse(b"get"), format);
        assert_eq!(parse(b"gat 10"), format);
        assert_eq!(parse(b" get a"), Err(Reject::Error { noreply: false }));
        assert_eq!(parse(b"bogus noreply"), Err(Reject::Error { noreply: true }));
        assert_eq!(parse(b"incr k 1").unwrap(), Command::Delta { incr: true, key: b"k", delta: 1, noreply: false });
        assert_eq!(parse(b"incr k"), format);
        assert!(matches!(parse(b"incr k -1"), Err(Reject::Client { message: "invalid numeric delta argument", .. })));
        assert!(matches!(parse(b"incr k +1"), Err(Reject::Client { message: "invalid numeric delta argument", .. })));
        assert_eq!(parse(b"delete k 0 noreply").unwrap(), Command::Delete { key: b"k", noreply: true });
        assert_eq!(parse(b"delete k 5").unwrap(), Command::Delete { key: b"k", noreply: false });
        assert_eq!(parse(b"flush_all 10").unwrap(), Command::FlushAll { delay: 10, noreply: false });
        assert_eq!(parse(b"flush_all noreply").unwrap(), Command::FlushAll { delay: 0, noreply: true });
        assert_eq!(parse(b"verbosity"), format);
        assert_eq!(parse(b"verbosity 1 2 3").unwrap(), Command::Verbosity { noreply: false });
        assert_eq!(parse(b"GET / HTTP/1.1"), Err(Reject::Close));
    }

    #[test]
    fn strict_numbers_are_mcmcs() {
        assert_eq!(strict_i32(b"-5"), Some(-5));
        assert_eq!(strict_i32(b"01"), Some(1));
        assert_eq!(strict_i32(b"+1"), None);
        assert_eq!(strict_i32(b"2147483648"), None);
        assert_eq!(strict_i32(b"-2147483648"), Some(-2147483648));
        assert_eq!(strict_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(strict_u64(b"18446744073709551616"), None);
        assert_eq!(strict_u32(b"4294967296"), None);
    }
}
