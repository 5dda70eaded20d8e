//! The worker API's routes: OpenLambda's, and the admin API's, each to its handler module.
//!
//! | Route                          | Does                                                      |
//! |--------------------------------|-----------------------------------------------------------|
//! | `POST /run/<name>[/<path>]`    | runs the lambda: JSON to `f(event)`, or HTTP to a WSGI `app` |
//! | `POST /map/<name>[?chunk=N]`   | runs `f(event)` on each item of a JSON array, in chunks over its sandboxes ([`crate::map_routes`]) |
//! | `POST /leases/<name>`          | holds N sandboxes of the lambda for a client's object (201) ([`crate::lease_routes`]) |
//! | `POST /leases/<id>/<part>`     | runs `f(event)` on that part's sandbox, answering as `/run` |
//! | `POST /leases/<id>/keepalive`  | resets the lease's idle clock                             |
//! | `DELETE /leases/<id>`          | releases the lease (its sandboxes are destroyed)          |
//! | `GET /leases`                  | lists the leases                                          |
//! | `PUT`/`GET /leases/<id>/files/<file>` | writes or reads a file of the lease's directory    |
//! | `PUT`/`GET`/`DELETE /blobs/<name>` | a map's large item or result ([`crate::blob_routes`])        |
//! | `POST /registry/<name>`        | uploads a tar.gz of the lambda's directory (201)          |
//! | `GET /registry`                | lists lambda names                                        |
//! | `GET /registry/<name>`         | the lambda's metadata                                     |
//! | `DELETE /registry/<name>`      | removes it                                                |
//! | `GET /status`, `/pid`          | `ready`, the worker's pid                                 |
//! | `GET /stats`, `GET /metrics`   | JSON figures; Prometheus text                             |
//! | `GET /packages`                | the install cache's packages                              |
//! | `/tenants...`                  | tenants and their keys, the operator's ([`crate::tenant_routes`]) |
//! | `GET /audit[?limit=N]`         | the control plane's changes the caller may see ([`crate::audit_routes`]) |
//!
//! Every route but `/run/...`, `/map/...` and `GET /status` needs the worker's token
//! ([`crate::auth`]); a tenant's key reaches `/registry`, `/logs` and `/audit`, for its own lambdas.
//!
//! Every failure answers with JSON `{"error": <code>, "message": ...}` and a status that says
//! whose fault it was; the codes are [`ErrorCode`]'s and never change meaning. The app port
//! ([`crate::app_port`]) sends requests to its lambda through the same [`crate::run::forward`]
//! as `/run`.

use axum::routing::{any, delete, get, post, put};
use axum::Router;

use crate::http::{count_errors, tag_request, ApiError};
use crate::state::Api;
use crate::{
    audit_routes, auth, blob_routes, console, lease_routes, log_routes, map_routes, registry_routes, run, site_routes, stats_routes,
    tenant_routes,
};
use sprout_engine::ErrorCode;

/// Build the router: every route, and the fallbacks, behind the token check. Errors are
/// counted in `metrics` by code.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/run/{name}", any(run::run))
        .route("/run/{name}/", any(run::run))
        .route("/run/{name}/{*rest}", any(run::run))
        .route("/map/{name}", post(map_routes::map))
        .route("/leases", get(lease_routes::list))
        .route("/leases/{key}", post(lease_routes::create).delete(lease_routes::release))
        .route("/leases/{id}/{part}", post(lease_routes::call))
        .route("/leases/{id}/files/{file}", get(lease_routes::get_file).put(lease_routes::put_file))
        .route("/blobs/{name}", get(blob_routes::get).put(blob_routes::put).delete(blob_routes::delete))
        .route("/registry", get(registry_routes::list_lambdas))
        .route(
            "/registry/{name}",
            get(registry_routes::show_lambda)
                .post(registry_routes::upload)
                .put(registry_routes::upload)
                .delete(registry_routes::delete_lambda),
        )
        .route("/status", get(|| async { "ready\n" }))
        .route("/pid", get(|| async { format!("{}\n", std::process::id()) }))
        .route("/stats", get(stats_routes::stats))
        .route("/stats/history", get(log_routes::history))
        .route("/logs", get(log_routes::find_request))
        .route("/logs/{name}", get(log_routes::lambda_logs))
        .route("/metrics", get(stats_routes::metrics))
        .route("/packages", get(stats_routes::list_packages))
        .route("/sites", get(site_routes::list))
        .route("/sites/{host}", put(site_routes::put).delete(site_routes::delete))
        .route("/audit", get(audit_routes::read))
        .route("/tenants", get(tenant_routes::list).post(tenant_routes::add))
        .route("/tenants/{tenant}", get(tenant_routes::show).delete(tenant_routes::remove))
        .route("/tenants/{tenant}/quotas", put(tenant_routes::set_quotas))
        .route("/tenants/{tenant}/isolation", put(tenant_routes::set_isolation))
        .route("/tenants/{tenant}/keys", get(tenant_routes::keys).post(tenant_routes::issue))
        .route("/tenants/{tenant}/keys/{id}", delete(tenant_routes::revoke))
        .merge(console::routes())
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such endpoint") })
        .method_not_allowed_fallback(|| async { ApiError::new(ErrorCode::MethodNotAllowed, "method not allowed here") })
        .layer(axum::middleware::from_fn_with_state(api.auth.clone(), auth::require_token))
        .layer(axum::middleware::from_fn_with_state(api.clone(), audit_routes::record))
        .layer(axum::middleware::map_response_with_state(api.engine.metrics.clone(), count_errors))
        .layer(axum::middleware::from_fn_with_state(api.engine.invoker.clone(), tag_request))
        .with_state(api)
}
