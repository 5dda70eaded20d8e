//! Bearer-token authentication of the admin plane: who may use which endpoint of `worker.listen`.
//!
//! Protected by default, open by exception: only `/run/...` (any method, any sub-path) and
//! `GET /status` (a health check) are open; every other path, including unknown ones and any
//! endpoint added later, needs `Authorization: Bearer <token>` with the worker's token
//! ([`token`]: `DIR/api-token`). No header answers 401 `unauthorized` with
//! `WWW-Authenticate: Bearer realm="sprout"`; a malformed header or a wrong token answers 403
//! `forbidden`. Tokens are compared in constant time. The app port is not behind this.
//! `worker.auth = false` opens everything.

pub mod token;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;

use crate::api::{fail, ApiError, ErrorCode};
pub use token::{Discovery, Token};

/// Whether a request may reach `path` without a token.
pub fn is_open(method: &Method, path: &str) -> bool {
    path.starts_with("/run/") || (path == "/status" && (method == Method::GET || method == Method::HEAD))
}

/// What a request's `Authorization` headers present.
#[derive(Debug, PartialEq, Eq)]
pub enum Credential<'a> {
    Missing,
    /// Not exactly one `Bearer <token>` header.
    Malformed,
    Bearer(&'a str),
}

/// Read the `Authorization` header: the scheme `Bearer` in any case, then the token.
pub fn credential(headers: &HeaderMap) -> Credential<'_> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return if headers.contains_key(header::AUTHORIZATION) { Credential::Malformed } else { Credential::Missing };
    };
    bearer_token(value).map_or(Credential::Malformed, Credential::Bearer)
}

fn bearer_token(value: &HeaderValue) -> Option<&str> {
    let (scheme, token) = value.to_str().ok()?.trim().split_once(' ')?;
    let token = token.trim_start();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(char::is_whitespace)).then_some(token)
}

/// Whether two tokens are equal, in time that depends only on their lengths (a token's
/// length is no secret: every one has 64 digits).
pub fn same_token(presented: &[u8], expected: &[u8]) -> bool {
    if presented.len() != expected.len() {
        return false;
    }
    let difference = presented.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(difference) == 0
}

/// The answer to one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// 401: no credentials.
    Unauthorized,
    /// 403: credentials that are not this worker's, and why.
    Forbidden(&'static str),
}

/// The worker's token and whether its API requires it.
pub struct Guard {
    token: Token,
    required: bool,
    /// The listen address, to name the discovery file in messages.
    listen: String,
}

impl Guard {
    pub fn new(token: Token, required: bool, listen: impl Into<String>) -> Guard {
        Guard { token, required, listen: listen.into() }
    }

    pub fn decide(&self, method: &Method, path: &str, headers: &HeaderMap) -> Verdict {
        if !self.required || is_open(method, path) {
            return Verdict::Allow;
        }
        match credential(headers) {
            Credential::Missing => Verdict::Unauthorized,
            Credential::Malformed => {
                Verdict::Forbidden("the Authorization header is malformed: send exactly one `Authorization: Bearer <token>`")
            }
            Credential::Bearer(presented) if same_token(presented.as_bytes(), self.token.as_str().as_bytes()) => Verdict::Allow,
            Credential::Bearer(_) => Verdict::Forbidden("the bearer token is not this worker's (DIR/api-token)"),
        }
    }

    /// Whether a request header carries this worker's own token, which no lambda may see:
    /// `/run` passes the other headers, `Authorization` included, to the handler.
    pub fn is_worker_credential(&self, name: &str, value: &HeaderValue) -> bool {
        name.eq_ignore_ascii_case(header::AUTHORIZATION.as_str())
            && bearer_token(value).is_some_and(|t| same_token(t.as_bytes(), self.token.as_str().as_bytes()))
    }

    fn unauthorized_message(&self) -> String {
        format!(
            "this endpoint needs `Authorization: Bearer <token>`; the token is in the worker directory's \
             api-token file (DIR/api-token), and in /run/sprout/api/{} while the worker runs; \
             sprout's clients send it from --token (token=), $SPROUT_TOKEN or that file",
            self.listen
        )
    }
}

