//! The commands the three protocols share, run against the store with their statistics
//! counted once, the way memcached counts them whatever the protocol. `ascii`, `binary` and
//! `meta` only parse a request into one of these calls and compose their reply from its
//! result (Pelikan's split of protocol from processing).

use bytes::Bytes;

use crate::request::Env;
use crate::stats::CoreStats;
use crate::store::{item_size, Deleted, DeltaError, Item, Lookup, Mode, Stored};

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
/// store_too_large when memory cannot be found for it).
pub fn store(env: &Env, mode: Mode, key: &[u8], value: Bytes, flags: u32, exptime: u32) -> Stored {
    let stats = env.stats;
    CoreStats::bump(&stats.cmd_set);
    let result = env.shared.store.store(mode, key, value, flags, exptime, stats.next_cas(), env.shared.clock.now());
    if let Mode::Cas(_) = mode {
        match result {
            Stored::Stored(_) => CoreStats::bump(&stats.cas_hits),
            Stored::Exists => CoreStats::bump(&stats.cas_badval),
            Stored::NotFound => CoreStats::bump(&stats.cas_misses),
            Stored::NotStored | Stored::TooLarge => {}
        }
    }
    if result == Stored::TooLarge {
        CoreStats::bump(&stats.store_too_large);
    }
    result
}

/// Delete `key`; a non-zero `cas` must match (delete_hits or delete_misses; a cas mismatch
/// counts as neither).
pub fn delete(env: &Env, key: &[u8], cas: u64) -> Deleted {
    let result = env.shared.store.delete(key, cas, env.shared.clock.now());
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
/// as neither).
pub fn delta(env: &Env, key: &[u8], incr: bool, delta: u64, cas: u64, create: Option<(u64, u32)>) -> Result<(u64, u64), DeltaError> {
    let stats = env.stats;
    let result = env.shared.store.delta(key, incr, delta, cas, stats.next_cas(), create, env.shared.clock.now());
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
