//! `/blobs/<name>`: the blob store's files for clients — `PUT` writes the body as blob
//! `name` (up to `limits.max_upload_mb`), `GET` reads it, `DELETE` removes it.

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sprout_offload::file_error;

use crate::files;
use crate::http::fail;
use crate::state::Api;

/// `PUT /blobs/<name>`: the body becomes the blob (replacing one of that name).
pub async fn put(State(api): State<Api>, UrlPath(name): UrlPath<String>, body: Body) -> Response {
    match files::receive(&api.blobs.files, &name, body, api.max_upload).await {
        Ok(size) => axum::Json(json!({"blob": name, "bytes": size})).into_response(),
        Err(e) => fail(e.with("blob", name.as_str())),
    }
}

/// `GET /blobs/<name>`: the blob's bytes.
pub async fn get(State(api): State<Api>, UrlPath(name): UrlPath<String>) -> Response {
    files::send(&api.blobs.files, &name).unwrap_or_else(|e| fail(e.with("blob", name.as_str())))
}

/// `DELETE /blobs/<name>`.
pub async fn delete(State(api): State<Api>, UrlPath(name): UrlPath<String>) -> Response {
    match api.blobs.files.remove(&name) {
        Ok(()) => axum::Json(json!({"deleted": name})).into_response(),
        Err(e) => fail(file_error(e).with("blob", name.as_str())),
    }
}
