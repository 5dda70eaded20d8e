//! Every error the worker answers with: a code (the `error` of the JSON body, stable in
//! meaning), the status that says whose fault it was, and the text of `/stats`' and
//! `/metrics`' error counts. One table, so a status is decided in one place. [`Error`] is
//! such an error with its JSON body; [`handler_error`] makes one of a handler's reply.
//!
//! The status is an HTTP status number because both ways out of the worker carry it: the HTTP
//! API answers with it, and a handler's call to another lambda (`sprout.invoke`) gets it in
//! its reply frame, as `POST /run/<name>` would have answered. The engine knows the number;
//! only the HTTP edge turns it into a response.

use serde_json::{json, Value};

macro_rules! error_codes {
    ($($variant:ident = $code:literal, $status:literal;)*) => {
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

            /// The HTTP status of an answer with this error (4xx: the caller's fault, 5xx: the
            /// lambda's or the worker's).
            pub fn status(self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $status,)*
                }
            }
        }
    };
}

error_codes! {
    // The request itself (4xx).
    NotFound = "not_found", 404;
    InvalidRequest = "invalid_request", 400;
    MethodNotAllowed = "method_not_allowed", 405;
    LambdaNotFound = "lambda_not_found", 404;
    SiteNotFound = "site_not_found", 404;
    InvalidName = "invalid_name", 400;
    PayloadTooLarge = "payload_too_large", 413;
    // A map (`/map/<name>`) over a lambda that is a WSGI or ASGI app, not a function.
    NotAFunction = "not_a_function", 400;
    // A user lease (`/leases/<id>/...`) that does not exist (any more).
    LeaseNotFound = "lease_not_found", 404;
    Unauthorized = "unauthorized", 401;
    Forbidden = "forbidden", 403;
    // Tenants and their keys (the operator's routes), and a lambda name another principal has.
    TenantNotFound = "tenant_not_found", 404;
    KeyNotFound = "key_not_found", 404;
    TenantExists = "tenant_exists", 409;
    TenantNotEmpty = "tenant_not_empty", 409;
    NameTaken = "name_taken", 409;
    // A tenant's quota (the body names it and its limit): counts and rates, code bytes, and
    // stored files' bytes.
    QuotaExceeded = "quota_exceeded", 429;
    CodeQuotaExceeded = "code_quota_exceeded", 413;
    FilesQuotaExceeded = "files_quota_exceeded", 413;
    // An upload (4xx).
    InvalidArchive = "invalid_archive", 400;
    UnsafePath = "unsafe_path", 400;
    ArchiveTooLarge = "archive_too_large", 413;
    MissingHandler = "missing_handler", 400;
    SyntaxError = "syntax_error", 400;
    UnpinnedRequirements = "unpinned_requirements", 400;
    InvalidRequirements = "invalid_requirements", 400;
    InvalidLambdaConfig = "invalid_lambda_config", 400;
    // The worker is busy or stopping (429, 503).
    QueueFull = "queue_full", 429;
    QueueTimeout = "queue_timeout", 503;
    MemoryBudget = "memory_budget", 503;
    ShuttingDown = "shutting_down", 503;
    SandboxStartFailed = "sandbox_start_failed", 503;
    SharedRegistryUnavailable = "shared_registry_unavailable", 503;
    // The lambda (5xx, but a bad event is the caller's: 400).
    LoadError = "load_error", 500;
    InstallFailed = "install_failed", 500;
    HandlerException = "handler_exception", 500;
    InvalidJson = "invalid_json", 400;
    InvalidResult = "invalid_result", 500;
    Timeout = "timeout", 504;
    OutOfMemory = "out_of_memory", 502;
    SandboxCrashed = "sandbox_crashed", 502;
    CallDepthExceeded = "call_depth_exceeded", 508;
    // A lease's part whose sandbox died: the state it held is gone.
    LeasePartLost = "lease_part_lost", 502;
    // The worker's own fault.
    Internal = "internal", 500;
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
pub struct Error {
    pub code: ErrorCode,
    body: Value,
    /// Already counted in the metrics (by the invoker): the HTTP layer must not count it again.
    counted: bool,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        Error { code, body: json!({"error": code.as_str(), "message": message.into()}), counted: false }
    }

    /// Add `key` to the body.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Error {
        self.body[key] = value.into();
        self
    }

    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.body.get(key)
    }

    /// Marks it counted in the metrics already (by the invoker).
    pub fn counted(mut self) -> Error {
        self.counted = true;
        self
    }

    /// Whether the metrics counted it already: the HTTP edge must not count it again.
    pub fn is_counted(&self) -> bool {
        self.counted
    }

    /// The JSON body.
    pub fn body(&self) -> &Value {
        &self.body
    }

    /// The JSON body, with the status in it (how a handler's call learns of the error).
    pub fn into_call_reply(self) -> Value {
        let mut body = self.body;
        body["status"] = self.code.status().into();
        body
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message())
    }
}

/// The error a handler's reply reports, if it reports one.
pub fn handler_error(reply: &sprout_sandbox::channel::Reply) -> Option<Error> {
    let code = ErrorCode::from_handler(reply.error.as_deref()?);
    let mut e = Error::new(code, reply.message.clone().unwrap_or_default());
    if let Some(tb) = &reply.traceback {
        e = e.with("traceback", tb.clone());
    }
    Some(e)
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
            assert!((400..600).contains(&status), "{code}: {status}");
        }
        assert_eq!(ErrorCode::ALL.len(), 44);
    }

    #[test]
    fn a_handlers_unknown_error_is_a_handler_exception() {
        assert_eq!(ErrorCode::from_handler("invalid_json").status(), 400);
        assert_eq!(ErrorCode::from_handler("out_of_memory"), ErrorCode::HandlerException);
    }
}
