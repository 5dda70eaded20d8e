//! The audit log's routes: the middleware recording each change of the control plane
//! ([`crate::audit`]) after it is answered, and `GET /audit`.

use std::time::SystemTime;

use axum::extract::{Extension, RawQuery, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sprout_engine::ErrorCode;

use crate::audit::{is_audited, AuditEntry};
use crate::auth::{tenants, Principal, Verdict};
use crate::http::{fail, ApiError, RequestId};
use crate::state::Api;

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 10_000;

/// The tenant a change is about, read before it is made (a delete forgets its owner).
fn owner_of(api: &Api, path: &str) -> Option<String> {
    let mut parts = path.trim_start_matches('/').split('/');
    match (parts.next(), parts.next()) {
        (Some("registry"), Some(name)) => api.auth.tenants.owner(name),
        (Some("tenants"), Some(tenant)) if api.auth.tenants.exists(tenant) => Some(tenant.to_string()),
        _ => None,
    }
}

/// The key id in a presented bearer credential that looks like a tenant key.
fn presented_key_id(request: &Request) -> Option<String> {
    let value = request.headers().get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.trim().split_once(' ')?.1.trim();
    tenants::looks_like_key(token).then(|| token.split('_').nth(1).unwrap_or_default().to_string())
}

/// The middleware recording each audited request after it is answered. It sits outside the
/// token check, so refused attempts are recorded too.
pub(crate) async fn record(State(api): State<Api>, request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    if !is_audited(&method, &path) {
        return next.run(request).await;
    }
    let verdict = api.auth.decide(&method, &path, request.headers());
    let (actor, tenant, key) = match verdict {
        // An open path (the console's login): whoever it was, the status says how it went.
        Verdict::Allow if crate::auth::is_open(&method, &path) => ("anonymous", None, None),
        Verdict::Allow => ("operator", None, None),
        Verdict::Tenant(grant) => ("tenant", Some(grant.tenant), Some(grant.key_id)),
        _ => ("refused", None, presented_key_id(&request)),
    };
    let owner = owner_of(&api, &path);
    let request_id = request.extensions().get::<RequestId>().map(|id| id.0.to_string());
    let response = next.run(request).await;
    let entry = AuditEntry {
        time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        actor: actor.to_string(),
        tenant,
        key,
        method: method.to_string(),
        path,
        status: response.status().as_u16(),
        owner,
        request_id,
    };
    let log = api.audit.clone();
    // Synced before the reply leaves, off the async threads.
    let _ = tokio::task::spawn_blocking(move || log.append(&entry)).await;
    response
}

/// `GET /audit[?limit=N]`: the newest N entries the caller may see (default 100, at most 10,000).
pub(crate) async fn read(State(api): State<Api>, Extension(principal): Extension<Principal>, RawQuery(query): RawQuery) -> Response {
    let mut limit = DEFAULT_LIMIT;
    for pair in query.as_deref().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("limit", n)) => match n.parse::<usize>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => limit = n,
                _ => return fail(ApiError::new(ErrorCode::InvalidRequest, format!("limit must be 1-{MAX_LIMIT}, not {n:?}"))),
            },
            _ => return fail(ApiError::new(ErrorCode::InvalidRequest, format!("unknown parameter {pair:?} (known: limit)"))),
        }
    }
    let log = api.audit.clone();
    match tokio::task::spawn_blocking(move || log.read(&principal, limit)).await {
        Ok(Ok(entries)) => axum::Json(json!({"entries": entries})).into_response(),
        Ok(Err(e)) => fail(ApiError::new(ErrorCode::Internal, format!("reading the audit log: {e}"))),
        Err(e) => fail(ApiError::new(ErrorCode::Internal, format!("reading the audit log: {e}"))),
    }
}
