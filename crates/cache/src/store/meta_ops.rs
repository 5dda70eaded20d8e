//! The meta commands' item operations, each done at once under the item's shard lock: mg's
//! read with vivify-on-miss (`N`), recache (`R`), stale and win flags (`X`, `W`, `Z`), hit-before
//! and last access (`h`, `l`); md's invalidation (`I`) and value removal (`x`); me's dump.

use bytes::Bytes;

use super::{Deleted, Entry, Item, Store};
use crate::slab_classes::class_of;

/// What an mg asks of its item.
#[derive(Clone, Copy, Debug, Default)]
pub struct MetaRead {
    /// `T`: the new expiry (absolute, from `Clock::expiry`).
    pub touch: Option<u32>,
    /// `N`: on a miss, create an empty item with this expiry and this cas.
    pub vivify: Option<(u32, u64)>,
    /// `R`: win the recache when the item expires before this (absolute) time.
    pub recache_before: Option<u32>,
    /// Bump it in the LRU, mark it fetched and accessed (no `u`).
    pub bump: bool,
}

/// What an mg found (or made).
#[derive(Clone, Debug)]
pub struct MetaItem {
    pub item: Item,
    /// Before this read: fetched before (`h`), seconds since its last access (`l`).
    pub hit_before: bool,
    pub idle_s: u32,
    /// `W`: this client won the right to recache; `Z`: another already had; `X`: stale.
    pub won: bool,
    pub token_was_sent: bool,
    pub stale: bool,
    /// Made by `N` on a miss.
    pub created: bool,
    pub class: u8,
}

/// What `me` shows of an item.
#[derive(Clone, Debug)]
pub struct ItemDebug {
    /// Seconds left (-1: never), since its last access, its cas, fetched, class, size.
    pub ttl: i64,
    pub idle_s: u32,
    pub cas: u64,
    pub fetched: bool,
    pub class: u8,
    pub size: usize,
}

impl Store {
    /// mg's read: `Err` says why there is none (a miss, or dead and dropped).
    pub fn meta_read(&self, key: &[u8], r: &MetaRead, now: u32) -> Result<MetaItem, super::Lookup> {
        let (hash, shard) = self.locate(key);
        let mut shard = shard.lock();
        let (i, created) = match self.find_live(&mut shard, hash, key, now) {
            Ok(i) => (i, false),
            Err(why) => {
                let Some((exptime, cas)) = r.vivify else { return Err(why) };
                let entry = Entry::new(key, Bytes::new(), hash, cas, self.next_tick(), 0, exptime, now);
                let charge = entry.charge();
                self.used.fetch_add(charge, std::sync::atomic::Ordering::Relaxed);
                (shard.insert(entry), true)
            }
        };
        let tick = self.next_tick();
        let e = &mut shard.entries[i as usize];
        let (hit_before, idle_s, token_was_sent, stale) = (e.fetched, now.saturating_sub(e.accessed), e.token_sent, e.stale);
        if let Some(exptime) = r.touch {
            e.exptime = exptime;
        }
        let recache = r.recache_before.is_some_and(|t| !created && e.exptime != 0 && e.exptime < t);
        let won = !token_was_sent && (created || recache || stale);
        e.token_sent |= won;
        if r.bump {
            e.fetched = true;
            e.accessed = now;
        }
        let item = Item { value: e.value.clone(), flags: e.flags, cas: e.cas, exptime: e.exptime };
        let class = e.class;
        if r.bump {
            shard.bump(i, tick);
        }
        drop(shard);
        if created && self.used() > self.limit {
            self.make_room(0, now);
        }
        Ok(MetaItem { item, hit_before, idle_s, won, token_was_sent, stale, created, class })
    }

    /// md's `I`: mark the item stale, give it cas `new_cas` and (with `T`) a new expiry; it
    /// stays readable, with `X`, until stored again. `cas` non-zero must match.
    pub fn invalidate(&self, key: &[u8], cas: u64, new_cas: u64, exptime: Option<u32>, now: u32) -> Deleted {
        self.with_live(key, cas, now, |e| {
            e.stale = true;
            e.token_sent = false;
            e.cas = new_cas;
            if let Some(exptime) = exptime {
                e.exptime = exptime;
            }
        })
    }

    /// md's `x`: empty the item's value (and its client flags), keeping the item.
    pub fn drop_value(&self, key: &[u8], cas: u64, now: u32) -> Deleted {
        let (hash, shard) = self.locate(key);
        let mut shard = shard.lock();
        let Some(i) = self.live(&mut shard, hash, key, now) else { return Deleted::NotFound };
        if cas != 0 && shard.entries[i as usize].cas != cas {
            return Deleted::Exists;
        }
        let (size_before, class_before) = (shard.entries[i as usize].size(), shard.entries[i as usize].class);
        let e = &mut shard.entries[i as usize];
        let freed = e.value.len();
        e.value = Bytes::new();
        e.flags = 0;
        e.class = class_of(e.size());
        let (size, class) = (e.size(), e.class);
        shard.classes.released(class_before, size_before);
        shard.classes.held(class, size);
        drop(shard);
        self.used.fetch_sub(freed, std::sync::atomic::Ordering::Relaxed);
        Deleted::Deleted
    }

    /// me: the item's metadata, without marking it read.
    pub fn debug(&self, key: &[u8], now: u32) -> Option<ItemDebug> {
        let (hash, shard) = self.locate(key);
        let mut shard = shard.lock();
        let i = self.live(&mut shard, hash, key, now)?;
        let e = &shard.entries[i as usize];
        let ttl = if e.exptime == 0 { -1 } else { i64::from(e.exptime) - i64::from(now) };
        Some(ItemDebug { ttl, idle_s: now.saturating_sub(e.accessed), cas: e.cas, fetched: e.fetched, class: e.class, size: e.size() })
    }

    /// Change a live item in place when `cas` (non-zero) matches.
    fn with_live(&self, key: &[u8], cas: u64, now: u32, change: impl FnOnce(&mut Entry)) -> Deleted {
        let (hash, shard) = self.locate(key);
        let mut shard = shard.lock();
        let Some(i) = self.live(&mut shard, hash, key, now) else { return Deleted::NotFound };
        let e = &mut shard.entries[i as usize];
        if cas != 0 && e.cas != cas {
            return Deleted::Exists;
        }
        change(e);
        Deleted::Deleted
    }
}
