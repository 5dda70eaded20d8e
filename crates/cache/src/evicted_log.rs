//! The items the store evicts, kept for the evictions log only while someone watches
//! evictions (`watch evictions`): one relaxed load per eviction otherwise.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// An evicted item, as the evictions log line describes it.
pub struct Evicted {
    pub key: Box<[u8]>,
    pub size: usize,
    pub fetched: bool,
    /// Its expiry (relative time; 0 = never), and when it was stored.
    pub exptime: u32,
    pub stored_at: u32,
    pub class: u8,
}

#[derive(Default)]
pub struct EvictedLog {
    on: AtomicBool,
    items: Mutex<Vec<Evicted>>,
}

impl EvictedLog {
    /// Keep evicted items (or stop, dropping what was kept).
    pub fn keep(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
        if !on {
            self.items.lock().clear();
        }
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub fn record(&self, item: Evicted) {
        self.items.lock().push(item);
    }

    pub fn take(&self) -> Vec<Evicted> {
        std::mem::take(&mut *self.items.lock())
    }
}
