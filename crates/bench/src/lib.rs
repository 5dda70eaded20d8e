//! Benchmark drivers behind `sprout bench`: each runs its peers side by side in one run and
//! writes JSON, a markdown table and a PNG plot under bench/results/.
//!
//! * [`sandboxes`]: SOCK figures 14-16 on this machine: cold starts at several concurrency
//!   levels and warm invocations, for every sandbox backend, through the real worker;
//!   [`isolation`] compares the isolated lean sandbox with SOCK's, and with gVisor's, head to
//!   head; [`footprint`] times a new lambda's first cold start and weighs an idle one.
//! * [`asgi`]: an ASGI hello world against the WSGI one, cold and warm, through the worker.
//! * [`packages`]: SOCK figures 17-21: cold starts with and without the install, import and
//!   handler caches, with real and synthetic packages, and the memory the import cache saves.
//! * [`store`]: Mirage figure 3: sprout.store against hand-written sqlite3, SQLAlchemy and
//!   Peewee, and on PostgreSQL (the driver is bench/store_bench.py).
//! * [`cache`]: EbbRT figures 4 and 6: the Sprout cache against Debian's memcached under
//!   memaslap, by connections and by value size, on one core and on two.
//! * [`keepalive`]: the hybrid histogram keep-alive policy against a fixed 10-minute window
//!   and against keeping everything loaded, over a week of a synthetic Azure population
//!   ([`azure`]).
//! * [`fleet`]: Cloudstone for a fleet of mostly idle sites: their load profiles, drawn
//!   from [`azure`], and the search for the most sites a deployment holds.
//! * [`neighbours`]: noisy neighbours: a victim lambda's warm latency alone and beside lambdas
//!   flooding stdout, spinning the CPU or churning memory, on one worker.
//! * [`offload`]: elastic offload: `sprout.map` over a worker's sandboxes against Ray and
//!   `multiprocessing.Pool` on the same two CPUs: no-op tasks per second, a task's round trip,
//!   the makespan of CPU-bound tasks (the driver is bench/offload.py).
//! * [`primitives`]: SOCK section 2 (figures 1-5) on this kernel: bind against overlay
//!   mounts, namespace creation and teardown, cgroup reuse against creation.

pub mod asgi;
pub mod azure;
pub mod cache;
pub mod cache_load;
mod echo;
pub mod fleet;
pub mod fleet_routing;
mod footprint;
mod http;
pub mod isolation;
pub mod keepalive;
mod load_loop;
pub mod neighbours;
pub mod offload;
pub mod packages;
mod parking;
pub mod primitives;
pub mod report;
mod sandbox_worker;
pub mod sandboxes;
pub mod second_kernel;
pub mod store;
pub mod worker;
