//! `/tenants`: the operator's routes making tenants and issuing, listing and revoking their
//! keys ([`crate::auth::tenants`]). Every route here takes the operator's token; a tenant's
//! key is refused (403) before it gets here.
//!
//! | Route                                | Does                                                  |
//! |--------------------------------------|-------------------------------------------------------|
//! | `GET /tenants`                       | the tenants, each with its lambdas and live keys counted |
//! | `POST /tenants` `{"name": "acme"}`   | makes a tenant (201; 409 `tenant_exists`)             |
//! | `GET /tenants/<t>`                   | the tenant: its lambdas, live keys, quotas and what it uses now |
//! | `PUT /tenants/<t>/quotas` `{"lambdas", "code_mb", "invocations_per_s", "concurrent"}` | replaces its quotas (each optional: no limit) ([`crate::quotas`]) |
//! | `PUT /tenants/<t>/isolation` `{"class": "gvisor"}` | the isolation class its uploads get from then on (`null`: the worker's policy) |
//! | `DELETE /tenants/<t>`                | removes it and its keys (409 `tenant_not_empty` while it owns a lambda) |
//! | `POST /tenants/<t>/keys` `{"read_only", "lambdas", "expires_in_s"}` (all optional) | issues a key, shown this once (201) |
//! | `GET /tenants/<t>/keys`              | its keys, revoked and expired ones too (never a secret) |
//! | `DELETE /tenants/<t>/keys/<id>`      | revokes the key: refused from the next request on     |

use std::collections::BTreeSet;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use sprout_engine::ErrorCode;

use crate::auth::tenants::{Scope, StoreError};
use crate::auth::unix_now;
use crate::http::{fail, read_body, ApiError};
use crate::quotas::Quotas;
use crate::state::Api;

/// The largest body of these routes.
const MAX_BODY: usize = 64 << 10;

/// A store's refusal as the API's answer.
pub(crate) fn store_error(e: StoreError) -> Response {
    fail(store_api_error(e))
}

/// A store's refusal as the API's error.
pub(crate) fn store_api_error(e: StoreError) -> ApiError {
    let code = match &e {
        StoreError::InvalidName(_) => ErrorCode::InvalidName,
        StoreError::TenantExists(_) => ErrorCode::TenantExists,
        StoreError::TenantNotFound(_) => ErrorCode::TenantNotFound,
        StoreError::TenantNotEmpty(..) => ErrorCode::TenantNotEmpty,
        StoreError::KeyNotFound(_) => ErrorCode::KeyNotFound,
        StoreError::NameTaken(_) => ErrorCode::NameTaken,
        StoreError::Io(_) => ErrorCode::Internal,
    };
    ApiError::new(code, e.to_string())
}

/// A JSON body of type `T`, empty meaning `T::default()`.
async fn json_body<T: for<'de> Deserialize<'de> + Default>(body: Body) -> Result<T, ApiError> {
    let bytes = read_body(body, MAX_BODY).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("the body is not the JSON asked for: {e}")))
}

