//! memcached's slab classes as Sprout's store reports them (`stats slabs`, `stats items`).
//!
//! Sprout's store is not slab-based: every item is its own allocation. Clients, tests and
//! monitoring still read memcached's per-class figures (`items:N:number`, `N:used_chunks`,
//! `mem_requested`, `evicted`, `reclaimed`), so each item is counted in the class memcached
//! 1.6 would put it in with its defaults (`-n 48 -f 1.25`, 1 MiB pages, chunks up to half a
//! page; larger items in the largest class, one chunk per half page), and the per-class
//! counters are kept beside each shard's items, under its lock. Pages are what a slab
//! allocator would need for the class's items; memory is not reserved by class.

use std::sync::LazyLock;

/// The largest chunk (`slab_chunk_max`): half a 1 MiB page.
pub const CHUNK_MAX: usize = 512 << 10;
const PAGE: usize = 1 << 20;
/// memcached's ceiling on the number of classes.
pub const MAX_CLASSES: usize = 64;

/// The chunk size of each class, from class 1 (index 0): memcached's `slabs_init` with its
/// defaults.
pub static SIZES: LazyLock<Vec<usize>> = LazyLock::new(|| {
    let mut sizes = Vec::new();
    let mut size: usize = 48 + 48; // sizeof(item) + the smallest chunk's data
    while sizes.len() + 2 < MAX_CLASSES && (size as f64) < CHUNK_MAX as f64 / 1.25 {
        size = size.div_ceil(8) * 8;
        sizes.push(size);
        size = (size as f64 * 1.25) as usize;
    }
    sizes.push(CHUNK_MAX);
    sizes
});

/// The class (from 1) of an item of `size` bytes as memcached counts them.
pub fn class_of(size: usize) -> u8 {
    let index = SIZES.partition_point(|&chunk| chunk < size).min(SIZES.len() - 1);
    (index + 1) as u8
}

/// Chunks an item of `size` bytes takes in its class: one, or one per half page beyond that.
fn chunks_of(size: usize) -> u64 {
    size.div_ceil(CHUNK_MAX).max(1) as u64
}

/// One class's counters in one shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassCounts {
    pub number: u64,
    pub chunks: u64,
    pub requested: u64,
    pub evicted: u64,
    pub evicted_nonzero: u64,
    pub reclaimed: u64,
    pub expired_unfetched: u64,
    pub evicted_unfetched: u64,
    pub get_hits: u64,
    pub cmd_set: u64,
    pub delete_hits: u64,
    pub incr_hits: u64,
    pub decr_hits: u64,
    pub cas_hits: u64,
    pub cas_badval: u64,
    pub touch_hits: u64,
}

impl ClassCounts {
    fn add(&mut self, o: &ClassCounts) {
        self.number += o.number;
        self.chunks += o.chunks;
        self.requested += o.requested;
        self.evicted += o.evicted;
        self.evicted_nonzero += o.evicted_nonzero;
        self.reclaimed += o.reclaimed;
        self.expired_unfetched += o.expired_unfetched;
        self.evicted_unfetched += o.evicted_unfetched;
        self.get_hits += o.get_hits;
        self.cmd_set += o.cmd_set;
        self.delete_hits += o.delete_hits;
        self.incr_hits += o.incr_hits;
        self.decr_hits += o.decr_hits;
        self.cas_hits += o.cas_hits;
        self.cas_badval += o.cas_badval;
        self.touch_hits += o.touch_hits;
    }

    /// The counters `stats reset` zeroes (not the items held).
    fn reset(&mut self) {
        *self = ClassCounts { number: self.number, chunks: self.chunks, requested: self.requested, ..ClassCounts::default() };
    }
}

/// Every class's counters in one shard.
#[derive(Clone)]
pub struct Classes(Box<[ClassCounts; MAX_CLASSES]>);

impl Default for Classes {
    fn default() -> Classes {
        Classes(Box::new([ClassCounts::default(); MAX_CLASSES]))
    }
}

impl Classes {
    pub fn of(&mut self, class: u8) -> &mut ClassCounts {
        &mut self.0[class as usize]
    }

    /// An item of `size` bytes came into `class`.
    pub fn held(&mut self, class: u8, size: usize) {
        let c = self.of(class);
        c.number += 1;
        c.chunks += chunks_of(size);
        c.requested += size as u64;
    }

    /// An item of `size` bytes left `class`.
    pub fn released(&mut self, class: u8, size: usize) {
        let c = self.of(class);
        c.number = c.number.saturating_sub(1);
        c.chunks = c.chunks.saturating_sub(chunks_of(size));
        c.requested = c.requested.saturating_sub(size as u64);
    }

