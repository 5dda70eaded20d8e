//! Bearer-token authentication of the admin plane: who may use which endpoint of `worker.listen`.
//!
//! Protected by default, open by exception: only `/run/...` and `/map/...` (any method, any
//! sub-path: a lambda's invocations) and `GET /status` (a health check) are open; every other path, including unknown ones and any
//! endpoint added later, needs `Authorization: Bearer <token>` with the worker's token
//! ([`token`]: `DIR/api-token`). No header answers 401 `unauthorized` with
//! `WWW-Authenticate: Bearer realm="sprout"`; a malformed header or a wrong token answers 403
//! `forbidden`. Tokens are compared in constant time. The app port is not behind this.
//! `worker.auth = false` opens everything.
//!
//! The web console ([`crate::console`]) logs a browser in with the token once and then holds
//! the cookie `sprout_console`: a session secret made at each worker start (not the token),
//! which authorizes GET and HEAD only, on every admin path (the console is read-only; a cookie
//! never authorizes POST, PUT or DELETE). `GET`/`POST /console/login` and
//! `POST /console/logout` are open; a browser asking for the console page without a session
//! is sent (303) to the login form instead of the JSON 401.

pub mod tenants;
pub mod token;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;

use sprout_engine::ErrorCode;

use crate::http::{fail, ApiError};
pub use tenants::{Grant, Tenants};
pub use token::{same_token, Discovery, Token};

/// The console's session cookie.
pub const SESSION_COOKIE: &str = "sprout_console";
/// The console's login form, where a browser without a session is sent.
pub const LOGIN_PATH: &str = "/console/login";

fn is_read(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

/// Whether a request may reach `path` without a token.
pub fn is_open(method: &Method, path: &str) -> bool {
    path.starts_with("/run/")
        || path.starts_with("/map/")
        || (path == "/status" && is_read(method))
        || (path == LOGIN_PATH && (is_read(method) || method == Method::POST))
        || (path == "/console/logout" && method == Method::POST)
}

/// The console's pages, which a browser without a session is redirected from to the login.
fn is_console_page(method: &Method, path: &str) -> bool {
    is_read(method) && (path == "/console" || path == "/console/")
}

/// The values of the cookie `name` in a request's `Cookie` headers (one per header line and
/// pair: a browser may send several).
pub fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    headers.get_all(header::COOKIE).iter().filter_map(|value| value.to_str().ok()).flat_map(|value| value.split(';')).filter_map(
        move |pair| {
            let (key, value) = pair.split_once('=')?;
            (key.trim() == name).then(|| value.trim().trim_matches('"'))
        },
    )
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

/// Who a request speaks for, put in its extensions by the middleware for the routes to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The worker's token, the console's session, an open path, or `worker.auth = false`.
    Operator,
    /// A tenant's key ([`tenants`]).
    Tenant(Grant),
}

impl Principal {
    /// The tenant, for a tenant's key (None: the operator).
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Principal::Operator => None,
            Principal::Tenant(grant) => Some(&grant.tenant),
        }
    }

    /// Whether this principal may see `lambda`, which `owner` owns (None: the operator).
    pub fn sees(&self, lambda: &str, owner: Option<&str>) -> bool {
        match self {
            Principal::Operator => true,
            Principal::Tenant(grant) => grant.sees(lambda, owner),
        }
    }

    /// Whether this principal may see `lambda`, its owner looked up in `tenants` (only for a
    /// tenant: the operator sees every lambda).
    pub fn sees_lambda(&self, tenants: &Tenants, lambda: &str) -> bool {
        match self {
            Principal::Operator => true,
            Principal::Tenant(grant) => grant.sees(lambda, tenants.owner(lambda).as_deref()),
        }
    }
}

