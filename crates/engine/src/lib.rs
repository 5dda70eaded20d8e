//! Sprout's worker engine: what runs lambdas, with no HTTP in it. The layers above
//! (`sprout-offload`, `sprout-triggers`, `sprout-sites`, the fleet's member side, and the HTTP
//! edge `sprout-api`) turn their requests into calls on [`Engine`]; the engine never knows
//! them, except as the [`LambdaWatcher`]s and [`BatchCalls`] they hand it at start.
//!
//! It reads top-down, as OpenLambda's `lambda/` layer over `sandbox/`:
//!
//! * [`Engine`] — the engine as one: started from [`config::EngineConfig`] on a claimed
//!   [`Host`], told of lambdas that arrive and go, shut down.
//! * [`invoker`] — the one invocation path: every way a lambda runs (`/run`, the app port,
//!   `sprout.invoke`, Kafka, maps, leases) is a [`invoker::Call`], checked, run, counted and
//!   logged there; request ids come from it too.
//! * [`instances`] — which sandbox serves a request: warm reuse, cold starts, queues; idle
//!   sandboxes paused as the handler cache ([`handler_cache`]), kept for each lambda's
//!   window ([`keepalive`]), evicted under one memory budget ([`budget`]); a request whose
//!   sandbox died sent to another when safe ([`retry`]); CPU shared by weight
//!   ([`cpu_shares`], [`ticker`]). Its decisions are a pure state machine
//!   ([`instances::pools`]), tested against a fake back-end.
//! * [`registry`] — what runs: lambda code and its `ol.yaml`, uploaded and checked.
//! * [`packages`] — a lambda's requirements, resolved and installed once into the install
//!   cache (the import cache of Zygotes lives with the sandboxes).
//! * [`networks`] — the network namespace each lambda holds; [`isolation`] and [`backends`]
//!   — which back-end (isolation class) runs each lambda; [`sandboxes`] builds them all from
//!   the configuration. The sandboxes themselves are `sprout-sandbox`'s.
//! * [`logs`] — every line a handler writes, tagged by request; [`metrics`] — what `/stats`
//!   and `/metrics` show ([`histograms`], [`timeline`]).
//! * [`errors`] — every error code the worker answers with, and its status; [`names`] —
//!   what a lambda may be called; [`config`] — the engine's sections of `config.toml`.

mod backends;
mod budget;
pub mod config;
mod cpu_shares;
mod engine;
mod errors;
mod handler_cache;
mod histograms;
mod instances;
mod invoker;
mod isolation;
mod keepalive;
mod logs;
mod metrics;
mod names;
mod networks;
mod packages;
mod registry;
mod retry;
mod sandboxes;
mod ticker;
mod timeline;

// What the layers above name; every module but the configuration's stays private.
pub use cpu_shares::CpuYield;
pub use engine::{Engine, Extensions, LambdaWatcher, Origin};
pub use errors::{handler_error, Error, ErrorCode};
pub use instances::{Held, Invocation};
pub use invoker::{handler_failure, BatchCalls, Call, CallPolicy, Invoker};
pub use keepalive::{Policy as KeepAlivePolicy, Tracker as KeepAliveTracker};
pub use logs::{Entry as LogEntry, LogGroups, Query as LogQuery, Trigger};
pub use metrics::Metrics;
pub use names::valid_name;
pub use packages::install_cache::{InstallCache, InstalledPackage};
pub use packages::requirements::{parse as parse_requirements, Requirement};
pub use registry::{InvokeAuth, KafkaTrigger, Lambda, LambdaConfig, UploadError};
pub use sandboxes::{make_packages, Host, MakeBackend};
