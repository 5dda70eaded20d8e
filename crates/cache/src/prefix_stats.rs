//! memcached's `stats detail`: counts of gets, hits, sets and deletes per key prefix (the key
//! up to its first `:`), kept only while `stats detail on`, dumped by `stats detail dump`
//! (`PREFIX <p> get <n> hit <n> set <n> del <n>` lines, then `END`), cleared by `stats reset`.
//! As memcached, the text and binary protocols' get, set and delete are counted (not the meta
//! commands'), keys without the delimiter are not, and at most 65,536 prefixes are kept.
//! Turned off, a request pays one relaxed atomic load.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

const DELIMITER: u8 = b':';
const MAX_PREFIXES: usize = 1 << 16;

/// What happened to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get { hit: bool },
    Set,
    Delete,
}

#[derive(Default)]
pub struct PrefixStats {
    on: AtomicBool,
    /// Per prefix: gets, hits, sets, deletes.
    counts: Mutex<BTreeMap<Vec<u8>, [u64; 4]>>,
}

impl PrefixStats {
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// Count `op` on `key`, while collection is on.
    #[inline]
    pub fn record(&self, key: &[u8], op: Op) {
        if self.on.load(Ordering::Relaxed) {
            self.record_slow(key, op);
        }
    }

    #[cold]
    fn record_slow(&self, key: &[u8], op: Op) {
        let Some(end) = key.iter().take_while(|&&b| b != 0).position(|&b| b == DELIMITER) else { return };
        let mut counts = self.counts.lock();
        if !counts.contains_key(&key[..end]) && counts.len() >= MAX_PREFIXES {
            return;
        }
        let c = counts.entry(key[..end].to_vec()).or_default();
        match op {
            Op::Get { hit } => {
                c[0] += 1;
                c[1] += u64::from(hit);
            }
            Op::Set => c[2] += 1,
            Op::Delete => c[3] += 1,
        }
    }

    /// `stats detail dump`'s lines, `END` included.
    pub fn dump(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (prefix, [get, hit, set, del]) in self.counts.lock().iter() {
            out.extend_from_slice(b"PREFIX ");
            out.extend_from_slice(prefix);
            out.extend_from_slice(format!(" get {get} hit {hit} set {set} del {del}\r\n").as_bytes());
        }
        out.extend_from_slice(b"END\r\n");
        out
    }

    /// `stats reset`: every prefix forgotten.
    pub fn clear(&self) {
        self.counts.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_counted_only_while_on() {
        let stats = PrefixStats::default();
        stats.record(b"foo:1", Op::Set);
        assert_eq!(stats.dump(), b"END\r\n");
        stats.set_on(true);
        stats.record(b"foo:1", Op::Set);
        stats.record(b"foo:1", Op::Get { hit: true });
        stats.record(b"foo:2", Op::Get { hit: false });
        stats.record(b"bar:x", Op::Delete);
        stats.record(b"plain", Op::Set);
        assert_eq!(stats.dump(), b"PREFIX bar get 0 hit 0 set 0 del 1\r\nPREFIX foo get 2 hit 1 set 1 del 0\r\nEND\r\n");
        stats.set_on(false);
        stats.record(b"foo:1", Op::Set);
        stats.clear();
        assert_eq!(stats.dump(), b"END\r\n");
    }
}
