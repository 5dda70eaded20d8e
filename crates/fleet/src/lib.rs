//! A fleet of Sprout workers on one machine that looks like one platform: each worker its own
//! host (a network namespace with a veth address, its CPUs, its memory budget), HAProxy from
//! Debian's packages as the one entry point, routing `/run/<lambda>` by the chosen policy.
//!
//! * [`plan`] decides names, addresses and CPUs (pure);
//! * [`haproxy`] writes HAProxy's configuration for a policy (pure);
//! * [`netns`] makes and removes a member's namespace and link;
//! * [`postgres`] runs the fleet's PostgreSQL, which holds the shared registry;
//! * [`worker_config`] writes each worker's config.toml (pure);
//! * [`control`] is `sprout fleet up | down | status | deploy`;
//! * [`membership`] adds and drains workers of a running fleet, through HAProxy's
//!   [`runtime`] API;
//! * [`member`] is a worker's own side of its fleet: the shared registry it follows, the
//!   routes it keeps, and their `[registry]` section of its configuration.

pub mod control;
pub mod haproxy;
pub mod member;
pub mod membership;
pub mod netns;
pub mod plan;
pub mod postgres;
pub mod runtime;
pub mod worker_config;
