//! `/leases`: user leases over HTTP ([`sprout_offload::LeaseBook`] keeps them). Behind the
//! worker's token: they hold resources.
//!
//! | Route                           | Does                                                    |
//! |---------------------------------|---------------------------------------------------------|
//! | `POST /leases/<name>`           | `{"parts": N, "idle_timeout_s": T}`: holds N sandboxes (201) |
//! | `POST /leases/<id>/<part>`      | runs `f(event)` on that part's sandbox, answering as `/run` |
//! | `POST /leases/<id>/keepalive`   | resets the lease's idle clock                           |
//! | `DELETE /leases/<id>`           | releases it: its sandboxes are destroyed                |
//! | `GET /leases`                   | every lease: id, lambda, parts, idle seconds            |
//! | `PUT /leases/<id>/files/<file>` | writes the body as a file of the lease's directory      |
//! | `GET /leases/<id>/files/<file>` | reads a file of the lease's directory                   |
//!
//! A client reads and writes a lease's files without a sandbox in the way (bodies up to
//! `limits.max_upload_mb`, streamed to disk).
//!
//! A tenant's key leases only its own lambdas and sees only their leases: another's answers
//! as one that does not exist (404 `lambda_not_found`, `lease_not_found`). A lease's files
//! count against its lambda's tenant's `files_mb` ([`crate::stored_files`]).

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::json;
use sprout_offload::{Caller, LeaseBook, MAX_LEASE_SPEC};

use sprout_engine::ErrorCode;

use crate::auth::Principal;
use crate::files;
use crate::http::{fail, read_body, ApiError, RequestId};
use crate::run::reply_of;
use crate::state::Api;
use crate::stored_files::upload_limit;

/// Lease `id` as `principal` may use it: another's answers as a missing lease.
fn check_lease(api: &Api, principal: &Principal, id: &str) -> Result<(), ApiError> {
    if matches!(principal, Principal::Operator) || api.leases.lambda_of(id).is_some_and(|l| principal.sees_lambda(&api.auth.tenants, &l)) {
        return Ok(());
    }
    let message = format!("no lease {id:?} (released, expired, or its lambda deleted or replaced)");
    Err(ApiError::new(ErrorCode::LeaseNotFound, message))
}

/// `POST /leases/<name>`: hold N sandboxes of lambda `name`.
pub async fn create(State(api): State<Api>, Extension(principal): Extension<Principal>, Path(name): Path<String>, body: Body) -> Response {
    if !principal.sees_lambda(&api.auth.tenants, &name) {
        return fail(ApiError::new(ErrorCode::LambdaNotFound, format!("no lambda named {name:?}")));
    }
    let made = async {
        let lambda = api.leases.leasable(&api.engine, &name)?;
        let body = read_body(body, MAX_LEASE_SPEC).await?;
        Ok::<_, ApiError>(api.leases.create(&api.engine, lambda, &body).await?)
    };
    match made.await {
        Ok(made) => (StatusCode::CREATED, axum::Json(made)).into_response(),
        Err(e) => fail(e),
    }
}

/// `POST /leases/<id>/<part>` (a call) and `POST /leases/<id>/keepalive`.
pub async fn call(
    State(api): State<Api>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    Extension(principal): Extension<Principal>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((id, part)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(e) = check_lease(&api, &principal, &id) {
        return fail(e);
    }
    if part == "keepalive" {
        return api.leases.keepalive(&id).map(axum::Json).map(IntoResponse::into_response).unwrap_or_else(fail);
    }
    let replied = async {
        let part = LeaseBook::part_number(&part)?;
        let body = read_body(body, api.engine.invoker.limits().max_body).await?;
        let caller = Caller { headers: api.auth.lambda_headers(&headers), remote_addr: peer.ip().to_string() };
        let reply = api.leases.call(&api.engine, &id, part, caller, &body, request_id).await?;
        let mut response = reply_of(&api, reply.invocation, &reply.lambda, false)?;
        response.headers_mut().insert("x-sprout-lease-part", HeaderValue::from(reply.part));
        Ok::<_, ApiError>(response)
    };
    replied.await.unwrap_or_else(fail)
}

/// `PUT /leases/<id>/files/<file>`: the body becomes the file (replacing one there),
/// streamed to disk as it arrives; a body past `limits.max_upload_mb` leaves nothing.
pub async fn put_file(
    State(api): State<Api>,
    Extension(principal): Extension<Principal>,
    Path((id, file)): Path<(String, String)>,
    body: Body,
) -> Response {
    if let Err(e) = check_lease(&api, &principal, &id) {
        return fail(e);
    }
    let written = async {
        let dir = api.leases.dir(&id)?;
        let tenant = api.leases.lambda_of(&id).and_then(|lambda| api.auth.tenants.owner(&lambda));
        let limit = upload_limit(&api, tenant.as_deref(), dir.files.path().join(&file)).await?;
        files::receive(&dir.files, &file, body, &limit).await.inspect_err(|e| limit.count(&api, e))
    };
    let written = written.await;
    match written {
        Ok(size) => axum::Json(json!({"lease": id, "file": file, "bytes": size})).into_response(),
        Err(e) => fail(e.with("lease", id.as_str())),
    }
}

/// `GET /leases/<id>/files/<file>`: the file's bytes, streamed.
pub async fn get_file(
    State(api): State<Api>,
    Extension(principal): Extension<Principal>,
    Path((id, file)): Path<(String, String)>,
) -> Response {
    if let Err(e) = check_lease(&api, &principal, &id) {
        return fail(e);
    }
    let sent = api.leases.dir(&id).map_err(ApiError::from).and_then(|dir| files::send(&dir.files, &file));
    sent.unwrap_or_else(|e| fail(e.with("lease", id.as_str())))
}

/// `DELETE /leases/<id>`: release a lease; its sandboxes are destroyed.
pub async fn release(State(api): State<Api>, Extension(principal): Extension<Principal>, Path(id): Path<String>) -> Response {
    if let Err(e) = check_lease(&api, &principal, &id) {
        return fail(e);
    }
    api.leases.release(&id).map(|released| axum::Json(released).into_response()).unwrap_or_else(fail)
}

/// `GET /leases`: every lease, by id.
pub async fn list(State(api): State<Api>, Extension(principal): Extension<Principal>) -> Response {
    let mut leases = api.leases.list();
    if let Some(all) = leases.as_array_mut() {
        all.retain(|l| l["lambda"].as_str().is_some_and(|name| principal.sees_lambda(&api.auth.tenants, name)));
    }
    axum::Json(leases).into_response()
}
