//! Sprout's HTTP edge: OpenLambda's worker API and the admin API on `worker.listen`, and the
//! app port serving lambdas as web sites. It only turns requests into typed calls on the
//! engine and the features built on it ([`Api`] holds them), and their errors into responses
//! ([`http::ApiError`]); it decides nothing about sandboxes.
//!
//! * [`routes`] — every route of the API, each to its handler module: [`run`] (`/run`),
//!   [`registry_routes`], [`stats_routes`], [`map_routes`], [`lease_routes`],
//!   [`blob_routes`] (with [`files`]), [`log_routes`], [`site_routes`], [`tenant_routes`],
//!   and the web [`console`];
//! * [`auth`] — who may use which endpoint: the worker's token ([`auth::token`]), tenants'
//!   keys ([`auth::tenants`]) and the console's session;
//! * [`quotas`] — tenants' quotas and what they use against them; [`stored_files`] — their
//!   blobs' and leases' files' bytes against `files_mb`; [`blob_owners`] — who uploaded
//!   each blob; [`tenant_policies`] — what the engine asks of the tenants (CPU yield, log
//!   groups);
//! * [`app_port`] — the app port (`[app]`, [`app_config`]): sites by host name, their
//!   [`static_files`] before their lambda;
//! * [`audit`] — the audit log of the control plane's changes ([`audit_routes`]: recording
//!   them, `GET /audit`);
//! * [`http`] — what every route shares: errors as responses, bodies within limits, request
//!   ids.

pub mod app_config;
pub mod app_port;
pub mod audit;
mod audit_routes;
pub mod auth;
pub mod blob_owners;
mod blob_routes;
mod console;
mod files;
pub mod http;
mod lease_routes;
mod log_routes;
mod map_routes;
pub mod quotas;
mod registry_routes;
pub mod routes;
mod run;
mod site_routes;
mod state;
pub mod static_files;
mod stats_routes;
pub mod stored_files;
pub mod tenant_policies;
mod tenant_routes;

use std::future::Future;
use std::net::SocketAddr;

pub use app_config::AppSection;
pub use app_port::AppPort;
pub use auth::{Discovery, Guard, Tenants, Token};
pub use state::{Api, ApiParts, AppSites};

/// Serve the API on `listener` until `shutdown` completes, then finish the requests under way.
pub async fn serve(
    listener: tokio::net::TcpListener,
    api: Api,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = routes::router(api);
    axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>()).with_graceful_shutdown(shutdown).await
}
