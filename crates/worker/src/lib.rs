//! Sprout's worker: an OpenLambda-compatible serverless worker on SOCK's lean sandboxes. This
//! crate is its top: the configuration file ([`Config`], every section from the layer it
//! configures), the life cycle (`init`, `up`, `down`, `status`, `cleanup`), and the wiring of
//! the layers below, which Cargo keeps in one direction (docs/architecture.md):
//!
//! * `sprout-api` — the HTTP edge: routes, auth, console, the app port; it turns requests
//!   into calls on the engine and the features;
//! * the features on the engine — `sprout-offload` (maps, leases, blobs),
//!   `sprout-triggers` (Kafka), `sprout-sites` (the app port's sites), `sprout-fleet`'s
//!   member side (the shared registry, routes);
//! * `sprout-engine` — the registry, instances and pools, the invoker, packages, networks,
//!   logs, metrics; no HTTP;
//! * `sprout-sandbox` — the sandboxes themselves.
//!
//! [`daemon`] starts, stops and cleans up a worker; [`preinstall`] fills its install cache
//! ahead of time.

mod config;
mod daemon;
mod preinstall;

// What other crates name (the command line, the benchmarks); every module stays private.
pub use config::{Config, WorkerSection, TEMPLATE};
pub use daemon::{cleanup_dir, down, init, running_pid, serve, status, up_detached, InitOutcome, Status, LOG};
pub use preinstall::preinstall;
pub use sprout_api::auth::token::{discovery_path, read_token};
pub use sprout_engine::InstallCache;
pub use sprout_engine::{KeepAlivePolicy, KeepAliveTracker};
