//! Which failed requests run once more on another sandbox: those whose sandbox died before a
//! byte of its reply arrived, when running them twice is harmless (nginx's
//! `proxy_next_upstream`: safe HTTP methods only).
//!
//! A warm sandbox may die just as a request is handed to it (killed while paused, its SIGKILL
//! delivered only as it resumes; its Zygote gone). Such a request is sent to another sandbox,
//! once, within what is left of its time limit. Never retried: `f(event)` invocations (POSTs
//! with side effects, whatever the method says), unsafe methods, a reply that had begun
//! arriving, and the handler's own failures — its time limit (504) and its memory limit
//! (502 `out_of_memory`).

use sprout_sandbox::{HandlerKind, InvokeError, Phase};

/// HTTP methods that change nothing (RFC 9110 section 9.2.1), the ones a retry cannot harm.
const SAFE_METHODS: [&str; 3] = ["GET", "HEAD", "OPTIONS"];

/// Why a request was sent to a second sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Writing the request to the sandbox failed.
    SendFailed,
    /// The sandbox's channel closed (or was reset) before a byte of the reply arrived.
    NoReply,
}

impl Reason {
    pub const ALL: [Reason; 2] = [Reason::SendFailed, Reason::NoReply];

    pub fn label(self) -> &'static str {
        match self {
            Reason::SendFailed => "send_failed",
            Reason::NoReply => "no_reply",
        }
    }
}

/// Whether a request with `method` to a handler of `kind` that failed with `error` may run on
/// another sandbox, and why.
pub fn reason(kind: HandlerKind, method: &str, error: &InvokeError) -> Option<Reason> {
    if !kind.serves_http() || !SAFE_METHODS.contains(&method) {
        return None;
    }
    match error {
        InvokeError::Crashed { phase: Phase::Sending, .. } => Some(Reason::SendFailed),
        InvokeError::Crashed { phase: Phase::AwaitingReply, .. } => Some(Reason::NoReply),
        InvokeError::Crashed { phase: Phase::Replying, .. } | InvokeError::Timeout(_) | InvokeError::OutOfMemory { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn crashed(phase: Phase) -> InvokeError {
        InvokeError::Crashed { message: "Connection reset by peer (os error 104)".into(), phase }
    }

    #[test]
    fn safe_methods_to_wsgi_apps_are_retried_until_the_reply_begins() {
        for method in SAFE_METHODS {
            assert_eq!(reason(HandlerKind::Wsgi, method, &crashed(Phase::Sending)), Some(Reason::SendFailed));
            assert_eq!(reason(HandlerKind::Wsgi, method, &crashed(Phase::AwaitingReply)), Some(Reason::NoReply));
            assert_eq!(reason(HandlerKind::Wsgi, method, &crashed(Phase::Replying)), None);
        }
    }

    #[test]
    fn unsafe_methods_and_functions_are_never_retried() {
        for method in ["POST", "PUT", "PATCH", "DELETE", "get", "CONNECT"] {
            assert_eq!(reason(HandlerKind::Wsgi, method, &crashed(Phase::AwaitingReply)), None, "{method}");
        }
        for method in ["POST", "GET"] {
            assert_eq!(reason(HandlerKind::Function, method, &crashed(Phase::AwaitingReply)), None, "{method}");
        }
    }

    #[test]
    fn the_handlers_own_failures_are_never_retried() {
        let timeout = InvokeError::Timeout(Duration::from_secs(1));
        let oom = InvokeError::OutOfMemory { limit_mb: 64 };
        assert_eq!(reason(HandlerKind::Wsgi, "GET", &timeout), None);
        assert_eq!(reason(HandlerKind::Wsgi, "GET", &oom), None);
    }
}
