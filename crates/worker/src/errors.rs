//! Every error the worker's API answers with: a code (the `error` of the JSON body, stable in
//! meaning), the HTTP status that says whose fault it was, and the text of `/stats`' and
//! `/metrics`' error counts. One table, so a status is decided in one place. [`ApiError`] is
//! such an error with its JSON body; [`failure_error`] and [`handler_error`] make one of why
//! an invocation failed.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::instances::Failure;

macro_rules! error_codes {
    ($($variant:ident = $code:literal, $status:ident;)*) => {
        /// An error the API answers with.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($variant,)*
        }

        impl ErrorCode {
            /// Every code, in the order of the table.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as the JSON body and the metrics spell it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            /// The HTTP status of a response with this error.
            pub fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$variant => StatusCode::$status,)*
                }
            }
        }
    };
}

error_codes! {
    // The request itself (4xx).
    NotFound = "not_found", NOT_FOUND;
    InvalidRequest = "invalid_request", BAD_REQUEST;
    MethodNotAllowed = "method_not_allowed", METHOD_NOT_ALLOWED;
    LambdaNotFound = "lambda_not_found", NOT_FOUND;
    SiteNotFound = "site_not_found", NOT_FOUND;
    InvalidName = "invalid_name", BAD_REQUEST;
    PayloadTooLarge = "payload_too_large", PAYLOAD_TOO_LARGE;
    // A map (`/map/<name>`) over a lambda that is a WSGI or ASGI app, not a function.
    NotAFunction = "not_a_function", BAD_REQUEST;
    // A user lease (`/leases/<id>/...`) that does not exist (any more).
    LeaseNotFound = "lease_not_found", NOT_FOUND;
    Unauthorized = "unauthorized", UNAUTHORIZED;
    Forbidden = "forbidden", FORBIDDEN;
    // An upload (4xx).
    InvalidArchive = "invalid_archive", BAD_REQUEST;
    UnsafePath = "unsafe_path", BAD_REQUEST;
    ArchiveTooLarge = "archive_too_large", PAYLOAD_TOO_LARGE;
    MissingHandler = "missing_handler", BAD_REQUEST;
    SyntaxError = "syntax_error", BAD_REQUEST;
    UnpinnedRequirements = "unpinned_requirements", BAD_REQUEST;
    InvalidRequirements = "invalid_requirements", BAD_REQUEST;
    InvalidLambdaConfig = "invalid_lambda_config", BAD_REQUEST;
    // The worker is busy or stopping (429, 503).
    QueueFull = "queue_full", TOO_MANY_REQUESTS;
    QueueTimeout = "queue_timeout", SERVICE_UNAVAILABLE;
    MemoryBudget = "memory_budget", SERVICE_UNAVAILABLE;
    ShuttingDown = "shutting_down", SERVICE_UNAVAILABLE;
    SandboxStartFailed = "sandbox_start_failed", SERVICE_UNAVAILABLE;
    SharedRegistryUnavailable = "shared_registry_unavailable", SERVICE_UNAVAILABLE;
    // The lambda (5xx, but a bad event is the caller's: 400).
    LoadError = "load_error", INTERNAL_SERVER_ERROR;
    InstallFailed = "install_failed", INTERNAL_SERVER_ERROR;
    HandlerException = "handler_exception", INTERNAL_SERVER_ERROR;
    InvalidJson = "invalid_json", BAD_REQUEST;
    InvalidResult = "invalid_result", INTERNAL_SERVER_ERROR;
    Timeout = "timeout", GATEWAY_TIMEOUT;
    OutOfMemory = "out_of_memory", BAD_GATEWAY;
    SandboxCrashed = "sandbox_crashed", BAD_GATEWAY;
    CallDepthExceeded = "call_depth_exceeded", LOOP_DETECTED;
    // A lease's part whose sandbox died: the state it held is gone.
    LeasePartLost = "lease_part_lost", BAD_GATEWAY;
    // The worker's own fault.
    Internal = "internal", INTERNAL_SERVER_ERROR;
}

