//! The disk budget of parked pods: their images' bytes, oldest parked first, and which to
//! evict when one more does not fit. A pure ledger; the back-end removes what it names.

use std::collections::VecDeque;

/// Parked images, oldest first, against `budget` bytes.
pub(crate) struct DiskLedger<T> {
    budget: u64,
    images: VecDeque<(T, u64)>,
    total: u64,
}

impl<T: PartialEq> DiskLedger<T> {
    pub fn new(budget: u64) -> DiskLedger<T> {
        DiskLedger { budget, images: VecDeque::new(), total: 0 }
    }

    /// Count `who`'s image of `bytes`; returns those to evict so the rest fit, oldest first
    /// (`who` itself last of all, when it alone is over the budget). What is returned is
    /// no longer counted.
    pub fn park(&mut self, who: T, bytes: u64) -> Vec<T> {
        self.images.push_back((who, bytes));
        self.total += bytes;
        let mut evicted = Vec::new();
        while self.total > self.budget {
            let Some((oldest, bytes)) = self.images.pop_front() else { break };
            self.total -= bytes;
            evicted.push(oldest);
        }
        evicted
    }

    /// `who`'s image is gone (restored, or its lambda's sandboxes went): no longer counted.
    pub fn remove(&mut self, who: &T) {
        if let Some(at) = self.images.iter().position(|(w, _)| w == who) {
            let (_, bytes) = self.images.remove(at).expect("a position found");
            self.total -= bytes;
        }
    }

    /// Images counted, and their bytes.
    pub fn usage(&self) -> (usize, u64) {
        (self.images.len(), self.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_until_the_newest_fits() {
        let mut ledger = DiskLedger::new(100);
        assert!(ledger.park("a", 40).is_empty());
        assert!(ledger.park("b", 40).is_empty());
        assert_eq!(ledger.usage(), (2, 80));
        assert_eq!(ledger.park("c", 50), vec!["a"]);
        assert_eq!(ledger.usage(), (2, 90));
        assert_eq!(ledger.park("d", 95), vec!["b", "c"]);
        assert_eq!(ledger.usage(), (1, 95));
    }

    #[test]
    fn an_image_over_the_whole_budget_is_evicted_itself() {
        let mut ledger = DiskLedger::new(100);
        ledger.park("a", 10);
        assert_eq!(ledger.park("huge", 101), vec!["a", "huge"]);
        assert_eq!(ledger.usage(), (0, 0));
    }

    #[test]
    fn a_restored_image_frees_its_bytes_and_keeps_the_order() {
        let mut ledger = DiskLedger::new(100);
        ledger.park("a", 30);
        ledger.park("b", 30);
        ledger.park("c", 30);
        ledger.remove(&"b");
        ledger.remove(&"nobody");
        assert_eq!(ledger.usage(), (2, 60));
        assert_eq!(ledger.park("d", 60), vec!["a"]);
        assert_eq!(ledger.park("e", 10), Vec::<&str>::new());
        assert_eq!(ledger.usage(), (3, 100));
    }
}
