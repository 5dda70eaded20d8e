//! Log watchers (memcached's `watch`): the event kinds a connection may watch, each watcher's
//! bounded buffer of lines with memcached's `skipped=N` when it overflowed, and the lines in
//! memcached 1.6.45's format (`logger.c`). An event costs one atomic load while nobody
//! watches its kind; a watcher's connection is woken (on its own core) when its buffer goes
//! from empty to not.

use std::fmt::Write;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

pub const FETCHERS: u32 = 1 << 0;
pub const MUTATIONS: u32 = 1 << 1;
pub const EVICTIONS: u32 = 1 << 2;
pub const CONNEVENTS: u32 = 1 << 3;
pub const DELETIONS: u32 = 1 << 4;
/// Kinds memcached knows that this server has no events for (raw commands, system and proxy
/// events): accepted, never written.
const SILENT: u32 = 1 << 5;

/// memcached's WATCHER_LIMIT.
pub const LIMIT: usize = 20;
/// memcached's default `watcher_logbuf_size` (256 KiB).
pub const BUFFER: usize = 256 << 10;

/// The kinds of a `watch` line's arguments, matched as memcached matches them (an argument
/// may be a prefix of a kind's name); none means fetchers. None: an unknown argument (ERROR).
pub fn parse_kinds(args: &[&[u8]]) -> Option<u32> {
    const NAMES: [(&[u8], u32); 10] = [
        (b"rawcmds", SILENT),
        (b"evictions", EVICTIONS),
        (b"fetchers", FETCHERS),
        (b"mutations", MUTATIONS),
        (b"sysevents", SILENT),
        (b"connevents", CONNEVENTS),
        (b"proxyreqs", SILENT),
        (b"proxyevents", SILENT),
        (b"proxyuser", SILENT),
        (b"deletions", DELETIONS),
    ];
    if args.is_empty() {
        return Some(FETCHERS);
    }
    args.iter().try_fold(0, |kinds, arg| NAMES.iter().find(|(name, _)| name.starts_with(arg)).map(|(_, kind)| kinds | kind))
}

/// One watching connection's buffer.
pub struct Watcher {
    kinds: u32,
    inner: Mutex<Buffer>,
    /// Wakes the watcher's connection; called with no lock held, once per empty-to-not.
    wake: Box<dyn Fn() + Send + Sync>,
}

#[derive(Default)]
struct Buffer {
    text: Vec<u8>,
    skipped: u64,
    /// A wake-up was sent and the connection has not taken the text since.
    woken: bool,
}

impl Watcher {
    /// Take what is buffered (the connection writes it out).
    pub fn take(&self) -> Vec<u8> {
        let mut inner = self.inner.lock().unwrap();
        inner.woken = false;
        std::mem::take(&mut inner.text)
    }

    /// Buffer a line; false when it was skipped.
    fn offer(&self, line: &str) -> bool {
        let wake = {
            let mut inner = self.inner.lock().unwrap();
            if inner.skipped > 0 {
                let note = format!("skipped={}\n", inner.skipped);
                if inner.text.len() + note.len() + line.len() > BUFFER {
                    inner.skipped += 1;
                    return false;
                }
                inner.text.extend_from_slice(note.as_bytes());
                inner.skipped = 0;
            }
            if inner.text.len() + line.len() > BUFFER {
                inner.skipped += 1;
                return false;
            }
            inner.text.extend_from_slice(line.as_bytes());
            !std::mem::replace(&mut inner.woken, true)
        };
        if wake {
            (self.wake)();
        }
        true
    }
}

/// Every watcher of the server.
#[derive(Default)]
pub struct Watchers {
    /// The union of the kinds watched.
    active: AtomicU32,
    list: Mutex<Vec<Arc<Watcher>>>,
    /// memcached's gid: one sequence over all log lines.
    gid: AtomicU64,
    /// Lines written to watchers' buffers, and lines dropped for a full one.
    sent: AtomicU64,
    skipped: AtomicU64,
}

impl Watchers {
    /// Add a watcher of `kinds`; None when LIMIT watch already.
    pub fn add(&self, kinds: u32, wake: Box<dyn Fn() + Send + Sync>) -> Option<Arc<Watcher>> {
        let mut list = self.list.lock().unwrap();
        if list.len() >= LIMIT {
            return None;
        }
        let watcher = Arc::new(Watcher { kinds, inner: Mutex::new(Buffer::default()), wake });
        list.push(watcher.clone());
        self.active.fetch_or(kinds, Ordering::Relaxed);
        Some(watcher)
    }

    pub fn remove(&self, watcher: &Arc<Watcher>) {
        let mut list = self.list.lock().unwrap();
        list.retain(|w| !Arc::ptr_eq(w, watcher));
        self.active.store(list.iter().fold(0, |k, w| k | w.kinds), Ordering::Relaxed);
    }

    /// Whether anyone watches `kind` (check before building a line's fields).
    #[inline]
    pub fn watching(&self, kind: u32) -> bool {
        self.active.load(Ordering::Relaxed) & kind != 0
    }

