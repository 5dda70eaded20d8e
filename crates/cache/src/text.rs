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
    /// `ERROR`: no such command, or the wrong number of tokens.
    Error,
    /// `CLIENT_ERROR <message>`; `noreply` says whether the line asked for silence (memcached
    /// honours it even for errors).
    Client { message: &'static str, noreply: bool },
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

fn noreply(tokens: &[&[u8]]) -> bool {
    tokens.last().is_some_and(|t| *t == b"noreply")
}

/// Parse one command line (without its `\n`, and without a `\r` before it).
pub fn parse(line: &[u8]) -> Result<Command<'_>, Reject> {
    let tokens = tokenize(line);
    // memcached counts a final empty token: `n` below is its ntokens.
    let n = tokens.len() + 1;
    if tokens.is_empty() || tokens[0].len() < 2 {
        return Err(Reject::Error);
    }
    let cmd = tokens[0];
    let want = |ok: bool| if ok { Ok(()) } else { Err(Reject::Error) };
    match cmd {
        b"get" | b"gets" | b"gat" | b"gats" | b"bget" => {
            want(n >= 3)?;
            let cas = cmd == b"gets" || cmd == b"gats";
            let touch = cmd.starts_with(b"gat");
            // The keys: everything after the command (and the exptime of gat).
            let after_cmd = rest_after(line, tokens[0]);
            if touch {
                let exptime = parse_i32(tokens[1]).ok_or(Reject::Client { message: "invalid exptime argument", noreply: false })?;
                let keys = rest_after(line, tokens[1]);
                return Ok(Command::Get { cas, touch: Some(exptime), keys });
            }
            Ok(Command::Get { cas, touch: None, keys: after_cmd })
        }
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
            let kind = match cmd {
                b"set" => StoreKind::Set,
                b"add" => StoreKind::Add,
                b"replace" => StoreKind::Replace,
                b"append" => StoreKind::Append,
                b"prepend" => StoreKind::Prepend,
                _ => StoreKind::Cas,
            };
            let base = if kind == StoreKind::Cas { 7 } else { 6 };
            want(n == base || n == base + 1)?;
            let nr = noreply(&tokens);
            let bad = Reject::Client { message: BAD_FORMAT, noreply: nr };
            let key = tokens[1];
            if key.len() > KEY_MAX {
                return Err(bad);
            }
            let flags = parse_u32(tokens[2]).ok_or(bad.clone())?;
            let exptime = parse_i32(tokens[3]).ok_or(bad.clone())?;
            let bytes = parse_i32(tokens[4]).ok_or(bad.clone())?;
            let cas = if kind == StoreKind::Cas { parse_u64(tokens[5]).ok_or(bad.clone())? } else { 0 };
            if !(0..=(i32::MAX as i64 - 2)).contains(&bytes) {
                return Err(bad);
            }
            Ok(Command::Store { kind, key, flags, exptime, bytes: bytes as usize, cas, noreply: nr })
        }
        b"delete" => {
            want((3..=5).contains(&n))?;
            let nr = noreply(&tokens);
            if n > 3 {
                let hold_is_zero = tokens[2] == b"0";
                let valid = (n == 4 && (hold_is_zero || nr)) || (n == 5 && hold_is_zero && nr);
                if !valid {
                    return Err(Reject::Client { message: "bad command line format.  Usage: delete <key> [noreply]", noreply: nr });
                }
            }
            if tokens[1].len() > KEY_MAX {
                return Err(Reject::Client { message: BAD_FORMAT, noreply: nr });
            }
            Ok(Command::Delete { key: tokens[1], noreply: nr })
        }
        b"incr" | b"decr" => {
            want(n == 4 || n == 5)?;
            let nr = noreply(&tokens);
            if tokens[1].len() > KEY_MAX {
                return Err(Reject::Client { message: BAD_FORMAT, noreply: nr });
            }
            let delta = parse_u64(tokens[2]).ok_or(Reject::Client { message: "invalid numeric delta argument", noreply: nr })?;
            Ok(Command::Delta { incr: cmd == b"incr", key: tokens[1], delta, noreply: nr })
        }
        b"touch" => {
            want(n == 4 || n == 5)?;
            let nr = noreply(&tokens);
            if tokens[1].len() > KEY_MAX {
                return Err(Reject::Client { message: BAD_FORMAT, noreply: nr });
            }
            let exptime = parse_i32(tokens[2]).ok_or(Reject::Client { message: "invalid exptime argument", noreply: nr })?;
            Ok(Command::Touch { key: tokens[1], exptime, noreply: nr })
        }
        b"flush_all" => {
            want((2..=4).contains(&n))?;
            let nr = noreply(&tokens);
            let delay = if n != if nr { 3 } else { 2 } {
                parse_i32(tokens[1]).ok_or(Reject::Client { message: "invalid exptime argument", noreply: nr })?
            } else {
                0
            };
            Ok(Command::FlushAll { delay, noreply: nr })
        }
        b"stats" => Ok(Command::Stats { args: tokens[1..].to_vec() }),
        b"version" => Ok(Command::Version),
        b"quit" => Ok(Command::Quit),
        b"verbosity" => {
            want(n == 3 || n == 4)?;
            let nr = noreply(&tokens);
            parse_u32(tokens[1]).ok_or(Reject::Client { message: BAD_FORMAT, noreply: nr })?;
            Ok(Command::Verbosity { noreply: nr })
        }
        b"slabs" => slabs(&tokens[1..]),
        [b'm', name] if matches!(name, b'g' | b's' | b'd' | b'a' | b'n' | b'e') => {
            Ok(Command::Meta { name: *name, tokens: tokens[1..].to_vec() })
        }
        _ => {
            if n >= 3 && tokens[tokens.len() - 1].starts_with(b"HTTP/") {
                return Err(Reject::Close);
            }
            Err(Reject::Error)
        }
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
            _ => Err(Reject::Error),
        },
        [b"automove"] => Err(bad),
        _ => Err(Reject::Error),
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
        assert_eq!(answer(b"slabs automove 3"), Err(Reject::Error));
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
        assert_eq!(answer(b"slabs dance"), Err(Reject::Error));
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
        assert_eq!(parse(b"set foo 0 0 -1"), Err(Reject::Client { message: BAD_FORMAT, noreply: false }));
        assert_eq!(parse(b"set foo x 0 1"), Err(Reject::Client { message: BAD_FORMAT, noreply: false }));
        assert_eq!(parse(b"set foo 0 0"), Err(Reject::Error));
        assert_eq!(parse(b"set foo 0 0 1 noreply extra"), Err(Reject::Error));
        let long_key = format!("set {} 0 0 1", "k".repeat(251));
        assert!(matches!(parse(long_key.as_bytes()), Err(Reject::Client { .. })));
        let ok_key = format!("set {} 0 0 1", "k".repeat(250));
        assert!(parse(ok_key.as_bytes()).is_ok());
    }

    #[test]
    fn parses_gets_and_others() {
        assert_eq!(parse(b"get a b  c").unwrap(), Command::Get { cas: false, touch: None, keys: b"a b  c" });
        assert_eq!(parse(b"gats 10 a").unwrap(), Command::Get { cas: true, touch: Some(10), keys: b"a" });
        assert_eq!(keys(b"a b  c").collect::<Vec<_>>(), vec![&b"a"[..], b"b", b"c"]);
        assert_eq!(parse(b"get"), Err(Reject::Error));
        assert_eq!(parse(b""), Err(Reject::Error));
        assert_eq!(parse(b"x"), Err(Reject::Error));
        assert_eq!(parse(b"incr k 1").unwrap(), Command::Delta { incr: true, key: b"k", delta: 1, noreply: false });
        assert!(matches!(parse(b"incr k -1"), Err(Reject::Client { message: "invalid numeric delta argument", .. })));
        assert_eq!(parse(b"delete k 0 noreply").unwrap(), Command::Delete { key: b"k", noreply: true });
        assert!(matches!(parse(b"delete k 5"), Err(Reject::Client { .. })));
        assert_eq!(parse(b"flush_all 10").unwrap(), Command::FlushAll { delay: 10, noreply: false });
        assert_eq!(parse(b"flush_all noreply").unwrap(), Command::FlushAll { delay: 0, noreply: true });
        assert_eq!(parse(b"GET / HTTP/1.1"), Err(Reject::Close));
    }
}
