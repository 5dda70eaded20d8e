//! What every core of the server shares: its settings, the store, the clock, the connection
//! count and the stats Ebb; and the `stats` report built from them.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use sprout_runtime::EbbRef;

use crate::clock::Clock;
use crate::stats::{CoreStats, Counters};
use crate::store::Store;

/// The version `version` reports: memcached's protocol level, then ours.
pub const VERSION: &str = concat!("1.6.0-sprout-", env!("CARGO_PKG_VERSION"));

#[derive(Clone, Debug)]
pub struct Settings {
    /// Address to listen on.
    pub listen: String,
    /// TCP port (0: any free port).
    pub port: u16,
    /// Memory for items, in bytes (`-m` is megabytes).
    pub limit_bytes: usize,
    /// Cores (event loops), `-t`.
    pub cores: usize,
    /// Connections at most, `-c`.
    pub max_conns: usize,
    /// Largest value, `-I`.
    pub item_max: usize,
    /// CPUs to pin cores to (default: this process's affinity mask).
    pub cpus: Option<Vec<usize>>,
    /// Pin each core's thread to one CPU (false: the threads float over the allowed CPUs,
    /// as memcached's do, which is fairer when a core's CPU is shared with other work).
    pub pin: bool,
    /// Microseconds a core keeps polling after its last request before it sleeps.
    pub spin_us: u64,
    /// Microseconds a core polls for the next request while few clients keep it busy.
    pub lone_spin_us: u64,
    /// The most clients a core polls for under `lone_spin_us` (1: a lone client).
    pub poll_clients: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            listen: "127.0.0.1".into(),
            port: 11211,
            limit_bytes: 64 << 20,
            cores: 4,
            max_conns: 1024,
            item_max: 1 << 20,
            cpus: None,
            pin: true,
            spin_us: 0,
            lone_spin_us: LONE_SPIN_US,
            poll_clients: POLL_CLIENTS,
        }
    }
}

/// `--lone-spin-us`'s default: above a lone closed-loop client's idle time between requests
/// on this project's VM (40-60 µs), so its polling starts; one window is what a client that
/// pauses costs.
pub const LONE_SPIN_US: u64 = 200;

/// `--poll-clients`'s default: a lone client. Up to 4 gain on a dedicated core (1.08-1.23x at 4
/// connections on this VM's one core), but where the clients share the core's CPU (2 cores
/// here, beside the generator) polling for them took that CPU from them: 0.61-0.69x.
pub const POLL_CLIENTS: usize = 1;

pub struct Shared {
    pub settings: Settings,
    pub store: Store,
    pub clock: Clock,
    pub stats: EbbRef<CoreStats>,
    /// Open client connections, across cores (checked against `max_conns`).
    pub conns: AtomicUsize,
    pub verbosity: AtomicU32,
    /// `stats detail`'s counts by key prefix.
    pub prefixes: crate::prefix_stats::PrefixStats,
    /// `watch`ing connections and what they watch.
    pub watchers: crate::watch::Watchers,
    /// What `stats conns` lists.
    pub conn_table: crate::conn_table::ConnTable,
    /// Open connections per core: where the next one goes.
    pub loads: crate::core_loads::CoreLoads,
}

impl Shared {
    pub fn new(settings: Settings, stats: EbbRef<CoreStats>) -> Shared {
        Shared {
            store: Store::with_item_max(settings.limit_bytes, settings.item_max),
            clock: Clock::start(),
            loads: crate::core_loads::CoreLoads::new(settings.cores),
            settings,
            stats,
            conns: AtomicUsize::new(0),
            verbosity: AtomicU32::new(0),
            prefixes: Default::default(),
            watchers: Default::default(),
            conn_table: Default::default(),
        }
    }

    /// Add a watcher of `kinds` (`crate::watch`); None at the limit. The store keeps its
    /// evicted items for the log only while someone watches evictions.
    pub fn watch(&self, kinds: u32, wake: Box<dyn Fn() + Send + Sync>) -> Option<std::sync::Arc<crate::watch::Watcher>> {
        let watcher = self.watchers.add(kinds, wake)?;
        self.store.evicted.keep(self.watchers.watching(crate::watch::EVICTIONS));
        Some(watcher)
    }

    pub fn unwatch(&self, watcher: &std::sync::Arc<crate::watch::Watcher>) {
        self.watchers.remove(watcher);
        self.store.evicted.keep(self.watchers.watching(crate::watch::EVICTIONS));
    }

