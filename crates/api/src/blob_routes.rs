//! `/blobs/<name>`: the blob store's files for clients — `PUT` writes the body as blob
//! `name` (up to `limits.max_upload_mb`, and within a tenant's `files_mb`), `GET` reads it,
//! `DELETE` removes it. A tenant's key reaches its own blobs and those a sandbox wrote; another
//! principal's answer as missing (404 `not_found`), as [`crate::stored_files`] says.

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::json;
use sprout_offload::file_error;

use crate::auth::Principal;
use crate::files;
use crate::http::{fail, ApiError};
use crate::state::Api;
use crate::stored_files::upload_limit;

/// Blob `name` as `principal` may use it: another's answers as a missing blob.
fn check(api: &Api, principal: &Principal, name: &str) -> Result<(), ApiError> {
    if api.blob_owners.may_use(principal, name) {
        return Ok(());
    }
    let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory (os error 2)");
    Err(ApiError(file_error(missing)).with("blob", name))
}

/// `PUT /blobs/<name>`: the body becomes the blob (replacing one of that name).
pub async fn put(
    State(api): State<Api>,
    Extension(principal): Extension<Principal>,
    UrlPath(name): UrlPath<String>,
    body: Body,
) -> Response {
    if let Err(e) = check(&api, &principal, &name) {
        return fail(e);
    }
    let tenant = principal.tenant();
    let received = async {
        let limit = upload_limit(&api, tenant, api.blobs.files.path().join(&name)).await?;
        let size = files::receive(&api.blobs.files, &name, body, &limit).await.inspect_err(|e| limit.count(&api, e))?;
        api.blob_owners.uploaded(&name, tenant, api.blobs.files.path());
        Ok::<_, ApiError>(size)
    };
    match received.await {
        Ok(size) => axum::Json(json!({"blob": name, "bytes": size})).into_response(),
        Err(e) => fail(e.with("blob", name.as_str())),
    }
}

/// `GET /blobs/<name>`: the blob's bytes.
pub async fn get(State(api): State<Api>, Extension(principal): Extension<Principal>, UrlPath(name): UrlPath<String>) -> Response {
    let sent =
        check(&api, &principal, &name).and_then(|()| files::send(&api.blobs.files, &name).map_err(|e| e.with("blob", name.as_str())));
    sent.unwrap_or_else(fail)
}

/// `DELETE /blobs/<name>`.
pub async fn delete(State(api): State<Api>, Extension(principal): Extension<Principal>, UrlPath(name): UrlPath<String>) -> Response {
    if let Err(e) = check(&api, &principal, &name) {
        return fail(e);
    }
    match api.blobs.files.remove(&name) {
        Ok(()) => {
            api.blob_owners.deleted(&name);
            axum::Json(json!({"deleted": name})).into_response()
        }
        Err(e) => fail(ApiError(file_error(e)).with("blob", name.as_str())),
    }
}