    /// Log an event of `kind`: `fields` writes what follows `type=` (memcached's words).
    pub fn log(&self, kind: u32, fields: impl FnOnce(&mut String)) {
        if !self.watching(kind) {
            return;
        }
        let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let gid = self.gid.fetch_add(1, Ordering::Relaxed);
        let mut line = format!("ts={}.{} gid={} type=", since.as_secs(), since.subsec_micros(), gid);
        fields(&mut line);
        line.push('\n');
        let list = self.list.lock().unwrap().clone();
        for watcher in list.iter().filter(|w| w.kinds & kind != 0) {
            let counter = if watcher.offer(&line) { &self.sent } else { &self.skipped };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// (watchers, lines sent, lines skipped) for `stats`.
    pub fn counts(&self) -> (usize, u64, u64) {
        (self.list.lock().unwrap().len(), self.sent.load(Ordering::Relaxed), self.skipped.load(Ordering::Relaxed))
    }
}

/// A key as memcached writes it in a log line: URI-encoded (all but `A-Za-z0-9-._~`).
pub fn put_key(line: &mut String, key: &[u8]) {
    for &b in key {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            line.push(b as char);
        } else {
            let _ = write!(line, "%{b:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn counting() -> (Arc<AtomicUsize>, Box<dyn Fn() + Send + Sync>) {
        let woken = Arc::new(AtomicUsize::new(0));
        let w = woken.clone();
        (
            woken,
            Box::new(move || {
                w.fetch_add(1, Ordering::Relaxed);
            }),
        )
    }

    #[test]
    fn kinds_are_matched_by_prefix_as_memcached_does() {
        assert_eq!(parse_kinds(&[]), Some(FETCHERS));
        assert_eq!(parse_kinds(&[b"fetchers", b"mutations"]), Some(FETCHERS | MUTATIONS));
        assert_eq!(parse_kinds(&[b"fetch"]), Some(FETCHERS));
        assert_eq!(parse_kinds(&[b"rawcmds"]), Some(SILENT));
        assert_eq!(parse_kinds(&[b"fetchersx"]), None);
        assert_eq!(parse_kinds(&[b"mutations", b"bogus"]), None);
    }

    #[test]
    fn lines_reach_the_watchers_of_their_kind_and_wake_each_once() {
        let watchers = Watchers::default();
        assert!(!watchers.watching(FETCHERS));
        let (woken, wake) = counting();
        let w = watchers.add(FETCHERS, wake).unwrap();
        let (other_woken, other_wake) = counting();
        let other = watchers.add(MUTATIONS, other_wake).unwrap();
        watchers.log(FETCHERS, |l| l.push_str("item_get key=a"));
        watchers.log(FETCHERS, |l| l.push_str("item_get key=b"));
        assert_eq!(woken.load(Ordering::Relaxed), 1, "woken when its buffer went from empty to not");
        let text = String::from_utf8(w.take()).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("ts=") && lines[0].contains(" gid=0 type=item_get key=a"), "{text}");
        assert!(lines[1].contains(" gid=1 type=item_get key=b"));
        assert_eq!((other_woken.load(Ordering::Relaxed), other.take().len()), (0, 0));
        watchers.log(FETCHERS, |l| l.push_str("item_get key=c"));
        assert_eq!(woken.load(Ordering::Relaxed), 2, "woken again after it took the text");
        watchers.remove(&w);
        assert!(!watchers.watching(FETCHERS) && watchers.watching(MUTATIONS));
    }

    #[test]
    fn a_full_buffer_skips_lines_and_says_how_many() {
        let watchers = Watchers::default();
        let w = watchers.add(FETCHERS, Box::new(|| {})).unwrap();
        let long = "x".repeat(1000);
        for _ in 0..(BUFFER / 1000 + 10) {
            watchers.log(FETCHERS, |l| l.push_str(&long));
        }
        let first = w.take();
        assert!(first.len() <= BUFFER && !first.is_empty());
        watchers.log(FETCHERS, |l| l.push_str("item_get key=after"));
        let text = String::from_utf8(w.take()).unwrap();
        let skipped: u64 = text.lines().next().unwrap().strip_prefix("skipped=").unwrap().parse().unwrap();
        assert!(skipped >= 10, "{text}");
        assert!(text.lines().nth(1).unwrap().ends_with("type=item_get key=after"));
    }

    #[test]
    fn no_more_than_the_limit_watch() {
        let watchers = Watchers::default();
        let all: Vec<_> = (0..LIMIT).map(|_| watchers.add(FETCHERS, Box::new(|| {})).unwrap()).collect();
        assert!(watchers.add(FETCHERS, Box::new(|| {})).is_none());
        watchers.remove(&all[0]);
        assert!(watchers.add(FETCHERS, Box::new(|| {})).is_some());
    }

    #[test]
    fn keys_are_uri_encoded() {
        let mut line = String::new();
        put_key(&mut line, b"a b#~");
        assert_eq!(line, "a%20b%23~");
    }
}