/// The paths a tenant's key may use: its lambdas in the registry, their logs, its sites,
/// leases and blobs, and the audit log (each route shows it only its own). Every other
/// admin path takes the operator's token.
fn tenant_path(path: &str) -> bool {
    let one_segment_under = |prefix: &str| matches!(path.strip_prefix(prefix), Some(name) if !name.is_empty() && !name.contains('/'));
    matches!(
        path,
        "/registry" | "/logs" | "/audit" | "/sites" | "/leases" | "/stats/history" | "/console" | "/console/" | "/console/session"
    ) || path.strip_prefix("/leases/").is_some_and(|rest| !rest.is_empty())
        || one_segment_under("/console/assets/")
        || one_segment_under("/registry/")
        || one_segment_under("/logs/")
        || one_segment_under("/sites/")
        || one_segment_under("/blobs/")
}

/// The answer to one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The operator (or an open path).
    Allow,
    /// A tenant's key, on a path open to tenants; the routes check what it owns.
    Tenant(Grant),
    /// 401: no credentials.
    Unauthorized,
    /// 403: credentials that are not this worker's, and why.
    Forbidden(&'static str),
    /// 303 to the console's login form: a browser asking for the console without a session.
    LogIn,
}

/// The worker's token and whether its API requires it.
pub struct Guard {
    token: Token,
    required: bool,
    /// The listen address, to name the discovery file in messages.
    listen: String,
    /// The console's session secret, made at start (None: the kernel gave no random bytes,
    /// and the console cannot log in).
    session: Option<Token>,
    /// The tenants and their keys.
    pub tenants: Arc<Tenants>,
}

impl Guard {
    pub fn new(token: Token, required: bool, listen: impl Into<String>, tenants: Arc<Tenants>) -> Guard {
        let session =
            Token::generate().inspect_err(|e| tracing::warn!("no session secret for the console, which cannot log in: {e:#}")).ok();
        Guard { token, required, listen: listen.into(), session, tenants }
    }

    /// Whether `presented` is the worker's token (constant time).
    pub fn is_token(&self, presented: &str) -> bool {
        same_token(presented.trim().as_bytes(), self.token.as_str().as_bytes())
    }

    /// The console's session secret, the value of its cookie.
    pub fn session(&self) -> Option<&str> {
        self.session.as_ref().map(Token::as_str)
    }

    /// Whether a cookie value is this worker run's session secret (constant time).
    fn is_session(&self, presented: &str) -> bool {
        self.session.as_ref().is_some_and(|s| same_token(presented.as_bytes(), s.as_str().as_bytes()))
    }

    pub fn decide(&self, method: &Method, path: &str, headers: &HeaderMap) -> Verdict {
        if !self.required || is_open(method, path) {
            return Verdict::Allow;
        }
        let verdict = match self.decide_credentials(method, headers) {
            Verdict::Tenant(grant) => tenant_verdict(grant, method, path),
            other => other,
        };
        if matches!(verdict, Verdict::Unauthorized | Verdict::Forbidden(_))
            && is_console_page(method, path)
            && credential(headers) == Credential::Missing
        {
            return Verdict::LogIn;
        }
        verdict
    }

