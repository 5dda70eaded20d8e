//! The web console: serves its page, assets and login form (the data comes from the API itself).
//!
//! | Route                          | Does                                                          |
//! |--------------------------------|---------------------------------------------------------------|
//! | `GET /console`                 | the console page (a browser without a session: 303 to login) |
//! | `GET /console/assets/<file>`   | its script and style, embedded in the binary                  |
//! | `GET /console/login`           | the login form (open)                                         |
//! | `POST /console/login`          | `token=...`: the worker's token, or a tenant's key, sets the session cookie (open) |
//! | `GET /console/session`         | who the session is: `{"principal": "operator"}` or `{"principal": "tenant", "tenant", "key"}` |
//! | `POST /console/logout`         | clears the cookie (open)                                      |
//!
//! Who may see what is [`crate::auth`]'s: the cookie `sprout_console` holds the worker run's
//! session secret ([`Guard::session`]) and authorizes GET and HEAD only, so the page reads
//! `/stats`, `/stats/history`, `/registry` and `/logs` with it and can change nothing. A
//! tenant logs in with one of its keys, which the cookie then holds (revoking the key ends the
//! session); its console shows only its own lambdas, their logs and history, without the
//! worker's figures.

use std::collections::HashMap;

use axum::extract::rejection::FormRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Form, Router};

use sprout_engine::ErrorCode;

use crate::auth::{tenants, unix_now, Guard, Principal, LOGIN_PATH, SESSION_COOKIE};
use crate::http::ApiError;
use crate::state::Api;

const INDEX_HTML: &str = include_str!("console/index.html");
const LOGIN_HTML: &str = include_str!("console/login.html");
/// The assets by file name: content and type.
const ASSETS: [(&str, &str, &str); 2] = [
    ("console.js", include_str!("console/console.js"), "text/javascript; charset=utf-8"),
    ("console.css", include_str!("console/console.css"), "text/css; charset=utf-8"),
];

/// Nothing but the worker itself: no inline script, no other origin, no framing.
const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
                        form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
/// The login form brings its style inline (its assets are behind the session it makes).
const LOGIN_CSP: &str =
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The console's routes, merged into the API's router (behind the same token check).
pub fn routes() -> Router<Api> {
    Router::new()
        .route("/console", get(page))
        .route("/console/", get(page))
        .route("/console/assets/{file}", get(asset))
        .route("/console/session", get(session))
        .route(LOGIN_PATH, get(login_form).post(log_in))
        .route("/console/logout", axum::routing::post(log_out))
}

/// A response of the console's own: its type, never cached without asking, never framed.
fn served(status: StatusCode, content_type: &'static str, csp: &'static str, body: String) -> Response {
    let mut response = (status, body).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    response
}

async fn page() -> Response {
    served(StatusCode::OK, "text/html; charset=utf-8", PAGE_CSP, INDEX_HTML.to_string())
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, body, content_type)) => served(StatusCode::OK, content_type, PAGE_CSP, body.to_string()),
        None => ApiError::new(ErrorCode::NotFound, format!("the console has no asset {file:?}")).into_response(),
    }
}

/// The login form, with a message (already a sentence of ours, escaped all the same).
fn login_page(status: StatusCode, message: &str) -> Response {
    let shown = if message.is_empty() {
        String::new()
    } else {
        format!("<p class=\"message\" id=\"login-message\" role=\"alert\">{}</p>", escape(message))
    };
    let mut response = served(status, "text/html; charset=utf-8", LOGIN_CSP, LOGIN_HTML.replace("<!-- MESSAGE -->", &shown));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

async fn login_form() -> Response {
    login_page(StatusCode::OK, "")
}

async fn session(Extension(principal): Extension<Principal>) -> Response {
    let body = match principal {
        Principal::Operator => serde_json::json!({"principal": "operator"}),
        Principal::Tenant(grant) => serde_json::json!({"principal": "tenant", "tenant": grant.tenant, "key": grant.key_id}),
    };
    axum::Json(body).into_response()
}

async fn log_in(State(api): State<Api>, form: Result<Form<HashMap<String, String>>, FormRejection>) -> Response {
    let presented = form.ok().and_then(|Form(mut fields)| fields.remove("token")).unwrap_or_default();
    let guard: &Guard = &api.auth;
    let presented = presented.trim();
    if tenants::looks_like_key(presented) {
        if let Err(refusal) = guard.tenants.authenticate(presented, unix_now()) {
            tracing::info!(?refusal, "console login refused: a tenant key that is not valid");
            return login_page(StatusCode::FORBIDDEN, "That key is revoked, expired or not this worker's.");
        }
        let cookie = format!("{SESSION_COOKIE}={presented}; HttpOnly; SameSite=Strict; Path=/");
        return redirect("/console", &cookie);
    }
    // Always compared, whatever came (constant time in the token's length).
    if !guard.is_token(presented) {
        tracing::info!("console login refused: not the worker's token");
        return login_page(StatusCode::FORBIDDEN, "That is not this worker's token (DIR/api-token) nor a tenant's key.");
    }
    let Some(session) = guard.session() else {
        return login_page(
            StatusCode::SERVICE_UNAVAILABLE,
            "The worker has no session secret (no random bytes at start): use the API with the token.",
        );
    };
    let cookie = format!("{SESSION_COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/");
    redirect("/console", &cookie)
}

async fn log_out() -> Response {
    redirect(LOGIN_PATH, &format!("{SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"))
}

fn redirect(to: &'static str, cookie: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let h = response.headers_mut();
    h.insert(header::LOCATION, HeaderValue::from_static(to));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(cookie) = HeaderValue::from_str(cookie) {
        h.insert(header::SET_COOKIE, cookie);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_the_page_names_is_served() {
        for (name, body, _) in ASSETS {
            assert!(INDEX_HTML.contains(&format!("/console/assets/{name}")), "{name} is not used by the page");
            assert!(!body.is_empty());
        }
        assert!(LOGIN_HTML.contains("<!-- MESSAGE -->") && LOGIN_HTML.contains("name=\"token\""));
    }

    #[test]
    fn nothing_comes_from_outside_the_worker() {
        for text in [INDEX_HTML, LOGIN_HTML, ASSETS[0].1, ASSETS[1].1] {
            let text = text.replace("http://www.w3.org/2000/svg", ""); // a name, never fetched
            assert!(!text.contains("http://") && !text.contains("https://") && !text.contains("//cdn"), "an outside URL");
        }
    }

    #[test]
    fn messages_are_escaped() {
        assert_eq!(escape("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
    }
}
