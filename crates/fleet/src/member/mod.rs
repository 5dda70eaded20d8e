//! A worker's side of a fleet: following the fleet's one registry in PostgreSQL
//! ([`shared_registry`]), and keeping, in the fleet HAProxy's routes map, the route of each
//! lambda uploaded through this worker ([`routes`], package-aware routing). Both are features
//! on the worker's engine: the registry's changes become its arrivals and deletions, and the
//! routes a [`sprout_engine::LambdaWatcher`].

pub mod config;
pub mod routes;
pub mod shared_registry;

pub use config::RegistrySection;
pub use routes::FleetRoutes;
pub use shared_registry::SharedRegistry;
