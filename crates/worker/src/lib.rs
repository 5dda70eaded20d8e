//! Sprout's worker: an OpenLambda-compatible serverless worker on SOCK's lean sandboxes.
//!
//! It reads the same way as OpenLambda's worker, one module per layer, a request walking
//! down once and back:
//!
//! * [`api`] — how requests arrive: the HTTP routes (`/run`, `/registry`, `/stats`, ...),
//!   all but `/run` and `/status` behind the worker's token ([`auth`]);
//!   [`app`] — the app port, lambdas served as web sites chosen by host name ([`sites`]),
//!   with [`static_files`] before them.
//! * [`calls`] — a handler's calls to other lambdas (`sprout.invoke`), over its channel.
//! * [`map_routes`] — `/map/<name>`: a lambda over many items, in chunks over its sandboxes
//!   ([`map_run`]), planned by a pure state machine ([`map_plan`]); a handler's calls with
//!   `batch` are the same map.
//! * [`lease_routes`] — `/leases`: N sandboxes of a lambda held for a client's object, calls
//!   run on the part they name; the bookkeeping (idle expiry, lost parts) is [`leases`].
//! * [`registry`] and [`archive`], [`syntax`], [`lambda_config`] — what runs: lambda code and
//!   its `ol.yaml`, uploaded and checked.
//! * [`instances`] — which sandbox serves a request: warm reuse, cold starts, queues; idle
//!   sandboxes paused as the handler cache ([`handler_cache`]); a request whose sandbox died
//!   before answering sent to another when that is safe ([`retry`]). Its decisions are a pure
//!   state machine ([`instances::pools`]), tested against a fake back-end.
//! * [`keepalive`] — the hybrid histogram policy's keep-alive and pre-warm windows, per
//!   lambda (a pure state machine; [`instances`] keeps idle sandboxes for them with
//!   `keep_alive = "histogram"`; pre-warming is not built yet).
//! * [`kafka`] — Kafka triggers: consumers that run a lambda on each message, at least once.
//! * [`networks`] — the network namespace each lambda holds, and the services it may reach.
//! * [`packages`] — a lambda's requirements, resolved and installed once into the install
//!   cache (the import cache of Zygotes lives with the sandboxes).
//! * the sandboxes themselves live in the `sprout-sandbox` crate, behind its `Backend` and
//!   `Sandbox` traits; [`isolation`] decides which of the worker's back-ends (its isolation
//!   classes, held by [`backends`]) runs each lambda.
//!
//! [`config`] is `DIR/config.toml`; [`daemon`] starts, stops and cleans up a worker;
//! [`metrics`] counts for `/stats` and `/metrics`; [`errors`] is every error code the API
//! answers with, and its status.

mod api;
mod app;
mod archive;
mod auth;
mod backends;
mod blobs;
mod budget;
mod bytecode;
mod config;
mod console;
mod cpu_shares;
mod daemon;
mod errors;
mod fleet_routes;
mod handler_cache;
mod instances;
mod invoker;
mod isolation;
mod kafka;
mod keepalive;
mod lambda_config;
mod lease_files;
mod lease_routes;
mod leases;
mod log_routes;
mod logs;
mod map_plan;
mod map_routes;
mod map_run;
mod metrics;
mod networks;
mod packages;
mod preinstall;
mod registry;
mod retry;
mod shared_code;
mod shared_files;
mod shared_registry;
mod site_routes;
mod sites;
mod static_files;
mod syntax;
mod ticker;
mod timeline;

// What other crates name (the command line, the benchmarks); every module stays private.
pub use auth::token::{discovery_path, read_token};
pub use config::Config;
pub use daemon::{cleanup_dir, down, init, serve, status, up_detached, InitOutcome, Status, LOG};
pub use keepalive::{Policy as KeepAlivePolicy, Tracker as KeepAliveTracker};
pub use packages::install_cache::InstallCache;
pub use preinstall::preinstall;
