//! `sprout-cache`: a memcached-compatible cache server on `sprout-runtime`, after EbbRT's.
//!
//! Each core accepts its own connections and answers every request it reads on that core,
//! start to finish, in one event: parse, look up, reply. The items live in one sharded store
//! (`store`), the counters in a per-core Ebb (`stats`) gathered for `stats`, and values go
//! out by reference (`output`). The protocol state machine (`session`, with `ascii`,
//! `binary` and `meta` under it) knows nothing of sockets, so it is fuzzed alone; the three
//! protocols only parse and reply, and `exec` runs every command against the store and
//! counts it. What they all share (`Env`, `Next`, `StoreOp`...) sits in `request`, below
//! every one of them; `session` re-exports it.

pub mod ascii;
pub mod binary;
pub mod clock;
pub mod conn;
pub mod conn_table;
pub mod core_loads;
pub mod evicted_log;
pub mod exec;
pub mod meta;
pub mod output;
pub mod prefix_stats;
mod request;
pub mod server;
pub mod session;
pub mod shared;
pub mod slab_classes;
pub mod stats;
pub mod store;
pub mod text;
pub mod watch;

pub use server::Server;
pub use shared::Settings;
