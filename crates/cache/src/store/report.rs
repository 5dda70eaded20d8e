//! What the store reports of itself: memcached's `stats` counters, `stats reset`, and the
//! per-slab-class figures and item listing (`stats items|slabs`, `stats cachedump`).

use super::{Classes, Store};

/// Counters of the store, named as memcached's `stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub curr_items: u64,
    pub total_items: u64,
    pub bytes: u64,
    pub evictions: u64,
    pub reclaimed: u64,
    pub expired_unfetched: u64,
    pub evicted_unfetched: u64,
    pub limit_maxbytes: u64,
}

impl Store {
    pub fn stats(&self) -> StoreStats {
        let mut st = StoreStats { limit_maxbytes: self.limit as u64, ..Default::default() };
        for shard in self.shards.iter() {
            let s = shard.lock();
            st.curr_items += s.entries.len() as u64;
            st.total_items += s.total_items;
            st.evictions += s.evictions;
            st.reclaimed += s.reclaimed;
            st.expired_unfetched += s.expired_unfetched;
            st.evicted_unfetched += s.evicted_unfetched;
        }
        st.bytes = self.used() as u64;
        st
    }

    /// Zero the counters `stats reset` resets (not items or bytes).
    pub fn reset_stats(&self) {
        for shard in self.shards.iter() {
            let mut s = shard.lock();
            s.total_items = 0;
            s.evictions = 0;
            s.reclaimed = 0;
            s.expired_unfetched = 0;
            s.evicted_unfetched = 0;
            s.classes.reset();
        }
    }

    /// `stats cachedump`: up to `limit` (0: all) items of slab `class`: key, value length, expiry.
    pub fn dump_class(&self, class: u8, limit: usize) -> Vec<(Vec<u8>, usize, u32)> {
        let mut items = Vec::new();
        for shard in self.shards.iter() {
            let s = shard.lock();
            let of_class = s.entries.iter().map(|(_, e)| e).filter(|e| e.class == class);
            items.extend(of_class.map(|e| (e.key.to_vec(), e.value.len(), e.exptime)).take(limit.wrapping_sub(items.len())));
        }
        items
    }

    /// Every shard's counters by slab class, summed.
    pub fn classes(&self) -> Classes {
        let mut all = Classes::default();
        for shard in self.shards.iter() {
            all.add(&shard.lock().classes);
        }
        all
    }
}