    fn decide_credentials(&self, method: &Method, headers: &HeaderMap) -> Verdict {
        match credential(headers) {
            Credential::Missing => {
                let mut presented = cookies(headers, SESSION_COOKIE).peekable();
                if presented.peek().is_none() {
                    return Verdict::Unauthorized;
                }
                // A tenant's console session: its key, for reading only.
                if let Some(key) = cookies(headers, SESSION_COOKIE).find(|v| tenants::looks_like_key(v)) {
                    return match (self.tenants.authenticate(key, unix_now()), is_read(method)) {
                        (Ok(mut grant), true) => {
                            grant.scope.read_only = true;
                            Verdict::Tenant(grant)
                        }
                        (Ok(_), false) => {
                            Verdict::Forbidden("the console's session authorizes GET and HEAD only: send `Authorization: Bearer <key>`")
                        }
                        (Err(_), _) => Verdict::Forbidden("the console session's key is revoked, expired or unknown: log in again"),
                    };
                }
                // Every value is compared: `any` would stop at the first match.
                let valid = presented.fold(false, |valid, value| self.is_session(value) | valid);
                match (valid, is_read(method)) {
                    (true, true) => Verdict::Allow,
                    (true, false) => {
                        Verdict::Forbidden("the console's session authorizes GET and HEAD only: send `Authorization: Bearer <token>`")
                    }
                    (false, _) => {
                        Verdict::Forbidden("the console session is not this worker run's (it restarted?): log in again at /console/login")
                    }
                }
            }
            Credential::Malformed => {
                Verdict::Forbidden("the Authorization header is malformed: send exactly one `Authorization: Bearer <token>`")
            }
            Credential::Bearer(presented) if same_token(presented.as_bytes(), self.token.as_str().as_bytes()) => Verdict::Allow,
            Credential::Bearer(presented) if tenants::looks_like_key(presented) => match self.tenants.authenticate(presented, unix_now()) {
                Ok(grant) => Verdict::Tenant(grant),
                Err(tenants::Refusal::Revoked) => Verdict::Forbidden("this tenant key was revoked"),
                Err(tenants::Refusal::Expired) => Verdict::Forbidden("this tenant key has expired"),
                Err(tenants::Refusal::Unknown) => Verdict::Forbidden("the bearer token is no key of this worker's"),
            },
            Credential::Bearer(_) => Verdict::Forbidden("the bearer token is not this worker's (DIR/api-token)"),
        }
    }

    /// Whether a request may invoke `lambda` (owned by `owner`; None: the operator's), which
    /// wants a key (ol.yaml `auth: key`): the operator's token, or a live key of its tenant
    /// that may see it. Err: the verdict to answer with (401 without credentials, else 403).
    pub fn may_invoke(&self, headers: &HeaderMap, lambda: &str, owner: Option<&str>) -> Result<(), Verdict> {
        if !self.required {
            return Ok(());
        }
        match credential(headers) {
            Credential::Missing => Err(Verdict::Unauthorized),
            Credential::Malformed => {
                Err(Verdict::Forbidden("the Authorization header is malformed: send exactly one `Authorization: Bearer <key>`"))
            }
            Credential::Bearer(presented) if same_token(presented.as_bytes(), self.token.as_str().as_bytes()) => Ok(()),
            Credential::Bearer(presented) => match self.tenants.authenticate(presented, unix_now()) {
                Ok(grant) if grant.sees(lambda, owner) => Ok(()),
                Ok(_) | Err(tenants::Refusal::Unknown) => Err(Verdict::Forbidden("this key may not invoke this lambda")),
                Err(tenants::Refusal::Revoked) => Err(Verdict::Forbidden("this tenant key was revoked")),
                Err(tenants::Refusal::Expired) => Err(Verdict::Forbidden("this tenant key has expired")),
            },
        }
    }

    /// Whether a request header carries this worker's own token or the console's session,
    /// which no lambda may see: `/run` passes the other headers, `Authorization` and `Cookie`
    /// included, to the handler ([`Guard::lambda_headers`] takes these out; a browser logged in
    /// to the console sends its cookie to the worker's `/run` and to the app port on the same
    /// host).
    pub fn is_worker_credential(&self, name: &str, value: &HeaderValue) -> bool {
        if name.eq_ignore_ascii_case(header::COOKIE.as_str()) {
            let mut one = HeaderMap::new();
            one.insert(header::COOKIE, value.clone());
            return cookies(&one, SESSION_COOKIE).fold(false, |found, v| (self.is_session(v) || tenants::looks_like_key(v)) | found);
        }
        name.eq_ignore_ascii_case(header::AUTHORIZATION.as_str())
            && bearer_token(value).is_some_and(|t| same_token(t.as_bytes(), self.token.as_str().as_bytes()) || tenants::looks_like_key(t))
    }