pub(crate) async fn list(State(api): State<Api>) -> Response {
    let tenants: Vec<_> = api
        .auth
        .tenants
        .list(unix_now())
        .into_iter()
        .map(|(name, lambdas, keys)| json!({"name": name, "lambdas": lambdas, "keys": keys}))
        .collect();
    axum::Json(tenants).into_response()
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NewTenant {
    name: String,
}

pub(crate) async fn add(State(api): State<Api>, body: Body) -> Response {
    let new: NewTenant = match json_body(body).await {
        Ok(n) => n,
        Err(e) => return fail(e),
    };
    match api.auth.tenants.add(&new.name, unix_now()) {
        Ok(()) => {
            tracing::info!(tenant = %new.name, "tenant added");
            (StatusCode::CREATED, axum::Json(json!({"name": new.name}))).into_response()
        }
        Err(e) => store_error(e),
    }
}

pub(crate) async fn show(State(api): State<Api>, Path(tenant): Path<String>) -> Response {
    let quotas = match api.auth.tenants.quotas(&tenant) {
        Ok(q) => q,
        Err(e) => return store_error(e),
    };
    let now = unix_now();
    let mut usage = api.usage.of(&tenant);
    usage["files_bytes"] = crate::stored_files::stored_bytes(&api, &tenant).await.into();
    usage["log_dropped_bytes"] = api.engine.logs.group_dropped().into_iter().find(|(g, _)| *g == tenant).map_or(0, |(_, b)| b).into();
    let keys = api.auth.tenants.list(now).into_iter().find(|(name, ..)| *name == tenant).map_or(0, |(_, _, keys)| keys);
    let body = json!({
        "name": tenant,
        "lambdas": api.auth.tenants.owned(&tenant),
        "keys": keys,
        "quotas": quotas,
        "isolation": api.auth.tenants.isolation(&tenant).ok().flatten(),
        "usage": usage,
    });
    axum::Json(body).into_response()
}

pub(crate) async fn set_quotas(State(api): State<Api>, Path(tenant): Path<String>, body: Body) -> Response {
    let quotas: Quotas = match json_body(body).await {
        Ok(q) => q,
        Err(e) => return fail(e),
    };
    if let Err(why) = quotas.check() {
        return fail(ApiError::new(ErrorCode::InvalidRequest, why));
    }
    if let Some(mb) = quotas.memory_mb.filter(|mb| *mb < api.usage.sandbox_mb()) {
        let why = format!("memory_mb {mb} is less than one sandbox's memory limit ({} MB, limits.memory_mb)", api.usage.sandbox_mb());
        return fail(ApiError::new(ErrorCode::InvalidRequest, why));
    }
    match api.auth.tenants.set_quotas(&tenant, quotas.clone()) {
        Ok(()) => {
            tracing::info!(%tenant, ?quotas, "quotas set");
            axum::Json(json!({"name": tenant, "quotas": quotas})).into_response()
        }
        Err(e) => store_error(e),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Isolation {
    class: Option<String>,
}

pub(crate) async fn set_isolation(State(api): State<Api>, Path(tenant): Path<String>, body: Body) -> Response {
    let wanted: Isolation = match json_body(body).await {
        Ok(w) => w,
        Err(e) => return fail(e),
    };
    let class = match wanted.class.as_deref().map(|c| api.engine.registry.isolation().parse(c)) {
        Some(Err(e)) => return fail(ApiError::new(ErrorCode::InvalidRequest, e.to_string())),
        Some(Ok(kind)) => Some(kind.name().to_string()),
        None => None,
    };
    match api.auth.tenants.set_isolation(&tenant, class.clone()) {
        Ok(()) => {
            tracing::info!(%tenant, ?class, "isolation class set");
            axum::Json(json!({"name": tenant, "isolation": class})).into_response()
        }
        Err(e) => store_error(e),
    }
}

pub(crate) async fn remove(State(api): State<Api>, Path(tenant): Path<String>) -> Response {
    match api.auth.tenants.remove(&tenant) {
        Ok(()) => {
            tracing::info!(%tenant, "tenant removed with its keys");
            axum::Json(json!({"deleted": tenant})).into_response()
        }
        Err(e) => store_error(e),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NewKey {
    #[serde(default)]
    read_only: bool,
    #[serde(default)]
    lambdas: Option<BTreeSet<String>>,
    #[serde(default)]
    expires_in_s: Option<u64>,
}

pub(crate) async fn issue(State(api): State<Api>, Path(tenant): Path<String>, body: Body) -> Response {
    let new: NewKey = match json_body(body).await {
        Ok(n) => n,
        Err(e) => return fail(e),
    };
    if let Some(bad) = new.lambdas.iter().flatten().find(|name| !sprout_engine::valid_name(name)) {
        return fail(ApiError::new(ErrorCode::InvalidName, format!("{bad:?} is not a lambda name")));
    }
    if new.expires_in_s == Some(0) {
        return fail(ApiError::new(ErrorCode::InvalidRequest, "expires_in_s must be at least 1 (leave it out: no expiry)"));
    }
    let now = unix_now();
    let scope = Scope { read_only: new.read_only, lambdas: new.lambdas, expires: new.expires_in_s.map(|s| now.saturating_add(s)) };
    match api.auth.tenants.issue(&tenant, scope, now) {
        Ok(issued) => {
            tracing::info!(%tenant, key = %issued.record.id, "key issued");
            let mut body = json!(issued.record);
            body["key"] = json!(issued.key);
            body["tenant"] = json!(tenant);
            (StatusCode::CREATED, axum::Json(body)).into_response()
        }
        Err(e) => store_error(e),
    }
}

pub(crate) async fn keys(State(api): State<Api>, Path(tenant): Path<String>) -> Response {
    match api.auth.tenants.keys(&tenant) {
        Ok(keys) => axum::Json(keys).into_response(),
        Err(e) => store_error(e),
    }
}

pub(crate) async fn revoke(State(api): State<Api>, Path((tenant, id)): Path<(String, String)>) -> Response {
    match api.auth.tenants.revoke(&tenant, &id, unix_now()) {
        Ok(record) => {
            tracing::info!(%tenant, key = %id, "key revoked");
            axum::Json(record).into_response()
        }
        Err(e) => store_error(e),
    }
}
