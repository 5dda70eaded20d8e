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

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use sprout_engine::ErrorCode;
use sprout_sites::SiteConfig;

use crate::http::{fail, read_body, ApiError};
use crate::state::{Api, AppSites};

fn sites(api: &Api) -> Result<&AppSites, ApiError> {
    api.sites.as_deref().ok_or_else(|| ApiError::new(ErrorCode::NotFound, "this worker has no app port ([app] listen)"))
}

pub(crate) async fn list(State(api): State<Api>) -> Response {
    match sites(&api) {
        Ok(s) => axum::Json(s.list()).into_response(),
        Err(e) => fail(e),
    }
}

pub(crate) async fn put(State(api): State<Api>, Path(host): Path<String>, body: Body) -> Response {
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
    match sites.put(&host, config.clone()) {
        Ok(created) => {
            tracing::info!(host, lambda = %config.lambda, "site {}", if created { "added" } else { "replaced" });
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            (status, axum::Json(json!({"host": host, "site": config}))).into_response()
        }
        Err(message) => fail(ApiError::new(ErrorCode::InvalidRequest, message)),
    }
}

pub(crate) async fn delete(State(api): State<Api>, Path(host): Path<String>) -> Response {
    let sites = match sites(&api) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    match sites.delete(&host) {
        Ok(true) => {
            tracing::info!(host, "site removed");
            axum::Json(json!({"deleted": host})).into_response()
        }
        Ok(false) => fail(ApiError::new(ErrorCode::SiteNotFound, format!("no site for host {host:?}"))),
        Err(message) => fail(ApiError::new(ErrorCode::InvalidRequest, message)),
    }
}
