//! Sandboxes per lambda: who serves a request, and what happens to a sandbox afterwards.
//!
//! A request takes an idle sandbox of its lambda's current version (a warm start) or, while
//! the lambda has fewer than `max_per_lambda` sandboxes and the worker fewer than
//! `max_total`, provisions a new one (a cold start); otherwise it waits in the lambda's
//! bounded queue (429 when full) until a sandbox or room for one is handed to it. After a
//! request a healthy sandbox goes to the next waiter or becomes idle (with `keep_warm`); a
//! failed one, one of a replaced version, one of a lambda whose `ol.yaml` says
//! `reuse-sandbox: false`, or any with `keep_warm = false` is destroyed in the background; a request whose sandbox died before answering runs once more on another when
//! that is safe ([`crate::retry`]). Idle sandboxes are destroyed after their lambda's
//! keep-alive window (from its idle times, [`crate::keepalive`], or `idle_timeout`), and
//! evicted least recently used first when the worker needs room for another lambda. Under a
//! memory budget a cold start is admitted first ([`admission`]): it evicts idle sandboxes,
//! waits for memory, or waits for a sandbox its lambda already has.
//!
//! Idle sandboxes are SOCK's handler cache: each is paused as it goes idle and resumed for
//! the next request; when paused sandboxes together pass their memory limit (PSS, measured
//! when they pause and every few seconds after) the least recently used are evicted
//! ([`crate::handler_cache`]).
//!
//! Every decision is made by [`pools::Pools`], a pure state machine behind one mutex; this
//! module carries its decisions out against a [`Backend`], never holding the mutex across a
//! sandbox operation other than pausing.
//!
//! The parts: [`manager`] carries a request to a sandbox and back; [`pools`] decides; the
//! memory budget's [`admission`]; sandboxes [`held`] for user leases; what a new sandbox is
//! made with ([`prepare`]); sandboxes started as lambdas arrive ([`on_deploy`]); what is
//! counted ([`figures`], [`stats`]).

mod admission;
mod cpu;
mod deploy_starts;
#[cfg(test)]
pub(crate) mod fake;
mod figures;
mod held;
mod kept;
mod manager;
mod on_deploy;
mod outcome;
pub mod pools;
mod prepare;
mod settings;
mod stats;
#[cfg(test)]
mod tests;

pub use figures::SandboxState;
pub use held::Held;
pub use manager::Instances;
pub use outcome::{Failure, Invocation};
pub use prepare::Provisioning;
pub use settings::InstanceConfig;
pub use stats::LambdaFigures;
