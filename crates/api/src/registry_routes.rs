//! `/registry`: lambdas uploaded (a tar.gz of the directory, checked by the engine's
//! registry), listed, shown and deleted; an upload or deletion here is published to the
//! fleet's shared registry when the worker belongs to one.

use axum::body::Body;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sprout_engine::config::BackendKind;
use sprout_engine::UploadError;
use sprout_engine::{ErrorCode, Lambda, Origin};

use crate::auth::Principal;
use crate::http::{fail, read_body, ApiError};
use crate::quotas::Refused;
use crate::state::Api;
use crate::tenant_routes::store_api_error;

/// The answer for a lambda that does not exist or that the principal may not see: the same.
fn not_found(name: &str) -> Response {
    fail(ApiError::new(ErrorCode::LambdaNotFound, format!("no lambda named {name:?}")))
}

/// Before a tenant's upload of `archive_len` bytes: its key may change `name`, its quotas hold
/// it, and the name is its own (claimed now if nobody has it). Ok(true): claimed by this
/// upload, to release if the upload fails.
fn claim_for_upload(api: &Api, principal: &Principal, name: &str, archive_len: usize) -> Result<bool, ApiError> {
    let Principal::Tenant(grant) = principal else { return Ok(false) };
    if grant.scope.lambdas.as_ref().is_some_and(|set| !set.contains(name)) {
        return Err(ApiError::new(ErrorCode::Forbidden, "this key may change only the lambdas it was issued for"));
    }
    if !sprout_engine::valid_name(name) {
        return Ok(false); // the registry refuses it with its own message
    }
    check_upload_quotas(api, &grant.tenant, name, archive_len)?;
    let exists = api.engine.registry.get(name).is_some();
    api.auth.tenants.claim(name, &grant.tenant, exists).map_err(store_api_error)
}

/// A tenant's `lambdas` and `code_mb` quotas against an upload of `name` (the version it
/// replaces not counted).
fn check_upload_quotas(api: &Api, tenant: &str, name: &str, archive_len: usize) -> Result<(), ApiError> {
    let quotas = api.auth.tenants.quotas(tenant).map_err(store_api_error)?;
    let others: Vec<String> = api.auth.tenants.owned(tenant).into_iter().filter(|n| n != name).collect();
    let refused = if quotas.lambdas.is_some_and(|limit| others.len() as u64 >= limit) {
        Some((ErrorCode::QuotaExceeded, Refused { quota: "lambdas", limit: quotas.lambdas.unwrap_or(0) as f64 }))
    } else if let Some(limit) = quotas.code_mb {
        let used: u64 = others.iter().filter_map(|n| api.engine.registry.get(n)).map(|l| l.archive_bytes).sum();
        (used + archive_len as u64 > limit << 20)
            .then_some((ErrorCode::CodeQuotaExceeded, Refused { quota: "code_mb", limit: limit as f64 }))
    } else {
        None
    };
    let Some((code, refused)) = refused else { return Ok(()) };
    api.usage.count_refusal(tenant, refused.quota);
    Err(refused.error(code, tenant))
}

/// The operator's isolation class in an upload's query (`?isolation=gvisor`), if any; any
/// other parameter, or a class this worker does not run, is refused.
fn upload_isolation(api: &Api, query: Option<&str>) -> Result<Option<BackendKind>, ApiError> {
    let mut chosen = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("isolation", class)) => {
                let kind =
                    api.engine.registry.isolation().parse(class).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.to_string()))?;
                chosen = Some(kind);
            }
            _ => return Err(ApiError::new(ErrorCode::InvalidRequest, format!("unknown upload parameter {pair:?} (known: isolation)"))),
        }
    }
    Ok(chosen)
}

