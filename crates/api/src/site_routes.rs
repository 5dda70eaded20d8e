//! The admin API's `/sites` endpoints: the app port's host-to-lambda table ([`sprout_sites`]),
//! listed, changed and removed at run time (behind the worker's token, as `/registry` is).
//!
//! - `GET /sites`: every site by host (`"*"` is the default one), and where it came from.
//! - `PUT /sites/<host>` with `{"lambda": "olio-a", "static": {"/static/": "/srv/a"}}`: 201
//!   when new, 200 when replaced; 400 `invalid_request` for a bad host, body, lambda name or
//!   directory, or a host `config.toml` defines (change it there). Saved in `DIR/sites.json`.
//! - `DELETE /sites/<host>`: 200, or 404 `site_not_found`.
//!
//! A worker without an app port answers 404 `not_found` to all three.
//!
//! A tenant's key lists, puts and deletes only its own hosts (the first tenant to put a host
//! owns it; a host another principal serves is 409 `name_taken`), for its own lambdas
//! (another's: 404 `lambda_not_found`), and without static directories (they are the host's
//! files: the operator's token); another's host answers 404 `site_not_found`.

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use sprout_engine::ErrorCode;
use sprout_sites::{normalize_host, SiteConfig};

use crate::auth::Principal;
use crate::http::{fail, read_body, ApiError};
use crate::state::{Api, AppSites};
use crate::tenant_routes::store_api_error;

fn sites(api: &Api) -> Result<&AppSites, ApiError> {
    api.sites.as_deref().ok_or_else(|| ApiError::new(ErrorCode::NotFound, "this worker has no app port ([app] listen)"))
}

/// Whether `principal` may see the site of `host`.
fn sees_host(api: &Api, principal: &Principal, host: &str) -> bool {
    match principal {
        Principal::Operator => true,
        Principal::Tenant(grant) => normalize_host(host).is_some_and(|h| api.auth.tenants.host_owner(&h).as_deref() == Some(&grant.tenant)),
    }
}

pub(crate) async fn list(State(api): State<Api>, Extension(principal): Extension<Principal>) -> Response {
    match sites(&api) {
        Ok(s) => {
            let mut listed = s.list();
            listed.retain(|host, _| sees_host(&api, &principal, host));
            axum::Json(listed).into_response()
        }
        Err(e) => fail(e),
    }
}

/// Before a tenant puts `config` for `host`: its lambda is the tenant's, no static
/// directory, and the host its own (claimed now if nobody has it). Ok(Some(host)): claimed now.
fn claim_for_site(api: &Api, sites: &AppSites, principal: &Principal, host: &str, config: &SiteConfig) -> Result<Option<String>, ApiError> {
    let Principal::Tenant(grant) = principal else { return Ok(None) };
    if !config.statics.is_empty() {
        return Err(ApiError::new(ErrorCode::Forbidden, "static directories are the worker host's files: the operator's token sets them"));
    }
    if !grant.sees(&config.lambda, api.auth.tenants.owner(&config.lambda).as_deref()) {
        return Err(ApiError::new(ErrorCode::LambdaNotFound, format!("no lambda named {:?}", config.lambda)));
    }
    let key = normalize_host(host).ok_or_else(|| ApiError::new(ErrorCode::InvalidRequest, format!("{host:?} is not a host name")))?;
    let exists = sites.list().contains_key(&key);
    match api.auth.tenants.claim_host(&key, &grant.tenant, exists).map_err(store_api_error)? {
        true => Ok(Some(key)),
        false => Ok(None),
    }
}

pub(crate) async fn put(
    State(api): State<Api>,
    Extension(principal): Extension<Principal>,
    Path(host): Path<String>,
    body: Body,
) -> Response {
    let sites = match sites(&api) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let body = match read_body(body, 1 << 20).await {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    let config: SiteConfig = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return fail(ApiError::new(ErrorCode::InvalidRequest, format!("a site is {{\"lambda\": ..., \"static\": {{...}}}}: {e}")))
        }
    };
    let claimed_now = match claim_for_site(&api, sites, &principal, &host, &config) {
        Ok(claimed) => claimed,
        Err(e) => return fail(e),
    };
    let put = sites.put(&host, config.clone());
    if let (Err(_), Some(key)) = (&put, &claimed_now) {
        if let Err(e) = api.auth.tenants.release_host(key) {
            tracing::warn!(host = %key, "the failed site's host stays claimed: {e}");
        }
    }
    match put {
        Ok(created) => {
            tracing::info!(host, lambda = %config.lambda, "site {}", if created { "added" } else { "replaced" });
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            (status, axum::Json(json!({"host": host, "site": config}))).into_response()
        }
        Err(message) => fail(ApiError::new(ErrorCode::InvalidRequest, message)),
    }
}

pub(crate) async fn delete(State(api): State<Api>, Extension(principal): Extension<Principal>, Path(host): Path<String>) -> Response {
    let sites = match sites(&api) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    if !sees_host(&api, &principal, &host) {
        return fail(ApiError::new(ErrorCode::SiteNotFound, format!("no site for host {host:?}")));
    }
    match sites.delete(&host) {
        Ok(true) => {
            tracing::info!(host, "site removed");
            if let Some(key) = normalize_host(&host) {
                if let Err(e) = api.auth.tenants.release_host(&key) {
                    tracing::warn!(host = %key, "the removed site's host stays claimed: {e}");
                }
            }
            axum::Json(json!({"deleted": host})).into_response()
        }
        Ok(false) => fail(ApiError::new(ErrorCode::SiteNotFound, format!("no site for host {host:?}"))),
        Err(message) => fail(ApiError::new(ErrorCode::InvalidRequest, message)),
    }
}
