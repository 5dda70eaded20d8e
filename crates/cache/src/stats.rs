//! The server's counters, as an Ebb: each core counts its own requests in its own
//! representative (plain cells, no atomics, no locks), and `stats` gathers and sums them.
//! The names are memcached's.

use std::cell::Cell;
use std::sync::Arc;

use sprout_runtime::{CoreId, Ebb};

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// One core's counters (the Ebb representative).
        pub struct CoreStats {
            core: CoreId,
            cores: u64,
            /// This core's cas sequence: cas = seq * cores + core + 1, unique across cores.
            cas_seq: Cell<u64>,
            $(pub $name: Cell<u64>,)*
        }

        /// The counters summed over cores.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Counters {
            $(pub $name: u64,)*
        }

        impl CoreStats {
            /// A core's representative with every counter at zero.
            fn zeroed(core: CoreId, cores: usize) -> CoreStats {
                CoreStats { core, cores: cores.max(1) as u64, cas_seq: Cell::new(0), $($name: Cell::new(0),)* }
            }

            pub fn snapshot(&self) -> Counters {
                Counters { $($name: self.$name.get(),)* }
            }

            pub fn reset(&self) {
                $(self.$name.set(0);)*
            }
        }

        impl Counters {
            pub fn add(&mut self, other: &Counters) {
                $(self.$name += other.$name;)*
            }

            /// (name, value) in memcached's order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }
        }
    };
}

counters!(
    curr_connections,
    total_connections,
    rejected_connections,
    cmd_get,
    cmd_set,
    cmd_flush,
    cmd_touch,
    cmd_meta,
    get_hits,
    get_misses,
    get_expired,
    get_flushed,
    delete_misses,
    delete_hits,
    incr_misses,
    incr_hits,
    decr_misses,
    decr_hits,
    cas_misses,
    cas_hits,
    cas_badval,
    touch_hits,
    touch_misses,
    store_too_large,
    store_no_memory,
    bytes_read,
    bytes_written,
);

impl CoreStats {
    #[inline]
    pub fn bump(cell: &Cell<u64>) {
        cell.set(cell.get() + 1);
    }

    #[inline]
    pub fn add(cell: &Cell<u64>, n: u64) {
        cell.set(cell.get() + n);
    }

    /// A cas unique no other core hands out.
    #[inline]
    pub fn next_cas(&self) -> u64 {
        let seq = self.cas_seq.get() + 1;
        self.cas_seq.set(seq);
        seq * self.cores + self.core as u64 + 1
    }
}

/// What the representatives share: the number of cores (for cas spacing).
pub struct StatsRoot {
    pub cores: usize,
}

impl Ebb for CoreStats {
    type Root = StatsRoot;

    fn create_rep(root: &Arc<StatsRoot>, core: CoreId) -> CoreStats {
        CoreStats::zeroed(core, root.cores)
    }
}