pub(crate) async fn upload(
    State(api): State<Api>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    body: Body,
) -> Response {
    let chosen = match upload_isolation(&api, query.as_deref()).and_then(|c| tenant_isolation(&api, &principal, c)) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let data = match read_body(body, api.max_upload).await {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let claimed_now = match claim_for_upload(&api, &principal, &name, data.len()) {
        Ok(claimed) => claimed,
        Err(e) => return fail(e),
    };
    let response = store_upload(&api, name.clone(), data, chosen).await;
    if claimed_now && !response.status().is_success() && api.engine.registry.get(&name).is_none() {
        if let Err(e) = api.auth.tenants.release(&name) {
            tracing::warn!(lambda = %name, "the failed upload's name stays claimed: {e}");
        }
    }
    response
}

async fn store_upload(api: &Api, name: String, data: axum::body::Bytes, chosen: Option<BackendKind>) -> Response {
    let registry = api.engine.registry.clone();
    let archive = data.clone(); // Bytes: shared, not copied; for the shared registry
    let result = tokio::task::spawn_blocking(move || registry.upload(&name, &data, chosen)).await;
    match result {
        Ok(Ok(lambda)) => {
            tracing::info!(lambda = %lambda.name, version = lambda.version, files = lambda.files, "lambda uploaded");
            api.engine.arrived(&lambda, Origin::Api);
            api.engine.networks.prepare(&lambda.name).await;
            if let Some(shared) = &api.shared {
                if let Err(e) = shared.publish(&lambda.name, &lambda.sha256, &archive, lambda.isolation.map(|k| k.name())).await {
                    let message = format!("the lambda is stored on this worker but not in the fleet's shared registry, so the other workers do not have it; upload it again: {e:#}");
                    return fail(ApiError::new(ErrorCode::SharedRegistryUnavailable, message).with("lambda", lambda.name.clone()));
                }
            }
            (StatusCode::CREATED, axum::Json(lambda_json(api, &lambda))).into_response()
        }
        Ok(Err(e)) => {
            let mut err = ApiError::new(e.code(), e.to_string());
            match &e {
                UploadError::Syntax(s) => err = err.with("line", s.line).with("offset", s.offset),
                UploadError::Config(c) => err = err.with("line", c.line),
                _ => {}
            }
            fail(err)
        }
        Err(e) => fail(ApiError::new(ErrorCode::Internal, e.to_string())),
    }
}

/// The isolation class of a tenant's upload: its tenant's (the operator's choice), never one
/// the upload names (`?isolation=` is the operator's).
fn tenant_isolation(api: &Api, principal: &Principal, chosen: Option<BackendKind>) -> Result<Option<BackendKind>, ApiError> {
    let Principal::Tenant(grant) = principal else { return Ok(chosen) };
    if chosen.is_some() {
        return Err(ApiError::new(ErrorCode::Forbidden, "?isolation= is the operator's: a tenant's lambdas run in its tenant's class"));
    }
    match api.auth.tenants.isolation(&grant.tenant).map_err(store_api_error)? {
        None => Ok(None),
        Some(class) => api.engine.registry.isolation().parse(&class).map(Some).map_err(|e| {
            ApiError::new(ErrorCode::InvalidRequest, format!("the tenant's isolation class is not one this worker runs now: {e}"))
        }),
    }
}

/// A lambda's metadata, with the back-end that runs it (its isolation class, by the worker's
/// policy as it is now; null when that class is not run here).
fn lambda_json(api: &Api, lambda: &Lambda) -> Value {
    let mut body = json!(*lambda);
    body["backend"] = api.engine.registry.class_of(lambda).map(|k| json!(k.name())).unwrap_or(Value::Null);
    body
}

pub(crate) async fn list_lambdas(State(api): State<Api>, Extension(principal): Extension<Principal>) -> Response {
    let names: Vec<String> =
        api.engine.registry.list().iter().map(|l| l.name.clone()).filter(|name| principal.sees_lambda(&api.auth.tenants, name)).collect();
    axum::Json(names).into_response()
}

pub(crate) async fn show_lambda(State(api): State<Api>, Extension(principal): Extension<Principal>, Path(name): Path<String>) -> Response {
    match api.engine.registry.get(&name).filter(|_| principal.sees_lambda(&api.auth.tenants, &name)) {
        Some(l) => axum::Json(lambda_json(&api, &l)).into_response(),
        None => not_found(&name),
    }
}

pub(crate) async fn delete_lambda(
    State(api): State<Api>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Response {
    if !principal.sees_lambda(&api.auth.tenants, &name) || !api.engine.delete(&name, Origin::Api).await {
        return not_found(&name);
    }
    if let Err(e) = api.auth.tenants.release(&name) {
        tracing::warn!(lambda = %name, "the deleted lambda's name stays claimed: {e}");
    }
    if let Some(shared) = &api.shared {
        if let Err(e) = shared.delete(&name).await {
            let message = format!("the lambda is deleted on this worker but not in the fleet's shared registry; delete it again: {e:#}");
            return fail(ApiError::new(ErrorCode::SharedRegistryUnavailable, message).with("lambda", name));
        }
    }
    axum::Json(json!({"deleted": name})).into_response()
}
