//! `[registry]`: where a worker's lambdas are kept beyond it (the fleet's shared registry) and
//! where it keeps their routes (the fleet HAProxy's routes map).

use serde::{Deserialize, Serialize};

/// Where lambdas' code is kept beyond this worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistrySection {
    /// A PostgreSQL connection string: the fleet's shared registry, which this worker stores
    /// its uploads in and follows; empty: this worker's own registry only.
    pub shared: String,
    /// How often the shared registry is read when no notification came, milliseconds.
    pub poll_ms: u64,
    /// Package-aware routing: the fleet HAProxy's runtime API socket and its routes map, where
    /// a lambda uploaded through this worker is routed by its largest package ([`super::routes`]).
    /// Empty: none.
    pub routes_socket: String,
    pub routes_map: String,
}

impl Default for RegistrySection {
    fn default() -> Self {
        RegistrySection { shared: String::new(), poll_ms: 1000, routes_socket: String::new(), routes_map: String::new() }
    }
}
