//! Arbitrary bytes, split at newlines as `ascii::step` splits them, through the text
//! protocol's tokenizer and parser. Nothing may panic, and what they return must make sense:
//! tokens are non-empty, in order, slices of the line without spaces (but the 24th, which
//! holds the rest of the line); keys of parsed commands obey memcached's limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sprout_cache::text::{self, Command, KEY_MAX};

fn within(line: &[u8], part: &[u8]) -> bool {
    let (l, p) = (line.as_ptr() as usize, part.as_ptr() as usize);
    p >= l && p + part.len() <= l + line.len()
}

fn check_line(line: &[u8]) {
    let tokens = text::tokenize(line);
    assert!(tokens.len() <= 24, "{} tokens", tokens.len());
    let mut after = line.as_ptr() as usize;
    for (i, t) in tokens.iter().enumerate() {
        assert!(!t.is_empty(), "empty token");
        assert!(within(line, t), "token outside its line");
        assert!(t.as_ptr() as usize >= after, "tokens out of order");
        after = t.as_ptr() as usize + t.len();
        if i < 23 {
            assert!(!t.contains(&b' '), "token {i} holds a space");
        }
    }
    if tokens.len() < 24 {
        // Fewer than 24 tokens: they are exactly the line's non-space bytes.
        let joined: Vec<u8> = tokens.concat();
        let squeezed: Vec<u8> = line.iter().copied().filter(|&b| b != b' ').collect();
        assert_eq!(joined, squeezed);
    }
    for t in tokens.iter() {
        if let Some(v) = text::parse_u64(t) {
            let digits = t.strip_prefix(b"+").unwrap_or(t);
            assert!(digits.iter().all(u8::is_ascii_digit));
            assert_eq!(v.to_string().len(), digits.iter().skip_while(|&&b| b == b'0').count().max(1));
        }
        if let Some(v) = text::parse_i32(t) {
            assert!((i32::MIN as i64..=i32::MAX as i64).contains(&v));
        }
    }

    match text::parse(line) {
        Ok(Command::Get { keys, .. }) => {
            assert!(within(line, keys), "keys outside the line");
            assert!(!keys.starts_with(b" "));
            for k in text::keys(keys) {
                assert!(!k.is_empty() && !k.contains(&b' '));
            }
        }
        Ok(Command::Store { key, bytes, .. }) => {
            assert!(within(line, key) && !key.is_empty() && key.len() <= KEY_MAX);
            assert!(bytes <= i32::MAX as usize - 2);
        }
        Ok(Command::Delete { key, .. }) | Ok(Command::Delta { key, .. }) | Ok(Command::Touch { key, .. }) => {
            assert!(within(line, key) && !key.is_empty() && key.len() <= KEY_MAX);
        }
        Ok(Command::Meta { name, tokens }) => {
            assert!(b"gsdane".contains(&name));
            assert!(tokens.iter().all(|t| within(line, t)));
        }
        Ok(Command::Stats { args }) => assert!(args.iter().all(|t| within(line, t))),
        Ok(_) | Err(_) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    // As ascii::step: a line ends at '\n', and a '\r' before it goes when the line has more.
    for raw in data.split(|&b| b == b'\n') {
        let line = match raw {
            [rest @ .., b'\r'] if !rest.is_empty() => rest,
            _ => raw,
        };
        check_line(line);
        // The raw line too (a lone or trailing '\r' stays in it).
        check_line(raw);
    }
});