    /// Every item is gone (flush_all): nothing held, the operations' counters kept.
    pub fn emptied(&mut self) {
        for c in self.0.iter_mut() {
            (c.number, c.chunks, c.requested) = (0, 0, 0);
        }
    }

    pub fn add(&mut self, other: &Classes) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0.iter()) {
            mine.add(theirs);
        }
    }

    pub fn reset(&mut self) {
        self.0.iter_mut().for_each(ClassCounts::reset);
    }

    /// `stats slabs`: each class that holds items, then `active_slabs` and `total_malloced`.
    pub fn slabs_report(&self) -> Vec<(String, String)> {
        let mut lines = Vec::new();
        let (mut active, mut malloced) = (0, 0);
        for (class, c) in self.0.iter().enumerate().skip(1).filter(|(_, c)| c.number > 0 || c.cmd_set > 0) {
            let size = SIZES[class - 1];
            let per_page = (PAGE / size) as u64;
            let pages = c.chunks.div_ceil(per_page).max(1);
            active += 1;
            malloced += pages * PAGE as u64;
            let mut put = |name: &str, value: u64| lines.push((format!("{class}:{name}"), value.to_string()));
            put("chunk_size", size as u64);
            put("chunks_per_page", per_page);
            put("total_pages", pages);
            put("total_chunks", pages * per_page);
            put("used_chunks", c.chunks);
            put("free_chunks", pages * per_page - c.chunks);
            put("free_chunks_end", 0);
            put("get_hits", c.get_hits);
            put("cmd_set", c.cmd_set);
            put("delete_hits", c.delete_hits);
            put("incr_hits", c.incr_hits);
            put("decr_hits", c.decr_hits);
            put("cas_hits", c.cas_hits);
            put("cas_badval", c.cas_badval);
            put("touch_hits", c.touch_hits);
        }
        lines.push(("active_slabs".into(), active.to_string()));
        lines.push(("total_malloced".into(), malloced.to_string()));
        lines
    }

    /// `stats items`: each class that holds items (one LRU: all of them counted cold).
    pub fn items_report(&self) -> Vec<(String, String)> {
        let mut lines = Vec::new();
        for (class, c) in self.0.iter().enumerate().skip(1).filter(|(_, c)| c.number > 0) {
            let mut put = |name: &str, value: u64| lines.push((format!("items:{class}:{name}"), value.to_string()));
            put("number", c.number);
            put("number_hot", 0);
            put("number_warm", 0);
            put("number_cold", c.number);
            put("mem_requested", c.requested);
            put("evicted", c.evicted);
            put("evicted_nonzero", c.evicted_nonzero);
            put("outofmemory", 0);
            put("reclaimed", c.reclaimed);
            put("expired_unfetched", c.expired_unfetched);
            put("evicted_unfetched", c.evicted_unfetched);
        }
        lines
    }

    /// `stats sizes`: memcached's histogram of items by size in 32-byte buckets (its
    /// `-o track_sizes`); the items' sizes are not kept by bucket here, so it answers as
    /// memcached does with tracking off.
    pub fn sizes_report() -> Vec<(String, String)> {
        vec![("sizes_status".into(), "disabled".into())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classes_are_memcached_defaults() {
        assert_eq!(SIZES.len(), 39);
        assert_eq!(&SIZES[..4], &[96, 120, 152, 192]);
        assert_eq!((SIZES[29], SIZES[30]), (66232, 82792));
        assert_eq!(*SIZES.last().unwrap(), CHUNK_MAX);
        assert_eq!((class_of(1), class_of(96), class_of(97), class_of(66622)), (1, 1, 2, 31));
        assert_eq!(class_of(5 << 20), 39, "a large item goes in the largest class");
    }

    #[test]
    fn items_are_counted_in_and_out_and_reported() {
        let mut classes = Classes::default();
        classes.held(1, 66);
        classes.held(1, 70);
        classes.of(1).cmd_set += 2;
        classes.held(39, 600 << 10);
        classes.released(1, 70);
        let items = classes.items_report();
        assert!(items.contains(&("items:1:number".into(), "1".into())));
        assert!(items.contains(&("items:1:mem_requested".into(), "66".into())));
        let slabs = classes.slabs_report();
        assert!(slabs.contains(&("39:used_chunks".into(), "2".into())), "two half pages");
        assert!(slabs.contains(&("1:cmd_set".into(), "2".into())));
        assert!(slabs.contains(&("active_slabs".into(), "2".into())));
        let mut sum = Classes::default();
        sum.add(&classes);
        sum.add(&classes);
        assert_eq!(sum.of(1).number, 2);
        sum.reset();
        assert_eq!((sum.of(1).number, sum.of(1).cmd_set), (2, 0));
    }
}