    /// The lines of `stats [group]`, or None for a group memcached does not know; `asking`:
    /// the asking connection's socket (`stats conns` shows it busy).
    pub fn report(&self, group: Option<&[u8]>, counters: &Counters, asking: i32) -> Option<Vec<(String, String)>> {
        let mut lines: Vec<(String, String)> = Vec::new();
        let mut put = |name: &str, value: String| lines.push((name.to_string(), value));
        match group {
            None => {
                let (user, system) = rusage();
                let store = self.store.stats();
                put("pid", std::process::id().to_string());
                put("uptime", self.clock.uptime().to_string());
                put("time", self.clock.unix().to_string());
                put("version", VERSION.to_string());
                put("pointer_size", (8 * std::mem::size_of::<usize>()).to_string());
                put("rusage_user", user);
                put("rusage_system", system);
                put("max_connections", self.settings.max_conns.to_string());
                for (name, value) in counters.fields() {
                    put(name, value.to_string());
                }
                put("limit_maxbytes", store.limit_maxbytes.to_string());
                put("accepting_conns", "1".into());
                put("threads", self.settings.cores.to_string());
                put("bytes", store.bytes.to_string());
                put("curr_items", store.curr_items.to_string());
                put("total_items", store.total_items.to_string());
                put("expired_unfetched", store.expired_unfetched.to_string());
                put("evicted_unfetched", store.evicted_unfetched.to_string());
                put("evictions", store.evictions.to_string());
                put("reclaimed", store.reclaimed.to_string());
                let crawler = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed).to_string();
                put("crawler_reclaimed", crawler(&self.store.crawler_reclaimed));
                put("crawler_items_checked", crawler(&self.store.crawler_checked));
                put("connection_structures", self.conn_table.len().to_string());
                let (watchers, sent, skipped) = self.watchers.counts();
                put("log_watchers", watchers.to_string());
                put("log_watcher_sent", sent.to_string());
                put("log_watcher_skipped", skipped.to_string());
                // True zeros: accepting never stops (a connection past -c is refused alone), no
                // item is reference-locked, there is no SASL, and a connection never yields.
                for name in
                    ["listen_disabled_num", "time_in_listen_disabled_us", "lrutail_reflocked", "auth_cmds", "auth_errors", "conn_yields"]
                {
                    put(name, "0".into());
                }
            }
            Some(b"settings") => {
                let s = &self.settings;
                put("maxbytes", s.limit_bytes.to_string());
                put("maxconns", s.max_conns.to_string());
                put("tcpport", s.port.to_string());
                put("domain_socket", "NULL".into());
                put("udpport", "0".into());
                put("inter", s.listen.clone());
                put("verbosity", self.verbosity.load(Ordering::Relaxed).to_string());
                put("num_threads", s.cores.to_string());
                put("cas_enabled", "yes".into());
                put("item_size_max", s.item_max.to_string());
                put("evictions", "on".into());
                put("binding_protocol", "auto-negotiate".into());
                put("flush_enabled", "yes".into());
                put("auth_enabled_sasl", "no".into());
                put("shutdown_command", "no".into());
                put("lru_crawler", "yes".into());
                // The slab classes stats slabs reports (crate::slab_classes).
                put("growth_factor", "1.25".into());
                put("chunk_size", "48".into());
                put("slab_chunk_max", crate::slab_classes::CHUNK_MAX.to_string());
                put("slab_reassign", "yes".into());
                put("detail_enabled", if self.prefixes.is_on() { "yes" } else { "no" }.into());
            }
            // memcached's per-slab-class figures, for the classes memcached would put the
            // items in (crate::slab_classes).
            Some(b"items") => lines.extend(self.store.classes().items_report()),
            Some(b"slabs") => lines.extend(self.store.classes().slabs_report()),
            Some(b"sizes") => lines.extend(crate::slab_classes::Classes::sizes_report()),
            Some(b"conns") => lines.extend(self.conn_table.report(asking, self.clock.now())),
            // Sprout's own: where the connections live (crate::core_loads), and how each
            // core's polls went (slept; spun in a polling window, and found a request so).
            Some(b"cores") => {
                let polls = sprout_runtime::poll_counts();
                for (core, open) in self.loads.counts().into_iter().enumerate() {
                    put(&format!("core:{core}:curr_connections"), open.to_string());
                    let counts = polls.get(core).copied().unwrap_or_default();
                    put(&format!("core:{core}:polls_slept"), counts.slept.to_string());
                    put(&format!("core:{core}:polls_spun"), counts.spun.to_string());
                    put(&format!("core:{core}:polls_spun_found"), counts.spun_found.to_string());
                }
            }
            Some(_) => return None,
        }
        Some(lines)
    }
}

/// CPU time of the process, as memcached prints it (seconds.microseconds).
fn rusage() -> (String, String) {
    // SAFETY: rusage is plain data, for which all-zero bytes are a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into `usage`, a live local of the right type.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let fmt = |t: libc::timeval| format!("{}.{:06}", t.tv_sec, t.tv_usec);
    (fmt(usage.ru_utime), fmt(usage.ru_stime))
}
