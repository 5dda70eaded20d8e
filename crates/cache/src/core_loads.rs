//! Which core a new connection lives on: the one with the fewest open connections (the
//! accepting core on a tie). SO_REUSEPORT picks the accepting core by a hash of the client's
//! address, which leaves 3 of 4 connections on one of two cores half the time; memcached's
//! listener deals connections to its threads in turn, and so, in effect, does this.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Open connections per core, shared by every core's acceptor.
pub struct CoreLoads {
    open: Box<[AtomicUsize]>,
}

impl CoreLoads {
    pub fn new(cores: usize) -> CoreLoads {
        CoreLoads { open: (0..cores.max(1)).map(|_| AtomicUsize::new(0)).collect() }
    }

    /// A connection was accepted on core `me`: the core it should live on, counted there from
    /// now (two cores placing at once may both see the same counts; each then still places
    /// on a least-loaded core as it saw them, off by one connection at most).
    pub fn place(&self, me: usize) -> usize {
        let counts: Vec<usize> = self.open.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let core = least_loaded(&counts, me);
        self.open[core].fetch_add(1, Ordering::Relaxed);
        core
    }

    /// A connection living on `core` closed.
    pub fn closed(&self, core: usize) {
        let _ = self.open[core].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Open connections on each core.
    pub fn counts(&self) -> Vec<usize> {
        self.open.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }
}

/// The core with the fewest of `open`, `me` if it is one of them, else the lowest-numbered.
pub fn least_loaded(open: &[usize], me: usize) -> usize {
    let fewest = open.iter().copied().min().unwrap_or(0);
    if open.get(me) == Some(&fewest) {
        return me;
    }
    open.iter().position(|&n| n == fewest).unwrap_or(me)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tie_keeps_the_connection_where_it_was_accepted() {
        assert_eq!(least_loaded(&[0, 0], 1), 1);
        assert_eq!(least_loaded(&[3, 2, 2], 2), 2);
    }

    #[test]
    fn otherwise_the_least_loaded_core_takes_it() {
        assert_eq!(least_loaded(&[1, 0], 0), 1);
        assert_eq!(least_loaded(&[5, 2, 2, 4], 3), 1);
        assert_eq!(least_loaded(&[7], 0), 0);
    }

    #[test]
    fn connections_all_accepted_on_one_core_end_up_even() {
        let loads = CoreLoads::new(2);
        let placed: Vec<usize> = (0..16).map(|_| loads.place(0)).collect();
        assert_eq!(loads.counts(), vec![8, 8]);
        assert_eq!(&placed[..4], &[0, 1, 0, 1]);
    }

    #[test]
    fn closing_makes_room_where_it_closed() {
        let loads = CoreLoads::new(3);
        for _ in 0..6 {
            loads.place(0);
        }
        assert_eq!(loads.counts(), vec![2, 2, 2]);
        loads.closed(2);
        assert_eq!(loads.place(0), 2);
        loads.closed(1);
        loads.closed(1);
        loads.closed(1); // one more close than opens: stays at zero
        assert_eq!(loads.counts(), vec![2, 0, 2]);
    }
}
