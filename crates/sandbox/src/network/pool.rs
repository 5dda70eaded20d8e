//! Which namespaces to make next: the slots of a block (lowest free first, so addresses are
//! reused and interface names stay short) and how many ready namespaces the pool lacks.
//! Pure bookkeeping; [`super::Network`] does the making.

use std::collections::BTreeSet;

/// The slots of a block: taken ones, and free ones below the highest ever taken.
#[derive(Debug)]
pub struct Slots {
    limit: u32,
    next: u32,
    free: BTreeSet<u32>,
}

impl Slots {
    pub fn new(limit: u32) -> Slots {
        Slots { limit, next: 0, free: BTreeSet::new() }
    }

    /// The lowest free slot; None when every slot is taken.
    pub fn take(&mut self) -> Option<u32> {
        if let Some(slot) = self.free.pop_first() {
            return Some(slot);
        }
        (self.next < self.limit).then(|| {
            self.next += 1;
            self.next - 1
        })
    }

    pub fn give_back(&mut self, slot: u32) {
        debug_assert!(slot < self.next && !self.free.contains(&slot));
        if slot + 1 == self.next {
            self.next -= 1;
            while self.next > 0 && self.free.remove(&(self.next - 1)) {
                self.next -= 1;
            }
        } else {
            self.free.insert(slot);
        }
    }

    pub fn in_use(&self) -> u32 {
        self.next - self.free.len() as u32
    }
}

/// How many namespaces to make now so that `ready` (plus those being made) reaches `target`,
/// without passing `max_total` namespaces in all (`in_use` counts ready, assigned and being
/// made ones).
pub fn shortfall(target: usize, ready: usize, making: usize, in_use: usize, max_total: usize) -> usize {
    let want = target.saturating_sub(ready + making);
    want.min(max_total.saturating_sub(in_use))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_lowest_first() {
        let mut s = Slots::new(4);
        assert_eq!([s.take(), s.take(), s.take()], [Some(0), Some(1), Some(2)]);
        s.give_back(1);
        assert_eq!(s.in_use(), 2);
        assert_eq!(s.take(), Some(1));
        assert_eq!(s.take(), Some(3));
        assert_eq!(s.take(), None);
        for slot in [3, 2, 0, 1] {
            s.give_back(slot);
        }
        assert_eq!(s.in_use(), 0);
        assert_eq!(s.take(), Some(0));
    }

    #[test]
    fn giving_back_the_top_slots_shrinks_the_range() {
        let mut s = Slots::new(10);
        for _ in 0..5 {
            s.take();
        }
        s.give_back(2);
        s.give_back(3);
        s.give_back(4);
        assert_eq!(s.next, 2);
        assert!(s.free.is_empty());
    }

    #[test]
    fn the_pool_fills_to_its_target_within_the_total() {
        assert_eq!(shortfall(4, 0, 0, 0, 100), 4);
        assert_eq!(shortfall(4, 2, 1, 10, 100), 1);
        assert_eq!(shortfall(4, 5, 0, 10, 100), 0);
        assert_eq!(shortfall(4, 0, 0, 98, 100), 2);
        assert_eq!(shortfall(4, 0, 0, 120, 100), 0);
    }
}
