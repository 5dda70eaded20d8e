//! The commands the three protocols share, run against the store with their statistics
//! counted once, the way memcached counts them whatever the protocol. `ascii`, `binary` and
//! `meta` only parse a request into one of these calls and compose their reply from its
//! result (Pelikan's split of protocol from processing).

use std::fmt::Write;

use bytes::Bytes;

use crate::request::Env;
use crate::slab_classes::class_of;
use crate::stats::CoreStats;
use crate::store::meta_ops::{MetaItem, MetaRead};
use crate::store::{item_size, Deleted, DeltaError, Item, Lookup, Mode, Stored};
use crate::watch::{self, put_key};

/// How a read treats the item it finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// get: mark it recently used.
    Get,
    /// get without marking it used (meta get's `u`).
    Peek,
    /// gat and touch: give it this expiry (absolute, from `Clock::expiry`) and mark it used.
    Touch(u32),
    /// meta get with `T`: like `Touch`, but counted as a get when there is no item (memcached
    /// decides by whether the expiry was set).
    GetOrTouch(u32),
}

/// Read `key`. A touching read counts as a touch (cmd_touch; touch_hits or touch_misses), any
/// other as a get (cmd_get; get_hits or get_misses); expired and flushed items found on the
/// way count too (get_expired, get_flushed). `tests/cache/test_cache_compat.py` checks the
/// counts against memcached's in every protocol.
pub fn read(env: &Env, key: &[u8], how: Read) -> Option<Item> {
    let (store, stats, now) = (&env.shared.store, env.stats, env.shared.clock.now());
    let found = match how {
        Read::Get => store.lookup(key, None, now),
        Read::Touch(exptime) | Read::GetOrTouch(exptime) => store.lookup(key, Some(exptime), now),
        Read::Peek => store.peek(key, now).map_or(Lookup::Miss, Lookup::Hit),
    };
    match &found {
        Lookup::Expired => CoreStats::bump(&stats.get_expired),
        Lookup::Flushed => CoreStats::bump(&stats.get_flushed),
        Lookup::Hit(_) | Lookup::Miss => {}
    }
    log_get(env, key, &found);
    let item = found.hit();
    let touched = match how {
        Read::Touch(_) => true,
        Read::GetOrTouch(_) => item.is_some(),
        Read::Get | Read::Peek => false,
    };
    let (command, hits, misses) = if touched {
        (&stats.cmd_touch, &stats.touch_hits, &stats.touch_misses)
    } else {
        (&stats.cmd_get, &stats.get_hits, &stats.get_misses)
    };
    CoreStats::bump(command);
    CoreStats::bump(if item.is_some() { hits } else { misses });
    item
}

/// mg's read (`crate::store::meta_ops`), counted as `read` counts: a touch with `T` that finds
/// its item, else a get; an item `N` created counts as a hit, as memcached counts it.
pub fn meta_read(env: &Env, key: &[u8], how: &MetaRead) -> Option<MetaItem> {
    let stats = env.stats;
    let found = env.shared.store.meta_read(key, how, env.shared.clock.now());
    match &found {
        Err(Lookup::Expired) => CoreStats::bump(&stats.get_expired),
        Err(Lookup::Flushed) => CoreStats::bump(&stats.get_flushed),
        _ => {}
    }
    let (command, hits, misses) =
        // memcached counts T as a touch only when it found the item.
        if how.touch.is_some() && found.is_ok() {
            (&stats.cmd_touch, &stats.touch_hits, &stats.touch_misses)
        } else {
            (&stats.cmd_get, &stats.get_hits, &stats.get_misses)
        };
    CoreStats::bump(command);
    CoreStats::bump(if found.is_ok() { hits } else { misses });
    if env.shared.watchers.watching(watch::FETCHERS) {
        log_get(env, key, &found.as_ref().map_or_else(Clone::clone, |m| Lookup::Hit(m.item.clone())));
    }
    found.ok()
}

/// Whether a store of a `len`-byte value under `key` must be refused before its value is
/// read, because the item could never fit (counted as store_too_large). memcached drops the
/// old value of a `set` it cannot store (`drop_old`), so no stale value outlives the failed
/// overwrite.
pub fn refuse_too_large(env: &Env, key: &[u8], len: usize, flags: u32, drop_old: bool) -> bool {
    if item_size(key.len(), len, flags) <= env.shared.settings.item_max {
        return false;
    }
    CoreStats::bump(&env.stats.store_too_large);
    if drop_old {
        env.shared.store.delete(key, 0, env.shared.clock.now());
    }
    true
}

