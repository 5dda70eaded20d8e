//! The items: a hash table split into shards, each behind its own lock with its own LRU list,
//! and one memory limit over all of them, charged per item.
//!
//! Every core reads and writes the same shards; a request takes one shard's lock for the few
//! hundred nanoseconds its lookup and update need, so cores contend only when they touch the
//! same shard at the same instant. Values are `Bytes`: a get hands out a reference-counted
//! handle to the stored buffer, which the connection sends as it is, and storing a value
//! moves the buffer it was read into.
//!
//! Memory: an item is charged its key, its value and `ITEM_OVERHEAD` (its table entry and
//! bookkeeping), and `bytes` never passes `limit` for long: before an item goes in, the least
//! recently used items are evicted — the oldest of the shards' LRU tails, so eviction follows
//! one LRU order across shards. Expired items are reclaimed when met (on access or at a tail).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use hashbrown::HashTable;
use parking_lot::Mutex;
use slab::Slab;

use crate::evicted_log::{Evicted, EvictedLog};
use crate::slab_classes::{class_of, Classes};

mod counter;
pub mod meta_ops;
pub mod report;

use counter::parse_counter;

/// Shards of the table (a power of two).
pub const SHARDS: usize = 16;

/// Bytes charged to an item beyond its key and value: the entry, its table slot, and the
/// allocator's headers for the key and value buffers.
pub const ITEM_OVERHEAD: usize = std::mem::size_of::<Entry>() + 8 + 32;

const NIL: u32 = u32::MAX;

/// What a read returns: a handle to the stored value, with the item's flags and cas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub value: Bytes,
    pub flags: u32,
    pub cas: u64,
    /// Relative expiry time; 0 = never.
    pub exptime: u32,
}

/// How a store treats an existing (or missing) item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Set,
    Add,
    Replace,
    /// Append to an existing value; a non-zero cas must match.
    Append(u64),
    Prepend(u64),
    /// Store only over an item whose cas matches.
    Cas(u64),
    /// As `Cas`; and over an item with a newer cas too, keeping its expiry, marked stale (ms `I`).
    CasOrStale(u64),
}

/// What a read found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    Hit(Item),
    Miss,
    /// There was an item, but it had expired (memcached's get_expired).
    Expired,
    /// There was an item, but a flush_all had invalidated it (get_flushed).
    Flushed,
}