impl ErrorCode {
    /// The error a handler's reply reports: the helper says `invalid_json`, `invalid_result`
    /// or `handler_exception` (or, to a map's chunk, `not_a_function`); anything else it might
    /// say is a handler exception.
    pub fn from_handler(code: &str) -> ErrorCode {
        match code {
            "invalid_json" => ErrorCode::InvalidJson,
            "invalid_result" => ErrorCode::InvalidResult,
            "not_a_function" => ErrorCode::NotAFunction,
            _ => ErrorCode::HandlerException,
        }
    }
}

impl ErrorCode {
    /// The error of an invocation whose sandbox failed.
    pub fn of_invoke_error(e: &sprout_sandbox::InvokeError) -> ErrorCode {
        match e {
            sprout_sandbox::InvokeError::Timeout(_) => ErrorCode::Timeout,
            sprout_sandbox::InvokeError::OutOfMemory { .. } => ErrorCode::OutOfMemory,
            sprout_sandbox::InvokeError::Crashed { .. } => ErrorCode::SandboxCrashed,
        }
    }
}

/// An error answer: its code and JSON body (`error`, `message`, and what else says why).
#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    body: Value,
    /// Already counted in the metrics (by the invoker): the HTTP layer must not count it again.
    counted: bool,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { code, body: json!({"error": code.as_str(), "message": message.into()}), counted: false }
    }

    /// Add `key` to the body.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> ApiError {
        self.body[key] = value.into();
        self
    }

    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.body.get(key)
    }

    pub(crate) fn counted(mut self) -> ApiError {
        self.counted = true;
        self
    }

    /// The JSON body, with the status in it (how a handler's call learns of the error).
    pub fn into_call_reply(self) -> Value {
        let mut body = self.body;
        body["status"] = self.code.status().as_u16().into();
        body
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.code.status(), [(header::CONTENT_TYPE, "application/json")], self.body.to_string()).into_response();
        if !self.counted {
            response.extensions_mut().insert(self.code);
        }
        response.extensions_mut().insert(WorkerError);
        response
    }
}

/// Marks a response the worker made for an error (not a handler's own), so the request id can
/// be added to its body.
#[derive(Debug, Clone, Copy)]
pub struct WorkerError;

/// The error a handler's reply reports, if it reports one.
pub fn handler_error(reply: &sprout_sandbox::channel::Reply) -> Option<ApiError> {
    let code = ErrorCode::from_handler(reply.error.as_deref()?);
    let mut e = ApiError::new(code, reply.message.clone().unwrap_or_default());
    if let Some(tb) = &reply.traceback {
        e = e.with("traceback", tb.clone());
    }
    Some(e)
}

/// The error of an invocation that got no reply from its handler.
pub fn failure_error(failure: Failure) -> ApiError {
    let message = failure.to_string();
    match failure {
        Failure::QueueFull(_) => ApiError::new(ErrorCode::QueueFull, message),
        Failure::QueueTimeout(_) => ApiError::new(ErrorCode::QueueTimeout, message),
        Failure::NoMemory(_) => ApiError::new(ErrorCode::MemoryBudget, message),
        Failure::ShuttingDown => ApiError::new(ErrorCode::ShuttingDown, message),
        Failure::Load { traceback, .. } => {
            let e = ApiError::new(ErrorCode::LoadError, message);
            match traceback {
                Some(tb) => e.with("traceback", tb),
                None => e,
            }
        }
        Failure::Platform(_) => ApiError::new(ErrorCode::SandboxStartFailed, message),
        Failure::Install(e) => {
            let mut err = ApiError::new(ErrorCode::InstallFailed, message).with("pip_output", e.output);
            if let Some(package) = e.package {
                err = err.with("package", package);
            }
            err
        }
        Failure::Sandbox(e) => ApiError::new(ErrorCode::of_invoke_error(&e), message),
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn codes_are_distinct_snake_case_and_say_whose_fault() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} twice");
            assert!(code.as_str().chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{code}");
            let status = code.status();
            assert!(status.is_client_error() || status.is_server_error(), "{code}: {status}");
        }
        assert_eq!(ErrorCode::ALL.len(), 36);
    }

    #[test]
    fn a_handlers_unknown_error_is_a_handler_exception() {
        assert_eq!(ErrorCode::from_handler("invalid_json").status(), 400);
        assert_eq!(ErrorCode::from_handler("out_of_memory"), ErrorCode::HandlerException);
    }
}