/// The middleware in front of every route of `worker.listen`.
pub(crate) async fn require_token(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    match guard.decide(request.method(), request.uri().path(), request.headers()) {
        Verdict::Allow => next.run(request).await,
        Verdict::Unauthorized => {
            let mut response = fail(ApiError::new(ErrorCode::Unauthorized, guard.unauthorized_message()));
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"sprout\""));
            response
        }
        Verdict::Forbidden(why) => fail(ApiError::new(ErrorCode::Forbidden, why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    fn guard(required: bool) -> (Guard, String) {
        let token = Token::generate().unwrap();
        let text = token.as_str().to_string();
        (Guard::new(token, required, "127.0.0.1:5000"), text)
    }

    #[test]
    fn only_run_and_get_status_are_open() {
        for (method, path) in [
            (Method::POST, "/run/echo"),
            (Method::GET, "/run/hello/ada/x?y=1"),
            (Method::DELETE, "/run/app/"),
            (Method::PUT, "/run/x"),
            (Method::GET, "/status"),
            (Method::HEAD, "/status"),
        ] {
            assert!(is_open(&method, path), "{method} {path}");
        }
        for (method, path) in [
            (Method::GET, "/registry"),
            (Method::POST, "/registry/echo"),
            (Method::DELETE, "/registry/echo"),
            (Method::GET, "/stats"),
            (Method::GET, "/metrics"),
            (Method::GET, "/packages"),
            (Method::GET, "/pid"),
            (Method::POST, "/status"),
            (Method::GET, "/status/"),
            (Method::GET, "/run"),
            (Method::GET, "/running"),
            (Method::GET, "//run/echo"),
            (Method::GET, "/RUN/echo"),
            (Method::GET, "/%72un/echo"),
            (Method::GET, "/nowhere"),
            (Method::GET, "/"),
        ] {
            assert!(!is_open(&method, path), "{method} {path}");
        }
    }

    #[test]
    fn the_header_is_one_bearer_token() {
        assert_eq!(credential(&headers(&[])), Credential::Missing);
        assert_eq!(credential(&headers(&["Bearer abc"])), Credential::Bearer("abc"));
        assert_eq!(credential(&headers(&["bearer  abc "])), Credential::Bearer("abc"));
        assert_eq!(credential(&headers(&["BEARER abc"])), Credential::Bearer("abc"));
        for malformed in ["abc", "Bearer", "Bearer ", "Basic YWRhOmFkYQ==", "Bearer a b", "Bearerabc", ""] {
            assert_eq!(credential(&headers(&[malformed])), Credential::Malformed, "{malformed:?}");
        }
        assert_eq!(credential(&headers(&["Bearer abc", "Bearer abc"])), Credential::Malformed);
        let mut opaque = HeaderMap::new();
        opaque.insert(header::AUTHORIZATION, HeaderValue::from_bytes(b"Bearer \xff").unwrap());
        assert_eq!(credential(&opaque), Credential::Malformed);
    }

    #[test]
    fn tokens_are_equal_only_byte_for_byte() {
        assert!(same_token(b"0123abcd", b"0123abcd"));
        assert!(!same_token(b"0123abcd", b"0123abce"));
        assert!(!same_token(b"0123abcd", b"1123abcd"));
        assert!(!same_token(b"0123abc", b"0123abcd"));
        assert!(!same_token(b"", b"0123abcd"));
        assert!(same_token(b"", b""));
    }

    #[test]
    fn protected_paths_need_the_worker_token() {
        let (guard, token) = guard(true);
        let ok = format!("Bearer {token}");
        let wrong = format!("Bearer {}", Token::generate().unwrap().as_str());
        assert_eq!(guard.decide(&Method::GET, "/stats", &headers(&[&ok])), Verdict::Allow);
        assert_eq!(guard.decide(&Method::GET, "/stats", &headers(&[])), Verdict::Unauthorized);
        assert_eq!(guard.decide(&Method::GET, "/nowhere", &headers(&[])), Verdict::Unauthorized);
        assert!(matches!(guard.decide(&Method::GET, "/stats", &headers(&[&wrong])), Verdict::Forbidden(_)));
        assert!(matches!(guard.decide(&Method::GET, "/stats", &headers(&[&token])), Verdict::Forbidden(_)));
        assert!(matches!(guard.decide(&Method::POST, "/registry/x", &headers(&[&ok, &ok])), Verdict::Forbidden(_)));
        // Open paths ignore credentials, good or bad.
        assert_eq!(guard.decide(&Method::POST, "/run/echo", &headers(&[])), Verdict::Allow);
        assert_eq!(guard.decide(&Method::POST, "/run/echo", &headers(&[&wrong])), Verdict::Allow);
        assert_eq!(guard.decide(&Method::GET, "/status", &headers(&["junk"])), Verdict::Allow);
    }

    #[test]
    fn auth_off_allows_everything() {
        let (guard, _) = guard(false);
        assert_eq!(guard.decide(&Method::DELETE, "/registry/x", &headers(&[])), Verdict::Allow);
        assert_eq!(guard.decide(&Method::GET, "/stats", &headers(&["Bearer wrong"])), Verdict::Allow);
    }

    #[test]
    fn the_worker_token_is_recognised_for_removal_before_a_lambda_sees_it() {
        let (guard, token) = guard(true);
        let value = |v: &str| HeaderValue::from_str(v).unwrap();
        assert!(guard.is_worker_credential("authorization", &value(&format!("Bearer {token}"))));
        assert!(guard.is_worker_credential("Authorization", &value(&format!("bearer {token}"))));
        assert!(!guard.is_worker_credential("authorization", &value("Bearer the-app-s-own")));
        assert!(!guard.is_worker_credential("authorization", &value("Basic YWRhOmFkYQ==")));
        assert!(!guard.is_worker_credential("x-token", &value(&format!("Bearer {token}"))));
    }

    #[test]
    fn the_401_message_says_where_the_token_is() {
        let (guard, token) = guard(true);
        let message = guard.unauthorized_message();
        assert!(message.contains("DIR/api-token") && message.contains("$SPROUT_TOKEN"), "{message}");
        assert!(message.contains("/run/sprout/api/127.0.0.1:5000") && !message.contains(&token), "{message}");
    }
}