/// Store a value that has arrived (cmd_set; for cas, cas_hits, cas_badval or cas_misses;
/// store_no_memory when memory cannot be found for it).
pub fn store(env: &Env, mode: Mode, key: &[u8], value: Bytes, flags: u32, exptime: u32, cas_in: Option<u64>) -> Stored {
    let stats = env.stats;
    CoreStats::bump(&stats.cmd_set);
    let now = env.shared.clock.now();
    if env.shared.watchers.watching(watch::FETCHERS) {
        // memcached looks the key up before it stores, and logs that fetch.
        log_get(env, key, &env.shared.store.peek(key, now).map_or(Lookup::Miss, Lookup::Hit));
    }
    let len = value.len();
    let result = env.shared.store.store(mode, key, value, flags, exptime, cas_in.unwrap_or_else(|| stats.next_cas()), now);
    env.shared.watchers.log(watch::MUTATIONS, |line| {
        let status = match result {
            Stored::Stored(_) => "stored",
            Stored::NotStored => "not_stored",
            Stored::Exists => "exists",
            Stored::NotFound => "not_found",
            Stored::TooLarge => "no_memory",
        };
        let cmd = match mode {
            Mode::Set => "set",
            Mode::Add => "add",
            Mode::Replace => "replace",
            Mode::Append(_) => "append",
            Mode::Prepend(_) => "prepend",
            Mode::Cas(_) | Mode::CasOrStale(_) => "cas",
        };
        let ttl = if exptime == 0 { 0 } else { exptime.saturating_sub(now) };
        line.push_str("item_store key=");
        put_key(line, key);
        let class = class_of(item_size(key.len(), len, flags));
        let _ = write!(line, " status={status} cmd={cmd} ttl={ttl} clsid={class} cfd={} size={len}", env.fd);
    });
    if let Mode::Cas(_) | Mode::CasOrStale(_) = mode {
        match result {
            Stored::Stored(_) => CoreStats::bump(&stats.cas_hits),
            Stored::Exists => CoreStats::bump(&stats.cas_badval),
            Stored::NotFound => CoreStats::bump(&stats.cas_misses),
            Stored::NotStored | Stored::TooLarge => {}
        }
    }
    if result == Stored::TooLarge {
        // No memory could be found for it (refuse_too_large refused what can never fit).
        CoreStats::bump(&stats.store_no_memory);
    }
    if env.shared.watchers.watching(watch::EVICTIONS) {
        for gone in env.shared.store.evicted.take() {
            env.shared.watchers.log(watch::EVICTIONS, |line| {
                line.push_str("eviction key=");
                put_key(line, &gone.key);
                let ttl = if gone.exptime == 0 { -1 } else { i64::from(gone.exptime) - i64::from(now) };
                let fetch = if gone.fetched { "yes" } else { "no" };
                // la: seconds since it was stored (the store keeps no access time).
                let (la, class) = (now.saturating_sub(gone.stored_at), gone.class);
                let _ = write!(line, " fetch={fetch} ttl={ttl} la={la} clsid={class} size={}", gone.size);
            });
        }
    }
    result
}

/// Delete `key`; a non-zero `cas` must match (delete_hits or delete_misses; a cas mismatch
/// counts as neither).
pub fn delete(env: &Env, key: &[u8], cas: u64) -> Deleted {
    let now = env.shared.clock.now();
    let watched = env.shared.watchers.watching(watch::DELETIONS).then(|| env.shared.store.peek(key, now)).flatten();
    let result = env.shared.store.delete(key, cas, now);
    if let (Deleted::Deleted, Some(item)) = (result, watched) {
        env.shared.watchers.log(watch::DELETIONS, |line| {
            line.push_str("deleted key=");
            put_key(line, key);
            let size = item_size(key.len(), item.value.len(), item.flags);
            let _ = write!(line, " cmd=delete clsid={} size={}", class_of(size), item.value.len());
        });
    }
    match result {
        Deleted::Deleted => CoreStats::bump(&env.stats.delete_hits),
        Deleted::NotFound => CoreStats::bump(&env.stats.delete_misses),
        Deleted::Exists => {}
    }
    result
}

/// incr or decr `key` by `delta`; a non-zero `cas` must match; `create`: the initial value
/// and expiry of a missing item (binary and meta). Returns the new value and cas (incr_ or
/// decr_hits, or _misses when there is no item; a non-numeric value or a cas mismatch counts
/// as neither). `cas_in`: the new cas (meta `E`) instead of the next one.
pub fn delta(
    env: &Env,
    key: &[u8],
    incr: bool,
    delta: u64,
    cas: u64,
    create: Option<(u64, u32)>,
    cas_in: Option<u64>,
) -> Result<(u64, u64), DeltaError> {
    let stats = env.stats;
    let result = env.shared.store.delta(key, incr, delta, cas, cas_in.unwrap_or_else(|| stats.next_cas()), create, env.shared.clock.now());
    let (hits, misses) = if incr { (&stats.incr_hits, &stats.incr_misses) } else { (&stats.decr_hits, &stats.decr_misses) };
    match &result {
        Ok(_) => CoreStats::bump(hits),
        Err(DeltaError::NotFound) => CoreStats::bump(misses),
        Err(DeltaError::NonNumeric | DeltaError::Exists) => {}
    }
    result
}

/// flush_all: now, or after `delay` seconds (cmd_flush).
pub fn flush(env: &Env, delay: i64) {
    CoreStats::bump(&env.stats.cmd_flush);
    let at = (delay > 0).then(|| env.shared.clock.expiry(delay));
    env.shared.store.flush(at);
}

/// memcached's fetchers log line for a lookup of `key`.
fn log_get(env: &Env, key: &[u8], found: &Lookup) {
    env.shared.watchers.log(watch::FETCHERS, |line| {
        let (status, item) = match found {
            Lookup::Hit(item) => ("found", Some(item)),
            Lookup::Miss => ("not_found", None),
            Lookup::Flushed => ("flushed", None),
            Lookup::Expired => ("expired", None),
        };
        let (class, size) = item.map_or((0, 0), |i| (class_of(item_size(key.len(), i.value.len(), i.flags)), i.value.len()));
        line.push_str("item_get key=");
        put_key(line, key);
        let _ = write!(line, " status={status} clsid={class} cfd={} size={size}", env.fd);
    });
}