    /// A request's headers as its lambda sees them: without the worker's token, and with the
    /// console's session cookie taken out of `Cookie` (the lambda's own cookies kept).
    pub fn lambda_headers(&self, headers: &HeaderMap) -> Vec<(String, String)> {
        let mut out = Vec::with_capacity(headers.len());
        for (name, value) in headers {
            let value = if name == header::COOKIE && self.is_worker_credential(name.as_str(), value) {
                match self.without_session(value) {
                    Some(kept) => kept,
                    None => continue,
                }
            } else if self.is_worker_credential(name.as_str(), value) {
                continue;
            } else {
                value.clone()
            };
            if let Ok(text) = value.to_str() {
                out.push((name.as_str().to_string(), text.to_string()));
            }
        }
        out
    }

    /// A `Cookie` header as a lambda may see it: without the console's session cookie (None
    /// when nothing else is left), the lambda's own cookies kept.
    pub fn without_session(&self, value: &HeaderValue) -> Option<HeaderValue> {
        let Ok(text) = value.to_str() else { return Some(value.clone()) };
        let kept: Vec<&str> = text
            .split(';')
            .map(str::trim)
            .filter(|pair| !pair.is_empty() && !matches!(pair.split_once('='), Some((key, _)) if key.trim() == SESSION_COOKIE))
            .collect();
        if kept.is_empty() {
            return None;
        }
        HeaderValue::from_str(&kept.join("; ")).ok()
    }

    /// The answer to a refused invocation of a lambda that wants a key.
    pub fn refuse_invocation(&self, verdict: Verdict) -> Response {
        match verdict {
            Verdict::Unauthorized => {
                let message = "this lambda wants a key (its ol.yaml says `auth: key`): send `Authorization: Bearer <key>` \
                               with a key of its tenant";
                let mut response = fail(ApiError::new(ErrorCode::Unauthorized, message));
                response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"sprout\""));
                response
            }
            Verdict::Forbidden(why) => fail(ApiError::new(ErrorCode::Forbidden, why)),
            _ => fail(ApiError::new(ErrorCode::Forbidden, "refused")),
        }
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

/// Seconds since the epoch, for keys' expiry.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A tenant key's verdict on a path: only the tenant paths, and only reading for a read-only key.
fn tenant_verdict(grant: Grant, method: &Method, path: &str) -> Verdict {
    if !tenant_path(path) {
        return Verdict::Forbidden(
            "a tenant's key reaches /registry, /logs, /sites, /leases, /blobs and /audit only; this endpoint takes the operator's token",
        );
    }
    if grant.scope.read_only && !is_read(method) {
        return Verdict::Forbidden("this tenant key is read-only: GET and HEAD only");
    }
    Verdict::Tenant(grant)
}

/// The middleware in front of every route of `worker.listen`: it decides, and puts the
/// [`Principal`] in the request's extensions.
pub(crate) async fn require_token(State(guard): State<Arc<Guard>>, mut request: Request, next: Next) -> Response {
    match guard.decide(request.method(), request.uri().path(), request.headers()) {
        Verdict::Allow => {
            request.extensions_mut().insert(Principal::Operator);
            next.run(request).await
        }
        Verdict::Tenant(grant) => {
            request.extensions_mut().insert(Principal::Tenant(grant));
            next.run(request).await
        }
        Verdict::Unauthorized => {
            let mut response = fail(ApiError::new(ErrorCode::Unauthorized, guard.unauthorized_message()));
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"sprout\""));
            response
        }
        Verdict::Forbidden(why) => fail(ApiError::new(ErrorCode::Forbidden, why)),
        Verdict::LogIn => Response::builder()
            .status(axum::http::StatusCode::SEE_OTHER)
            .header(header::LOCATION, LOGIN_PATH)
            .header(header::CACHE_CONTROL, "no-store")
            .body(axum::body::Body::empty())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests;