impl Lookup {
    pub fn hit(self) -> Option<Item> {
        match self {
            Lookup::Hit(item) => Some(item),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Stored, with its new cas.
    Stored(u64),
    NotStored,
    Exists,
    NotFound,
    /// The item can never fit: larger than the whole memory limit.
    TooLarge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaError {
    NotFound,
    NonNumeric,
    Exists,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    Deleted,
    NotFound,
    Exists,
}

struct Entry {
    key: Box<[u8]>,
    value: Bytes,
    hash: u64,
    cas: u64,
    /// Global LRU sequence of the last store or fetch.
    touched: u64,
    flags: u32,
    /// Relative expiry time; 0 = never.
    exptime: u32,
    /// Relative time it was stored (for delayed flush_all).
    stored_at: u32,
    prev: u32,
    next: u32,
    fetched: bool,
    /// memcached's slab class for its size ([`crate::slab_classes`]).
    class: u8,
    /// Relative time of the last store or bumping read (meta `l`, `me`'s `la`).
    accessed: u32,
    /// Marked stale by `md … I` (meta `X`), and whether a client was told it won the
    /// right to recache it (meta `W`, then `Z` to others).
    stale: bool,
    token_sent: bool,
}

impl Entry {
    /// A new item, stored at `now`, most recently used as of `tick`, not yet fetched.
    #[allow(clippy::too_many_arguments)]
    fn new(key: &[u8], value: Bytes, hash: u64, cas: u64, tick: u64, flags: u32, exptime: u32, now: u32) -> Entry {
        let class = class_of(item_size(key.len(), value.len(), flags));
        let (prev, next, stored_at, accessed) = (NIL, NIL, now, now);
        Entry {
            key: key.into(),
            value,
            hash,
            cas,
            touched: tick,
            flags,
            exptime,
            stored_at,
            prev,
            next,
            fetched: false,
            class,
            accessed,
            stale: false,
            token_sent: false,
        }
    }

    fn charge(&self) -> usize {
        self.key.len() + self.value.len() + ITEM_OVERHEAD
    }

    /// Its size as memcached counts it.
    fn size(&self) -> usize {
        item_size(self.key.len(), self.value.len(), self.flags)
    }
}

#[derive(Default)]
struct Shard {
    table: HashTable<u32>,
    entries: Slab<Entry>,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    total_items: u64,
    evictions: u64,
    reclaimed: u64,
    expired_unfetched: u64,
    evicted_unfetched: u64,
    /// Its items and operations by slab class.
    classes: Classes,
    /// Where the crawler looks next.
    crawl_at: usize,
}

pub struct Store {
    shards: Box<[Mutex<Shard>]>,
    hasher: ahash::RandomState,
    used: AtomicUsize,
    limit: usize,
    /// The largest item (`-I`), as `item_size` counts it: appends may not pass it.
    item_max: usize,
    /// The LRU clock: one tick per store or fetch, across shards.
    tick: AtomicU64,
    /// Relative time from which items stored earlier are invalid (delayed flush_all); 0 = none.
    flush_at: AtomicU32,
    /// Rotates where an eviction starts looking.
    cursor: AtomicUsize,
    /// The evicted, kept while someone watches evictions.
    pub evicted: EvictedLog,
    /// The crawler's work: entries looked at, and dead ones it freed.
    pub crawler_checked: AtomicU64,
    pub crawler_reclaimed: AtomicU64,
}

impl Shard {
    fn new() -> Shard {
        Shard { head: NIL, tail: NIL, ..Default::default() }
    }

    fn find(&self, hash: u64, key: &[u8]) -> Option<u32> {
        self.table.find(hash, |&i| &*self.entries[i as usize].key == key).copied()
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let e = &self.entries[i as usize];
            (e.prev, e.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.entries[next as usize].prev = prev;
        }
    }

    fn push_front(&mut self, i: u32) {
        let head = self.head;
        {
            let e = &mut self.entries[i as usize];
            e.prev = NIL;
            e.next = head;
        }
        if head != NIL {
            self.entries[head as usize].prev = i;
        } else {
            self.tail = i;
        }
        self.head = i;
    }

    fn bump(&mut self, i: u32, tick: u64) {
        self.entries[i as usize].touched = tick;
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
    }

    /// Remove entry `i` entirely; returns its charge.
    fn remove(&mut self, i: u32) -> (Entry, usize) {
        self.unlink(i);
        let hash = self.entries[i as usize].hash;
        if let Ok(slot) = self.table.find_entry(hash, |&j| j == i) {
            slot.remove();
        }
        let entry = self.entries.remove(i as usize);
        self.classes.released(entry.class, entry.size());
        let charge = entry.charge();
        (entry, charge)
    }

    fn insert(&mut self, entry: Entry) -> u32 {
        let hash = entry.hash;
        self.classes.held(entry.class, entry.size());
        let i = self.entries.insert(entry) as u32;
        let entries = &self.entries;
        self.table.insert_unique(hash, i, |&j| entries[j as usize].hash);
        self.push_front(i);
        self.total_items += 1;
        i
    }
}

impl Store {
    /// A store holding at most `limit_bytes` of items.
    pub fn new(limit_bytes: usize) -> Store {
        Store::with_item_max(limit_bytes, usize::MAX)
    }

    /// A store whose appends and prepends may not grow an item past `item_max`.
    pub fn with_item_max(limit_bytes: usize, item_max: usize) -> Store {
        Store {
            item_max,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
            hasher: ahash::RandomState::new(),
            used: AtomicUsize::new(0),
            limit: limit_bytes,
            tick: AtomicU64::new(1),
            flush_at: AtomicU32::new(0),
            cursor: AtomicUsize::new(0),
            evicted: EvictedLog::default(),
            crawler_checked: AtomicU64::new(0),
            crawler_reclaimed: AtomicU64::new(0),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    #[inline]
    fn locate(&self, key: &[u8]) -> (u64, &Mutex<Shard>) {
        let hash = self.hasher.hash_one(key);
        // The table indexes by the low bits and tags by the top seven: pick the shard from
        // bits in between, so each shard's keys still spread over its whole table.
        (hash, &self.shards[(hash >> 40) as usize & (SHARDS - 1)])
    }

    #[inline]
    fn next_tick(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed)
    }

    /// Why entry `e` is dead at `now`, if it is.
    #[inline]
    fn death(&self, e: &Entry, now: u32) -> Option<Lookup> {
        if e.exptime != 0 && e.exptime <= now {
            return Some(Lookup::Expired);
        }
        let flush_at = self.flush_at.load(Ordering::Relaxed);
        (flush_at != 0 && flush_at <= now && e.stored_at < flush_at).then_some(Lookup::Flushed)
    }

    #[inline]
    fn dead(&self, e: &Entry, now: u32) -> bool {
        self.death(e, now).is_some()
    }

    /// Find a live entry, dropping it if it is dead (and saying why).
    fn find_live(&self, shard: &mut Shard, hash: u64, key: &[u8], now: u32) -> Result<u32, Lookup> {
        let i = shard.find(hash, key).ok_or(Lookup::Miss)?;
        if let Some(why) = self.death(&shard.entries[i as usize], now) {
            self.reclaim(shard, i);
            return Err(why);
        }
        Ok(i)
    }

    /// Drop dead entry `i`, counted as reclaimed (and expired_unfetched if never read).
    fn reclaim(&self, shard: &mut Shard, i: u32) {
        let (e, charge) = shard.remove(i);
        let class = shard.classes.of(e.class);
        class.reclaimed += 1;
        if !e.fetched {
            shard.expired_unfetched += 1;
            class.expired_unfetched += 1;
        }
        shard.reclaimed += 1;
        self.used.fetch_sub(charge, Ordering::Relaxed);
    }

    /// A step of memcached's LRU crawler over shard `s` (of [`SHARDS`]): look at up to `budget`
    /// entries from where its last step stopped and drop the dead ones, so an expired item's
    /// memory returns without a lookup meeting it. Returns how many went.
    pub fn crawl(&self, s: usize, budget: usize, now: u32) -> usize {
        let mut shard = self.shards[s].lock();
        let capacity = shard.entries.capacity();
        let (mut i, mut gone) = (shard.crawl_at, 0);
        for _ in 0..budget.min(capacity) {
            i = if i >= capacity { 0 } else { i };
            if shard.entries.get(i).is_some_and(|e| self.dead(e, now)) {
                self.reclaim(&mut shard, i as u32);
                gone += 1;
            }
            i += 1;
        }
        shard.crawl_at = i;
        drop(shard);
        self.crawler_checked.fetch_add(budget.min(capacity) as u64, Ordering::Relaxed);
        self.crawler_reclaimed.fetch_add(gone as u64, Ordering::Relaxed);
        gone
    }

    fn live(&self, shard: &mut Shard, hash: u64, key: &[u8], now: u32) -> Option<u32> {
        self.find_live(shard, hash, key, now).ok()
    }

    /// Read an item, marking it recently used; with `touch`, also give it that expiry (gat).
    pub fn lookup(&self, key: &[u8], touch: Option<u32>, now: u32) -> Lookup {
        let (hash, shard) = self.locate(key);
        let mut shard = shard.lock();
        let i = match self.find_live(&mut shard, hash, key, now) {
            Ok(i) => i,
            Err(why) => return why,
        };
        shard.bump(i, self.next_tick());
        let class = shard.entries[i as usize].class;
        let counts = shard.classes.of(class);
        match touch {
            Some(_) => counts.touch_hits += 1,
            None => counts.get_hits += 1,
        }
        let e = &mut shard.entries[i as usize];
        if let Some(exptime) = touch {
            e.exptime = exptime;
        }
        e.fetched = true;
        e.accessed = now;
        Lookup::Hit(Item { value: e.value.clone(), flags: e.flags, cas: e.cas, exptime: e.exptime })
    }

    /// Read an item without marking it used (meta get's `u`).
    pub fn peek(&self, key: &[u8], now: u32) -> Option<Item> {
        let (hash, shard) = self.locate(key);
        let mut shard = shard.lock();
        let i = self.live(&mut shard, hash, key, now)?;
        let e = &shard.entries[i as usize];
        Some(Item { value: e.value.clone(), flags: e.flags, cas: e.cas, exptime: e.exptime })
    }

    /// Read an item, marking it recently used.
    pub fn get(&self, key: &[u8], now: u32) -> Option<Item> {
        self.lookup(key, None, now).hit()
    }

    /// Set a new expiry and read the item (gat); `touch` is this without the value.
    pub fn touch(&self, key: &[u8], exptime: u32, now: u32) -> Option<Item> {
        self.lookup(key, Some(exptime), now).hit()
    }

    /// Store `value` under `key` as `mode` says, with the new cas `cas`.
    #[allow(clippy::too_many_arguments)]
    pub fn store(&self, mode: Mode, key: &[u8], value: Bytes, flags: u32, exptime: u32, cas: u64, now: u32) -> Stored {
        let (hash, shard_lock) = self.locate(key);
        // The charge of what will be stored; for append and prepend, an upper bound.
        let charge = key.len() + value.len() + ITEM_OVERHEAD;
        if charge > self.limit {
            return Stored::TooLarge;
        }
        let grows = matches!(mode, Mode::Append(_) | Mode::Prepend(_));
        if !grows {
            self.make_room(charge, now);
        }
        let mut shard = shard_lock.lock();
        let existing = self.live(&mut shard, hash, key, now);
        // Some(token sent): stored stale over a newer item (CasOrStale).
        let mut stale = None;
        let (value, flags, exptime) = match (mode, existing) {
            (Mode::Add, Some(i)) => {
                // memcached bumps the existing item on a failed add.
                shard.bump(i, self.next_tick());
                return Stored::NotStored;
            }
            (Mode::Replace | Mode::Append(_) | Mode::Prepend(_), None) => return Stored::NotStored,
            (Mode::Cas(_) | Mode::CasOrStale(_), None) => return Stored::NotFound,
            (Mode::CasOrStale(want), Some(i)) if want < shard.entries[i as usize].cas => {
                let e = &shard.entries[i as usize];
                stale = Some(e.token_sent);
                (value, flags, e.exptime)
            }
            (Mode::Cas(want) | Mode::CasOrStale(want), Some(i)) if shard.entries[i as usize].cas != want => {
                let class = shard.entries[i as usize].class;
                shard.classes.of(class).cas_badval += 1;
                return Stored::Exists;
            }
            (Mode::Append(want) | Mode::Prepend(want), Some(i)) if want != 0 && shard.entries[i as usize].cas != want => {
                return Stored::Exists
            }
            (Mode::Append(_) | Mode::Prepend(_), Some(i))
                if item_size(key.len(), shard.entries[i as usize].value.len() + value.len(), shard.entries[i as usize].flags)
                    > self.item_max =>
            {
                // memcached refuses to grow an item past the item size limit.
                return Stored::NotStored;
            }
            (Mode::Append(_), Some(i)) => {
                let e = &shard.entries[i as usize];
                let mut joined = Vec::with_capacity(e.value.len() + value.len());
                joined.extend_from_slice(&e.value);
                joined.extend_from_slice(&value);
                (Bytes::from(joined), e.flags, e.exptime)
            }
            (Mode::Prepend(_), Some(i)) => {
                let e = &shard.entries[i as usize];
                let mut joined = Vec::with_capacity(e.value.len() + value.len());
                joined.extend_from_slice(&value);
                joined.extend_from_slice(&e.value);
                (Bytes::from(joined), e.flags, e.exptime)
            }
            _ => (value, flags, exptime),
        };
        let mut entry = Entry::new(key, value, hash, cas, self.next_tick(), flags, exptime, now);
        (entry.stale, entry.token_sent) = (stale.is_some(), stale == Some(true));
        let new_charge = entry.charge();
        if new_charge > self.limit {
            return Stored::TooLarge;
        }
        if let Some(i) = existing {
            let (_, old) = shard.remove(i);
            self.used.fetch_sub(old, Ordering::Relaxed);
        }
        let counts = shard.classes.of(entry.class);
        counts.cmd_set += 1;
        if matches!(mode, Mode::Cas(_) | Mode::CasOrStale(_)) {
            counts.cas_hits += 1;
        }
        shard.insert(entry);
        self.used.fetch_add(new_charge, Ordering::Relaxed);
        drop(shard);
        if grows || self.used() > self.limit {
            self.make_room(0, now);
        }
        Stored::Stored(cas)
    }

    /// Delete an item; a non-zero `cas` must match.
    pub fn delete(&self, key: &[u8], cas: u64, now: u32) -> Deleted {
        let (hash, shard) = self.locate(key);
        let mut shard = shard.lock();
        let Some(i) = self.live(&mut shard, hash, key, now) else {
            return Deleted::NotFound;
        };
        if cas != 0 && shard.entries[i as usize].cas != cas {
            return Deleted::Exists;
        }
        let (e, charge) = shard.remove(i);
        shard.classes.of(e.class).delete_hits += 1;
        self.used.fetch_sub(charge, Ordering::Relaxed);
        Deleted::Deleted
    }

    /// incr (or decr) a decimal value by `delta`, giving it the new cas `new_cas`. incr wraps
    /// at 2^64; decr stops at 0. A shorter result is padded with spaces to the old length, as
    /// memcached rewrites the value in place. `initial`: for a missing item, store this value
    /// with this expiry instead of failing (the binary protocol's increment).
    #[allow(clippy::too_many_arguments)] // one per field of the protocols' incr/decr
    pub fn delta(
        &self,
        key: &[u8],
        incr: bool,
        delta: u64,
        expect_cas: u64,
        new_cas: u64,
        initial: Option<(u64, u32)>,
        now: u32,
    ) -> Result<(u64, u64), DeltaError> {
        let (hash, shard_lock) = self.locate(key);
        let mut shard = shard_lock.lock();
        let Some(i) = self.live(&mut shard, hash, key, now) else {
            drop(shard);
            let Some((value, exptime)) = initial else {
                return Err(DeltaError::NotFound);
            };
            let text = Bytes::from(value.to_string());
            return match self.store(Mode::Add, key, text, 0, exptime, new_cas, now) {
                Stored::Stored(cas) => Ok((value, cas)),
                // Another core added it meanwhile: apply the delta to that.
                _ => self.delta(key, incr, delta, expect_cas, new_cas, None, now),
            };
        };
        let e = &shard.entries[i as usize];
        if expect_cas != 0 && e.cas != expect_cas {
            return Err(DeltaError::Exists);
        }
        let current = parse_counter(&e.value).ok_or(DeltaError::NonNumeric)?;
        let value = if incr { current.wrapping_add(delta) } else { current.saturating_sub(delta) };
        let mut text = value.to_string().into_bytes();
        if text.len() < e.value.len() {
            text.resize(e.value.len(), b' ');
        }
        let old_len = e.value.len();
        let (old_class, old_size) = (e.class, e.size());
        let tick = self.next_tick();
        let e = &mut shard.entries[i as usize];
        e.value = Bytes::from(text);
        e.cas = new_cas;
        e.class = class_of(e.size());
        let (new_class, new_size) = (e.class, e.size());
        let grown = e.value.len() - old_len;
        shard.classes.released(old_class, old_size);
        shard.classes.held(new_class, new_size);
        let counts = shard.classes.of(new_class);
        if incr {
            counts.incr_hits += 1;
        } else {
            counts.decr_hits += 1;
        }
        shard.bump(i, tick);
        if grown > 0 {
            self.used.fetch_add(grown, Ordering::Relaxed);
        }
        Ok((value, new_cas))
    }

    /// flush_all: at once (`at` = None) empties every shard; with a time, items stored
    /// before it become invalid when it comes.
    pub fn flush(&self, at: Option<u32>) {
        match at {
            Some(at) => self.flush_at.store(at.max(1), Ordering::Relaxed),
            None => {
                self.flush_at.store(0, Ordering::Relaxed);
                for shard in self.shards.iter() {
                    let mut s = shard.lock();
                    let freed: usize = s.entries.iter().map(|(_, e)| e.charge()).sum();
                    s.classes.emptied();
                    s.table.clear();
                    s.entries.clear();
                    s.head = NIL;
                    s.tail = NIL;
                    drop(s);
                    self.used.fetch_sub(freed, Ordering::Relaxed);
                }
            }
        }
    }

    /// Evict least recently used items until `charge` more bytes fit.
    fn make_room(&self, charge: usize, now: u32) {
        let mut misses = 0;
        while self.used.load(Ordering::Relaxed) + charge > self.limit {
            if !self.evict_one(now) {
                misses += 1;
                // Every shard empty while memory is charged cannot last; other cores are
                // between a charge and an insert. Give up rather than spin.
                if misses > 2 {
                    return;
                }
            }
        }
    }

    /// Evict the oldest item among the shards' LRU tails (expired ones count as reclaimed).
    fn evict_one(&self, now: u32) -> bool {
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        let mut oldest: Option<(u64, usize)> = None;
        for k in 0..SHARDS {
            let s = (start + k) & (SHARDS - 1);
            let shard = self.shards[s].lock();
            if shard.tail != NIL {
                let touched = shard.entries[shard.tail as usize].touched;
                if oldest.is_none_or(|(t, _)| touched < t) {
                    oldest = Some((touched, s));
                }
            }
        }
        let Some((_, s)) = oldest else { return false };
        let mut shard = self.shards[s].lock();
        let tail = shard.tail;
        if tail == NIL {
            return true;
        }
        let now_dead = self.dead(&shard.entries[tail as usize], now);
        let (entry, charge) = shard.remove(tail);
        let class = shard.classes.of(entry.class);
        if now_dead {
            class.reclaimed += 1;
        } else {
            class.evicted += 1;
            class.evicted_nonzero += u64::from(entry.exptime != 0);
            class.evicted_unfetched += u64::from(!entry.fetched);
        }
        if now_dead {
            shard.reclaimed += 1;
        } else {
            shard.evictions += 1;
            if !entry.fetched {
                shard.evicted_unfetched += 1;
            }
        }
        drop(shard);
        if !now_dead && self.evicted.is_on() {
            let (key, size, fetched, class) = (entry.key, entry.value.len(), entry.fetched, entry.class);
            self.evicted.record(Evicted { key, size, fetched, exptime: entry.exptime, stored_at: entry.stored_at, class });
        }
        self.used.fetch_sub(charge, Ordering::Relaxed);
        true
    }
}

/// An item's size as memcached counts it against `-I`: a 48-byte header, 8 bytes of cas, the
/// key and its NUL, the value and its "\r\n", and 4 more when it has flags. What fits stock
/// memcached fits here, and nothing larger.
pub fn item_size(key: usize, value: usize, flags: u32) -> usize {
    48 + 8 + key + 1 + value + 2 + if flags != 0 { 4 } else { 0 }
}
