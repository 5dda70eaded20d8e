//! What every route shares: an engine [`Error`] as the HTTP answer it is ([`ApiError`]), a
//! body read within its limit, and the middleware that gives every request an id and counts
//! every error answer by its code.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use serde_json::Value;
use sprout_engine::Metrics;
use sprout_engine::{Error, ErrorCode, Invoker};

/// An engine error as the HTTP answer it is: its code's status and its JSON body.
#[derive(Debug)]
pub struct ApiError(pub Error);

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError(Error::new(code, message))
    }

    /// Add `key` to the body.
    pub fn with(self, key: &str, value: impl Into<Value>) -> ApiError {
        ApiError(self.0.with(key, value))
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        ApiError(e)
    }
}

impl std::ops::Deref for ApiError {
    type Target = Error;
    fn deref(&self) -> &Error {
        &self.0
    }
}

/// The HTTP status of an error code.
pub fn status_of(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (code, counted) = (self.0.code, self.0.is_counted());
        let mut response = (status_of(code), [(header::CONTENT_TYPE, "application/json")], self.0.body().to_string()).into_response();
        if matches!(code, ErrorCode::PayloadTooLarge | ErrorCode::FilesQuotaExceeded) {
            // The rest of the body was not read, so the connection cannot carry another
            // request: say so, or a client reusing it races the close (RFC 9112 9.6). (An
            // upload past `files_mb` is refused as it streams in, or before.)
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if !counted {
            response.extensions_mut().insert(code);
        }
        response.extensions_mut().insert(WorkerError);
        response
    }
}

/// Marks a response the worker made for an error (not a handler's own), so the request id can
/// be added to its body.
#[derive(Debug, Clone, Copy)]
pub struct WorkerError;

/// A worker's name as the value of `x-sprout-worker` (`worker` if it cannot be one).
pub fn worker_name_header(name: &str) -> HeaderValue {
    HeaderValue::from_str(name).unwrap_or(HeaderValue::from_static("worker"))
}

/// The id of the request being answered, given by [`tag_request`].
#[derive(Clone)]
pub struct RequestId(pub Arc<str>);

/// Give every request an id: in its extensions for the handlers, in `X-Sprout-Request-Id` on
/// its reply, and in the body of an error the worker answers with (an [`ApiError`]'s, never a
/// handler's own).
pub(crate) async fn tag_request(State(invoker): State<Arc<Invoker>>, mut request: Request, next: Next) -> Response {
    let id = invoker.new_id();
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).await;
    if response.extensions().get::<WorkerError>().is_some() {
        response = with_request_id(response, &id).await;
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HeaderName::from_static("x-sprout-request-id"), value);
    }
    response
}

/// An error response of the worker's, with `request_id` in its JSON body.
async fn with_request_id(response: Response, id: &str) -> Response {
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = body.collect().await.map(|b| b.to_bytes()) else {
        return Response::from_parts(parts, Body::empty());
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(mut map)) => {
            map.insert("request_id".into(), Value::from(id));
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(Value::Object(map).to_string()))
        }
        _ => Response::from_parts(parts, Body::from(bytes)),
    }
}

/// Count every error response by its code (each carries its [`ErrorCode`]).
pub(crate) async fn count_errors(State(metrics): State<Arc<Metrics>>, response: Response) -> Response {
    if let Some(code) = response.extensions().get::<ErrorCode>() {
        metrics.error(*code);
    }
    response
}

/// An error as the response it is.
pub(crate) fn fail(e: impl Into<ApiError>) -> Response {
    e.into().into_response()
}

pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::new(ErrorCode::PayloadTooLarge, format!("the request body exceeds the limit of {} bytes", limit)))
        }
        Err(e) => Err(ApiError::new(ErrorCode::InvalidRequest, format!("reading the body: {e}"))),
    }
}
